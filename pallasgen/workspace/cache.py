"""A content-addressed cache of generated modules, so unchanged specs skip black.

The key hashes everything that decides a module's text: the spec's bytes and label,
its tuning file, the targets it is generated for, pallasgen's own code and templates, and the versions of black,
Jinja2 and Lark. A hit therefore gives exactly what generating would; deleting the cache is always safe.

Each entry's first line is the SHA-256 of the text below it: an entry that was edited,
truncated or half-written does not match it and is ignored (and rebuilt), never used.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import metadata
from importlib.resources import files
from pathlib import Path

from pallasgen.runtime.constants import TARGETS
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


def key(source: str, label: str, tuning: str = "", targets: tuple[str, ...] = TARGETS) -> str:
    """The cache key of a spec's module: its text, label, tuning file's text and targets."""
    material = f"{generator_fingerprint()}\0{label}\0{source}\0{tuning}\0{','.join(targets)}".encode()
    return hashlib.sha256(material).hexdigest()


def load(cache_key: str) -> str | None:
    """The module stored under `cache_key`; None if there is none or it fails its hash."""
    try:
        data = (cache_dir() / f"{cache_key}.py").read_bytes()
    except OSError:
        return None
    recorded, newline, body = data.partition(b"\n")
    if not newline or recorded != _digest(body).encode():
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _digest(body: bytes) -> str:
    return "# sha256:" + hashlib.sha256(body).hexdigest()


def store(cache_key: str, text: str) -> None:
    """Saves a module; a cache that cannot be written is simply not used."""
    try:
        write_atomically(cache_dir() / f"{cache_key}.py", f"{_digest(text.encode())}\n{text}")
    except OSError:
        pass
