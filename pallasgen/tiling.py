"""TPU block-shape rules and the VMEM a block configuration needs."""

from __future__ import annotations

from math import prod

from . import ir
from .dtypes import DTYPES, DType

# Scoped VMEM that Mosaic grants a kernel by default on the smallest current TPU (v5e).
SCOPED_VMEM_BYTES = 16 * 1024 * 1024
SUBLANES, LANES = 8, 128


def tiling_problem(dim: str, size: int, dims: tuple[str, ...], dtypes: list[DType]) -> str | None:
    """Why blocking `dim` by `size` breaks the TPU tiling rule, or None.

    Every array in the kernel is laid out over `dims` (broadcast dimensions have
    size 1, which is whole), so the rule for the last two kernel dimensions is the
    rule for every block.
    """
    position = len(dims) - dims.index(dim)
    if len(dims) == 1:
        smallest = max(LANES * (32 // d.bits) for d in dtypes) if dtypes else LANES
        if size % 1024 == 0 or (size & (size - 1) == 0 and size >= smallest):
            return None
        return (
            f"block {dim} = {size} cannot tile a one-dimensional array on TPU: use a multiple of 1024"
            f" or a power of two of at least {smallest}, or leave {dim} unblocked to take it whole"
        )
    if position == 1 and size % LANES:
        return (
            f"block {dim} = {size} breaks the TPU tiling rule: the last dimension of a block is a multiple"
            f" of {LANES}; use {_round_up(size, LANES)} or leave {dim} unblocked to take it whole"
        )
    if position == 2 and size % SUBLANES:
        return (
            f"block {dim} = {size} breaks the TPU tiling rule: the second-to-last dimension of a block is a"
            f" multiple of {SUBLANES}; use {_round_up(size, SUBLANES)} or leave {dim} unblocked to take it whole"
        )
    return None


def block_bytes(decl: ir.ArrayDecl, blocks: dict[str, int]) -> int:
    """Bytes of one block of an array; dimensions taken whole count as 1 (unknown)."""
    return prod(blocks.get(d, 1) for d in decl.dims) * DTYPES[decl.dtype].bytes


def pipeline_vmem_bytes(kernel: ir.Kernel, blocks: dict[str, int]) -> int:
    """VMEM for double-buffered input and output blocks."""
    return 2 * sum(block_bytes(d, blocks) for d in kernel.inputs + kernel.outputs)


def vmem_problem(kernel: ir.Kernel, blocks: dict[str, int]) -> str | None:
    needed = pipeline_vmem_bytes(kernel, blocks)
    if needed <= SCOPED_VMEM_BYTES:
        return None
    return (
        f"these blocks need {format_bytes(needed)} of VMEM (double-buffered), more than the"
        f" {format_bytes(SCOPED_VMEM_BYTES)} a TPU v5e grants a kernel; use smaller blocks"
    )


def format_bytes(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.1f} MiB"
    return f"{count / 1024:.1f} KiB"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
