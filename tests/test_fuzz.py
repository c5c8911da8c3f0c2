"""Fuzzing: no spec text makes pallasgen fail with anything but a spec error, and
every spec that builds gives a module whose kernels match their references.

CI runs a small budget. A long run is a documented command:

    PALLASGEN_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py -p no:cacheprovider -q
"""

from __future__ import annotations

import os
import re
import random
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_cases import load_module
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import decode, generate
from pallasgen.workspace.sync import Target, build_notes

EXAMPLES = int(os.environ.get("PALLASGEN_FUZZ_EXAMPLES", "150"))
RUN_EXAMPLES = max(10, EXAMPLES // 10)
SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.pallas"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

TOKENS = [
    "kernel",
    "in",
    "out",
    "let",
    "param",
    "block",
    "accumulate",
    "true",
    "false",
    "x",
    "y",
    "z",
    "M",
    "N",
    "K",
    "f32",
    "bf16",
    "i8",
    "i32",
    "bool",
    "exp",
    "where",
    "gelu",
    "pl",
    "lambda",
    "0",
    "1",
    "2.5",
    "1e-5",
    "300",
    "1e999",
    "99999999999",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "@",
    ".T",
    ".",
    "==",
    "<",
    ">=",
    "&",
    "|",
    "~",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "\n",
    " ",
    "\t",
    "#",
    "# c\n",
    "\r\n",
    "$",
    "\ufeff",
    "\x00",
]


def build(source: str) -> str | None:
    """The generated module, None for a spec error; anything else propagates and fails."""
    try:
        return generate(decode(source.encode("utf-8", "surrogatepass"), "fuzz.pallas"), "fuzz.pallas", "fuzz.pallas")
    except SpecError as error:
        assert error.diagnostics, "a spec error names at least one problem"
        assert "Traceback" not in error.render()
        return None


def assert_compiles(module_text: str | None) -> None:
    """A module, where the spec built, imports: compiling alone misses a default that
    fails as the module runs (`p=inf`)."""
    if module_text is not None:
        exec(compile(module_text, "generated.py", "exec"), types.ModuleType("fuzzed").__dict__)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup_gives_a_module_or_a_spec_error(tokens):
    assert_compiles(build(" ".join(tokens)))


# Each mutation case builds a whole bundled spec (gradients and all), the costly kind:
# half the budget each for text and for byte mutations.
MUTATE = settings(FUZZ, max_examples=max(1, EXAMPLES // 2))


@MUTATE
@given(st.sampled_from(SPECS), st.randoms(use_true_random=False), st.integers(1, 4))
def test_mutated_bundled_specs_give_a_module_or_a_spec_error(spec, rng, mutations):
    text = spec.read_text()
    for _ in range(mutations):
        text = mutate(text, rng)
    assert_compiles(build(text))


@MUTATE
@given(st.sampled_from(SPECS), st.randoms(use_true_random=False), st.integers(1, 3))
def test_byte_mutated_bundled_specs_give_a_module_or_a_spec_error(spec, rng, mutations):
    data = bytearray(spec.read_bytes())
    for _ in range(mutations):
        at = rng.randrange(len(data) + 1)
        choice = rng.randrange(3)
        if choice == 0 and at < len(data):
            data[at] = rng.randrange(256)
        elif choice == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:
            del data[at : at + rng.randint(1, 8)]
    try:
        text = decode(bytes(data), "fuzz.pallas")
    except SpecError as error:
        assert "not UTF-8" in error.render()
        return
    assert_compiles(build(text))


# ---------------------------------------------------------------- structural cases: what a fuzzer found

KERNEL_NAMES = ["k", "k_reference", "k_backward", "k_backward_reference", "k_with_residuals", "jnp", "k2"]
PARAM_NAMES = ["p", "gpu_backend", "mgpu_stages", "mgpu_block_m", "block_d0", "interpret", "x", "inf", "gpu_warps"]
PARAM_DTYPES = ["f32", "bf16", "i32", "i8", "u8", "bool"]
NUMBERS = ["2", "0.5", "-1", "300", "9999999999", "1e400", "1e-50", "2147483648", "1" * 120]
EXPRESSIONS = [
    "x + {n}",
    "x * p",
    "x + i8({n})",
    "x + ~({n})",
    "x + ~(2 ** 31)",
    "x + 2 ** 31",
    "x + abs(2) ** abs(1000000000)",
    "x ** abs(7)",
    "round(x)",
    "sum(x)",
    "sum(x, {d})",
    "max(x, 0)",
    "mean(x, axis={d})",
    "x[...]",
    "frobnicate(x)",
    "(x @ x) @ (x @ x).T",
    "x @ x.T",
    "exp(x) / sum(exp(x), {d})",
    "where(x > {n}, x, {n})",
    "x + " + "9" * 5000,
]


@st.composite
def structural_specs(draw):
    """A kernel (or two) built from parts: any number of dimensions, params named like
    keywords, literals in and out of range, chains of lets, and the fuzzer's findings."""
    count = draw(st.sampled_from([1, 2, 3, 11, 12]))
    dims = [f"D{n}" for n in range(count)]
    dtype = draw(st.sampled_from(["f32", "bf16", "i32", "i8"]))
    out_dims = dims if draw(st.booleans()) else dims[:-1]
    lines = [f"    in  x: {dtype}[{', '.join(dims)}]", f"    out z: {dtype}[{', '.join(out_dims)}]"]
    params = draw(st.lists(st.tuples(st.sampled_from(PARAM_NAMES), st.sampled_from(PARAM_DTYPES)), max_size=2))
    for name, param_dtype in params:
        lines.append(f"    param {name}: {param_dtype} = {draw(st.sampled_from(NUMBERS))}")
    value = draw(st.sampled_from(EXPRESSIONS)).format(n=draw(st.sampled_from(NUMBERS)), d=draw(st.sampled_from(dims)))
    chain = draw(st.sampled_from([0, 0, 1, 3, 250]))
    if chain:
        lines.append(f"    let a0 = {value}")
        lines += [f"    let a{n} = a{n - 1} * 2" for n in range(1, chain)]
        value = f"a{chain - 1}"
    lines.append(f"    z = {value}")
    if draw(st.booleans()):
        lines.append(f"    block {', '.join(f'{d} = {draw(st.sampled_from([1, 8, 128, 1024]))}' for d in dims)}")
    kernel = "kernel k {\n" + "\n".join(lines) + "\n}\n"
    second = draw(st.sampled_from([None, *KERNEL_NAMES[1:]]))
    if second:
        kernel += f"\nkernel {second} {{\n    in  x: f32[N]\n    out z: f32[N]\n    z = x * 2\n}}\n"
    return kernel


@FUZZ
@given(structural_specs())
def test_structural_specs_give_a_module_or_a_spec_error(source):
    assert_compiles(build(source))


def mutate(text: str, rng: random.Random) -> str:
    """Deletes, duplicates or replaces a span, or drops in a token."""
    if not text:
        return rng.choice(TOKENS)
    start = rng.randrange(len(text))
    end = min(len(text), start + rng.randint(1, 12))
    choice = rng.randrange(4)
    if choice == 0:
        return text[:start] + text[end:]
    if choice == 1:
        return text[:end] + text[start:end] + text[end:]
    if choice == 2:
        return text[:start] + rng.choice(TOKENS) + text[end:]
    return text[:start] + chr(rng.randrange(32, 127)) + text[start + 1 :]


def test_bytes_that_are_not_utf8_are_a_spec_error():
    with pytest.raises(SpecError, match="not UTF-8"):
        decode(b"kernel k {\n  in x: f32[N]\xff\n}", "bad.pallas")


# ---------------------------------------------------------------- specs that build must run

DTYPES = ["f32", "bf16", "i32", "i8"]
UNARY = ["exp", "tanh", "relu", "abs", "sigmoid", "f32", "i32", "-", "~"]
BINARY = ["+", "-", "*", "/", "maximum", "minimum", ">", "=="]


@st.composite
def expressions(draw, names, depth=3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([*names, "2", "0.5", "slope"]))
    if draw(st.booleans()):
        op = draw(st.sampled_from(UNARY))
        inner = draw(expressions(names, depth - 1))
        return f"{op}({inner})" if op not in "-~" else f"{op}({inner})"
    op = draw(st.sampled_from(BINARY))
    left, right = draw(expressions(names, depth - 1)), draw(expressions(names, depth - 1))
    return f"{op}({left}, {right})" if op.isalpha() else f"({left} {op} {right})"


@st.composite
def elementwise_specs(draw):
    dims = draw(st.sampled_from([["M", "N"], ["N"]]))
    inputs = []
    for index in range(draw(st.integers(1, 3))):
        own = dims if draw(st.booleans()) or len(dims) == 1 else [draw(st.sampled_from(dims))]
        inputs.append((f"a{index}", draw(st.sampled_from(DTYPES)), own))
    inputs[0] = (inputs[0][0], inputs[0][1], dims)
    value = draw(expressions([name for name, _, _ in inputs]))
    out_dtype = draw(st.sampled_from(DTYPES))
    lines = [f"    in {name}: {dtype}[{', '.join(own)}]" for name, dtype, own in inputs]
    lines += [
        f"    out r: {out_dtype}[{', '.join(dims)}]",
        "    param slope: f32 = 0.25",
        f"    r = {out_dtype}({value})",
    ]
    blocks = "block M = 8, N = 128" if len(dims) == 2 else "block N = 1024"
    return "kernel fuzzed {\n" + "\n".join(lines) + f"\n    {blocks}\n}}\n", inputs, dims


@settings(max_examples=RUN_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(elementwise_specs())
def test_generated_elementwise_specs_run_and_match_their_reference(tmp_path_factory, case):
    spec, inputs, dims = case
    module_text = build(spec)
    if module_text is None:  # e.g. ~ on a float: a spec error is a fine answer
        return
    path = tmp_path_factory.mktemp("fuzz") / "fuzzed.py"
    path.write_text(module_text)
    module = load_module(path, f"_fuzzed_{abs(hash(spec))}")
    sizes = {"M": 11, "N": 130}
    rng = np.random.default_rng(0)
    arrays = []
    for _, dtype, own in inputs:
        shape = tuple(sizes[d] for d in own)
        values = rng.integers(-5, 6, shape) if dtype.startswith("i") else rng.standard_normal(shape)
        arrays.append(
            np.asarray(values).astype({"f32": np.float32, "bf16": "bfloat16", "i32": np.int32, "i8": np.int8}[dtype])
        )
    import jax.numpy as jnp

    arrays = [jnp.asarray(a) for a in arrays]
    got = np.asarray(module.fuzzed(*arrays), np.float64)
    want = np.asarray(module.fuzzed.reference(*arrays), np.float64)
    assert got.shape == want.shape == tuple(sizes[d] for d in dims)
    # XLA may skip the rounding of bf16 intermediates that interpret mode keeps, so bf16
    # specs allow a few bf16 steps of the intermediate values (and an integer output, one
    # step of truncation); translation bugs are far larger.
    uses_bf16 = "bf16" in spec
    integer_output = "out r: i" in spec
    atol = (1.0 if integer_output else 0.1) if uses_bf16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=5e-2 if uses_bf16 else 1e-5, atol=atol, equal_nan=True)


# ---------------------------------------------------------------- products, as users write them

PRODUCT_DTYPES = {"f32": np.float32, "bf16": "bfloat16", "i8": np.int8}


@st.composite
def product_specs(draw):
    """A kernel of one product and what surrounds it: batch dimensions on either side or
    both, transposed or computed operands, two dtypes, an epilogue that reduces or takes a
    softmax or a second product, outputs in any order, blocks or none. Its inputs: (name,
    dtype, dims)."""
    batch = draw(st.lists(st.sampled_from(["B", "H"]), unique=True, max_size=2))
    left_batch = [d for d in batch if draw(st.booleans())]
    right_batch = [d for d in batch if d not in left_batch or draw(st.booleans())]
    dtype = draw(st.sampled_from(list(PRODUCT_DTYPES)))
    other = dtype if draw(st.integers(0, 4)) else draw(st.sampled_from(["f32", "bf16"]))
    left_t, right_t = draw(st.booleans()), draw(st.booleans())
    inputs = [
        ("x", dtype, [*left_batch, *(["K", "M"] if left_t else ["M", "K"])]),
        ("y", other, [*right_batch, *(["N", "K"] if right_t else ["K", "N"])]),
    ]
    left = draw(st.sampled_from(["x", "relu(x)", "(x * 2)"])) + (".T" if left_t else "")
    product = f"({left} @ {'y.T' if right_t else 'y'})"
    dims = [*dict.fromkeys([*left_batch, *right_batch]), "M", "N"]
    reduced = draw(st.sampled_from(dims))
    epilogue, kept = draw(
        st.sampled_from(
            [
                (product, dims),
                (f"relu({product}) * 0.5", dims),
                (f"{product} + bias", dims),
                (f"sum({product}, {reduced})", [d for d in dims if d != reduced]),
                (f"max({product}, {reduced})", [d for d in dims if d != reduced]),
                (f"softmax({product}, N)", dims),
                (f"{product} - logsumexp({product}, N)", dims),
                (f"where(index(M) >= index(N), {product}, 0)", dims),
            ]
        )
    )
    if "bias" in epilogue:
        inputs.append(("bias", "f32", [draw(st.sampled_from(["M", "N"]))]))
    outputs = draw(st.permutations(kept)) if draw(st.booleans()) else kept
    out_dtype = draw(st.sampled_from(["f32", "bf16"]))
    lines = [f"    in  {name}: {t}[{', '.join(own)}]" for name, t, own in inputs]
    lines += [f"    out z: {out_dtype}[{', '.join(outputs)}]", f"    z = {out_dtype}({epilogue})"]
    blocks = {d: 1 for d in batch if draw(st.integers(0, 4))}
    blocks |= {d: draw(st.sampled_from([8, 16, 128, 256])) for d in ("M", "N", "K") if draw(st.booleans())}
    if blocks:
        lines.append("    block " + ", ".join(f"{d} = {b}" for d, b in blocks.items()))
    return "kernel fuzzed {\n" + "\n".join(lines) + "\n}\n", inputs


@FUZZ
@given(product_specs())
def test_product_specs_give_a_module_or_a_spec_error(case):
    assert_compiles(build(case[0]))


@settings(max_examples=RUN_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(product_specs(), st.sampled_from([1, 3, 20, 130]))
def test_product_specs_that_build_match_their_reference(tmp_path_factory, case, size):
    """Interpret mode against the module's reference, at ragged sizes."""
    import jax.numpy as jnp

    spec, inputs = case
    module_text = build(spec)
    if module_text is None:
        return
    path = tmp_path_factory.mktemp("fuzz") / "fuzzed.py"
    path.write_text(module_text)
    module = load_module(path, f"_fuzzed_product_{abs(hash(spec))}")
    sizes = {"B": 2, "H": 3, "M": size, "N": 130, "K": 20}
    rng = np.random.default_rng(0)
    arrays = []
    for _, dtype, own in inputs:
        shape = tuple(sizes[d] for d in own)
        values = rng.integers(-5, 6, shape) if dtype == "i8" else rng.standard_normal(shape)
        arrays.append(jnp.asarray(np.asarray(values).astype(PRODUCT_DTYPES[dtype])))
    got = np.asarray(module.fuzzed(*arrays), np.float64)
    want = np.asarray(module.fuzzed.reference(*arrays), np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * (1 + np.abs(want).max(initial=0)), equal_nan=True)


# ---------------------------------------------------------------- mutated specs that build must be callable

CALLED_SPECS = int(os.environ.get("PALLASGEN_FUZZ_CALLED", "10"))  # about 30 s of CPU


def bundled_kernel_texts() -> list[str]:
    """Each kernel of the bundled specs, with its comment lines: one to mutate at a time
    (a whole spec, gradients and all, costs seconds to build)."""
    pattern = re.compile(r"(?ms)^(?:#[^\n]*\n)*kernel .*?^\}[^\n]*\n")
    return [match.group(0) for spec in SPECS for match in pattern.finditer(spec.read_text())]


def tolerance(dtype) -> float:
    """How far a kernel may be from its reference: interpret mode and XLA round 16-bit
    intermediates at different points (a few steps of bf16), and an integer computed from
    floats may round one step apart."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return 1.0
    return 1e-4 if dtype.itemsize >= 4 else 2**-5


def check_call(module, kernel, arrays) -> str | None:
    """None where the kernel gives its reference's answer (or refuses the call with an error
    that names it), else what went wrong."""
    import jax

    try:
        want = jax.tree.leaves(getattr(module, kernel).reference(*arrays))
    except Exception:  # noqa: BLE001 - a reference that fails leaves the kernel free to refuse
        want = None
    try:
        got = jax.tree.leaves(getattr(module, kernel)(*arrays, interpret=True))
    except (TypeError, ValueError) as error:
        if str(error).startswith(f"{kernel}: "):
            return None
        return f"raised {type(error).__name__}: {str(error).splitlines()[0][:300]}"
    except Exception as error:  # noqa: BLE001
        return f"raised {type(error).__name__}: {str(error).splitlines()[0][:300]}"
    if want is None:
        return None
    for index, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {index}: {g.dtype}{list(g.shape)}, its reference {w.dtype}{list(w.shape)}"
        atol = tolerance(g.dtype)
        try:
            np.testing.assert_allclose(
                np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=atol, atol=atol, equal_nan=True
            )
        except AssertionError as error:
            return f"output {index} differs from its reference:{error}"
    return None


def test_a_seeded_sample_of_mutated_kernels_that_build_are_called_and_match_their_references(tmp_path):
    """Mutated bundled kernels that build (a seeded sample) are called on small random
    inputs in interpret mode, and with each dimension empty in turn: each gives its reference's answer, or refuses the call with
    a TypeError or ValueError naming the kernel."""
    import jax.numpy as jnp

    from kernel_cases import random_array
    from pallasgen.workspace.pipeline import check_source

    rng, texts, called, failures = random.Random(30), bundled_kernel_texts(), 0, []
    for attempt in range(40 * CALLED_SPECS):
        if called == CALLED_SPECS:
            break
        text = rng.choice(texts)
        for _ in range(rng.randint(1, 2)):
            text = mutate(text, rng)
        module_text = build(text)
        if module_text is None:
            continue
        called += 1
        path = tmp_path / f"called_{attempt}.py"
        path.write_text(module_text)
        module = load_module(path, f"_fuzz_called_{attempt}")
        sizes_rng = np.random.default_rng(attempt)
        for checked in check_source(text, "fuzz.pallas"):
            kernel = checked.kernel
            sizes = {d: int(sizes_rng.integers(1, 24)) for d in checked.dims}
            # Random sizes, then each dimension empty in turn (no kernel runs: cheap).
            for empty in (None, *checked.dims):
                at = {**sizes, empty: 0} if empty else sizes
                arrays = [
                    jnp.asarray(random_array(sizes_rng, decl.dtype, tuple(at[d] for d in decl.dims)))
                    for decl in kernel.inputs
                ]
                problem = check_call(module, kernel.name, arrays)
                if problem:
                    failures.append(f"{kernel.name} at {at}: {problem}\n--- spec:\n{text}")
    assert called == CALLED_SPECS, f"only {called} of {40 * CALLED_SPECS} mutations built"
    assert not failures, "\n\n".join(failures)


# Products in the forms users write (SwiGLU, a softmax of a product, a transposed or
# computed operand, a product reduced over N), some of which jax.grad cannot differentiate.
PRODUCT_VALUES = [
    "x @ w",
    "(x @ w) * (x @ v)",
    "silu(x @ w) * (x @ v)",
    "softmax(x @ w, N)",
    "exp((x @ w) - max(x @ w, N))",
    "(x @ w) + (x @ u.T)",
    "x @ f32(w)",
    "x @ (w * 2)",
    "where(x @ w > 0, x @ w, 0)",
    "(x @ w) / sum(x @ w, N)",
    "gelu(x @ w) * 2",
]
# Each input's declaration, for the values that read it.
PRODUCT_INPUTS = {"x": "[M, K]", "w": "[K, N]", "v": "[K, N]", "u": "[N, K]"}


@st.composite
def product_specs(draw):
    dtype = draw(st.sampled_from(["f32", "bf16"]))
    value = draw(st.sampled_from(PRODUCT_VALUES))
    inputs = [
        f"    in  {name}: {dtype}{dims}" for name, dims in PRODUCT_INPUTS.items() if re.search(rf"\b{name}\b", value)
    ]
    lines = [*inputs, "    out z: f32[M, N]", f"    z = f32({value})"]
    if draw(st.booleans()):
        lines.insert(len(inputs) + 1, "    out r: f32[M]")
        lines.append(f"    r = {draw(st.sampled_from(['sum', 'max']))}(f32({value}), N)")
    if draw(st.booleans()):
        lines.append(f"    block M = 128, N = {draw(st.sampled_from([128, 256]))}")
    return "kernel k {\n" + "\n".join(lines) + "\n}\n"


@settings(FUZZ, max_examples=RUN_EXAMPLES)
@given(product_specs())
def test_every_accepted_kernel_jax_grad_cannot_differentiate_is_noted_at_build(tmp_path_factory, source):
    """Whatever the generated module's jax.grad raises NotImplementedError for,
    `pallasgen build` has noted, naming the kernel; and it notes nothing else."""
    module = build(source)
    if module is None:
        return
    refused = set(
        re.findall(r"def _(\w+)_vjp\(\*saved_and_cotangents\):\n(?:    .*\n)*?    raise NotImplementedError", module)
    )
    spec = tmp_path_factory.mktemp("spec") / "k.pallas"
    spec.write_text(source)
    notes = build_notes([Target(spec, "k.pallas", spec.with_suffix(".py"))], str)
    noted = {re.match(r"'(\w+)' is not differentiable", n.message).group(1) for n in notes if n.kind == "grad"}
    assert noted == refused
