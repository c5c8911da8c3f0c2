"""The `pallasgen` command: wires the stages together, prints, and sets the exit code.

Exit codes: 0 success, 1 `check` found drift, 2 a spec or usage error.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.gradients.derive import every_kernel
from pallasgen.backends import backend_named
from pallasgen.devices import runner
from pallasgen.devices.extras import MissingExtra, require
from pallasgen.show import tilemap
from pallasgen.workspace.atomic import write_atomically
from pallasgen.workspace.config import ConfigError, load_config, no_spec_folder
from pallasgen.frontend.errors import SpecError
from pallasgen.frontend.text import counted
from pallasgen.workspace.pipeline import check_source, decode
from pallasgen.workspace.report import FORMATS, Finding, drift_description, drift_finding, formatted, spec_findings
from pallasgen.workspace.sync import (
    SpecErrors,
    StaleTuning,
    UsageError,
    apply,
    collect_targets,
    generate_targets,
    plan_changes,
    stale_tunings,
    unified_diff,
    build_notes,
)

SPEC_OR_USAGE_ERROR = 2
DRIFT = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pallasgen", prog_name="pallasgen", message="%(prog)s %(version)s")
def main() -> None:
    """Generate JAX Pallas kernels from spec files."""
    from pallasgen.devices.compile_only import quiet_libtpu_without_tpu

    quiet_libtpu_without_tpu()  # before any command imports jax


_paths = click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
_out = click.option("--out", type=click.Path(path_type=Path, file_okay=False), help="Output folder.")
_no_cache = click.option(
    "--no-cache", is_flag=True, help="Generate every module afresh; neither read nor write the cache."
)


_format = click.option(
    "--format",
    "form",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="How problems are reported. json: one JSON object per line (file, line, column, severity,"
    " message; for an out-of-date file also kind and spec); github: GitHub Actions workflow commands that"
    " annotate the file and line. With json and github those lines alone go to stdout, everything else to"
    " stderr.",
)


@main.command()
@_paths
@_out
@_no_cache
@_format
def build(paths: tuple[Path, ...], out: Path | None, no_cache: bool, form: str) -> None:
    """Write generated modules for PATHS (spec files or folders; default from pyproject.toml).

    A spec error is reported as `path:line:col: error: message`, with the line and a
    caret (--format text), as a JSON object (json), or as a workflow command (github);
    nothing is written and the exit code is 2.
    """
    targets, modules, changes = _prepare(paths, out, no_cache, form)
    backend_targets = _config(form).targets
    try:
        apply(changes)
    except OSError as error:
        _usage_error(f"cannot write {_display(Path(error.filename or ''))}: {error.strerror}", form)
    for change in changes:
        verb = {"create": "wrote", "update": "updated", "remove": "removed stale"}[change.kind]
        _say(form, f"{verb} {_display(change.path)}")
    for stale in _stale_tunings(targets, form, backend_targets):
        finding = Finding("warning", stale.left_out, stale.file, kind="stale-tuning", spec=stale.spec)
        _report(form, finding, f"warning: {stale.file}: {stale.left_out}", err=True)
    for note in build_notes(targets, _display, backend_targets):
        where = f"{note.file}:{note.position.line}:{note.position.column}"
        finding = Finding(note.severity, note.message, note.file, note.position, kind=note.kind)
        _report(form, finding, f"{note.severity}: {where}: {note.message}", err=True)
    _say(form, f"pallasgen: {counted(len(targets), 'spec')}, {counted(len(changes), 'file')} changed")


@main.command()
@_paths
@_out
@click.option("--quiet", "-q", is_flag=True, help="Print only the summary (and, with --format, the records).")
@_no_cache
@_format
def check(paths: tuple[Path, ...], out: Path | None, quiet: bool, no_cache: bool, form: str) -> None:
    """Exit 1 if generated modules differ from what PATHS would generate."""
    targets, modules, changes = _prepare(paths, out, no_cache, form)
    for change in changes:
        shown = _display(change.path)
        if not quiet or form != "text":
            _report(form, drift_finding(change, shown), f"{shown}: {drift_description(change)}")
        if change.kind == "update" and not quiet:
            _say(form, unified_diff(change, _display), nl=False)
    if changes:
        counts = {kind: sum(c.kind == kind for c in changes) for kind in ("update", "create", "remove")}
        _say(
            form,
            f"pallasgen check: {counted(len(changes), 'file')} out of date ({counts['update']} changed,"
            f" {counts['create']} missing, {counts['remove']} stale); run `pallasgen build`",
        )
        sys.exit(DRIFT)
    stale = _stale_tunings(targets, form, _config(form).targets)
    for tuning in stale:
        message = f"{tuning.why}; run `pallasgen tune` again, or remove its entry"
        finding = Finding("error", message, tuning.file, kind="stale-tuning", spec=tuning.spec)
        _report(form, finding, f"{tuning.file}: {message}")
    if stale:
        changed = counted(len(stale), "tuned kernel changed since it was", "tuned kernels changed since they were")
        _say(form, f"pallasgen check: {changed} tuned")
        sys.exit(DRIFT)
    matching = counted(len(targets), "generated file matches its spec", "generated files match their specs")
    _say(form, f"pallasgen check: {matching}")


def _report(form: str, finding: Finding, text: str, err: bool = False) -> None:
    """A finding: `text` for a person (on stderr if `err`), else one record on stdout."""
    if form == "text":
        click.echo(text, err=err)
    else:
        click.echo(formatted(finding, form))


def _say(form: str, text: str, nl: bool = True) -> None:
    """A line for a person: on stdout with --format text, else on stderr, leaving stdout to the records."""
    click.echo(text, nl=nl, err=form != "text")


def _stale_tunings(targets, form: str, backend_targets: tuple[str, ...]) -> list[StaleTuning]:
    try:
        return stale_tunings(targets, _display, backend_targets)
    except UsageError as error:
        _usage_error(str(error), form)


_targets = click.argument("targets", nargs=-1, metavar="SPEC[:KERNEL]...")
_sizes = click.option(
    "--size",
    "sizes",
    multiple=True,
    metavar="DIM=N",
    help="A dimension's size (repeatable); the others as described above.",
)
_seed = click.option(
    "--seed", default=0, show_default=True, type=click.IntRange(min=0), help="Seed of the random inputs."
)
_modules = click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder the generated modules are read from (default from pyproject.toml);"
    " a missing or stale module is generated in memory instead.",
)


_tolerances = ", ".join(f"{dtype} {tolerance:.0e}" for dtype, tolerance in runner.TOLERANCE.items())


@main.command(help=f"""Run generated kernels on random inputs and compare them with their references.

    SPEC[:KERNEL] names a spec file and optionally one of its kernels; without any,
    every kernel of the project's specs runs.

    Sizes not given with --size: a blocked dimension is one and a half blocks (so its
    last block is a ragged edge), an unblocked one {runner.UNBLOCKED_SIZE}, a matmul's batch dimension
    {runner.PRODUCT_BATCH_SIZE}; then, while an array holds more than {runner.ELEMENTS_PER_ARRAY} elements, its largest
    such dimension is halved. Every kernel so runs in seconds in interpret mode on CPU.

    Each output's line shows its worst element against the error allowed there:
    {_tolerances} times (1 + |reference|); other dtypes must be exact.
    A kernel whose gradient runs generated backward kernels is differentiated too:
    jax.vjp of it against jax.vjp of its reference, at random cotangents, a line per
    float input, grad(NAME) (--no-grad skips it).
    Exits 1 if any element is beyond its allowance.
    """)
@_targets
@_sizes
@_seed
@_modules
@click.option("--no-grad", is_flag=True, help="Do not check the gradients of differentiable kernels.")
def run(targets: tuple[str, ...], sizes: tuple[str, ...], seed: int, out: Path | None, no_grad: bool) -> None:
    _require("pallasgen run", tpu=False)
    given = _parse_sizes(sizes)
    kernels = _kernels(targets, out, given)
    failed = False
    for module, checked in kernels:
        dims = runner.sizes_for(checked, given)
        checks = [runner.run_kernel]
        if not no_grad and runner.has_gradient(checked):
            checks.append(runner.run_gradient)
        for check in checks:
            for result in _within_memory(checked, dims, lambda: check(module, checked, dims, seed)):
                failed |= not result.ok
                click.echo(result.describe(dims))
        if not no_grad and checked.gradient is not None and checked.gradient.not_yet is not None:
            click.echo(f"{checked.kernel.name}.grad: not differentiable ({runner.why_no_backward(checked)})")
    _say_if_interpreted()
    sys.exit(DRIFT if failed else 0)


@main.command()
@_targets
@_sizes
@_seed
@_modules
@click.option(
    "--repeats", default=20, show_default=True, type=click.IntRange(min=1), help="Timed calls of each function."
)
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Also write results here.")
@click.option("--sweep", is_flag=True, help="Try candidate block sizes (and GPU options); print the best.")
@click.option("--block", "blocks", multiple=True, metavar="DIM=N", help="A TPU block size (repeatable).")
@click.option(
    "--chip",
    type=click.Choice(backend_named("tpu").chip_names),
    help="Instead of timing, compile for this TPU (no TPU needed) and print the compiler's cycle estimates.",
)
@click.option(
    "--vmem-limit", type=click.IntRange(min=1), metavar="MIB", help="With --chip: the kernel's scoped VMEM limit."
)
@click.option(
    "--grad",
    is_flag=True,
    help="Measure the forward plus backward pass (jax.vjp) against XLA's of the reference, at random cotangents.",
)
@click.option(
    "--gpu-backend",
    type=click.Choice(["triton", "mosaic_gpu"]),
    help="On an NVIDIA GPU: time the Triton or the Mosaic GPU kernels (each kernel's default otherwise).",
)
def bench(
    targets: tuple[str, ...],
    sizes: tuple[str, ...],
    seed: int,
    out: Path | None,
    repeats: int,
    json_path: Path | None,
    sweep: bool,
    blocks: tuple[str, ...],
    chip: str | None,
    vmem_limit: int | None,
    grad: bool,
    gpu_backend: str | None,
) -> None:
    """Time generated kernels against XLA (their jitted reference) on this machine's device.

    SPEC[:KERNEL] and the default sizes are as for `pallasgen run`. With --chip, compile
    them and their references for that TPU instead and compare the compiler's estimated
    cycles. With --grad, measure each differentiable kernel's forward plus backward pass
    (its generated backward kernels) against XLA's forward plus backward pass of its
    reference. On an NVIDIA GPU, attention kernels are timed beside cuDNN's attention
    (jax.nn.dot_product_attention) too, where it computes the kernel's output.
    """
    _require(f"pallasgen bench{' --chip' if chip else ''}", tpu=chip is not None)
    if chip is not None or blocks:
        _require_target("tpu", "bench --chip" if chip is not None else "bench --block")
    given = _parse_sizes(sizes)
    if sweep and grad:
        _usage_error("--sweep tries forward blocks; it cannot be combined with --grad")
    kernels = _kernels(targets, out, given)
    if grad:
        kernels = _differentiable_kernels(kernels)
    if chip is not None:
        if sweep:
            _usage_error("--sweep times kernels; it cannot be combined with --chip")
        _estimate(kernels, given, _parse_blocks(blocks), chip, vmem_limit, json_path, grad)
        return
    if vmem_limit is not None:
        _usage_error("--vmem-limit needs --chip")
    if gpu_backend is not None:
        _require_target(gpu_backend, f"bench --gpu-backend {gpu_backend}")
    import json

    import jax

    from pallasgen.devices import bench as benchmark

    device = jax.devices()[0].device_kind
    on_gpu = jax.default_backend() == "gpu"
    options = _parse_blocks(blocks)
    if sweep:
        _sweep(kernels, given, seed, repeats, device)
        return
    timings = []
    with click.progressbar(kernels, label=f"Timing on {device}", file=sys.stderr) as progress:
        for module, checked in progress:
            dims = runner.sizes_for(checked, given)
            inputs = _within_memory(checked, dims, lambda: runner.random_inputs(checked, dims, seed))
            cotangents = (
                _within_memory(checked, dims, lambda: runner.random_cotangents(checked, dims, seed)) if grad else None
            )
            keywords = _block_options(checked, options)
            if gpu_backend is not None and "gpu_backend" in getattr(module, checked.kernel.name).options:
                keywords["gpu_backend"] = gpu_backend
            timings.append(
                _within_memory(
                    checked,
                    dims,
                    lambda: benchmark.time_kernel(
                        module, checked, dims, inputs, repeats, keywords, cotangents, cudnn=on_gpu
                    ),
                )
            )
    for timing in timings:
        click.echo(benchmark.describe(timing, device))
    _say_if_interpreted()
    if json_path is not None:
        records = [
            {
                "kernel": t.kernel,
                "sizes": t.sizes,
                "kernel_seconds": t.kernel_seconds,
                "xla_seconds": t.xla_seconds,
                "speedup_over_xla": t.ratio,
                "cudnn_seconds": t.cudnn_seconds,
                "flops": t.flops,
                "bytes": t.bytes_moved,
            }
            for t in timings
        ]
        payload = {
            "device": device,
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "gpu_backend": gpu_backend,
            "results": records,
        }
        try:
            json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            _usage_error(f"cannot write {_display(json_path)}: {error.strerror}")


def _sweep(kernels, given: dict[str, int], seed: int, repeats: int, device: str) -> None:
    import jax

    from pallasgen.devices import bench as benchmark

    backend = "gpu" if jax.default_backend() == "gpu" else "tpu"
    _require_target("triton" if backend == "gpu" else "tpu", "bench --sweep here")
    for module, checked in kernels:
        dims = runner.sizes_for(checked, given)
        inputs = _within_memory(checked, dims, lambda: runner.random_inputs(checked, dims, seed))
        candidates = benchmark.sweep_candidates(checked, backend)
        if not candidates:
            click.echo(f"{checked.kernel.name}: no candidate block sizes tile and fit VMEM; nothing to sweep")
            continue
        with click.progressbar(length=len(candidates), label=f"Sweeping {checked.kernel.name}", file=sys.stderr) as bar:
            (seconds, options), xla_seconds = _within_memory(
                checked, dims, lambda: benchmark.sweep(module, checked, inputs, candidates, repeats, bar)
            )
        shape = ", ".join(f"{d}={n}" for d, n in dims.items())
        chosen = ", ".join(f"{k}={v}" for k, v in options.items())
        click.echo(
            f"{checked.kernel.name} [{shape}] on {device}: best of {len(candidates)} is {chosen}:"
            f" {seconds * 1e3:.3f} ms, speedup over XLA {xla_seconds / seconds:.2f}x"
        )
    _say_if_interpreted()


def _differentiable_kernels(kernels) -> list:
    """The kernels whose gradient runs generated backward kernels; a line for each other."""
    from pallasgen.devices import runner

    kept = []
    for module, checked in kernels:
        if runner.has_backward_kernels(checked):
            kept.append((module, checked))
        else:
            click.echo(f"{checked.kernel.name}: no backward kernels to measure ({runner.why_no_backward(checked)})")
    return kept


def _estimate(kernels, given: dict[str, int], blocks: dict[str, int], chip: str, vmem_mib, json_path, grad) -> None:
    import json

    from pallasgen.devices import estimate
    from pallasgen.devices import runner
    from pallasgen.devices.apart import ApartEstimator, NoEstimate
    from pallasgen.devices.compile_only import CompileError

    records = []
    failed = False
    estimator = ApartEstimator(chip)
    click.echo(f"TPU {chip}, {estimate.LABEL}; speedup over XLA = XLA cycles / kernel cycles (above 1: faster)")
    for module, checked in kernels:
        dims = runner.sizes_for(checked, given)
        limit = vmem_mib * 1024 * 1024 if vmem_mib else None
        try:
            result = estimator.estimate(module, checked, dims, _block_options(checked, blocks), limit, grad)
        except NoEstimate as error:
            failed = True
            click.echo(f"{checked.kernel.name}: no estimate for TPU {chip}: {error.message}")
            continue
        except CompileError as error:
            failed = True
            click.echo(f"{checked.kernel.name}: does not compile for TPU {chip}: {error.message}")
            continue
        click.echo(estimate.describe(result))
        percent, peak = estimate.percent_of_peak(result) or (None, None)
        records.append(
            {
                "kernel": result.kernel,
                "forward_and_backward": grad,
                "sizes": result.sizes,
                "blocks": _block_options(checked, blocks),
                "kernel_cycles": result.kernel_cycles,
                "mosaic_cycles": result.mosaic_cycles,
                "xla_cycles": result.xla_cycles,
                "speedup_over_xla": result.speedup,
                "percent_of_peak": percent,
                "peak": peak,
            }
        )
    if json_path is not None:
        payload = {"chip": chip, "what": estimate.LABEL, "vmem_limit_mib": vmem_mib, "results": records}
        json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if failed:
        sys.exit(DRIFT)


def _block_options(checked, blocks: dict[str, int]) -> dict[str, int]:
    """The `block_*` keywords among --block that this kernel has (a kernel without a dim ignores it)."""
    return {backend_named("tpu").block_keyword(d): n for d, n in blocks.items() if d in checked.blocks}


@main.command()
@click.argument("target", metavar="SPEC[:KERNEL]")
@click.option(
    "--size", "sizes", multiple=True, metavar="DIM=N", help="A dimension's size to tune at (repeatable; every one)."
)
@click.option(
    "--chip",
    type=click.Choice(backend_named("tpu").chip_names),
    help="The compile-only TPU to tune for.",
)
@click.option("--gpu", is_flag=True, help="Instead, time the GPU blocks and options on this machine's CUDA GPU.")
@click.option(
    "--gpu-backend",
    type=click.Choice(["triton", "mosaic_gpu"]),
    default="triton",
    show_default=True,
    help="With --gpu: tune Triton's blocks, warps and stages, or Mosaic GPU's blocks and pipeline stages (products).",
)
@click.option(
    "--budget",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="The most compiles (TPU) or timings (GPU) per kernel.",
)
@click.option(
    "--block",
    "blocks",
    multiple=True,
    metavar="DIM=N",
    help="Start the search with this block (repeatable); blocks tuned before are measured too.",
)
def tune(
    target: str,
    sizes: tuple[str, ...],
    chip: str | None,
    gpu: bool,
    gpu_backend: str,
    budget: int,
    blocks: tuple[str, ...],
) -> None:
    """Search the TPU blocks that minimise the compiler's cycle estimate for SPEC's kernels
    (or SPEC:KERNEL) at the given sizes, and record the best in SPEC's tuning file
    (NAME.tuning.json beside it), which `pallasgen build` renders into the generated module.

    No TPU is needed: libtpu compiles for a compile-only chip and estimates cycles (not
    time). A search starts from the blocks a call takes on the chip (or from --block)
    and keeps the best it finds.

    With --gpu, the Triton blocks, warps and stages are timed on this machine's CUDA GPU
    instead, and recorded for its kind of GPU: a call that passes none takes them there.
    With --gpu --gpu-backend mosaic_gpu, Mosaic GPU's blocks and pipeline stages
    (`mgpu_*`) of the products it takes, recorded apart from Triton's.
    """
    from pallasgen.devices import estimate
    from pallasgen.devices.apart import ApartEstimator
    from pallasgen.devices.compile_only import CompileError
    from pallasgen.devices.tune import MEASURE, tune as search
    from pallasgen.workspace.tuning import entry_for, read_tuning, tuning_path, with_entry

    if (chip is None) == (not gpu):
        _usage_error("tune needs --chip (a compile-only TPU) or --gpu (this machine's CUDA GPU), one of them")
    if gpu and blocks:
        _usage_error("--block starts a TPU search; --gpu starts from the spec's GPU blocks")
    if not gpu and gpu_backend != "triton":
        _usage_error("--gpu-backend chooses what --gpu tunes")
    _require_target(gpu_backend if gpu else "tpu", f"tune --gpu --gpu-backend {gpu_backend}" if gpu else "tune --chip")
    _require(f"pallasgen tune{' --gpu' if gpu else ''}", tpu=not gpu)
    device = _cuda_device_kind() if gpu else None
    given = _parse_sizes(sizes)
    starts = _parse_blocks(blocks)
    kernels = _kernels((target,), None, given)
    for _, checked in kernels:
        missing = [d for d in checked.dims if d not in given]
        if missing:
            _usage_error(
                f"{checked.kernel.name}: give the size of every dimension to tune at (missing: {', '.join(missing)})"
            )
        _check_start(checked, given, starts)
    spec = Path(target.partition(":")[0])
    path = tuning_path(spec)
    tuning = _checked_kernels(
        str(path), lambda: read_tuning(path.read_text(encoding="utf-8"), _display(path)) if path.is_file() else {}
    )
    if gpu:
        _write_tuning(path, _tune_gpu(kernels, given, budget, tuning, device, gpu_backend))
        return
    estimator = ApartEstimator(chip)
    for module, checked in kernels:
        dims = {d: given[d] for d in checked.dims}
        label = f"Tuning {checked.kernel.name} for {chip}"
        with click.progressbar(length=budget, label=label, file=sys.stderr) as bar:
            previous = entry_for(tuning, checked, chip, dims)
            before = previous and previous.blocks.blocks
            given_start = {d: b for d, b in starts.items() if d in backend_named("tpu").tunable_dims(checked)}
            try:
                found = search(estimator, module, checked, dims, budget, bar.update, before, given_start)
            except CompileError as error:
                _usage_error(f"{checked.kernel.name}: {error}")
        best, start = found.best, found.start
        best_ratio = estimate.ratio(best.cost, found.xla_cost)
        started = (
            f"{estimate.describe_speedup(start.cost, found.xla_cost)}" if start.cost else f"rejected: {start.error}"
        )
        click.echo(
            f"{checked.kernel.name} on {chip} ({estimate.LABEL}): {_pairs(best.blocks)} {best.cost:,} cycles,"
            f" {estimate.describe_speedup(best.cost, found.xla_cost)} (XLA {found.xla_cost:,});"
            f" from {'the given' if given_start else 'the blocks tuned before' if previous else 'the untuned'}"
            f" {_pairs(start.blocks)}"
            f" {started}; {counted(len(found.trials), 'compile')}"
        )
        entry = _tuned_entry(found, best_ratio, (MEASURE, "cycles", "compiles"), chip, dims, best.blocks)
        tuning = with_entry(tuning, checked, entry)
    _write_tuning(path, tuning)


def _cuda_device_kind() -> str:
    """The device kind of this machine's CUDA GPU; a usage error without one."""
    from pallasgen.devices import gpu_tune

    try:
        return gpu_tune.cuda_device_kind()
    except gpu_tune.NoCudaDevice as error:
        _usage_error(str(error))


