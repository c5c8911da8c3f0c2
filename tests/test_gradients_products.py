"""`jax.grad` through the bundled product kernels (specs/matmul.pallas): their backward
kernels, derived by gradients/products.py, are one product kernel per operand
(dx = dacc @ y.T, dy = x.T @ dacc), each computing the product's cotangent dacc (the
epilogue's derivative) from what the forward saved, and the one that contracts M also
summing a bias's cotangent over M; where the fused middle cannot lay that out (scores,
linear), an elementwise kernel for dacc and a kernel per broadcast input's sum.

Each kernel is differentiated on both paths (TPU and GPU kernels in interpret mode) at
ragged sizes and compared with `jax.vjp` of its reference and with float64 NumPy
derivatives written here by hand.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from kernel_cases import (
    assert_product_cotangent_close as assert_close,
    pallas_calls_and_primitives,
    f64,
    generated_module,
    gelu_tanh_derivative_numpy,
    kernels_in,
    take_gpu_branch,
)
from pallasgen.frontend import ir
from pallasgen.workspace.pipeline import check_source

RAGGED = {"B": 3, "M": 37, "N": 300, "K": 45, "S": 37, "T": 300, "D": 64}


def matmul_numpy(x, y, dz):
    """z = x @ y: dx = dz @ y.T, dy = x.T @ dz."""
    x, y, g = f64(x), f64(y), f64(dz)
    return g @ y.T, x.T @ g


def matmul_relu_numpy(x, y, dz):
    """z = relu(x @ y): the product's cotangent is dz where x @ y > 0."""
    x, y = f64(x), f64(y)
    g = np.where(x @ y > 0, f64(dz), 0.0)
    return g @ y.T, x.T @ g


def matmul_bias_gelu_numpy(x, y, bias, dz):
    """z = gelu(x @ y + bias): g = dz gelu'(x @ y + bias); dbias = g summed over M."""
    x, y = f64(x), f64(y)
    g = f64(dz) * gelu_tanh_derivative_numpy(x @ y + f64(bias))
    return g @ y.T, x.T @ g, g.sum(axis=0)


def batched_matmul_numpy(x, y, dz):
    """z[b] = x[b] @ y[b]: dx[b] = dz[b] @ y[b].T, dy[b] = x[b].T @ dz[b]."""
    x, y, g = f64(x), f64(y), f64(dz)
    return g @ y.transpose(0, 2, 1), x.transpose(0, 2, 1) @ g


def scores_numpy(q, k, ds, *, scale=0.125):
    """s = (q @ k.T) * scale: g = ds * scale; dq = g @ k, dk = g.T @ q (per batch)."""
    q, k, g = f64(q), f64(k), f64(ds) * scale
    return g @ k, g.transpose(0, 2, 1) @ q


def linear_numpy(x, w, bias, dy):
    """y = x @ w.T + bias: dx = dy @ w, dw = dy.T @ x, dbias = dy summed over M."""
    x, w, g = f64(x), f64(w), f64(dy)
    return g @ w, g.T @ x, g.sum(axis=0)


