"""`[tool.pallasgen] targets`: a project generates only the backends it uses (issue 29).

A TPU-only module has no Triton or Mosaic GPU code, runs in interpret mode and is much
shorter; a GPU-only one interprets its Triton kernels on CPU; a module called on a
platform it was not generated for says so; the checks, the cache key and the keywords
`jax.grad` passes on follow the targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import pallasgen
from pallasgen.backends import BACKENDS, plan_module, targeted
from pallasgen.cli import main
from pallasgen.runtime.constants import TARGETS
from pallasgen.workspace import cache
from pallasgen.workspace.config import ConfigError, load_config
from pallasgen.workspace.pipeline import check_source, generate

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"

SPEC = """kernel add_vectors {
    in  x: f32[N]
    in  y: f32[N]
    out z: f32[N]
    z = x + y
    block N = 1024
}

kernel matmul {
    in  x: f32[M, K]
    in  y: f32[K, N]
    out z: f32[M, N]
    z = x @ y
    block M = 128, N = 128, K = 128
}
"""

GPU_WORDS = ("pltriton", "plgpu", "gpu_", "triton", "mosaic", "Triton", "Mosaic GPU")


def make_project(root: Path, targets: str | None, spec: str = SPEC) -> Path:
    (root / "specs").mkdir(parents=True, exist_ok=True)
    (root / "specs" / "kernels.pallas").write_text(spec)
    table = '[tool.pallasgen]\nspecs = "specs"\nout = "out"\n'
    if targets is not None:
        table += f"targets = {targets}\n"
    (root / "pyproject.toml").write_text(table)
    return root


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def built(tmp_path, targets: str | None, name: str):
    root = make_project(tmp_path / name, targets)
    pallasgen.build(project=root, use_cache=False)
    return root / "out" / "kernels.py"


# Configuration


def test_the_default_is_every_target(tmp_path):
    make_project(tmp_path, None)
    assert load_config(tmp_path).targets == TARGETS == ("tpu", "triton", "mosaic_gpu")


def test_targets_are_kept_in_one_order(tmp_path):
    make_project(tmp_path, '["mosaic_gpu", "tpu"]')
    assert load_config(tmp_path).targets == ("tpu", "mosaic_gpu")


@pytest.mark.parametrize(
    "value, said",
    [
        ('"tpu"', "got 'tpu'"),
        ("[]", "got []"),
        ('["tpu", "cuda"]', "'cuda' is not one"),
        ('["gpu"]', "'gpu' is not one"),
        ('["tpu", "tpu"]', "'tpu' is named twice"),
        ("[1]", "1 is not one"),
    ],
)
def test_bad_targets_are_a_config_error(tmp_path, value, said):
    make_project(tmp_path, value)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    message = str(error.value)
    assert str(tmp_path / "pyproject.toml") in message
    assert '"tpu", "triton", "mosaic_gpu"' in message and said in message


def test_bad_targets_are_a_usage_error_of_build(tmp_path, monkeypatch):
    make_project(tmp_path, '["cuda"]')
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["build"])
    assert result.exit_code == 2
    assert "targets must be a non-empty list" in result.output and "'cuda' is not one" in result.output


def test_each_backend_names_its_target():
    assert {backend.target: backend.name for backend in BACKENDS} == {
        "tpu": "tpu",
        "triton": "gpu",
        "mosaic_gpu": "mosaic_gpu",
    }
    assert [backend.name for backend in targeted(("triton",))] == ["gpu"]


# What a module holds


def test_a_tpu_only_module_has_no_gpu_code_runs_and_is_much_shorter(tmp_path):
    path = built(tmp_path, '["tpu"]', "tpu_only")
    text = path.read_text()
    for word in GPU_WORDS:
        assert word not in text, word
    assert "gpu_backend" not in text and "from jax.experimental.pallas import tpu as pltpu" in text
    everything = generate(SPEC, "kernels.pallas", "specs/kernels.pallas")
    assert len(text.splitlines()) < 0.6 * len(everything.splitlines())

    module = load(path, "targets_tpu_only")
    x = jnp.arange(1000, dtype=jnp.float32)
    y = jnp.linspace(0, 1, 1000, dtype=jnp.float32)
    np.testing.assert_allclose(module.add_vectors(x, y), module.add_vectors.reference(x, y))
    a = jax.random.normal(jax.random.key(0), (40, 72), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (72, 24), jnp.float32)
    np.testing.assert_allclose(module.matmul(a, b), module.matmul.reference(a, b), rtol=1e-5, atol=1e-4)
    # jax.grad runs the derived backward kernels, generated for the TPU alone too.
    grad = jax.grad(lambda a: module.matmul(a, b).sum())(a)
    np.testing.assert_allclose(grad, jax.grad(lambda a: module.matmul.reference(a, b).sum())(a), rtol=1e-5, atol=1e-4)


def test_the_bundled_specs_shrink_without_gpu_targets():
    for spec in ("matmul", "softmax"):
        source = (SPECS / f"{spec}.pallas").read_text()
        label = f"specs/{spec}.pallas"
        tpu_only = generate(source, label, label, targets=("tpu",))
        assert len(tpu_only.splitlines()) < 0.7 * len((ROOT / "generated" / f"{spec}.py").read_text().splitlines())
        assert "pltriton" not in tpu_only and "plgpu" not in tpu_only and "gpu_" not in tpu_only


def test_a_triton_only_module_interprets_its_triton_kernels_on_cpu(tmp_path):
    path = built(tmp_path, '["triton"]', "triton_only")
    text = path.read_text()
    assert "pltpu" not in text and "gpu_backend" not in text and "mosaic" not in text
    assert "    triton=_add_vectors_gpu,\n" in text and "    tpu=" not in text
    module = load(path, "targets_triton_only")
    assert module.add_vectors.options == ("gpu_block_n", "gpu_stages", "gpu_warps", "interpret")
    x = jnp.arange(1000, dtype=jnp.float32)
    y = jnp.ones(1000, jnp.float32)
    np.testing.assert_allclose(module.add_vectors(x, y), module.add_vectors.reference(x, y))
    np.testing.assert_allclose(module.add_vectors(x, y, interpret=True), module.add_vectors.reference(x, y))
    a = jax.random.normal(jax.random.key(0), (40, 72), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (72, 24), jnp.float32)
    np.testing.assert_allclose(module.matmul(a, b), module.matmul.reference(a, b), rtol=1e-5, atol=1e-4)
    grad = jax.grad(lambda x: module.add_vectors(x, y).sum())(x)
    np.testing.assert_allclose(grad, jnp.ones_like(x))


BATCHED = """kernel batched {
    in  x: f32[B, M, K]
    in  y: f32[B, K, N]
    out z: f32[B, M, N]
    z = x @ y
    block M = 64, N = 64, K = 64
}
"""


def test_a_triton_only_product_steps_its_batch_without_block_b_1(tmp_path, monkeypatch):
    """Only the TPU's checks ask for `block B = 1`; Triton's product, planned as carried
    state, takes one element of B per program whatever the TPU's blocks say."""
    root = make_project(tmp_path / "batched", '["triton"]', BATCHED)
    pallasgen.build(project=root, use_cache=False)
    module = load(root / "out" / "kernels.py", "targets_triton_batched")
    x = np.random.default_rng(0).standard_normal((3, 40, 72))
    y = np.random.default_rng(1).standard_normal((3, 72, 24))
    z = module.batched(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), gpu_block_m=16, gpu_block_k=32)
    np.testing.assert_allclose(z, np.einsum("bmk,bkn->bmn", x, y), rtol=1e-4, atol=1e-4)
    with_tpu = make_project(
        tmp_path / "with_tpu",
        '["tpu", "triton"]',
        BATCHED.replace("M = 64, N = 64, K = 64", "M = 64, N = 128, K = 128"),
    )
    monkeypatch.chdir(with_tpu)
    result = CliRunner().invoke(main, ["build"])
    assert result.exit_code == 2 and "write block B = 1" in result.output


