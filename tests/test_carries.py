"""What a kernel carries across its swept dimension, from the one analysis every kernel
goes through (`analysis.carries.sweep_over`): a single product its accumulator, a
reducing kernel its running values, attention its online softmax, an elementwise
kernel nothing."""

from pathlib import Path

import pytest

from pallasgen.frontend import ir
from pallasgen.workspace.pipeline import check_source

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

SPECS = Path(__file__).resolve().parents[1] / "specs"


def checked(spec: str, name: str):
    path = SPECS / f"{spec}.pallas"
    return next(c for c in check_source(path.read_text(encoding="utf-8"), str(path)) if c.kernel.name == name)


def carried(spec: str, name: str) -> tuple[str, list[str]]:
    sweep = checked(spec, name).sweep
    return sweep.dim, [carry.kind for carry in sweep.carries]


def test_a_product_carries_its_accumulator_and_computes_its_epilogue_at_the_end():
    assert carried("matmul", "matmul_bias_gelu") == ("K", ["dot"])
    sweep = checked("matmul", "matmul_bias_gelu").sweep
    assert sweep.step == () and [s.target for s in sweep.finish if isinstance(s, ir.Assign)] == ["z"]


def test_a_reduction_carries_its_running_values():
    assert carried("reductions", "column_sums") == ("M", ["sum"])
    assert carried("reductions", "argmax_blocked") == ("N", ["argmax"])


def test_logsumexp_carries_the_running_max_and_sum_of_exp_that_attention_does():
    assert carried("losses", "cross_entropy") == ("V", ["max", "expsum", "sum"])
    assert carried("attention", "attention") == ("T", ["max", "dot", "expsum"])


def test_a_kernel_that_sweeps_nothing_carries_nothing():
    assert checked("ops", "add_f32").sweep is None
    assert checked("norms", "layer_norm").sweep is None  # N is taken whole
