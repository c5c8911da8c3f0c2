"""The `pallasgen` command: wires the stages together, prints, and sets the exit code.

Exit codes: 0 success, 1 `check` found drift, 2 a spec or usage error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .config import ConfigError, load_config
from .errors import SpecError
from .pipeline import check_source, decode
from .sync import (
    SpecErrors,
    UsageError,
    apply,
    collect_targets,
    generate_targets,
    plan_changes,
    unified_diff,
)

SPEC_OR_USAGE_ERROR = 2
DRIFT = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Generate JAX Pallas kernels from spec files."""


_paths = click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
_out = click.option("--out", type=click.Path(path_type=Path, file_okay=False), help="Output folder.")
_no_cache = click.option(
    "--no-cache", is_flag=True, help="Generate every module afresh; neither read nor write the cache."
)


@main.command()
@_paths
@_out
@_no_cache
def build(paths: tuple[Path, ...], out: Path | None, no_cache: bool) -> None:
    """Write generated modules for PATHS (spec files or folders; default from pyproject.toml)."""
    targets, modules, changes = _prepare(paths, out, no_cache)
    try:
        apply(changes)
    except OSError as error:
        _usage_error(f"cannot write {_display(Path(error.filename or ''))}: {error.strerror}")
    for change in changes:
        verb = {"create": "wrote", "update": "updated", "remove": "removed stale"}[change.kind]
        click.echo(f"{verb} {_display(change.path)}")
    click.echo(f"pallasgen: {len(targets)} specs, {len(changes)} files changed")


@main.command()
@_paths
@_out
@click.option("--quiet", "-q", is_flag=True, help="Print only the summary.")
@_no_cache
def check(paths: tuple[Path, ...], out: Path | None, quiet: bool, no_cache: bool) -> None:
    """Exit 1 if generated modules differ from what PATHS would generate."""
    targets, modules, changes = _prepare(paths, out, no_cache)
    for change in changes if not quiet else ():
        if change.kind == "create":
            click.echo(f"{_display(change.path)}: missing; {change.spec_label} generates it")
        elif change.kind == "remove":
            click.echo(f"{_display(change.path)}: stale; its spec {change.spec_label} no longer exists")
        else:
            click.echo(f"{_display(change.path)}: differs from what {change.spec_label} generates")
            click.echo(unified_diff(change, _display), nl=False)
    if changes:
        counts = {kind: sum(c.kind == kind for c in changes) for kind in ("update", "create", "remove")}
        click.echo(
            f"pallasgen check: {len(changes)} files out of date ({counts['update']} changed,"
            f" {counts['create']} missing, {counts['remove']} stale); run `pallasgen build`"
        )
        sys.exit(DRIFT)
    click.echo(f"pallasgen check: {len(targets)} generated files match their specs")


_targets = click.argument("targets", nargs=-1, metavar="SPEC[:KERNEL]...")
_sizes = click.option("--size", "sizes", multiple=True, metavar="DIM=N", help="A dimension's size (repeatable).")
_seed = click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")


@main.command()
@_targets
@_sizes
@_seed
@_out
def run(targets: tuple[str, ...], sizes: tuple[str, ...], seed: int, out: Path | None) -> None:
    """Run generated kernels on random inputs and compare them with their references.

    Exits 1 if any output differs from the reference by more than its dtype allows.
    """
    from . import runner

    failed = False
    for module, checked in _kernels(targets, out):
        dims = runner.sizes_for(checked, _parse_sizes(sizes))
        for result in runner.run_kernel(module, checked, dims, seed):
            failed |= not result.ok
            shape = ", ".join(f"{d}={dims[d]}" for d in checked.dims)
            verdict = "OK" if result.ok else f"MISMATCH in {result.mismatches} elements"
            click.echo(
                f"{result.kernel}.{result.output} [{shape}]: max |kernel - reference| ="
                f" {result.max_error:.3g} (allowed {result.tolerance:.0e} x (1 + |reference|)) {verdict},"
                f" {result.seconds * 1e3:.1f} ms for the first call, compilation included"
            )
    _say_if_interpreted()
    sys.exit(DRIFT if failed else 0)


