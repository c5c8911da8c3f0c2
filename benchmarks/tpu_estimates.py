"""Compiler cycle estimates of the bundled kernels against XLA, for a compile-only TPU.

Run by hand on any machine (no TPU needed); prints one JSON object per compile:

    python benchmarks/tpu_estimates.py --chip v5e defaults
    python benchmarks/tpu_estimates.py --chip v6e try matmul_bias_gelu M=4096,N=4096,K=4096 \
        block_m=1024,block_n=1024,block_k=1024 --vmem-mib 64

Cycles come from libtpu's static cost model: estimates, not times (see pallasgen/devices/estimate.py).
With the profile flag a compile of a 4096^3 matmul takes about a minute on a 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator, percent_of_peak
from pallasgen.workspace.pipeline import check_source
from pallasgen.devices.runner import load_module

ROOT = Path(__file__).resolve().parents[1]
SPEC_OF = {
    "matmul": "matmul", "matmul_relu": "matmul", "matmul_bias_gelu": "matmul", "matmul_int8": "matmul",
    "batched_matmul": "matmul", "scores": "matmul", "linear": "matmul", "leaky": "activations",
    "bias_gelu": "activations", "quantize_rows": "activations", "giou": "giou", "add_vectors": "add_vectors",
}
# The sizes of issue 11, cheapest compiles first.
ISSUE_SIZES = [
    ("add_vectors", "N=16777216"),
    ("giou", "B=1024,N=4096"),
    ("bias_gelu", "M=8192,N=8192"),
    ("leaky", "M=8192,N=8192"),
    ("quantize_rows", "M=8192,N=8192"),
    ("scores", "B=8,S=2048,T=2048,D=128"),
    ("linear", "M=4096,N=4096,K=4096"),
    ("matmul_bias_gelu", "M=4096,N=4096,K=4096"),
    ("batched_matmul", "B=8,M=2048,N=2048,K=2048"),
    ("matmul_int8", "M=4096,N=4096,K=4096"),
    ("matmul", "M=4096,N=4096,K=4096"),
    ("matmul_relu", "M=4096,N=4096,K=4096"),
    ("matmul_bias_gelu", "M=8192,N=8192,K=8192"),
]


def pairs(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


def measure(estimator: Estimator, name: str, sizes: dict[str, int], options: dict, vmem_mib: int | None) -> dict:
    spec = SPEC_OF[name]
    checked = next(c for c in check_source((ROOT / "specs" / f"{spec}.pallas").read_text(), spec) if c.kernel.name == name)
    path = ROOT / "generated" / f"{spec}.py"
    module = load_module(path.read_text(encoding="utf-8"), path)
    blocks = {**checked.blocks, **{k.removeprefix("block_").upper(): v for k, v in options.items()}}
    blocks = {d: min(b, sizes[d]) for d, b in blocks.items()}
    limit = vmem_mib * 2**20 if vmem_mib else None
    estimate = estimator.estimate(module, checked, sizes, options, limit)
    percent, peak = percent_of_peak(estimate)
    return {
        "chip": estimator.chip, "kernel": name, "sizes": sizes, "blocks": blocks, "vmem_limit_mib": vmem_mib,
        "vmem_mib": round(backend_named("tpu").memory_bytes(checked, blocks) / 2**20, 2),
        "kernel_cycles": estimate.kernel_cycles, "mosaic_cycles": estimate.mosaic_cycles,
        "xla_cycles": estimate.xla_cycles, "ratio": estimate.ratio and round(estimate.ratio, 3), "percent": round(percent, 1), "peak": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, required=True)
    parser.add_argument("--vmem-mib", type=int, help="vmem_limit_bytes for the kernel, in MiB")
    parser.add_argument("what", nargs="+", help="`defaults`, or `try KERNEL SIZES [BLOCKS ...]`")
    args = parser.parse_args()
    estimator = Estimator(args.chip, Path(tempfile.mkdtemp(prefix="llo_profile_")))
    if args.what == ["defaults"]:
        jobs = [(name, sizes, "") for name, sizes in ISSUE_SIZES]
    else:
        _, name, sizes, *blocks = args.what
        jobs = [(name, sizes, b) for b in blocks or [""]]
    for name, sizes, blocks in jobs:
        try:
            record = measure(estimator, name, pairs(sizes), pairs(blocks), args.vmem_mib)
        except Exception as error:  # a rejected block shape or VMEM overflow is a result too
            record = {"chip": args.chip, "kernel": name, "sizes": pairs(sizes), "options": pairs(blocks), "error": str(error)[:300]}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
