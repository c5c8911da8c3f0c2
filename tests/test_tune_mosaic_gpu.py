"""`pallasgen tune --gpu --gpu-backend mosaic_gpu` without a GPU: the search over a Mosaic
GPU product's blocks and pipeline stages with a stand-in timer, the entries kept per
device kind apart from Triton's, the `mgpu_*` keywords a generated product takes (read
from that table at call time, checked before anything compiles), and the refusals."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu
from kernel_cases import take_gpu_branch
from test_cli import pallasgen, project, write  # noqa: F401  (a fixture)
from test_mosaic_gpu import interpreted
from test_tune_gpu import H100, H200, MATMUL, checked, gpu_entry

from pallasgen.analysis.tuning import kernel_fingerprint
from pallasgen.devices import bench, gpu_tune
from pallasgen.devices.runner import load_module
from pallasgen.workspace.tuning import entry_for, format_tuning, read_tuning, with_entry

BEST = {"mgpu_block_m": 128, "mgpu_block_n": 64, "mgpu_block_k": 16, "mgpu_stages": 4}
SIZES = {"M": 4096, "N": 4096, "K": 4096}


class StandInTimer:
    """A `time_pair` whose kernel time grows with each keyword's distance (in doublings) from BEST."""

    def __init__(self):
        self.calls = []

    def __call__(self, first, second):
        keywords = first()
        second()
        self.calls.append(keywords)
        distance = sum(abs(math.log2(keywords[k]) - math.log2(v)) for k, v in BEST.items())
        return 1e-3 * (1 + distance), 2e-3


def stand_in_module():
    def mm(*arrays, **keywords):
        return keywords

    mm.reference = lambda *arrays: jnp.zeros(())
    return SimpleNamespace(mm=mm)


def test_the_search_walks_from_the_built_in_choices_to_the_fastest_on_mosaic_gpu():
    timer = StandInTimer()
    found = gpu_tune.tune_gpu(timer, stand_in_module(), checked(), [], SIZES, 64, lambda n: None, backend="mosaic_gpu")
    assert dict(found.best.blocks) == BEST
    assert dict(found.start.blocks) == {"mgpu_block_m": 128, "mgpu_block_n": 128, "mgpu_block_k": 32, "mgpu_stages": 2}
    assert all(call["gpu_backend"] == "mosaic_gpu" for call in timer.calls)
    # Never timed: an accumulator above one warpgroup's registers (128 x 256).
    assert not any(call["mgpu_block_m"] * call["mgpu_block_n"] > 128 * 128 for call in timer.calls)


def test_mosaic_gpu_choices_are_wgmma_tiles_and_pipeline_depths():
    assert gpu_tune.choices(checked(), SIZES, "mosaic_gpu") == {
        "mgpu_block_m": [64, 128],
        "mgpu_block_n": [64, 128, 256],
        "mgpu_block_k": [8, 16, 32],  # f32 rows of 32, 64 and 128 bytes
        "mgpu_stages": [1, 2, 3, 4, 5, 6],
    }
    bf16 = checked(MATMUL.replace("f32", "bf16"))
    assert gpu_tune.choices(bf16, SIZES, "mosaic_gpu")["mgpu_block_k"] == [64]  # wgmma: swizzles must match


def test_mosaic_gpu_entries_are_kept_apart_from_tritons():
    mm = checked()
    triton = gpu_entry(mm, H100, SIZES, {"M": 64, "N": 64, "K": 32}, {"warps": 4, "stages": 3})
    mosaic = gpu_entry(mm, H100, SIZES, {"M": 128, "N": 64, "K": 16}, {"stages": 4})
    tuning = with_entry(with_entry({}, mm, triton, "gpu"), mm, mosaic, "mosaic_gpu")
    read = read_tuning(format_tuning(tuning), "spec.tuning.json")
    assert entry_for(read, mm, H100, SIZES, "gpu").blocks == triton.blocks
    assert entry_for(read, mm, H100, SIZES, "mosaic_gpu").blocks == mosaic.blocks
    item = json.loads(format_tuning(read))["kernels"]["mm"]["tuned_mosaic_gpu"][0]
    assert (
        item["device"] == H100 and item["blocks"] == {"M": 128, "N": 64, "K": 16} and item["options"] == {"stages": 4}
    )


def build(project, *entries):  # noqa: F811
    write(project / "specs" / "mm.pallas", MATMUL)
    tuning = {}
    for entry in entries:
        tuning = with_entry(tuning, checked(), entry, "mosaic_gpu")
    write(project / "specs" / "mm.tuning.json", format_tuning(tuning))
    result = pallasgen("build")
    assert result.exit_code == 0, result.output
    path = project / "generated" / "mm.py"
    return load_module(path.read_text(), path)


