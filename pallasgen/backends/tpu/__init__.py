"""TPU: Pallas's Mosaic backend."""

from __future__ import annotations

from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import Backend
from pallasgen.runtime.constants import TARGETS
from pallasgen.backends.tpu.checks import check_tpu
from pallasgen.backends.tpu.carried import plan_tpu
from pallasgen.backends.tpu.tiling import tile_layouts
from pallasgen.backends.tpu.chips import (
    CHIP_NAMES,
    chip_named,
    default_blocks_vmem_warning,
    tuned_blocks_problem,
)
from pallasgen.backends.tpu.plan import (
    kernel_function_name,
    keyword_group,
    launcher_name,
    tunable_dims,
)
from pallasgen.backends.tpu.tiling import (
    SCOPED_VMEM_BYTES,
    block_choices,
    tiling_problem,
    kernel_vmem,
    tiling_rule,
    vmem_problem,
)


class TpuBackend(Backend):
    name = "tpu"
    target = "tpu"
    template = "tpu.py.j2"
    chip_names = CHIP_NAMES  # the compile-only chips `--chip` names

    def chip(self, name: str):
        return chip_named(name)

    def check(self, kernel, space, product, blocks, earlier, checked=None):
        return None, check_tpu(checked)

    def keywords(self, checked, targets=TARGETS):
        return keyword_group(checked)

    def reserved_names(self, checked):
        return {block_keyword(d) for d in checked.dims}

    def function_names(self, kernel):
        return kernel_function_name(kernel), launcher_name(kernel)

    def plan(self, lowered, targets=TARGETS):
        return plan_tpu(lowered)

    def blocks_at(self, plan, sizes):
        return {b.dim: min(b.default, sizes[b.dim]) for b in plan.blocks}  # a small dimension is one whole block

    # What tuning and benchmarks ask of the TPU's blocks, for any kernel:
    # a search's choices are named by their dimensions.

    memory_budget = SCOPED_VMEM_BYTES

    def tunable_dims(self, checked) -> list[str]:
        """The dimensions whose blocks are `block_*` keywords."""
        return tunable_dims(checked)

    def default_blocks(self, checked):
        """The spec's blocks (a call on a known chip takes the chip's or tuned ones instead)."""
        return dict(checked.blocks)

    def layouts(self, checked):
        """Each array's block as Mosaic tiles it: what the tiling rule reads."""
        return tile_layouts(checked.kernel, checked.frame)

    def block_problem(self, checked, dim, block):
        """Why blocking `dim` by `block` breaks Mosaic's tiling rule for this kernel, or None."""
        return tiling_problem(dim, block, self.layouts(checked))

    def tuning_choices(self, checked):
        return {d: ("block", d) for d in self.tunable_dims(checked)}

    def tuning_space(self, checked, sizes):
        """The blocks of each tunable dimension that `sizes` gives worth trying: the tiling
        rule's multiple times each power of two below the size, then the whole dimension."""
        return {
            d: block_choices(tiling_rule(d, self.layouts(checked)), sizes[d])
            for d in self.tunable_dims(checked)
            if d in sizes
        }

    def tuning_problem(self, checked, chosen):
        """Why blocks (over the spec's) overflow VMEM, or None."""
        blocks = {**checked.blocks, **chosen}
        return vmem_problem(kernel_vmem(checked, blocks), blocks)

    def memory_bytes(self, checked, blocks) -> int:
        """VMEM of the blocks (dimensions taken whole count as 1): `tiling.kernel_vmem`."""
        blocks = {**checked.blocks, **blocks}
        return kernel_vmem(checked, blocks).total(blocks)

    def build_warnings(self, checked) -> list[str]:
        message = default_blocks_vmem_warning(checked, self.tunable_dims(checked), self.memory_bytes)
        return [message] if message else []

    def tuned_blocks_problem(self, checked, tuned) -> str | None:
        return tuned_blocks_problem(
            checked,
            self.tunable_dims(checked),
            tuned,
            self.layouts(checked),
            lambda blocks: self.tuning_problem(checked, blocks),
        )
