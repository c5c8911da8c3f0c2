"""Specs the checker accepts that Mosaic or Triton once rejected, or that were wrong,
built and compiled for real (see test_compiled.py for the compilers), and run in
interpret mode against NumPy.

- narrow integers: compares, maximum, minimum, clip and where on i8/u8/i16 (Mosaic has
  no narrow-integer compare; the TPU kernel widens them to i32), and arithmetic, relu
  and abs (no i8/u8 add, multiply or negation, no narrow division or maximum);
- division and remainder of every integer dtype, by zero too, as XLA computes them
  (u8 floor division in i32 would give 254 for x // 0: the TPU kernel truncates);
- integer bit operations: `^` and shifts by a literal on i32, u8 and i16 (the TPU kernel
  shifts narrow integers in i32, then wraps them to their dtype), and `^` of bools;
- f16 (no f16 vectors on v5e/v6e; the TPU kernel computes in f32), its `max` and
  `min` too, kept in f32 to the TPU kernel's f32 output;
- bool vectors in blocks of 128 (held as 32-bit in VMEM);
- a batched product whose epilogue reads an array without the batch dimension;
- positions after a product (issue 19): `where(index(M) >= index(N), x @ y, 0)` with K
  blocked (the epilogue runs under `pl.when`, its positions read before it), and batched
  with a batch dimension of block 1 (no axis of the blocks: positions along M and N are
  2-D, index(B) the batch element's), K blocked or `q @ k.T` with D whole; and positions
  read at the last step of a blocked reduction (TPU: under `pl.when`) or in the GPU
  kernel's loop over its blocks;
- bf16 and i8 products `x @ y.T` at sizes where a block has fewer than 5 rows (Mosaic
  cannot select such blocks to mask a ragged K) or y has one row (Pallas lowers that as a
  vector product, which fails for all but f32; an f32 one fails to broadcast a bias);
- `where` between literals or params by a condition known at trace time (Pallas's
  Triton lowering gives such constants the condition's dtype); the kernel uses a
  Python conditional, constants through functions folded as the code is generated;
- `where` between literals or params by a condition traced with the kernel (a param
  through a function): chosen between f32 or i32 constants, and converted where the
  choice meets an array as JAX converts a weak value (a bf16 array compares with the
  choice rounded to bf16);
- `where` by an array condition between two scalars of i8 or bf16 (Mosaic cannot
  relayout the condition for them); the TPU kernel chooses 16- and 8-bit values in 32
  bits;
- a bf16 compare choosing between 32-bit values (a v6e compares bf16 in bf16, and
  Mosaic cannot relayout its 16-bit mask for a 32-bit choice); the TPU kernel compares
  in f32, a literal rounded to bf16 first (1.001 compares as 1.0, as in JAX);
- blocks passed at call time, checked against the same tiling rule as the spec.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_cases import BF16, load_module, take_gpu_branch, unmasked_block_accesses
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import generate

pytestmark = pytest.mark.skipif(
    bool(compile_only.missing_compilers()), reason="needs libtpu (jax[tpu]) and triton: pip install -e '.[dev]'"
)

SPECS = {
    "narrow_ints": """
kernel narrow_ints {
    in  x: i8[M, N]
    in  y: u8[M, N]
    in  z: i16[M, N]
    out a: i8[M, N]
    out b: u8[M, N]
    out c: i16[M, N]
    out pos: bool[M, N]
    a = where(x > 0, maximum(x, -3), clip(x, -100, 100))
    b = minimum(y, 200)
    c = maximum(z, minimum(z, 7))
    pos = (x >= 1) & (y != 0) & (z < 9)
    block M = 32, N = 256
}
""",
    "half": """
kernel half {
    in  x: f16[M, N]
    in  s: f32[N]
    out y: f16[M, N]
    out t: f32[M, N]
    y = f16(exp(x) * s)
    t = f32(x) + 1
    block M = 16, N = 256
}
""",
    "flags": """
