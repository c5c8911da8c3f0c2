"""What `pallasgen show` draws, as plain data: how each array of a kernel is cut into
blocks at given sizes, the grid that walks those blocks, and one highlighted step.

The layout of each array over the grid comes from the plan's own rules
(`lowering.parts.layout_of`, `lowering.parts.grid_names`); block sizes are clamped as the
generated code clamps them, and VMEM figures come from `tiling`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.frontend.errors import did_you_mean
from pallasgen.backends.gpu.plan import SMALLEST_DOT_TILE
from pallasgen.lowering.parts import grid_names, layout_of
from pallasgen.backends.tpu.tiling import accumulator_bytes, block_bytes, vmem_bytes

# A picture with more blocks than this along one dimension is no longer readable.
MAX_BLOCKS = 24
# The size given by default to a dimension taken whole: small, so that it draws narrow.
WHOLE_SIZE = 64


class ShowError(Exception):
    """Sizes that cannot be drawn, in plain words."""


@dataclass(frozen=True)
class Axis:
    """One dimension of an array as the kernel walks it."""

    dim: str | None  # None where the array broadcasts: one element, the same for every step
    size: int
    block: int  # elements per block (per loop slice where `looped`)
    index: str | None  # the grid index that picks the block (i, j, k), None if always block 0
    chosen: int  # the block the highlighted step reads or writes
    looped: bool = False  # GPU: each program loops over the whole axis itself

    @property
    def blocks(self) -> int:
        return -(-self.size // self.block)

    @property
    def ragged(self) -> bool:
        """The last block runs past the array's end."""
        return self.size % self.block != 0


@dataclass(frozen=True)
class ArrayTiles:
    name: str
    dtype: str
    dims: tuple[str, ...]
    is_output: bool
    axes: tuple[Axis, ...]  # over the grid as the plan lays it out; the last two are drawn
    broadcast_over: tuple[str, ...]
    block_bytes: int  # one block (TPU) or one load of a program (GPU)
    contracted: str | None  # the product's contracted dimension, on its operands
    transposed: bool  # an operand the product reads transposed (`k.T`)


@dataclass(frozen=True)
class GridAxis:
    dim: str
    index: str
    steps: int
    arbitrary: bool  # the contracted dimension: steps accumulate in order
    chosen: int


@dataclass(frozen=True)
class KernelTiles:
    kernel: str
    gpu: bool
    sizes: dict[str, int]
    blocks: dict[str, int]  # the blocked dimensions, clamped as the generated code clamps them
    grid: tuple[GridAxis, ...]
    arrays: tuple[ArrayTiles, ...]
    contracted: str | None
    operands: tuple[str, ...]  # a product's left and right operands
    looped: str | None  # GPU: the contracted dimension each program loops over
    vmem_bytes: int  # TPU: double-buffered blocks plus the accumulator
    accumulator_bytes: int
    accumulator_dtype: str | None
    gpu_options: dict[str, int]