@main.command()
@_targets
@_sizes
@_seed
@_out
@click.option("--repeats", default=20, show_default=True, help="Timed calls of each function.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Also write results here.")
@click.option("--sweep", is_flag=True, help="Try candidate block sizes (and GPU options); print the best.")
@click.option("--block", "blocks", multiple=True, metavar="DIM=N", help="A TPU block size (repeatable).")
@click.option(
    "--chip",
    type=click.Choice(["v5e", "v6e"]),
    help="Instead of timing, compile for this TPU (no TPU needed) and print the compiler's cycle estimates.",
)
@click.option("--vmem-limit", type=click.IntRange(min=1), metavar="MIB", help="With --chip: the kernel's scoped VMEM limit.")
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
) -> None:
    """Time generated kernels against XLA (their jitted reference) on this machine's device.

    With --chip, compile them and their references for that TPU instead and compare the
    compiler's estimated cycles.
    """
    if chip is not None:
        if sweep:
            _usage_error("--sweep times kernels; it cannot be combined with --chip")
        _estimate(_kernels(targets, out), _parse_sizes(sizes), _parse_blocks(blocks), chip, vmem_limit, json_path)
        return
    if vmem_limit is not None:
        _usage_error("--vmem-limit needs --chip")
    import json

    import jax

    from . import bench as benchmark
    from . import runner

    device = jax.devices()[0].device_kind
    kernels = _kernels(targets, out)
    options = _parse_blocks(blocks)
    if sweep:
        _sweep(kernels, _parse_sizes(sizes), seed, repeats, device)
        return
    timings = []
    with click.progressbar(kernels, label=f"Timing on {device}", file=sys.stderr) as progress:
        for module, checked in progress:
            dims = runner.sizes_for(checked, _parse_sizes(sizes))
            inputs = runner.random_inputs(checked, dims, seed)
            timings.append(benchmark.time_kernel(module, checked, dims, inputs, repeats, _block_options(checked, options)))
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
                "ratio_to_xla": t.ratio,
                "flops": t.flops,
                "bytes": t.bytes_moved,
            }
            for t in timings
        ]
        payload = {"device": device, "jax": jax.__version__, "backend": jax.default_backend(), "results": records}
        json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _sweep(kernels, given: dict[str, int], seed: int, repeats: int, device: str) -> None:
    import jax

    from . import bench as benchmark
    from . import runner

    backend = "gpu" if jax.default_backend() == "gpu" else "tpu"
    for module, checked in kernels:
        dims = runner.sizes_for(checked, given)
        inputs = runner.random_inputs(checked, dims, seed)
        candidates = benchmark.sweep_candidates(checked, backend)
        with click.progressbar(length=len(candidates), label=f"Sweeping {checked.kernel.name}", file=sys.stderr) as bar:
            (seconds, options), xla_seconds = benchmark.sweep(module, checked, inputs, candidates, repeats, bar)
        shape = ", ".join(f"{d}={n}" for d, n in dims.items())
        chosen = ", ".join(f"{k}={v}" for k, v in options.items())
        click.echo(
            f"{checked.kernel.name} [{shape}] on {device}: best of {len(candidates)} is {chosen}:"
            f" {seconds * 1e3:.3f} ms, {xla_seconds / seconds:.2f}x XLA"
        )
    _say_if_interpreted()


def _estimate(kernels, given: dict[str, int], blocks: dict[str, int], chip: str, vmem_mib, json_path) -> None:
    import json
    import tempfile

    from . import estimate
    from . import runner

    records = []
    with tempfile.TemporaryDirectory(prefix="pallasgen-llo-") as profile_dir:
        estimator = estimate.Estimator(chip, Path(profile_dir))
        click.echo(f"TPU {chip}, {estimate.LABEL}")
        for module, checked in kernels:
            dims = runner.sizes_for(checked, given)
            limit = vmem_mib * 1024 * 1024 if vmem_mib else None
            result = estimator.estimate(module, checked, dims, _block_options(checked, blocks), limit)
            click.echo(estimate.describe(result))
            percent, peak = estimate.percent_of_peak(result)
            records.append(
                {
                    "kernel": result.kernel,
                    "sizes": result.sizes,
                    "blocks": _block_options(checked, blocks),
                    "kernel_cycles": result.kernel_cycles,
                    "mosaic_cycles": result.mosaic_cycles,
                    "xla_cycles": result.xla_cycles,
                    "ratio_kernel_to_xla": result.ratio,
                    "percent_of_peak": percent,
                    "peak": peak,
                }
            )
    if json_path is not None:
        payload = {"chip": chip, "what": estimate.LABEL, "vmem_limit_mib": vmem_mib, "results": records}
        json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _block_options(checked, blocks: dict[str, int]) -> dict[str, int]:
    """The `block_*` keywords among --block that this kernel has (a kernel without a dim ignores it)."""
    from .names import block_keyword

    return {block_keyword(d): n for d, n in blocks.items() if d in checked.blocks}


