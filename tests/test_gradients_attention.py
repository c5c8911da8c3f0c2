"""`jax.grad` of the attention kernels (specs/attention.pallas) runs the FlashAttention-2
backward pass derived from their specs (pallasgen/gradients/attention.py):
`NAME_backward_dq` (dq, delta), `NAME_backward_dkdv` (dk, dv; summed over R by
`gqa_backward_over_r`), recomputing the probabilities from the saved log-sum-exp.

Gradients are compared with `jax.vjp` of the references and with float64 NumPy ones
(test_attention.py's `attention_backward_numpy`) at ragged sizes, on both paths (the
TPU and the GPU kernels in interpret mode); the derived kernels with the hand-written
`attention_dq` and `attention_dkdv`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jax.test_util import check_grads

from kernel_cases import (
    compiled,
    assert_mosaic_compiles,
    assert_triton_compiles_masked,
    BF16,
    generated_module,
    load_module,
    take_gpu_branch,
)
from pallasgen.gradients.derive import every_kernel
from pallasgen.workspace.pipeline import check_source, generate
from test_attention import attention_backward_numpy, attention_numpy, causal, f64
from kernel_cases import pallas_calls_and_primitives
from test_matmul_kernels import race_detection, races_found

KERNELS = ["attention", "attention_full", "attention_bottom_right", "gqa"]
SCALE = {"gqa": 0.088388}
SPEC = Path(__file__).resolve().parents[1] / "specs" / "attention.pallas"


@pytest.fixture(scope="module")
def attention():
    return generated_module("attention")


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def arrays(name, rng, s, t, d=32):
    """q, k, v, and a cotangent of each output (o, and lse where the kernel has it)."""
    q_shape = (1, 2, 3, s, d) if name == "gqa" else (2, 2, s, d)
    kv_shape = (1, 2, t, d) if name == "gqa" else (2, 2, t, d)
    q, k, v, do = bf16(rng, *q_shape), bf16(rng, *kv_shape), bf16(rng, *kv_shape), bf16(rng, *q_shape)
    cotangents = (do, rng.standard_normal(q_shape[:-1]).astype(np.float32)) if name == "attention" else do
    return (q, k, v), cotangents


def gradients_numpy(name, q, k, v, cotangents):
    """dq, dk, dv in float64: ds = p * (do v^T - delta), with delta = sum(do * o) less the
    log-sum-exp's cotangent (d lse / ds = p); k, v broadcast over R sum theirs over it."""
    do, dlse = cotangents if name == "attention" else (cotangents, 0.0)
    s, t = q.shape[-2], k.shape[-2]
    mask = {
        "attention": causal(s, t),
        "attention_bottom_right": causal(s, t, bottom_right=True),
    }.get(name, np.ones((s, t), bool))
    if name == "gqa":
        k, v = k[:, :, None], v[:, :, None]
    scale = SCALE.get(name, 0.125)
    o, lse = attention_numpy(q, k, v, scale=scale, mask=mask)
    delta = (f64(do) * o).sum(-1) - dlse
    dq, _, dk, dv = attention_backward_numpy(q, k, v, do, lse, scale=scale, mask=mask, delta=delta)
    return (dq, dk.sum(2), dv.sum(2)) if name == "gqa" else (dq, dk, dv)


def kernel_vjp(module, name, primals, cotangents):
    function = functools.partial(getattr(module, name), interpret=True)
    _, vjp = jax.vjp(function, *primals)
    return vjp(cotangents)


def assert_close(got, want, tolerance=2**-6):
    """Within bf16 rounding of the operands of the backward products, relative to the
    largest gradient."""
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(f64(g), f64(w), rtol=tolerance, atol=tolerance * np.abs(f64(w)).max())


def on_path(module, path, monkeypatch):
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)


