"""`pallasgen run` and `pallasgen bench` on the bundled specs, in a copy of the project."""

from __future__ import annotations

import json
import os
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from pallasgen.devices import runner
from pallasgen.devices.bench import sweep_candidates
from pallasgen.cli import main
from pallasgen.backends.gpu.options import is_power_of_two
from pallasgen.workspace.pipeline import check_source
from pallasgen.backends import backend_named
from pallasgen.backends.tpu.tiling import SCOPED_VMEM_BYTES, tiling_problem

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


FOUR_D = """\
kernel four_d {
    in  x: f32[B, H, S, D]
    in  y: f32[B, H, S, D]
    out z: f32[B, H, S, D]
    z = x * y + 1
}
"""


def checked_kernel(source: str, name: str):
    (checked,) = [k for k in check_source(source, "spec.pallas") if k.kernel.name == name]
    return checked


def test_run_compares_each_output_with_the_reference(project):
    result = invoke("run", "specs/activations.pallas:leaky", "--size", "M=20", "--size", "N=300")
    assert result.exit_code == 0, result.output
    assert "leaky.y [M=20, N=300]: OK, worst element " in result.output
    assert "leaky.mask [M=20, N=300]: OK, compared exactly;" in result.output
    assert "say nothing about TPU or GPU speed" in result.output


def test_run_generates_a_stale_module_in_memory_and_leaves_the_file_alone(project):
    module = project / "generated" / "activations.py"
    edited = module.read_text().replace("x * slope", "x * slope * 2", 1)
    module.write_text(edited)
    result = invoke("run", "specs/activations.pallas:leaky", "--size", "M=20", "--size", "N=300")
    assert result.exit_code == 0, result.output
    assert "generated in memory: generated/activations.py is stale; run `pallasgen build` to write it" in result.stderr
    assert "leaky.y [M=20, N=300]: OK" in result.stdout
    assert module.read_text() == edited


@pytest.mark.parametrize("command", ["run", "bench"])
def test_run_and_bench_generate_a_missing_module_in_memory(project, command):
    (project / "generated" / "add_vectors.py").unlink()
    result = invoke(
        command, "specs/add_vectors.pallas", "--size", "N=300", *(["--repeats", "1"] * (command == "bench"))
    )
    assert result.exit_code == 0, result.output
    assert "generated in memory: generated/add_vectors.py is missing" in result.stderr
    assert "add_vectors" in result.stdout
    assert not (project / "generated" / "add_vectors.py").exists()


def kernel_with_reference(function, reference):
    """A stand-in for a generated kernel: `function`, with `reference` as its `.reference`."""

    def kernel(*arrays, **keywords):
        return function(*arrays, **keywords)

    kernel.reference = reference
    return kernel


def test_run_says_which_kernels_jax_grad_cannot_differentiate_and_why(project):
    (project / "specs" / "two.pallas").write_text(
        "kernel two {\n    in  x: bf16[M, K]\n    in  w, u: bf16[K, N]\n    out o: f32[M, N]\n"
        "    o = softmax(x @ w + x @ u, N)\n    block M = 128\n}\n"
    )
    result = invoke("run", "specs/two.pallas", "--size", "M=8", "--size", "K=16", "--size", "N=128")
    assert result.exit_code == 0, result.output
    assert (
        "two.grad: not differentiable (none is generated yet for several products whose values are reduced,"
        " other than attention's)" in result.output
    )
    assert "not differentiable" not in invoke("run", "specs/two.pallas", "--no-grad", "--size", "M=8").output


