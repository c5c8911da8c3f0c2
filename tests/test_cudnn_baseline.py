"""cuDNN's attention as `pallasgen bench`'s baseline for attention kernels on NVIDIA GPUs:
the same q, k and v in cuDNN's layout, the spec's scale and mask, and a check that it
computes the kernel's output. Here jax.nn.dot_product_attention runs its XLA
implementation on CPU, which takes the same arguments as its cuDNN one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernel_cases import generated_module
from pallasgen.devices import bench, runner
from pallasgen.devices.cudnn import agrees, cudnn_attention
from pallasgen.workspace.pipeline import check_source

ROOT = Path(__file__).resolve().parents[1]


def bundled(spec: str, name: str):
    (checked,) = [k for k in check_source((ROOT / "specs" / spec).read_text(), spec) if k.kernel.name == name]
    return checked


def numpy_attention(q, k, v, scale, mask):
    """float64 softmax(q k^T * scale, masked) v over the last two axes; k, v broadcast over q's extra axes."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    while k.ndim < q.ndim:  # grouped-query attention: q's R sits after k's leading axes
        k, v = k[..., None, :, :], v[..., None, :, :]
    s = np.einsum("...sd,...td->...st", q, k) * scale
    s = np.where(mask(s.shape[-2], s.shape[-1]), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("...st,...td->...sd", p / p.sum(-1, keepdims=True), v)


def causal(s, t):
    return np.arange(s)[:, None] >= np.arange(t)[None, :]


def everything(s, t):
    return np.ones((s, t), bool)


@pytest.mark.parametrize(
    "name, sizes, scale, mask",
    [
        ("attention", dict(B=2, H=3, S=40, T=40, D=16), 0.125, causal),
        ("attention_full", dict(B=2, H=3, S=24, T=40, D=16), 0.125, everything),
        ("gqa", dict(B=1, G=2, R=3, S=32, T=32, D=16), 0.088388, everything),
    ],
)
def test_the_baseline_is_cudnns_attention_on_the_kernels_q_k_v_with_its_scale_and_mask(name, sizes, scale, mask):
    checked = bundled("attention.pallas", name)
    inputs = runner.random_inputs(checked, sizes, 0)
    baseline = cudnn_attention(checked, inputs, implementation="xla")
    got = np.asarray(baseline.layout(baseline.function(*baseline.arrays)), np.float64)
    want = numpy_attention(*inputs[:3], scale, mask)
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    assert agrees(baseline, [want.astype(np.float32)] * (baseline.output + 1))


def test_a_param_given_at_the_call_is_the_scale():
    checked = bundled("attention.pallas", "attention_full")
    inputs = runner.random_inputs(checked, dict(B=1, H=1, S=16, T=16, D=8), 0)
    baseline = cudnn_attention(checked, inputs, {"scale": 0.5}, implementation="xla")
    got = np.asarray(baseline.layout(baseline.function(*baseline.arrays)), np.float64)
    np.testing.assert_allclose(got, numpy_attention(*inputs[:3], 0.5, everything), atol=2e-2, rtol=2e-2)


def test_a_mask_cudnn_does_not_apply_is_found_out_by_comparing_results():
    """Bottom-right causal attention is cuDNN's top-left causal one only where S == T."""
    checked = bundled("attention.pallas", "attention_bottom_right")
    for s, t, same in ((32, 32, True), (16, 32, False)):
        inputs = runner.random_inputs(checked, dict(B=1, H=2, S=s, T=t, D=8), 0)
        baseline = cudnn_attention(checked, inputs, implementation="xla")
        bottom_right = lambda s, t: np.arange(s)[:, None] + t - s >= np.arange(t)[None, :]  # noqa: E731
        assert agrees(baseline, [numpy_attention(*inputs[:3], 0.125, bottom_right)]) is same


F32_ATTENTION = """\
kernel f32_attention {
    in  q: f32[S, D]
    in  k, v: f32[T, D]
    out o: f32[S, D]
    o = softmax((q @ k.T) * 0.5, T) @ v
    block S = 128, T = 128
}
"""


def test_kernels_cudnn_cannot_stand_beside_say_why():
    assert cudnn_attention(bundled("matmul.pallas", "matmul"), ()) == "not an attention kernel"
    (f32,) = check_source(F32_ATTENTION, "spec.pallas")
    assert cudnn_attention(f32, ()) == "cuDNN takes bf16 or f16 q, k and v"


def test_bench_reports_why_cudnn_is_missing_where_it_cannot_run():
    """On CPU there is no cuDNN: the kernel and XLA are still timed, and the line says why."""
    checked = bundled("attention.pallas", "attention_full")
    sizes = dict(B=1, H=1, S=16, T=16, D=8)
    inputs = runner.random_inputs(checked, sizes, 0)
    timing = bench.time_kernel(generated_module("attention"), checked, sizes, inputs, 1, {}, cudnn=True)
    assert timing.cudnn_seconds is None and timing.cudnn_note.startswith("no cuDNN: ")
    assert timing.cudnn_note in bench.describe(timing, "cpu")