# The bundled kernels take bf16 only; finite differences need f32 (same statements).
F32_ATTENTION = """kernel attention_f32 {
    in  q: f32[B, H, S, D]
    in  k, v: f32[B, H, T, D]
    out o: f32[B, H, S, D]
    out lse: f32[B, H, S]
    param scale: f32 = 0.125
    let s = where(index(S) >= index(T), (q @ k.T) * scale, -inf)
    let p = exp(s - max(s, T))
    o = (p @ v) / sum(p, T)
    lse = logsumexp(s, T)
    block B = 1, H = 1, S = 128, T = 8  # lse's last dimension is S: a multiple of 128 on TPU
}
"""


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_check_grads_of_causal_attention_on_small_f32_inputs(tmp_path, path, monkeypatch):
    """Finite differences agree with the derived backward kernels (both outputs; T swept in
    three blocks, the last one ragged, blocks past the diagonal skipped)."""
    source = tmp_path / "attention_f32.py"
    source.write_text(generate(F32_ATTENTION, "specs/attention_f32.pallas", "specs/attention_f32.pallas"))
    module = load_module(source, f"_pallasgen_attention_f32_{path}_{tmp_path.name}")
    on_path(module, path, monkeypatch)
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 2, n, 4)), jnp.float32) for n in (19, 19, 19))
    check_grads(functools.partial(module.attention_f32, interpret=True), (q, k, v), 1, ["rev"], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("path", ["tpu", "gpu"])
@pytest.mark.parametrize("name", KERNELS)
def test_grad_matches_the_references_vjp_and_float64_numpy_at_ragged_sizes(attention, name, path, monkeypatch):
    """S = 200 and T = 300 fill no block (128 by 128 on TPU, 64 at most on GPU)."""
    on_path(attention, path, monkeypatch)
    primals, cotangents = arrays(name, np.random.default_rng(0), s=200, t=300)
    got = kernel_vjp(attention, name, primals, cotangents)
    _, reference_vjp = jax.vjp(getattr(attention, name).reference, *primals)
    assert_close(got, reference_vjp(cotangents))
    assert_close(got, gradients_numpy(name, *primals, cotangents))


@pytest.mark.parametrize("name", KERNELS)
def test_grad_on_a_simulated_two_core_tpu_has_no_race_and_the_right_answer(attention, name):
    """Simulated TPU memories (uninitialized memory is NaN, out-of-bounds reads raise),
    the parallel grid axes split over two cores, ragged S and T."""
    primals, cotangents = arrays(name, np.random.default_rng(5), s=200, t=300)
    function = functools.partial(getattr(attention, name), interpret=race_detection(cores=2))
    try:
        _, vjp = jax.vjp(function, *primals)
        got = jax.block_until_ready(vjp(cotangents))  # finished before its state is reset
        assert not races_found()
    finally:
        pltpu.reset_tpu_interpret_mode_state()
    assert_close(got, gradients_numpy(name, *primals, cotangents))


def test_the_log_sum_exp_outputs_cotangent_reaches_the_inputs(attention):
    """attention's lse output: its cotangent alone gives dq, dk (and no dv)."""
    primals, (do, dlse) = arrays("attention", np.random.default_rng(1), s=70, t=90)
    cotangents = (np.zeros_like(do), dlse)
    dq, dk, dv = kernel_vjp(attention, "attention", primals, cotangents)
    assert_close((dq, dk, dv), gradients_numpy("attention", *primals, cotangents))
    assert np.abs(f64(dq)).max() > 0.1 and not f64(dv).any()


BACKWARD_CALLS = {
    "attention": ["attention", "attention_backward_dq", "attention_backward_dkdv"],
    "attention_full": [
        "attention_full",
        "attention_full_backward_dq",
        "attention_full_backward_dkdv",
    ],
    "attention_bottom_right": [
        "attention_bottom_right",
        "attention_bottom_right_backward_dq",
        "attention_bottom_right_backward_dkdv",
    ],
    "gqa": ["gqa", "gqa_backward_dq", "gqa_backward_dkdv", "gqa_backward_over_r"],
}


@pytest.mark.parametrize("name", KERNELS)
def test_grad_runs_the_derived_backward_kernels_not_xlas_differentiation(attention, name):
    """The forward pass (the kernel, writing the log-sum-exp too where it does not output
    one), then the backward kernels; no product or exp outside them."""
    (q, k, v), _ = arrays(name, np.random.default_rng(2), s=70, t=90)

    def loss(q, k, v):
        out = getattr(attention, name)(q, k, v, interpret=True)
        return sum(x.astype(jnp.float32).sum() for x in (out if isinstance(out, tuple) else (out,)))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    calls, primitives = pallas_calls_and_primitives(jaxpr)
    assert sorted(calls) == sorted(BACKWARD_CALLS[name])
    assert not primitives & {"dot_general", "exp"}


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_grad_of_causal_attention_never_reads_the_keys_no_query_sees(attention, path, monkeypatch):
    """Keys and values past every query's reach are NaN: the forward and both backward
    kernels skip their blocks (a block computed and masked would carry 0 * NaN), and
    those keys and values get exactly 0."""
    rng = np.random.default_rng(3)
    (q, k, v), cotangents = arrays("attention", rng, s=128, t=512)
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[..., 128:, :] = np.nan
    v_nan[..., 128:, :] = np.nan
    on_path(attention, path, monkeypatch)
    dq, dk, dv = kernel_vjp(attention, "attention", (q, k_nan, v_nan), cotangents)
    assert_close((dq, dk, dv), gradients_numpy("attention", q, k, v, cotangents))
    assert not f64(dk)[..., 128:, :].any() and not f64(dv)[..., 128:, :].any()


def test_the_saving_kernel_skips_the_blocks_the_kernel_skips():
    """attention_bottom_right, writing its residual log-sum-exp under jax.grad, computes it
    in the kernel's own sweep over T (one carry of max and one of exp-sums for both), and
    skips where it does."""
    checked = {c.kernel.name: c for c in check_source(SPEC.read_text(), str(SPEC))}
    forward = checked["attention_bottom_right"]
    saving = forward.gradient.saving
    assert saving.sweep.skip is not None and saving.sweep.skip.condition == forward.sweep.skip.condition
    assert sorted(c.kind for c in saving.sweep.carries) == sorted(c.kind for c in forward.sweep.carries)


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_the_derived_kernels_equal_the_hand_written_ones(attention, path, monkeypatch):
    """attention_backward_dq and _dkdv, derived from `attention`, against attention_dq and
    attention_dkdv written by hand in the spec, on the same arrays (no lse cotangent)."""
    rng = np.random.default_rng(4)
    (q, k, v), (do, _) = arrays("attention", rng, s=200, t=300)
    o, lse = attention_numpy(q, k, v, scale=0.125, mask=causal(200, 300))
    o, lse, zero = o.astype(BF16), lse.astype(np.float32), np.zeros_like(lse, dtype=np.float32)
    on_path(attention, path, monkeypatch)
    dq, delta = attention.attention_backward_dq(q, k, v, o, do, lse, zero, interpret=True)
    want_dq, want_delta = attention.attention_dq(q, k, v, o, do, lse, interpret=True)
    assert_close((dq, delta), (want_dq, want_delta))
    dk, dv = attention.attention_backward_dkdv(q, k, v, do, lse, delta, interpret=True)
    assert_close((dk, dv), attention.attention_dkdv(q, k, v, do, lse, delta, interpret=True))


# --------------------------------------------------------------------------- compiled

SIZES = {"B": 1, "H": 2, "G": 2, "R": 3, "S": 300, "T": 500, "D": 128}
# The sum over R takes one T by 128 D per GPU program: a ragged D gives it an edge to mask.
RAGGED_D = {"gqa_backward_over_r": 100}
DERIVED = [name for names in BACKWARD_CALLS.values() for name in names if name not in KERNELS]


def abstract(name):
    kernel = next(c.kernel for c in every_kernel(check_source(SPEC.read_text(), str(SPEC))) if c.kernel.name == name)
    dtypes = {"bf16": jnp.bfloat16, "f32": jnp.float32}
    sizes = {**SIZES, "D": RAGGED_D.get(name, SIZES["D"])}
    return [jax.ShapeDtypeStruct(tuple(sizes[d] for d in x.dims), dtypes[x.dtype]) for x in kernel.inputs]


@compiled
@pytest.mark.parametrize("name", DERIVED)
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_mosaic_compiles_the_derived_kernel(attention, name, chip):
    assert_mosaic_compiles(functools.partial(getattr(attention, name), interpret=False), abstract(name), chip)


@compiled
@pytest.mark.parametrize("name", DERIVED)
def test_triton_compiles_the_derived_kernel_with_every_access_masked(attention, name):
    assert_triton_compiles_masked(functools.partial(getattr(attention, name), interpret=False), abstract(name))