def test_a_kernel_that_disagrees_with_its_reference_is_a_mismatch():
    checked, *_ = check_source((ROOT / "specs" / "activations.pallas").read_text(), "activations.pallas")
    path = ROOT / "generated" / "activations.py"
    reference = runner.load_module(path.read_text(), path).leaky.reference
    wrong = SimpleNamespace(leaky=kernel_with_reference(lambda x: tuple(o + 1 for o in reference(x)), reference))
    results = runner.run_kernel(wrong, checked, {"M": 8, "N": 128}, seed=0)
    assert [(r.output, r.ok, r.mismatches) for r in results] == [("y", False, 8 * 128), ("mask", False, 8 * 128)]
    y, mask = (r.describe({"M": 8, "N": 128}) for r in results)
    assert y.startswith("leaky.y [M=8, N=128]: MISMATCH in 1024 of 1024 elements, worst element ")
    assert " beyond the " in y
    assert mask.startswith("leaky.mask [M=8, N=128]: MISMATCH in 1024 of 1024 elements, compared exactly; worst")


def test_run_checks_the_gradient_of_a_kernel_with_backward_kernels(project):
    """Each float input of bias_gelu gets a line; --no-grad skips them; a kernel with no
    generated backward kernels (argmax: no float output) gets none."""
    sizes = ["--size", "M=20", "--size", "N=300"]
    result = invoke("run", "specs/activations.pallas:bias_gelu", *sizes)
    assert result.exit_code == 0, result.output
    for name in ("x", "bias", "scale"):
        assert f"bias_gelu.grad({name}) [M=20, N=300]: OK, worst element " in result.output
    assert "grad(" not in invoke("run", "specs/activations.pallas:bias_gelu", *sizes, "--no-grad").output
    argmax = invoke("run", "specs/reductions.pallas:argmax_rows", "--size", "M=20", "--size", "N=200")
    assert argmax.exit_code == 0, argmax.output
    assert "argmax_rows.i" in argmax.output and "grad(" not in argmax.output


def test_a_backward_pass_that_disagrees_with_the_references_is_a_mismatch():
    import jax

    checked, *_ = check_source((ROOT / "specs" / "activations.pallas").read_text(), "activations.pallas")
    path = ROOT / "generated" / "activations.py"
    reference = runner.load_module(path.read_text(), path).leaky.reference

    @jax.custom_vjp
    def doubled_backward(x):
        return reference(x)

    def forward(x):
        return reference(x), x

    def backward(x, cotangents):
        (dx,) = jax.vjp(lambda x: reference(x)[0], x)[1](cotangents[0])
        return (2 * dx,)

    doubled_backward.defvjp(forward, backward)
    wrong = SimpleNamespace(leaky=kernel_with_reference(doubled_backward, reference))
    (result,) = runner.run_gradient(wrong, checked, {"M": 8, "N": 128}, seed=0)
    assert (result.output, result.ok) == ("grad(x)", False)
    assert result.describe({"M": 8, "N": 128}).startswith("leaky.grad(x) [M=8, N=128]: MISMATCH in ")


def test_the_worst_float_element_is_shown_against_its_own_allowance():
    """The element nearest its allowance, 1e-4 x (1 + |reference|) for f32, with that allowance."""
    got = [1.0, 100.005, 3.0]
    want = [1.0, 100.0, 3.00005]
    result = runner._compare("k", "y", got, want, runner.TOLERANCE["f32"], 0.0)
    assert result.ok
    assert result.worst[1:] == pytest.approx((100.0, 0.005, 0.0101))
    assert "worst element 100.005, reference 100: |diff| 0.005 within the 0.0101 allowed there" in result.describe({})


def test_a_gradients_allowance_adds_its_dtypes_error_of_the_cotangents_size():
    """A product's sum that cancels near 0 keeps its terms' rounding: a gradient's element
    is allowed its dtype's error of the cotangent's root mean square besides its own."""
    got, want = [0.5, 100.0, -100.0], [0.0, 100.0, -100.0]
    assert not runner._compare("k", "grad(x)", got, want, 0.2, 0.0).ok
    result = runner._compare("k", "grad(x)", got, want, 0.2, 0.0, floor=0.02 * 81.6)
    assert result.ok
    assert "(2e-01 x (1 + |reference|) + 1.63, a sum's rounding by the cotangents' size)" in result.describe({})


