"""`jax.grad` of a product whose value is reduced over the dimension the kernel sweeps
(gradients/fused.py `_recomputing_product`), as Liger's fused linear + cross-entropy:
the logits `x @ w.T` over a vocabulary V swept in blocks with a running log-sum-exp.
Saving the logits would keep [M, V] whole; instead the forward pass saves the
log-sum-exp ([M]), and each product kernel computes the logits again block by block and
their cotangent `dloss * (softmax - onehot)` in its tiles: `dx` sweeps V, `dw` sweeps M.
Neither the logits nor their cotangent reaches memory.

Each layout of the weight (nn.Linear's [V, K], and [K, V]) is differentiated on both paths
(TPU and Triton kernels in interpret mode) at ragged sizes against float64 NumPy
derivatives written here by hand, and its backward kernels compile for v5e, v6e and sm_90
(every access masked).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_cases import (
    compiled,
    abstract_arrays,
    assert_product_cotangent_close as assert_close,
    assert_triton_compiles_masked,
    compiled_gradient,
    float_inputs,
    f64,
    module_from_spec,
    on_path,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel linear_cross_entropy {            # the logits [M, V] never reach memory
    in  x: bf16[M, K]
    in  w: bf16[V, K]                    # as nn.Linear stores it
    in  label: i32[M]
    out loss: f32[M]
    let z = x @ w.T
    loss = logsumexp(z, V) - sum(where(index(V) == label, z, 0.0), V)
    block M = 128, V = 512
}

kernel linear_cross_entropy_kv {
    in  x: bf16[M, K]
    in  w: bf16[K, V]
    in  label: i32[M]
    out loss: f32[M]
    let z = x @ w
    loss = logsumexp(z, V) - sum(where(index(V) == label, z, 0.0), V)
    block M = 128, V = 512
}
"""

CAUSAL_SPEC = """\
kernel causal_logsumexp {                # blocks past the diagonal skipped, forward and backward
    in  q: f32[S, D]
    in  k: f32[T, D]
    out y: f32[S]
    y = logsumexp(where(index(S) >= index(T), q @ k.T, -inf), T)
    block S = 16, T = 128
}
"""

RAGGED = {"M": 37, "K": 200, "V": 1300}  # V: two blocks of 512 and a ragged third


def linear_cross_entropy_numpy(x, w, label, dloss, transposed=True):
    """loss = lse(z) - z[label], z = x @ w.T: dz = dloss (softmax(z) - onehot(label));
    dx = dz @ w, dw = dz.T @ x (for w [K, V]: dx = dz @ w.T, dw = x.T @ dz)."""
    x, w, g = f64(x), f64(w), f64(dloss)
    z = x @ (w.T if transposed else w)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = g[:, None] * (p - (np.arange(z.shape[1])[None] == np.asarray(label)[:, None]))
    return (dz @ w, dz.T @ x) if transposed else (dz @ w.T, x.T @ dz)


KERNELS = {
    "linear_cross_entropy": (
        (("bf16", "MK"), ("bf16", "VK"), ("i32", "M")),
        linear_cross_entropy_numpy,
    ),
    "linear_cross_entropy_kv": (
        (("bf16", "MK"), ("bf16", "KV"), ("i32", "M")),
        functools.partial(linear_cross_entropy_numpy, transposed=False),
    ),
}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "linear_cross_entropy")


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