def _tuned_entry(found, ratio, measure: tuple[str, str, str], chip: str, dims, blocks, options=()):
    """The tuning entry that records a search's best (TPU or GPU): `measure` says by what
    (MEASURE), in which unit ("cycles", "seconds") and what its trials were ("compiles",
    "timings")."""
    from pallasgen.devices.tune import versions
    from pallasgen.workspace.tuning import Entry

    by, unit, trials = measure
    recorded = {
        "by": by,
        f"kernel_{unit}": found.best.cost,
        f"xla_{unit}": found.xla_cost,
        "ratio": None if ratio is None else round(ratio, 3),
        trials: len(found.trials),
    }
    return Entry(TunedBlocks(chip, tuple(dims.items()), blocks, options), recorded, versions())


def _tune_gpu(kernels, given: dict[str, int], budget: int, tuning, device: str, backend: str):
    """`tune --gpu`: each kernel's fastest blocks and options on the CUDA GPU of kind
    `device` for the GPU `backend` (Mosaic GPU: its products only, the others skipped
    with a note), recorded in `tuning` for that kind and backend; returns the tuning."""
    from pallasgen.devices import bench
    from pallasgen.devices.compile_only import CompileError
    from pallasgen.devices.gpu_tune import MEASURE, REPEATS, entry_parts, gpu_backend_named, tune_gpu
    from pallasgen.workspace.tuning import entry_for, with_entry

    table = gpu_backend_named(backend).name  # the backend whose tuned entries these are
    if backend == "mosaic_gpu":
        mosaic_gpu = backend_named("mosaic_gpu")
        for _, checked in kernels:
            if not mosaic_gpu.tunable_dims(checked):
                why = "no Mosaic GPU blocks to tune (only a product it takes has them)"
                click.echo(f"pallasgen: note: {checked.kernel.name}: {why}", err=True)
        kernels = [(module, checked) for module, checked in kernels if mosaic_gpu.tunable_dims(checked)]
        if not kernels:
            _usage_error("none of these kernels has Mosaic GPU blocks to tune (only a product it takes has them)")
    for module, checked in kernels:
        dims = {d: given[d] for d in checked.dims}
        inputs = _within_memory(checked, dims, lambda: runner.random_inputs(checked, dims, 0))
        previous = entry_for(tuning, checked, device, dims, table)
        with click.progressbar(
            length=budget, label=f"Timing {checked.kernel.name} on {device}", file=sys.stderr
        ) as bar:
            try:
                found = tune_gpu(
                    lambda first, second: bench.time_pair(first, second, REPEATS),
                    module,
                    checked,
                    inputs,
                    dims,
                    budget,
                    bar.update,
                    previous and previous.blocks,
                    backend,
                )
            except CompileError as error:
                _usage_error(f"{checked.kernel.name}: {error}")
        best = found.best
        blocks, options = entry_parts(checked, best.blocks, backend)
        ratio = found.xla_cost / best.cost if best.cost else None
        click.echo(
            f"{checked.kernel.name} on {device}: {', '.join(f'{k}={v}' for k, v in best.blocks)} {best.cost * 1e3:.3f} ms"
            f" (XLA {found.xla_cost * 1e3:.3f} ms, speedup over XLA {ratio:.2f}x); {counted(len(found.trials), 'timing')}"
        )
        entry = _tuned_entry(found, ratio, (MEASURE, "seconds", "timings"), device, dims, blocks, options)
        tuning = with_entry(tuning, checked, entry, table)
    return tuning


