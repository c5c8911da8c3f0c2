"""A property sweep of the compiled tier: small random specs that the checker accepts,
with random legal blocks, built in memory and compiled for real at random call sizes.

- Elementwise kernels: 1 to 3 inputs whose dimensions are subsequences of the output's
  ([M, N] or [N]), dtypes f32, bf16, f16, i32, i16, i8, u8 and bool (bool only as a
  `where` condition), params p (f32) and n (i32), expressions of + - * maximum where exp; a
  `where` condition is a bool input, a comparison of arrays, or of params through
  functions (traced with the kernel).
- Matrix products: bf16, f32 or i8 operands (the second maybe transposed), with or
  without a bias epilogue.
- Reductions over N of rows ([M, N] to [M], maybe with an output that keeps N) or of
  a vector ([N] to a scalar): every reducer, of any of those numeric dtypes, N taken
  whole or blocked (then reduced step by step).

Blocks are drawn as multiples of what the TPU tiling rule asks (pallasgen.backends.tpu.tiling), or
left whole; call sizes are aligned, ragged, or smaller than a block. Each kernel is
compiled by Mosaic for a compile-only v5e or v6e (drawn) and by Triton for sm_90 (see
test_compiled.py); at odd sizes, where every GPU block overhangs its array, no Triton
load or store may go without a mask. Whatever the checker accepts, both compilers must accept.

Deterministic (derandomize=True) and small; a longer run:

    PALLASGEN_SWEEP_EXAMPLES=200 python -m pytest tests/test_compiled_sweep.py -p no:cacheprovider -q
"""

from __future__ import annotations

import functools
import os

import jax
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from kernel_cases import NUMPY_DTYPES, load_module, unmasked_block_accesses
from pallasgen.devices import compile_only
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import check_source, generate
from pallasgen.backends.tpu.tiling import tile_layouts, tiling_rule

pytestmark = pytest.mark.skipif(
    bool(compile_only.missing_compilers()), reason="needs libtpu (jax[tpu]) and triton: pip install -e '.[dev]'"
)

EXAMPLES = int(os.environ.get("PALLASGEN_SWEEP_EXAMPLES", "20"))
SWEEP = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

NUMERIC = ["f32", "bf16", "f16", "i32", "i16", "i8", "u8"]


# --------------------------------------------------------------------------- specs


