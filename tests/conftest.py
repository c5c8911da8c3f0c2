"""Makes the shared test helpers (kernel_cases.py) importable in any pytest import mode,
gives libtpu the environment it needs to start without a TPU (test_compiled.py) before
anything imports jax, and marks the tests that drive a browser (`-m "not browser"`
leaves them out: CI runs them on one of its two jax lines, see .ci/run).

Test files that neither import nor run jax (the build path: spec checks, rendering,
`pallasgen build`, `check` and `show`) say so with `pytestmark = pytest.mark.jax_free`:
CI runs them on its first jax line only, as no jax version can change what they test.

`--case-stride N` runs, of each parametrized test's cases, the first and every Nth after
it (in collection order): CI's second jax line runs every test and every tier, and a share
of each sweep of kernels, shapes and chips that its first line runs whole, and with
`--fuzz-examples 30` 30 of each fuzz test's 150 examples (hypothesis, derandomized)."""

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from pallasgen.devices.compile_only import set_libtpu_environment

set_libtpu_environment()

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def pytest_addoption(parser):
    parser.addoption(
        "--case-stride",
        type=int,
        default=1,
        metavar="N",
        help="of each parametrized test's cases, run the first and every Nth after it (default 1: all)",
    )
    parser.addoption(
        "--fuzz-examples",
        type=int,
        metavar="N",
        help="examples of each fuzz test (tests/test_fuzz.py; default: PALLASGEN_FUZZ_EXAMPLES, else 150)",
    )


def pytest_configure(config):
    """`--fuzz-examples` sets PALLASGEN_FUZZ_EXAMPLES, which tests/test_fuzz.py reads on import."""
    examples = config.getoption("fuzz_examples")
    if examples is not None:
        if examples < 1:
            raise pytest.UsageError(f"--fuzz-examples must be 1 or more, not {examples}")
        os.environ["PALLASGEN_FUZZ_EXAMPLES"] = str(examples)


def pytest_collection_modifyitems(config, items):
    """`browser`: each test that takes the `browser` fixture (test_playground.py: headless
    Chromium running the playground's Pyodide, whose Python and wheels are the same
    whichever Python and jax run pytest). With `--case-stride N`, each parametrized test's
    cases past the first but every Nth are deselected."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
    stride = config.getoption("case_stride")
    if stride < 1:
        raise pytest.UsageError(f"--case-stride must be 1 or more, not {stride}")
    cases_seen = Counter()
    kept, deselected = [], []
    for item in items:
        test = (item.path, item.cls, getattr(item, "originalname", item.name))
        (kept if cases_seen[test] % stride == 0 else deselected).append(item)
        cases_seen[test] += 1
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
