"""`pallasgen run` and `pallasgen bench` on the bundled specs, in a copy of the project."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from pallasgen import runner
from pallasgen.bench import sweep_candidates
from pallasgen.cli import main
from pallasgen.gpu import is_power_of_two
from pallasgen.pipeline import check_source
from pallasgen.tiling import SCOPED_VMEM_BYTES, array_layouts, tiling_problem, vmem_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of the repository's specs and generated modules, as the working directory."""
    for folder in ("specs", "generated"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    (tmp_path / "pyproject.toml").write_text('[tool.pallasgen]\nspecs = "specs"\nout = "generated"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PALLASGEN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_run_compares_each_output_with_the_reference(project):
    result = invoke("run", "specs/activations.pallas:leaky", "--size", "M=20", "--size", "N=300")
    assert result.exit_code == 0, result.output
    assert "leaky.y [M=20, N=300]: max |kernel - reference| = 0" in result.output
    assert "leaky.mask [M=20, N=300]" in result.output
    assert "say nothing about TPU or GPU speed" in result.output


def test_run_refuses_a_generated_module_that_differs_from_its_spec(project):
    module = project / "generated" / "activations.py"
    module.write_text(module.read_text().replace("x * slope", "x * slope * 2", 1))
    result = invoke("run", "specs/activations.pallas:leaky", "--size", "M=20", "--size", "N=300")
    assert result.exit_code == 2
    assert "out of date; run `pallasgen build` first" in result.output


def test_a_kernel_that_disagrees_with_its_reference_is_a_mismatch():
    checked, *_ = check_source((ROOT / "specs" / "activations.pallas").read_text(), "activations.pallas")
    reference = runner.load_module(ROOT / "generated" / "activations.py").leaky_reference
    wrong = SimpleNamespace(leaky=lambda x: tuple(o + 1 for o in reference(x)), leaky_reference=reference)
    results = runner.run_kernel(wrong, checked, {"M": 8, "N": 128}, seed=0)
    assert [(r.output, r.ok, r.mismatches) for r in results] == [("y", False, 8 * 128), ("mask", False, 8 * 128)]


def test_run_names_a_missing_kernel(project):
    result = invoke("run", "specs/activations.pallas:nope")
    assert result.exit_code == 2
    assert "has no kernel named 'nope'" in result.output


def test_bench_times_kernel_and_xla_and_writes_json(project):
    result = invoke(
        "bench",
        "specs/matmul.pallas:matmul",
        "--size",
        "M=64",
        "--size",
        "N=128",
        "--size",
        "K=128",
        "--repeats",
        "2",
        "--json",
        "out.json",
    )
    assert result.exit_code == 0, result.output
    assert "matmul [M=64, N=128, K=128]:" in result.output and "x XLA" in result.output
    record = json.loads((project / "out.json").read_text())
    assert record["backend"] == "cpu"
    (timing,) = record["results"]
    assert timing["kernel"] == "matmul" and timing["flops"] == 2 * 64 * 128 * 128
    assert timing["ratio_to_xla"] == pytest.approx(timing["xla_seconds"] / timing["kernel_seconds"])


def test_bench_sweep_prints_the_fastest_configuration(project):
    result = invoke("bench", "specs/add_vectors.pallas", "--size", "N=4096", "--repeats", "1", "--sweep")
    assert result.exit_code == 0, result.output
    assert "add_vectors [N=4096] on cpu: best of" in result.output


@pytest.mark.parametrize("spec", sorted(p.name for p in (ROOT / "specs").glob("*.pallas")))
def test_sweep_candidates_obey_the_tiling_rules(spec):
    for checked in check_source((ROOT / "specs" / spec).read_text(), spec):
        tpu = sweep_candidates(checked, "tpu")
        assert tpu, checked.kernel.name
        layouts = array_layouts(checked.kernel, checked.dims, checked.product)
        for candidate in tpu:
            blocks = {
                **checked.blocks,
                **{d: candidate[f"block_{d.lower()}"] for d in checked.blocks if f"block_{d.lower()}" in candidate},
            }
            assert not any(tiling_problem(d, size, layouts) for d, size in blocks.items())
            assert vmem_bytes(checked.kernel, blocks, checked.product) <= SCOPED_VMEM_BYTES
        for candidate in sweep_candidates(checked, "gpu"):
            assert all(is_power_of_two(v) for k, v in candidate.items() if k.startswith("gpu_block_"))