def test_a_mosaic_gpu_only_module_defaults_to_it_and_refuses_cpu(tmp_path):
    path = built(tmp_path, '["mosaic_gpu"]', "mosaic_only")
    text = path.read_text()
    assert "pltpu" not in text and "pltriton" not in text and "gpu_backend" not in text
    assert "from pallasgen.runtime.support import plgpu" in text
    module = load(path, "targets_mosaic_only")
    assert {"mgpu_block_m", "mgpu_stages"} <= set(module.matmul.options) and "gpu_backend" not in module.matmul.options
    x = jnp.arange(16, dtype=jnp.float32)
    with pytest.raises(NotImplementedError, match=r"add_vectors: no kernel for CPU.*generated for mosaic_gpu only"):
        module.add_vectors(x, x)


def test_both_gpu_targets_keep_the_gpu_backend_keyword(tmp_path):
    checked = check_source(SPEC, "kernels.pallas", ("triton", "mosaic_gpu"))
    plan = plan_module("kernels.pallas", checked, ("triton", "mosaic_gpu"))
    matmul = next(k for k in plan.kernels if k.name == "matmul")
    assert "gpu_backend" in matmul.signature.names and set(matmul.backends) == {"gpu", "mosaic_gpu"}
    alone = plan_module("kernels.pallas", check_source(SPEC, "k", ("mosaic_gpu",)), ("mosaic_gpu",))
    assert "gpu_backend" not in next(k for k in alone.kernels if k.name == "matmul").signature.names


def test_jax_grad_passes_on_only_targeted_keywords():
    mosaic_gpu = next(b for b in BACKENDS if b.target == "mosaic_gpu")
    assert mosaic_gpu.backward_keywords() == ("gpu_backend",)
    assert mosaic_gpu.backward_keywords(("mosaic_gpu",)) == ()
    for targets in (("tpu",), ("mosaic_gpu",)):
        plan = plan_module("k", check_source(SPEC, "k", targets), targets)
        vjp = next(k for k in plan.kernels if k.name == "matmul").gradient
        assert all("gpu_backend" not in call.arguments for call in vjp.calls)
        backward = [k for k in plan.kernels if k.name.startswith("matmul_backward")]
        assert backward and all(set(k.backends) == set(plan.kernels[0].backends) for k in backward)


