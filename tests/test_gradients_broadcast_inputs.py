"""`jax.grad` of kernels with an input broadcast over two blocked dimensions
(gradients/reverse.py), as users write them: RoPE with `cos, sin: f32[S, D]` over
`[B, H, S, D]` with B and H blocked, and an RMS norm's weight `w: f32[D]` over
`[B, S, D]` with B and S blocked. Such an input's cotangent is summed over one of them
by the kernel that computes it (`dcos_b`, partial sums in f32 that keep B) and over the
other by a kernel of its own (`NAME_backward_over_b`).

Each is differentiated on both paths (TPU and Triton kernels in interpret mode) at
ragged sizes against float64 NumPy derivatives written here by hand, and its backward
kernels compile for v5e, v6e and sm_90 (every access masked).
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
    assert_triton_compiles_masked,
    f64,
    module_from_spec,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel rope {                            # q split in halves by the caller
    in  x1, x2: bf16[B, H, S, D]
    in  cos, sin: f32[S, D]
    out y1, y2: bf16[B, H, S, D]
    y1 = bf16(x1 * cos - x2 * sin)
    y2 = bf16(x2 * cos + x1 * sin)
    block B = 1, H = 1, S = 64
}

kernel rms_norm_bsd {
    in  x: f32[B, S, D]
    in  w: f32[D]
    out y: f32[B, S, D]
    y = x * rsqrt(mean(x * x, D) + 1e-6) * w
    block B = 1, S = 32
}
"""

RAGGED = {"B": 3, "H": 5, "S": 100, "D": 40}


def rope_numpy(x1, x2, cos, sin, dy1, dy2):
    x1, x2, cos, sin, g1, g2 = map(f64, (x1, x2, cos, sin, dy1, dy2))
    return g1 * cos + g2 * sin, g2 * cos - g1 * sin, (g1 * x1 + g2 * x2).sum((0, 1)), (g2 * x1 - g1 * x2).sum((0, 1))


def rms_norm_bsd_numpy(x, w, dy):
    """y = x r w, r = (mean(x^2) + eps)^-1/2: dx = r (g - x r^2 mean(g x)), g = dy w; dw = sum(dy x r, B, S)."""
    x, w, dy = f64(x), f64(w), f64(dy)
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    g = dy * w
    return r * (g - x * r**2 * (g * x).mean(-1, keepdims=True)), (dy * x * r).sum((0, 1))


KERNELS = {
    "rope": ((("bf16", "BHSD"),) * 2 + (("f32", "SD"),) * 2, rope_numpy),
    "rms_norm_bsd": ((("f32", "BSD"), ("f32", "D")), rms_norm_bsd_numpy),
}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "broadcast")


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(module, kernel, path):
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(rng.standard_normal(s.shape), s.dtype) for s in shapes(kernel)]
    outputs = jax.eval_shape(getattr(module, kernel).reference, *arrays)
    cotangents = jax.tree.map(lambda o: jnp.asarray(rng.standard_normal(o.shape), o.dtype), outputs)
    _, vjp = jax.vjp(functools.partial(getattr(module, kernel), interpret=True), *arrays)
    for got, want, array in zip(vjp(cotangents), KERNELS[kernel][1](*arrays, *jax.tree.leaves(cotangents)), arrays):
        assert got.shape == array.shape and got.dtype == array.dtype
        # bf16 cotangents: a rounding each; f32 ones summed over B and H (or B and S) in f32
        tolerance = 2.0**-7 if array.dtype == jnp.bfloat16 else 1e-5
        np.testing.assert_allclose(f64(got), want, rtol=tolerance, atol=tolerance * np.abs(want).max())


def test_the_second_sum_is_a_kernel_of_its_own_reading_f32_partial_sums():
    (rope,) = [k for k in check_source(SPEC, "broadcast.pallas") if k.kernel.name == "rope"]
    kernels = {k.checked.kernel.name: k for k in rope.gradient.kernels}
    assert list(kernels) == ["rope_backward", "rope_backward_over_h", "rope_backward_over_b"]
    partials = kernels["rope_backward_over_h"].checked.kernel.outputs
    assert [(p.name, p.dtype, p.dims) for p in partials] == [
        ("dcos_b", "f32", ("B", "S", "D")),
        ("dsin_b", "f32", ("B", "S", "D")),
    ]
    assert kernels["rope_backward_over_b"].results == ("cos", "sin")


NOT_YET = """\
kernel k {{
    in  x: f32[{dims}]
    in  w: f32[D]
    out y: f32[{dims}]
    y = x * w
    block {blocks}
}}
"""


def test_an_input_broadcast_over_three_blocked_dimensions_is_not_differentiable_yet():
    (checked,) = check_source(NOT_YET.format(dims="A, B, S, D", blocks="A = 1, B = 1, S = 8"), "k.pallas")
    assert checked.gradient.not_yet == "an input broadcast over three blocked dimensions"
    (checked,) = check_source(NOT_YET.format(dims="B, S, D", blocks="B = 1, S = 8"), "k.pallas")
    assert checked.gradient.not_yet is None


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
