"""TPU block-shape rules and the VMEM a block configuration needs."""

from __future__ import annotations

from math import prod

from . import ir
from .dtypes import DTYPES, DType
from .planparts import layout_of
from .product import Product

# Scoped VMEM that Mosaic grants a kernel by default on the smallest current TPU (v5e).
SCOPED_VMEM_BYTES = 16 * 1024 * 1024
SUBLANES, LANES = 8, 128

Layout = tuple[tuple[str | None, ...], DType]


def array_layouts(kernel: ir.Kernel, dims: tuple[str, ...], product: Product | None) -> list[Layout]:
    """The dimensions each array is blocked over, and its dtype.

    Product operands keep their own dimensions; every other array is laid out over
    the output dimensions, with None where it broadcasts (size 1, which is whole).
    """
    output_dims = kernel.outputs[0].dims
    return [
        (layout_of(decl, output_dims, product), DTYPES[decl.dtype])
        for decl in kernel.inputs + kernel.outputs
        if decl.dtype in DTYPES
    ]


def tiling_problem(dim: str, size: int, layouts: list[Layout]) -> str | None:
    """Why blocking `dim` by `size` breaks the TPU tiling rule for some array, or None."""
    for dims, dtype in layouts:
        if dim not in dims:
            continue
        position = len(dims) - dims.index(dim)
        if len(dims) == 1:
            smallest = LANES * (32 // dtype.bits)
            if size % 1024 and not (size & (size - 1) == 0 and size >= smallest):
                return (
                    f"block {dim} = {size} cannot tile a one-dimensional {dtype.name} array on TPU: use a multiple"
                    f" of 1024 or a power of two of at least {smallest}, or leave {dim} unblocked to take it whole"
                )
        elif position == 1 and size % LANES:
            return (
                f"block {dim} = {size} breaks the TPU tiling rule: {dim} is the last dimension of a block, so"
                f" it is a multiple of {LANES}; use {_round_up(size, LANES)} or leave {dim} unblocked"
            )
        elif position == 2 and size % SUBLANES:
            return (
                f"block {dim} = {size} breaks the TPU tiling rule: {dim} is the second-to-last dimension of a"
                f" block, so it is a multiple of {SUBLANES}; use {_round_up(size, SUBLANES)} or leave {dim} unblocked"
            )
    return None


def block_bytes(decl: ir.ArrayDecl, blocks: dict[str, int]) -> int:
    """Bytes of one block of an array; dimensions taken whole count as 1 (unknown)."""
    return prod(blocks.get(d, 1) for d in decl.dims) * DTYPES[decl.dtype].bytes


def accumulator_bytes(product: Product | None, blocks: dict[str, int]) -> int:
    """The VMEM scratch of a product whose contracted dimension is blocked."""
    if product is None or product.k not in blocks:
        return 0
    return blocks.get(product.m, 1) * blocks.get(product.n, 1) * product.accumulator.bytes


def vmem_bytes(kernel: ir.Kernel, blocks: dict[str, int], product: Product | None) -> int:
    """VMEM for double-buffered input and output blocks, plus the accumulator."""
    pipelined = 2 * sum(block_bytes(d, blocks) for d in kernel.inputs + kernel.outputs)
    return pipelined + accumulator_bytes(product, blocks)


def vmem_problem(kernel: ir.Kernel, blocks: dict[str, int], product: Product | None) -> str | None:
    needed = vmem_bytes(kernel, blocks, product)
    if needed <= SCOPED_VMEM_BYTES:
        return None
    return (
        f"these blocks need {format_bytes(needed)} of VMEM (inputs and outputs double-buffered"
        f"{', plus the accumulator' if accumulator_bytes(product, blocks) else ''}), more than the"
        f" {format_bytes(SCOPED_VMEM_BYTES)} a TPU v5e grants a kernel; use smaller blocks"
    )


def format_bytes(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.1f} MiB"
    return f"{count / 1024:.1f} KiB"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
