"""The options CI's jax lines run the suite with (tests/conftest.py): `--case-stride N`, of
each parametrized test the first case and every Nth after it (tests without cases all
run); `--share K/N`, the Kth of N disjoint shares of the suite; `--fuzz-examples N`, the
examples of each fuzz test."""

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

def test_also_alone():
    pass

@pytest.mark.jax_line
@pytest.mark.parametrize("kernel", ["matmul", "softmax"])
def test_on_some_jax_lines(kernel):
    pass
"""
EVERY_TEST = 7 + 4 + 1 + 1 + 2


def collected(pytester, *options):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sweeps=SWEEPS)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:xdist", *options)
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


def test_without_a_stride_or_a_share_every_test_runs(pytester):
    assert len(collected(pytester)) == EVERY_TEST


def test_a_stride_of_three_keeps_each_tests_first_case_and_every_third(pytester):
    assert collected(pytester, "--case-stride", "3") == [
        "test_shape[0]",
        "test_shape[3]",
        "test_shape[6]",
        "test_compiles[matmul-v5e]",
        "test_compiles[softmax-v6e]",
        "test_alone",
        "test_also_alone",
        "test_on_some_jax_lines[matmul]",
    ]


def test_a_stride_below_one_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sweeps=SWEEPS)
    result = pytester.runpytest("--case-stride", "0", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--case-stride must be 1 or more, not 0*"])


def test_two_shares_run_each_test_once_and_each_sweep_on_both(pytester):
    first, second = collected(pytester, "--share", "1/2"), collected(pytester, "--share", "2/2")
    shared = {"test_on_some_jax_lines[matmul]", "test_on_some_jax_lines[softmax]"}
    assert set(first) & set(second) == shared
    assert len(set(first) | set(second)) == EVERY_TEST
    for share in first, second:
        assert 3 <= sum(t.startswith("test_shape[") for t in share) <= 4  # cases take turns
        assert sum(t.startswith("test_compiles[") for t in share) == 2
        assert sum(t in ("test_alone", "test_also_alone") for t in share) == 1
        assert shared <= set(share)


def test_shares_split_what_a_stride_keeps(pytester):
    strided = collected(pytester, "--case-stride", "2")
    first = collected(pytester, "--case-stride", "2", "--share", "1/2")
    second = collected(pytester, "--case-stride", "2", "--share", "2/2")
    assert set(first) | set(second) == set(strided)
    assert set(first) & set(second) == {"test_on_some_jax_lines[matmul]"}


@pytest.mark.parametrize("share", ["0/2", "3/2", "1", "a/b"])
def test_a_share_not_k_of_n_is_a_usage_error(pytester, share):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sweeps=SWEEPS)
    result = pytester.runpytest("--share", share, "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--share must be K/N with 1 <= K <= N (as 1/2), not '{share}'*"])


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
