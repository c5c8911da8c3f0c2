"""What the playground's Web Worker calls inside Pyodide: the CLI's build and show, on
one spec held in memory instead of a project on disk.

The spec is written into a throwaway project (`specs/NAME.pallas`, its tuning file if
it has one, a pyproject.toml naming `specs`) so that `collect_targets` and
`generate_targets`, the functions `pallasgen build` runs, label and generate it exactly
as the CLI does: the code is byte-identical to `generated/NAME.py`, and diagnostics are
the text the CLI prints.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pallasgen.frontend.errors import SpecError
from pallasgen.show import tilemap
from pallasgen.show.tilesvg import render_svg
from pallasgen.workspace.pipeline import check_source
from pallasgen.workspace.sync import SpecErrors, UsageError, collect_targets, generate_targets, stale_tunings
from pallasgen.workspace.tuning import tuning_path

PYPROJECT = '[tool.pallasgen]\nspecs = "specs"\nout = "generated"\n'


def build(name: str, source: str, tuning: str | None = None) -> dict:
    """`pallasgen build` of `specs/NAME.pallas` holding `source` (and `tuning`, its tuning
    file's text): {"code": the module or "", "diagnostics": the errors, or the warnings of
    a stale tuning file, as the CLI prints them, or ""}."""
    with tempfile.TemporaryDirectory() as root:
        spec = Path(root, "specs", f"{name}.pallas")
        spec.parent.mkdir()
        spec.write_text(source, encoding="utf-8")
        Path(root, "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
        if tuning is not None:
            tuning_path(spec).write_text(tuning, encoding="utf-8")
        display = _relative_to(Path(root).resolve())
        try:
            targets, _ = collect_targets([spec], Path(root, "generated"), display)
            (code,) = generate_targets(targets, display, use_cache=False).values()
            stale = stale_tunings(targets, display)
        except SpecErrors as errors:
            return {"code": "", "diagnostics": str(errors)}
        except UsageError as error:
            return {"code": "", "diagnostics": f"pallasgen: error: {error}"}
    return {"code": code, "diagnostics": "\n".join(f"warning: {s.file}: {s.left_out}" for s in stale)}


def tiling(name: str, source: str, kernel: str | None = None) -> dict:
    """The kernels of a spec and the `pallasgen show` picture of `kernel` (the first if
    it is None or not among them): {"kernels": names, "kernel": shown, "svg": SVG or ""}."""
    try:
        kernels = check_source(source, f"specs/{name}.pallas")
    except SpecError:
        return {"kernels": [], "kernel": None, "svg": ""}
    names = [checked.kernel.name for checked in kernels]
    if not names:
        return {"kernels": [], "kernel": None, "svg": ""}
    chosen = kernels[names.index(kernel)] if kernel in names else kernels[0]
    try:
        svg = render_svg(tilemap.kernel_tiles(chosen, tilemap.sizes_for(chosen, {}, False), False))
    except tilemap.ShowError as error:
        svg = f"<p>{_escaped(str(error))}</p>"
    return {"kernels": names, "kernel": chosen.kernel.name, "svg": svg}


def _relative_to(root: Path):
    """Paths as the CLI shows them when run in the project's root: relative to it."""

    def display(path: Path) -> str:
        path = Path(os.path.abspath(path))
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    return display


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