def test_integer_outputs_are_compared_exactly_and_say_so():
    result = runner._compare("k", "mask", [0, 1, 1], [0, 1, 1], runner.TOLERANCE.get("i32", 0.0), 0.0)
    assert result.ok and ", compared exactly;" in result.describe({})
    assert "allowed" not in result.describe({})
    assert runner._compare("k", "mask", [0, 1, 2], [0, 1, 1], 0.0, 0.0).mismatches == 1


def test_a_nan_on_one_side_only_is_a_mismatch_and_the_worst_element():
    result = runner._compare("k", "y", [float("nan"), 1.0], [1.0, 1.0], runner.TOLERANCE["f32"], 0.0)
    assert result.mismatches == 1
    assert "worst element nan, reference 1: |diff| inf beyond" in result.describe({})


def test_default_sizes_make_each_blocked_dimension_one_and_a_half_blocks():
    """Two blocks, the second a ragged edge, while the arrays stay within the budget."""
    checked, *_ = check_source((ROOT / "specs" / "giou.pallas").read_text(), "giou.pallas")
    assert checked.blocks == {"B": 256, "N": 1024}
    assert runner.sizes_for(checked, {}) == {"B": 384, "N": 1536}


def test_default_sizes_keep_every_array_of_any_rank_within_the_budget():
    checked = checked_kernel(FOUR_D, "four_d")
    sizes = runner.sizes_for(checked, {})
    assert 0 < math.prod(sizes.values()) <= runner.ELEMENTS_PER_ARRAY
    assert min(sizes.values()) >= 16


def test_given_sizes_are_kept_and_only_the_others_shrink():
    checked = checked_kernel(FOUR_D, "four_d")
    sizes = runner.sizes_for(checked, {"D": 4096})
    assert sizes["D"] == 4096
    assert math.prod(sizes.values()) <= runner.ELEMENTS_PER_ARRAY


def test_run_of_a_4d_spec_finishes_with_default_sizes(project):
    (project / "specs" / "four_d.pallas").write_text(FOUR_D)
    result = invoke("run", "specs/four_d.pallas")
    assert result.exit_code == 0, result.output
    assert "four_d.z [B=" in result.stdout and ": OK" in result.stdout


