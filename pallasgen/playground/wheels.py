"""The wheels the build path needs in Pyodide, all pure Python (py3-none-any).

From PyPI, at the versions installed here (so the browser generates what the CLI does):
lark, Jinja2, black's pure-Python wheel and black's dependencies. Packed from this
installation: pallasgen itself, and MarkupSafe without its C speedups (it falls back to
its own pure-Python escaping; PyPI has no pure wheel of it).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib import metadata, resources
from pathlib import Path

# The distributions `pallasgen build` imports (black's for Python 3.12, Pyodide's).
FROM_PYPI = ("lark", "jinja2", "black", "click", "mypy_extensions", "packaging", "pathspec", "platformdirs", "pytokens")
# Files of a packed package: code, grammar, templates, type marker.
PACKED_SUFFIXES = (".py", ".lark", ".j2", ".typed")


class WheelError(Exception):
    """A wheel that could not be fetched or packed."""


def download(cache: Path) -> list[Path]:
    """The pure-Python wheels of FROM_PYPI at their installed versions, from `cache` or PyPI."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = []
    for name in FROM_PYPI:
        version = metadata.version(name)
        wheel = _cached_wheel(cache, name, version)
        if wheel is None:
            _pip_download(f"{name}=={version}", cache)
            wheel = _cached_wheel(cache, name, version)
            if wheel is None:
                raise WheelError(f"PyPI has no pure-Python wheel of {name} {version}")
        wheels.append(wheel)
    return wheels


def _cached_wheel(cache: Path, name: str, version: str) -> Path | None:
    stem = f"{name.replace('-', '_').lower()}-{version}-"
    found = [p for p in cache.glob("*-py3-none-any.whl") if p.name.lower().startswith(stem)]
    return found[0] if found else None


def _pip_download(requirement: str, cache: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(cache)]
    command += ["--only-binary=:all:", "--platform", "any", "--python-version", "3.12", requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise WheelError(f"cannot download {requirement} with pip (is PyPI reachable?): {why}")


def pack_installed(out: Path) -> list[Path]:
    """pallasgen and MarkupSafe's pure-Python part, as installed here, as wheels in `out`."""
    pallasgen = {
        "pallasgen": resources.files("pallasgen"),
        "pallasgen/templates": resources.files("pallasgen.templates"),
    }
    return [
        _pack("pallasgen", pallasgen, out),
        _pack("MarkupSafe", {"markupsafe": resources.files("markupsafe")}, out),
    ]


def _pack(distribution: str, folders: dict, out: Path) -> Path:
    """A py3-none-any wheel of `distribution` holding `folders` (path in the wheel -> files)."""
    version = metadata.version(distribution)
    name = distribution.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    entries: dict[str, bytes] = {}
    for prefix, folder in folders.items():
        for relative, data in _package_files(folder):
            entries[f"{prefix}/{relative}"] = data
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: pallasgen playground\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in entries.items():
            archive.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return wheel


def _package_files(folder, prefix: str = ""):
    """(relative path, bytes) of the packed files under `folder`, sorted, subpackages included."""
    for resource in sorted(folder.iterdir(), key=lambda r: r.name):
        if resource.is_dir() and resource.name != "__pycache__" and (resource / "__init__.py").is_file():
            yield from _package_files(resource, f"{prefix}{resource.name}/")
        elif resource.is_file() and resource.name.endswith(PACKED_SUFFIXES):
            yield prefix + resource.name, resource.read_bytes()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