kernel flags {
    in  x: f32[N]
    out on: bool[N]
    on = x > 0.5
    block N = 128
}
""",
    "bmm_bias": """
kernel bmm_bias {
    in  x: f32[B, M, K]
    in  y: f32[B, K, N]
    in  bias: f32[N]
    in  scale: f32[M]
    out z: f32[B, M, N]
    z = (x @ y + bias) * scale
    block B = 1, M = 128, N = 128, K = 128
}
""",
    "narrow_arithmetic": """
kernel narrow_arithmetic {
    in  x: i8[M, N]
    in  y: u8[M, N]
    in  z: i16[M, N]
    out a: i8[M, N]
    out b: u8[M, N]
    out c: i16[M, N]
    a = x * x + x // 3 - x % 5 + abs(x) - (-x) ** 2
    b = y * 3 - y // 7 + y % 11 + relu(y)
    c = z * z - z // (z % 7 + 8) + relu(-z)
    block M = 32, N = 256
}
""",
    "bit_ops": """
kernel bit_ops {
    in  x: i32[M, N]
    in  w: u8[M, N]
    in  h: i16[M, N]
    out mixed: i32[M, N]
    out lo, hi: i8[M, N]
    out g: i16[M, N]
    out odd: bool[M, N]
    let a = x ^ ((x >> 16) & 65535)
    mixed = a ^ a << 5                  # Python precedence: a ^ (a << 5)
    lo = i8(w << 4) >> 4
    hi = i8(w) >> 4
    g = (h >> 3) ^ (h << 2)
    odd = (x > 0) ^ (w > 127)
    block M = 32, N = 256
}
""",
    "division": """
kernel division {
    in  a: i8[M, N]
    in  b: u8[M, N]
    in  c: i16[M, N]
    in  d: i32[M, N]
    in  by: i8[M, N]
    out qa: i8[M, N]
    out ra: i8[M, N]
    out qb: u8[M, N]
    out rb: u8[M, N]
    out qc: i16[M, N]
    out rc: i16[M, N]
    out qd: i32[M, N]
    out rd: i32[M, N]
    qa = a // by
    ra = a % by
    qb = b // u8(by)
    rb = b % u8(by)
    qc = c // i16(by)
    rc = c % i16(by)
    qd = d // i32(by)
    rd = d % i32(by)
    block M = 32, N = 256
}
""",
    "static_where": """
kernel static_where {
    in  x: f32[M, N]
    out y: f32[M, N]
    param s: f32 = 1.0
    let flag = s > 0
    y = x * where(s > 0, 1.0, -1.0) + where(flag, 2, 0.5) + where(~flag, 1, 2) + where(true, 0, 9)
    block M = 8, N = 128
}
""",
    "static_calls": """
kernel static_calls {
    in  x: f32[M, N]
    out y: f32[M, N]
    param s: f32 = 1.0
    let big = maximum(2.0, 0.5) > 0.75
    y = x + where(2 > maximum(2, 2), 1.0, 0.0) + where(big, 2, 0.5) + where(~(exp(1.0) < 2), 4, 8) + where(s > i32(-1.5), maximum(2, 3), 0.5)
    block M = 8, N = 128
}
""",
    "half_extremes": """
kernel half_extremes {
    in  x: f16[M, N]
    out top, low: f16[M]
    top = max(x, N)
    low = min(x, N)
    block M = 16, N = 128
}
""",
    "traced_where": """
kernel traced_where {
    in  x: f32[M, N]
    in  h: bf16[M, N]
    in  q: i8[M, N]
    out y: f32[M, N]
    out z: bf16[M, N]
    out r: i8[M, N]
    out above: bool[M, N]
    param s: f32 = 1.0
    param t: i32 = 3
    let gain = where(maximum(s, 0.0) > 0.5, 1.5, 0.25)
    y = x + where(exp(s) < 3, s, 2) + gain * 2
    z = h * gain + where(abs(t) > 2, 1, 0.5)
    r = q + where(minimum(t, 9) > 2, t, 1)
    above = h > gain * 1.001
    block M = 32, N = 128
}
""",
    "bf16_compare": """
