"""Makes the shared test helpers (kernel_cases.py) importable in any pytest import mode,
gives libtpu the environment it needs to start without a TPU (test_compiled.py) before
anything imports jax, and marks the tests that drive a browser (`-m "not browser"`
leaves them out: CI runs them on one of its two jax lines, see .ci/run).

Test files that neither import nor run jax (the build path: spec checks, rendering,
`pallasgen build`, `check` and `show`) say so with `pytestmark = pytest.mark.jax_free`:
CI runs them on its first jax line only, as no jax version can change what they test."""

import sys
from pathlib import Path

import pytest

from pallasgen.devices.compile_only import set_libtpu_environment

set_libtpu_environment()

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def pytest_collection_modifyitems(config, items):
    """`browser`: each test that takes the `browser` fixture (test_playground.py: headless
    Chromium running the playground's Pyodide, whose Python and wheels are the same
    whichever Python and jax run pytest)."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
