"""Plans to Python source: Jinja2 templates (StrictUndefined), then black in-process."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import black
import jinja2

from pallasgen.backends import ModulePlan
from pallasgen.frontend.text import escape_text
from pallasgen.rendering.shared import share_identical_functions

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
    environment.filters["pyrepr"] = python_literal
    environment.filters["docstring"] = docstring
    return environment


def render_module(plan: ModulePlan) -> str:
    """The generated module's source, black-formatted.

    Black formats each top-level piece on its own, and each shared helper once per
    process: the result is the text black gives the whole module, in a fraction of
    the time (tests check the equality).
    """
    header, helpers, kernels = _pieces(plan)
    pieces = [format_code(header), *map(_format_once, helpers), *map(format_code, kernels)]
    # Black leaves one blank line after the module docstring and two between definitions.
    return pieces[0] + "\n" + "\n\n".join(pieces[1:])


def render_pieces(plan: ModulePlan) -> list[str]:
    """The unformatted module: its header, the helpers it calls, and its kernels' pieces."""
    header, helpers, kernels = _pieces(plan)
    return [header, *helpers, *kernels]


def _pieces(plan: ModulePlan) -> tuple[str, list[str], list[str]]:
    """The header; the imports and the shared helpers that the kernels call, directly or
    through other helpers; and one piece per kernel and per backend's functions of it."""
    environment = _environment()
    header = environment.get_template("header.py.j2").render(module=plan)
    kernels = []
    for kernel in plan.kernels:
        kernels.append((kernel.name, environment.get_template("public.py.j2").render(k=kernel)))
        for name, template in zip(kernel.backends, plan.templates):
            kernels.append((kernel.name, environment.get_template(template).render(k=kernel, p=kernel.backends[name])))
    kernels = share_identical_functions(kernels)
    imports, helpers = helper_definitions(plan.helpers)
    called = _called_helpers(helpers, set().union(*(_names(ast.parse(piece)) for piece in kernels)))
    return header, [imports, *(helper.source for name, helper in helpers.items() if name in called)], kernels


@dataclass(frozen=True)
class Helper:
    source: str  # its definition, unformatted
    calls: frozenset[str]  # the names in its code: the helpers it calls among them


def helper_definitions(values: dict[str, object]) -> tuple[str, dict[str, Helper]]:
    """templates/helpers.py.j2 rendered with `values`, cut at its top-level statements:
    the imports (and settings) every module needs, then each helper by the name it
    defines, in the template's order."""
    source = _environment().get_template("helpers.py.j2").render(**values)
    lines = source.splitlines()
    imports, helpers, start = [], {}, 0
    for node in ast.parse(source).body:
        text = "\n".join(lines[start : node.end_lineno])
        start = node.end_lineno
        if isinstance(node, (ast.FunctionDef, ast.Assign)):
            (name,) = [node.name] if isinstance(node, ast.FunctionDef) else [t.id for t in node.targets]
            helpers[name] = Helper(text.strip("\n") + "\n", frozenset(_names(node)))
        else:
            imports.append(text)
    return "\n".join(imports) + "\n", helpers


def _called_helpers(helpers: dict[str, Helper], names: set[str]) -> set[str]:
    """The helpers among `names`, and those they call in turn."""
    called, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in helpers and name not in called:
            called.add(name)
            pending.extend(helpers[name].calls)
    return called


def _names(tree: ast.AST) -> set[str]:
    """The names that code reads or binds (not those in strings: docstrings and comments
    may mention a helper without calling it)."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def format_code(source: str) -> str:
    return black.format_str(source, mode=BLACK_MODE)


@cache
def _format_once(source: str) -> str:
    return format_code(source)


def python_literal(value) -> str:
    """`repr`, with strings in double quotes as black writes them (so black has less to do)."""
    if isinstance(value, tuple):
        items = [python_literal(item) for item in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, str) and value.isprintable() and not any(c in value for c in '"\\'):
        return f'"{value}"'
    return repr(value)


def docstring(lines: tuple[str, ...]) -> str:
    """A triple-quoted docstring whose text cannot end the string or escape from it.

    Tabs are expanded where Python 3.13 expands them on compiling (the indentation
    counts), so the docstring reads the same on every Python.
    """
    body = "\n".join(escape_text(line) for line in "\n    ".join(lines).expandtabs().split("\n")).rstrip()
    return f'"""{body}\n    """' if len(lines) > 1 else f'"""{body}"""'
