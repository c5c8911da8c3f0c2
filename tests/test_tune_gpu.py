"""`pallasgen tune --gpu` without a GPU: the search over Triton's blocks, warps and stages
with a stand-in timer, what it records per device kind in the spec's tuning file, how a
generated module reads that table at call time, and the clear refusal where jax finds
no CUDA device."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import take_gpu_branch
from test_cli import pallasgen, project, write  # noqa: F401  (a fixture)

from pallasgen.analysis.tuning import TunedBlocks, kernel_fingerprint
from pallasgen.devices import bench, gpu_tune
from pallasgen.devices.runner import load_module
from pallasgen.workspace.pipeline import check_source
from pallasgen.workspace.tuning import Entry, entry_for, format_tuning, read_tuning, with_entry

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
MATMUL = """\
kernel mm {
    in  x: f32[M, K]
    in  y: f32[K, N]
    out z: f32[M, N]
    z = x @ y
}
"""
BEST = {"gpu_block_m": 128, "gpu_block_n": 128, "gpu_block_k": 32, "gpu_warps": 8, "gpu_stages": 4}


def checked(source: str = MATMUL):
    return check_source(source, "spec.pallas")[0]


class StandInTimer:
    """A `time_pair` whose kernel time grows with each keyword's distance (in doublings,
    or steps of warps and stages) from BEST, and that rejects blocks of N above 128."""

    def __init__(self):
        self.calls = []

    def __call__(self, first, second):
        keywords = first()
        second()
        self.calls.append(keywords)
        if keywords["gpu_block_n"] > 128:
            raise RuntimeError("out of shared memory")
        distance = sum(abs(math.log2(keywords[k]) - math.log2(v)) for k, v in BEST.items())
        return 1e-3 * (1 + distance), 2e-3


def stand_in_module():
    """A module whose kernel `mm` returns the keywords it was called with."""
    def mm(*arrays, **keywords):
        return keywords

    mm.reference = lambda *arrays: jnp.zeros(())
    return SimpleNamespace(mm=mm)


def test_the_search_walks_from_the_specs_choices_to_the_fastest_and_rejects_what_fails():
    timer, mm = StandInTimer(), checked()
    found = gpu_tune.tune_gpu(timer, stand_in_module(), mm, [], {"M": 4096, "N": 4096, "K": 4096}, 64, lambda n: None)
    assert dict(found.best.blocks) == BEST
    assert found.start.blocks == (
        ("gpu_block_k", 32),
        ("gpu_block_m", 64),
        ("gpu_block_n", 64),
        ("gpu_stages", 3),
        ("gpu_warps", 4),
    )  # the spec's: 64x64x32 tiles for f32, 4 warps, 3 stages
    assert found.xla_cost == 2e-3
    rejected = [t for t in found.trials if t.cost is None]
    assert rejected and all(dict(t.blocks)["gpu_block_n"] > 128 for t in rejected)
    assert rejected[0].error == "RuntimeError: out of shared memory"
    assert all(call["gpu_backend"] == "triton" for call in timer.calls)


def test_the_search_stops_at_its_budget():
    timer = StandInTimer()
    found = gpu_tune.tune_gpu(timer, stand_in_module(), checked(), [], {"M": 64, "N": 64, "K": 64}, 3, lambda n: None)
    assert len(found.trials) == len(timer.calls) == 3


def test_blocks_are_powers_of_two_up_to_the_dimension_and_options_those_the_spec_may_set():
    options = gpu_tune.choices(checked(), {"M": 100, "N": 5000, "K": 16})
    assert options["gpu_block_m"] == [16, 32, 64, 128]
    assert options["gpu_block_n"] == [16, 32, 64, 128, 256, 512, 1024]
    assert options["gpu_block_k"] == [16]
    assert options["gpu_warps"] == [1, 2, 4, 8, 16, 32] and options["gpu_stages"] == list(range(1, 9))


def gpu_entry(kernel, device: str, sizes: dict, blocks: dict, options: dict) -> Entry:
    return Entry(TunedBlocks(device, tuple(sizes.items()), tuple(blocks.items()), tuple(options.items())), {}, {})


def test_gpu_entries_are_kept_per_device_kind_and_size_bucket_beside_the_tpu_ones():
    mm = checked()
    sizes = {"M": 4096, "N": 4096, "K": 4096}
    tpu = Entry(TunedBlocks("v5e", tuple(sizes.items()), (("M", 512), ("N", 512), ("K", 512))), {}, {})
    tuning = with_entry({}, mm, tpu)
    first = gpu_entry(mm, H100, sizes, {"M": 64, "N": 64, "K": 32}, {"warps": 4, "stages": 3})
    other = gpu_entry(mm, H200, sizes, {"M": 32, "N": 64, "K": 32}, {"warps": 4, "stages": 2})
    tuning = with_entry(with_entry(tuning, mm, first, "gpu"), mm, other, "gpu")
    better = gpu_entry(mm, H100, {"M": 4000, "N": 4096, "K": 4096}, dict(M=128, N=64, K=32), {"warps": 8, "stages": 4})
    tuning = with_entry(tuning, mm, better, "gpu")
    read = read_tuning(format_tuning(tuning), "spec.tuning.json")
    assert read["mm"].entries("tpu") == (tpu,)
    assert [e.blocks.chip for e in read["mm"].entries("gpu")] == [H100, H200]
    assert entry_for(read, mm, H100, sizes, "gpu").blocks == better.blocks
    assert entry_for(read, mm, H100, sizes) is None  # a TPU lookup never finds a GPU entry
    item = json.loads(format_tuning(read))["kernels"]["mm"]["tuned_gpu"][0]
    assert item["device"] == H100 and item["options"] == {"warps": 8, "stages": 4}


def test_a_file_without_gpu_entries_is_written_as_before():
    mm = checked()
    tpu = Entry(TunedBlocks("v5e", (("M", 8), ("N", 8), ("K", 8)), (("M", 8), ("N", 8), ("K", 8))), {}, {})
    assert "tuned_gpu" not in format_tuning(with_entry({}, mm, tpu))


def build_with_gpu_tuning(project, *entries) -> object:  # noqa: F811
    write(project / "specs" / "mm.pallas", MATMUL)
    tuning = {}
    for entry in entries:
        tuning = with_entry(tuning, checked(), entry, "gpu")
    write(project / "specs" / "mm.tuning.json", format_tuning(tuning))
    result = pallasgen("build")
    assert result.exit_code == 0, result.output
    path = project / "generated" / "mm.py"
    return load_module(path.read_text(), path)


def test_a_call_without_gpu_blocks_takes_the_nearest_entry_tuned_for_its_gpu(project, monkeypatch):  # noqa: F811
    mm = checked()
    big = gpu_entry(mm, H100, dict(M=4096, N=4096, K=4096), dict(M=128, N=64, K=32), {"warps": 8, "stages": 4})
    small = gpu_entry(mm, H100, dict(M=256, N=256, K=256), dict(M=32, N=32, K=16), {"warps": 2, "stages": 2})
    module = build_with_gpu_tuning(project, big, small)
    table = module.mm.triton_options.table
    assert table[None] == (64, 64, 32, 4, 3)

    def chosen(kind, sizes, given=(None,) * 5):
        monkeypatch.setattr(module.rt, "gpu_device_kind", lambda: kind)
        return module.rt.gpu_options(table, sizes, given)

    assert chosen(H100, (4096, 8192, 4096)) == (128, 64, 32, 8, 4)
    assert chosen(H100, (300, 200, 256)) == (32, 32, 16, 2, 2)
    assert chosen(H100, (4096, 4096, 4096), (None, 256, None, None, 1)) == (128, 256, 32, 8, 1)  # given ones win
    assert chosen(H200, (4096, 4096, 4096)) == table[None]  # a GPU not tuned for: the spec's
    assert chosen(None, (4096, 4096, 4096)) == table[None]  # no GPU


def test_the_tuned_choice_reaches_the_triton_launch_and_the_kernel_still_computes_right(
    project, monkeypatch  # noqa: F811
):
    mm = checked()
    entry = gpu_entry(mm, H100, dict(M=32, N=32, K=64), dict(M=16, N=32, K=16), {"warps": 2, "stages": 1})
    module = build_with_gpu_tuning(project, entry)
    take_gpu_branch(monkeypatch, module)
    monkeypatch.setattr(module.rt, "gpu_device_kind", lambda: H100)
    launched = []
    choose = module.rt.gpu_options
    monkeypatch.setattr(module.rt, "gpu_options", lambda *args: launched.append(choose(*args)) or launched[-1])
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 64), np.float32), rng.standard_normal((64, 32), np.float32)
    np.testing.assert_allclose(np.asarray(module.mm(x, y, interpret=True)), x @ y, rtol=1e-4, atol=1e-4)
    assert launched == [(16, 32, 16, 2, 1)]


@pytest.mark.parametrize(
    "blocks, options, message",
    [
        ({"M": 48, "N": 64, "K": 32}, {"warps": 4, "stages": 3}, "GPU block M=48 is not a power of two"),
        ({"M": 64, "N": 64}, {"warps": 4, "stages": 3}, "GPU blocks for M, N, but the kernel's GPU blocks are M, N, K"),
        ({"M": 64, "N": 64, "K": 32}, {"warps": 3, "stages": 3}, "GPU option warps is 3, not one of 1, 2, 4,"),
    ],
)
def test_gpu_entries_that_do_not_fit_the_kernel_are_an_error_naming_it(project, blocks, options, message):  # noqa: F811
    write(project / "specs" / "mm.pallas", MATMUL)
    entry = {"device": H100, "sizes": {"M": 64, "N": 64, "K": 64}, "blocks": blocks, "options": options}
    kernels = {"mm": {"fingerprint": kernel_fingerprint(checked().kernel), "tuned": [], "tuned_gpu": [entry]}}
    write(project / "specs" / "mm.tuning.json", json.dumps({"kernels": kernels}))
    result = pallasgen("build")
    assert result.exit_code == 2
    assert result.stderr.startswith("specs/mm.tuning.json:1:14: error: kernel 'mm': ")
    assert message in result.stderr


def test_tune_gpu_without_a_cuda_device_says_it_needs_one(project):  # noqa: F811
    result = pallasgen("tune", "specs/add_vectors.pallas", "--gpu", "--size", "N=4096")
    assert result.exit_code == 2
    assert result.stderr == (
        "pallasgen: error: pallasgen tune --gpu times kernels on a CUDA device, and jax finds none here\n"
    )
    assert not (project / "specs" / "add_vectors.tuning.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "tune needs --chip (a compile-only TPU) or --gpu (this machine's CUDA GPU), one of them"),
        (("--gpu", "--chip", "v5e"), "tune needs --chip (a compile-only TPU) or --gpu"),
        (("--gpu", "--block", "N=1024"), "--block starts a TPU search; --gpu starts from the spec's GPU blocks"),
    ],
)
def test_tune_takes_a_tpu_or_a_gpu(project, args, message):  # noqa: F811
    result = pallasgen("tune", "specs/add_vectors.pallas", "--size", "N=4096", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_tune_gpu_records_the_fastest_choice_for_the_device_kind(project, monkeypatch):  # noqa: F811
    """On a GPU (here a stand-in device kind and timer), the best choice is written for
    that kind of GPU and the next build renders it."""
    monkeypatch.setattr(gpu_tune, "cuda_device_kind", lambda: H100)

    def stand_in_time_pair(first, second, repeats):  # first: the kernel's call, with its keywords
        return {256: 1e-4, 512: 5e-5}.get(first.keywords["gpu_block_n"], 2e-4), 1e-4

    monkeypatch.setattr(bench, "time_pair", stand_in_time_pair)
    result = pallasgen("tune", "specs/add_vectors.pallas", "--gpu", "--size", "N=4096", "--budget", "8")
    assert result.exit_code == 0, result.output
    assert f"add_vectors on {H100}: gpu_block_n=512" in result.stdout
    (entry,) = json.loads((project / "specs" / "add_vectors.tuning.json").read_text())["kernels"]["add_vectors"][
        "tuned_gpu"
    ]
    assert entry["device"] == H100 and entry["sizes"] == {"N": 4096} and entry["blocks"] == {"N": 512}
    assert entry["measure"]["kernel_seconds"] == 5e-5 and entry["measure"]["ratio"] == 2.0
    assert pallasgen("build").exit_code == 0
    generated = (project / "generated" / "add_vectors.py").read_text()
    assert f'"{H100}": {{(4096,): (512, 4, 1)}}' in generated