# Each kernel's inputs (name, dtype, dims) and its float64 derivative.
KERNELS = {
    "matmul": ((("f32", "MK"), ("f32", "KN")), matmul_numpy),
    "matmul_relu": ((("f32", "MK"), ("f32", "KN")), matmul_relu_numpy),
    "matmul_bias_gelu": ((("bf16", "MK"), ("bf16", "KN"), ("f32", "N")), matmul_bias_gelu_numpy),
    "batched_matmul": ((("bf16", "BMK"), ("bf16", "BKN")), batched_matmul_numpy),
    "scores": ((("bf16", "BSD"), ("bf16", "BTD")), scores_numpy),
    "linear": ((("bf16", "MK"), ("bf16", "NK"), ("f32", "N")), linear_numpy),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@pytest.fixture(scope="module")
def mm():
    return generated_module("matmul")


@pytest.fixture(params=["tpu", "gpu"])
def path(request, mm, monkeypatch):
    """Which kernels run: the TPU kernels in interpret mode (the CPU default), or the
    Triton kernels in interpret mode (the module's dispatch pointed at them)."""
    clear_caches(mm)
    if request.param == "gpu":
        take_gpu_branch(monkeypatch, mm)
    yield request.param
    clear_caches(mm)


def clear_caches(module):
    """Drops the jitted traces of every kernel, which hold the path they were traced on."""
    for name in kernels_in(module):
        getattr(module, name).clear_cache()


def inputs_and_cotangent(kernel: str, seed: int = 0, sizes=RAGGED):
    rng = np.random.default_rng(seed)
    inputs, _ = KERNELS[kernel]
    arrays = [jnp.asarray(rng.standard_normal([sizes[d] for d in dims]), DTYPES[dtype]) for dtype, dims in inputs]
    out = jax.eval_shape(getattr(generated_module("matmul"), kernel).reference, *arrays)
    return arrays, jnp.asarray(rng.standard_normal(out.shape) * 2.0, out.dtype)


def kernel_vjp(module, kernel, arrays, dz, **keywords):
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True, **keywords), *arrays)
    return vjp(dz)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_vjp_of_its_reference_at_ragged_sizes(mm, kernel, path):
    arrays, dz = inputs_and_cotangent(kernel)
    got = kernel_vjp(mm, kernel, arrays, dz)
    _, vjp = jax.vjp(getattr(mm, kernel).reference, *arrays)
    want = vjp(dz)
    assert len(got) == len(want) == len(arrays)
    for g, w, a in zip(got, want, arrays):
        assert g.dtype == w.dtype == a.dtype and g.shape == w.shape == a.shape, kernel
        assert_close(g, w, g.dtype)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(mm, kernel, path):
    arrays, dz = inputs_and_cotangent(kernel, seed=1)
    got = kernel_vjp(mm, kernel, arrays, dz)
    want = KERNELS[kernel][1](*arrays, dz)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, g.dtype)


def test_the_scale_param_reaches_the_backward_kernels(mm):
    arrays, ds = inputs_and_cotangent("scores", seed=2)
    got = kernel_vjp(mm, "scores", arrays, ds, scale=0.5)
    for g, w in zip(got, scores_numpy(*arrays, ds, scale=0.5), strict=True):
        assert_close(g, w, g.dtype)


def test_int8_inputs_get_float0_cotangents(mm):
    x, y = jnp.ones((8, 16), jnp.int8), jnp.ones((16, 128), jnp.int8)
    _, vjp = jax.vjp(functools.partial(mm.matmul_int8, interpret=True), x, y)
    dx, dy = vjp(np.zeros((8, 128), jax.dtypes.float0))
    assert dx.dtype == dy.dtype == jax.dtypes.float0


@pytest.mark.parametrize("kernel", ["matmul", "matmul_relu"])
def test_check_grads_on_small_f32_inputs(mm, kernel):
    arrays, _ = inputs_and_cotangent(kernel, seed=3, sizes={"M": 5, "K": 6, "N": 7})
    check_grads(functools.partial(getattr(mm, kernel), interpret=True), arrays, order=1, modes=["rev"])


# --------------------------------------------------------------------------- what grad runs


def test_grad_runs_the_generated_backward_kernels_not_xlas_differentiation(mm):
    """matmul_bias_gelu under jax.grad: the forward kernel that also writes the product's
    value (acc), and one product per operand, which compute the epilogue's derivative
    (dy's also the sum over M for the bias); no dot_general or tanh outside them."""
    x, y = jax.ShapeDtypeStruct((40, 200), jnp.bfloat16), jax.ShapeDtypeStruct((200, 300), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((300,), jnp.float32)

    def loss(x, y, bias):
        return mm.matmul_bias_gelu(x, y, bias, interpret=True).astype(jnp.float32).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, y, bias)
    calls, primitives = pallas_calls_and_primitives(jaxpr)
    assert sorted(calls) == sorted(
        [
            "matmul_bias_gelu",  # writing its accumulator too, the residual the backward kernels read
            "matmul_bias_gelu_backward_x",
            "matmul_bias_gelu_backward_y",
        ]
    )
    assert not {"tanh", "dot_general"} & primitives


def backward_kernels(forward: str) -> dict:
    (checked,) = [k for k in check_source(open_spec(), "matmul.pallas") if k.kernel.name == forward]
    return {b.checked.kernel.name.removeprefix(f"{forward}_backward_"): b for b in checked.gradient.kernels}


