"""`jax.grad` through kernels with several products of inputs (gradients/products.py), as
users write them: SwiGLU `silu(x @ w1) * (x @ w3)`, GeGLU with weights stored as
nn.Linear stores them (`x @ w1.T`), and a sum of products with a bias. The products'
values are saved by the forward pass (acc1, acc2: jax saves them too), the epilogue's
derivative gives each product's cotangent, and each operand's cotangent is one product
kernel: the sum of its products where it is an operand of several
(`dx = dacc1 @ w1.T + dacc2 @ w3.T`).

Each kernel is differentiated on both paths (TPU and Triton kernels in interpret mode) at
ragged sizes against float64 NumPy derivatives written here by hand and `jax.vjp` of its
reference, and compiled by the real compilers (Mosaic for v5e and v6e, Triton for sm_90
with every access masked, Mosaic GPU's lowering).
"""

from __future__ import annotations

import functools
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_cases import (
    compiled,
    abstract_arrays,
    compiled_gradient,
    float_inputs,
    assert_product_cotangent_close as assert_close,
    assert_triton_compiles_masked,
    f64,
    gelu_tanh_derivative_numpy,
    gelu_tanh_numpy,
    lowered_for_mosaic_gpu,
    module_from_spec,
    take_gpu_branch,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel swiglu {
    in  x: bf16[M, K]
    in  w1, w3: bf16[K, N]
    out y: bf16[M, N]
    y = bf16(silu(x @ w1) * (x @ w3))
    block M = 128, N = 128, K = 256
}

kernel geglu {                           # weights as nn.Linear stores them: [out, in]
    in  x: bf16[M, K]
    in  w1, w3: bf16[N, K]
    out y: bf16[M, N]
    y = bf16(gelu(x @ w1.T) * (x @ w3.T))
    block M = 128, N = 128, K = 256
}

kernel ffn {                             # SwiGLU's hidden layer, then the down projection
    in  x: bf16[M, K]
    in  w1, w3: bf16[K, F]
    in  w2: bf16[F, N]
    out y: bf16[M, N]
    y = bf16(bf16(silu(x @ w1) * (x @ w3)) @ w2)
    block M = 128, N = 128, F = 128
}

kernel two_inputs {
    in  x: f32[M, K]
    in  w: f32[K, N]
    in  u: f32[M, J]
    in  v: f32[J, N]
    in  bias: f32[N]
    out y: f32[M, N]
    y = x @ w + u @ v + bias
    block M = 64, N = 128, K = 128
}
"""

RAGGED = {"M": 37, "K": 300, "N": 200, "J": 45, "F": 150}


def silu_numpy(a):
    return a / (1 + np.exp(-a))


def silu_derivative_numpy(a):
    sigmoid = 1 / (1 + np.exp(-a))
    return sigmoid * (1 + a * (1 - sigmoid))


def swiglu_numpy(x, w1, w3, dy):
    """y = silu(a) * b, a = x @ w1, b = x @ w3: da = dy b silu'(a), db = dy silu(a);
    dx = da @ w1.T + db @ w3.T, dw1 = x.T @ da, dw3 = x.T @ db."""
    x, w1, w3, g = f64(x), f64(w1), f64(w3), f64(dy)
    a, b = x @ w1, x @ w3
    da, db = g * b * silu_derivative_numpy(a), g * silu_numpy(a)
    return da @ w1.T + db @ w3.T, x.T @ da, x.T @ db


def ffn_numpy(x, w1, w3, w2, dy):
    """y = h @ w2, h = silu(x @ w1) * (x @ w3) rounded to bf16: dh = dy @ w2.T, dw2 = h.T @ dy,
    then SwiGLU's derivative from dh (the rounding's derivative taken as 1, as jax takes it)."""
    h = f64((silu_numpy(f64(x) @ f64(w1)) * (f64(x) @ f64(w3))).astype(jnp.bfloat16))
    dh = f64(dy) @ f64(w2).T
    return (*swiglu_numpy(x, w1, w3, dh), h.T @ f64(dy))


def geglu_numpy(x, w1, w3, dy):
    """y = gelu(a) * b, a = x @ w1.T, b = x @ w3.T: dw1 = da.T @ x, dw3 = db.T @ x."""
    x, w1, w3, g = f64(x), f64(w1), f64(w3), f64(dy)
    a, b = x @ w1.T, x @ w3.T
    da, db = g * b * gelu_tanh_derivative_numpy(a), g * gelu_tanh_numpy(a)
    return da @ w1 + db @ w3, da.T @ x, db.T @ x


def two_inputs_numpy(x, w, u, v, bias, dy):
    """y = x @ w + u @ v + bias: each product's cotangent is dy; dbias sums it over M."""
    x, w, u, v, g = f64(x), f64(w), f64(u), f64(v), f64(dy)
    return g @ w.T, x.T @ g, g @ v.T, u.T @ g, g.sum(axis=0)


