"""Identical functions written once: where two kernels' private functions have the same
code (`add_f32` and `add_i32` take the same TPU kernel: a Ref's dtype is not in its code),
the module keeps the first and the other's callers call it.

Two top-level functions are identical when their docstrings and bodies are the same
Python (compared as ASTs, so formatting does not count), whatever their names and those
of their positional parameters and local variables: `_matmul_backward_y`'s kernel is
`_matmul_backward_x`'s, its refs named after the arrays of the kernel written first.
Keyword-only parameters keep their names, which callers bind. Only private functions
without decorators are shared: public functions are the module's API. Sharing one may
make its callers identical in turn (two launchers that differed only in the kernel they
call): those are shared as well, until no two are the same.
"""

from __future__ import annotations

import ast
import io
import tokenize


def share_identical_functions(pieces: list[tuple[str, str]]) -> list[str]:
    """The pieces' code (each `(owner, source)`: the kernel it is written for, and its
    unformatted source) with each private function identical to an earlier one left out
    and its uses calling that one; a piece left empty is left out too."""
    owners = [owner for owner, _ in pieces]
    sources = [source for _, source in pieces]
    sharers: dict[str, list[str]] = {}  # a kept function -> the kernels whose copy it replaces
    renaming: set[str] = set()  # the kept functions some of whose copies had other names in them
    while True:
        kept: dict[str, str] = {}  # a function's code -> the first function with it
        kept_nodes: dict[str, ast.FunctionDef] = {}
        renamed: dict[str, str] = {}
        dropped: list[list[ast.FunctionDef]] = []
        for owner, source in zip(owners, sources):
            dropped.append([])
            for node in ast.parse(source).body:
                if not _shareable(node):
                    continue
                kept_nodes.setdefault(node.name, node)
                first = kept.setdefault(_code(node), node.name)
                if first != node.name:
                    if node.name in renaming or _exact(node) != _exact(kept_nodes[first]):
                        renaming.add(first)
                    renamed[node.name] = first
                    dropped[-1].append(node)
                    sharers.setdefault(first, [])
                    sharers[first] += [o for o in [owner, *sharers.pop(node.name, [])] if o not in sharers[first]]
        if not renamed:
            break
        sources = [_rename(_without(source, nodes), renamed) for source, nodes in zip(sources, dropped)]
    sources = [_noted(source, sharers, renaming) for source in sources]
    return [source for source in sources if source.strip()]


def _shareable(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.decorator_list


def _code(node: ast.FunctionDef) -> str:
    """The function as Python, less its name, each of its own names (positional parameters,
    and what its body binds) numbered in the order it first appears."""
    own = {a.arg for a in [*node.args.posonlyargs, *node.args.args]}
    own |= {node.args.vararg.arg} if node.args.vararg else set()
    for inner in ast.walk(ast.Module([*node.body], type_ignores=[])):
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
            own.add(inner.id)
        elif isinstance(inner, (ast.FunctionDef, ast.Lambda)):
            own |= {inner.name} if isinstance(inner, ast.FunctionDef) else set()
            own |= {a.arg for a in [*inner.args.posonlyargs, *inner.args.args]}
    numbers: dict[str, str] = {}
    copy = ast.parse(ast.unparse(node)).body[0]
    for inner in ast.walk(copy):
        for field, name in (("id", getattr(inner, "id", None)), ("arg", getattr(inner, "arg", None))):
            if isinstance(name, str) and name in own and not _keyword_only(copy, inner):
                setattr(inner, field, numbers.setdefault(name, f"_{len(numbers)}"))
        if isinstance(inner, ast.FunctionDef) and inner is not copy and inner.name in own:
            inner.name = numbers.setdefault(inner.name, f"_{len(numbers)}")
    return ast.dump(ast.Module([*copy.body], type_ignores=[])) + ast.dump(copy.args)


def _exact(node: ast.FunctionDef) -> str:
    """The function as Python, less its name: names and all."""
    return ast.dump(ast.Module([*node.body], type_ignores=[])) + ast.dump(node.args)


def _keyword_only(function: ast.FunctionDef, node: ast.AST) -> bool:
    """Whether `node` is a keyword-only parameter of `function`, or a keyword argument:
    names that callers and callees bind."""
    return node in function.args.kwonlyargs or isinstance(node, ast.keyword)


def _without(source: str, nodes: list[ast.FunctionDef]) -> str:
    """`source` less the lines of `nodes` (top-level definitions) and the comment lines
    right above each."""
    lines = source.splitlines(keepends=True)
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        start = node.lineno - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        del lines[start : node.end_lineno]
    return "".join(lines)


def _rename(source: str, renamed: dict[str, str]) -> str:
    """`source` with each name in `renamed` (as code names it, not in strings or comments)
    replaced."""
    lines = source.splitlines(keepends=True)
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.NAME]
    for token in reversed([t for t in tokens if t.string in renamed]):
        row, column = token.start
        line = lines[row - 1]
        lines[row - 1] = line[:column] + renamed[token.string] + line[column + len(token.string) :]
    return "".join(lines)


def _noted(source: str, sharers: dict[str, list[str]], renaming: set[str]) -> str:
    """A comment above each function that others' code calls in place of their own copy
    (which named its parameters or variables otherwise, for those in `renaming`)."""
    lines = source.splitlines(keepends=True)
    for node in sorted(ast.parse(source).body, key=lambda n: n.lineno, reverse=True):
        if isinstance(node, ast.FunctionDef) and node.name in sharers:
            but = " but for its names" if node.name in renaming else ""
            note = f"# Also {_listed(sharers[node.name])}: the same code{but}, written once.\n"
            lines.insert(node.lineno - 1, note)
    return "".join(lines)


def _listed(names: list[str]) -> str:
    quoted = [f"`{name}`'s" for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
