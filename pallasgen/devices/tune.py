"""`pallasgen tune`: the TPU blocks that minimise the compiler's cycle estimate for a
kernel at given sizes, on a compile-only chip (no TPU needed).

The search starts from the blocks a call would take on that chip (its tuned ones, else
the chip's default, grown at call time for a kernel without a product) and walks
downhill: each round compiles every neighbour (one block doubled or halved, among the
blocks that tile and fit VMEM) and moves to the best, until none is better or the
budget of compiles is spent. Every estimate is the compiler's static cost model, never
a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.backends import backend_named
from pallasgen.devices.compile_only import CompileError
from pallasgen.devices.estimate import arguments

MEASURE = "libtpu static cost model: estimated cycles, not a time"


@dataclass(frozen=True)
class Trial:
    blocks: tuple[tuple[str, int], ...]  # the choices measured (on a GPU, its launch options too)
    cost: float | None  # estimated cycles (TPU) or seconds (GPU); None: rejected
    error: str = ""


@dataclass(frozen=True)
class Tuned:
    best: Trial
    start: Trial  # where the search started: given blocks, else those tuned before, else a call's
    xla_cost: float  # XLA's, measured as the trials are
    trials: tuple[Trial, ...]


def block_choices(checked: CheckedKernel, dim: str, size: int) -> list[int]:
    """The blocks of `dim` worth trying at `size` (the TPU backend's `tuning_space`: the
    tiling rule's multiple times each power of two below the size, then the whole dimension)."""
    return list(backend_named("tpu").tuning_space(checked, {dim: size})[dim])


def start_blocks(module, checked: CheckedKernel, chip: str, sizes: dict[str, int]) -> dict[str, int]:
    """The blocks a call that passes none takes at `sizes` on `chip` (the chip's default,
    grown for a kernel without a product, or a tuned entry), each the nearest choice to
    it (a block clamped to a small dimension is that dimension). They are what the
    generated `module` itself chooses (the runtime's `tpu_blocks`, traced, not compiled)."""
    import jax

    tunable = backend_named("tpu").tunable_dims(checked)
    if not tunable:
        return {}  # every dimension whole: nothing to choose
    chosen = []
    runtime = module.rt  # pallasgen.runtime.support, which the module's launchers call
    choose, original_chip = runtime.tpu_blocks, runtime.tpu_chip
    runtime.tpu_blocks = lambda *args, **keywords: chosen.append(choose(*args, **keywords)) or chosen[-1]
    runtime.tpu_chip = lambda: chip
    try:
        kernel = functools.partial(getattr(module, checked.kernel.name), interpret=True)
        jax.eval_shape(kernel, *arguments(checked, sizes))
    finally:
        runtime.tpu_blocks, runtime.tpu_chip = choose, original_chip
        jax.clear_caches()  # nothing traced with the stand-in chip stays
    call = dict(zip(tunable, chosen[-1]))
    return {d: min(block_choices(checked, d, sizes[d]), key=lambda b: abs(b - block)) for d, block in call.items()}


def search(
    checked: CheckedKernel, sizes: dict[str, int], start: dict[str, int], measure, budget: int, progress, first=()
):
    """Steepest descent from `start` over the TPU's `block_choices`, among the blocks that
    fit VMEM (see `descend`)."""
    tpu = backend_named("tpu")
    choices = {d: list(values) for d, values in tpu.tuning_space(checked, {d: sizes[d] for d in start}).items()}
    return descend(choices, start, measure, budget, progress, first, lambda blocks: tpu.tuning_problem(checked, blocks))


def descend(
    choices: dict[str, list[int]], start: dict[str, int], measure, budget: int, progress, first=(), problem=None
):
    """Steepest descent from `start` over `choices` (each name's values, in order), at most
    `budget` measurements, after measuring the sets in `first` (so that the best found is
    no worse than they); a set `problem` finds a reason against is not measured.

    `measure(chosen)` gives a cost (lower is better) or raises `CompileError`;
    `progress(n)` advances a progress bar by n measurements. Returns every trial, in order.
    """
    trials: dict[tuple, Trial] = {}

    def trial(chosen: dict[str, int]) -> Trial:
        key = tuple(sorted(chosen.items()))
        if key not in trials:
            try:
                trials[key] = Trial(key, measure(chosen))
            except CompileError as error:
                trials[key] = Trial(key, None, error.message.splitlines()[0][:200])
            progress(1)
        return trials[key]

    for chosen in first:
        trial(chosen)
    current = trial(start)
    while len(trials) < budget:
        fresh = [n for n in _neighbours(current.blocks, choices) if tuple(sorted(n.items())) not in trials]
        fitting = [n for n in fresh if problem is None or not problem(n)]
        tried = [trial(n) for n in fitting[: budget - len(trials)]]
        better = [t for t in tried if t.cost is not None and (current.cost is None or t.cost < current.cost)]
        if not better:
            break
        current = min(better, key=lambda t: t.cost)
    return list(trials.values())


def _neighbours(blocks: tuple[tuple[str, int], ...], choices: dict[str, list[int]]) -> list[dict[str, int]]:
    """Each block moved one choice up or down, the others kept."""
    found = []
    for dim, block in blocks:
        index = choices[dim].index(block)
        for step in (1, -1):
            if 0 <= index + step < len(choices[dim]):
                found.append({**dict(blocks), dim: choices[dim][index + step]})
    return found


def tune(
    estimator, module, checked: CheckedKernel, sizes: dict[str, int], budget: int, progress, previous=None, given=None
) -> Tuned:
    """The best blocks for `checked` at `sizes` on the estimator's chip, searched from the
    `previous` ones (those tuned before at these sizes) if given, else from those a call
    takes: a second run goes on from the first and keeps its blocks unless it finds better.
    `given` blocks replace those of the start (the previous ones are then measured too)."""
    xla_cycles = []

    def measure(blocks: dict[str, int]) -> int:
        keywords = {backend_named("tpu").block_keyword(d): b for d, b in blocks.items()}
        estimate = estimator.estimate(module, checked, sizes, keywords)
        xla_cycles.append(estimate.xla_cycles)
        return estimate.kernel_cycles

    start = dict(previous) if previous else start_blocks(module, checked, estimator.chip, sizes)
    start.update(given or {})
    first = [dict(previous)] if previous and given else []
    trials = search(checked, sizes, start, measure, budget, progress, first)
    return best_of(trials, start, xla_cycles[0] if xla_cycles else 0, "mosaic")  # none: best_of refuses


def best_of(trials: list[Trial], start: dict[str, int], xla_cost: float, compiler: str) -> Tuned:
    """The search's result; raises `CompileError` if no trial was measured."""
    measured = [t for t in trials if t.cost is not None]
    if not measured:
        raise CompileError(compiler, f"no block set compiled; the first error: {trials[0].error}")
    started = next(t for t in trials if t.blocks == tuple(sorted(start.items())))
    return Tuned(min(measured, key=lambda t: t.cost), started, xla_cost, tuple(trials))


def versions() -> dict[str, str]:
    """The versions a tuning was made with: what decides the compiler's estimates."""
    found = {}
    for distribution in ("pallasgen", "jax", "jaxlib", "libtpu"):
        try:
            found[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            pass
    return found
