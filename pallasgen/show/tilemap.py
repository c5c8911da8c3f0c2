"""What `pallasgen show` draws, as plain data: how each array of a kernel is cut into
blocks at given sizes, the grid that walks those blocks, and one highlighted step.

Everything is read from the backend's plan, the one the generated code is rendered
from: its `Tiling` (grid order, index maps, block extents, dimension semantics, the
dimension a program loops over), its blocks as its launcher clamps them, and on a TPU
its scratch accumulators and the parts of its VMEM.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, replace
from math import prod

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.backends import backend_named, plan_backends
from pallasgen.frontend.errors import did_you_mean
from pallasgen.lowering.parts import contracted_inputs

# A picture with more blocks than this along one dimension is no longer readable.
MAX_BLOCKS = 24
# The size given by default to a dimension taken whole: small, so that it draws narrow.
WHOLE_SIZE = 64


class ShowError(Exception):
    """Sizes that cannot be drawn, in plain words."""


@dataclass(frozen=True)
class Axis:
    """One dimension of an array as the kernel walks it."""

    dim: str | None  # None where the array has size 1: it broadcasts, or a reduction removed it
    size: int
    block: int  # elements per block (per loop slice where `looped`)
    index: str | None  # the grid index that picks the block (i, j, k), None if always block 0
    chosen: int  # the block the highlighted step reads or writes
    looped: bool = False  # GPU: each program loops over the whole axis itself
    index_code: str = "0"  # the index map's entry, as the generated code writes it

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
    axes: tuple[Axis, ...]  # the axes of its block, as its BlockSpec has them; the last two are drawn
    missing: tuple[str, ...]  # the kernel's dimensions it lacks: an input broadcasts over them, an output reduces them
    block_bytes: int  # one block (TPU) or one load of a program (GPU)
    accumulated: str | None  # the dimension it is read along step by step (TPU) or in a loop (GPU)
    transposed: bool  # an operand the product reads transposed (`k.T`)
    skips: bool = False  # a skipped step fetches no new block of it (its index map keeps block 0)


@dataclass(frozen=True)
class GridAxis:
    dim: str
    index: str
    steps: int
    semantics: str  # "parallel", or "arbitrary": its steps accumulate in order
    chosen: int


@dataclass(frozen=True)
class KernelTiles:
    kernel: str
    gpu: bool
    sizes: dict[str, int]
    blocks: dict[str, int]  # the blocked dimensions, clamped as the generated code clamps them
    grid: tuple[GridAxis, ...]
    arrays: tuple[ArrayTiles, ...]
    contracted: str | None  # a product's contracted dimension
    operands: tuple[str, ...]  # a product's left and right operands
    accumulated: str | None  # TPU: the dimension of the arbitrary axis, into scratch accumulators
    looped: str | None  # GPU: the dimension each program loops over
    scratch: tuple[str, ...]  # TPU: the scratch accumulators, as the generated code's comments describe them
    vmem_bytes: int  # TPU: every part of `vmem_formula` together
    vmem_formula: str
    vmem_limit: int  # TPU: the most VMEM a launcher asks for
    gpu_options: dict[str, int]
    # A kernel that skips steps (causal attention past the diagonal): the condition under
    # which a step computes (as the index maps write it), whether the highlighted step is
    # skipped, and which steps along the accumulated dimension are, at its other indices.
    live: str | None = None
    step_skipped: bool = False
    skipped: tuple[int, ...] = ()


def default_sizes(checked: CheckedKernel, gpu: bool) -> dict[str, int]:
    """Sizes that show a ragged edge: two and a half blocks of each blocked dimension,
    three of a dimension blocked by one, and a small size for one taken whole."""
    blocks = backend_named("gpu" if gpu else "tpu").default_blocks(checked)
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
    """Every array's blocks at `sizes`, on the TPU path or the GPU (Triton) path, as the
    backend's plan lays them out."""
    kernel = checked.kernel
    backend = backend_named("gpu" if gpu else "tpu")
    # A plain call's plan: without the residuals its launchers write under jax.grad.
    plan = plan_backends(replace(checked, gradient=None))[backend.name]
    tiling = plan.tiling
    blocks = backend.blocks_at(plan, sizes) | {g.dim: 1 for g in tiling.grid if g.per_element}
    _check_drawable(tiling, sizes, blocks)
    contracted = contracted_inputs(checked)  # inputs read only as products' operands
    operands, transposed = set(contracted), {name for name, t in contracted.items() if t}
    steps = {g.dim: -(-sizes[g.dim] // blocks[g.dim]) for g in tiling.grid}
    accumulated = next((g.dim for g in tiling.grid if g.semantics == "arbitrary"), None)
    chosen = _highlighted_step(tiling.grid, steps, checked.space.layout, accumulated)
    grid = tuple(GridAxis(g.dim, g.index, steps[g.dim], g.semantics, chosen[g.dim]) for g in tiling.grid)
    by_index = {g.index: g.dim for g in tiling.grid}
    decls = {decl.name: decl for decl in kernel.inputs + kernel.outputs}
    vmem = None if gpu else plan.vmem
    exact = {**sizes, **blocks}  # a dimension taken whole is one block of its size

    def axis(block_axis) -> Axis:
        dim = block_axis.dim
        if dim is None:
            return Axis(None, 1, 1, None, 0)
        if block_axis.extent == "squeezed":
            return Axis(
                dim,
                sizes[dim],
                1,
                block_axis.index,
                chosen[by_index[block_axis.index]],
                index_code=block_axis.index_code,
            )
        block = blocks[dim] if block_axis.extent == "block" or dim == tiling.looped else sizes[dim]
        picked = chosen[by_index[block_axis.index]] if block_axis.index else 0
        return Axis(dim, sizes[dim], block, block_axis.index, picked, dim == tiling.looped, block_axis.index_code)

    def array_tiles(blocks_of) -> ArrayTiles:
        decl = decls[blocks_of.name]
        axes = tuple(axis(a) for a in blocks_of.axes)
        if vmem is not None:
            block_bytes = next(p.bytes(exact) for p in vmem.parts if p.array == decl.name)
        else:
            block_bytes = DTYPES[decl.dtype].bytes * prod(a.block for a in axes if a.dim is not None)
        along = accumulated or tiling.looped
        return ArrayTiles(
            name=decl.name,
            dtype=decl.dtype,
            dims=decl.dims,
            is_output=decl in kernel.outputs,
            axes=axes,
            missing=() if decl.name in operands else tuple(d for d in checked.space.layout if d not in decl.dims),
            block_bytes=block_bytes,
            accumulated=along if along in decl.dims and decl in kernel.inputs else None,
            transposed=decl.name in transposed,
            skips=any(a.live for a in blocks_of.axes),
        )

    live = next((a.live for array in tiling.arrays for a in array.axes if a.live), None)
    skipped: tuple[int, ...] = ()
    step_skipped = False
    if live is not None and accumulated is not None:
        values = {**_block_and_size_names(checked, sizes, blocks), **{g.index: chosen[g.dim] for g in tiling.grid}}
        along = next(g.index for g in tiling.grid if g.dim == accumulated)
        skipped = tuple(n for n in range(steps[accumulated]) if _evaluate(live, {**values, along: n}) is False)
        step_skipped = chosen[accumulated] in skipped
    accumulator = None if gpu else plan.accumulator
    return KernelTiles(
        kernel=kernel.name,
        gpu=gpu,
        sizes={d: sizes[d] for d in checked.dims},
        blocks={d: blocks[d] for d in checked.dims if d in blocks},
        grid=grid,
        arrays=tuple(array_tiles(a) for a in tiling.arrays),
        contracted=checked.product.k if checked.product else None,
        operands=tuple(o.name for o in checked.product.operands) if checked.product else (),
        accumulated=accumulated,
        looped=tiling.looped,
        scratch=tuple(comment for comment, _ in accumulator.scratch) if accumulator else (),
        vmem_bytes=vmem.total(exact) if vmem else 0,
        vmem_formula=vmem.formula(exact) if vmem else "",
        vmem_limit=vmem.limit if vmem else 0,
        gpu_options=backend.default_options(checked) if gpu else {},
        live=live,
        step_skipped=step_skipped,
        skipped=skipped,
    )


def _check_drawable(tiling, sizes: dict[str, int], blocks: dict[str, int]) -> None:
    """Raises `ShowError` where an array would draw more than MAX_BLOCKS blocks of a
    dimension as its rows or columns (not as a stack)."""
    drawn = {a.dim for array in tiling.arrays for a in array.axes[-2:]}
    for dim in (d for d in blocks if d in drawn):
        count = -(-sizes[dim] // blocks[dim])
        if count > MAX_BLOCKS:
            raise ShowError(
                f"--size {dim}={sizes[dim]} makes {count} blocks of {blocks[dim]}; show draws at"
                f" most {MAX_BLOCKS} along a dimension: give a smaller size"
            )


def _highlighted_step(grid, steps, out_dims, accumulated) -> dict[str, int]:
    """Block 1 along the output's rows (its only dimension if it has one) and along the
    accumulated dimension, block 0 elsewhere: a step whose blocks are not all in a corner."""
    dims = [g.dim for g in grid]
    parallel = [d for d in dims if d != accumulated]
    rows = out_dims[-2] if len(out_dims) >= 2 else out_dims[-1] if out_dims else None
    moved = {rows if rows in parallel else (parallel[0] if parallel else None), accumulated}
    return {d: min(1, steps[d] - 1) if d in moved else 0 for d in dims}


def _block_and_size_names(checked: CheckedKernel, sizes: dict[str, int], blocks: dict[str, int]) -> dict[str, int]:
    """The values of the names an index map's condition reads besides the grid indices:
    `block_<dim>`, and each size by its variable (the dimension in lower case, with the
    underscores the generated code adds where the name is taken)."""
    from pallasgen.analysis.names import block_keyword

    names = {block_keyword(d): b for d, b in blocks.items()}
    for dim in checked.dims:
        for underscores in range(4):
            names.setdefault(dim.lower() + "_" * underscores, sizes[dim])
    return names


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.GtE: operator.ge,
    ast.Gt: operator.gt,
    ast.LtE: operator.le,
    ast.Lt: operator.lt,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def _evaluate(code: str, names: dict[str, int]):
    """An index map's integer arithmetic and comparisons at known values; None where it
    reads anything else."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPERATORS:
            return _OPERATORS[type(node.ops[0])](value(node.left), value(node.comparators[0]))
        raise ValueError(code)

    try:
        return value(ast.parse(code, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None
