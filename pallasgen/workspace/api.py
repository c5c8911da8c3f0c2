"""pallasgen's Python API: `pallasgen.build` and `pallasgen.check`, what the commands do,
for a project folder. Neither imports jax."""

from __future__ import annotations

import os
from pathlib import Path

from pallasgen.workspace.config import load_config, no_spec_folder
from pallasgen.workspace.sync import Change, UsageError, apply, collect_targets, generate_targets, plan_changes


def build(paths=(), *, project: str | os.PathLike = ".", out=None, use_cache: bool = True) -> list[Change]:
    """`pallasgen build` in `project`: writes the modules of `paths` (spec files or folders,
    relative to `project`; default `[tool.pallasgen] specs`) into `out` (default
    `[tool.pallasgen] out`) and removes stale ones; returns what it changed.

    Raises `pallasgen.SpecErrors` (every failing spec's diagnostics; nothing is written),
    `pallasgen.UsageError` or `pallasgen.ConfigError`.
    """
    changes = _plan(paths, project, out, use_cache)
    apply(changes)
    return changes


def check(paths=(), *, project: str | os.PathLike = ".", out=None, use_cache: bool = True) -> list[Change]:
    """`pallasgen check` in `project`: what `build` would change (each a `Change` of kind
    "create", "update" or "remove", with the old and new text); empty if every generated
    module matches its spec. Raises as `build` does; writes nothing."""
    return _plan(paths, project, out, use_cache)


def _plan(paths, project, out, use_cache: bool) -> list[Change]:
    root = Path(project).resolve()
    config = load_config(root)
    out_dir = root / out if out is not None else config.out
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a folder")
    if not paths and not config.specs.exists():
        raise UsageError(no_spec_folder(config))
    given = [root / path for path in paths] or [config.specs]
    targets, owned = collect_targets(given, out_dir, _relative_to(root))
    if not targets:
        raise UsageError(f"no spec files in {', '.join(map(str, given))}")
    modules = generate_targets(targets, _relative_to(root), use_cache=use_cache, backend_targets=config.targets)
    return plan_changes(targets, modules, owned, out_dir)


def _relative_to(root: Path):
    def display(path: Path) -> str:
        path = Path(os.path.abspath(path))
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    return display