KERNELS = {
    "swiglu": ((("bf16", "MK"), ("bf16", "KN"), ("bf16", "KN")), swiglu_numpy),
    "geglu": ((("bf16", "MK"), ("bf16", "NK"), ("bf16", "NK")), geglu_numpy),
    "ffn": ((("bf16", "MK"), ("bf16", "KF"), ("bf16", "KF"), ("bf16", "FN")), ffn_numpy),
    "two_inputs": ((("f32", "MK"), ("f32", "KN"), ("f32", "MJ"), ("f32", "JN"), ("f32", "N")), two_inputs_numpy),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "glu")


def inputs_and_cotangent(module, kernel: str, seed: int = 0):
    """Inputs scaled so that the products are of order 1 (where silu and gelu bend)."""
    rng = np.random.default_rng(seed)
    inputs, _ = KERNELS[kernel]
    arrays = [
        jnp.asarray(rng.standard_normal([RAGGED[d] for d in dims]) / np.sqrt(RAGGED["K"]) ** (i > 0), DTYPES[dtype])
        for i, (dtype, dims) in enumerate(inputs)
    ]
    out = jax.eval_shape(getattr(module, kernel).reference, *arrays)
    return arrays, jnp.asarray(rng.standard_normal(out.shape), out.dtype)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(module, kernel, path):
    arrays, dy = inputs_and_cotangent(module, kernel)
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    for got, want, array in zip(vjp(dy), KERNELS[kernel][1](*arrays, dy), arrays, strict=True):
        assert got.shape == array.shape and got.dtype == array.dtype
        assert_close(got, want, array.dtype)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_vjp_of_its_reference(module, kernel, path):
    arrays, dy = inputs_and_cotangent(module, kernel, seed=1)
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    _, reference_vjp = jax.vjp(getattr(module, kernel).reference, *arrays)
    for got, want, array in zip(vjp(dy), reference_vjp(dy), arrays, strict=True):
        assert_close(got, want, array.dtype)


def backward_kernels(forward: str) -> dict:
    (checked,) = [k for k in check_source(SPEC, "glu.pallas") if k.kernel.name == forward]
    return {b.checked.kernel.name.removeprefix(f"{forward}_backward_"): b for b in checked.gradient.kernels}


def test_one_kernel_computes_the_products_cotangents_and_an_operand_of_both_sums_two_products():
    """swiglu_backward_epilogue computes dacc1 and dacc2 (bf16, as the operands) from the
    saved acc1, acc2 and dy once; dx = dacc1 @ w1.T + dacc2 @ w3.T is one pass over N,
    dw1 and dw3 one product each. (Computing both cotangents in every product kernel
    instead reads both saved values at each step: estimated slower, see _fused.)"""
    kernels = backward_kernels("swiglu")
    assert list(kernels) == ["epilogue", "x", "w1", "w3"]
    epilogue = kernels["epilogue"]
    assert epilogue.results == ("dacc1", "dacc2")
    assert [o.dtype for o in epilogue.checked.kernel.outputs] == ["bf16", "bf16"]
    assert {(a.name, a.source) for a in epilogue.arguments} == {
        ("acc1", "residual"),
        ("acc2", "residual"),
        ("y", "cotangent"),
    }
    products = {name: len(kernels[name].checked.frame.products) for name in ("x", "w1", "w3")}
    assert products == {"x": 2, "w1": 1, "w3": 1}
    assert {a.name for a in kernels["x"].arguments} == {"dacc1", "dacc2", "w1", "w3"}
    assert {a.name for a in kernels["w3"].arguments} == {"dacc2", "x"}


def test_the_forward_pass_saves_each_products_value_the_epilogues_derivative_reads():
    (swiglu,) = [k for k in check_source(SPEC, "glu.pallas") if k.kernel.name == "swiglu"]
    assert swiglu.gradient.residuals == ("acc1", "acc2")
    (two_inputs,) = [k for k in check_source(SPEC, "glu.pallas") if k.kernel.name == "two_inputs"]
    assert two_inputs.gradient.residuals == ()  # a sum's derivative reads no product


def test_a_bias_beside_two_products_is_summed_once_in_a_pass_over_m():
    """dw = x.T @ dy and dv = u.T @ dy both sweep M; the bias's cotangent is summed in the
    first, and only there."""
    kernels = backward_kernels("two_inputs")
    assert sorted(kernels) == ["u", "v", "w", "x"]
    assert kernels["w"].results == ("w", "bias")
    assert all("bias" not in derived.results for name, derived in kernels.items() if name != "w")


