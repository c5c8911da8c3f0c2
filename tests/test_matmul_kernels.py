"""The bundled matmuls (generated/matmul.py) against independent NumPy references.

NumPy computes each product in float64 (int64 for int8, which must be exact) from
the inputs exactly as the kernel sees them. Shape classes: block-aligned, ragged in
M, N and K, and smaller than one block; small explicit blocks keep grids multi-step
and the runs cheap in interpret mode.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice
from jax.experimental.pallas import tpu as pltpu

from pallasgen.workspace.pipeline import generate

from kernel_cases import BF16, derived_kernels, generated_module, kernels_in, load_module, spec_inputs

SMALL_BLOCKS = dict(block_m=16, block_n=128, block_k=128)
# int8 arrays take blocks of 32 rows: Mosaic tiles them (32, 128).
INT8_BLOCKS = dict(SMALL_BLOCKS, block_m=32)
# (M, N, K) per shape class, read against SMALL_BLOCKS.
SHAPES = {
    "aligned": (32, 256, 384),
    "ragged": (40, 200, 300),
    "smaller_than_a_block": (5, 7, 3),
}


@pytest.fixture(scope="module")
def mm():
    return generated_module("matmul")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def f64(array) -> np.ndarray:
    return np.asarray(array, np.float64)


def gelu_tanh(z):
    return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def assert_close(got, want, rtol, atol):
    np.testing.assert_allclose(f64(got), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape_class", SHAPES)
@pytest.mark.parametrize("blocks", [SMALL_BLOCKS, {}], ids=["small_blocks", "default_blocks"])
def test_f32_matmul_and_fused_relu_match_numpy(mm, rng, shape_class, blocks):
    m, n, k = SHAPES[shape_class]
    x, y = normal(rng, (m, k), np.float32), normal(rng, (k, n), np.float32)
    want = f64(x) @ f64(y)
    assert_close(mm.matmul(x, y, **blocks), want, rtol=1e-5, atol=1e-4)
    assert_close(mm.matmul_relu(x, y, **blocks), np.maximum(want, 0.0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape_class", SHAPES)
def test_int8_matmul_is_exact_in_int32(mm, rng, shape_class):
    m, n, k = SHAPES[shape_class]
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    y = rng.integers(-128, 128, (k, n), dtype=np.int8)
    got = mm.matmul_int8(x, y, **INT8_BLOCKS)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.int64) @ y.astype(np.int64))


@pytest.mark.parametrize("shape_class", SHAPES)
def test_bf16_matmul_with_bias_and_gelu_accumulates_in_f32(mm, rng, shape_class):
    m, n, k = SHAPES[shape_class]
    x, y = normal(rng, (m, k), BF16), normal(rng, (k, n), BF16)
    bias = normal(rng, (n,), np.float32)
    got = mm.matmul_bias_gelu(x, y, bias, **SMALL_BLOCKS)
    assert got.dtype == jnp.bfloat16
    want = gelu_tanh(f64(x) @ f64(y) + f64(bias))
    assert_close(got, want, rtol=1e-2, atol=1e-2)  # one bf16 rounding of the result


@pytest.mark.parametrize("shape_class", SHAPES)
def test_linear_reads_its_weight_transposed(mm, rng, shape_class):
    m, n, k = SHAPES[shape_class]
    x, w = normal(rng, (m, k), BF16), normal(rng, (n, k), BF16)
    bias = normal(rng, (n,), np.float32)
    got = mm.linear(x, w, bias, block_m=16, block_n=128, block_k=128)
    assert_close(got, f64(x) @ f64(w).T + f64(bias), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("shape_class", SHAPES)
def test_batched_matmul_multiplies_each_batch_element(mm, rng, shape_class):
    m, n, k = SHAPES[shape_class]
    x, y = normal(rng, (3, m, k), BF16), normal(rng, (3, k, n), BF16)
    got = mm.batched_matmul(x, y, **SMALL_BLOCKS)
    assert_close(got, np.einsum("bmk,bkn->bmn", f64(x), f64(y)), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape_class", SHAPES)
def test_scores_scale_q_against_every_key(mm, rng, shape_class):
    s, t, d = SHAPES[shape_class]
    q, k = normal(rng, (2, s, d), BF16), normal(rng, (2, t, d), BF16)
    got = mm.scores(q, k, block_s=16, block_t=128, scale=0.5)
    assert_close(got, 0.5 * np.einsum("bsd,btd->bst", f64(q), f64(k)), rtol=1e-4, atol=1e-3)


# Products that once had a plan of their own and rules to match: one path now takes them.
MIXED_SPEC = """
kernel mixed {
    in  x: bf16[M, K]
    in  y: f32[K, N]
    out z: f32[M, N]
    z = x @ y
    block M = 16, N = 128, K = 128
}

