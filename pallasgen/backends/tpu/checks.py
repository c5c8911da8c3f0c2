"""The TPU's own spec checks: blocks Mosaic can tile, one batch element per product
step, and blocks that fit in VMEM."""

from __future__ import annotations

from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.backends.tpu.tiling import array_layouts, tiling_problem, vmem, vmem_problem
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic


def check_tpu(
    kernel: ir.Kernel, space: IterationSpace, product: Product | None, blocks: dict[str, int]
) -> list[Diagnostic]:
    """Diagnostics for `block` sizes the TPU cannot take; none until every item names a
    dimension once with a valid size."""
    if len(blocks) != len(kernel.blocks) or not kernel.outputs:
        return []
    found = _batch_block_problems(kernel, blocks) if product is not None else []
    layouts = array_layouts(kernel, space.layout, product)
    for item in kernel.blocks:
        problem = tiling_problem(item.dim, item.size, layouts)
        if problem:
            found.append(Diagnostic(item.position, problem))
    known_dtypes = all(d.dtype in DTYPES for d in kernel.inputs + kernel.outputs)
    if kernel.blocks and known_dtypes and not found:
        problem = vmem_problem(vmem(kernel, blocks, product), blocks)
        if problem:
            found.append(Diagnostic(kernel.blocks[0].position, problem))
    return found


def _batch_block_problems(kernel: ir.Kernel, blocks: dict[str, int]) -> list[Diagnostic]:
    """A matmul kernel takes one batch element per step, so its tiles are matrices."""
    found = []
    out = kernel.outputs[0]
    for dim, position in list(zip(out.dims, out.dim_positions))[:-2]:
        if blocks.get(dim) != 1:
            item = next((b for b in kernel.blocks if b.dim == dim), None)
            found.append(
                Diagnostic(
                    item.position if item else position,
                    f"batch dimension {dim} of a matrix product is blocked by 1: write block {dim} = 1",
                )
            )
    return found
