"""The scoped VMEM a kernel needs on a compile-only TPU, beside what pallasgen counts.

Run by hand on any machine (no TPU needed); prints one line per kernel:

    python benchmarks/tpu_vmem_needed.py --chip v5e matmul M=4096,N=4096,K=4096 M=512,N=1024,K=1024
    python benchmarks/tpu_vmem_needed.py matmul_relu_backward_x M=4096,N=4096,K=4096 M=512,K=1024,N=1024

SPEC:KERNEL or a kernel of specs/matmul.pallas (its backward kernels too), its sizes and
its blocks. The kernel is compiled with `vmem_limit_bytes` fixed by bisection (libtpu
fails a compile whose scoped allocation passes the limit, CompileTimeScopedVmemOom)
until the need is known within a quarter of a MiB. About ten compiles per kernel.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from pallasgen.backends import backend_named
from pallasgen.devices.compile_only import CompileError, compile_for_tpu, set_libtpu_environment
from pallasgen.devices.runner import load_module
from pallasgen.gradients.derive import every_kernel
from pallasgen.workspace.pipeline import check_source

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def pairs(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


def compiles(module, function, args, blocks, limit_mib: float, chip: str) -> bool:
    module.rt.vmem_limit = lambda needed: int(limit_mib * MIB)
    try:
        compile_for_tpu(functools.partial(function, **blocks, interpret=False), args, chip)
    except CompileError as error:
        if "ScopedVmemOom" not in error.details:
            raise
        return False
    return True


def needed_mib(module, function, args, blocks, chip: str, resolution: float = 0.25) -> tuple[float, float] | None:
    """The interval (above, at most] of MiB the kernel needs; None if 100 MiB do not do."""
    low, high = 0.0, 100.0
    if not compiles(module, function, args, blocks, high, chip):
        return None
    while high - low > resolution:
        middle = (low + high) / 2
        low, high = (low, middle) if compiles(module, function, args, blocks, middle, chip) else (middle, high)
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, default="v5e")
    parser.add_argument("kernel", help="SPEC:KERNEL, or a kernel of specs/matmul.pallas")
    parser.add_argument("sizes", help="DIM=N,...")
    parser.add_argument("blocks", help="DIM=N,...: each blocked dimension's block")
    args = parser.parse_args()
    spec, _, name = args.kernel.rpartition(":")
    spec = spec or "matmul"
    set_libtpu_environment()
    import jax

    source = (ROOT / "specs" / f"{spec}.pallas").read_text(encoding="utf-8")
    checked = next(c for c in every_kernel(check_source(source, f"{spec}.pallas")) if c.kernel.name == name)
    path = ROOT / "generated" / f"{spec}.py"
    module = load_module(path.read_text(encoding="utf-8"), path)
    function = getattr(module, name)
    sizes, blocks = pairs(args.sizes), pairs(args.blocks)
    arrays = [
        jax.ShapeDtypeStruct(tuple(sizes[d] for d in dims), dtype) for dtype, dims, *_ in function._inputs.values()
    ]
    keywords = {f"block_{d.lower()}": b for d, b in blocks.items()}
    counted = backend_named("tpu").memory_bytes(checked, {**checked.blocks, **blocks}) / MIB
    found = needed_mib(module, function, arrays, keywords, args.chip)
    need = "more than 100 MiB" if found is None else f"({found[0]:.2f}, {found[1]:.2f}] MiB"
    print(f"{args.chip} {name} {args.sizes} blocks {args.blocks}: needs {need}; pallasgen counts {counted:.2f} MiB")


if __name__ == "__main__":
    main()