kernel bf16_compare {
    in  a: bf16[M, N]
    in  b: f32[M, N]
    out r: f32[M, N]
    out c: bool[M, N]
    r = where(a > 1.001, exp(2), 1.5) + where(a > b, 1.0, 0.0)
    c = a >= 1.001
    block M = 16, N = 128
}
""",
    "scalar_choice": """
kernel scalar_choice {
    in  c: bool[M, N]
    in  s: i8[]
    in  t: bf16[]
    out a: i8[M, N]
    out b: bf16[M, N]
    a = where(c, 4, s)
    b = where(c, t, 0.5)
    block M = 32, N = 256
}
""",
    **{f"nt_{dtype}": f"""
kernel nt_{dtype} {{
    in  x: {dtype}[M, K]
    in  y: {dtype}[N, K]
    out z: {"i32" if dtype == "i8" else "f32"}[M, N]
    z = x @ y.T
    block M = 32, N = 128, K = 256
}}
""" for dtype in ("bf16", "i8")},
    "nt_f32_bias": """
kernel nt_f32_bias {
    in  x: f32[M, K]
    in  y: f32[N, K]
    in  bias: f32[N]
    out z: f32[M, N]
    z = x @ y.T + bias
    block M = 16, N = 128
}
""",
    "lower_scores": """
kernel lower_scores {
    in  x: f32[M, K]
    in  y: f32[K, N]
    out z: f32[M, N]
    z = where(index(M) >= index(N), x @ y, 0)
    block M = 128, N = 128, K = 128
}
""",
    "batched_lower": """
kernel batched_lower {
    in  x: f32[B, M, K]
    in  y: f32[B, K, N]
    out z: f32[B, M, N]
    z = where(index(M) + 100 * index(B) >= index(N), x @ y, 0)
    block B = 1, M = 128, N = 128, K = 128
}
""",
    "causal_scores": """
kernel causal_scores {
    in  q: f32[B, S, D]
    in  k: f32[B, T, D]
    out s: f32[B, S, T]
    s = where(index(S) >= index(T), q @ k.T, -1e30)
    block B = 1, S = 128, T = 128
}
""",
    "weighted_sums": """
