"""Atomic file writes: a temporary file in the same folder, then a rename."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

# The name of write_atomically's temporary file for NAME: `.NAME.XXXXXXXX.tmp`, the
# middle part tempfile.mkstemp's random letters, digits and underscores. A build that is
# killed mid-write leaves one behind.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def temporary_of(path: Path) -> str | None:
    """The file name whose temporary file `path` is, or None if it is not one."""
    match = _TEMPORARY.fullmatch(path.name)
    return match and match["name"]


def write_atomically(path: Path, text: str) -> None:
    """Writes `text` so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
