"""The comment above each TPU grid says how its axes run, and says what the code does:
the axes it calls independent are the `parallel` ones of its dimension semantics, those
it says accumulate in order the `arbitrary` ones."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

GENERATED = Path(__file__).resolve().parents[1] / "generated"


def tpu_launchers() -> list:
    """Each bundled kernel's TPU launcher (`_NAME_tpu`): (module path, function name),
    found by its `def` line (parsing the modules is left to the tests that read them:
    collection, which every pytest-xdist worker repeats, would parse 1.6 MB of code)."""
    return [
        pytest.param(path, name, id=f"{path.stem}.{name}")
        for path in sorted(GENERATED.glob("*.py"))
        for name in re.findall(r"^def (\w+_tpu)\(", path.read_text(), re.M)
    ]


@functools.cache
def top_level_functions(path: Path) -> dict[str, str]:
    """Each function defined at the top level of the module at `path`: its source text
    (`ast.get_source_segment`, from the module's lines split once)."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            last = lines[node.end_lineno - 1].encode()[: node.end_col_offset].decode()
            found[node.name] = "".join(lines[node.lineno - 1 : node.end_lineno - 1]) + last
    return found


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
    """And the `def` lines find every top-level function named `_NAME_tpu`, no more."""
    found = [tuple(param.values) for param in tpu_launchers()]
    assert len(found) > 10
    parsed = [
        (p, name) for p in sorted(GENERATED.glob("*.py")) for name in top_level_functions(p) if name.endswith("_tpu")
    ]
    assert found == parsed


@pytest.mark.parametrize(("path", "name"), tpu_launchers())
def test_the_grid_comment_states_the_dimension_semantics(path, name):
    launcher = top_level_functions(path)[name]
    semantics = ast.literal_eval(re.search(r"compiler_params=rt\.tpu_params\(\s*(\([^)]*\))", launcher).group(1))
    assert semantics_the_comment_states(grid_comment(launcher)) == semantics
