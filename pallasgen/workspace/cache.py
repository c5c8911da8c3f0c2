"""A content-addressed cache of generated modules, so unchanged specs skip black.

The key hashes everything that decides a module's text: the spec's bytes and label,
its tuning file, pallasgen's own code and templates, and the versions of black,
Jinja2 and Lark. A hit therefore gives exactly what generating would; deleting the cache is always safe.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import metadata
from importlib.resources import files
from pathlib import Path

from pallasgen.workspace.atomic import write_atomically

ENVIRONMENT_VARIABLE = "PALLASGEN_CACHE_DIR"


def cache_dir() -> Path:
    """`$PALLASGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/pallasgen`, else `~/.cache/pallasgen`."""
    if os.environ.get(ENVIRONMENT_VARIABLE):
        return Path(os.environ[ENVIRONMENT_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pallasgen"


@cache
def generator_fingerprint() -> str:
    """A hash of pallasgen's code, grammar and templates and of the libraries that shape output."""
    digest = hashlib.sha256()
    for package in ("pallasgen", "pallasgen.templates"):
        for name, data in _source_files(files(package)):
            digest.update(name.encode() + b"\0" + data + b"\0")
    for distribution in ("black", "jinja2", "lark"):
        digest.update(f"{distribution}={metadata.version(distribution)}\0".encode())
    return digest.hexdigest()


def _source_files(folder, prefix: str = ""):
    """(relative path, bytes) of every code, grammar and template file under `folder`, sorted."""
    for resource in sorted(folder.iterdir(), key=lambda r: r.name):
        if resource.is_dir() and resource.name != "__pycache__":
            yield from _source_files(resource, f"{prefix}{resource.name}/")
        elif resource.is_file() and resource.name.endswith((".py", ".lark", ".j2")):
            yield prefix + resource.name, resource.read_bytes()


def key(source: str, label: str, tuning: str = "") -> str:
    """The cache key of a spec's module: its text, label and tuning file's text."""
    material = f"{generator_fingerprint()}\0{label}\0{source}\0{tuning}".encode()
    return hashlib.sha256(material).hexdigest()


def load(cache_key: str) -> str | None:
    try:
        return (cache_dir() / f"{cache_key}.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def store(cache_key: str, text: str) -> None:
    """Saves a module; a cache that cannot be written is simply not used."""
    try:
        write_atomically(cache_dir() / f"{cache_key}.py", text)
    except OSError:
        pass