def _write_tuning(path: Path, tuning) -> None:
    from pallasgen.workspace.tuning import format_tuning

    try:
        write_atomically(path, format_tuning(tuning))
    except OSError as error:
        _usage_error(f"cannot write {_display(path)}: {error.strerror}")
    click.echo(f"wrote {_display(path)}; run `pallasgen build` to render it into the generated module")


def _check_start(checked, sizes: dict[str, int], starts: dict[str, int]) -> None:
    """A --block to start `tune` from is one its search could reach: a tiling multiple
    times a power of two below the size, or the whole size."""
    from pallasgen.devices.tune import block_choices

    for dim, block in starts.items():
        if dim not in backend_named("tpu").tunable_dims(checked):
            continue  # a kernel without the dimension, or one that takes it whole
        choices = block_choices(checked, dim, sizes[dim])
        if block not in choices:
            _usage_error(
                f"{checked.kernel.name}: --block {dim}={block} is not a block the search tries at {dim}={sizes[dim]}"
                f" (one of {', '.join(map(str, choices))})"
            )


def _pairs(blocks) -> str:
    """TPU blocks as the keywords that set them."""
    return ", ".join(f"{backend_named('tpu').block_keyword(d)}={b}" for d, b in blocks) or "(every dimension whole)"


@main.command(help=f"""Draw a kernel's arrays cut into blocks, its grid and its edge blocks as an SVG picture.

    SPEC[:KERNEL] names a spec file and one of its kernels (just SPEC if it holds one).

    Sizes not given with --size: two and a half blocks of each blocked dimension (so its
    last block is a ragged edge), three of a dimension blocked by one, {tilemap.WHOLE_SIZE}
    for one taken whole; with --gpu, the blocks are the GPU ones.
    """)