def inputs(kernel: str, rng) -> list[jax.Array]:
    """x and w of logits of order 1, labels anywhere in V (the last, ragged block too)."""
    x, w, label = shapes(kernel)
    return [
        jnp.asarray(rng.standard_normal(x.shape), x.dtype),
        jnp.asarray(rng.standard_normal(w.shape) / np.sqrt(RAGGED["K"]), w.dtype),
        jnp.asarray(rng.integers(0, RAGGED["V"], label.shape), jnp.int32),
    ]


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative_and_the_references(module, kernel, path):
    rng = np.random.default_rng(0)
    arrays = inputs(kernel, rng)
    dloss = jnp.asarray(rng.standard_normal(RAGGED["M"]), jnp.float32)
    function = getattr(module, kernel)
    _, vjp = jax.vjp(functools.partial(function, interpret=True), *arrays)
    dx, dw, dlabel = vjp(dloss)
    _, reference_vjp = jax.vjp(function.reference, *arrays)
    want = KERNELS[kernel][1](*arrays, dloss)
    for got, reference, expected, array in zip((dx, dw), reference_vjp(dloss)[:2], want, arrays):
        assert got.shape == array.shape and got.dtype == array.dtype
        assert_close(got, expected, jnp.bfloat16)
        assert_close(reference, expected, jnp.bfloat16)
    assert dlabel.dtype == jax.dtypes.float0


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    return module_from_spec(tmp_path_factory, CAUSAL_SPEC, "causal_logsumexp")


@pytest.mark.parametrize("on", ["tpu", "gpu"])
def test_a_masked_product_computed_again_skips_the_blocks_the_mask_rules_out(causal, on, monkeypatch):
    """dq sweeps T and dk sweeps S over the scores computed again, each skipping the blocks
    past the diagonal (dk's rows are the dimension it sweeps: it computes no strips)."""
    rng = np.random.default_rng(0)
    s, t, d = 40, 300, 8
    q, k = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in ((s, d), (t, d)))
    dy = jnp.asarray(rng.standard_normal(s), jnp.float32)
    scores = np.where(np.arange(s)[:, None] >= np.arange(t)[None], f64(q) @ f64(k).T, -np.inf)
    p = np.exp(scores - scores.max(1, keepdims=True))
    ds = f64(dy)[:, None] * p / p.sum(1, keepdims=True)
    with on_path(causal, on, monkeypatch):
        _, vjp = jax.vjp(functools.partial(causal.causal_logsumexp, interpret=True), q, k)
        dq, dk = vjp(dy)
    np.testing.assert_allclose(f64(dq), ds @ f64(k), atol=1e-5)
    np.testing.assert_allclose(f64(dk), ds.T @ f64(q), atol=1e-5)


def test_the_forward_pass_saves_the_log_sum_exp_and_no_kernel_writes_the_logits():
    (checked,) = [k for k in check_source(SPEC, "lce.pallas") if k.kernel.name == "linear_cross_entropy"]
    gradient = checked.gradient
    assert [(k.checked.kernel.name, k.results) for k in gradient.kernels] == [
        ("linear_cross_entropy_backward_x", ("x",)),
        ("linear_cross_entropy_backward_w", ("w",)),
    ]
    (residual,) = gradient.saving.kernel.outputs[1:]
    assert (residual.dtype, residual.dims) == ("f32", ("M",))
    for kernel in gradient.kernels:
        assert all(d.dims != ("M", "V") for d in kernel.checked.kernel.inputs)
        assert len(kernel.checked.frame.products) == 2  # the logits again, then the cotangent's product
    swept = {k.checked.kernel.name: k.checked.sweep.dim for k in gradient.kernels}
    assert swept == {"linear_cross_entropy_backward_x": "V", "linear_cross_entropy_backward_w": "M"}


def gradient_of(module, kernel: str, **keywords):
    """jax.grad by every float input."""
    return compiled_gradient(getattr(module, kernel), float_inputs(KERNELS[kernel][0]), **keywords)


@compiled
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_tpu(module, kernel, chip):
    text = compile_only.compile_for_tpu(gradient_of(module, kernel), shapes(kernel), chip=chip).as_text()
    assert text.count("tpu_custom_call") >= 3


@compiled
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_sm90_with_every_access_masked(module, kernel):
    assert_triton_compiles_masked(gradient_of(module, kernel, gpu_backend="triton"), shapes(kernel))
