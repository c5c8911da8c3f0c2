"""`jax.grad` of kernels whose product has an operand of positions alone
(gradients/fused.py): a cumulative sum written as a triangle product,
`f32(index(U) <= index(T)) @ xu`, and decayed sums `bf16(where(index(U) <= index(T),
exp(...), 0)) @ xu` reading a param. Such an operand is a constant of the gradient: it
gets no cotangent, and the kernel that needs it (`dxu = tri.T @ dy`, a reverse cumulative
sum) computes it in its tiles, as the forward does; no kernel writes it.

Each is differentiated on both paths (TPU and Triton kernels in interpret mode) at ragged
sizes against float64 NumPy derivatives written here by hand, and its backward kernels
compile for v5e, v6e and sm_90 (every access masked).
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
    assert_triton_compiles_masked,
    compiled_gradient,
    float_inputs,
    f64,
    module_from_spec,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel cumsum_rows {                     # y[b, t] = the sum of xu[b, u] for u <= t, in O(T^2)
    in  x: f32[B, T, N]                  # gives T's size
    in  xu: f32[B, U, N]                 # x again, along U
    out y: f32[B, T, N]
    y = f32(index(U) <= index(T)) @ xu
    block B = 1, T = 128, N = 128
}

kernel decayed_sums {                    # y[t] = the sum of xu[u] exp(-decay (t - u)) for u <= t
    in  x: bf16[T, D]
    in  xu: bf16[U, D]
    out y: f32[T, D]
    param decay: f32 = 0.05
    let weight = where(index(U) <= index(T), exp(f32(index(U) - index(T)) * decay), 0.0)
    y = bf16(weight) @ xu
    block T = 128, D = 128
}
"""

RAGGED = {"B": 2, "T": 300, "U": 300, "N": 200, "D": 200}


def lower_triangle(weights=None):
    t, u = np.arange(RAGGED["T"])[:, None], np.arange(RAGGED["U"])[None]
    return np.where(u <= t, 1.0 if weights is None else weights(t - u), 0.0)


def cumsum_rows_numpy(x, xu, dy):
    """dxu[u] = the sum of dy[t] for t >= u: a reverse cumulative sum; x is read for its size."""
    dy = f64(dy)
    return np.zeros(x.shape), np.flip(np.cumsum(np.flip(dy, 1), 1), 1)


def decayed_sums_numpy(x, xu, dy, decay=0.05):
    """dxu = W.T @ dy, W the decay weights rounded to bf16 as the forward's operand is."""
    weights = lower_triangle(lambda distance: np.exp(-decay * distance)).astype(jnp.bfloat16)
    return np.zeros(x.shape), f64(weights).T @ f64(dy)


KERNELS = {
    "cumsum_rows": ((("f32", "BTN"), ("f32", "BUN")), cumsum_rows_numpy),
    "decayed_sums": ((("bf16", "TD"), ("bf16", "UD")), decayed_sums_numpy),
}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "constant_operands")


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(module, kernel, path):
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(rng.standard_normal(s.shape), s.dtype) for s in shapes(kernel)]
    outputs = jax.eval_shape(getattr(module, kernel).reference, *arrays)
    dy = jnp.asarray(rng.standard_normal(outputs.shape), outputs.dtype)
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    for got, want, array in zip(vjp(dy), KERNELS[kernel][1](*arrays, dy), arrays):
        assert got.shape == array.shape and got.dtype == array.dtype
        # f32: sums of up to 300 exact terms; bf16: the cotangent rounded to bf16 for the product
        tolerance = 2.0**-7 if array.dtype == jnp.bfloat16 else 1e-5
        np.testing.assert_allclose(f64(got), want, rtol=tolerance, atol=tolerance * np.abs(want).max())


def test_no_kernel_writes_the_operand_and_the_one_that_reads_it_computes_it():
    (cumsum,) = [k for k in check_source(SPEC, "constant_operands.pallas") if k.kernel.name == "cumsum_rows"]
    (backward,) = cumsum.gradient.kernels
    kernel = backward.checked.kernel
    assert kernel.name == "cumsum_rows_backward_xu" and backward.results == ("xu",)
    # dy, and xu for U's size: the triangle is computed from index(U) and index(T) in the tiles
    assert [(d.name, a.source) for d, a in zip(kernel.inputs, backward.arguments)] == [
        ("dy", "cotangent"),
        ("xu", "input"),
    ]
    assert cumsum.gradient.residuals == ()


def gradient_of(module, kernel: str, **keywords):
    """jax.grad by every float input."""
    return compiled_gradient(getattr(module, kernel), float_inputs(KERNELS[kernel][0]), **keywords)


@compiled
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_tpu(module, kernel, chip):
    """The forward kernel saves nothing, so only the backward kernel is left to compile."""
    text = compile_only.compile_for_tpu(gradient_of(module, kernel), shapes(kernel), chip=chip).as_text()
    assert text.count("tpu_custom_call") == 1


@compiled
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_sm90_with_every_access_masked(module, kernel):
    assert_triton_compiles_masked(gradient_of(module, kernel, gpu_backend="triton"), shapes(kernel))
