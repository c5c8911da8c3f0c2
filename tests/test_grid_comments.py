"""The comment above each TPU grid says how its axes run, and says what the code does:
the axes it calls independent are the `parallel` ones of `dimension_semantics`, those
it says accumulate in order the `arbitrary` ones."""

from __future__ import annotations

import ast
import re

import pytest

from kernel_cases import GENERATED


def tpu_launchers() -> list:
    """Each bundled kernel's TPU launcher (`_NAME_tpu`), as source text."""
    launchers = []
    for path in sorted(GENERATED.glob("*.py")):
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_tpu"):
                launchers.append(pytest.param(ast.get_source_segment(source, node), id=f"{path.stem}.{node.name}"))
    return launchers


def grid_comment(launcher: str) -> str:
    """The comment lines between `pl.pallas_call(` and `grid=`, as one line."""
    between = launcher[launcher.index("pl.pallas_call(") : launcher.index("grid=")]
    return " ".join(line.strip().removeprefix("# ") for line in between.splitlines() if line.strip().startswith("#"))


def semantics_the_comment_states(comment: str) -> tuple[str, ...]:
    """Each grid axis's semantics as the comment states them, in the grid's order."""
    if comment == "A single step: every dimension is taken whole.":
        return ()
    axes = re.findall(r"(?:block|element) of (\w+)", comment.split(".")[0].split(";")[0])
    if comment.endswith("steps are independent, so every axis is parallel."):
        return ("parallel",) * len(axes)
    said = {}
    for listed, kind in re.findall(
        r"[Ss]teps along ([\w, ]+?) (?:are independent|accumulate in order) \((\w+)\)", comment
    ):
        said.update((axis, kind) for axis in listed.split(", "))
    assert set(said) == set(axes), comment
    return tuple(said[axis] for axis in axes)


def test_every_bundled_module_has_tpu_launchers():
    assert len(tpu_launchers()) > 10


@pytest.mark.parametrize("launcher", tpu_launchers())
def test_the_grid_comment_states_the_dimension_semantics(launcher):
    semantics = ast.literal_eval(re.search(r"dimension_semantics=(\([^)]*\))", launcher).group(1))
    assert semantics_the_comment_states(grid_comment(launcher)) == semantics