kernel mixed_relu {
    in  x: f32[M, K]
    in  y: bf16[K, N]
    out z: f32[M, N]
    z = relu(x @ y)
    block M = 16, N = 128, K = 128
}

kernel product_and_row_sums {
    in  x: f32[M, K]
    in  y: f32[K, N]
    in  b: f32[M]
    out z: f32[M, N]
    out r: f32[M]
    z = x @ y
    r = b * 2
    block M = 16, N = 128, K = 128
}
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed") / "mixed.py"
    path.write_text(generate(MIXED_SPEC, "specs/mixed.pallas", "specs/mixed.pallas"), encoding="utf-8")
    return load_module(path, "_pallasgen_mixed")


def test_operands_of_two_float_dtypes_are_converted_to_their_common_one(mixed, rng):
    m, n, k = SHAPES["ragged"]
    x, y = normal(rng, (m, k), BF16), normal(rng, (k, n), np.float32)
    assert_close(mixed.mixed(x, y), f64(x) @ f64(y), rtol=1e-5, atol=1e-4)


def test_the_gradient_of_a_product_of_two_dtypes_converts_as_the_forward_does(mixed, rng):
    """`x @ y` with x bf16 and y f32 is `f32(x) @ y`: dx, rounded to bf16, and dy in f32."""
    m, n, k = SHAPES["ragged"]
    x, y, dz = normal(rng, (m, k), BF16), normal(rng, (k, n), np.float32), normal(rng, (m, n), np.float32)
    dx, dy = jax.vjp(mixed.mixed, x, y)[1](dz)
    assert (dx.dtype, dy.dtype) == (jnp.bfloat16, jnp.float32)
    assert_close(dx, f64(dz) @ f64(y).T, rtol=1e-2, atol=5e-2)
    assert_close(dy, f64(x).T @ f64(dz), rtol=1e-5, atol=1e-4)


def test_a_product_of_two_dtypes_saves_its_product_for_its_epilogues_derivative(mixed, rng):
    """relu(x @ y): the forward pass saves x @ y as it computes it (y converted), which the
    backward pass reads for relu's derivative."""
    m, n, k = SHAPES["ragged"]
    x, y, dz = normal(rng, (m, k), np.float32), normal(rng, (k, n), BF16), normal(rng, (m, n), np.float32)
    dx, dy = jax.vjp(mixed.mixed_relu, x, y)[1](dz)
    dacc = f64(dz) * (f64(x) @ f64(y) > 0)
    assert_close(dx, dacc @ f64(y).T, rtol=1e-5, atol=1e-4)
    assert_close(dy, f64(x).T @ dacc, rtol=1e-2, atol=5e-2)


def test_a_product_kernel_has_outputs_of_other_dimensions(mixed, rng):
    m, n, k = SHAPES["ragged"]
    x, y, b = normal(rng, (m, k), np.float32), normal(rng, (k, n), np.float32), normal(rng, (m,), np.float32)
    z, r = mixed.product_and_row_sums(x, y, b)
    assert_close(z, f64(x) @ f64(y), rtol=1e-5, atol=1e-4)
    assert_close(r, 2 * f64(b), rtol=0, atol=0)


def test_ragged_k_padding_never_reaches_the_sum(mm):
    """Interpret mode pads edge blocks with NaN: an unmasked K would poison every output."""
    x = np.ones((16, 130), np.float32)
    y = np.ones((130, 128), np.float32)
    got = np.asarray(mm.matmul(x, y, block_m=16, block_n=128, block_k=128))
    assert np.all(got == 130.0)


def test_vmap_over_a_generated_matmul(mm, rng):
    """The quickstart's batched example: vmap adds a parallel grid axis."""
    x, y = normal(rng, (4, 40, 300), np.float32), normal(rng, (4, 300, 200), np.float32)
    got = jax.vmap(functools.partial(mm.matmul, **SMALL_BLOCKS, interpret=True))(x, y)
    assert_close(got, np.einsum("bmk,bkn->bmn", f64(x), f64(y)), rtol=1e-5, atol=1e-4)


