"""Tuned blocks: the tuning file `pallasgen tune` writes beside a spec, how `build` renders
it, which blocks a call takes on each chip, how `check` finds a stale tuning, and the
search itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_cli import ADD_VECTORS, pallasgen, project, write  # noqa: F401  (a fixture)

from pallasgen.analysis.tuning import TunedBlocks, kernel_fingerprint
from pallasgen.backends.tpu.chips import CHIPS, chip_blocks
from pallasgen.backends.tpu.plan import tunable_dims
from pallasgen.devices.compile_only import CompileError
from pallasgen.devices.runner import load_module
from pallasgen.devices.tune import block_choices, search, start_blocks
from pallasgen.workspace.pipeline import check_source, generate
from pallasgen.workspace.tuning import Entry, format_tuning, read_tuning, size_bucket, with_entry

MATMUL = """\
kernel mm {
    in  x: bf16[M, K]
    in  y: bf16[K, N]
    out z: f32[M, N]
    z = x @ y
    block M = 128, N = 128, K = 128
}
"""
V5E, V6E = CHIPS


def checked(source: str = ADD_VECTORS):
    return check_source(source, "spec.pallas")[0]


def tuning_file(kernel, *entries: tuple[str, dict, dict]) -> str:
    """A tuning file for `kernel` with (chip, sizes, blocks) entries."""
    tuning = {}
    for chip, sizes, blocks in entries:
        entry = Entry(TunedBlocks(chip, tuple(sizes.items()), tuple(blocks.items())), {"kernel_cycles": 1}, {})
        tuning = with_entry(tuning, kernel, entry)
    return format_tuning(tuning)


def test_a_kernels_fingerprint_follows_what_it_computes_not_its_layout_doc_or_block_values():
    base = kernel_fingerprint(checked().kernel)
    moved = "\n\n" + ADD_VECTORS.replace("# Adds two vectors.", "# Sums.").replace("    z =", "      z =")
    assert kernel_fingerprint(checked(moved).kernel) == base
    assert kernel_fingerprint(checked(ADD_VECTORS.replace("1024", "2048")).kernel) == base
    assert kernel_fingerprint(checked(ADD_VECTORS.replace("x + y", "x - y")).kernel) != base
    assert kernel_fingerprint(checked(ADD_VECTORS.replace("f32[N]", "bf16[N]")).kernel) != base
    assert kernel_fingerprint(checked(ADD_VECTORS.replace("    block N = 1024\n", "")).kernel) != base


def test_sizes_fall_in_buckets_of_the_nearest_power_of_two():
    assert size_bucket({"M": 4096, "N": 4000, "K": 50257, "B": 1, "S": 3}) == {
        "M": 4096,
        "N": 4096,
        "K": 65536,
        "B": 1,
        "S": 2,
    }


def test_a_new_entry_replaces_the_one_of_its_chip_and_bucket_and_keeps_the_others():
    kernel = checked()
    text = tuning_file(
        kernel,
        ("v5e", {"N": 4096}, {"N": 1024}),
        ("v6e", {"N": 4096}, {"N": 2048}),
        ("v5e", {"N": 4000}, {"N": 4096}),  # the same bucket as 4096 on v5e: replaces it
        ("v5e", {"N": 1 << 20}, {"N": 8192}),
    )
    (tuned,) = read_tuning(text, "t.json").values()
    assert [(e.blocks.chip, dict(e.blocks.sizes), dict(e.blocks.blocks)) for e in tuned.entries("tpu")] == [
        ("v5e", {"N": 4000}, {"N": 4096}),
        ("v5e", {"N": 1 << 20}, {"N": 8192}),
        ("v6e", {"N": 4096}, {"N": 2048}),
    ]
    assert tuned.fingerprint == kernel_fingerprint(kernel.kernel)


def test_the_tuning_file_is_sorted_indented_json_with_one_line_per_innermost_object():
    text = tuning_file(checked(), ("v5e", {"N": 4096}, {"N": 1024}))
    assert json.loads(text)["kernels"]["add_vectors"]["tuned"][0]["blocks"] == {"N": 1024}
    assert '          "sizes": {"N": 4096},\n          "blocks": {"N": 1024},\n' in text
    assert format_tuning(read_tuning(text, "t.json")) == text
    assert text.endswith("}\n")


def test_build_renders_tuned_blocks_into_the_module_and_check_is_clean(project):  # noqa: F811
    text = tuning_file(checked(), ("v6e", {"N": 1 << 20}, {"N": 8192}), ("v5e", {"N": 4096}, {"N": 2048}))
    write(project / "specs" / "add_vectors.tuning.json", text)
    assert pallasgen("build").exit_code == 0
    module = (project / "generated" / "add_vectors.py").read_text()
    assert 'None: {"default": (1024,)}' in module
    assert '"v5e": {(4096,): (2048,)}' in module  # no "default": the chip's is None's
    assert '"v6e": {(1048576,): (8192,)}' in module
    result = pallasgen("check")
    assert result.exit_code == 0, result.output


def test_a_changed_tuning_file_makes_the_module_stale(project):  # noqa: F811
    assert pallasgen("build").exit_code == 0
    write(project / "specs" / "add_vectors.tuning.json", tuning_file(checked(), ("v5e", {"N": 4096}, {"N": 2048})))
    result = pallasgen("check")
    assert result.exit_code == 1
    assert "generated/add_vectors.py: differs from what specs/add_vectors.pallas generates" in result.output


def test_check_reports_a_kernel_changed_since_it_was_tuned_and_build_leaves_its_blocks_out(project):  # noqa: F811
    write(project / "specs" / "add_vectors.tuning.json", tuning_file(checked(), ("v5e", {"N": 4096}, {"N": 2048})))
    write(project / "specs" / "add_vectors.pallas", ADD_VECTORS.replace("x + y", "x * y"))
    built = pallasgen("build")
    assert built.exit_code == 0
    assert "warning: specs/add_vectors.tuning.json: 'add_vectors' changed since it was tuned" in built.stderr
    assert "(4096,): (2048,)" not in (project / "generated" / "add_vectors.py").read_text()
    result = pallasgen("check")
    assert result.exit_code == 1
    assert (
        "specs/add_vectors.tuning.json: 'add_vectors' changed since it was tuned; run `pallasgen tune` again,"
        " or remove its entry" in result.output
    )
    assert result.stdout.splitlines()[-1] == "pallasgen check: 1 tuned kernel changed since it was tuned"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"kernels": {\n  "add_vectors": [}\n}', "specs/add_vectors.tuning.json:2:19: error: Expecting value"),
        ('{"kernels": []}', 'specs/add_vectors.tuning.json:1:1: error: expected an object with "kernels"'),
        (
            '{"kernels": {\n  "add_vectors": {"fingerprint": "x", "tuned": [{"chip": "v5e"}]}}}',
            'specs/add_vectors.tuning.json:2:3: error: kernel \'add_vectors\': each entry has "chip", "sizes"',
        ),
    ],
)
def test_a_malformed_tuning_file_is_an_error_at_its_line_and_nothing_is_written(project, text, message):  # noqa: F811
    write(project / "specs" / "add_vectors.tuning.json", text)
    result = pallasgen("build")
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (project / "generated").exists()


@pytest.mark.parametrize(
    "chip, blocks, message",
    [
        ("v5e", {"N": 1000}, "block N = 1000 breaks the TPU tiling rule"),
        ("v4", {"N": 1024}, "unknown chip 'v4' (known: v5e, v6e)"),
        ("v5e", {"M": 1024}, "blocks for M, but the kernel blocks N"),
        ("v5e", {"N": 1 << 24}, "more than the 100.0 MiB a kernel may ask"),
    ],
)
def test_tuned_blocks_that_do_not_fit_the_kernel_are_an_error_naming_it(project, chip, blocks, message):  # noqa: F811
    entry = {"chip": chip, "sizes": {"N": 1 << 24}, "blocks": blocks}
    text = json.dumps(
        {"kernels": {"add_vectors": {"fingerprint": kernel_fingerprint(checked().kernel), "tuned": [entry]}}}
    )
    write(project / "specs" / "add_vectors.tuning.json", text)
    result = pallasgen("build")
    assert result.exit_code == 2
    assert result.stderr.startswith("specs/add_vectors.tuning.json:1:14: error: kernel 'add_vectors': ")
    assert message in result.stderr


def test_a_call_without_blocks_takes_the_nearest_tuned_entry_for_its_chip_else_the_chips_default(
    project, monkeypatch  # noqa: F811
):
    write(project / "specs" / "mm.pallas", MATMUL)
    mm = checked(MATMUL)
    text = tuning_file(mm, ("v6e", dict(M=4096, N=4096, K=4096), dict(M=512, N=1024, K=2048)))
    write(project / "specs" / "mm.tuning.json", text)
    assert pallasgen("build").exit_code == 0
    path = project / "generated" / "mm.py"
    module = load_module(path.read_text(), path)
    table, spec = module.mm.tpu_blocks, (128, 128, 128)

    def blocks(chip, sizes, given=(None, None, None)):
        monkeypatch.setattr(module.rt, "tpu_chip", lambda: chip)
        return module.rt.tpu_blocks(table, sizes, given)

    assert blocks("v6e", (4096, 4096, 4096)) == (512, 1024, 2048)
    assert blocks("v6e", (8192, 2048, 4096)) == (512, 1024, 2048)  # the nearest (only) bucket
    assert blocks("v6e", (4096, 4096, 4096), (256, None, None)) == (256, 1024, 2048)  # a given block wins
    assert blocks("v5e", (4096, 4096, 4096)) == tuple(chip_blocks(mm, ["M", "N", "K"], V5E).values())
    assert blocks(None, (4096, 4096, 4096)) == spec  # CPU, or a TPU with no table


def test_the_chosen_blocks_reach_the_kernels_grid_and_it_still_computes_right(project, monkeypatch):  # noqa: F811
    write(project / "specs" / "mm.pallas", MATMUL)
    write(
        project / "specs" / "mm.tuning.json",
        tuning_file(checked(MATMUL), ("v6e", dict(M=256, N=256, K=512), dict(M=128, N=256, K=256))),
    )
    assert pallasgen("build").exit_code == 0
    path = project / "generated" / "mm.py"
    module = load_module(path.read_text(), path)
    monkeypatch.setattr(module.rt, "tpu_chip", lambda: "v6e")
    x = jax.random.normal(jax.random.key(0), (256, 512), jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (512, 256), jnp.bfloat16)
    jaxpr = str(jax.make_jaxpr(lambda x, y: module.mm(x, y, interpret=True))(x, y))
    assert "grid=(2,1,2)" in jaxpr.replace(" ", "")
    expected = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    np.testing.assert_allclose(np.asarray(module.mm(x, y, interpret=True)), expected, rtol=1e-4, atol=1e-3)


def test_a_chips_default_grows_a_products_blocks_to_its_mxu_within_its_vmem_and_keeps_the_rest():
    mm = checked(MATMUL)
    assert chip_blocks(mm, ["M", "N", "K"], V5E) == {"M": 512, "N": 512, "K": 512}
    assert chip_blocks(mm, ["M", "N", "K"], V6E) == {"M": 1024, "N": 1024, "K": 1024}
    f32 = checked(MATMUL.replace("bf16", "f32").replace("128, N = 128, K = 128", "256, N = 256, K = 4096"))
    # 1024 x 1024 x 4096 f32 blocks need 76 MiB: N gives way (K is never below the spec's).
    assert chip_blocks(f32, ["M", "N", "K"], V6E) == {"M": 1024, "N": 256, "K": 4096}
    adds = checked()
    assert chip_blocks(adds, tunable_dims(adds), V6E) == {"N": 1024}


def test_a_product_of_a_computed_operand_takes_the_chips_product_blocks_too():
    """relu's backward kernel for x (its operand the cotangent masked where the product was
    positive) is fed as the product of two inputs is; a softmax's row, held whole, is not
    (its size decides what fits in VMEM: its blocks grow at the call instead)."""
    masked = checked("""\