kernel weighted_sums {
    in  x: f32[M, V]
    out s: f32[M]
    s = sum(x * f32(index(M)), V) + f32(index(M))
    block M = 8, V = 128
}
""",
}


@functools.cache
def module(name: str, tmp_root: str):
    path = f"{tmp_root}/{name}.py"
    with open(path, "w", encoding="utf-8") as f:
        f.write(generate(SPECS[name], f"{name}.pallas", f"specs/{name}.pallas"))
    return load_module(__import__("pathlib").Path(path), f"_compiled_spec_{name}")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("compiled_specs"))
    return lambda name: module(name, root)


def numpy_inputs(name: str, rng, m=70, n=300, b=2, k=200):
    if name in ("narrow_ints", "narrow_arithmetic"):
        return [
            rng.integers(-128, 128, (m, n)).astype(np.int8),
            rng.integers(0, 256, (m, n)).astype(np.uint8),
            rng.integers(-300, 300, (m, n)).astype(np.int16),
        ]
    if name == "half":
        return [rng.standard_normal((m, n)).astype(np.float16), rng.standard_normal(n).astype(np.float32)]
    if name == "bit_ops":  # every bit pattern of each dtype
        return [rng.integers(i.min, i.max, (m, n), endpoint=True).astype(i.dtype) for i in map(np.iinfo, BIT_DTYPES)]
    if name == "division":  # divisors 0 to 3, a third of them 0
        info = [np.iinfo(dtype) for dtype in (np.int8, np.uint8, np.int16, np.int32)]
        return [rng.integers(i.min, i.max, (m, n), endpoint=True).astype(i.dtype) for i in info] + [
            rng.integers(0, 3, (m, n)).astype(np.int8)
        ]
    if name == "flags":
        return [rng.random(n * 5 + 3).astype(np.float32)]
    if name in ("static_where", "static_calls"):
        return [rng.standard_normal((m, n)).astype(np.float32)]
    if name == "half_extremes":
        return [rng.standard_normal((m, n)).astype(np.float16)]
    if name == "traced_where":
        x = rng.standard_normal((m, n)).astype(np.float32)
        return [x, x.astype(BF16), rng.integers(-128, 128, (m, n)).astype(np.int8)]
    if name == "bf16_compare":  # values near 1, where 1.001 and its bf16 rounding (1.0) differ
        a = (1 + rng.integers(-4, 5, (m, n)) / 128).astype(BF16)
        return [a, (a.astype(np.float32) + rng.choice([-1e-3, 0, 1e-3], (m, n))).astype(np.float32)]
    if name == "scalar_choice":
        return [rng.random((m, n)) < 0.5, np.array(-7, np.int8), np.array(1.5, BF16)]
    if name == "nt_i8":
        return [rng.integers(-128, 128, shape).astype(np.int8) for shape in ((m, k), (n, k))]
    if name == "nt_bf16":
        return [rng.standard_normal(shape).astype(BF16) for shape in ((m, k), (n, k))]
    if name == "nt_f32_bias":
        return [rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (n, k), (n,))]
    if name == "lower_scores":
        return [rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (k, n))]
    if name == "batched_lower":
        return [rng.standard_normal(shape).astype(np.float32) for shape in ((b, m, k), (b, k, n))]
    if name == "weighted_sums":
        return [rng.standard_normal((m, n)).astype(np.float32)]
    if name == "causal_scores":  # S, T, D as m, n, k
        return [rng.standard_normal(shape).astype(np.float32) for shape in ((b, m, k), (b, n, k))]
    return [
        rng.standard_normal((b, m, k)).astype(np.float32),
        rng.standard_normal((b, k, n)).astype(np.float32),
        rng.standard_normal(n).astype(np.float32),
        rng.standard_normal(m).astype(np.float32),
    ]


def expected(name: str, *arrays):
    """Independent NumPy (int64 / float64) results."""
    if name == "narrow_ints":
        x, y, z = (a.astype(np.int64) for a in arrays)
        a = np.where(x > 0, np.maximum(x, -3), np.clip(x, -100, 100)).astype(np.int8)
        return (
            a,
            np.minimum(y, 200).astype(np.uint8),
            np.maximum(z, np.minimum(z, 7)).astype(np.int16),
            ((x >= 1) & (y != 0) & (z < 9)),
        )
    if name == "bit_ops":  # in int64, wrapped to each dtype as it shifts out of it
        x, w, h = (a.astype(np.int64) for a in arrays)
        a = x ^ ((x >> 16) & 65535)
        nibble = lambda v: np.where(v >= 8, v - 16, v)  # noqa: E731
        return (
            wrap(a ^ (a << 5), np.int32),
            nibble(w & 15).astype(np.int8),
            nibble(w >> 4).astype(np.int8),
            wrap((h >> 3) ^ (h << 2), np.int16),
            (x > 0) ^ (w > 127),
        )
    if name == "half":
        x, s = (a.astype(np.float64) for a in arrays)
        return (np.exp(x) * s).astype(np.float16), x + 1
    if name == "narrow_arithmetic":  # wrapping arithmetic: computed in int64, cast back
        x, y, z = (a.astype(np.int64) for a in arrays)
        a = x * x + x // 3 - x % 5 + np.abs(x) - (-x) ** 2
        b = y * 3 - y // 7 + y % 11 + np.maximum(y, 0)
        c = z * z - z // (z % 7 + 8) + np.maximum(-z, 0)
        return a.astype(np.int8), b.astype(np.uint8), c.astype(np.int16)
    if name == "flags":
        return (arrays[0] > 0.5,)
    if name == "division":  # as XLA divides each dtype, by zero too (u8: x // 0 is 255, not NumPy's 0)
        *numerators, by = (jnp.asarray(a) for a in arrays)
        return tuple(f(x, by.astype(x.dtype)) for x in numerators for f in (jnp.floor_divide, jnp.remainder))
    if name == "static_where":
        return (arrays[0].astype(np.float64) + 4,)
    if name == "static_calls":
        return (arrays[0].astype(np.float64) + 9,)
    if name == "half_extremes":
        return arrays[0].max(axis=1), arrays[0].min(axis=1)
    if name == "traced_where":  # s = 1.0, t = 3: gain 1.5; 1.5 * 1.001 is 1.5 in bf16
        x, h, q = arrays
        h = h.astype(np.float64)
        return x.astype(np.float64) + 4, h * 1.5 + 1, (q.astype(np.int64) + 3).astype(np.int8), h > 1.5
    if name == "bf16_compare":
        a, b = (x.astype(np.float64) for x in arrays)
        return np.where(a > 1.0, np.exp(2), 1.5) + (a > b), a >= 1.0
    if name == "scalar_choice":
        c, s, t = arrays
        return np.where(c, 4, s).astype(np.int8), np.where(c, t.astype(np.float64), 0.5)
    if name.startswith("nt_"):
        x, y, *bias = (a.astype(np.float64) for a in arrays)
        return (x @ y.T + sum(bias),)
    if name == "weighted_sums":
        x, rows = arrays[0].astype(np.float64), np.arange(arrays[0].shape[0])
        return (x.sum(axis=1) * rows + rows,)
    if name in ("lower_scores", "batched_lower", "causal_scores"):
        x, y = (a.astype(np.float64) for a in arrays)
        product = x @ (np.swapaxes(y, -1, -2) if name == "causal_scores" else y)
        rows, columns = np.arange(product.shape[-2])[:, None], np.arange(product.shape[-1])[None, :]
        if name == "batched_lower":
            rows = rows + 100 * np.arange(product.shape[0])[:, None, None]
        return (np.where(rows >= columns, product, -1e30 if name == "causal_scores" else 0.0),)
    x, y, bias, scale = (a.astype(np.float64) for a in arrays)
    return ((x @ y + bias) * scale[:, None],)


BIT_DTYPES = (np.int32, np.uint8, np.int16)


def wrap(values, dtype):
    """int64 `values` as `dtype` wraps them: their low bits, as two's complement."""
    bits = np.iinfo(dtype).bits
    low = values & ((1 << bits) - 1)
    return np.where(low >= 1 << (bits - 1), low - (1 << bits), low).astype(dtype)