def default_sizes(checked: CheckedKernel, gpu: bool) -> dict[str, int]:
    """Sizes that show a ragged edge: two and a half blocks of each blocked dimension,
    three of a dimension blocked by one, and a small size for one taken whole."""
    blocks = checked.settings["gpu"].blocks if gpu else checked.blocks
    return {d: (3 if blocks[d] == 1 else blocks[d] * 5 // 2) if d in blocks else WHOLE_SIZE for d in checked.dims}


def sizes_for(checked: CheckedKernel, given: dict[str, int], gpu: bool) -> dict[str, int]:
    """The given sizes over the defaults; raises `ShowError` for a dimension the kernel lacks."""
    for dim, size in given.items():
        if size < 1:
            raise ShowError(f"--size {dim}={size}: a size is a positive integer")
        if dim not in checked.dims:
            raise ShowError(
                f"--size {dim}: {checked.kernel.name} has no dimension {dim}{did_you_mean(dim, checked.dims)};"
                f" its dimensions are {', '.join(checked.dims)}"
            )
    return {**default_sizes(checked, gpu), **given}


def kernel_tiles(checked: CheckedKernel, sizes: dict[str, int], gpu: bool) -> KernelTiles:
    """Every array's blocks at `sizes`, on the TPU path or the GPU (Triton) path."""
    kernel, product = checked.kernel, checked.product
    out_dims = checked.space.layout
    blocks = _gpu_blocks(checked, sizes) if gpu else {d: min(b, sizes[d]) for d, b in checked.blocks.items()}
    for dim, block in blocks.items():
        if -(-sizes[dim] // block) > MAX_BLOCKS and _drawn(dim, checked):
            raise ShowError(
                f"--size {dim}={sizes[dim]} makes {-(-sizes[dim] // block)} blocks of {block}; show draws at"
                f" most {MAX_BLOCKS} along a dimension: give a smaller size"
            )
    contracted = product.k if product else None
    looped = contracted if gpu else None
    grid_dims = list(out_dims) if gpu else [d for d in checked.dims if d in blocks]
    names = grid_names(grid_dims, product)
    steps = {d: -(-sizes[d] // blocks.get(d, sizes[d])) for d in grid_dims}
    chosen = _highlighted_step(grid_dims, steps, out_dims, contracted)
    grid = tuple(GridAxis(d, names[d], steps[d], d == contracted, chosen[d]) for d in grid_dims)
    exact = {d: blocks.get(d, sizes[d]) for d in checked.dims}
    operands = {o.name for o in product.operands} if product else set()
    transposed = {o.name for o in product.operands if o.transposed} if product else set()

    def axis(dim: str | None) -> Axis:
        if dim is None:
            return Axis(None, 1, 1, None, 0)
        return Axis(dim, sizes[dim], exact[dim], names.get(dim), chosen.get(dim, 0), dim == looped)

    arrays = tuple(
        ArrayTiles(
            name=decl.name,
            dtype=decl.dtype,
            dims=decl.dims,
            is_output=decl in kernel.outputs,
            axes=tuple(axis(d) for d in layout_of(decl, out_dims, product)),
            broadcast_over=() if decl.name in operands else tuple(d for d in out_dims if d not in decl.dims),
            block_bytes=block_bytes(decl, exact),
            contracted=contracted if decl.name in operands else None,
            transposed=decl.name in transposed,
        )
        for decl in kernel.inputs + kernel.outputs
    )
    # Only a blocked contracted dimension needs an accumulator in VMEM scratch.
    accumulating = product if product is not None and product.k in checked.blocks and not gpu else None
    return KernelTiles(
        kernel=kernel.name,
        gpu=gpu,
        sizes={d: sizes[d] for d in checked.dims},
        blocks={d: blocks[d] for d in checked.dims if d in blocks},
        grid=grid,
        arrays=arrays,
        contracted=contracted,
        operands=tuple(o.name for o in product.operands) if product else (),
        looped=looped,
        vmem_bytes=0 if gpu else vmem_bytes(kernel, exact, accumulating),
        accumulator_bytes=accumulator_bytes(accumulating, exact),
        accumulator_dtype=accumulating.accumulator.name if accumulating else None,
        gpu_options=dict(checked.settings["gpu"].options) if gpu else {},
    )


def _gpu_blocks(checked: CheckedKernel, sizes: dict[str, int]) -> dict[str, int]:
    """GPU blocks as the generated launcher clamps them: to the size's next power of two,
    and no smaller than a dot tile for a product's dimensions."""
    product = checked.product
    dot_dims = (product.m, product.n, product.k) if product else ()
    return {
        d: min(b, max(SMALLEST_DOT_TILE if d in dot_dims else 1, 1 << (sizes[d] - 1).bit_length()))
        for d, b in checked.settings["gpu"].blocks.items()
    }


def _highlighted_step(grid_dims, steps, out_dims, contracted) -> dict[str, int]:
    """Block 1 along the output's rows (its only dimension if it has one) and along the
    contracted dimension, block 0 elsewhere: a step whose blocks are not all in a corner."""
    rows = out_dims[-2] if len(out_dims) >= 2 else out_dims[-1] if out_dims else None
    moved = {rows if rows in grid_dims else (grid_dims[0] if grid_dims else None), contracted}
    return {d: min(1, steps[d] - 1) if d in moved else 0 for d in grid_dims}


def _drawn(dim: str, checked: CheckedKernel) -> bool:
    """Whether some array draws `dim` as rows or columns of blocks (not as a stack)."""
    out_dims = checked.space.layout
    decls = checked.kernel.inputs + checked.kernel.outputs
    return any(dim in layout_of(decl, out_dims, checked.product)[-2:] for decl in decls)