@click.argument("target", metavar="SPEC[:KERNEL]")
@_sizes
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The SVG file to write (default: KERNEL.svg here).",
)
@click.option("--gpu", is_flag=True, help="Draw the GPU (Triton) tiling instead of the TPU one.")
def show(target: str, sizes: tuple[str, ...], out_file: Path | None, gpu: bool) -> None:
    from pallasgen.show.tilesvg import render_svg

    _require_target("triton" if gpu else "tpu", "show --gpu" if gpu else "show (without --gpu)")
    checked = _one_kernel(target)
    try:
        tiles = tilemap.kernel_tiles(checked, tilemap.sizes_for(checked, _parse_sizes(sizes), gpu), gpu)
        picture = render_svg(tiles)
    except tilemap.ShowError as error:
        _usage_error(str(error))
    path = out_file if out_file is not None else Path(f"{checked.kernel.name}.svg")
    try:
        path.write_text(picture, encoding="utf-8")
    except OSError as error:
        _usage_error(f"cannot write {_display(path)}: {error.strerror}")
    click.echo(_display(path))


@main.command()
@click.option(
    "--out", required=True, type=click.Path(path_type=Path, file_okay=False), help="The folder to write the site to."
)
def playground(out: Path) -> None:
    """Write a static site that builds specs in the browser (Pyodide), the project's specs as examples.

    Serve it with any static server, e.g. `python -m http.server -d OUT`; it needs no
    network once served. Building it fetches Pyodide with npm and the wheels the build
    path needs with pip (both cached under the cache folder).
    """
    from pallasgen.playground.site import SiteError, build_site
    from pallasgen.workspace.cache import cache_dir

    try:
        config = load_config(Path.cwd())
    except ConfigError as error:
        _usage_error(str(error))
    try:
        build_site(out, config.specs, cache_dir() / "playground")
    except SiteError as error:
        _usage_error(f"cannot build the playground: {error}")
    click.echo(f"wrote {_display(out)}; serve it with `python -m http.server -d {_display(out)}`")


