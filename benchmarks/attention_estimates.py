"""Attention by compiler estimate: pallasgen's kernels (specs/attention.pallas) against
XLA's compile of plain attention and against jax's own Pallas flash attention
(`jax.experimental.pallas.ops.tpu.flash_attention`, its default blocks), on a
compile-only TPU. Run by hand on any machine (no TPU needed); prints one JSON object
per measurement and a table:

    python benchmarks/attention_estimates.py --chip v5e
    python benchmarks/attention_estimates.py --chip v6e --sizes B=1,H=8,S=4096,T=4096,D=128

Cycles come from libtpu's static cost model: estimates, not times.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator
from pallasgen.devices.runner import load_module

ROOT = Path(__file__).resolve().parents[1]


def plain_attention(q, k, v, *, scale, causal):
    """softmax(q k^T * scale) v as XLA compiles it: the scores go through HBM."""
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("bhsd,bhtd->bhst", q, k, preferred_element_type=jnp.float32) * scale
    if causal:
        rows = jax.lax.broadcasted_iota(jnp.int32, s.shape, 2)
        cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 3)
        s = jnp.where(rows >= cols, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhst,bhtd->bhsd", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


def parse_sizes(text: str) -> dict[str, int]:
    """`B=1,H=8,...` as {"B": 1, "H": 8, ...}."""
    return {k: int(v) for k, v in (item.split("=") for item in text.split(","))}


def generated_attention():
    """The bundled module generated/attention.py."""
    path = ROOT / "generated" / "attention.py"
    return load_module(path.read_text(encoding="utf-8"), path)


def bf16_arrays(estimator, shapes):
    """Abstract bf16 arrays of these shapes on the estimator's compile-only chip."""
    import jax
    import jax.numpy as jnp

    return [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=estimator.sharding) for shape in shapes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, default="v5e")
    parser.add_argument("--sizes", default="B=1,H=8,S=4096,T=4096,D=128")
    parser.add_argument("--blocks", default="", help="block_s=...,block_t=... for pallasgen's kernels")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    blocks = {k: int(v) for k, v in (item.split("=") for item in args.blocks.split(",") if item)}
    with tempfile.TemporaryDirectory() as profile_dir:
        estimator = Estimator(args.chip, Path(profile_dir))
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

        module = generated_attention()
        b, h, s, t, d = (sizes[n] for n in "BHSTD")
        shapes = [(b, h, s, d), (b, h, t, d), (b, h, t, d)]
        arrays = bf16_arrays(estimator, shapes)
        scale = 0.125
        rows = []
        for causal in (True, False):
            kernel = module.attention if causal else module.attention_full
            candidates = {
                "pallasgen": functools.partial(kernel, interpret=False, scale=scale, **blocks),
                "xla": functools.partial(plain_attention, scale=scale, causal=causal),
                "jax_flash_attention": functools.partial(flash_attention, causal=causal, sm_scale=scale),
            }
            cycles = {}
            for name, function in candidates.items():
                ops, _ = estimator.op_cycles(function, arrays)
                cycles[name] = sum(ops.values())
                print(json.dumps({"chip": args.chip, "causal": causal, "which": name, "cycles": cycles[name], **sizes}))
            flops = 4 * b * h * s * t * d // (2 if causal else 1)
            chip = backend_named("tpu").chip(args.chip)
            floor = flops / chip.bf16_flops * chip.clock_hz
            rows.append((causal, cycles, floor))
    print(
        f"\n| {args.chip} | pallasgen | XLA | jax flash_attention | pallasgen/XLA | pallasgen/flash | MXU floor | % of MXU peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for causal, cycles, floor in rows:
        ours = cycles["pallasgen"]
        print(
            f"| {'causal' if causal else 'full'} | {ours:,} | {cycles['xla']:,} | {cycles['jax_flash_attention']:,}"
            f" | {ours / cycles['xla']:.2f}x | {ours / cycles['jax_flash_attention']:.2f}x | {floor:,.0f}"
            f" | {100 * floor / ours:.0f}% |"
        )
    causal_cycles, full_cycles = rows[0][1]["pallasgen"], rows[1][1]["pallasgen"]
    print(f"\ncausal / full (pallasgen): {causal_cycles / full_cycles:.2f}")


if __name__ == "__main__":
    main()
