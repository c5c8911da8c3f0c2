"""`pallasgen bench --chip`: cycle estimates read from libtpu's profile, and their arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_run_and_bench import invoke, project  # noqa: F401  (a fixture)

from pallasgen.backends.tpu.chips import chip_named
from pallasgen.devices.estimate import LABEL, Estimate, parse_profile, percent_of_peak

PROFILE = """hlo_op_estimate {
  hlo_op_name: "bias_gelu.1"
  estimated_cycles: 570014
  num_equivalent_hlos: 1
  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
  scalar_inputs: 0
}
"""


ROOT = Path(__file__).resolve().parents[1]


def estimate(**fields) -> Estimate:
    defaults = dict(kernel="k", sizes={}, chip="v5e", kernel_cycles=1000, mosaic_cycles=1000, xla_cycles=800)
    return Estimate(**{**defaults, "flops": 0, "bytes_moved": 0, "int8": False, **fields})


def test_a_profile_file_gives_each_op_and_its_cycles():
    assert parse_profile(PROFILE + PROFILE.replace("bias_gelu.1", "copy")) == [
        ("bias_gelu.1", 570014),
        ("copy", 570014),
    ]


def test_the_ratio_is_kernel_over_xla_and_the_percent_is_of_the_matching_peak():
    v5e, v6e = chip_named("v5e"), chip_named("v6e")
    assert estimate().ratio == 1.25
    half_of_bf16 = 0.5 * 1000 * v5e.bf16_flops / v5e.clock_hz
    assert percent_of_peak(estimate(flops=half_of_bf16)) == (pytest.approx(50), "bf16 peak")
    assert percent_of_peak(estimate(flops=half_of_bf16, int8=True)) == (pytest.approx(25), "int8 peak")
    all_of_hbm = 1000 * v6e.hbm_bytes / v6e.clock_hz
    assert percent_of_peak(estimate(chip="v6e", bytes_moved=all_of_hbm)) == (pytest.approx(100), "HBM peak")


def test_bench_chip_compiles_the_kernel_and_xla_and_reads_their_cycles(project, tmp_path):  # noqa: F811
    # A fresh process: libtpu reads the profile flag once, when it loads.
    command = "from pallasgen.cli import main; main()"
    args = ["bench", "--chip", "v5e", "specs/add_vectors.pallas", "--size", "N=65536", "--block", "N=8192"]
    result = subprocess.run(
        [sys.executable, "-c", command, *args, "--json", "out.json"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"TPU v5e, {LABEL}" in result.stdout
    assert "add_vectors [N=65536]: kernel " in result.stdout
    (record,) = json.loads((project / "out.json").read_text())["results"]
    assert record["blocks"] == {"block_n": 8192}
    assert record["kernel_cycles"] == record["mosaic_cycles"] > 0  # nothing but the Mosaic call
    assert record["xla_cycles"] > 0
    assert record["speedup_over_xla"] == record["xla_cycles"] / record["kernel_cycles"]
    assert "speedup over XLA" in result.stdout and "kernel/XLA" not in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--chip", "v9z"], "Invalid value for '--chip'"),
        (["--chip", "v5e", "--sweep"], "cannot be combined with --chip"),
        (["--vmem-limit", "64"], "--vmem-limit needs --chip"),
        (["--chip", "v5e", "--block", "N=big"], "expected DIM=N"),
    ],
)
def test_bench_chip_usage_errors_exit_2_without_a_traceback(project, args, message):  # noqa: F811
    result = invoke("bench", "specs/add_vectors.pallas", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert isinstance(result.exception, SystemExit)


def test_a_reference_whose_compile_wrote_no_cycles_has_no_ratio_rather_than_a_crash():
    """XLA's compile of an int8 product (and of batched scores) can write no cycles."""
    from pallasgen.devices.estimate import describe

    assert estimate(xla_cycles=0).ratio is None
    assert "no XLA estimate to compare with" in describe(estimate(xla_cycles=0))