def _one_kernel(target: str):
    """The checked kernel SPEC:KERNEL names; SPEC alone if it holds one kernel."""
    spec_path, _, wanted = target.partition(":")
    targets = _config().targets
    kernels = _checked_kernels(
        spec_path, lambda: check_source(decode(Path(spec_path).read_bytes(), spec_path), spec_path, targets)
    )
    if not wanted and len(kernels) > 1:
        names = ", ".join(k.kernel.name for k in kernels)
        _usage_error(f"{spec_path} has {len(kernels)} kernels; name one as {spec_path}:KERNEL: {names}")
    return _named(kernels, spec_path, wanted)[0]


def _config(form: str = "text"):
    """The project's configuration here; a bad one is a usage error."""
    try:
        return load_config(Path.cwd())
    except ConfigError as error:
        _usage_error(str(error), form)


def _require_target(target: str, what: str) -> None:
    """A usage error if the project does not generate its kernels for `target`."""
    targets = _config().targets
    if target not in targets:
        _usage_error(
            f"{what} needs the {target!r} target, and this project's [tool.pallasgen] targets are"
            f" {', '.join(map(repr, targets))}"
        )


def _checked_kernels(spec_path: str, check):
    """`check()`'s result; an unreadable spec, a usage or a spec error exits 2 with its message."""
    try:
        return check()
    except OSError as error:
        _usage_error(f"{spec_path}: {error.strerror}")
    except UsageError as error:
        _usage_error(str(error))
    except SpecError as error:
        click.echo(error.render(), err=True)
        sys.exit(SPEC_OR_USAGE_ERROR)


