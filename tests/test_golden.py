"""The committed generated/ is exactly what the repository's specs/ build to.

A failure here means a spec, a template or pallasgen changed without
`pallasgen build` being run, or someone edited a generated file by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pallasgen.workspace.pipeline import Tuning, decode, generate
from pallasgen.workspace.sync import generated_from
from pallasgen.workspace.tuning import tuning_path

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.pallas"))
GENERATED = ROOT / "generated"


def test_the_repository_has_specs_to_check():
    assert SPECS


def test_pallasgen_check_passes_on_the_repository(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from pallasgen.cli import main; main()", "check"],
        cwd=ROOT,
        env={**os.environ, "PALLASGEN_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"pallasgen check: {len(SPECS)} generated files match their specs"


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_committed_module_equals_what_its_spec_generates(spec):
    label = f"specs/{spec.name}"
    tuning = tuning_path(spec)
    tuned = Tuning(tuning.read_text(encoding="utf-8"), tuning.name) if tuning.is_file() else None
    expected = generate(decode(spec.read_bytes(), label), label, label, tuned)
    committed = GENERATED / f"{spec.stem}.py"
    assert committed.is_file(), f"{committed.relative_to(ROOT)} is missing; run `pallasgen build`"
    assert (
        committed.read_text(encoding="utf-8") == expected
    ), f"{committed.relative_to(ROOT)} differs from what {label} generates; run `pallasgen build`"


def test_every_generated_module_has_its_spec():
    for module in sorted(GENERATED.glob("*.py")):
        label = generated_from(module)
        if label is not None:
            assert (ROOT / label).is_file(), f"{module.relative_to(ROOT)} is stale: {label} no longer exists"
