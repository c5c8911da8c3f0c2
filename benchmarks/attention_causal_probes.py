"""Where causal attention's cycles go: hand-written variants of the generated causal kernel
(`generated/attention.py`'s `attention`: blocks of 1024 queries by 1024 keys, a running
max, sum and p @ v in VMEM scratch), each estimated by libtpu's compile-only cost model
beside the generated `attention` and `attention_full`. Run by hand on any machine (no TPU
needed); prints one JSON object per variant and a table:

    python benchmarks/attention_causal_probes.py --chip v5e
    python benchmarks/attention_causal_probes.py --chip v6e blocks steps_split

The variants differ in their grid and in what a step computes:

- grid `blocks`: (B, H, blocks of S, blocks of T), as generated; a block no query sees
  is skipped under `pl.when` and its k, v index maps stay on block 0.
- grid `steps`: (B, H, steps), one step per (block of S, block of T) that some query
  sees, in row order; a step's blocks come from its program id by arithmetic on Python
  constants built at trace time (no tables), so the cost model sees every index.
- grid `tables`: the same steps from scalar-prefetched tables
  (`pltpu.PrefetchScalarGridSpec`, as jax's splash attention does). The cost model
  cannot know a table's contents: it estimates these as if every step read block 0 and
  took no branch on a table value, so their cycles are not comparable (shown to say so).
- body `masked`: every computed block masked; `split`: blocks every query sees
  unmasked, diagonal ones masked; `stripsN`: as `split`, a diagonal block computed as N
  strips of queries, each with only the keys it can see (strip n: the first n + 1 Nths).

Cycles come from libtpu's static cost model: estimates, not times.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path

from attention_estimates import bf16_arrays, generated_attention, parse_sizes

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator

BLOCK = 1024
VARIANTS = {
    "blocks": ("blocks", "masked", "skip"),  # the generated kernel's shape
    "blocks_every_block": ("blocks", "masked", "every"),  # no block skipped (wrong results past the diagonal)
    "blocks_no_block": ("blocks", "none", "skip"),  # nothing computed: the grid's own cycles
    "blocks_split": ("blocks", "split", "skip"),
    "blocks_strips2": ("blocks", "strips2", "skip"),
    "blocks_strips4": ("blocks", "strips4", "skip"),
    "blocks_strips8": ("blocks", "strips8", "skip"),
    "blocks_2048_strips4": ("blocks", "strips4", "skip", 2048),  # whole blocks in strips of 512 queries
    "blocks_2048_strips8": ("blocks", "strips8", "skip", 2048),
    "blocks_4096_strips8": ("blocks", "strips8", "skip", 4096),
    "blocks_4096_strips16": ("blocks", "strips16", "skip", 4096),
    "blocks_4096_every_block": ("blocks", "split", "every", 4096),  # full attention, strips of 512 queries
    "blocks_2048_every_block": ("blocks", "split", "every", 2048),  # full attention, strips of 512 queries
    "steps": ("steps", "masked", "seen"),
    "steps_split": ("steps", "split", "seen"),
    "steps_strips2": ("steps", "strips2", "seen"),
    "steps_strips4": ("steps", "strips4", "seen"),
    "steps_no_block": ("steps", "none", "seen"),
    "steps_all_blocks": ("steps", "split", "every"),  # full attention through the steps grid
    "tables": ("tables", "masked", "seen"),
    "tables_split": ("tables", "split", "seen"),
}


def causal_attention(grid, body, blocks_taken, block=BLOCK, interpret=False):
    """Causal attention with lse (scale 0.125) as `grid`, `body` and `blocks_taken` say,
    in blocks of `block` queries by `block` keys (`interpret`: on CPU, to check it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def update(q, k, v, s_start, t_start, masked, refs, rows=slice(None)):
        max_ref, acc_ref, sum_ref = refs
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * 0.125
        if masked:
            queries = s_start + jax.lax.broadcasted_iota(jnp.int32, (s.shape[0], 1), 0)
            keys = t_start + jax.lax.broadcasted_iota(jnp.int32, (1, s.shape[1]), 1)
            s = jnp.where(queries >= keys, s, -jnp.inf)
        previous = max_ref[rows, :]
        new = jnp.maximum(previous, jnp.max(s, axis=1, keepdims=True))
        shift = jnp.where(new > -jnp.inf, new, 0.0)
        rescale = jnp.exp(previous - shift)
        max_ref[rows, :] = new
        p = jnp.exp(s - shift)
        acc_ref[rows, :] = rescale * acc_ref[rows, :] + jnp.dot(p, v.astype(jnp.float32))
        sum_ref[rows, :] = rescale * sum_ref[rows, :] + jnp.sum(p, axis=1, keepdims=True)

    def gated(condition, function):  # under pl.when unless the condition is True
        if condition is True:
            function()
        else:
            pl.when(condition)(function)

    def compute(q_ref, k_ref, v_ref, refs, s_start, t_start, seen, whole):
        """One block: nothing where no query sees it, else as `body` says."""
        if body == "none":
            return
        if body == "masked":
            gated(seen, lambda: update(q_ref[...], k_ref[...], v_ref[...], s_start, t_start, True, refs))
            return

        def whole_block():
            height = min(
                block, BLOCK // 2 if block > BLOCK else BLOCK
            )  # a block taller than BLOCK: strips of 512 queries
            for strip in range(block // height):
                rows = pl.ds(strip * height, height)
                update(q_ref[rows, :], k_ref[...], v_ref[...], s_start + strip * height, t_start, False, refs, rows)

        gated(whole, whole_block)

        @pl.when(jnp.logical_not(whole) if seen is True else seen & jnp.logical_not(whole))
        def _diagonal():
            if body == "split":
                update(q_ref[...], k_ref[...], v_ref[...], s_start, t_start, True, refs)
                return
            strips = int(body.removeprefix("strips"))
            height = block // strips  # a diagonal block starts at the same query and key
            for strip in range(strips):
                rows, keys = pl.ds(strip * height, height), pl.ds(0, (strip + 1) * height)
                update(
                    q_ref[rows, :], k_ref[keys, :], v_ref[keys, :], s_start + strip * height, t_start, True, refs, rows
                )

    def init_and_finish(first, last, refs, o_ref, lse_ref, step_body):
        max_ref, acc_ref, sum_ref = refs

        @pl.when(first)
        def _init():
            max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
            sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)

        step_body()

        @pl.when(last)
        def _finish():
            o_ref[...] = (acc_ref[...] / sum_ref[...]).astype(o_ref.dtype)
            lse_ref[...] = jnp.where(max_ref[...] > -jnp.inf, max_ref[...], 0.0) + jnp.log(sum_ref[...])

    def seen_at(i, j):  # some query of block i sees some key of block j
        return i * block + block - 1 >= j * block if blocks_taken != "every" else i >= 0

    def whole_at(i, j):  # every query of block i sees every key of block j
        return i * block >= j * block + block - 1 if blocks_taken != "every" else i >= 0

    def call(q, k, v):
        b, h, s_, d = q.shape
        rows, cols = pl.cdiv(s_, block), pl.cdiv(k.shape[2], block)
        scratch = [pltpu.VMEM((block, 1), jnp.float32), pltpu.VMEM((block, d), jnp.float32)]
        scratch.append(pltpu.VMEM((block, 1), jnp.float32))
        outputs = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, s_, 1), jnp.float32))
        options = dict(out_shape=outputs, interpret=interpret, name="attention")
        params = dict(vmem_limit_bytes=(100 if block <= BLOCK else 48) * 2**20)  # 100 MiB left XLA too little at 2048
        if grid == "blocks":

            def kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *refs):
                i, j = pl.program_id(2), pl.program_id(3)
                seen = seen_at(i, j) if blocks_taken == "skip" else True
                body_ = functools.partial(
                    compute, q_ref, k_ref, v_ref, refs, i * block, j * block, seen, whole_at(i, j)
                )
                init_and_finish(j == 0, j == cols - 1, refs, o_ref, lse_ref, body_)

            def live(i, j):
                return jnp.where(seen_at(i, j), j, 0) if blocks_taken == "skip" else j

            return pl.pallas_call(
                kernel,
                grid=(b, h, rows, cols),
                in_specs=[
                    pl.BlockSpec((None, None, block, d), lambda b, h, i, j: (b, h, i, 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, i, j: (b, h, live(i, j), 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, i, j: (b, h, live(i, j), 0)),
                ],
                out_specs=(
                    pl.BlockSpec((None, None, block, d), lambda b, h, i, j: (b, h, i, 0)),
                    pl.BlockSpec((None, None, block, 1), lambda b, h, i, j: (b, h, i, 0)),
                ),
                scratch_shapes=scratch,
                **options,
                compiler_params=pltpu.CompilerParams(
                    dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"), **params
                ),
            )(q, k, v)

        # One step per seen (row, col) pair, in row order.
        pairs = [(i, j) for i in range(rows) for j in range(cols) if seen_at(i, j)]
        row_of, col_of = [i for i, _ in pairs], [j for _, j in pairs]
        firsts = [n for n, (i, _) in enumerate(pairs) if n == 0 or pairs[n - 1][0] != i]
        lasts = [n for n, (i, _) in enumerate(pairs) if n == len(pairs) - 1 or pairs[n + 1][0] != i]
        diagonal = [n for n, (i, j) in enumerate(pairs) if not whole_at(i, j)]

        def piecewise(step, values):  # values[step], by arithmetic on constants
            value = values[0] + 0 * step
            for n in range(1, len(values)):
                if values[n] != values[n - 1]:
                    value = value + jnp.where(step >= n, values[n] - values[n - 1], 0)
            return value

        def one_of(step, points):
            hit = step < 0
            for point in points:
                hit = hit | (step == point)
            return hit

        if grid == "steps":
            row_at = lambda step: piecewise(step, row_of)
            col_at = lambda step: piecewise(step, col_of)

            def kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *refs):
                step = pl.program_id(2)
                body_ = functools.partial(
                    compute,
                    q_ref,
                    k_ref,
                    v_ref,
                    refs,
                    row_at(step) * block,
                    col_at(step) * block,
                    True,
                    jnp.logical_not(one_of(step, diagonal)),
                )
                init_and_finish(one_of(step, firsts), one_of(step, lasts), refs, o_ref, lse_ref, body_)

            return pl.pallas_call(
                kernel,
                grid=(b, h, len(pairs)),
                in_specs=[
                    pl.BlockSpec((None, None, block, d), lambda b, h, n: (b, h, row_at(n), 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, n: (b, h, col_at(n), 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, n: (b, h, col_at(n), 0)),
                ],
                out_specs=(
                    pl.BlockSpec((None, None, block, d), lambda b, h, n: (b, h, row_at(n), 0)),
                    pl.BlockSpec((None, None, block, 1), lambda b, h, n: (b, h, row_at(n), 0)),
                ),
                scratch_shapes=scratch,
                **options,
                compiler_params=pltpu.CompilerParams(
                    dimension_semantics=("parallel", "parallel", "arbitrary"), **params
                ),
            )(q, k, v)

        # grid == "tables": the same steps, read from scalar-prefetched tables.
        first = np.zeros(len(pairs), np.int32)
        first[firsts] = 1
        last = np.zeros(len(pairs), np.int32)
        last[lasts] = 1
        whole = np.ones(len(pairs), np.int32)
        whole[diagonal] = 0
        tables = [jnp.asarray(np.asarray(t, np.int32)) for t in (row_of, col_of, first, last, whole)]

        def kernel(row_ref, col_ref, first_ref, last_ref, whole_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *refs):
            n = pl.program_id(2)
            body_ = functools.partial(
                compute, q_ref, k_ref, v_ref, refs, row_ref[n] * block, col_ref[n] * block, True, whole_ref[n] == 1
            )
            init_and_finish(first_ref[n] == 1, last_ref[n] == 1, refs, o_ref, lse_ref, body_)

        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=len(tables),
                grid=(b, h, len(pairs)),
                in_specs=[
                    pl.BlockSpec((None, None, block, d), lambda b, h, n, rows, cols, *_: (b, h, rows[n], 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, n, rows, cols, *_: (b, h, cols[n], 0)),
                    pl.BlockSpec((None, None, block, d), lambda b, h, n, rows, cols, *_: (b, h, cols[n], 0)),
                ],
                out_specs=(
                    pl.BlockSpec((None, None, block, d), lambda b, h, n, rows, cols, *_: (b, h, rows[n], 0)),
                    pl.BlockSpec((None, None, block, 1), lambda b, h, n, rows, cols, *_: (b, h, rows[n], 0)),
                ),
                scratch_shapes=scratch,
            ),
            **options,
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"), **params),
        )(*tables, q, k, v)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, default="v5e")
    parser.add_argument("--sizes", default="B=1,H=8,S=4096,T=4096,D=128")
    parser.add_argument("variants", nargs="*", help=f"default: all of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    unknown = [name for name in args.variants if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    sizes = parse_sizes(args.sizes)
    with tempfile.TemporaryDirectory() as profile_dir:
        estimator = Estimator(args.chip, Path(profile_dir))
        import jax
        import jax.numpy as jnp

        module = generated_attention()
        b, h, s, t, d = (sizes[n] for n in "BHSTD")
        shapes = [(b, h, s, d), (b, h, t, d), (b, h, t, d)]
        arrays = bf16_arrays(estimator, shapes)
        candidates = {
            "generated attention_full": functools.partial(module.attention_full, interpret=False),
            "generated attention": functools.partial(module.attention, interpret=False),
        }
        for name in args.variants or VARIANTS:
            candidates[name] = causal_attention(*VARIANTS[name])
        cycles = {}
        for name, function in candidates.items():
            ops, _ = estimator.op_cycles(function, arrays)
            cycles[name] = sum(ops.values())
            print(json.dumps({"chip": args.chip, "which": name, "cycles": cycles[name], **sizes}), flush=True)
    full = cycles["generated attention_full"]
    print(f"\n| {args.chip} | cycles | over generated attention_full |")
    print("|---|---|---|")
    for name, value in cycles.items():
        print(f"| {name} | {value:,} | {value / full:.3f} |")


if __name__ == "__main__":
    main()
