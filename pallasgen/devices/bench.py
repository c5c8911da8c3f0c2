"""`pallasgen bench`: generated kernels timed against XLA (their jitted reference).

Only this module and `runner` import jax, and only when a command needs them.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.backends import backend_named

# Block sizes and launch options a sweep tries, per backend.
TPU_CANDIDATES = (128, 256, 512, 1024)
GPU_PRODUCT_TILES, GPU_PRODUCT_DEPTHS = (64, 128), (32, 64)
GPU_ELEMENTWISE_LAST, GPU_ELEMENTWISE_ROWS = (128, 256, 512), (4, 8, 16)
GPU_WARPS, GPU_STAGES = (4, 8), (2, 3, 4)

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
    cudnn_seconds: float | None = None  # median of cuDNN's attention, where it computes the same
    cudnn_note: str = ""  # why there is no cuDNN time, for an attention kernel on a GPU

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
    """Flops of the products (2 per multiply-add of each, counted whole even where a block
    is skipped; 0 without one) and bytes read and written at least once."""
    kernel = checked.kernel
    flops = 0
    for node, product in checked.frame.products.items():
        result = 1
        for dim in checked.types[node].dims:
            result *= sizes[dim]
        flops += 2 * result * sizes[product.k]
    moved = 0
    for decl in kernel.inputs + kernel.outputs:
        count = 1
        for dim in decl.dims:
            count *= sizes[dim]
        moved += count * DTYPES[decl.dtype].bytes
    return flops, moved


def time_kernel(
    module,
    checked: CheckedKernel,
    sizes: dict[str, int],
    inputs,
    repeats: int,
    options: dict,
    cotangents=None,
    cudnn: bool = False,
) -> Timing:
    """Median times of the kernel and of its jitted reference (XLA), measured in one run;
    given the float outputs' `cotangents`, of each one's forward plus backward pass. With
    `cudnn`, an attention kernel's is measured beside cuDNN's too (`devices.cudnn`)."""
    import functools

    import jax

    name = checked.kernel.name
    kernel = functools.partial(getattr(module, name), **options)
    reference = getattr(module, name).reference
    from pallasgen.devices import cudnn as cudnn_baseline

    baseline = cudnn_baseline.checked_baseline(checked, inputs, kernel) if cudnn else None
    note = baseline if isinstance(baseline, str) else ""
    baseline = None if isinstance(baseline, str) else baseline
    if cotangents is None:
        timed = [lambda: kernel(*inputs), lambda: jax.jit(reference)(*inputs)]
        if baseline is not None:
            timed.append(lambda: baseline.function(*baseline.arrays))
        seconds = time_alternating(timed, repeats) + [None]
        flops, moved = work(checked, sizes)
        return Timing(name, sizes, *seconds[:2], flops, moved, cudnn_seconds=seconds[2], cudnn_note=note)
    kernel, reference = (jax.jit(with_backward(f, checked)) for f in (kernel, reference))
    timed = [lambda: kernel(inputs, cotangents), lambda: reference(inputs, cotangents)]
    if baseline is not None:
        cudnn_pass, cudnn_cotangent = cudnn_baseline.with_backward(baseline)
        timed.append(lambda: cudnn_pass(baseline.arrays, cudnn_cotangent))
    seconds = time_alternating(timed, repeats) + [None]
    return Timing(f"{name} forward+backward", sizes, *seconds[:2], 0, 0, cudnn_seconds=seconds[2], cudnn_note=note)


def with_backward(function, checked: CheckedKernel):
    """`function`'s forward and backward pass as one function, as training runs them: from
    the inputs and the float outputs' cotangents, the outputs and the float inputs'
    cotangents (`jax.vjp`; integer outputs take float0 cotangents)."""
    import jax
    import numpy as np

    kernel = checked.kernel
    float_inputs = [i for i, d in enumerate(kernel.inputs) if DTYPES[d.dtype].is_float]

    def forward_and_backward(inputs, cotangents):
        outputs, pullback = jax.vjp(function, *inputs)
        several = isinstance(outputs, tuple)
        given = iter(cotangents)
        every = tuple(
            next(given) if DTYPES[decl.dtype].is_float else np.zeros(out.shape, jax.dtypes.float0)
            for decl, out in zip(kernel.outputs, outputs if several else (outputs,))
        )
        grads = pullback(every if several else every[0])
        return outputs, tuple(grads[i] for i in float_inputs)

    return forward_and_backward


def float_outputs(checked: CheckedKernel) -> list:
    """The kernel's float outputs, whose cotangents `with_backward` takes."""
    return [decl for decl in checked.kernel.outputs if DTYPES[decl.dtype].is_float]