def _named(kernels, spec_path: str, wanted: str) -> list:
    """The kernels named `wanted`, the spec's or one derived from them for jax.grad (all
    the spec's if it is empty); none is a usage error."""
    if not wanted:
        return list(kernels)
    matching = [k for k in every_kernel(kernels) if k.kernel.name == wanted]
    if not matching:
        names = ", ".join(k.kernel.name for k in kernels)
        derived = ", ".join(k.kernel.name for k in every_kernel(kernels) if k not in kernels)
        _usage_error(
            f"{spec_path} has no kernel named {wanted!r}; its kernels: {names}"
            + (f"; derived for jax.grad: {derived}" if derived else "")
        )
    return matching


def _kernels(targets: tuple[str, ...], out: Path | None, given: dict[str, int]) -> list:
    """(module, checked kernel) for each SPEC[:KERNEL]; every kernel of the default specs if none.

    A generated module that is missing or differs from its spec is generated in memory.
    """
    try:
        config = load_config(Path.cwd())
    except ConfigError as error:
        _usage_error(str(error))
    out_dir = out if out is not None else config.out
    if not targets:
        targets = tuple(str(p) for p in sorted(config.specs.glob("*.pallas")))
        if not targets:
            _usage_error(f"no spec files in {_display(config.specs)}; name one as SPEC[:KERNEL]")
    chosen = []
    for target in targets:
        spec_path, _, wanted = target.partition(":")
        if Path(spec_path).is_dir():
            _usage_error(f"{spec_path}: a folder; name a spec file in it, as SPEC[:KERNEL]")

        def check():
            (spec,), _ = collect_targets([Path(spec_path)], out_dir, _display)
            return (
                spec,
                check_source(decode(spec.spec.read_bytes(), spec_path), spec_path, config.targets),
                generate_targets([spec], _display, backend_targets=config.targets),
            )

        spec, kernels, modules = _checked_kernels(spec_path, check)
        matching = _named(kernels, spec_path, wanted)
        for change in [c for c in plan_changes([spec], modules, set(), out_dir) if c.path == spec.output]:
            state = "missing" if change.kind == "create" else "stale"
            click.echo(
                f"generated in memory: {_display(spec.output)} is {state}; run `pallasgen build` to write it",
                err=True,
            )
        module = runner.load_module(modules[spec.output], spec.output)
        chosen.extend((module, checked) for checked in matching)
    _check_sized_dimensions(given, [checked for _, checked in chosen])
    return chosen