def test_run_names_a_missing_kernel_and_lists_the_kernels(project):
    result = invoke("run", "specs/activations.pallas:nope")
    assert result.exit_code == 2
    assert "has no kernel named 'nope'; its kernels: leaky, bias_gelu, quantize_rows" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["specs/matmul.pallas:matmul", "--size", "Q=3"],
            "--size Q=3: no dimension Q in matmul [M, N, K]",
            id="unknown-dimension",
        ),
        pytest.param(["specs/add_vectors.pallas", "--size", "N"], "--size N: expected DIM=N", id="no-value"),
        pytest.param(["specs/add_vectors.pallas", "--size", "N=0"], "--size N=0: expected DIM=N", id="zero"),
        pytest.param(["specs/add_vectors.pallas", "--size", "N=-4"], "--size N=-4: expected DIM=N", id="negative"),
        pytest.param(["specs/add_vectors.pallas", "--size", "N=\u00b2"], "expected DIM=N", id="unicode-digit"),
        pytest.param(["specs/add_vectors.pallas", "--size", "=4"], "--size =4: expected DIM=N", id="no-name"),
        pytest.param(
            ["specs/add_vectors.pallas", "--size", "N=4", "--size", "N=5"], "--size N is given twice", id="twice"
        ),
        pytest.param(
            ["specs/add_vectors.pallas", "--size", "N=99999999999999999999999"],
            "add_vectors [N=99999999999999999999999]: the arrays do not fit in memory",
            id="too-large",
        ),
        pytest.param(["specs"], "specs: a folder; name a spec file in it", id="folder"),
        pytest.param(["specs/nope.pallas"], "specs/nope.pallas: no such file or folder", id="missing-spec"),
        pytest.param(["pyproject.toml"], "not a spec file (expected a .pallas file)", id="not-a-spec"),
        pytest.param(["specs/add_vectors.pallas", "--seed", "-1"], "-1 is not in the range x>=0", id="seed"),
    ],
)
def test_run_usage_errors_exit_2_in_plain_words(project, args, message):
    result = invoke("run", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert isinstance(result.exception, SystemExit)  # not an uncaught exception


def test_run_without_specs_in_the_project_is_a_usage_error(project):
    shutil.rmtree(project / "specs")
    result = invoke("run")
    assert result.exit_code == 2
    assert "pallasgen: error: no spec files in specs" in result.stderr


def test_run_with_an_unreadable_pyproject_is_a_usage_error(project):
    (project / "pyproject.toml").write_text("[tool.pallasgen\n")
    result = invoke("run", "specs/add_vectors.pallas")
    assert result.exit_code == 2
    assert result.stderr.startswith("pallasgen: error: ") and "pyproject.toml" in result.stderr


def test_bench_refuses_zero_repeats(project):
    result = invoke("bench", "specs/add_vectors.pallas", "--repeats", "0")
    assert result.exit_code == 2
    assert "0 is not in the range x>=1" in result.output


def test_bench_json_into_a_missing_folder_is_a_usage_error(project):
    result = invoke("bench", "specs/add_vectors.pallas", "--size", "N=8", "--repeats", "1", "--json", "no/such.json")
    assert result.exit_code == 2
    assert "pallasgen: error: cannot write no/such.json: No such file or directory" in result.stderr


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
    assert "matmul [M=64, N=128, K=128]:" in result.output and "speedup over XLA " in result.output
    record = json.loads((project / "out.json").read_text())
    assert record["backend"] == "cpu"
    (timing,) = record["results"]
    assert timing["kernel"] == "matmul" and timing["flops"] == 2 * 64 * 128 * 128
    assert timing["speedup_over_xla"] == pytest.approx(timing["xla_seconds"] / timing["kernel_seconds"])


def test_bench_gpu_backend_chooses_the_gpu_kernels_and_is_recorded(project):
    """Off a GPU the TPU kernel is interpreted whatever `gpu_backend` says; the choice is
    still checked against the project's targets and written to the JSON."""
    result = invoke(
        "bench",
        "specs/add_vectors.pallas",
        "--size",
        "N=256",
        "--repeats",
        "1",
        "--gpu-backend",
        "mosaic_gpu",
        "--json",
        "out.json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads((project / "out.json").read_text())["gpu_backend"] == "mosaic_gpu"
    (project / "pyproject.toml").write_text(
        '[tool.pallasgen]\nspecs = "specs"\nout = "generated"\ntargets = ["tpu", "triton"]\n'
    )
    result = invoke("bench", "specs/add_vectors.pallas", "--gpu-backend", "mosaic_gpu")
    assert result.exit_code == 2
    assert "bench --gpu-backend mosaic_gpu needs the 'mosaic_gpu' target" in result.stderr


def test_bench_sweep_prints_the_fastest_configuration(project):
    result = invoke("bench", "specs/add_vectors.pallas", "--size", "N=4096", "--repeats", "1", "--sweep")
    assert result.exit_code == 0, result.output
    assert "add_vectors [N=4096] on cpu: best of" in result.output and "speedup over XLA " in result.output


@pytest.mark.parametrize("spec", sorted(p.name for p in (ROOT / "specs").glob("*.pallas")))
def test_sweep_candidates_obey_the_tiling_rules(spec):
    for checked in check_source((ROOT / "specs" / spec).read_text(), spec):
        tpu = sweep_candidates(checked, "tpu")
        assert tpu, checked.kernel.name
        backend = backend_named("tpu")
        layouts = backend.layouts(checked)
        for candidate in tpu:
            blocks = {
                **checked.blocks,
                **{d: candidate[f"block_{d.lower()}"] for d in checked.blocks if f"block_{d.lower()}" in candidate},
            }
            assert not any(tiling_problem(d, size, layouts) for d, size in blocks.items())
            assert backend.memory_bytes(checked, blocks) <= SCOPED_VMEM_BYTES
        for candidate in sweep_candidates(checked, "gpu"):
            assert all(is_power_of_two(v) for k, v in candidate.items() if k.startswith("gpu_block_"))


def test_bench_grad_times_the_forward_plus_backward_pass_of_each_differentiable_kernel(project):
    result = invoke(
        "bench", "specs/activations.pallas", "--size", "M=16", "--size", "N=256", "--repeats", "1", "--grad"
    )
    assert result.exit_code == 0, result.output
    assert "bias_gelu forward+backward [M=16, N=256]: " in result.output and "speedup over XLA " in result.output
    assert "quantize_rows: no backward kernels to measure (no float input reaches a float output)" in result.output
    assert "quantize_rows forward+backward" not in result.output


def test_with_backward_gives_the_outputs_and_the_float_inputs_cotangents_as_jax_vjp_does(project):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallasgen.devices.bench import with_backward

    (checked,) = [
        k for k in check_source(Path("specs/activations.pallas").read_text(), "a") if k.kernel.name == "leaky"
    ]
    x = jnp.asarray(np.linspace(-2.0, 2.0, 8 * 128, dtype=np.float32).reshape(8, 128))

    def leaky(x):  # y, and an integer mask that takes a float0 cotangent
        return jnp.where(x > 0, x, x * 0.01), (x > 0).astype(jnp.int32)

    dy = jnp.full((8, 128), 3.0, jnp.float32)
    (y, mask), (dx,) = with_backward(leaky, checked)([x], [dy])
    np.testing.assert_array_equal(mask, np.asarray(x) > 0)
    np.testing.assert_allclose(dx, np.where(np.asarray(x) > 0, 3.0, 0.03), rtol=1e-6)
    assert jax.numpy.shape(y) == (8, 128)


def test_a_kernel_derived_for_jax_grad_can_be_named_as_a_target(project):
    result = invoke(
        "bench",
        "specs/activations.pallas:bias_gelu_backward_over_m",
        "--size",
        "M=16",
        "--size",
        "N=256",
        "--repeats",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert "bias_gelu_backward_over_m [M=16, N=256]: " in result.output
    missing = invoke("bench", "specs/activations.pallas:nothing")
    assert missing.exit_code == 2
    assert "its kernels: leaky, bias_gelu, quantize_rows; derived for jax.grad: leaky_backward," in missing.output


def test_commands_print_nothing_from_libtpu_on_a_machine_without_a_tpu(tmp_path):
    import importlib.util
    import subprocess
    import sys

    from pallasgen.devices.compile_only import tpu_present

    if importlib.util.find_spec("libtpu") is None or tpu_present():
        pytest.skip("needs libtpu installed on a machine without a TPU")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "JAX_PLATFORMS"))}
    result = subprocess.run(
        [sys.executable, "-m", "pallasgen", "run", "specs/add_vectors.pallas", "--size", "N=1000", "--no-grad"],
        cwd=root,
        env={**env, "PALLASGEN_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "host bounds" not in result.stderr and "worker hostname" not in result.stderr, result.stderr


def test_libtpu_is_left_alone_where_a_tpu_or_tpu_settings_are(tmp_path, monkeypatch):
    from pallasgen.devices import compile_only

    for name in list(os.environ):
        if name.startswith("TPU_"):
            monkeypatch.delenv(name)
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1ae0\n")
    assert compile_only.quiet_libtpu_without_tpu(str(tmp_path)) == {}
    assert not any(name.startswith("TPU_") for name in os.environ)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host-a,host-b")
    assert compile_only.quiet_libtpu_without_tpu(str(tmp_path / "none")) == {}
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
    for name in compile_only.QUIET_LIBTPU_ENV:
        monkeypatch.setenv(name, "")  # so that monkeypatch restores (removes) them afterwards
        monkeypatch.delenv(name)
    assert compile_only.quiet_libtpu_without_tpu(str(tmp_path / "none")) == compile_only.QUIET_LIBTPU_ENV
