"""`pallasgen tune --gpu`: the Triton blocks and launch options (warps, pipeline stages)
that run a kernel fastest at given sizes, timed on the CUDA device that runs it; or,
with `backend="mosaic_gpu"`, Mosaic GPU's blocks and pipeline stages of a product. What
is searched is each backend's (`Backend.tuning_space`, `tuning_start`, `tuning_problem`).

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
from pallasgen.backends import Backend, backend_named
from pallasgen.devices.compile_only import CompileError
from pallasgen.devices.tune import Tuned, best_of, descend

MEASURE = "median seconds of a call on the device, timed beside XLA's (its jitted reference)"
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


def gpu_backend_named(backend: str) -> Backend:
    """The backend that a `gpu_backend` value names ("triton" is the GPU backend's)."""
    return backend_named("gpu" if backend == "triton" else backend)


def choices(checked: CheckedKernel, sizes: dict[str, int], backend: str = "triton") -> dict[str, list[int]]:
    """Each public keyword the search sets, with its values in order (the backend's
    `tuning_space`): on Triton, the GPU blocks, warps and stages; on Mosaic GPU, those
    its `mgpu_*` keywords take."""
    return {
        keyword: list(values) for keyword, values in gpu_backend_named(backend).tuning_space(checked, sizes).items()
    }


def start_choices(
    checked: CheckedKernel, options: dict[str, list[int]], previous=None, backend: str = "triton"
) -> dict[str, int]:
    """Where the search starts: the blocks and options tuned before (a `TunedBlocks`)
    where they fit the kernel, else the spec's (Mosaic GPU's built-in ones), each the
    nearest value the search tries."""
    return gpu_backend_named(backend).tuning_start(checked, options, previous)


def entry_parts(checked: CheckedKernel, chosen: tuple[tuple[str, int], ...], backend: str = "triton"):
    """A trial's keywords as a tuning entry keeps them: (blocks by dimension, options by name)."""
    return gpu_backend_named(backend).tuned_parts(checked, dict(chosen))


def tune_gpu(
    time_pair, module, checked: CheckedKernel, inputs, sizes, budget: int, progress, previous=None, backend="triton"
) -> Tuned:
    """The fastest blocks and options for `checked` on `inputs` (at `sizes`) on the GPU
    `backend` ("triton" or "mosaic_gpu"), searched from the `previous` ones (tuned before
    for this GPU and size bucket) if given, else the spec's. `time_pair(first, second)`
    gives the median seconds of two calls, timed in one run (`bench.time_pair`; a test
    passes its own). Choices that cannot run (the backend's `tuning_problem`) are not timed."""
    import jax

    kernel = getattr(module, checked.kernel.name)
    reference = jax.jit(getattr(module, checked.kernel.name).reference)
    xla_seconds = []

    def measure(chosen: dict[str, int]) -> float:
        try:
            call = functools.partial(kernel, *inputs, gpu_backend=backend, **chosen)
            seconds, xla = time_pair(call, functools.partial(reference, *inputs))
        except Exception as error:  # noqa: BLE001  (a choice the backend cannot compile or run is rejected)
            raise CompileError(backend, f"{type(error).__name__}: {error}") from None
        xla_seconds.append(xla)
        return seconds

    options = choices(checked, sizes, backend)
    start = start_choices(checked, options, previous, backend)
    searched = gpu_backend_named(backend)
    trials = descend(options, start, measure, budget, progress, (), lambda c: searched.tuning_problem(checked, c))
    return best_of(trials, start, min(xla_seconds, default=0.0), backend)