def _check_sized_dimensions(given: dict[str, int], kernels: list) -> None:
    """Every --size names a dimension of some kernel being run."""
    for dim, size in given.items():
        if not any(dim in checked.dims for checked in kernels):
            described = " or ".join(f"{c.kernel.name} [{', '.join(c.dims)}]" for c in kernels)
            _usage_error(f"--size {dim}={size}: no dimension {dim} in {described}")


def _within_memory(checked, dims: dict[str, int], compute):
    """What `compute` returns; a usage error if the arrays of these sizes do not fit in memory."""
    try:
        return compute()
    except MemoryError:
        shape = ", ".join(f"{d}={n}" for d, n in dims.items())
        _usage_error(f"{checked.kernel.name} [{shape}]: the arrays do not fit in memory; give smaller --size values")


def _say_if_interpreted() -> None:
    import jax

    if jax.default_backend() == "cpu":
        click.echo("Ran in Pallas interpret mode on CPU: these times say nothing about TPU or GPU speed.")


def _parse_sizes(sizes: tuple[str, ...]) -> dict[str, int]:
    return _parse_dim_values("--size", sizes)


def _parse_blocks(blocks: tuple[str, ...]) -> dict[str, int]:
    return _parse_dim_values("--block", blocks)


def _parse_dim_values(option: str, items: tuple[str, ...]) -> dict[str, int]:
    """`DIM=N` items of a repeatable option, each dimension once, N a positive integer."""
    parsed = {}
    for item in items:
        dim, _, value = item.partition("=")
        if not dim.isidentifier() or not (value.isascii() and value.isdigit()) or int(value) < 1:
            _usage_error(f"{option} {item}: expected DIM=N, a dimension name and a positive integer")
        if dim in parsed:
            _usage_error(f"{option} {dim} is given twice")
        parsed[dim] = int(value)
    return parsed


