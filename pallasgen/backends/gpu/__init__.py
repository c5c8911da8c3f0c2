"""NVIDIA GPUs: Pallas's Triton backend."""

from __future__ import annotations

from dataclasses import replace

from pallasgen.backends.base import Backend
from pallasgen.runtime.constants import TARGETS
from pallasgen.backends.gpu.checks import check_gpu
from pallasgen.backends.gpu.options import GPU_FUNCTION_LOCALS, OPTIONS, gpu_block_keyword, gpu_keywords
from pallasgen.backends.gpu.options import tuned_block_choices
from pallasgen.backends.gpu.carried import default_gpu_blocks, gpu_blocks, keyword_group, plan_gpu
from pallasgen.backends.gpu.plan import kernel_function_name, SMALLEST_DOT_TILE, launcher_name, tuned_problem


class GpuBackend(Backend):
    name = "gpu"
    target = "triton"
    template = "gpu.py.j2"

    def check(self, kernel, space, product, blocks, earlier, checked=None):
        batch = checked.batch if checked is not None else ()
        settings, problems = check_gpu(kernel, space, product, blocks, earlier, batch)
        if checked is None or not checked.framed:
            return settings, problems
        given = {item.dim: item.size for item in kernel.gpu_blocks}
        return replace(settings, blocks=default_gpu_blocks(kernel, blocks, checked.frame, given)), problems

    def keywords(self, checked, targets=TARGETS):
        return keyword_group(checked)

    def reserved_names(self, checked):
        return gpu_keywords(checked.dims) | set(GPU_FUNCTION_LOCALS)

    def function_names(self, kernel):
        return kernel_function_name(kernel), launcher_name(kernel)

    def tunable_dims(self, checked) -> list[str]:
        """The dimensions whose blocks are keywords (`gpu_block_*`), which tune --gpu searches."""
        return list(gpu_blocks(checked))

    def block_keyword(self, dim):
        return gpu_block_keyword(dim)

    def default_blocks(self, checked):
        """The spec's GPU blocks, else Triton's defaults (a tuned entry's on its GPU)."""
        return dict(checked.settings["gpu"].blocks)

    def default_options(self, checked):
        return dict(checked.settings["gpu"].options)

    def tuned_blocks_problem(self, checked, tuned) -> str | None:
        return tuned_problem(checked, self.tunable_dims(checked), tuned)

    def tuning_choices(self, checked):
        """The `gpu_block_*` keywords, then `gpu_warps` and `gpu_stages`."""
        blocks = {gpu_block_keyword(d): ("block", d) for d in self.tunable_dims(checked)}
        return blocks | {keyword: ("option", name) for name, (keyword, _) in OPTIONS.items()}

    def tuning_space(self, checked, sizes):
        """Powers of two from the smallest block the launcher takes (a dot tile's, in a
        product) up to each dimension's next power of two, and the warps and stages a spec
        may set."""
        smallest = SMALLEST_DOT_TILE if checked.has_products else 1
        blocks = {gpu_block_keyword(d): tuned_block_choices(sizes[d], smallest) for d in self.tunable_dims(checked)}
        return blocks | {keyword: allowed for keyword, allowed in OPTIONS.values()}

    def plan(self, lowered, targets=TARGETS):
        return plan_gpu(lowered)

    def blocks_at(self, plan, sizes):
        """Powers of two: a small dimension one block, but no smaller than a dot tile; a
        dimension held whole, one block of its next power of two, no shallower than a dot
        that contracts it."""
        whole = {dim: max(smallest, _next_power_of_two(sizes[dim])) for _, _, dim, smallest in plan.whole_blocks}
        return {b.dim: max(b.smallest, min(b.default, _next_power_of_two(sizes[b.dim]))) for b in plan.blocks} | whole


def _next_power_of_two(size: int) -> int:
    return 1 << (size - 1).bit_length()
