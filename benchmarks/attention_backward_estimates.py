"""Causal attention, forward plus backward, by compiler estimate: pallasgen's kernels
(`jax.vjp` of specs/attention.pallas `attention`, which runs the FlashAttention-2
backward kernels derived from its spec; `pallasgen_handwritten`: `attention`, then the
hand-written `attention_dq` and `attention_dkdv`) against XLA's forward and backward of
plain attention (`jax.vjp`) and against jax's own Pallas flash attention (its custom
VJP, default blocks), on a compile-only TPU. Run by hand on any machine (no TPU needed):

    python benchmarks/attention_backward_estimates.py --chip v5e

Cycles come from libtpu's static cost model: estimates, not times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from attention_estimates import bf16_arrays, generated_attention, parse_sizes, plain_attention

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator

SCALE = 0.125


def forward_and_backward(attention):
    """o and (dq, dk, dv) for the cotangent `do`, through `jax.vjp` of `attention`."""
    import jax

    def both(q, k, v, do):
        o, backward = jax.vjp(attention, q, k, v)
        return o, backward(do)

    return both


def handwritten_forward_and_backward(module):
    """o, lse from `attention`; delta and dq from `attention_dq`; dk, dv from `attention_dkdv`."""

    def both(q, k, v, do):
        o, lse = module.attention(q, k, v, scale=SCALE, interpret=False)
        dq, delta = module.attention_dq(q, k, v, o, do, lse, scale=SCALE, interpret=False)
        dk, dv = module.attention_dkdv(q, k, v, do, lse, delta, scale=SCALE, interpret=False)
        return o, (dq, dk, dv)

    return both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, default="v5e")
    parser.add_argument("--sizes", default="B=1,H=8,S=4096,T=4096,D=128")
    parser.add_argument("--which", default="pallasgen,xla,jax_flash_attention", help="the candidates to estimate")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    with tempfile.TemporaryDirectory() as profile_dir:
        estimator = Estimator(args.chip, Path(profile_dir))
        import functools

        import jax
        from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

        module = generated_attention()
        b, h, s, t, d = (sizes[n] for n in "BHSTD")
        shapes = [(b, h, s, d), (b, h, t, d), (b, h, t, d), (b, h, s, d)]
        arrays = bf16_arrays(estimator, shapes)
        candidates = {
            "pallasgen": forward_and_backward(
                lambda q, k, v: module.attention(q, k, v, scale=SCALE, interpret=False)[0]
            ),
            "pallasgen_handwritten": handwritten_forward_and_backward(module),
            "xla": forward_and_backward(functools.partial(plain_attention, scale=SCALE, causal=True)),
            "jax_flash_attention": forward_and_backward(
                functools.partial(flash_attention, causal=True, sm_scale=SCALE)
            ),
        }
        cycles = {}
        for name in args.which.split(","):
            ops, _ = estimator.op_cycles(candidates[name], arrays)
            cycles[name] = sum(ops.values())
            print(json.dumps({"chip": args.chip, "which": name, "cycles": cycles[name], **sizes}))
    # The products pallasgen's kernels run, of 2*S*T*D flops each, half of them under the
    # causal mask: the forward's 2 (q k^T, p v), dq's 3 (q k^T, do v^T, ds k) and dkdv's
    # 4 (k q^T, v do^T, p^T do, ds^T q). Each backward kernel recomputes the scores.
    flops = 9 * 2 * b * h * s * t * d // 2
    chip = backend_named("tpu").chip(args.chip)
    floor = flops / chip.bf16_flops * chip.clock_hz
    if any(name not in cycles for name in ("pallasgen", "xla", "jax_flash_attention")):
        return
    ours = cycles["pallasgen"]
    print(f"\n| {args.chip} | pallasgen | XLA | jax flash_attention | pallasgen/XLA | pallasgen/flash | MXU floor |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| causal, forward + backward | {ours:,} | {cycles['xla']:,} | {cycles['jax_flash_attention']:,}"
        f" | {ours / cycles['xla']:.2f}x | {ours / cycles['jax_flash_attention']:.2f}x | {floor:,.0f} |"
    )


if __name__ == "__main__":
    main()
