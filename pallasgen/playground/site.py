"""Writes the playground's static site: page, scripts, Pyodide runtime, wheels, examples.

Pyodide comes from the `pyodide` npm package (PYODIDE_VERSION), fetched with `npm pack`
into a cache folder at build time; the page never loads anything from another host.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from importlib import resources
from pathlib import Path

from pallasgen.playground import wheels
from pallasgen.workspace.tuning import tuning_path

PYODIDE_VERSION = "0.27.7"
# The files of the npm package that loadPyodide() reads.
PYODIDE_FILES = (
    "pyodide.js",
    "pyodide.asm.js",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
    "package.json",
)
PAGE_FILES = ("index.html", "playground.js", "worker.js")


class SiteError(Exception):
    """A site that cannot be built: no npm, no network, an unwritable folder."""


def build_site(out: Path, specs: Path, cache: Path) -> None:
    """The playground in `out`, with the specs in `specs` as its examples."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        pyodide = _pyodide_package(cache / "npm")
        _unpack_pyodide(pyodide, out / "pyodide")
        wheel_dir = out / "wheels"
        shutil.rmtree(wheel_dir, ignore_errors=True)
        wheel_dir.mkdir()
        built = [shutil.copy(w, wheel_dir) for w in wheels.download(cache / "wheels")]
        built += wheels.pack_installed(wheel_dir)
        for name in PAGE_FILES:
            (out / name).write_bytes(resources.files("pallasgen.playground").joinpath("static", name).read_bytes())
        (out / "site.json").write_text(json.dumps(_site_data(specs, built), indent=1) + "\n", encoding="utf-8")
    except wheels.WheelError as error:
        raise SiteError(str(error)) from None
    except OSError as error:
        raise SiteError(f"{error.filename or out}: {error.strerror}") from None


def _site_data(specs: Path, built: list) -> dict:
    """What the page and worker read: the wheels to install and the bundled examples."""
    examples = {}
    for spec in sorted(specs.glob("*.pallas")):
        tuning = tuning_path(spec)
        examples[spec.stem] = {
            "spec": spec.read_text(encoding="utf-8"),
            "tuning": tuning.read_text(encoding="utf-8") if tuning.is_file() else None,
        }
    return {"wheels": sorted(f"wheels/{Path(w).name}" for w in built), "examples": examples}


def _pyodide_package(cache: Path) -> Path:
    """The pyodide npm package's tarball, from `cache` or fetched there with `npm pack`."""
    tarball = cache / f"pyodide-{PYODIDE_VERSION}.tgz"
    if tarball.is_file():
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        raise SiteError(f"npm is not installed; it fetches Pyodide {PYODIDE_VERSION} (the `pyodide` npm package)")
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [npm, "pack", f"pyodide@{PYODIDE_VERSION}", "--pack-destination", str(cache)], capture_output=True, text=True
    )
    if result.returncode != 0 or not tarball.is_file():
        why = (result.stderr.strip().splitlines() or ["no tarball written"])[-1]
        raise SiteError(f"cannot fetch pyodide@{PYODIDE_VERSION} with npm (is the npm registry reachable?): {why}")
    return tarball


def _unpack_pyodide(tarball: Path, folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    try:
        with tarfile.open(tarball) as archive:
            for name in PYODIDE_FILES:
                member = archive.extractfile(f"package/{name}")
                if member is None:
                    raise SiteError(f"{tarball}: no package/{name}")
                (folder / name).write_bytes(member.read())
    except (tarfile.TarError, KeyError) as error:
        raise SiteError(f"{tarball}: not a usable pyodide package ({error}); delete it and build again") from None