def _require(command: str, tpu: bool) -> None:
    """A usage error saying what to install if jax (and libtpu, for `tpu`) is missing."""
    try:
        require(command, tpu)
    except MissingExtra as error:
        _usage_error(str(error))


def _usage_error(message: str, form: str = "text"):
    _report(form, Finding("error", message), f"pallasgen: error: {message}", err=True)
    sys.exit(SPEC_OR_USAGE_ERROR)


def _prepare(paths: tuple[Path, ...], out: Path | None, no_cache: bool, form: str):
    try:
        config = load_config(Path.cwd())
        out_dir = out if out is not None else config.out
        if out_dir.exists() and not out_dir.is_dir():
            raise UsageError(f"--out {_display(out_dir)}: not a folder")
        if not paths and not config.specs.exists():
            raise UsageError(no_spec_folder(config, _display))
        targets, owned = collect_targets(list(paths) or [config.specs], out_dir, _display)
        if not targets:
            raise UsageError(f"no spec files in {', '.join(map(str, paths or [config.specs]))}")
        progress = _Progress() if _stderr_is_terminal() else None
        try:
            modules = generate_targets(
                targets, _display, use_cache=not no_cache, progress=progress, backend_targets=config.targets
            )
        finally:
            if progress is not None:
                progress.wipe()
    except SpecErrors as errors:
        if form == "text":
            click.echo(str(errors), err=True)
        else:
            for error in errors.errors:
                for finding in spec_findings(error):
                    click.echo(formatted(finding, form))
        sys.exit(SPEC_OR_USAGE_ERROR)
    except (UsageError, ConfigError) as error:
        _usage_error(str(error), form)
    return targets, modules, plan_changes(targets, modules, owned, out_dir)


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class _Progress:
    """`building I/N SPEC` on one line of a terminal's stderr, rewritten in place, then wiped."""

    def __init__(self) -> None:
        self.shown = 0  # the length of the line on screen

    def __call__(self, number: int, total: int, spec: str) -> None:
        line = f"building {number}/{total} {spec}"[: shutil.get_terminal_size().columns - 1]
        click.echo("\r" + line.ljust(self.shown), nl=False, err=True)
        self.shown = len(line)

    def wipe(self) -> None:
        if self.shown:
            click.echo("\r" + " " * self.shown + "\r", nl=False, err=True)


def _display(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it,
    else as given or absolute."""
    cwd = Path.cwd()
    return str(path.relative_to(cwd)) if path.is_absolute() and path.is_relative_to(cwd) else str(path)