@pytest.mark.parametrize("forward", ["matmul_relu", "matmul_bias_gelu", "batched_matmul"])
def test_no_backward_kernel_writes_the_products_cotangent(forward):
    """The epilogue's derivative (relu's mask, gelu's derivative, a conversion to bf16) is a
    computed operand of both product kernels: a let dacc, computed from the saved acc and
    the output's cotangent in each step, that the product reads; no elementwise kernel
    writes it to memory."""
    kernels = backward_kernels(forward)
    assert sorted(kernels) == ["x", "y"]
    for derived in kernels.values():
        checked = derived.checked
        lets = {s.name: s.value for s in checked.kernel.body if isinstance(s, ir.Let)}
        product = next(n for n in checked.frame.products)
        operands = {
            side.value.id if isinstance(side, ir.Attribute) else side.id for side in (product.left, product.right)
        }
        assert "dacc" in operands and "dacc" in lets
        assert all(a.source != "backward" for a in derived.arguments)
        assert {a.source for a in derived.arguments} >= {"cotangent", "input"}


def test_the_bias_cotangent_is_summed_in_the_pass_of_dy():
    """dy = x.T @ dacc and dbias = sum(dacc, M) both sweep M: one kernel carries the
    product and the sum (of gelu's derivative in f32, before dacc's rounding to bf16)."""
    dy = backward_kernels("matmul_bias_gelu")["y"]
    assert dy.results == ("y", "bias")
    assert [o.name for o in dy.checked.kernel.outputs] == ["dy", "dbias"]
    assert dy.checked.sweep.dim == "M"
    assert sorted(c.kind for c in dy.checked.sweep.carries) == ["dot", "sum"]
    assert [(a.name, a.source) for a in dy.arguments] == [
        ("acc", "residual"),
        ("bias", "input"),
        ("z", "cotangent"),
        ("x", "input"),
    ]


def test_a_computed_operand_the_fused_middle_cannot_lay_out_keeps_separate_kernels():
    """scores' dk = dacc.T @ q and linear's dw = dy.T @ x would need a computed tile
    transposed, which fused kernels do not lay out: their elementwise kernels stay."""
    assert sorted(backward_kernels("scores")) == ["epilogue", "k", "q"]
    assert sorted(backward_kernels("linear")) == ["over_m", "w", "x"]


def test_a_plain_product_takes_the_outputs_cotangent_straight_to_the_products(mm):
    """matmul and linear: no epilogue kernel, and the forward pass saves nothing but the
    inputs (the kernel has no residuals to write)."""
    x, y = jax.ShapeDtypeStruct((40, 200), jnp.float32), jax.ShapeDtypeStruct((200, 300), jnp.float32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, y: mm.matmul(x, y, interpret=True).sum(), argnums=(0, 1)))(x, y)
    calls, _ = pallas_calls_and_primitives(jaxpr)
    assert sorted(calls) == ["matmul", "matmul_backward_x", "matmul_backward_y"]
    assert not hasattr(mm, "linear_backward_epilogue")
    with pytest.raises(TypeError, match="linear saves no residuals"):
        mm.linear.with_residuals(x, y)


def open_spec() -> str:
    from kernel_cases import ROOT

    return (ROOT / "specs" / "matmul.pallas").read_text(encoding="utf-8")


def test_the_forward_saves_the_product_only_where_the_epilogues_derivative_reads_it():
    """gelu and relu read the product's value (saved as the residual acc); a scale, a
    bias or nothing at all do not."""
    saved = {k.kernel.name: k.gradient.residuals for k in check_source(open_spec(), "matmul.pallas")}
    assert saved["matmul_bias_gelu"] == saved["matmul_relu"] == ("acc",)
    assert saved["matmul"] == saved["scores"] == saved["linear"] == saved["batched_matmul"] == ()


