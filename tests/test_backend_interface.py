"""Each backend behind the one interface (`backends.base.Backend`) that callers outside
`pallasgen/backends/` use: its block keywords are its public ones, its tuning space names
the choices it declares, a search's start is an entry that fits, and the TPU's tiling
rule, which the generator checks spec blocks by and the runtime a call's blocks, says the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_cases import GENERATED, load_module

from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.backends import BACKENDS
from pallasgen.backends.tpu.tiling import TilingRule
from pallasgen.gradients.derive import every_kernel
from pallasgen.workspace.pipeline import check_source

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.pallas"))
CHIP = {"tpu": "v5e"}  # a known chip; a GPU's entries are by any device kind


def kernels():
    """Every kernel of the bundled specs, and those derived from them for jax.grad."""
    return [checked for spec in SPECS for checked in every_kernel(check_source(spec.read_text(), spec.name))]


@pytest.fixture(scope="module")
def checked_kernels():
    return kernels()


@pytest.mark.parametrize("backend", BACKENDS, ids=[b.name for b in BACKENDS])
def test_block_keywords_are_public_keywords_and_the_tuning_space_names_every_choice(backend, checked_kernels):
    for checked in checked_kernels:
        public = {k.name for k in backend.keywords(checked).keywords}
        tunable = backend.tunable_dims(checked)
        assert {backend.block_keyword(d) for d in tunable} <= public, checked.kernel.name
        choices = backend.tuning_choices(checked)
        assert sorted(what for kind, what in choices.values() if kind == "block") == sorted(tunable)
        space = backend.tuning_space(checked, {d: 1000 for d in checked.dims})
        assert list(space) == list(choices), checked.kernel.name
        assert all(values for values in space.values())


@pytest.mark.parametrize("backend", BACKENDS, ids=[b.name for b in BACKENDS])
def test_a_search_starts_from_defaults_that_a_tuning_entry_keeps_and_takes_back(backend, checked_kernels):
    for checked in checked_kernels:
        sizes = {d: 1024 for d in checked.dims}
        space = backend.tuning_space(checked, sizes)
        if not space:
            continue
        start = backend.tuning_start(checked, space)
        assert all(start[name] in values for name, values in space.items())
        blocks, options = backend.tuned_parts(checked, start)
        entry = TunedBlocks(CHIP.get(backend.name, "NVIDIA H100 80GB HBM3"), tuple(sizes.items()), blocks, options)
        assert backend.tuned_blocks_problem(checked, entry) is None, checked.kernel.name
        assert backend.tuning_start(checked, space, entry) == start
        assert backend.tuning_problem(checked, start) is None, checked.kernel.name


def test_a_backend_without_tuned_blocks_refuses_an_entry(checked_kernels):
    mosaic_gpu = next(b for b in BACKENDS if b.name == "mosaic_gpu")
    untunable = next(c for c in checked_kernels if not mosaic_gpu.tunable_dims(c))
    entry = TunedBlocks("NVIDIA H100 80GB HBM3", tuple((d, 64) for d in untunable.dims), (), ())
    assert mosaic_gpu.tuned_blocks_problem(untunable, entry)


@pytest.mark.parametrize(
    "rule",
    [
        TilingRule("N", 128, "lanes"),
        TilingRule("M", 16, "bf16 rows"),
        TilingRule("N", 1024, "1-D f32", 128),
    ],
    ids=["lanes", "sublanes", "one-dimensional"],
)
def test_the_generated_tiling_check_keeps_the_generators_tiling_rule(rule):
    """The generator's `TilingRule.allows` and the runtime's `tpu_blocks`, which a
    generated kernel's public function calls, allow the same blocks (both ask constants.tiles_on_tpu)."""
    module = load_module(GENERATED / "add_vectors.py", "add_vectors_tiling_rule")
    rt = module.rt
    smallest = (rule.smallest_power_of_two,) if rule.smallest_power_of_two else ()
    tiling = {rule.dim: (rule.multiple, rule.held, *smallest)}
    table = rt.TpuBlocks(tiling, {None: {"default": (1024,)}}, kernel="k", sizes=(rule.dim,))
    size = 5000
    for block in range(1, 4200):
        try:
            rt.tpu_blocks(table, (size,), (block,))
            allowed = True
        except ValueError as error:
            assert rule.describe() in str(error)  # the generator's words for the rule
            allowed = False
        assert allowed == (rule.allows(block) or block == size), block
