"""Copies named once: where generated code computes a value under one name and copies it
to another that it goes by from then on (`acc_k = acc_k_ref[...]`, then `acc = acc_k`:
a reduction's result, then the spec's `let` that holds it), the value takes the second
name where it is computed and the copy goes.

Only a plain copy `y = x` in the same block of statements as `x = ...` (or `x, w = ...`),
where `x` is read nowhere else and `y` is bound nowhere else and read only after the copy,
in the whole top-level function (nested functions included): then renaming changes no value.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter


def without_copies(source: str) -> str:
    """`source` (a piece of a generated module, unformatted) with each such copy gone."""
    while True:
        found = next((c for node in ast.parse(source).body for c in _copies(node)), None)
        if found is None:
            return source
        source = _renamed(source, *found)


def _copies(function: ast.stmt):
    """Each (copy statement, the definition of the name it copies) in a top-level function."""
    if not isinstance(function, ast.FunctionDef):
        return
    names = [n for n in ast.walk(function) if isinstance(n, ast.Name)]
    uses = Counter(n.id for n in names)
    stores = Counter(n.id for n in names if isinstance(n.ctx, ast.Store))
    parameters = {a.arg for n in ast.walk(function) if isinstance(n, ast.arguments) for a in _arguments(n)}
    for block in _blocks(function):
        defined: dict[str, ast.Name] = {}  # each name an assignment in the block binds: where
        for statement in block:
            target = _single_name(statement)
            copied = statement.value.id if target and isinstance(statement.value, ast.Name) else None
            if (
                copied in defined
                and uses[copied] == 2
                and stores[target] == 1
                and not {copied, target} & parameters
                and all(n.lineno > statement.lineno for n in names if n.id == target and n is not statement.targets[0])
            ):
                yield statement, defined[copied]
            defined.update((n.id, n) for n in _bound_names(statement))


def _arguments(arguments: ast.arguments):
    extra = [a for a in (arguments.vararg, arguments.kwarg) if a]
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, *extra]


def _blocks(function: ast.FunctionDef):
    """Every list of statements in the function, nested ones included."""
    for node in ast.walk(function):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _bound_names(statement: ast.stmt) -> list[ast.Name]:
    """The names an assignment binds: its one target, or each name its tuple unpacks to."""
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return []
    target = statement.targets[0]
    elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
    return [e for e in elements if isinstance(e, ast.Name)]


def _single_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    return None


def _renamed(source: str, copy: ast.Assign, target: ast.Name) -> str:
    """`source` with `target` (where the copied name is bound) binding the copy's name, and
    the copy's line gone."""
    lines = source.splitlines(keepends=True)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    token = next(t for t in tokens if t.type == tokenize.NAME and t.start == (target.lineno, target.col_offset))
    row, column = token.start
    line = lines[row - 1]
    lines[row - 1] = line[:column] + copy.targets[0].id + line[column + len(token.string) :]
    del lines[copy.lineno - 1 : copy.end_lineno]
    return "".join(lines)