kernel dx {
    in  acc: f32[M, N]
    in  dz: f32[M, N]
    in  y: f32[K, N]
    out dx: f32[M, K]
    let dacc = where(acc > 0.0, dz, 0.0)
    dx = dacc @ y.T
    block M = 256, K = 512, N = 512
}
""")
    assert masked.product is None and masked.framed
    assert chip_blocks(masked, ["M", "K", "N"], V5E) == {"M": 512, "K": 512, "N": 512}
    assert chip_blocks(masked, ["M", "K", "N"], V6E) == {"M": 1024, "K": 1024, "N": 1024}
    softmax = checked("""\
kernel matmul_softmax {
    in  x: bf16[M, K]
    in  w: bf16[K, N]
    out y: f32[M, N]
    y = softmax(x @ w, N)
    block M = 128, K = 512
}
""")
    assert chip_blocks(softmax, ["M", "K"], V6E) == {"M": 128, "K": 512}


GENERATED = Path(__file__).resolve().parents[1] / "generated"


def grid(module_name: str, kernel: str, chip, *shapes, **blocks) -> tuple[int, ...]:
    """The TPU grid a bundled kernel's call takes on `chip` (None: CPU), inputs of `shapes`."""
    path = GENERATED / f"{module_name}.py"
    module = load_module(path.read_text(), path)
    dtypes = {"softmax": [jnp.float32], "cross_entropy": [jnp.bfloat16, jnp.int32], "giou": [jnp.float32] * 8}
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in zip(shapes, dtypes[kernel])]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module.rt, "tpu_chip", lambda: chip)
        jaxpr = str(jax.make_jaxpr(lambda *a: getattr(module, kernel)(*a, interpret=True, **blocks))(*args))
    return tuple(map(int, re.search(r"grid=\(([\d, ]*)\)", jaxpr.replace(" ", "")).group(1).strip(",").split(",")))


