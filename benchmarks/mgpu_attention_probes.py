"""Where Mosaic GPU attention's time goes on a Hopper GPU: hand-written variants of the
generated forward kernel (`generated/attention.py`'s `_attention_mosaic_gpu_kernel`:
warp-specialized, two computing warpgroups of 64 queries sharing blocks of 128 keys that
a third copies in, p rounded to bf16 for p @ v and read from registers, the product
accumulated in place, exp as `rt.mgpu_exp`), each one change on top of it, timed beside the generated kernel, jax's
own Hopper kernel (`ops/gpu/attention_mgpu.py`, FlashAttention-3's structure) and cuDNN,
at B=2 H=16 S=T=4096 D=128, causal and full. Each is first checked against float64
NumPy at S=T=1000 (jax's kernel at 1024: it takes whole blocks only). Run on a GPU
machine (benchmarks/gpu_check_all.sh runs it after the speed table); `--dry-run` lowers
every variant for CUDA without a GPU:

    python benchmarks/mgpu_attention_probes.py [--out FOLDER] [--dry-run] [VARIANT ...]

The changes (VARIANTS): `fold` log2(e) folded into the scale (exp2 of the scores
themselves, one multiply an element fewer), `sched` the two warpgroups' softmax and
products alternated by a barrier (as jax's kernel), `smem` p @ v's operand written to a
shared-memory tile and the product added to the accumulator (the kernel generated
before, and what Mosaic GPU's interpreter runs: it runs neither wgmma's register operand
nor the accumulator's in-place pipeline), `t64` blocks of 64 keys as well. (`stages=3`:
three blocks in flight; `split=True`: p @ v as two bf16 products of p's high and low
parts, as generated before the specs rounded p.)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pallasgen.devices import bench  # noqa: E402
from pallasgen.runtime import support as rt  # noqa: E402

LOG2E = math.log2(math.e)
SIZES = dict(B=2, H=16, S=4096, D=128)
CHECKED = dict(B=1, H=2, S=1000, D=128)


def make(causal=True, wgs=2, block_t=64, stages=2, exp2=False, split=True, regs=False, init_acc=False, sched=False):
    """The forward kernel with `wgs` computing warpgroups and the changes the keywords name."""
    block_s = 64

    def kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *scratch, h, size_s, t, scale):
        q_smem, lse_smem, barrier, *rest = scratch
        o_smem = q_smem  # q is read by the pass only: its tile holds o after it
        nops = 0 if regs else (2 if split else 1)
        ops, sb = rest[:nops], rest[nops:]
        op1, op2 = (list(ops) + [None, None])[:2]
        block_d = o_smem.shape[-1]
        wg = jax.lax.axis_index("wg")
        b_index, h_index, s_block = rt.mgpu_grid_indices(h, pl.cdiv(size_s, wgs * block_s))
        s_start = (s_block * wgs + wg) * block_s

        def schedule():
            if sched:
                plgpu.barrier_arrive(sb[0])
                plgpu.barrier_wait(sb[0])

        def step(indices, k_smem, v_smem, carry):
            t_start = indices[0] * block_t

            def compute():
                max_t, acc_t, sum_exp_t = carry

                def qk(acc_ref):
                    plgpu.wgmma(acc_ref, q_smem.at[wg], k_smem.T)
                    schedule()
                    return acc_ref[...]

                raw = pl.run_scoped(qk, plgpu.ACC((block_s, block_t), jnp.float32))
                sc = scale * LOG2E if exp2 is True else scale  # "unfolded": exp2(x * log2(e)) at each exp
                s = raw * sc
                if causal:
                    s = jnp.where(
                        rt.mgpu_spread(rt.mgpu_vector_positions(s_start, block_s, 0), (block_s, block_t), 0)
                        >= rt.mgpu_spread(rt.mgpu_vector_positions(t_start, block_t, 1), (block_s, block_t), 1),
                        s,
                        -jnp.inf,
                    )
                s = rt.mgpu_fill_past(s, t_start, t, 1, -jnp.inf, ragged=t % block_t)
                new = jnp.maximum(max_t, jnp.max(s, axis=1))
                shift = jnp.where(new > -jnp.inf, new, 0.0)
                ex = jnp.exp2 if exp2 is True else rt.mgpu_exp if exp2 else jnp.exp
                rescale = ex(max_t - shift)
                p = ex(s - rt.mgpu_spread(shift, s.shape, 0))
                acc_t = rt.mgpu_spread(rescale, acc_t.shape, 0) * acc_t
                high = p.astype(jnp.bfloat16)
                parts = [high, (p - high.astype(jnp.float32)).astype(jnp.bfloat16)] if split else [high]
                schedule()
                if not regs:
                    for part, ref in zip(parts, (op1, op2)):
                        ref.at[wg][...] = part
                    plgpu.commit_smem()
                    parts = [ref.at[wg] for ref in (op1, op2)[: len(parts)]]
                if init_acc:

                    def pv(acc_ref):
                        for part in parts:
                            plgpu.wgmma(acc_ref, part, v_smem)

                    acc_t = pl.run_state(pv)(plgpu.ACC.init(acc_t))
                else:

                    def pv2(acc_ref):
                        for part in parts:
                            plgpu.wgmma(acc_ref, part, v_smem)
                        return acc_ref[...]

                    acc_t = acc_t + pl.run_scoped(pv2, plgpu.ACC((block_s, block_d), jnp.float32))
                sum_exp_t = rescale * sum_exp_t + jnp.sum(p, axis=1)
                return new, acc_t, sum_exp_t

            if causal:
                # A skipped block still meets the barrier twice, or the warpgroups, which skip
                # different blocks, wait on each other forever (the first GPU run hung here).
                def skip():
                    schedule()
                    schedule()
                    return carry

                return jax.lax.cond(s_start + block_s - 1 >= t_start, compute, skip)
            return compute()

        def program(pipeline):
            rt.mgpu_copy_in(q_ref.at[b_index, h_index, pl.ds(s_start, block_s)], q_smem.at[wg], barrier.at[wg])
            if sched:
                pl.when(wg == 1)(schedule)
            max_t, acc_t, sum_exp_t = pipeline(
                (
                    rt.mgpu_full(block_s, -jnp.inf, jnp.float32, 0),
                    plgpu.layout_cast(jnp.full((block_s, block_d), 0, jnp.float32), plgpu.Layout.WGMMA),
                    rt.mgpu_full(block_s, 0.0, jnp.float32, 0),
                )
            )
            if sched:
                pl.when(wg == 0)(schedule)
            o_smem.at[wg][...] = (acc_t / rt.mgpu_spread(sum_exp_t, (block_s, block_d), 0)).astype(jnp.bfloat16)
            m = max_t / LOG2E if exp2 is True else max_t
            lse_smem.at[wg][...] = m + jnp.log(sum_exp_t)
            rt.mgpu_copy_out(
                (o_smem.at[wg], o_ref.at[b_index, h_index, pl.ds(s_start, block_s)]),
                (lse_smem.at[wg], lse_ref.at[b_index, h_index, pl.ds(s_start, block_s)]),
            )

        plgpu.emit_pipeline_warp_specialized(
            step,
            grid=(pl.cdiv(t, block_t),),
            in_specs=[rt.mgpu_spec((block_t, block_d), lambda i: (i, 0), jnp.bfloat16)] * 2,
            max_concurrent_steps=stages,
            num_compute_wgs=wgs,
            memory_registers=40,
            wg_axis="wg",
            compute_context=program,
        )(k_ref.at[b_index, h_index], v_ref.at[b_index, h_index])

    def attention(q, k, v, scale=0.125, interpret=False):
        b, h, size_s, d = q.shape
        t = k.shape[2]
        block_d = d + -d % 64
        ps, pt = size_s + -size_s % (wgs * block_s), t + -t % block_t
        q, k, v = (
            rt.mgpu_pad(q, (b, h, ps, block_d)),
            rt.mgpu_pad(k, (b, h, pt, block_d)),
            rt.mgpu_pad(v, (b, h, pt, block_d)),
        )
        nops = 0 if regs else (2 if split else 1)
        scratch = [
            rt.mgpu_smem((wgs, block_s, block_d), jnp.bfloat16),
            plgpu.SMEM((wgs, block_s), jnp.float32),
            plgpu.Barrier(num_barriers=wgs),
            *[rt.mgpu_smem((wgs, block_s, block_t), jnp.bfloat16)] * nops,
        ]
        if sched:
            scratch.append(plgpu.Barrier(num_arrivals=wgs))
        o, lse = plgpu.kernel(
            functools.partial(kernel, h=h, size_s=size_s, t=t, scale=scale),
            out_type=(
                jax.ShapeDtypeStruct((b, h, ps, block_d), jnp.bfloat16),
                jax.ShapeDtypeStruct((b, h, ps), jnp.float32),
            ),
            scratch_types=scratch,
            grid=(b * h * pl.cdiv(size_s, wgs * block_s),),
            grid_names=("programs",),
            num_threads=wgs + 1,
            thread_name="wg",
            interpret=interpret,
        )(q, k, v)
        return o[:, :, :size_s, :d], lse[:, :, :size_s]

    return attention


def reference(q, k, v, causal, scale=0.125):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bhsd,bhtd->bhst", q, k) * scale
    if causal:
        s = np.where(np.arange(s.shape[2])[:, None] >= np.arange(s.shape[3])[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhst,bhtd->bhsd", p, v) / p.sum(-1, keepdims=True)


VARIANTS = {
    "as_generated": dict(split=False, regs=True, init_acc=True, exp2="unfolded", block_t=128),
    "smem": dict(split=False, exp2="unfolded", block_t=128),
    "smem_t64": dict(split=False, exp2="unfolded"),
    "fold": dict(split=False, regs=True, init_acc=True, exp2=True, block_t=128),
    # Last: the barrier between the warpgroups hung on the first GPU run (fixed since).
    "fold_sched": dict(split=False, regs=True, init_acc=True, exp2=True, sched=True, block_t=128),
}


def qkv(sizes, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    shape = (sizes["B"], sizes["H"], sizes["S"], sizes["D"])
    return [jax.random.normal(key, shape, jnp.bfloat16) for key in keys]


def calls(causal: bool, names) -> dict:
    """Each contender's jitted call on q, k, v laid out [B, H, S, D]."""
    import generated.attention as generated
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    kernel = generated.attention if causal else generated.attention_full
    found = {"generated": jax.jit(lambda q, k, v: kernel(q, k, v, gpu_backend="mosaic_gpu"))}
    # [B, S, H, D] in and out, as cuDNN and jax's kernel take them
    bshd = lambda f: jax.jit(
        lambda q, k, v: jnp.swapaxes(f(*(jnp.swapaxes(x, 1, 2) for x in (q, k, v))), 1, 2)
    )  # noqa: E731
    found["cudnn"] = bshd(
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=0.125, is_causal=causal, implementation="cudnn")
    )
    for block_kv in (64, 128):
        config = attention_mgpu.TuningConfig(block_q=64, block_kv=block_kv, max_concurrent_steps=2, causal=causal)
        # f16 in and out: jax 0.11.2's kernel fails on bf16 ("src had type bfloat16 and dst had type float16");
        # it applies no scale, so q is scaled as it is converted (one pass either way)
        found[f"jax_fa3_kv{block_kv}"] = bshd(
            lambda q, k, v, c=config: attention_mgpu.attention(
                (q * 0.125).astype(jnp.float16), k.astype(jnp.float16), v.astype(jnp.float16), c
            ).astype(jnp.bfloat16)
        )
    for name in names:
        found[name] = jax.jit(make(causal=causal, **VARIANTS[name]))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="lower each variant for CUDA; time nothing")
    args = parser.parse_args()
    results = {}
    for causal in (True, False):
        mode = "causal" if causal else "full"
        if args.dry_run:
            q = jax.ShapeDtypeStruct((1, 2, 1000, 128), jnp.bfloat16)
            for name in args.variants:
                jax.export.export(jax.jit(make(causal=causal, **VARIANTS[name])), platforms=["cuda"])(q, q, q)
                print(f"{mode} {name}: lowers for CUDA", flush=True)
            continue
        contenders, errors, seconds = calls(causal, args.variants), {}, {}
        checked = {size: qkv(dict(CHECKED, S=size), seed=1) for size in (1000, 1024)}
        want = {size: reference(*arrays, causal) for size, arrays in checked.items()}
        big = qkv(SIZES)
        flops = 4 * SIZES["B"] * SIZES["H"] * SIZES["S"] ** 2 * SIZES["D"] // (2 if causal else 1)
        generated = functools.partial(contenders["generated"], *big)
        results[mode] = {"seconds": seconds, "errors": errors, "flops": flops}
        for name, call in contenders.items():
            # Each checked, then timed alternating with the generated kernel, and printed at
            # once: a contender that hangs the GPU is the last named, and those before it stand.
            print(f"{mode} {name}: checking", flush=True)
            try:
                size = 1024 if name.startswith("jax_fa3") else 1000  # jax's kernel: whole blocks only
                out = call(*checked[size])
                got = np.asarray(out[0] if isinstance(out, tuple) else out, np.float64)
                errors[name] = float(np.max(np.abs(got - want[size])))
                timed = functools.partial(call, *big)
                seconds[name] = bench.time_alternating([generated, timed], 10, 0.02)[1]
            except Exception as error:  # noqa: BLE001 - a contender that fails is reported
                errors[name] = "error: " + (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            speed = (
                f"{seconds[name] * 1e3:8.3f} ms {flops / seconds[name] / 1e12:6.0f} TFLOP/s" if name in seconds else ""
            )
            print(f"{mode:6} {name:36} {speed:28} max |error| at S=T={size}: {errors[name]}", flush=True)
            if args.out:  # after each: what a hang cuts short is kept
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "attention_probes.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