def time_pair(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of two functions, alternating calls after a warm-up of each."""
    return tuple(time_alternating([first, second], repeats))


def time_alternating(functions, repeats: int, round_seconds: float = 0.0) -> list[float]:
    """Median seconds of a call of each function, calls taking turns after a warm-up of
    each. With `round_seconds`, each turn makes as many calls as fill about that time
    (at most 64) and waits once, so that a short kernel's launch and wait do not count."""
    import jax

    calls = []
    for function in functions:
        jax.block_until_ready(function())
        start = time.perf_counter()
        jax.block_until_ready(function())
        once = time.perf_counter() - start
        calls.append(max(1, min(64, round(round_seconds / once))) if round_seconds else 1)
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for function, count, record in zip(functions, calls, times):
            start = time.perf_counter()
            for _ in range(count):
                result = function()
            jax.block_until_ready(result)
            record.append((time.perf_counter() - start) / count)
    return [statistics.median(record) for record in times]


def describe(timing: Timing, device_kind: str) -> str:
    """One line: time, throughput, speedup over XLA (XLA's time / the kernel's) and percent of peak where known."""
    peak = peak_for(device_kind)
    shape = ", ".join(f"{d}={n}" for d, n in timing.sizes.items())
    parts = [f"{timing.kernel} [{shape}]: {timing.kernel_seconds * 1e3:.3f} ms (XLA {timing.xla_seconds * 1e3:.3f} ms)"]
    if timing.flops:
        tflops = timing.flops / timing.kernel_seconds / 1e12
        parts.append(f"{tflops:.2f} TFLOP/s" + (f" ({100 * tflops / peak[0]:.0f}% of peak)" if peak else ""))
    elif timing.bytes_moved:  # 0: a forward plus backward pass, whose work is not counted
        gbps = timing.bytes_moved / timing.kernel_seconds / 1e9
        parts.append(f"{gbps:.1f} GB/s" + (f" ({100 * gbps / peak[1]:.0f}% of peak)" if peak else ""))
    parts.append(f"speedup over XLA {timing.ratio:.2f}x")
    if timing.cudnn_seconds is not None:
        ratio = timing.cudnn_seconds / timing.kernel_seconds
        parts.append(f"cuDNN {timing.cudnn_seconds * 1e3:.3f} ms (speedup over cuDNN {ratio:.2f}x)")
    elif timing.cudnn_note:
        parts.append(timing.cudnn_note)
    return ", ".join(parts)


def sweep_candidates(checked: CheckedKernel, backend: str) -> list[dict[str, int]]:
    """Keyword sets to try: TPU blocks that tile and fit VMEM, or GPU blocks and options."""
    if backend == "gpu":
        return _gpu_candidates(checked)
    tpu = backend_named("tpu")
    tunable = tpu.tunable_dims(checked)
    candidates = []
    for sizes in itertools.product(TPU_CANDIDATES, repeat=len(tunable)):
        blocks = {**checked.blocks, **dict(zip(tunable, sizes))}
        if any(tpu.block_problem(checked, d, blocks[d]) for d in tunable):
            continue
        if tpu.memory_bytes(checked, blocks) > tpu.memory_budget:
            continue
        candidates.append({tpu.block_keyword(d): blocks[d] for d in tunable})
    return candidates


def _gpu_candidates(checked: CheckedKernel) -> list[dict[str, int]]:
    product, layout = checked.product, checked.space.layout
    gpu = backend_named("gpu")
    tunable = gpu.tunable_dims(checked)  # reduced dimensions held whole have no GPU block
    if checked.framed:  # its tiles' rows, swept and parallel dimensions
        axes = {d: GPU_PRODUCT_TILES for d in tunable if d not in checked.frame.batch}
    elif product is not None:
        axes = {product.m: GPU_PRODUCT_TILES, product.n: GPU_PRODUCT_TILES, product.k: GPU_PRODUCT_DEPTHS}
    elif len(layout) == 1:
        axes = {layout[0]: (512, 1024, 2048)}
    else:
        axes = {layout[-2]: GPU_ELEMENTWISE_ROWS, layout[-1]: GPU_ELEMENTWISE_LAST}
    axes = {d: choices for d, choices in axes.items() if d in tunable}
    stages = GPU_STAGES if product is not None else (1,)
    candidates = []
    for sizes in itertools.product(*axes.values(), GPU_WARPS, stages):
        *blocks, warps, stage_count = sizes
        keywords = {gpu.block_keyword(d): b for d, b in zip(axes, blocks)}
        candidates.append({**keywords, "gpu_warps": warps, "gpu_stages": stage_count})
    return candidates


def sweep(module, checked: CheckedKernel, inputs, candidates: list[dict[str, int]], repeats: int, progress=None):
    """(seconds, keywords) of the fastest candidate, and XLA's seconds, measured in one run."""
    import jax

    kernel = getattr(module, checked.kernel.name)
    reference = jax.jit(getattr(module, checked.kernel.name).reference)
    best: tuple[float, dict[str, int]] | None = None
    xla_times = []
    for options in candidates:
        seconds, xla_seconds = time_pair(lambda: kernel(*inputs, **options), lambda: reference(*inputs), repeats)
        xla_times.append(xla_seconds)
        if best is None or seconds < best[0]:
            best = (seconds, options)
        if progress is not None:
            progress.update(1)
    return best, statistics.median(xla_times)