def test_a_kernel_without_a_product_grows_its_chip_default_at_call_time_to_large_steps():
    # 8-row blocks of softmax grow to 128 rows of 8192 (2**20 elements, 24 MiB of VMEM).
    assert grid("softmax", "softmax", "v6e", (8192, 8192)) == (64,)
    assert grid("softmax", "softmax", "v5e", (8192, 65536)) == (512,)  # 16 rows: within 32 MiB
    assert grid("softmax", "softmax", "v6e", (20, 8192)) == (1,)  # never past the dimension
    assert grid("softmax", "softmax", None, (8192, 8192)) == (1024,)  # CPU: the spec's blocks
    assert grid("softmax", "softmax", "v6e", (8192, 8192), block_m=8) == (1024,)  # a given block wins
    # A tuned entry is taken as it is: cross_entropy's 128 x 16384, tuned at 4096 x 32768.
    assert grid("losses", "cross_entropy", "v6e", (4096, 32768), (4096,)) == (32, 2)
    # giou's 256 x 1024 blocks already need 18 MiB: doubling either would pass 32 MiB.
    assert grid("giou", "giou", "v6e", *[(1024, 4096)] * 8) == (4, 4)


def test_a_search_starts_from_the_blocks_a_call_takes():
    """Not from the chip's spec-sized default, which a call without blocks never takes
    when it grows: softmax's 8 rows are 128 at 8192 x 8192, on each chip."""
    softmax, linear = checked_spec("softmax", "softmax"), checked_spec("matmul", "linear")
    for chip in ("v5e", "v6e"):
        assert start_blocks(generated("softmax"), softmax, chip, {"M": 8192, "N": 8192}) == {"M": 128}
    # linear's committed v6e entry at 4096^3, K whole.
    cube = {"M": 4096, "N": 4096, "K": 4096}
    assert start_blocks(generated("matmul"), linear, "v6e", cube) == {"M": 1024, "N": 1024, "K": 4096}