NOT_YET = """\
kernel ffn {{
    in  x: f32[M, K]
    in  w1, w3: f32[K, N]
    {more}
    out y: f32[M, {out}]
    y = {body}
}}
"""


@pytest.mark.parametrize(
    "body, more, out, what",
    [
        (
            "softmax(x @ w1 + x @ w3, N) @ w2",
            "in  w2: f32[N, D]",
            "D",
            "several products whose values are reduced, other than attention's in a computed operand of a product",
        ),
        ("softmax(x @ w1 + x @ w3, N)", "", "N", "several products whose values are reduced, other than attention's"),
        ("silu(exp(x) @ w1) * (x @ w3)", "", "N", "several products, one of a computed operand"),
        (
            "(x @ w1) @ w2 + x @ w4",
            "in  w2: f32[N, D]\n    in  w4: f32[K, D]",
            "D",
            "a product of a product beside another product",
        ),
    ],
)
def test_what_is_not_differentiable_yet_is_named(body, more, out, what):
    (checked,) = check_source(NOT_YET.format(more=more, out=out, body=body), "ffn.pallas")
    assert checked.gradient.not_yet == what


# --------------------------------------------------------------------------- compiled


def gradient_of(module, kernel: str, **keywords):
    """jax.grad by every float input."""
    return compiled_gradient(getattr(module, kernel), float_inputs(KERNELS[kernel][0]), **keywords)


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


@compiled
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_forward_and_backward_kernels_compile_for_tpu(module, kernel, chip):
    text = compile_only.compile_for_tpu(gradient_of(module, kernel), shapes(kernel), chip=chip).as_text()
    assert text.count("tpu_custom_call") >= len(backward_kernels(kernel))


@compiled
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_forward_and_backward_kernels_compile_for_sm90_with_every_access_masked(module, kernel):
    assert_triton_compiles_masked(gradient_of(module, kernel, gpu_backend="triton"), shapes(kernel))


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_lower_to_mosaic_gpu(module, kernel):
    """jax.grad with gpu_backend="mosaic_gpu" lowers for CUDA, each backward kernel that
    Mosaic GPU takes to a Mosaic GPU call (a product kernel in stages to one a stage);
    the others, and the forward kernels of two products, say why and run on Triton."""
    text = lowered_for_mosaic_gpu(gradient_of(module, kernel, gpu_backend="mosaic_gpu"), shapes(kernel))
    taken = [
        derived.checked.kernel.name
        for derived in backward_kernels(kernel).values()
        if getattr(module, derived.checked.kernel.name)._launchers["mosaic_gpu"][0]
    ]
    assert taken and len(re.findall(r"custom_call @mosaic_gpu", text)) >= len(taken)


@pytest.mark.jax_line
def test_the_backward_kernels_interpreted_on_mosaic_gpu_give_the_float64_numpy_derivative(module, monkeypatch):
    """Mosaic GPU's interpreter (jax 0.12 on) runs swiglu's epilogue, dw1 and dw3 as
    compiled, with TMA's bounds, on the residuals its forward pass saves. dx's pass over N
    reads blocks of M (of dacc1, dacc2) that the warpgroups of Mosaic GPU's fused form
    would have to share: it runs on Triton, and says so."""
    plgpu = pytest.importorskip("jax.experimental.pallas.mosaic_gpu", reason="jax 0.10.2 imports it only with absl-py")
    if not hasattr(plgpu, "InterpretGPUParams"):
        pytest.skip("Mosaic GPU's interpreter is public from jax 0.12")
    (x, w1, w3), dy = inputs_and_cotangent(module, "swiglu")
    _, acc1, acc2 = module.swiglu.with_residuals(x, w1, w3, interpret=True)
    take_gpu_branch(monkeypatch, module)
    interpret = plgpu.InterpretGPUParams()
    dacc1, dacc2 = module.swiglu_backward_epilogue(acc1, acc2, dy, gpu_backend="mosaic_gpu", interpret=interpret)
    dw1 = module.swiglu_backward_w1(x, dacc1, gpu_backend="mosaic_gpu", interpret=interpret)
    dw3 = module.swiglu_backward_w3(x, dacc2, gpu_backend="mosaic_gpu", interpret=interpret)
    _, want_dw1, want_dw3 = swiglu_numpy(x, w1, w3, dy)
    assert_close(dw1, want_dw1, jnp.bfloat16)
    assert_close(dw3, want_dw3, jnp.bfloat16)
    assert module.swiglu_backward_x._launchers["mosaic_gpu"][0] is None
    assert "an input read along the swept dimension in blocks of M (dacc1)" in " ".join(
        line.strip("# ") for line in inspect.getsource(module).splitlines()
    )