def test_a_generated_matmul_composes_inside_jit(mm, rng):
    x, y = normal(rng, (40, 300), np.float32), normal(rng, (300, 200), np.float32)

    @jax.jit
    def layer(x, y):
        return jnp.tanh(mm.matmul_relu(x * 2.0, y, **SMALL_BLOCKS)).sum(axis=0)

    want = np.tanh(np.maximum(f64(x) * 2.0 @ f64(y), 0.0)).sum(axis=0)
    assert_close(layer(x, y), want, rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------- races on a simulated TPU

RACE_SHAPE = (32, 256, 512)  # with SMALL_BLOCKS: grid (2, 2, 4), 4 parallel tiles
RACE_BLOCKS = dict(block_m=16, block_n=128, block_k=128)


def races_found() -> bool:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    return bool(interpret_pallas_call.races.races_found)


def race_detection(cores: int):
    """Interpret params that record races and let the kernel finish: jax 0.12 raises at
    the first race unless `on_race="warn"`, a field that jax 0.10.2 does not have."""
    params = dict(detect_races=True, num_cores_or_threads=cores)
    if "on_race" in {f.name for f in dataclasses.fields(pltpu.InterpretParams)}:
        params["on_race"] = "warn"
    return pltpu.InterpretParams(**params)


def run_with_race_detection(function, x, y, cores):
    params = race_detection(cores)
    try:
        return np.asarray(function(x, y, **RACE_BLOCKS, interpret=params)), races_found()
    finally:
        pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("cores", [4])
def test_no_race_and_right_answer_on_a_simulated_multicore_tpu(mm, rng, cores):
    """Each core owns whole output tiles; K steps of a tile run in order on one core."""
    m, n, k = RACE_SHAPE
    x, y = normal(rng, (m, k), np.float32), normal(rng, (k, n), np.float32)
    got, raced = run_with_race_detection(mm.matmul, x, y, cores)
    assert not raced
    assert_close(got, f64(x) @ f64(y), rtol=1e-5, atol=1e-4)


def test_race_detection_catches_k_marked_parallel(mm, rng, tmp_path):
    """The same kernel with the K axis wrongly marked parallel races (and is wrong)."""
    source = Path(mm.__file__).read_text()
    broken = source.replace('("parallel", "parallel", "arbitrary")', '("parallel", "parallel", "parallel")')
    assert broken != source
    path = tmp_path / "broken_matmul.py"
    path.write_text(broken)
    module = load_module(path, "_broken_matmul")
    m, n, k = RACE_SHAPE
    x, y = normal(rng, (m, k), np.float32), normal(rng, (k, n), np.float32)
    got, raced = run_with_race_detection(module.matmul, x, y, cores=8)
    assert raced
    assert not np.allclose(got, f64(x) @ f64(y), rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- Mosaic lowering

S = jax.ShapeDtypeStruct
LOWERING_CASES = {
    "matmul": [S((1000, 700), jnp.float32), S((700, 900), jnp.float32)],
    "matmul_relu": [S((512, 1024), jnp.float32), S((1024, 512), jnp.float32)],
    "matmul_bias_gelu": [S((1000, 3000), jnp.bfloat16), S((3000, 2000), jnp.bfloat16), S((2000,), jnp.float32)],
    "matmul_int8": [S((1024, 2000), jnp.int8), S((2000, 1024), jnp.int8)],
    "batched_matmul": [S((4, 300, 600), jnp.bfloat16), S((4, 600, 300), jnp.bfloat16)],
    "scores": [S((2, 256, 64), jnp.bfloat16), S((2, 384, 64), jnp.bfloat16)],
    "linear": [S((512, 1000), jnp.bfloat16), S((768, 1000), jnp.bfloat16), S((768,), jnp.float32)],
}
# The kernels derived for jax.grad (the forward with its residuals, the backward kernels),
# at ragged sizes of each dimension, their arrays as they declare them.
RAGGED = {"M": 1000, "N": 768, "K": 3000, "B": 4, "S": 256, "T": 384, "D": 64}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
LOWERING_CASES |= {
    kernel: [S(op.shape(RAGGED), DTYPES[op.dtype]) for op in spec_inputs("matmul", kernel)]
    for kernel in derived_kernels("matmul")
}


def test_every_bundled_matmul_has_a_lowering_case(mm):
    kernels = set(kernels_in(mm))
    assert kernels == set(LOWERING_CASES)


@pytest.mark.parametrize("kernel", LOWERING_CASES)
def test_lowers_for_tpu_with_ragged_sizes(mm, kernel):
    device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    function = functools.partial(getattr(mm, kernel), interpret=False)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(function).trace(*LOWERING_CASES[kernel]).lower(lowering_platforms=("tpu",))
    assert "tpu_custom_call" in lowered.as_text()
