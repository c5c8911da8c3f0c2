"""The options CI's second jax line runs the suite with (tests/conftest.py): `--case-stride
N`, of each parametrized test the first case and every Nth after it (tests without cases
all run); `--fuzz-examples N`, the examples of each fuzz test."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.jax_free

CONFTEST = Path(__file__).with_name("conftest.py")

SWEEPS = """
import pytest

@pytest.mark.parametrize("size", range(7))
def test_shape(size):
    pass

@pytest.mark.parametrize("chip", ["v5e", "v6e"])
@pytest.mark.parametrize("kernel", ["matmul", "softmax"])
def test_compiles(kernel, chip):
    pass

def test_alone():
    pass
"""


def collected(pytester, *options):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sweeps=SWEEPS)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:xdist", *options)
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def test_a_stride_of_three_keeps_each_tests_first_case_and_every_third(pytester):
    assert collected(pytester, "--case-stride", "3") == [
        "test_shape[0]",
        "test_shape[3]",
        "test_shape[6]",
        "test_compiles[matmul-v5e]",
        "test_compiles[softmax-v6e]",
        "test_alone",
    ]


def test_without_a_stride_every_case_runs(pytester):
    assert len(collected(pytester)) == 7 + 4 + 1


def test_a_stride_below_one_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sweeps=SWEEPS)
    result = pytester.runpytest("--case-stride", "0", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--case-stride must be 1 or more, not 0*"])


def test_fuzz_examples_set_the_count_tests_fuzz_reads_on_import(pytester, monkeypatch):
    monkeypatch.setenv("PALLASGEN_FUZZ_EXAMPLES", "150")  # restored after the in-process run sets it
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_reads="""
import os
EXAMPLES = int(os.environ.get("PALLASGEN_FUZZ_EXAMPLES", "150"))

def test_count():
    assert EXAMPLES == 30
""")
    assert pytester.runpytest("--fuzz-examples", "30", "-p", "no:xdist").ret == pytest.ExitCode.OK