def test_a_call_without_mgpu_keywords_takes_the_nearest_entry_tuned_for_its_gpu(project, monkeypatch):  # noqa: F811
    big = gpu_entry(checked(), H100, SIZES, {"M": 128, "N": 64, "K": 16}, {"stages": 4})
    small = gpu_entry(checked(), H100, {"M": 256, "N": 256, "K": 256}, {"M": 64, "N": 64, "K": 8}, {"stages": 1})
    module = build(project, big, small)
    table = module.mm.mosaic_gpu_options.table
    assert table[None] == (128, 128, 32, 2)

    def chosen(kind, sizes, given=(None,) * 4):
        monkeypatch.setattr(module.rt, "gpu_device_kind", lambda: kind)
        return module.rt.gpu_options(table, sizes, given)

    assert chosen(H100, (4096, 8192, 4096)) == (128, 64, 16, 4)
    assert chosen(H100, (300, 200, 256)) == (64, 64, 8, 1)
    assert chosen(H100, (4096, 4096, 4096), (None, 256, None, 1)) == (128, 256, 16, 1)  # given ones win
    assert chosen(H200, (4096, 4096, 4096)) == table[None]


def exported(module, **keywords) -> str:
    args = [jax.ShapeDtypeStruct((200, 300), jnp.float32), jax.ShapeDtypeStruct((300, 260), jnp.float32)]
    call = jax.jit(lambda x, y: module.mm(x, y, gpu_backend="mosaic_gpu", **keywords))
    return jax.export.export(call, platforms=["cuda"])(*args).mlir_module()


def test_the_mgpu_keywords_reach_the_pipeline(project):  # noqa: F811
    module = build(project)
    text = exported(module, mgpu_block_m=64, mgpu_block_n=256, mgpu_block_k=8, mgpu_stages=3)
    assert "mosaic_gpu" in text
    launched = []
    launcher = module._mm_mosaic_gpu_kernel
    module._mm_mosaic_gpu_kernel = lambda *refs, **keywords: launched.append(keywords) or launcher(*refs, **keywords)
    exported(module, mgpu_block_m=64, mgpu_block_n=256, mgpu_block_k=8, mgpu_stages=3)
    assert launched[-1] == {"block_m": 64, "block_n": 256, "block_k": 8, "stages": 3}


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"mgpu_block_m": 96}, "mm: mgpu_block_m must be one of 64, 128 or None, got 96"),
        ({"mgpu_block_k": 64}, "mm: mgpu_block_k must be one of 8, 16, 32 or None, got 64"),
        ({"mgpu_stages": 0}, "mm: mgpu_stages must be one of 1, 2, 3, 4, 5, 6 or None, got 0"),
        ({"mgpu_stages": 2.0}, "mm: mgpu_stages must be one of 1, 2, 3, 4, 5, 6 or None, got 2.0"),
        ({"mgpu_block_m": 128, "mgpu_block_n": 256}, "mm: a Mosaic GPU accumulator of 32768 elements"),
        (
            {"mgpu_block_m": 64, "mgpu_block_n": 256, "mgpu_stages": 6},
            "mm: these Mosaic GPU blocks and stages take 240 KiB of shared memory, more than the 227 KiB of a block",
        ),
    ],
)
def test_mgpu_keywords_mosaic_gpu_cannot_run_are_a_clear_error(project, keywords, message):  # noqa: F811
    module = build(project)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        exported(module, **keywords)


def test_a_tuned_entry_mosaic_gpu_cannot_run_is_an_error_naming_it(project):  # noqa: F811
    write(project / "specs" / "mm.pallas", MATMUL)
    entry = {"device": H100, "sizes": SIZES, "blocks": {"M": 96, "N": 64, "K": 16}, "options": {"stages": 2}}
    kernels = {"mm": {"fingerprint": kernel_fingerprint(checked().kernel), "tuned": [], "tuned_mosaic_gpu": [entry]}}
    write(project / "specs" / "mm.tuning.json", json.dumps({"kernels": kernels}))
    result = pallasgen("build")
    assert result.exit_code == 2
    assert "error: kernel 'mm': Mosaic GPU block M=96 is not one of 64, 128" in result.stderr


