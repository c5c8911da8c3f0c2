"""The TPU's own spec checks: blocks Mosaic can tile, one batch element per product
step, and blocks that fit in VMEM."""

from __future__ import annotations

from pallasgen.analysis.fused import FusedKernel, batch_block_problem
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.backends.tpu.tiling import kernel_vmem, tile_layouts, tiling_problem, vmem_problem
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic, Position


def check_tpu(checked: CheckedKernel | None) -> list[Diagnostic]:
    """Diagnostics for `block` sizes the TPU cannot take, as each array's tile holds
    them; none until the kernel has passed every earlier check (`checked`: it so far)."""
    if checked is None:
        return []
    kernel, frame, blocks = checked.kernel, checked.frame, checked.blocks
    found = _batch_block_problems(kernel, frame, blocks)
    layouts = tile_layouts(kernel, frame)
    for item in kernel.blocks:
        problem = tiling_problem(item.dim, item.size, layouts) if item.dim not in frame.batch else None
        if problem:
            found.append(Diagnostic(item.position, problem))
    if kernel.blocks and not found:
        problem = vmem_problem(kernel_vmem(checked, blocks), blocks)
        if problem:
            found.append(Diagnostic(kernel.blocks[0].position, problem))
    return found


def _batch_block_problems(kernel: ir.Kernel, frame: FusedKernel, blocks: dict[str, int]) -> list[Diagnostic]:
    """A product's batch dimensions take one element per step, so its tiles are matrices."""
    found = []
    positions: dict[str, Position] = {}  # where an output, else an input, names each dimension
    for decl in kernel.outputs + kernel.inputs:
        for dim, position in zip(decl.dims, decl.dim_positions):
            positions.setdefault(dim, position)
    for dim in frame.batch:
        if blocks.get(dim) != 1:
            item = next((b for b in kernel.blocks if b.dim == dim), None)
            found.append(
                Diagnostic(
                    item.position if item else positions[dim],
                    batch_block_problem(dim),
                )
            )
    return found
