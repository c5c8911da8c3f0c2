"""`jax.grad` through the fused product kernels of specs/attention.pallas that are not
attention: `matmul_softmax` (a softmax over N after the product) and `rmsnorm_matmul`
(a product of a computed operand, the rms-normalised rows of x). Their backward
kernels, derived by gradients/fused.py, are ordinary kernels:

- matmul_softmax: dacc = y * (dy - sum(dy * y, N)) from the saved output y, then
  dx = dacc @ w.T and dw = x.T @ dacc;
- rmsnorm_matmul: the operand a = bf16(h * rsqrt(mean(h * h, K) + 1e-6) * g) and its
  row statistic computed again, da = dy @ w.T, dw = a.T @ dy, then rms_norm's derivative
  (dx, and dg summed over M).

Each is differentiated on both paths (TPU and GPU kernels in interpret mode) at ragged
sizes and compared with `jax.vjp` of its reference and with float64 NumPy derivatives
written here by hand; f32 versions of both (a spec of this file's own: the bundled
kernels take bf16) pass `jax.test_util.check_grads`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads

from kernel_cases import (
    compiled,
    assert_mosaic_compiles,
    assert_triton_compiles_masked,
    ROOT,
    f64,
    generated_module,
    kernels_in,
    load_module,
    pallas_calls_and_primitives,
    take_gpu_branch,
)
from pallasgen.gradients.derive import every_kernel
from pallasgen.workspace.pipeline import check_source, generate

# Ragged against every block: matmul_softmax's M = 128, K = 512 (N whole), rmsnorm_matmul's
# M = 256, N = 512 (K whole); several blocks of each blocked dimension.
SIZES = {"matmul_softmax": {"M": 300, "K": 700, "N": 300}, "rmsnorm_matmul": {"M": 300, "K": 70, "N": 700}}
EPS = 1e-6


def matmul_softmax_numpy(x, w, dy):
    """y = softmax(x @ w, N): dacc = y * (dy - sum(dy * y, N)); dx = dacc @ w.T, dw = x.T @ dacc."""
    x, w, dy = f64(x), f64(w), f64(dy)
    s = x @ w
    y = np.exp(s - s.max(axis=1, keepdims=True))
    y /= y.sum(axis=1, keepdims=True)
    dacc = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    return dacc @ w.T, x.T @ dacc


def rmsnorm_matmul_numpy(x, g, w, dy):
    """y = a @ w with a = bf16(x r g), r = (mean(x^2, K) + eps)^-1/2 per row: da = dy @ w.T,
    dw = a.T @ dy, dg = sum(da x r, M), and dx = da g r - x r^3 sum(da g x, K) / K (r's
    derivative in x_j is -r^3 x_j / K)."""
    x, g, w, dy = f64(x), f64(g), f64(w), f64(dy)
    r = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    a = f64((x * r * g).astype(ml_dtypes.bfloat16))  # the operand, rounded as the forward rounds it
    da = dy @ w.T
    dx = da * g * r - x * r**3 * (da * g * x).sum(axis=1, keepdims=True) / x.shape[1]
    return dx, (da * x * r).sum(axis=0), a.T @ dy


KERNELS = {
    "matmul_softmax": ((("bf16", "MK", 1.0), ("bf16", "KN", "K")), matmul_softmax_numpy),
    "rmsnorm_matmul": ((("bf16", "MK", 1.0), ("f32", "K", 1.0), ("bf16", "KN", "K")), rmsnorm_matmul_numpy),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@pytest.fixture(scope="module")
def attention():
    return generated_module("attention")


@pytest.fixture(params=["tpu", "gpu"])
def path(request, attention, monkeypatch):
    """Which kernels run: the TPU kernels in interpret mode (the CPU default), or the
    Triton kernels in interpret mode (the module's dispatch pointed at them)."""
    clear_caches(attention)
    if request.param == "gpu":
        take_gpu_branch(monkeypatch, attention)
    yield request.param
    clear_caches(attention)


def clear_caches(module):
    """Drops the jitted traces of every kernel, which hold the path they were traced on."""
    for name in kernels_in(module):
        getattr(module, name).clear_cache()


def inputs_and_cotangent(module, kernel: str, seed: int, sizes):
    """Normal inputs, a weight scaled by 1/sqrt of its rows (softmax's scores of order 1),
    and a cotangent of the output's dtype."""
    rng = np.random.default_rng(seed)
    inputs, _ = KERNELS[kernel]
    arrays = []
    for dtype, dims, scale in inputs:
        scale = 1.0 / np.sqrt(sizes[scale]) if isinstance(scale, str) else scale
        arrays.append(jnp.asarray(rng.standard_normal([sizes[d] for d in dims]) * scale, DTYPES[dtype]))
    out = jax.eval_shape(getattr(module, kernel).reference, *arrays)
    return arrays, jnp.asarray(rng.standard_normal(out.shape), out.dtype)


def kernel_vjp(module, kernel, arrays, dy):
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    return vjp(dy)


def assert_close(got, want, dtype):
    """bf16: a bf16 ulp of each element, and of the cotangents' typical size where the
    sums cancel (the product's cotangent goes to the MXU in bf16, as the operands do);
    f32 (g's cotangent, a sum over M of bf16 terms): the same, as its terms are."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=2.0**-6 * np.sqrt(np.mean(want**2)))


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_vjp_of_its_reference_at_ragged_sizes(attention, kernel, path):
    arrays, dy = inputs_and_cotangent(attention, kernel, 0, SIZES[kernel])
    got = kernel_vjp(attention, kernel, arrays, dy)
    _, vjp = jax.vjp(getattr(attention, kernel).reference, *arrays)
    want = vjp(dy)
    assert len(got) == len(want) == len(arrays)
    for g, w, a in zip(got, want, arrays):
        assert g.dtype == w.dtype == a.dtype and g.shape == w.shape == a.shape, kernel
        assert_close(g, w, g.dtype)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(attention, kernel, path):
    arrays, dy = inputs_and_cotangent(attention, kernel, 1, SIZES[kernel])
    got = kernel_vjp(attention, kernel, arrays, dy)
    want = KERNELS[kernel][1](*arrays, dy)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, g.dtype)


# --------------------------------------------------------------------------- what grad runs


@pytest.mark.parametrize(
    ("kernel", "calls", "not_outside"),
    [
        (
            "matmul_softmax",
            ["matmul_softmax", "matmul_softmax_backward", "matmul_softmax_backward_x", "matmul_softmax_backward_w"],
            {"exp", "dot_general"},
        ),
        (
            "rmsnorm_matmul",
            [
                "rmsnorm_matmul",
                "rmsnorm_matmul_lhs",
                "rmsnorm_matmul_backward_lhs",
                "rmsnorm_matmul_backward_w",
                "rmsnorm_matmul_lhs_backward",
                "rmsnorm_matmul_lhs_backward_over_m",
            ],
            {"rsqrt", "dot_general"},
        ),
    ],
)
def test_grad_runs_the_generated_backward_kernels_not_xlas_differentiation(attention, kernel, calls, not_outside):
    """The forward kernel itself (neither saves a residual), then the backward kernels;
    no product, exp or rsqrt outside them (the loss sums the output)."""
    arrays, _ = inputs_and_cotangent(attention, kernel, 2, {"M": 40, "K": 200, "N": 300})
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]

    def loss(*arrays):
        return getattr(attention, kernel)(*arrays, interpret=True).astype(jnp.float32).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(len(arrays)))))(*shapes)
    found, primitives = pallas_calls_and_primitives(jaxpr)
    assert sorted(found) == sorted(calls)
    assert not not_outside & primitives


def attention_spec():
    return (ROOT / "specs" / "attention.pallas").read_text(encoding="utf-8")


def test_the_forward_saves_softmaxs_output_and_the_operand_is_recomputed():
    """matmul_softmax's backward reads y as the forward pass returned it (recomputing it
    would need the accumulator saved too); rmsnorm_matmul's forward saves nothing but its
    inputs, and a kernel of its own computes the operand and its row statistic again.
    The generated module says so."""
    kernels = {k.kernel.name: k for k in check_source(attention_spec(), "attention.pallas")}
    softmax, rms = kernels["matmul_softmax"].gradient, kernels["rmsnorm_matmul"].gradient
    assert softmax.residuals == rms.residuals == () and softmax.saving is None is rms.saving
    first, *_ = softmax.kernels
    assert [(a.name, a.source) for a in first.arguments] == [("y", "output"), ("y", "cotangent")]
    assert set(rms.recomputed) == {"h", "lhs", "mean_k"}
    recompute = rms.kernels[0]
    assert recompute.checked.kernel.name == "rmsnorm_matmul_lhs" and recompute.results == ("lhs", "mean_k")
    docs = generated_module("attention")
    assert "its inputs x, w and its outputs y." in " ".join(docs._matmul_softmax_vjp.__doc__.split())
    assert "the backward kernels recompute h, lhs, mean_k." in " ".join(docs._rmsnorm_matmul_vjp.__doc__.split())


def test_the_backward_kernels_are_ordinary_kernels_with_the_forwards_blocks():
    """dacc is elementwise with a row sum over the whole N (M blocked as forward); dx, dw
    are product kernels (N blocked there: dx takes [M, N] by [K, N] blocks); rms_norm's derivative is elementwise over rows of a whole K, and
    dg a sum over M of its own."""
    kernels = {k.kernel.name: k for k in check_source(attention_spec(), "attention.pallas")}
    backward = {b.checked.kernel.name: b.checked for k in kernels.values() if k.gradient for b in k.gradient.kernels}
    assert not backward["matmul_softmax_backward"].has_products
    assert backward["matmul_softmax_backward"].blocks == {"M": 128}
    assert backward["matmul_softmax_backward_x"].product.k == "N"
    # N, whole forward, is blocked as the forward's largest block where it is contracted
    assert backward["matmul_softmax_backward_x"].blocks == {"M": 128, "K": 512, "N": 512}
    assert backward["matmul_softmax_backward_w"].product.k == "M"
    assert backward["rmsnorm_matmul_lhs"].blocks == backward["rmsnorm_matmul_lhs_backward"].blocks == {"M": 256}
    assert backward["rmsnorm_matmul_backward_lhs"].product.k == "N"
    assert backward["rmsnorm_matmul_backward_w"].product.k == "M"
    over_m = backward["rmsnorm_matmul_lhs_backward_over_m"].kernel
    assert [o.dims for o in over_m.outputs] == [("K",)]


# --------------------------------------------------------------------------- compiled

# Ragged in every dimension, K longer than rmsnorm_matmul's whole-K blocks of 128 lanes.
COMPILE_SIZES = {"M": 1000, "K": 700, "N": 3000}


def derived(name):
    """The checked kernels derived for jax.grad of the bundled kernel `name`."""
    kernels = check_source(attention_spec(), "attention.pallas")
    (forward,) = [k for k in kernels if k.kernel.name == name]
    return [k for k in every_kernel((forward,)) if k is not forward]


DERIVED = [k.kernel.name for name in KERNELS for k in derived(name)]


def abstract(name):
    (checked,) = [k for forward in KERNELS for k in derived(forward) if k.kernel.name == name]
    return [
        jax.ShapeDtypeStruct(tuple(COMPILE_SIZES[d] for d in x.dims), DTYPES[x.dtype]) for x in checked.kernel.inputs
    ]


@compiled
@pytest.mark.parametrize("name", DERIVED)
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_mosaic_compiles_the_derived_kernel(attention, name, chip):
    assert_mosaic_compiles(functools.partial(getattr(attention, name), interpret=False), abstract(name), chip)


@compiled
@pytest.mark.parametrize("name", DERIVED)
def test_triton_compiles_the_derived_kernel_with_every_access_masked(attention, name):
    assert_triton_compiles_masked(functools.partial(getattr(attention, name), interpret=False), abstract(name))


# --------------------------------------------------------------------------- f32 kernels of this file's own

F32_SPEC = """\
kernel softmax_f32 {
    in  x: f32[M, K]
    in  w: f32[K, N]
    in  b: f32[N]
    out y: f32[M, N]
    y = softmax(x @ w + b, N)
    block M = 128, K = 128
}