def test_tune_gpu_for_mosaic_gpu_records_the_fastest_choice_for_the_device_kind(project, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gpu_tune, "cuda_device_kind", lambda: H100)

    def stand_in_time_pair(first, second, repeats):
        assert first.keywords["gpu_backend"] == "mosaic_gpu"
        return (5e-5 if first.keywords["mgpu_stages"] == 3 else 1e-4), 1e-4

    monkeypatch.setattr(bench, "time_pair", stand_in_time_pair)
    write(project / "specs" / "mm.pallas", MATMUL)
    args = ("--gpu", "--gpu-backend", "mosaic_gpu", "--size", "M=256", "--size", "N=256", "--size", "K=256")
    result = pallasgen("tune", "specs/mm.pallas", *args, "--budget", "12")
    assert result.exit_code == 0, result.output
    assert f"mm on {H100}: mgpu_block_k=32, mgpu_block_m=128, mgpu_block_n=128, mgpu_stages=3" in result.stdout
    kernel = json.loads((project / "specs" / "mm.tuning.json").read_text())["kernels"]["mm"]
    (entry,) = kernel["tuned_mosaic_gpu"]
    assert entry["blocks"] == {"M": 128, "N": 128, "K": 32} and entry["options"] == {"stages": 3}
    assert "tuned_gpu" not in kernel
    assert pallasgen("build").exit_code == 0
    assert f'"{H100}": {{(256, 256, 256): (128, 128, 32, 3)}}' in (project / "generated" / "mm.py").read_text()


def test_tune_gpu_for_mosaic_gpu_of_kernels_without_its_blocks_says_so(project, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gpu_tune, "cuda_device_kind", lambda: H100)
    result = pallasgen("tune", "specs/add_vectors.pallas", "--gpu", "--gpu-backend", "mosaic_gpu", "--size", "N=4096")
    assert result.exit_code == 2
    assert "add_vectors: no Mosaic GPU blocks to tune (only a product it takes has them)" in result.stderr
    assert "error: none of these kernels has Mosaic GPU blocks to tune" in result.stderr


def test_tune_gpu_for_mosaic_gpu_without_a_cuda_device_says_it_needs_one(project):  # noqa: F811
    args = ("--gpu", "--gpu-backend", "mosaic_gpu", "--size", "M=64", "--size", "N=64", "--size", "K=64")
    write(project / "specs" / "mm.pallas", MATMUL)
    result = pallasgen("tune", "specs/mm.pallas", *args)
    assert result.exit_code == 2
    assert result.stderr.endswith("pallasgen tune --gpu times kernels on a CUDA device, and jax finds none here\n")


def test_gpu_backend_without_gpu_is_a_usage_error(project):  # noqa: F811
    result = pallasgen("tune", "specs/add_vectors.pallas", "--chip", "v5e", "--gpu-backend", "mosaic_gpu")
    assert result.exit_code == 2 and "--gpu-backend chooses what --gpu tunes" in result.stderr


@interpreted
@pytest.mark.parametrize("blocks", [(64, 256, 8, 3), (128, 64, 16, 1), (64, 64, 32, 6)])
def test_a_product_with_other_blocks_and_stages_agrees_at_ragged_sizes(project, monkeypatch, blocks):  # noqa: F811
    module = build(project)
    take_gpu_branch(monkeypatch, module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((200, 300), np.float32), rng.standard_normal((300, 260), np.float32)
    keywords = dict(zip(("mgpu_block_m", "mgpu_block_n", "mgpu_block_k", "mgpu_stages"), blocks))
    got = module.mm(x, y, gpu_backend="mosaic_gpu", interpret=plgpu.InterpretGPUParams(), **keywords)
    np.testing.assert_allclose(np.asarray(got), x @ y, rtol=1e-4, atol=1e-3)


def test_a_second_search_starts_from_the_entry_tuned_before_unless_it_no_longer_fits():
    before = gpu_entry(checked(), H100, SIZES, {"M": 64, "N": 256, "K": 8}, {"stages": 3}).blocks
    found = gpu_tune.tune_gpu(StandInTimer(), stand_in_module(), checked(), [], SIZES, 1, print, before, "mosaic_gpu")
    assert dict(found.start.blocks) == {"mgpu_block_m": 64, "mgpu_block_n": 256, "mgpu_block_k": 8, "mgpu_stages": 3}
    edited = gpu_entry(checked(), H100, SIZES, {"M": 64, "N": 256}, {"stages": 3}).blocks  # K's block missing
    found = gpu_tune.tune_gpu(StandInTimer(), stand_in_module(), checked(), [], SIZES, 1, print, edited, "mosaic_gpu")
    assert dict(found.start.blocks)["mgpu_block_k"] == 32  # the built-in start