def compare(name, got, want):
    for g, w in zip(got if isinstance(got, tuple) else (got,), want):
        g = np.asarray(g)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
        else:
            tolerance = {np.dtype(np.float16): 2e-3, np.dtype(BF16): 2**-7}.get(g.dtype, 1e-4)
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_mosaic_compiles_the_spec(built, name, chip):
    function = getattr(built(name), name)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in numpy_inputs(name, np.random.default_rng(0), m=256)]
    compiled = compile_only.compile_for_tpu(functools.partial(function, interpret=False), args, chip=chip)
    assert "tpu_custom_call" in compiled.as_text()


@pytest.mark.parametrize("name", list(SPECS))
def test_triton_compiles_the_spec_with_every_access_masked(built, name):
    function = getattr(built(name), name)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in numpy_inputs(name, np.random.default_rng(0), 5, 101, 2, 37)]
    for ttir in compile_only.triton_ir(functools.partial(function, interpret=False), args):
        assert not unmasked_block_accesses(ttir)
        compile_only.compile_triton(ttir, capability=90)


@pytest.mark.parametrize("name", list(SPECS))
def test_interpreted_kernel_matches_numpy(built, name):
    rng = np.random.default_rng(1)
    arrays = numpy_inputs(name, rng)
    compare(name, getattr(built(name), name)(*arrays), expected(name, *arrays))


