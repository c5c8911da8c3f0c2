"""NVIDIA GPUs from Hopper (sm_90) on: Pallas's Mosaic GPU backend (`plgpu.kernel`,
TMA pipelines, `wgmma`). From sm_90 on a kernel with a matrix product runs on it unless
the public `gpu_backend` keyword names Triton (`faster_on_hopper`), any other only where
it names Mosaic GPU; a kernel it does not take runs on Triton (`support.refusal` says why)."""

from __future__ import annotations

import dataclasses

from pallasgen.backends.base import Backend
from pallasgen.runtime.constants import TARGETS
from pallasgen.backends.mosaic_gpu import choices
from pallasgen.backends.mosaic_gpu.plan import (
    BACKEND_KEYWORD,
    faster_on_hopper,
    kernel_function_name,
    keyword_group,
    launcher_name,
    plan_mosaic_gpu,
)
from pallasgen.backends.mosaic_gpu.stages import stages
from pallasgen.backends.mosaic_gpu.support import refusal


class MosaicGpuBackend(Backend):
    name = "mosaic_gpu"
    target = "mosaic_gpu"
    template = "mosaic_gpu.py.j2"

    def check(self, kernel, space, product, blocks, earlier, checked=None):
        """No spec is an error here: a kernel Mosaic GPU does not take keeps Triton."""
        return None, []

    def keywords(self, checked, targets=TARGETS):
        return keyword_group(checked, "triton" in targets, self.writes_residuals(checked, targets))

    def writes_residuals(self, checked, targets=TARGETS):
        """Unless it takes the kernel but not with its residuals, where Triton can run that:
        the kernel that writes them refused, or planned otherwise (it reads a residual it
        writes by name, where the kernel nests reductions that its stages compute apart)."""
        saving = checked.gradient.saving if checked.gradient else None
        if saving is None or "triton" not in targets or refusal(checked) is not None:
            return True
        return refusal(saving) is None and (stages(saving) is None) == (stages(checked) is None)

    def reserved_names(self, checked):
        return {BACKEND_KEYWORD, *(choices.keywords(checked) if choices.tunable(checked) else ())}

    def tunable_dims(self, checked) -> list[str]:
        """The dimensions whose blocks are keywords (`mgpu_block_*`), which tune --gpu searches."""
        return list(choices.block_choices(checked)) if choices.tunable(checked) else []

    def block_keyword(self, dim):
        return choices.mgpu_block_keyword(dim)

    def default_blocks(self, checked):
        """Its built-in blocks of a product's M, N and K."""
        return choices.defaults(checked) if choices.tunable(checked) else {}

    def default_options(self, checked):
        return {choices.STAGES: choices.DEFAULT_STAGES} if choices.tunable(checked) else {}

    def tuned_blocks_problem(self, checked, tuned) -> str | None:
        return choices.tuned_problem(checked, tuned)

    def tuning_choices(self, checked):
        """The `mgpu_block_*` keywords and `mgpu_stages`, of a product it takes."""
        if not choices.tunable(checked):
            return {}
        return {
            k: ("option" if what == choices.STAGES else "block", what) for k, what in choices.keywords(checked).items()
        }

    def tuning_space(self, checked, sizes):
        """The values its keywords take (wgmma tiles, pipeline depths), whatever the sizes."""
        return choices.allowed(checked) if choices.tunable(checked) else {}

    def tuning_problem(self, checked, chosen):
        """Why blocks and stages overflow a warpgroup's registers or a block's shared memory."""
        blocks, options = self.tuned_parts(checked, chosen)
        return choices.problem(checked, dict(blocks), dict(options)[choices.STAGES])

    memory_budget = choices.SMEM_PER_BLOCK

    def memory_bytes(self, checked, blocks):
        """Shared memory of a program with these blocks (over the defaults) and the default stages."""
        if not choices.tunable(checked):
            return None
        return choices.smem_bytes(checked, {**choices.defaults(checked), **blocks}, choices.DEFAULT_STAGES)

    def function_names(self, kernel):
        return kernel_function_name(kernel), launcher_name(kernel)

    def plan(self, lowered, targets=TARGETS):
        plan = plan_mosaic_gpu(lowered, "triton" in targets)
        preferred = "triton" in targets and not plan.refused and faster_on_hopper(lowered.checked)
        return dataclasses.replace(plan, on_hopper=preferred)

    def blocks_at(self, plan, sizes):
        """Its blocks are fixed per kernel, not keywords: none to report."""
        return {}

    def backward_keywords(self, targets=TARGETS):
        """The backward kernels of a kernel run on the GPU backend it runs on (a choice
        only where Triton is targeted too)."""
        return (BACKEND_KEYWORD,) if "triton" in targets else ()
