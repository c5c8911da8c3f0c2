"""`pallasgen bench`: generated kernels timed against XLA (their jitted reference).

Only this module and `runner` import jax, and only when a command needs them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .checks import CheckedKernel
from .dtypes import DTYPES

# Peak dense bf16 TFLOP/s and HBM GB/s by device kind (vendor figures).
PEAKS = {
    "TPU v4": (275.0, 1228.0),
    "TPU v5 lite": (197.0, 819.0),
    "TPU v5e": (197.0, 819.0),
    "TPU v5p": (459.0, 2765.0),
    "TPU v6 lite": (918.0, 1640.0),
    "TPU v6e": (918.0, 1640.0),
    "NVIDIA H100": (989.0, 3350.0),
    "NVIDIA H200": (989.0, 4800.0),
}


@dataclass(frozen=True)
class Timing:
    kernel: str
    sizes: dict[str, int]
    kernel_seconds: float  # median
    xla_seconds: float  # median of the jitted reference
    flops: int
    bytes_moved: int

    @property
    def ratio(self) -> float:
        """Kernel throughput over XLA's: above 1 the kernel is faster."""
        return self.xla_seconds / self.kernel_seconds


def peak_for(device_kind: str) -> tuple[float, float] | None:
    for name, peak in PEAKS.items():
        if device_kind.startswith(name):
            return peak
    return None


def work(checked: CheckedKernel, sizes: dict[str, int]) -> tuple[int, int]:
    """Flops of the product (0 without one) and bytes read and written at least once."""
    kernel, product = checked.kernel, checked.product
    elements = 1
    for dim in kernel.outputs[0].dims:
        elements *= sizes[dim]
    flops = 2 * elements * sizes[product.k] if product else 0
    moved = 0
    for decl in kernel.inputs + kernel.outputs:
        count = 1
        for dim in decl.dims:
            count *= sizes[dim]
        moved += count * DTYPES[decl.dtype].bytes
    return flops, moved


def time_kernel(module, checked: CheckedKernel, sizes: dict[str, int], inputs, repeats: int, options: dict) -> Timing:
    """Median times of the kernel and of its jitted reference (XLA), measured in one run."""
    import jax

    kernel = getattr(module, checked.kernel.name)
    reference = jax.jit(getattr(module, f"{checked.kernel.name}_reference"))
    kernel_seconds, xla_seconds = time_pair(
        lambda: kernel(*inputs, **options), lambda: reference(*inputs), repeats
    )
    flops, moved = work(checked, sizes)
    return Timing(checked.kernel.name, sizes, kernel_seconds, xla_seconds, flops, moved)


def time_pair(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of two functions, alternating calls after a warm-up of each."""
    import jax

    for function in (first, second):
        jax.block_until_ready(function())
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for function, record in zip((first, second), times):
            start = time.perf_counter()
            jax.block_until_ready(function())
            record.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def describe(timing: Timing, device_kind: str) -> str:
    """One line: time, throughput, ratio to XLA and percent of peak where known."""
    peak = peak_for(device_kind)
    shape = ", ".join(f"{d}={n}" for d, n in timing.sizes.items())
    parts = [f"{timing.kernel} [{shape}]: {timing.kernel_seconds * 1e3:.3f} ms (XLA {timing.xla_seconds * 1e3:.3f} ms)"]
    if timing.flops:
        tflops = timing.flops / timing.kernel_seconds / 1e12
        parts.append(f"{tflops:.2f} TFLOP/s" + (f" ({100 * tflops / peak[0]:.0f}% of peak)" if peak else ""))
    else:
        gbps = timing.bytes_moved / timing.kernel_seconds / 1e9
        parts.append(f"{gbps:.1f} GB/s" + (f" ({100 * gbps / peak[1]:.0f}% of peak)" if peak else ""))
    parts.append(f"{timing.ratio:.2f}x XLA")
    return ", ".join(parts)
