"""`pallasgen tune --gpu`: the Triton blocks and launch options (warps, pipeline stages)
that run a kernel fastest at given sizes, timed on the CUDA device that runs it; or,
with `backend="mosaic_gpu"`, Mosaic GPU's blocks and pipeline stages of a product
(`backends.mosaic_gpu.choices`).

The search starts from the spec's blocks and options (or those tuned before for this
kind of GPU) and walks downhill as the TPU search does (`tune.descend`): each round
times every neighbour (one block doubled or halved, warps or stages one choice up or
down) and moves to the fastest, until none is faster or the budget of timings is spent.
A choice that fails to compile or run is a rejected trial. Every cost is a median time
in seconds, measured beside XLA's (the jitted reference) in the same run.
"""

from __future__ import annotations

import functools

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.names import block_keyword
from pallasgen.backends import backend_named
from pallasgen.backends.gpu.options import OPTIONS
from pallasgen.backends.mosaic_gpu import choices as mosaic_gpu
from pallasgen.devices.compile_only import CompileError
from pallasgen.devices.tune import Tuned, best_of, descend

MEASURE = "median seconds of a call on the device, timed beside XLA's (its jitted reference)"
LARGEST_BLOCK = 1024  # Triton holds a block in registers: larger ones spill
REPEATS = 20  # timed calls of each trial


class NoCudaDevice(Exception):
    """`tune --gpu` run where jax finds no CUDA GPU."""


def cuda_device_kind() -> str:
    """The device kind of the CUDA GPU jax runs on; raises `NoCudaDevice` without one."""
    import jax

    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        devices = []
    if not devices:
        raise NoCudaDevice("pallasgen tune --gpu times kernels on a CUDA device, and jax finds none here")
    return devices[0].device_kind


def choices(checked: CheckedKernel, sizes: dict[str, int], backend: str = "triton") -> dict[str, list[int]]:
    """Each public keyword the search sets, with its values in order: the GPU blocks
    (powers of two from the smallest the launcher takes up to the dimension's next power
    of two, at most LARGEST_BLOCK), warps and stages (those the spec may set); on Mosaic
    GPU, those its `mgpu_*` keywords take."""
    if backend == "mosaic_gpu":
        return {keyword: list(values) for keyword, values in mosaic_gpu.allowed(checked).items()}
    found = {}
    for dim in backend_named("gpu").tunable_dims(checked):
        smallest = 16 if checked.product is not None or checked.fused is not None else 1
        largest = max(smallest, min(LARGEST_BLOCK, 1 << (sizes[dim] - 1).bit_length()))
        found[f"gpu_{block_keyword(dim)}"] = [1 << n for n in range(smallest.bit_length() - 1, largest.bit_length())]
    return found | {keyword: list(allowed) for keyword, allowed in OPTIONS.values()}


def start_choices(
    checked: CheckedKernel, options: dict[str, list[int]], previous=None, backend: str = "triton"
) -> dict[str, int]:
    """Where the search starts: the blocks and options tuned before (a `TunedBlocks`), else
    the spec's (Mosaic GPU's built-in ones), each the nearest value the search tries."""
    if backend == "mosaic_gpu":
        built_in = mosaic_gpu.defaults(checked) | {mosaic_gpu.STAGES: mosaic_gpu.DEFAULT_STAGES}
        fits = previous is not None and not mosaic_gpu.tuned_problem(checked, previous)  # a hand-edited one may not
        values = dict(previous.blocks) | dict(previous.options) if fits else built_in
        wanted = {keyword: values[what] for keyword, what in mosaic_gpu.keywords(checked).items()}
        return {k: min(options[k], key=lambda v: abs(v - value)) for k, value in wanted.items()}
    settings = checked.settings["gpu"]
    if previous is not None:
        blocks, launch = dict(previous.blocks), dict(previous.options)
    else:
        blocks, launch = settings.blocks, settings.options
    wanted = {f"gpu_{block_keyword(d)}": blocks[d] for d in backend_named("gpu").tunable_dims(checked)}
    wanted |= {keyword: launch[name] for name, (keyword, _) in OPTIONS.items()}
    return {k: min(options[k], key=lambda v: abs(v - value)) for k, value in wanted.items()}


def entry_parts(checked: CheckedKernel, chosen: tuple[tuple[str, int], ...], backend: str = "triton"):
    """A trial's keywords as a tuning entry keeps them: (blocks by dimension, options by name)."""
    values = dict(chosen)
    if backend == "mosaic_gpu":
        named = {what: values[keyword] for keyword, what in mosaic_gpu.keywords(checked).items()}
        stages = named.pop(mosaic_gpu.STAGES)
        return tuple(named.items()), ((mosaic_gpu.STAGES, stages),)
    blocks = tuple((d, values[f"gpu_{block_keyword(d)}"]) for d in backend_named("gpu").tunable_dims(checked))
    options = tuple((name, values[keyword]) for name, (keyword, _) in OPTIONS.items())
    return blocks, options


def tune_gpu(
    time_pair, module, checked: CheckedKernel, inputs, sizes, budget: int, progress, previous=None, backend="triton"
) -> Tuned:
    """The fastest blocks and options for `checked` on `inputs` (at `sizes`) on the GPU
    `backend` ("triton" or "mosaic_gpu"), searched from the `previous` ones (tuned before
    for this GPU and size bucket) if given, else the spec's. `time_pair(first, second)`
    gives the median seconds of two calls, timed in one run (`bench.time_pair`; a test
    passes its own). Mosaic GPU's choices that cannot run (`choices.problem`) are not timed."""
    import jax

    kernel = getattr(module, checked.kernel.name)
    reference = jax.jit(getattr(module, f"{checked.kernel.name}_reference"))
    xla_seconds = []

    def measure(chosen: dict[str, int]) -> float:
        try:
            call = functools.partial(kernel, *inputs, gpu_backend=backend, **chosen)
            seconds, xla = time_pair(call, functools.partial(reference, *inputs))
        except Exception as error:  # noqa: BLE001  (a choice the backend cannot compile or run is rejected)
            raise CompileError(backend, f"{type(error).__name__}: {error}") from None
        xla_seconds.append(xla)
        return seconds

    def problem(chosen: dict[str, int]) -> str | None:
        blocks, options = entry_parts(checked, tuple(chosen.items()), backend)
        return mosaic_gpu.problem(checked, dict(blocks), dict(options)[mosaic_gpu.STAGES])

    options = choices(checked, sizes, backend)
    start = start_choices(checked, options, previous, backend)
    trials = descend(options, start, measure, budget, progress, (), problem if backend == "mosaic_gpu" else None)
    return best_of(trials, start, min(xla_seconds, default=0.0), backend)