def test_a_kernel_with_every_dimension_whole_starts_its_search_from_no_blocks(tmp_path):
    spec = "kernel whole {\n    in  x: f32[N]\n    out y: f32[N]\n    y = x * 2.0\n}\n"
    path = tmp_path / "whole.py"
    path.write_text(generate(spec, "whole.pallas", "whole.pallas"))
    (whole,) = check_source(spec, "whole.pallas")
    assert start_blocks(load_module(path.read_text(), path), whole, "v5e", {"N": 1000}) == {}


def generated(name: str):
    path = GENERATED / f"{name}.py"
    return load_module(path.read_text(), path)


def checked_spec(spec: str, kernel: str):
    path = GENERATED.parent / "specs" / f"{spec}.pallas"
    return next(c for c in check_source(path.read_text(), path.name) if c.kernel.name == kernel)


def test_only_a_module_with_a_kernel_that_grows_its_blocks_calls_the_runtimes_growth():
    # A plain product's kernels (its backward kernels are products too) never grow.
    spec = (
        "kernel mm {\n    in  x: f32[M, K]\n    in  y: f32[K, N]\n    out z: f32[M, N]\n    z = x @ y\n"
        "    block M = 128, N = 128, K = 128\n}\n"
    )
    matmul = generate(spec, "mm.pallas", "mm.pallas")
    softmax = (GENERATED / "softmax.py").read_text()
    assert "tpu_blocks=rt.TpuBlocks(" in matmul and "step=lambda" not in matmul
    assert "step=lambda" in softmax


def test_block_choices_are_the_tiling_multiple_times_powers_of_two_then_the_whole_dimension():
    mm = checked(MATMUL)
    assert block_choices(mm, "M", 100) == [16, 32, 64, 100]  # bf16 rows: multiples of 16
    assert block_choices(mm, "N", 1000) == [128, 256, 512, 1000]
    assert block_choices(checked(), "N", 5000) == [1024, 2048, 4096, 5000]  # one-dimensional f32