@pytest.mark.parametrize("name", list(SPECS))
def test_interpreted_triton_kernel_matches_numpy(built, name, monkeypatch):
    """The Triton path too: bmm_bias's bias [N] and scale [M], which lack the batch
    dimension, are blocked as the kernel's tiles hold them (one block for every batch
    element), as on TPU."""
    module = built(name)
    take_gpu_branch(monkeypatch, module)
    arrays = numpy_inputs(name, np.random.default_rng(1))
    compare(name, getattr(module, name)(*arrays, interpret=True), expected(name, *arrays))


def test_a_call_time_block_that_breaks_the_tiling_rule_is_refused_before_compiling(built):
    x = jax.ShapeDtypeStruct((4096, 512), np.int8)
    y, z = jax.ShapeDtypeStruct((4096, 512), np.uint8), jax.ShapeDtypeStruct((4096, 512), np.int16)
    function = functools.partial(built("narrow_ints").narrow_ints, block_m=16, interpret=False)
    with pytest.raises(
        ValueError,
        match=r"narrow_ints: block_m=16 breaks the TPU tiling rule: M is the second-to-last"
        r" dimension of a block of i8 values, so it is a multiple of 32; use 32",
    ):
        jax.jit(function).trace(x, y, z)


def test_a_call_time_block_of_the_whole_dimension_is_always_legal(built):
    rng = np.random.default_rng(2)
    arrays = numpy_inputs("narrow_ints", rng, m=20)
    got = built("narrow_ints").narrow_ints(*arrays, block_m=20)
    compare("narrow_ints", got, expected("narrow_ints", *arrays))


def test_the_default_call_compiles_mosaic_when_compiling_for_a_tpu_from_a_cpu_host(built):
    """Dispatch follows the platform being compiled for, not the host's backend: a
    deviceless ahead-of-time compile for a TPU gets the Mosaic kernel, not the interpreter."""
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in numpy_inputs("bmm_bias", np.random.default_rng(0), m=256)]
    compiled = compile_only.compile_for_tpu(built("bmm_bias").bmm_bias, args)
    assert "tpu_custom_call" in compiled.as_text()


def test_the_default_call_exports_the_triton_kernel_for_cuda(built):
    from jax._src.mesh import AbstractDevice

    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in numpy_inputs("bmm_bias", np.random.default_rng(0))]
    h100 = AbstractDevice(device_kind=compile_only.GPU_DEVICE_KIND, num_cores=compile_only.GPU_CORES, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h100)):
        exported = jax.export.export(
            jax.jit(built("bmm_bias").bmm_bias),
            platforms=("cuda",),
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args)
    text = exported.mlir_module()
    assert "__gpu$xla.gpu.triton" in text and "tpu_custom_call" not in text


@pytest.mark.parametrize("name", ["nt_bf16", "nt_i8", "nt_f32_bias"])
@pytest.mark.parametrize(("m", "n", "k"), [(3, 1, 300), (2, 3, 257), (17, 1, 2), (4, 200, 300)])
def test_products_with_tiny_blocks_compile_for_tpu_and_match_numpy(built, name, m, n, k):
    """Blocks of 1 to 4 rows of 16- and 8-bit values, masked for a ragged K, and a
    one-row y: the TPU kernel selects in 32 bits and multiplies and sums instead."""
    arrays = numpy_inputs(name, np.random.default_rng(3), m=m, n=n, k=k)
    function = getattr(built(name), name)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    compiled = compile_only.compile_for_tpu(functools.partial(function, interpret=False), args)
    assert "tpu_custom_call" in compiled.as_text()
    compare(name, function(*arrays), expected(name, *arrays))