def _kernels(targets: tuple[str, ...], out: Path | None) -> list:
    """(module, checked kernel) for each SPEC[:KERNEL]; every kernel of the default specs if none."""
    from . import runner

    config = load_config(Path.cwd())
    out_dir = out if out is not None else config.out
    if not targets:
        targets = tuple(str(p) for p in sorted(config.specs.glob("*.pallas")))
    chosen = []
    for target in targets:
        spec_path, _, wanted = target.partition(":")
        spec = Path(spec_path)
        try:
            kernels = check_source(decode(spec.read_bytes(), spec_path), spec_path)
        except OSError as error:
            _usage_error(f"{spec_path}: {error.strerror}")
        except SpecError as error:
            click.echo(error.render(), err=True)
            sys.exit(SPEC_OR_USAGE_ERROR)
        matching = [k for k in kernels if not wanted or k.kernel.name == wanted]
        if not matching:
            _usage_error(f"{spec_path} has no kernel named {wanted!r}")
        module = runner.load_module(_up_to_date_module(spec, out_dir))
        chosen.extend((module, checked) for checked in matching)
    return chosen


def _say_if_interpreted() -> None:
    import jax

    if jax.default_backend() == "cpu":
        click.echo("Ran in Pallas interpret mode on CPU: these times say nothing about TPU or GPU speed.")


def _parse_sizes(sizes: tuple[str, ...]) -> dict[str, int]:
    parsed = {}
    for item in sizes:
        dim, _, value = item.partition("=")
        if not dim or not value.isdigit() or int(value) < 1:
            _usage_error(f"--size {item}: expected DIM=N with N a positive integer")
        parsed[dim] = int(value)
    return parsed


def _parse_blocks(blocks: tuple[str, ...]) -> dict[str, int]:
    parsed = {}
    for item in blocks:
        dim, _, value = item.partition("=")
        if not dim or not value.isdigit() or int(value) < 1:
            _usage_error(f"--block {item}: expected DIM=N with N a positive integer")
        parsed[dim] = int(value)
    return parsed


def _up_to_date_module(spec: Path, out_dir: Path) -> Path:
    try:
        targets, _ = collect_targets([spec], out_dir, _display)
        (module_text,) = generate_targets(targets, _display).values()
    except (UsageError, SpecErrors) as error:
        _usage_error(str(error))
    path = targets[0].output
    if not path.exists() or path.read_text(encoding="utf-8") != module_text:
        _usage_error(f"{_display(path)} is missing or out of date; run `pallasgen build` first")
    return path


def _usage_error(message: str):
    click.echo(f"pallasgen: error: {message}", err=True)
    sys.exit(SPEC_OR_USAGE_ERROR)


def _prepare(paths: tuple[Path, ...], out: Path | None, no_cache: bool):
    try:
        config = load_config(Path.cwd())
        out_dir = out if out is not None else config.out
        if out_dir.exists() and not out_dir.is_dir():
            raise UsageError(f"--out {_display(out_dir)}: not a folder")
        targets, owned = collect_targets(list(paths) or [config.specs], out_dir, _display)
        if not targets:
            raise UsageError(f"no spec files in {', '.join(map(str, paths or [config.specs]))}")
        modules = generate_targets(targets, _display, use_cache=not no_cache)
    except SpecErrors as errors:
        click.echo(str(errors), err=True)
        sys.exit(SPEC_OR_USAGE_ERROR)
    except (UsageError, ConfigError) as error:
        click.echo(f"pallasgen: error: {error}", err=True)
        sys.exit(SPEC_OR_USAGE_ERROR)
    return targets, modules, plan_changes(targets, modules, owned, out_dir)


def _display(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return os.path.relpath(path, Path.cwd()) if path.is_absolute() else str(path)
    except ValueError:
        return str(path)