@st.composite
def numeric_expressions(draw, numbers: list[str], flags: list[str], depth: int = 3) -> str:
    """An expression of numeric values: the `numbers` inputs, literals, + - * maximum
    where exp; a `where` condition is one of the bool `flags` or a comparison."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([*numbers, *numbers, "2", "1.5", "p", "n"]))
    operation = draw(st.sampled_from(["+", "-", "*", "maximum", "where", "exp"]))
    left = draw(numeric_expressions(numbers, flags, depth - 1))
    if operation == "exp":
        return f"exp({left})"
    right = draw(numeric_expressions(numbers, flags, depth - 1))
    if operation == "maximum":
        return f"maximum({left}, {right})"
    if operation == "where":
        conditions = [
            f"{draw(st.sampled_from(numbers))} > {right}",
            "maximum(p, 0.25) > 0.5",
            "minimum(n, 2) > 1",
            *flags,
        ]
        return f"where({draw(st.sampled_from(conditions))}, {left}, {right})"
    return f"({left} {operation} {right})"


@st.composite
def elementwise_specs(draw) -> str:
    """An elementwise kernel `k` with no block statement."""
    out_dims = draw(st.sampled_from([("M", "N"), ("N",)]))
    subsequences = [out_dims, *((d,) for d in out_dims), ()] if len(out_dims) == 2 else [out_dims, ()]
    inputs = []
    for index in range(draw(st.integers(1, 3))):
        dims = out_dims if index == 0 else draw(st.sampled_from(subsequences))
        dtype = "f32" if index == 0 and draw(st.booleans()) else draw(st.sampled_from([*NUMERIC, "bool"]))
        inputs.append((f"a{index}", dtype, dims))
    if all(dtype == "bool" for _, dtype, _ in inputs):
        inputs[0] = ("a0", "f32", out_dims)
    numbers = [name for name, dtype, _ in inputs if dtype != "bool"]
    flags = [name for name, dtype, _ in inputs if dtype == "bool"]
    value = draw(numeric_expressions(numbers, flags))
    out_dtype = draw(st.sampled_from([*NUMERIC, "bool"]))
    assignment = f"r = {value} > 0" if out_dtype == "bool" else f"r = {out_dtype}({value})"
    lines = [f"in {name}: {dtype}[{', '.join(dims)}]" for name, dtype, dims in inputs]
    lines += [f"out r: {out_dtype}[{', '.join(out_dims)}]", "param p: f32 = 0.75", "param n: i32 = 3", assignment]
    return "kernel k {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"


@st.composite
def matmul_specs(draw) -> str:
    """A matrix product `k`, maybe with a transposed operand and a bias, no block statement."""
    dtype = draw(st.sampled_from(["bf16", "f32", "i8"]))
    transposed = draw(st.booleans())
    lines = [f"in x: {dtype}[M, K]", f"in y: {dtype}[N, K]" if transposed else f"in y: {dtype}[K, N]"]
    product = "x @ y.T" if transposed else "x @ y"
    integer = dtype == "i8"
    if draw(st.booleans()):
        bias_dtype = draw(st.sampled_from(["i32", "f32"] if integer else ["f32", "bf16"]))
        lines.append(f"in bias: {bias_dtype}[N]")
        product = f"{product} + bias"
    out_dtype = draw(st.sampled_from(["i32", "f32"] if integer else ["f32", "bf16"]))
    lines += [f"out z: {out_dtype}[M, N]", f"z = {product}"]
    return "kernel k {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"


REDUCERS = ["sum", "max", "min", "mean", "argmax", "argmin", "logsumexp", "any", "all"]


@st.composite
def reduction_specs(draw) -> str:
    """A reduction `k` over N, no block statement."""
    dtype = draw(st.sampled_from(NUMERIC))
    rows = draw(st.booleans())
    reducer = draw(st.sampled_from(REDUCERS))
    value = "x > 1" if reducer in ("any", "all") else draw(st.sampled_from(["x", "x * 2", "maximum(x, 1)", "abs(x)"]))
    result = {"sum": "f32" if dtype in ("f32", "bf16") else "i32", "mean": "f32", "logsumexp": "f32"}.get(
        reducer, dtype
    )
    result = {"argmax": "i32", "argmin": "i32", "any": "bool", "all": "bool"}.get(reducer, result)
    lines = [f"in x: {dtype}[{'M, N' if rows else 'N'}]", f"out r: {result}[{'M' if rows else ''}]"]
    lines += [f"let s = {reducer}({value}, N)", "r = s"]
    if rows and draw(st.booleans()):  # an output that keeps N: N stays whole
        kept = "where(s, f32(x), 0.0)" if result == "bool" else "f32(x) - f32(s)"
        lines[1:1] = ["out y: f32[M, N]"]
        lines.append(f"y = {kept}")
    return "kernel k {\n" + "".join(f"    {line}\n" for line in lines) + "}\n"


@st.composite
def blocked(draw, skeleton: str) -> tuple[str, dict[str, int]]:
    """The spec with a block statement the TPU tiling rule allows (some dimensions left
    whole), and the blocks it sets."""
    try:
        (checked,) = check_source(skeleton, "sweep.pallas")
    except SpecError:
        reject()  # the skeleton is not a valid spec: this sweep is about ones that are
    layouts = tile_layouts(checked.kernel, checked.frame)
    blocks = {}
    for dim in checked.dims:
        rule = tiling_rule(dim, layouts)
        if rule is None or not draw(st.integers(0, 3)):
            continue  # taken whole
        if rule.smallest_power_of_two and draw(st.booleans()):
            blocks[dim] = rule.smallest_power_of_two * draw(st.sampled_from([1, 2, 4]))
        else:
            blocks[dim] = rule.multiple * draw(st.integers(1, 2))
    if not blocks:
        return skeleton, blocks
    statement = "    block " + ", ".join(f"{dim} = {size}" for dim, size in blocks.items()) + "\n"
    return skeleton.replace("\n}", "\n" + statement + "}", 1), blocks


@st.composite
def call_sizes(draw, dims: tuple[str, ...], blocks: dict[str, int]) -> tuple[dict[str, int], bool]:
    """Sizes of each dimension, and whether they are all odd (every GPU block overhangs)."""
    odd = draw(st.booleans())
    sizes = {}
    for dim in dims:
        block = blocks.get(dim, 128)
        kind = draw(st.sampled_from(["aligned", "ragged", "smaller"]))
        if kind == "aligned":
            size = block * draw(st.integers(1, 2))
        elif kind == "ragged":
            size = block * draw(st.integers(1, 2)) + draw(st.integers(1, block - 1))
        else:
            size = draw(st.integers(1, block))
        sizes[dim] = size | 1 if odd else size
        if odd and sizes[dim] == 1:
            sizes[dim] = 3
    return sizes, odd


# --------------------------------------------------------------------------- compiling


def build(spec: str, tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sweep.py"
    path.write_text(generate(spec, "sweep.pallas", "sweep.pallas"), encoding="utf-8")
    return load_module(path, f"_sweep_{abs(hash(spec))}")


def arguments(spec: str, sizes: dict[str, int]) -> list[jax.ShapeDtypeStruct]:
    (checked,) = check_source(spec, "sweep.pallas")
    return [
        jax.ShapeDtypeStruct(tuple(sizes[d] for d in decl.dims), NUMPY_DTYPES[decl.dtype])
        for decl in checked.kernel.inputs
    ]


def compile_both(spec: str, sizes: dict[str, int], every_block_overhangs: bool, chip: str, tmp_path_factory) -> None:
    """Mosaic (for `chip`) and Triton (sm_90) accept the kernel; masks where blocks overhang."""
    kernel = functools.partial(build(spec, tmp_path_factory).k, interpret=False)
    args = arguments(spec, sizes)
    where = f"{spec}at sizes {sizes}"
    try:
        compiled = compile_only.compile_for_tpu(kernel, args, chip=chip)
    except compile_only.CompileError as error:
        pytest.fail(f"Mosaic rejects a spec the checker accepts:\n{where}\n{error.message}")
    assert "tpu_custom_call" in compiled.as_text(), where
    kernels = compile_only.triton_ir(kernel, args)
    assert kernels, where
    for ttir in kernels:
        if every_block_overhangs:
            unmasked = unmasked_block_accesses(ttir)
            assert not unmasked, f"unmasked accesses:\n{where}\n" + "\n".join(unmasked)
        try:
            compile_only.compile_triton(ttir, capability=90)
        except compile_only.CompileError as error:
            pytest.fail(f"{error.compiler} rejects a spec the checker accepts:\n{where}\n{error.message}")


@st.composite
def cases(draw, skeletons):
    spec, blocks = draw(blocked(draw(skeletons)))
    try:
        (checked,) = check_source(spec, "sweep.pallas")
    except SpecError:
        reject()  # a block the checker refuses (N blocked where an output keeps it)
    sizes, odd = draw(call_sizes(checked.dims, blocks))
    return spec, sizes, odd, draw(st.sampled_from(["v5e", "v6e"]))


@SWEEP
@given(cases(elementwise_specs()))
def test_elementwise_specs_compile_for_tpu_and_gpu(tmp_path_factory, case):
    compile_both(*case, tmp_path_factory)


@SWEEP
@given(cases(matmul_specs()))
def test_matmul_specs_compile_for_tpu_and_gpu(tmp_path_factory, case):
    compile_both(*case, tmp_path_factory)


@SWEEP
@given(cases(reduction_specs()))
def test_reduction_specs_compile_for_tpu_and_gpu(tmp_path_factory, case):
    compile_both(*case, tmp_path_factory)
