"""Plans to Python source: Jinja2 templates (StrictUndefined), then black in-process."""

from __future__ import annotations

import re
import textwrap
from functools import cache
from importlib.resources import files

import black
import jinja2

from pallasgen.backends import ModulePlan
from pallasgen.frontend.text import escape_text
from pallasgen.lowering.gradient import DOC_WIDTH
from pallasgen.lowering.parts import LINE_LENGTH
from pallasgen.rendering.copies import without_copies
from pallasgen.rendering.shared import share_identical_functions

# The backends' modules a generated module imports where its code uses them.
_BACKEND_MODULES = ("pltpu", "pltriton", "plgpu")

BLACK_MODE = black.Mode(
    line_length=LINE_LENGTH,
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
    environment.filters["pyrepr"] = python_literal
    environment.filters["docstring"] = docstring
    environment.filters["pyrepr_tuple"] = lambda items: python_literal(tuple(items))
    environment.globals["line_length"] = LINE_LENGTH
    return environment


def render_module(plan: ModulePlan) -> str:
    """The generated module's source, black-formatted.

    Black formats each top-level piece on its own: the result is the text black gives
    the whole module, in a fraction of the time (tests check the equality).
    """
    header, kernels = _pieces(plan)
    # Black leaves two blank lines after the imports and between definitions.
    return "\n\n".join(map(format_code, [header, *kernels]))


def render_pieces(plan: ModulePlan) -> list[str]:
    """The unformatted module: its header (docstring and imports) and its kernels' pieces."""
    header, kernels = _pieces(plan)
    return [header, *kernels]


def _pieces(plan: ModulePlan) -> tuple[str, list[str]]:
    """The header, and one piece per kernel and per backend's functions of it."""
    environment = _environment()
    kernels = []
    for kernel in plan.kernels:  # its launchers, then its public function, which names them
        for name, template in zip(kernel.backends, plan.templates):
            kernels.append((kernel.name, environment.get_template(template).render(k=kernel, p=kernel.backends[name])))
        kernels.append((kernel.name, environment.get_template("public.py.j2").render(k=kernel)))
    kernels = share_identical_functions([(owner, without_copies(source)) for owner, source in kernels])
    code = "\n".join(kernels)
    used = {module for module in _BACKEND_MODULES if re.search(rf"\b{module}\.", code)}
    return environment.get_template("header.py.j2").render(module=plan, used=used), kernels


def format_code(source: str) -> str:
    return black.format_str(source, mode=BLACK_MODE)


def _wrapped(line: str) -> list[str]:
    """A docstring's line as it is, or in lines of DOC_WIDTH, each as indented as it."""
    if len(line) <= DOC_WIDTH:
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.wrap(line, DOC_WIDTH, initial_indent=indent, subsequent_indent=indent)


def python_literal(value) -> str:
    """`repr`, with strings in double quotes as black writes them (so black has less to do)."""
    if isinstance(value, tuple):
        items = [python_literal(item) for item in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, str) and value.isprintable() and not any(c in value for c in '"\\'):
        return f'"{value}"'
    return repr(value)


def docstring(lines: tuple[str, ...]) -> str:
    """A triple-quoted docstring whose text cannot end the string or escape from it, each
    line longer than DOC_WIDTH wrapped (a derived kernel's doc is one sentence a line).

    Tabs are expanded where Python 3.13 expands them on compiling (the indentation
    counts), so the docstring reads the same on every Python.
    """
    lines = tuple(piece for line in lines for piece in _wrapped(line))
    body = "\n".join(escape_text(line) for line in "\n    ".join(lines).expandtabs().split("\n")).rstrip()
    return f'"""{body}\n    """' if len(lines) > 1 else f'"""{body}"""'
