"""`jax.grad` of attention kernels whose scores read inputs besides q and k
(gradients/attention.py), as users write them: ALiBi's slopes `slope: f32[H]`, packed
sequences' segment ids with a key bias `k_bias: bf16[B, T]`, and grouped queries with a
slope per query head. An input without T gets its cotangent from the dq kernel (partial
sums over T in f32 that keep [B, H, S]), one with T from the dkdv kernel (over S, keeping
[B, H, T]); a kernel of their own sums those over what the input is broadcast over.
Integer inputs are read, and have no cotangent.

Each is differentiated on both paths (TPU and Triton kernels in interpret mode) at ragged
sizes against float64 NumPy derivatives written here by hand and `jax.vjp` of its
reference, and compiled by the real compilers (Mosaic for v5e and v6e, Triton for sm_90
with every access masked, Mosaic GPU's lowering).
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
    lowered_for_mosaic_gpu,
    module_from_spec,
)
from pallasgen.devices import compile_only
from pallasgen.workspace.pipeline import check_source

SPEC = """\
kernel alibi {                           # ALiBi: a linear bias of the distance, a slope per head
    in  q: bf16[B, H, S, D]
    in  k, v: bf16[B, H, T, D]
    in  slope: f32[H]
    out o: bf16[B, H, S, D]
    param scale: f32 = 0.125
    let s = where(index(S) >= index(T), (q @ k.T) * scale - slope * f32(index(S) - index(T)), -inf)
    o = softmax(s, T) @ v
    block B = 1, H = 1, S = 128, T = 128
}

kernel packed {                          # sequences packed in rows: a query sees its segment's keys
    in  q: bf16[B, H, S, D]
    in  k, v: bf16[B, H, T, D]
    in  q_segment: i32[B, S]
    in  k_segment: i32[B, T]
    in  k_bias: bf16[B, T]
    out o: bf16[B, H, S, D]
    out lse: f32[B, H, S]
    let s = where(q_segment == k_segment, (q @ k.T) * 0.125 + f32(k_bias), -inf)
    o = softmax(s, T) @ v
    lse = logsumexp(s, T)
    block B = 1, H = 1, S = 128, T = 128
}

