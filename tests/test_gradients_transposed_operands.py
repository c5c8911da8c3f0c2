"""`jax.grad` through products of a transposed computed operand (gradients/fused.py), as
users write them: int8 weight-only matmul `x @ bf16(w).T` (weights stored [out, in] as
nn.Linear stores them), with a per-channel scale, and an f32 `x @ (w * g).T`.

The product kernel that reads the operand computes it in its tiles (`dy @ bf16(w)`: the
int8 weights are read, no bf16 copy written). An integer weight has no cotangent: no
kernel computes the operand's (`drhs`, a whole product), and the forward pass saves
nothing for it. Each kernel is differentiated on both paths (TPU and Triton kernels in
interpret mode) at ragged sizes against float64 NumPy derivatives written here by hand,
and compiled for v5e, v6e and sm_90 (every access masked).
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
    compiled_gradient,
    float_inputs,
    assert_product_cotangent_close,
    assert_triton_compiles_masked,
    f64,
    module_from_spec,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel w8 {
    in  x: bf16[M, K]
    in  w: i8[N, K]
    out y: bf16[M, N]
    y = x @ bf16(w).T
    block M = 128, N = 128, K = 256
}

kernel w8_scaled {
    in  x: bf16[M, K]
    in  w: i8[N, K]
    in  scale: f32[N]
    out y: bf16[M, N]
    y = bf16((x @ bf16(w).T) * scale)
    block M = 128, N = 128, K = 256
}

kernel scaled_t {
    in  x: f32[M, K]
    in  w: f32[N, K]
    in  g: f32[K]
    out y: f32[M, N]
    y = x @ (w * g).T
    block M = 64, N = 128, K = 128
}
"""

RAGGED = {"M": 37, "K": 300, "N": 200}


def w8_numpy(x, w, dy):
    """y = x @ w.T: dx = dy @ w; w (integers) has none."""
    return (f64(dy) @ f64(w),)


def w8_scaled_numpy(x, w, scale, dy):
    """y = (x @ w.T) * scale: g = dy * scale; dx = g @ w, dscale = sum(dy * (x @ w.T), M)."""
    x, w, g = f64(x), f64(w), f64(dy)
    return (g * f64(scale)) @ w, (g * (x @ w.T)).sum(axis=0)


def scaled_t_numpy(x, w, g, dy):
    """y = x @ (w * g).T: dx = dy @ (w * g), d(w * g) = dy.T @ x, dw = that * g, dg = sum(w * that, N)."""
    x, w, g, dy = f64(x), f64(w), f64(g), f64(dy)
    drhs = dy.T @ x
    return dy @ (w * g), drhs * g, (w * drhs).sum(axis=0)


KERNELS = {  # each input's dtype and dimensions, and the float inputs' float64 derivatives
    "w8": ((("bf16", "MK"), ("i8", "NK")), w8_numpy),
    "w8_scaled": ((("bf16", "MK"), ("i8", "NK"), ("f32", "N")), w8_scaled_numpy),
    "scaled_t": ((("f32", "MK"), ("f32", "NK"), ("f32", "K")), scaled_t_numpy),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "i8": jnp.int8}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "quantized")


def inputs_and_cotangent(module, kernel: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = []
    for dtype, dims in KERNELS[kernel][0]:
        shape = [RAGGED[d] for d in dims]
        values = rng.integers(-128, 128, shape) if dtype == "i8" else rng.standard_normal(shape)
        arrays.append(jnp.asarray(values, DTYPES[dtype]))
    out = jax.eval_shape(getattr(module, kernel).reference, *arrays)
    return arrays, jnp.asarray(rng.standard_normal(out.shape), out.dtype)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(module, kernel, path):
    arrays, dy = inputs_and_cotangent(module, kernel)
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    got = vjp(dy)
    floats = [(g, a) for g, a in zip(got, arrays, strict=True) if jnp.issubdtype(a.dtype, jnp.floating)]
    for (cotangent, array), want in zip(floats, KERNELS[kernel][1](*arrays, dy), strict=True):
        assert cotangent.shape == array.shape and cotangent.dtype == array.dtype
        assert_product_cotangent_close(cotangent, want, array.dtype)
    integers = [g for g, a in zip(got, arrays) if a.dtype == jnp.int8]
    assert all(g.dtype == jax.dtypes.float0 for g in integers)


def gradient(name: str):
    (checked,) = [k for k in check_source(SPEC, "quantized.pallas") if k.kernel.name == name]
    return checked.gradient


def test_an_integer_weights_operand_gets_no_cotangent_and_nothing_saved():
    """w8's backward pass is one kernel, dx = dy @ bf16(w): it reads the int8 weights and
    converts them in its tiles (no kernel writes a bf16 copy), no kernel computes the
    operand's cotangent (dy.T @ x, a product as large as the forward's), and the forward
    saves nothing."""
    w8 = gradient("w8")
    (dx,) = w8.kernels
    assert dx.checked.kernel.name == "w8_backward_x" and w8.residuals == ()
    assert [(a.name, a.source) for a in dx.arguments] == [("y", "cotangent"), ("w", "input")]
    assert [k.checked.kernel.name for k in gradient("w8_scaled").kernels] == [
        "w8_scaled_backward_epilogue",
        "w8_scaled_backward_over_m",
        "w8_scaled_backward_x",
    ]


def test_a_float_weights_operand_cotangent_goes_through_the_operands_derivative():
    """x @ (w * g).T: dx = dy @ (w * g) computes the operand in its tiles; drhs = dy.T @ x,
    then the operand's derivative takes it to dw and dg (summed over N)."""
    names = [k.checked.kernel.name for k in gradient("scaled_t").kernels]
    assert names == [
        "scaled_t_backward_x",
        "scaled_t_backward_rhs",
        "scaled_t_rhs_backward",
        "scaled_t_rhs_backward_over_n",
    ]


def gradient_of(module, kernel: str, **keywords):
    """jax.grad by every float input."""
    return compiled_gradient(getattr(module, kernel), float_inputs(KERNELS[kernel][0]), **keywords)


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


@compiled
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_tpu(module, kernel, chip):
    text = compile_only.compile_for_tpu(gradient_of(module, kernel), shapes(kernel), chip=chip).as_text()
    assert text.count("tpu_custom_call") >= len(gradient(kernel).kernels)


@compiled
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_sm90_with_every_access_masked(module, kernel):
    assert_triton_compiles_masked(gradient_of(module, kernel, gpu_backend="triton"), shapes(kernel))
