"""Makes the shared test helpers (kernel_cases.py) importable in any pytest import mode,
gives libtpu the environment it needs to start without a TPU (test_compiled.py) before
anything imports jax, and marks the tests that drive a browser (`-m "not browser"`
leaves them out).

Test files that neither import nor run jax (the build path: spec checks, rendering,
`pallasgen build`, `check` and `show`) say so with `pytestmark = pytest.mark.jax_free`
(`-m jax_free` runs them alone; tests/test_layers.py holds them to it).

`--share K/N` runs the Kth of N disjoint shares of the suite, which together run each test
once: a parametrized test's cases take turns between the shares, and so do a file's tests
without cases; a test marked `jax_line` (one that some jax lines skip, or run only in part)
is not shared, but runs whole on every line. CI's two jax lines
run a share each (.ci/run), so every tier runs on both and every case on one.
`--case-stride N` runs, of each parametrized test's cases, the first and every Nth after it
(before any `--share`); `--fuzz-examples N`, N of each fuzz test's 150 examples
(hypothesis, derandomized)."""

import os
import re
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest

from pallasgen.devices.compile_only import set_libtpu_environment

set_libtpu_environment()

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture(params=["tpu", "gpu"])
def path(request, module, monkeypatch):
    """The test file's `module` (a fixture of its own) run on its TPU kernels in interpret
    mode, or on its Triton kernels in interpret mode (kernel_cases.on_path)."""
    from kernel_cases import on_path

    with on_path(module, request.param, monkeypatch) as path:
        yield path


def pytest_addoption(parser):
    parser.addoption(
        "--case-stride",
        type=int,
        default=1,
        metavar="N",
        help="of each parametrized test's cases, run the first and every Nth after it (default 1: all)",
    )
    parser.addoption(
        "--share",
        metavar="K/N",
        help="run the Kth of N disjoint shares of the suite, which together run each test once (default: all)",
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
    cases past the first but every Nth are deselected; with `--share K/N`, then, the
    tests of the other shares."""
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
    share = config.getoption("share")
    if share is not None:
        kept, others = shared(kept, *share_option(share))
        deselected += others
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def shared(items: list, k: int, n: int) -> tuple[list, list]:
    """The items of the Kth of N shares, and the others."""
    turns = Counter()
    kept, others = [], []
    for item in items:
        if item.get_closest_marker("jax_line"):
            kept.append(item)
            continue
        # A parametrized test's cases take turns, as do a file's tests without cases; each
        # run of turns starts at a share of its own (a hash of its name), so that the
        # shares are even.
        parametrized = hasattr(item, "callspec")
        run = f"{item.path.name}::{item.originalname}" if parametrized else item.path.name
        turn = turns[run] + zlib.crc32(run.encode())
        turns[run] += 1
        (kept if turn % n == k - 1 else others).append(item)
    return kept, others


def share_option(text: str) -> tuple[int, int]:
    """K and N of `--share K/N` (1 <= K <= N), or a usage error."""
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(f"--share must be K/N with 1 <= K <= N (as 1/2), not {text!r}")
    return int(match[1]), int(match[2])