kernel gqa_alibi {                       # grouped queries, symmetric ALiBi: a slope per query head
    in  q: bf16[B, G, R, S, D]
    in  k, v: bf16[B, G, T, D]
    in  slope: f32[G, R]
    out o: bf16[B, G, R, S, D]
    let s = (q @ k.T) * 0.125 - slope * f32(abs(index(S) - index(T)))
    o = softmax(s, T) @ v
    block B = 1, G = 1, R = 1, S = 128, T = 128
}
"""

RAGGED = {"B": 2, "H": 3, "G": 2, "R": 3, "S": 200, "T": 300, "D": 48}
SEGMENTS = 3


def softmax_backward(s, v, do, dlse=0.0):
    """o, lse, ds, dv of o = softmax(s) @ v in float64, from the cotangents of o and lse."""
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("...sd,...td->...st", do, v)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) + p * np.asarray(dlse)[..., None]
    return ds, np.einsum("...st,...sd->...td", p, do)


def distance():
    return np.arange(RAGGED["S"])[:, None] - np.arange(RAGGED["T"])[None]


def alibi_numpy(q, k, v, slope, do):
    q, k, v, slope, do = map(f64, (q, k, v, slope, do))
    scores = np.einsum("bhsd,bhtd->bhst", q, k) * 0.125 - slope[:, None, None] * distance()
    ds, dv = softmax_backward(np.where(distance() >= 0, scores, -np.inf), v, do)
    dq, dk = np.einsum("bhst,bhtd->bhsd", ds, k) * 0.125, np.einsum("bhst,bhsd->bhtd", ds, q) * 0.125
    return dq, dk, dv, -(ds * distance()).sum((0, 2, 3))


def packed_numpy(q, k, v, q_segment, k_segment, k_bias, do, dlse):
    q, k, v, k_bias, do, dlse = map(f64, (q, k, v, k_bias, do, dlse))
    scores = np.einsum("bhsd,bhtd->bhst", q, k) * 0.125 + k_bias[:, None, None, :]
    same = q_segment[:, None, :, None] == k_segment[:, None, None, :]
    ds, dv = softmax_backward(np.where(same, scores, -np.inf), v, do, dlse)
    dq, dk = np.einsum("bhst,bhtd->bhsd", ds, k) * 0.125, np.einsum("bhst,bhsd->bhtd", ds, q) * 0.125
    return dq, dk, dv, None, None, ds.sum((1, 2))


def gqa_alibi_numpy(q, k, v, slope, do):
    q, k, v, slope, do = map(f64, (q, k, v, slope, do))
    scores = np.einsum("bgrsd,bgtd->bgrst", q, k) * 0.125 - slope[..., None, None] * np.abs(distance())
    ds, dv = softmax_backward(scores, v[:, :, None], do)
    dq = np.einsum("bgrst,bgtd->bgrsd", ds, k) * 0.125
    dk = np.einsum("bgrst,bgrsd->bgtd", ds, q) * 0.125
    return dq, dk, dv.sum(2), -(ds * np.abs(distance())).sum((0, 3, 4))


KERNELS = {
    "alibi": ((("bf16", "BHSD"),) + (("bf16", "BHTD"),) * 2 + (("f32", "H"),), alibi_numpy),
    "packed": (
        (("bf16", "BHSD"),) + (("bf16", "BHTD"),) * 2 + (("i32", "BS"), ("i32", "BT"), ("bf16", "BT")),
        packed_numpy,
    ),
    "gqa_alibi": ((("bf16", "BGRSD"),) + (("bf16", "BGTD"),) * 2 + (("f32", "GR"),), gqa_alibi_numpy),
}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return module_from_spec(tmp_path_factory, SPEC, "attention_inputs")


def shapes(kernel: str) -> list[jax.ShapeDtypeStruct]:
    return abstract_arrays(KERNELS[kernel][0], RAGGED)


def inputs(kernel: str, rng) -> list[jax.Array]:
    """Random inputs (slopes of either sign: a negative one looks far, which a rounded
    delta would make 1% wrong); segments of about a third of S and of T each, so that
    every query sees keys of its segment."""
    arrays = []
    for array, (dtype, _) in zip(shapes(kernel), KERNELS[kernel][0]):
        if dtype == "i32":
            positions = np.arange(array.shape[-1]) * SEGMENTS // array.shape[-1]
            arrays.append(jnp.asarray(np.broadcast_to(positions, array.shape), jnp.int32))
        else:
            arrays.append(jnp.asarray(rng.standard_normal(array.shape), array.dtype))
    return arrays


def float_cotangents(got, arrays):
    return [(g, a) for g, a in zip(got, arrays) if jnp.issubdtype(a.dtype, jnp.floating)]


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative_and_the_references(module, kernel, path):
    rng = np.random.default_rng(0)
    arrays = inputs(kernel, rng)
    function = getattr(module, kernel)
    outputs = jax.eval_shape(function.reference, *arrays)
    cotangents = jax.tree.map(lambda o: jnp.asarray(rng.standard_normal(o.shape), o.dtype), outputs)
    _, vjp = jax.vjp(functools.partial(function, interpret=True), *arrays)
    got = vjp(cotangents)
    _, reference_vjp = jax.vjp(function.reference, *arrays)
    want = KERNELS[kernel][1](*arrays, *jax.tree.leaves(cotangents))
    for (g, array), (r, _), w in zip(
        float_cotangents(got, arrays),
        float_cotangents(reference_vjp(cotangents), arrays),
        [w for w, a in zip(want, arrays) if jnp.issubdtype(a.dtype, jnp.floating)],
    ):
        assert g.shape == array.shape and g.dtype == array.dtype
        # bf16: the backward products' operands in bf16 (p, ds), and o rounded to bf16 in
        # delta: a bf16 ulp of the largest cotangent, as jax.vjp of the reference; f32 (the
        # slopes): sums of exact terms over all queries and keys (the exact delta)
        tolerance = (2.0**-7 if array.dtype == jnp.bfloat16 else 1e-4) * np.abs(w).max()
        np.testing.assert_allclose(f64(g), w, atol=tolerance)
        np.testing.assert_allclose(f64(r), w, atol=tolerance)
    assert [g.dtype for g, a in zip(got, arrays) if a.dtype == jnp.int32] == [jax.dtypes.float0] * (
        kernel == "packed"
    ) * 2


def backward_kernels(kernel: str):
    (checked,) = [k for k in check_source(SPEC, "attention_inputs.pallas") if k.kernel.name == kernel]
    return {k.checked.kernel.name: k for k in checked.gradient.kernels}


def test_an_input_without_t_is_summed_over_t_by_dq_and_over_the_rest_by_a_kernel_of_its_own():
    kernels = backward_kernels("alibi")
    assert list(kernels) == ["alibi_backward_dq", "alibi_backward_dkdv", "alibi_backward_over_b_s"]
    partial = kernels["alibi_backward_dq"].checked.kernel.outputs[-1]
    assert (partial.name, partial.dtype, partial.dims) == ("dslope_bs", "f32", ("B", "H", "S"))
    summing = kernels["alibi_backward_over_b_s"]
    assert summing.results == ("slope",)
    # swept along S (the forward's larger block), B whole: not all of S at once
    assert [(b.dim, b.size) for b in summing.checked.kernel.blocks] == [("S", 128)]


def test_an_input_with_t_is_summed_over_s_by_dkdv_and_an_integer_input_has_no_cotangent():
    kernels = backward_kernels("packed")
    assert list(kernels) == ["packed_backward_dq", "packed_backward_dkdv", "packed_backward_over_h"]
    partial = kernels["packed_backward_dkdv"].checked.kernel.outputs[-1]
    assert (partial.name, partial.dtype, partial.dims) == ("dk_bias_h", "f32", ("B", "H", "T"))
    assert kernels["packed_backward_over_h"].results == ("k_bias",)
    results = {name for k in kernels.values() for name in k.results}
    assert not results & {"q_segment", "k_segment"}


GATED = """\
kernel gated {
    in  q: bf16[B, H, S, D]
    in  k, v: bf16[B, H, T, D]
    in  keep: f32[B, T]
    out o: bf16[B, H, S, D]
    o = softmax(where(keep > 0.5, (q @ k.T) * 0.125, -inf), T) @ v
    block B = 1, H = 1, S = 128, T = 128
}
"""


def test_a_float_input_read_only_by_a_condition_gets_a_zero_cotangent_and_no_kernel():
    (checked,) = check_source(GATED, "gated.pallas")
    kernels = checked.gradient.kernels
    assert [k.checked.kernel.name for k in kernels] == ["gated_backward_dq", "gated_backward_dkdv"]
    assert "keep" not in checked.gradient.results  # its cotangent is None: zeros


BIAS_OVER_S_AND_T = """\
kernel biased {
    in  q: bf16[B, H, S, D]
    in  k, v: bf16[B, H, T, D]
    in  bias: f32[H, S, T]
    out o: bf16[B, H, S, D]
    o = softmax((q @ k.T) * 0.125 + bias, T) @ v
    block B = 1, H = 1, S = 128, T = 128
}
"""


def test_an_input_over_both_s_and_t_is_not_differentiable_yet_and_says_which():
    (checked,) = check_source(BIAS_OVER_S_AND_T, "biased.pallas")
    assert checked.gradient.not_yet == "an input of the scores over both S and T (bias)"


def gradient_of(module, kernel: str, **keywords):
    """jax.grad by every float input."""
    return compiled_gradient(getattr(module, kernel), float_inputs(KERNELS[kernel][0]), **keywords)


@compiled
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_tpu(module, kernel, chip):
    text = compile_only.compile_for_tpu(gradient_of(module, kernel), shapes(kernel), chip=chip).as_text()
    assert text.count("tpu_custom_call") >= len(backward_kernels(kernel)) + 1


@compiled
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_the_backward_kernels_compile_for_sm90_with_every_access_masked(module, kernel):
    assert_triton_compiles_masked(gradient_of(module, kernel, gpu_backend="triton"), shapes(kernel))


def test_the_backward_kernels_of_packed_sequences_lower_to_mosaic_gpu(module):
    """dq and dkdv read the segment ids and the key bias in tiles on Mosaic GPU; the sum
    over H runs on Triton (a reduction Mosaic GPU does not take yet), and so does ALiBi,
    whose slopes are an array of batch dimensions alone."""
    text = lowered_for_mosaic_gpu(gradient_of(module, "packed", gpu_backend="mosaic_gpu"), shapes("packed"))
    assert text.count("custom_call @mosaic_gpu") >= 3  # forward, dq, dkdv
    assert module.alibi_backward_dq._launchers["mosaic_gpu"][0] is None
