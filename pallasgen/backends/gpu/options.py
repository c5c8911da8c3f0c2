"""What the GPU (Triton) path needs: power-of-two blocks and launch options, with defaults."""

from __future__ import annotations

from pallasgen.frontend import ir
from pallasgen.analysis.names import block_keyword
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.runtime.constants import GPU_LAUNCH_OPTIONS

# `gpu NAME = VALUE` options: (keyword of the generated function, allowed values); the
# runtime checks a call's by the same table.
OPTIONS = GPU_LAUNCH_OPTIONS

# Keywords of the generated GPU function that spec names must not take.
GPU_FUNCTION_LOCALS = ("num_warps", "num_stages")

LARGEST_TUNED_BLOCK = 1024  # Triton holds a block in registers: larger ones spill


def gpu_block_keyword(dim: str) -> str:
    """The public keyword of a GPU (Triton) block: gpu_block_<dim>."""
    return f"gpu_{block_keyword(dim)}"


def gpu_keywords(dims) -> set[str]:
    """The public keywords the GPU path adds: gpu_block_<dim>, gpu_warps, gpu_stages."""
    return {gpu_block_keyword(d) for d in dims} | {keyword for keyword, _ in OPTIONS.values()}


def tuned_block_choices(size: int, smallest: int) -> tuple[int, ...]:
    """The blocks `pallasgen tune --gpu` tries of a dimension of `size`: powers of two from
    `smallest` up to the size's next power of two, at most LARGEST_TUNED_BLOCK."""
    largest = max(smallest, min(LARGEST_TUNED_BLOCK, 1 << (size - 1).bit_length()))
    return tuple(1 << n for n in range(smallest.bit_length() - 1, largest.bit_length()))


def default_blocks(
    kernel: ir.Kernel, space: IterationSpace, product: Product | None, blocks: dict[str, int]
) -> dict[str, int]:
    """Blocks that suit Triton: 128x128x64 tiles for 16- and 8-bit products, 64x64x32 for
    f32; about a thousand elements per program for elementwise kernels. A kernel that
    reduces takes one row per program over whole rows, and loops over a blocked reduced
    dimension 1024 (last) or 64 positions at a time; reduced dimensions held whole
    have no block of their own."""
    if product is not None:
        out_dims = kernel.outputs[0].dims
        narrow = product.lhs.dtype.bits <= 16
        tile, depth = (128, 64) if narrow else (64, 32)
        batch = {d: 1 for d in out_dims[:-2]}
        return {**batch, product.m: tile, product.n: tile, product.k: depth}
    layout = space.layout
    if not any(d.reductions for d in space.dims):
        if len(layout) == 1:
            return {layout[0]: 1024}
        return {**{d: 1 for d in layout[:-2]}, layout[-2]: 8, layout[-1]: 128}
    chosen = {}
    for dim in space.dims:
        last = dim.name == layout[-1]
        if dim.reduced and dim.name in blocks:
            chosen[dim.name] = 1024 if last else 64
        elif not dim.reductions:
            chosen[dim.name] = (1024 if len(layout) == 1 else 128) if last else 1
    return chosen


def default_options(product: Product | None) -> dict[str, int]:
    if product is None:
        return {"warps": 4, "stages": 1}
    return {"warps": 8 if product.lhs.dtype.bits <= 16 else 4, "stages": 3}


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0