kernel rmsnorm_f32 {
    in  x: f32[M, K]
    in  g: f32[K]
    in  w: f32[K, N]
    out y: f32[M, N]
    let h = x * rsqrt(mean(x * x, K) + 1e-6)
    let a = h * g
    y = a @ w
    block M = 128, N = 128
}

kernel relu_scaled_f32 {
    in  x: f32[M, K]
    in  w: f32[K, N]
    out y: f32[M, N]
    y = relu((x * 2.0) @ w)
    block M = 128, N = 128, K = 128
}

kernel log_softmax_f32 {
    in  x: f32[M, K]
    in  w: f32[K, N]
    out y: f32[M, N]
    out top: f32[M]
    let s = x @ w
    y = s - logsumexp(s, N)
    top = max(s, N)
    block M = 128
}
"""
# Each f32 kernel: its inputs' dimensions, and what its forward pass saves besides its
# inputs: the accumulator where relu's derivative reads it (a product of a computed
# operand, saved as the forward computes it), the row statistics of a reducing epilogue.
F32_KERNELS = {
    "softmax_f32": (["MK", "KN", "N"], ()),
    "rmsnorm_f32": (["MK", "K", "KN"], ()),
    "relu_scaled_f32": (["MK", "KN"], ("acc",)),
    "log_softmax_f32": (["MK", "KN"], ("acc", "argmax_n", "logsumexp_n")),
}


@pytest.fixture(scope="module")
def f32_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("fused") / "fused_f32.py"
    path.write_text(generate(F32_SPEC, "specs/fused_f32.pallas", "specs/fused_f32.pallas"), encoding="utf-8")
    return load_module(path, "_pallasgen_fused_f32")


def f32_inputs(kernel: str, sizes, seed: int):
    rng = np.random.default_rng(seed)
    shapes, _ = F32_KERNELS[kernel]
    return [jnp.asarray(rng.standard_normal([sizes[d] for d in dims]) * 0.5, jnp.float32) for dims in shapes]


@pytest.mark.parametrize("kernel", list(F32_KERNELS))
def test_check_grads_on_small_f32_inputs(f32_module, kernel):
    """Numerical derivatives of f32 versions (the bundled kernels are bf16): an epilogue
    with a bias summed over M, an operand computed through lets, a computed operand with
    an epilogue that reads the accumulator, an epilogue with residuals of its own."""
    arrays = f32_inputs(kernel, {"M": 5, "K": 6, "N": 7}, seed=3)
    check_grads(functools.partial(getattr(f32_module, kernel), interpret=True), arrays, order=1, modes=["rev"])


@pytest.mark.parametrize("kernel", list(F32_KERNELS))
def test_f32_kernels_match_the_vjp_of_their_references_at_ragged_sizes(f32_module, kernel):
    arrays = f32_inputs(kernel, {"M": 130, "K": 150, "N": 140}, seed=4)
    outputs, reference = jax.vjp(getattr(f32_module, kernel).reference, *arrays)
    rng = np.random.default_rng(5)
    dy = jax.tree.map(lambda o: jnp.asarray(rng.standard_normal(o.shape), o.dtype), outputs)
    _, vjp = jax.vjp(functools.partial(getattr(f32_module, kernel), interpret=True), *arrays)
    for g, w in zip(vjp(dy), reference(dy), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_f32_kernels_save_what_their_backward_kernels_read():
    kernels = check_source(F32_SPEC, "fused_f32.pallas")
    assert {k.kernel.name: k.gradient.residuals for k in kernels} == {n: r for n, (_, r) in F32_KERNELS.items()}


def test_a_computed_operand_whose_inputs_the_epilogue_reads_too_is_not_generated_yet():
    """x reaches y through the operand and through the epilogue's bias: its cotangent
    would be a sum of the prologue's and the epilogue's."""
    source = (
        "kernel k {\n    in  x: f32[M, K]\n    in  w: f32[K, N]\n    out y: f32[M, N]\n"
        "    y = (x * rsqrt(mean(x * x, K) + 1e-6)) @ w + sum(x, K)\n    block M = 128, N = 128\n}\n"
    )
    (k,) = check_source(source, "k.pallas")
    assert k.gradient.not_yet == "a computed operand of a product whose inputs the rest of the kernel reads too"


def test_a_product_reduced_over_a_dimension_the_kernel_sweeps_is_computed_again_block_by_block():
    """The log-sum-exp of scores over blocks of T: the forward never holds the scores
    whole, so neither does the backward pass. Each product kernel computes them again
    block by block from the output (the log-sum-exp itself) and sweeps what it contracts:
    dq sweeps T, dk sweeps S (test_gradients_linear_cross_entropy.py checks the numbers)."""
    source = (
        "kernel k {\n    in  q: f32[S, D]\n    in  k: f32[T, D]\n    out y: f32[S]\n"
        "    y = logsumexp(q @ k.T, T)\n    block S = 64, T = 64\n}\n"
    )
    (k,) = check_source(source, "k.pallas")
    assert k.gradient.residuals == ()
    swept = [(b.checked.kernel.name, b.checked.sweep.dim) for b in k.gradient.kernels]
    assert swept == [("k_backward_q", "T"), ("k_backward_k", "S")]