def test_the_search_walks_downhill_to_the_best_blocks_within_the_budget():
    mm = checked(MATMUL)
    sizes = {"M": 4096, "N": 4096, "K": 4096}
    best = {"M": 512, "N": 1024, "K": 256}
    counted = []

    def measure(blocks):  # a bowl with its bottom at `best`
        if blocks["K"] == 2048:
            raise CompileError("mosaic", "rejected")
        return 1000 + sum(abs(blocks[d].bit_length() - best[d].bit_length()) for d in blocks)

    trials = search(mm, sizes, {"M": 128, "N": 128, "K": 1024}, measure, 100, counted.append)
    assert min((t for t in trials if t.cost), key=lambda t: t.cost).blocks == tuple(sorted(best.items()))
    assert len(counted) == len(trials) == len({t.blocks for t in trials})
    assert any(t.cost is None and t.error == "rejected" for t in trials)
    assert len(search(mm, sizes, {"M": 128, "N": 128, "K": 1024}, measure, 5, counted.append)) == 5


def test_tune_compiles_for_a_chip_and_writes_the_best_blocks(project):  # noqa: F811
    """A fresh process, as libtpu reads the profile flag once, when it loads."""
    args = ["tune", "specs/add_vectors.pallas", "--chip", "v5e", "--size", "N=65536", "--budget", "3"]
    result = subprocess.run(
        [sys.executable, "-c", "from pallasgen.cli import main; main()", *args], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "add_vectors on v5e (compiler estimate (no TPU): cycles, not time): block_n=" in result.stdout
    (entry,) = json.loads((project / "specs" / "add_vectors.tuning.json").read_text())["kernels"]["add_vectors"][
        "tuned"
    ]
    assert entry["chip"] == "v5e" and entry["sizes"] == {"N": 65536}
    assert entry["measure"]["compiles"] == 3 and entry["measure"]["kernel_cycles"] > 0
    assert {"jax", "pallasgen"} <= entry["versions"].keys()
    assert pallasgen("build").exit_code == 0
    assert f'(65536,): ({entry["blocks"]["N"]},)' in (project / "generated" / "add_vectors.py").read_text()
    # A second run goes on from the blocks tuned before and never records worse ones.
    again = subprocess.run(
        [sys.executable, "-c", "from pallasgen.cli import main; main()", *args[:-1], "1"],
        capture_output=True,
        text=True,
    )
    assert f"from the blocks tuned before block_n={entry['blocks']['N']} " in again.stdout, again.stderr[-2000:]
    (second,) = json.loads((project / "specs" / "add_vectors.tuning.json").read_text())["kernels"]["add_vectors"][
        "tuned"
    ]
    assert (
        second["blocks"] == entry["blocks"] and second["measure"]["kernel_cycles"] == entry["measure"]["kernel_cycles"]
    )
    # A run started from given blocks measures the ones tuned before too, and keeps the better.
    given = subprocess.run(
        [sys.executable, "-c", "from pallasgen.cli import main; main()", *args[:-1], "2", "--block", "N=1024"],
        capture_output=True,
        text=True,
    )
    assert "from the given block_n=1024 " in given.stdout and "2 compiles" in given.stdout, given.stderr[-2000:]
    (third,) = json.loads((project / "specs" / "add_vectors.tuning.json").read_text())["kernels"]["add_vectors"][
        "tuned"
    ]
    assert third["measure"]["kernel_cycles"] <= entry["measure"]["kernel_cycles"]


def test_tune_starts_only_from_blocks_its_search_could_reach(project):  # noqa: F811
    result = pallasgen("tune", "specs/add_vectors.pallas", "--chip", "v5e", "--size", "N=65536", "--block", "N=1000")
    assert result.exit_code == 2
    assert "add_vectors: --block N=1000 is not a block the search tries at N=65536 (one of 1024, 2048," in result.stderr


def test_tune_needs_every_dimensions_size(project):  # noqa: F811
    result = pallasgen("tune", "specs/add_vectors.pallas", "--chip", "v5e")
    assert result.exit_code == 2
    assert "add_vectors: give the size of every dimension to tune at (missing: N)" in result.stderr


def test_a_tune_where_no_block_set_compiles_is_a_compile_error_naming_the_first():
    """As when libtpu's static profile aborts every candidate's compile (devices.apart)."""
    from pallasgen.devices.tune import tune

    class Refusing:
        chip = "v5e"

        def estimate(self, module, checked, sizes, options):
            raise CompileError("libtpu", "the compile ended its process (signal 6)")

    with pytest.raises(CompileError, match=r"no block set compiled; the first error: .*signal 6"):
        tune(Refusing(), generated("add_vectors"), checked_spec("add_vectors", "add_vectors"), {"N": 4096}, 3, print)
