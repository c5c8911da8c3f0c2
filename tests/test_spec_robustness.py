"""An accepted spec always works (issue 30): what a fuzzer found, each case as it was
found. A spec mistake is a diagnostic; a spec that builds gives a module that imports
and whose kernels agree with their references."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kernel_cases import load_module, take_gpu_branch
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import generate


def build(source: str) -> str:
    return generate(source, "spec.pallas", "specs/spec.pallas")


def spec_error(source: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        build(source)
    return caught.value


def module_of(source: str, tmp_path, name: str = "robust"):
    path = tmp_path / f"{name}.py"
    path.write_text(build(source))
    return load_module(path, f"_robust_{name}")


def elementwise(body: str, dtype: str = "f32", extra: str = "", block: int = 128) -> str:
    return f"kernel k {{\n    in  x: {dtype}[N]\n    out z: {dtype}[N]\n{extra}    {body}\n    block N = {block}\n}}\n"


# ------------------------------------------------------------------ accepted, then broken


def test_a_float_param_given_as_a_whole_number_defaults_to_a_float(tmp_path):
    module = module_of(elementwise("z = x * p", extra="    param p: f32 = 9999999999\n"), tmp_path)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(module.k(x)), x * np.float32(9999999999), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(module.k.reference(x)), x * np.float32(9999999999), rtol=1e-6)


BITS = 2**32
POWERS = {
    "z = x + abs(2) ** abs(1000000000)": lambda v: v + pow(2, 1000000000, BITS),
    "z = x ** abs(1000000000)": lambda v: pow(v, 1000000000, BITS),
    "z = x ** 1000000001 + 3 ** abs(100)": lambda v: pow(v, 1000000001, BITS) + pow(3, 100, BITS),
}


@pytest.mark.parametrize("body", POWERS)
def test_an_integer_power_wraps_in_the_kernel_as_in_its_reference(tmp_path, body):
    module = module_of(elementwise(body, "i32"), tmp_path)
    x = np.arange(-3, 5, dtype=np.int32)
    want = np.asarray(module.k.reference(x))
    np.testing.assert_array_equal(np.asarray(module.k(x)), want)
    np.testing.assert_array_equal(want.astype(np.int64) % BITS, [POWERS[body](int(v)) % BITS for v in x])


def test_a_kernel_of_eleven_dimensions_builds_and_runs(tmp_path, monkeypatch):
    dims = ", ".join(f"D{n}" for n in range(11))
    blocks = ", ".join(f"D{n} = 1" for n in range(9))
    source = f"kernel k {{\n    in  x: f32[{dims}]\n    out z: f32[{dims}]\n    z = x + 1\n    block {blocks}\n}}\n"
    module = module_of(source, tmp_path)
    x = np.arange(2**10, dtype=np.float32).reshape((2,) * 9 + (1, 2))
    np.testing.assert_array_equal(np.asarray(module.k(x)), x + 1)
    np.testing.assert_array_equal(np.asarray(module.k.reference(x)), x + 1)
    take_gpu_branch(monkeypatch, module)  # the GPU grid names every index too
    np.testing.assert_array_equal(np.asarray(module.k(x, interpret=True)), x + 1)


# ------------------------------------------------------------------ wrong answers


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_round_of_a_narrow_float_on_the_gpu_path_rounds_as_jnp_round(tmp_path, monkeypatch, dtype):
    import jax.numpy as jnp

    module = module_of(elementwise("z = round(x)", dtype, block=1024), tmp_path, f"round_{dtype}")
    values = [135.0, 134.0, 133.0, 2.5, 3.5, -2.5, -135.0, 0.5, 1.5, 255.0, 256.0, 1000.0, 2047.0, -2045.0]
    x = jnp.asarray(values, dtype={"bf16": jnp.bfloat16, "f16": jnp.float16}[dtype])
    want = np.asarray(jnp.round(x), np.float32)
    np.testing.assert_array_equal(np.asarray(module.k(x), np.float32), want)  # the TPU path
    take_gpu_branch(monkeypatch, module)
    np.testing.assert_array_equal(np.asarray(module.k(x, interpret=True), np.float32), want)


# ------------------------------------------------------------------ diagnostics, not tracebacks


def chained(count: int, outputs: bool = False) -> str:
    """`count` statements, each computing on the one before it."""
    if outputs:
        declared = "".join(f"    out a{n}: f32[N]\n" for n in range(count))
        body = "    a0 = x\n" + "".join(f"    a{n} = a{n - 1} * x\n" for n in range(1, count))
        return f"kernel k {{\n    in  x: f32[N]\n{declared}{body}}}\n"
    body = "    let a0 = x\n" + "".join(f"    let a{n} = a{n - 1} * x\n" for n in range(1, count))
    return f"kernel k {{\n    in  x: f32[N]\n    out z: f32[N]\n{body}    z = a{count - 1}\n}}\n"


@pytest.mark.parametrize("outputs", [False, True], ids=["lets", "outputs"])
def test_statements_chained_past_the_limit_are_a_diagnostic_at_the_first_too_deep(outputs):
    from pallasgen.frontend.transform import MAX_EXPRESSION_DEPTH

    error = spec_error(chained(400, outputs))
    (diagnostic,) = error.diagnostics
    assert f"more than {MAX_EXPRESSION_DEPTH} levels" in diagnostic.message
    assert "lets and outputs it reads" in diagnostic.message
    first_too_deep = MAX_EXPRESSION_DEPTH  # a0 is 1 level, a1 two, ...
    line = (3 + 400 if outputs else 4) + first_too_deep
    assert diagnostic.position.line == line, error.render()


def test_statements_chained_up_to_the_limit_build():
    from pallasgen.frontend.transform import MAX_EXPRESSION_DEPTH

    build(chained(MAX_EXPRESSION_DEPTH - 1))


def test_a_spec_deeper_than_python_allows_is_a_diagnostic_not_a_recursion_error():
    import sys

    source = chained(60)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(120)  # as if the spec were deeper than the passes can go
    try:
        error = spec_error(source)
    finally:
        sys.setrecursionlimit(limit)
    assert "too deep" in error.diagnostics[0].message


@pytest.mark.parametrize("where", ["z = x + {}", "param p: i32 = {}\n    z = x"])
def test_a_number_of_thousands_of_digits_is_a_diagnostic(where):
    number = "1" * 5000
    error = spec_error(elementwise(where.format(number), "i32"))
    (diagnostic,) = error.diagnostics
    assert "5000 digits" in diagnostic.message
    assert len(error.render()) < 2000  # the number is not printed whole


def test_thousands_of_unknown_names_are_reported_quickly(monkeypatch):
    from pallasgen.analysis import infer
    from pallasgen.frontend import errors

    calls = []
    original = errors.did_you_mean
    monkeypatch.setattr(infer, "did_you_mean", lambda *a: calls.append(a) or original(*a))
    count = 3000
    body = "".join(f"    let v{n} = x + u{n}\n" for n in range(count))
    start = time.process_time()
    error = spec_error(f"kernel k {{\n    in  x: f32[N]\n    out z: f32[N]\n{body}    z = x\n}}\n")
    assert len(error.diagnostics) == count
    assert len(calls) <= errors.MAX_REPORTED  # a hint only for the errors shown
    assert time.process_time() - start < 30


def test_a_huge_name_is_shown_clipped_and_quickly():
    name = "a" * 1_000_000
    start = time.process_time()
    rendered = spec_error(elementwise(f"z = x + {name}b")).render()
    assert len(rendered) < 1000, rendered[:2000]
    assert "^" in rendered.splitlines()[2]
    assert time.process_time() - start < 10
