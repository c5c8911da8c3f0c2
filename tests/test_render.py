"""Rendering formats each top-level piece on its own: the result must be exactly what
black gives the whole module, so that speed never changes a byte of output."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasgen.workspace.pipeline import check_source
from pallasgen.backends import plan_module
from pallasgen.rendering.render import format_code, render_module, render_pieces

ROOT = Path(__file__).resolve().parents[1]


def plans():
    for spec in sorted((ROOT / "specs").glob("*.pallas")):
        yield spec.name, plan_module(f"specs/{spec.name}", check_source(spec.read_text(), spec.name))


@pytest.mark.parametrize(("name", "plan"), list(plans()), ids=lambda value: value if isinstance(value, str) else "")
def test_piecewise_formatting_equals_formatting_the_whole_module(name, plan):
    whole = "\n".join(render_pieces(plan))
    assert render_module(plan) == format_code(whole)
