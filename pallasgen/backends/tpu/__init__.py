"""TPU: Pallas's Mosaic backend."""

from __future__ import annotations

from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import Backend
from pallasgen.backends.tpu.checks import check_tpu
from pallasgen.backends.tpu.chips import CHIPS, STEP_ELEMENTS, STEP_VMEM_BYTES
from pallasgen.backends.tpu.plan import (
    block_table_name,
    kernel_function_name,
    keyword_group,
    launcher_name,
    plan_tpu,
)
from pallasgen.backends.tpu.tiling import SCOPED_VMEM_BYTES, VMEM_LIMIT_BYTES


class TpuBackend(Backend):
    name = "tpu"
    template = "tpu.py.j2"

    def check(self, kernel, space, product, blocks, earlier):
        return None, check_tpu(kernel, space, product, blocks)

    def keywords(self, checked):
        return keyword_group(checked)

    def reserved_names(self, checked):
        return {block_keyword(d) for d in checked.dims}

    def function_names(self, kernel):
        return kernel_function_name(kernel), block_table_name(kernel), launcher_name(kernel)

    def plan(self, lowered):
        return plan_tpu(lowered)

    def blocks_at(self, plan, sizes):
        return {b.dim: min(b.default, sizes[b.dim]) for b in plan.blocks}  # a small dimension is one whole block

    def helper_values(self):
        return {
            "scoped_vmem_mib": SCOPED_VMEM_BYTES >> 20,
            "vmem_limit_mib": VMEM_LIMIT_BYTES >> 20,
            "tpu_chips": {kind: chip.name for chip in CHIPS for kind in chip.device_kinds},
            "step_elements_log2": STEP_ELEMENTS.bit_length() - 1,
            "step_vmem_mib": STEP_VMEM_BYTES >> 20,
        }
