"""Where specs and generated modules live: `[tool.pallasgen]` in the nearest pyproject.toml."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pallasgen.frontend.text import escape_text
from pallasgen.runtime.constants import TARGETS

DEFAULT_SPECS = "specs"
DEFAULT_OUT = "generated"


class ConfigError(Exception):
    """A pyproject.toml that cannot be read or has a bad `[tool.pallasgen]` table."""


@dataclass(frozen=True)
class Config:
    specs: Path
    out: Path
    pyproject: Path | None = None  # where they were read from; None for the defaults
    targets: tuple[str, ...] = TARGETS  # what the kernels are generated for, in TARGETS' order


def no_spec_folder(config: Config, display=str) -> str:
    """The error for a configured (or default) spec folder that does not exist: how to configure one."""
    where = (
        "no pyproject.toml here or above, so the default; create one"
        if config.pyproject is None
        else f"from {display(config.pyproject)}; set it there"
    )
    return (
        f'no spec folder {display(config.specs)} ({where} with [tool.pallasgen] specs = "FOLDER" and'
        f' out = "FOLDER"), or name spec files or folders on the command line'
    )


def load_config(start: Path) -> Config:
    """The settings that apply in `start`: its nearest pyproject.toml's, or the defaults."""
    pyproject = find_pyproject(start.resolve())
    if pyproject is None:
        return Config(start / DEFAULT_SPECS, start / DEFAULT_OUT)
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("pallasgen", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from None
    root = pyproject.parent
    values = {}
    for key, default in (("specs", DEFAULT_SPECS), ("out", DEFAULT_OUT)):
        value = table.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{pyproject}: [tool.pallasgen] {key} must be a string")
        values[key] = root / value
    return Config(values["specs"], values["out"], pyproject, read_targets(table.get("targets", list(TARGETS)), pyproject))


def read_targets(value, pyproject: Path) -> tuple[str, ...]:
    """`[tool.pallasgen] targets`: a non-empty list of distinct names of TARGETS, in TARGETS' order."""
    allowed = ", ".join(f'"{name}"' for name in TARGETS)
    problem = f"{pyproject}: [tool.pallasgen] targets must be a non-empty list of distinct names among {allowed}"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{problem}, got {value!r}")
    for name in value:
        if name not in TARGETS:
            raise ConfigError(f"{problem}; {name!r} is not one")
        if value.count(name) > 1:
            raise ConfigError(f"{problem}; {name!r} is named twice")
    return tuple(name for name in TARGETS if name in value)


@cache
def find_pyproject(folder: Path) -> Path | None:
    """The nearest pyproject.toml in `folder` or above it."""
    for candidate in (folder, *folder.parents):
        if (candidate / "pyproject.toml").is_file():
            return candidate / "pyproject.toml"
    return None


def spec_label(spec: Path) -> str:
    """How generated headers name a spec: relative to its project's root, in POSIX form,
    with quotes, backslashes and unprintable characters escaped.

    It does not depend on the working directory or where the project is checked out.
    """
    spec = spec.resolve()
    pyproject = find_pyproject(spec.parent)
    label = spec.name if pyproject is None else spec.relative_to(pyproject.parent).as_posix()
    return escape_text(label)
