"""The NVIDIA GPU speed table: bundled kernels on both GPU paths against XLA (and cuDNN
for attention) at the sizes that issue 33 set, every row's times measured in one run.

    python benchmarks/gpu_speed.py [--out FOLDER] [--repeats N] [--tiny]

Each row times XLA (the kernel's jitted reference), the Triton kernel, the Mosaic GPU
kernel and, for attention, cuDNN's (`jax.nn.dot_product_attention`, where it computes
the kernel's output), calls taking turns after a warm-up of each (each turn as many calls
as fill 20 ms, then one wait), and prints medians;
a ratio is XLA's time over the path's (above 1: faster than XLA). It first measures the
card's copy bandwidth (a large `x + 1`, bytes read plus written), against which the
memory-bound rows are given as a percentage. FLOP counts: a product 2MNK; attention
4 B H S T D, half of it under a causal mask (FlashAttention's convention), forward plus
backward 3.5 times the forward. Writes FOLDER/speed.md (the table for
benchmarks/RESULTS.md) and FOLDER/speed.json. `--tiny` divides every size by 64 (at
least 1; for a dry run on CPU, where every kernel is interpreted).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kernel_cases import generated_module  # noqa: E402
from pallasgen.devices import bench, cudnn, runner  # noqa: E402
from pallasgen.workspace.pipeline import check_source  # noqa: E402

SQUARE = {4096: dict(M=4096, N=4096, K=4096), 8192: dict(M=8192, N=8192, K=8192)}
ATTENTION = dict(B=2, H=16, S=4096, T=4096, D=128)


def product_flops(s):
    return 2 * s.get("B", 1) * s["M"] * s["N"] * s["K"]


def attention_flops(causal):
    def flops(s):
        return 4 * s["B"] * s["H"] * s["S"] * s["T"] * s["D"] // (2 if causal else 1)

    return flops


# (label, spec, kernel, sizes, forward plus backward, FLOPs of the sizes or None: memory-bound)
ROWS = [
    ("matmul_bias_gelu bf16 4096^3", "matmul", "matmul_bias_gelu", SQUARE[4096], False, product_flops),
    ("matmul_bias_gelu bf16 8192^3", "matmul", "matmul_bias_gelu", SQUARE[8192], False, product_flops),
    ("linear bf16 4096^3", "matmul", "linear", SQUARE[4096], False, product_flops),
    ("linear bf16 8192^3", "matmul", "linear", SQUARE[8192], False, product_flops),
    (
        "batched_matmul bf16 8 x 2048^3",
        "matmul",
        "batched_matmul",
        dict(B=8, M=2048, N=2048, K=2048),
        False,
        product_flops,
    ),
    ("matmul f32 4096^3 (TF32)", "matmul", "matmul", SQUARE[4096], False, product_flops),
    ("matmul_int8 4096^3", "matmul", "matmul_int8", SQUARE[4096], False, product_flops),
    ("attention causal B=2 H=16 S=T=4096 D=128", "attention", "attention", ATTENTION, False, attention_flops(True)),
    ("attention_full, same", "attention", "attention_full", ATTENTION, False, attention_flops(False)),
    (
        "attention causal, forward + backward",
        "attention",
        "attention",
        ATTENTION,
        True,
        lambda s: attention_flops(True)(s) * 7 // 2,
    ),
    (
        "attention_full, forward + backward",
        "attention",
        "attention_full",
        ATTENTION,
        True,
        lambda s: attention_flops(False)(s) * 7 // 2,
    ),
    ("softmax f32 4096 x 32768", "softmax", "softmax", dict(M=4096, N=32768), False, None),
    ("layer_norm bf16 16384 x 8192", "norms", "layer_norm", dict(M=16384, N=8192), False, None),
    ("rms_norm bf16 16384 x 8192", "norms", "rms_norm", dict(M=16384, N=8192), False, None),
    ("cross_entropy bf16 4096 x 131072", "losses", "cross_entropy", dict(M=4096, V=131072), False, None),
    (
        "matmul_bias_gelu forward + backward 4096^3",
        "matmul",
        "matmul_bias_gelu",
        SQUARE[4096],
        True,
        lambda s: 3 * product_flops(s),
    ),
    ("softmax forward + backward", "softmax", "softmax", dict(M=4096, N=32768), True, None),
    ("layer_norm forward + backward", "norms", "layer_norm", dict(M=16384, N=8192), True, None),
    ("rms_norm forward + backward", "norms", "rms_norm", dict(M=16384, N=8192), True, None),
    ("cross_entropy forward + backward", "losses", "cross_entropy", dict(M=4096, V=131072), True, None),
]
PATHS = ("triton", "mosaic_gpu")
ROUND_SECONDS = 0.02  # each timed turn: calls enough to fill this, then one wait


@functools.cache
def checked_kernels(spec: str) -> dict:
    source = (ROOT / "specs" / f"{spec}.pallas").read_text()
    return {c.kernel.name: c for c in check_source(source, f"specs/{spec}.pallas")}


def copy_bandwidth(elements: int, repeats: int) -> float:
    """Bytes per second of a large `x + 1` (read once, written once)."""
    x = jnp.ones((elements,), jnp.float32)
    add_one = jax.jit(lambda x: x + 1)
    (seconds,) = bench.time_alternating([lambda: add_one(x)], repeats, ROUND_SECONDS)
    return 2 * 4 * elements / seconds


def time_row(row, repeats: int, tiny: bool, on_gpu: bool) -> dict:
    label, spec, name, sizes, grad, flops = row
    if tiny:
        sizes = {d: max(1, n // 64) for d, n in sizes.items()}
    checked = checked_kernels(spec)[name]
    module = generated_module(spec)
    function = getattr(module, name)
    inputs = runner.random_inputs(checked, sizes, 0)
    cotangents = runner.random_cotangents(checked, sizes, 0) if grad else None
    xla = jax.jit(function.reference)
    if grad:
        xla = jax.jit(bench.with_backward(function.reference, checked))
    timed = {"XLA": (lambda: xla(inputs, cotangents)) if grad else (lambda: xla(*inputs))}
    errors = {}
    for path in PATHS:
        kernel = functools.partial(function, gpu_backend=path)
        if grad:
            kernel = jax.jit(bench.with_backward(kernel, checked))
            call = functools.partial(kernel, inputs, cotangents)
        else:
            call = functools.partial(kernel, *inputs)
        try:
            jax.block_until_ready(call())  # compiles; a path that fails is reported, not timed
            timed[path] = call
        except Exception as error:  # noqa: BLE001 - every failure is a cell of the table
            errors[path] = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    baseline = cudnn.checked_baseline(checked, inputs, function) if on_gpu else None
    if isinstance(baseline, str):
        errors["cuDNN"] = baseline
    elif baseline is not None:
        if grad:
            cudnn_pass, cotangent = cudnn.with_backward(baseline)
            timed["cuDNN"] = lambda: cudnn_pass(baseline.arrays, cotangent)
        else:
            timed["cuDNN"] = lambda: baseline.function(*baseline.arrays)
    medians = dict(zip(timed, bench.time_alternating(list(timed.values()), repeats, ROUND_SECONDS)))
    _, moved = bench.work(checked, sizes)
    return {
        "row": label,
        "kernel": name,
        "sizes": sizes,
        "forward_and_backward": grad,
        "seconds": medians,
        "errors": errors,
        "flops": flops(sizes) if flops else None,
        "bytes": None if (flops or grad) else moved,
    }


def cell(record: dict, path: str, bandwidth: float) -> str:
    if path in record["errors"]:
        return "error" if path in PATHS else "n/a"
    seconds = record["seconds"].get(path)
    if seconds is None:
        return ""
    ratio = record["seconds"]["XLA"] / seconds
    if record["flops"]:
        return f"{record['flops'] / seconds / 1e12:.0f} TFLOP/s ({ratio:.2f}x)"
    if record["bytes"]:
        rate = record["bytes"] / seconds
        return f"{rate / 1e12:.2f} TB/s, {100 * rate / bandwidth:.0f}% ({ratio:.2f}x)"
    return f"{seconds * 1e3:.3f} ms ({ratio:.2f}x)"


def cudnn_cell(record: dict) -> str:
    """cuDNN's throughput, and each path's speed as a fraction of it."""
    seconds = record["seconds"].get("cuDNN")
    if seconds is None:
        return "n/a" if "cuDNN" in record["errors"] else ""
    paths = [
        f"{name} {seconds / record['seconds'][p]:.2f}x"
        for p, name in zip(PATHS, ("Triton", "MGPU"))
        if p in record["seconds"]
    ]
    return f"{record['flops'] / seconds / 1e12:.0f} TFLOP/s; " + ", ".join(paths) + " of it"


def table(records: list[dict], device: str, bandwidth: float) -> str:
    lines = [
        f"{device}, jax {jax.__version__}; copy bandwidth {bandwidth / 1e12:.2f} TB/s (x + 1, read plus written).",
        "Cells: throughput (XLA's time over the path's: above 1 is faster than XLA); % of the copy bandwidth;",
        "cuDNN: its throughput, and each path's time as a fraction of cuDNN's speed (above 1: faster).",
        "",
        "| kernel | XLA | Triton | Mosaic GPU | cuDNN |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        xla = r["seconds"]["XLA"]
        if r["flops"]:
            base = f"{r['flops'] / xla / 1e12:.0f} TFLOP/s"
        elif r["bytes"]:
            base = f"{r['bytes'] / xla / 1e12:.2f} TB/s, {100 * r['bytes'] / xla / bandwidth:.0f}%"
        else:
            base = f"{xla * 1e3:.3f} ms"
        cells = [cell(r, p, bandwidth) for p in PATHS] + [cudnn_cell(r)]
        lines.append(f"| {r['row']} | {base} | " + " | ".join(cells) + " |")
    notes = [f"- {r['row']}, {p}: {e}" for r in records for p, e in r["errors"].items()]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0].device_kind
    on_gpu = jax.default_backend() == "gpu"
    bandwidth = copy_bandwidth(2**30 if on_gpu else 2**20, args.repeats)
    print(f"{device}: copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    records = []
    for row in ROWS:
        start = time.perf_counter()
        try:
            records.append(time_row(row, args.repeats, args.tiny, on_gpu))
        except Exception:  # noqa: BLE001 - a row that cannot run at all is printed and skipped
            print(f"{row[0]}: FAILED\n{traceback.format_exc()}", flush=True)
            continue
        r = records[-1]
        cells = ", ".join(f"{p} {cell(r, p, bandwidth)}" for p in (*PATHS, "cuDNN") if cell(r, p, bandwidth))
        print(
            f"{row[0]}: XLA {r['seconds']['XLA'] * 1e3:.3f} ms; {cells} [{time.perf_counter() - start:.0f} s]",
            flush=True,
        )
        (args.out / "speed.json").write_text(
            json.dumps(
                {"device": device, "jax": jax.__version__, "copy_bytes_per_second": bandwidth, "rows": records},
                indent=1,
            )
        )
        (args.out / "speed.md").write_text(table(records, device, bandwidth))
    print(table(records, device, bandwidth))
    return 0 if len(records) == len(ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