def test_a_platform_the_module_lacks_is_a_clear_error(tmp_path):
    path = built(tmp_path, '["tpu"]', "tpu_for_export")
    module = load(path, "targets_tpu_for_export")
    x = jnp.ones(256, jnp.float32)
    with pytest.raises(NotImplementedError, match=r"add_vectors: no kernel for NVIDIA GPUs.*generated for tpu only"):
        jax.export.export(module.add_vectors, platforms=["cuda"])(x, x)


# Checks, cache and commands


def test_untargeted_backends_give_no_diagnostics():
    spec = """kernel scale {
    in  x: f32[M, N]
    out y: f32[M, N]
    y = x * 2.0
    block M = 8, N = 100
    gpu block N = 100
}
"""
    from pallasgen.frontend.errors import SpecError

    with pytest.raises(SpecError, match="TPU tiling rule"):
        check_source(spec, "s.pallas", ("tpu",))
    with pytest.raises(SpecError) as error:
        check_source(spec, "s.pallas", ("tpu", "mosaic_gpu"))
    assert "Triton" not in error.value.render()
    with pytest.raises(SpecError) as error:
        check_source(spec, "s.pallas", ("triton",))
    assert "TPU" not in error.value.render()
    check_source(spec, "s.pallas", ("mosaic_gpu",))


def test_the_cache_key_covers_the_targets():
    assert cache.key("s", "l") == cache.key("s", "l", "", TARGETS)
    assert cache.key("s", "l", "", ("tpu",)) != cache.key("s", "l")
    assert cache.key("s", "l", "", ("tpu",)) != cache.key("s", "l", "", ("triton",))


def test_changed_targets_are_not_served_a_stale_module(tmp_path, monkeypatch):
    root = make_project(tmp_path, '["tpu"]', SPEC.split("kernel matmul")[0])
    monkeypatch.setenv("PALLASGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(root)
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    tpu_only = (root / "out" / "kernels.py").read_text()
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text().replace('["tpu"]', '["triton"]'))
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 1, result.output
    assert CliRunner().invoke(main, ["build"]).exit_code == 0
    triton_only = (root / "out" / "kernels.py").read_text()
    assert triton_only != tpu_only and "pltriton" in triton_only and "pltpu" not in triton_only
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_check_passes_on_a_tpu_only_project(tmp_path, monkeypatch):
    root = make_project(tmp_path, '["tpu"]')
    monkeypatch.chdir(root)
    assert CliRunner().invoke(main, ["build", "--no-cache"]).exit_code == 0
    result = CliRunner().invoke(main, ["check", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "1 generated file matches its spec" in result.output
    # The all-targets module would differ: check compares against the configured targets.
    (root / "pyproject.toml").write_text('[tool.pallasgen]\nspecs = "specs"\nout = "out"\n')
    assert CliRunner().invoke(main, ["check", "--no-cache"]).exit_code == 1


def test_commands_for_an_untargeted_backend_say_so(tmp_path, monkeypatch):
    root = make_project(tmp_path, '["tpu"]')
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["show", "specs/kernels.pallas:matmul", "--gpu"])
    assert result.exit_code == 2
    assert "needs the 'triton' target" in result.output and "targets are 'tpu'" in result.output


def test_show_draws_a_tpu_only_projects_tiling(tmp_path, monkeypatch):
    root = make_project(tmp_path, '["tpu"]')
    monkeypatch.chdir(root)
    result = CliRunner().invoke(main, ["show", "specs/kernels.pallas:matmul", "--out", "m.svg"])
    assert result.exit_code == 0, result.output
    assert (root / "m.svg").read_text().startswith("<svg")


REFUSED = """kernel remainder {
    in  x: f32[N]
    in  y: f32[N]
    out z: f32[N]
    z = x % y
}
"""


def test_a_kernel_mosaic_gpu_refuses_has_no_kernel_without_triton(tmp_path):
    alone = generate(REFUSED, "r.pallas", "specs/r.pallas", targets=("mosaic_gpu",))
    words = " ".join(alone.replace("#", " ").split())
    assert "runs on Triton" not in words and "without the triton target, it has no GPU kernel" in words
    assert "This kernel has no GPU kernel (the module has no Triton kernels)" in words
    both = generate(REFUSED, "r.pallas", "specs/r.pallas", targets=("triton", "mosaic_gpu"))
    words = " ".join(both.replace("#", " ").split())
    assert "it runs on Triton." in words and "This kernel runs on Triton either way" in words
    path = tmp_path / "refused_alone.py"
    path.write_text(alone)
    module = load(path, "targets_refused_alone")
    x = jnp.ones(8, jnp.float32)
    with pytest.raises(NotImplementedError, match=r"remainder: no kernel for any platform \(Mosaic GPU does not take"):
        module.remainder(x, x)
