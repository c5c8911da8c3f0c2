"""Plans to Python source: Jinja2 templates (StrictUndefined), then black in-process."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import black
import jinja2

from .plan import ModulePlan

BLACK_MODE = black.Mode(
    line_length=100,
    target_versions={black.TargetVersion.PY311},
    magic_trailing_comma=False,
)


@cache
def _environment() -> jinja2.Environment:
    templates = files("pallasgen.templates")
    environment = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: templates.joinpath(name).read_text(encoding="utf-8")),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["pyrepr"] = repr
    environment.filters["docstring"] = docstring
    return environment


def render_module(plan: ModulePlan) -> str:
    """The generated module's source, black-formatted."""
    source = _environment().get_template("module.py.j2").render(module=plan)
    return black.format_str(source, mode=BLACK_MODE)


def docstring(lines: tuple[str, ...]) -> str:
    """A triple-quoted docstring whose text cannot end the string or escape from it."""
    escaped = [_escape(line) for line in lines]
    body = "\n    ".join(escaped).rstrip()
    return f'"""{body}\n    """' if len(escaped) > 1 else f'"""{body}"""'


def _escape(line: str) -> str:
    out = []
    for char in line:
        if char in '\\"':
            out.append("\\" + char)
        elif char.isprintable() or char == " ":
            out.append(char)
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)