def test_bench_chip_grad_estimates_the_forward_plus_backward_pass_against_xlas(project):  # noqa: F811
    command = "from pallasgen.cli import main; main()"
    args = ["bench", "--chip", "v5e", "--grad", "specs/activations.pallas:leaky", "--size", "M=256", "--size", "N=1024"]
    result = subprocess.run(
        [sys.executable, "-c", command, *args, "--json", "out.json"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "leaky forward+backward [M=256, N=1024]: kernel " in result.stdout
    assert "% of" not in result.stdout  # the work of a forward plus backward pass is not counted
    (record,) = json.loads((project / "out.json").read_text())["results"]
    assert record["forward_and_backward"] is True
    # The backward kernel runs too: more Mosaic cycles than the forward kernel's alone.
    forward = subprocess.run(
        [sys.executable, "-c", command, *args[:3], *args[4:], "--json", "forward.json"], capture_output=True, text=True
    )
    assert forward.returncode == 0, forward.stderr[-2000:]
    (alone,) = json.loads((project / "forward.json").read_text())["results"]
    assert record["mosaic_cycles"] > alone["mosaic_cycles"] > 0
    assert record["xla_cycles"] > alone["xla_cycles"] > 0


def test_a_kernel_that_does_not_compile_for_the_chip_is_a_line_and_exit_1_not_a_traceback(project):  # noqa: F811
    command = "from pallasgen.cli import main; main()"
    args = ["bench", "--chip", "v5e", "specs/add_vectors.pallas", "--size", "N=65536", "--block", "N=100"]
    result = subprocess.run([sys.executable, "-c", command, *args], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "add_vectors: does not compile for TPU v5e: " in result.stdout
    assert "Traceback" not in result.stderr


def test_blocks_grown_to_28_mib_are_estimated_with_a_limit_of_twice_that(project):  # noqa: F811
    """At 4096x4096 bias_gelu's backward kernels grow their blocks to 1024x1024 (28 MiB).
    Compiled for the estimate, asking for 100 MiB of VMEM failed ("Used 132.51M of
    128.00M vmem"); the launcher asks for twice what they need."""
    command = "from pallasgen.cli import main; main()"
    kernels = ["specs/activations.pallas:bias_gelu_backward", "specs/activations.pallas:bias_gelu_backward_over_m"]
    args = ["bench", "--chip", "v5e", *kernels, "--size", "M=4096", "--size", "N=4096"]
    result = subprocess.run([sys.executable, "-c", command, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "bias_gelu_backward [M=4096, N=4096]: kernel " in result.stdout
    assert "bias_gelu_backward_over_m [M=4096, N=4096]: kernel " in result.stdout


def test_the_line_says_speedup_over_xla_higher_is_better():
    from pallasgen.devices.estimate import describe

    assert estimate().speedup == 0.8
    assert "speedup over XLA 0.80x" in describe(estimate())


def test_a_kernel_estimated_at_0_cycles_is_said_without_dividing_by_it():
    from pallasgen.devices.estimate import describe

    line = describe(estimate(kernel_cycles=0, mosaic_cycles=0, bytes_moved=4096))
    assert "kernel 0 cycles" in line and "no kernel estimate to compare" in line
    assert percent_of_peak(estimate(kernel_cycles=0, bytes_moved=4096)) is None
    assert estimate(kernel_cycles=0).speedup is None


def test_a_percent_of_peak_past_100_is_flagged_as_past_the_physical_limit():
    from pallasgen.devices.estimate import describe

    v5e = chip_named("v5e")
    three_hbm = 3.11 * 1000 * v5e.hbm_bytes / v5e.clock_hz
    line = describe(estimate(bytes_moved=three_hbm))
    assert "311% of HBM peak" in line
    assert "past the physical limit" in line and "not a bound" in line
    assert "physical limit" not in describe(estimate(bytes_moved=three_hbm / 4))


ABORTING_MODULE = """
import os


def add_vectors(x, y, interpret=None):
    os.abort()  # as libtpu's static profile does on some kernels


add_vectors.reference = lambda x, y: x + y
"""


def test_an_estimate_whose_compile_aborts_its_process_is_that_kernels_error(tmp_path):
    """Each estimate runs in a process of its own (devices.apart): an abort there, as
    libtpu's static profile gives on v5e for attention's backward kernels at a ragged S,
    is that kernel's error, which `bench --chip` prints as a line before it goes on."""
    from pallasgen.devices.apart import ApartEstimator, NoEstimate, _aborted
    from pallasgen.devices.runner import load_module
    from pallasgen.workspace.pipeline import check_source

    (checked,) = check_source((ROOT / "specs" / "add_vectors.pallas").read_text(), "specs/add_vectors.pallas")
    module = load_module(ABORTING_MODULE, tmp_path / "aborting.py")
    with pytest.raises(NoEstimate, match=r"the compile ended its process \(signal 6;"):
        ApartEstimator("v5e").estimate(module, checked, {"N": 4096}, {})
    said = _aborted(-6, "F1127 12:57:27.5 8051 llo_module.cc:66] Check failed: TakeStatus() is OK\nmore")
    assert said.endswith("kernels that compile): Check failed: TakeStatus() is OK")