def test_each_operand_is_read_as_it_is_stored():
    """linear's w is [N, K], read as w.T forward: its cotangent is dy.T @ x, [N, K] as w
    is; scores' dk is ds.T @ q with the batch dimension kept."""
    kernels = {k.kernel.name: k for k in check_source(open_spec(), "matmul.pallas")}
    backward = {b.checked.kernel.name: b.checked for k in kernels.values() if k.gradient for b in k.gradient.kernels}
    for forward, operand, lhs, rhs in [
        ("linear", "x", ("dy", False), ("w", False)),
        ("linear", "w", ("dy", True), ("x", False)),
        ("scores", "q", ("dacc", False), ("k", False)),
        ("scores", "k", ("dacc", True), ("q", False)),
        ("matmul", "y", ("x", True), ("dz", False)),
    ]:
        derived = backward[f"{forward}_backward_{operand}"]
        product = derived.product
        assert ((product.lhs.name, product.lhs.transposed), (product.rhs.name, product.rhs.transposed)) == (lhs, rhs)
        (declared,) = [d for d in kernels[forward].kernel.inputs if d.name == operand]
        assert derived.kernel.outputs[0].dims == declared.dims


def test_a_product_kernels_blocks_are_the_forwards_by_dimension_name():
    matmul, *_ = check_source(open_spec(), "matmul.pallas")
    dx, dy = (b.checked for b in matmul.gradient.kernels)
    assert dx.blocks == {"M": 512, "K": 1024, "N": 1024} == dy.blocks | {"M": 512}
    assert dx.product.k == "N" and dy.product.k == "M"


def test_a_let_holding_a_product_counts_as_a_working_tile_of_its_dimensions_in_vmem():
    """`let pre = x @ w.T + bias` is an [M, N] value that the epilogue reads: the VMEM
    count holds it as a 32-bit [M, N] tile, not [M, N, K] (2048 MiB at these blocks)
    nor [M] (w.T unread)."""
    from pallasgen.backends.tpu.tiling import kernel_vmem

    source = (
        "kernel mlp {\n    in  x: bf16[M, K]\n    in  w: bf16[N, K]\n    in  bias: f32[N]\n    out z: bf16[M, N]\n"
        "    let pre = x @ w.T + bias\n    z = gelu(pre)\n    block M = 512, N = 1024, K = 1024\n}\n"
    )
    (mlp,) = check_source(source, "mlp.pallas")
    needed = kernel_vmem(mlp, mlp.blocks)
    (tile,) = [p for p in needed.parts if p.what == "working tile"]
    assert tile.dims == ("M", "N")
    assert needed.total(mlp.blocks) < 16 * 2**20


def test_the_products_value_takes_a_name_the_kernel_does_not_use(tmp_path):
    """A let named `acc` (and a param named `acc_`) leaves the product's value `acc__`:
    the gradient is still jax.vjp's of the reference."""
    from kernel_cases import load_module
    from pallasgen.workspace.pipeline import generate

    source = (
        "kernel k {\n    in  x: f32[M, K]\n    in  y: f32[K, N]\n    out z: f32[M, N]\n    param acc_: f32 = 0.5\n"
        "    let acc = x @ y\n    z = relu(acc) * acc_\n    block M = 128, N = 128, K = 128\n}\n"
    )
    (k,) = check_source(source, "k.pallas")
    assert k.gradient.residuals == ("acc__",)
    path = tmp_path / "k.py"
    path.write_text(generate(source, "k.pallas", "k.pallas"))
    module = load_module(path, "_pallasgen_products_acc")
    rng = np.random.default_rng(6)
    x, y = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(9, 20), (20, 130)])
    got = jax.grad(lambda x, y: (module.k(x, y, interpret=True) ** 2).sum(), argnums=(0, 1))(x, y)
    want = jax.grad(lambda x, y: (module.k.reference(x, y) ** 2).sum(), argnums=(0, 1))(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)


def test_an_operand_broadcast_over_a_batch_dimension_has_no_backward_kernels_yet():
    """x [B, M, K] @ y [K, N]: y's cotangent would sum over B as well as M."""
    source = (
        "kernel k {\n    in  x: f32[B, M, K]\n    in  y: f32[K, N]\n    out z: f32[B, M, N]\n    z = x @ y\n"
        "    block B = 1, M = 128\n}\n"
    )
    (k,) = check_source(source, "k.pallas")
    assert k.gradient.not_yet == "a product whose operands have different batch dimensions"
