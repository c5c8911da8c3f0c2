"""Each kernel's tiles: which dimension each axis of each value's tile holds (its *frame*).

A kernel with products is one `pallas_call` whose values are tiles of at most two
dimensions: a product's batch dimensions take one element per step and vanish from
the tiles. A kernel without products holds every value over its layout, at any rank
(`layout_frame`). Its blocked dimensions that some output has are parallel grid axes; at most
one blocked dimension that no output has is *swept*: its blocks are the steps of one
pass, in order, and what the kernel computes across them is *carried* from step to
step (`analysis.carries`).

This module decides, from the typed spec, each value's tile axes (its frame) and the
swept dimension, whose carries `analysis.carries.sweep_over` derives. It says nothing
about how a backend places a carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pallasgen.analysis.carries import ValueProblem, named, values_read
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.infer import dims_text, product_operand
from pallasgen.analysis.product import find_products, single_product
from pallasgen.analysis.valuetypes import ValueType
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic


def is_framed(kernel: ir.Kernel) -> bool:
    """Whether a kernel has products and none is its `single_product`: several products,
    a product of a value that is not an input array, or a product beside a reduction."""
    return bool(find_products(kernel)) and single_product(kernel) is None


@dataclass(frozen=True)
class Product:
    """One `@` of a fused kernel, as the tiles see it."""

    node: ir.Binary
    lhs: ir.Expr
    rhs: ir.Expr
    lhs_contracts: int  # the tile axis of the contracted dimension in each operand
    rhs_contracts: int
    k: str  # the contracted dimension


@dataclass(frozen=True)
class FusedKernel:
    """What the fused path derives from a checked kernel."""

    batch: tuple[str, ...]  # dimensions blocked by 1: one element per step
    row: str | None  # the first axis of every tile that has it
    parallel: tuple[str, ...]  # blocked dimensions some output has
    frame: dict[ir.Expr, tuple[str | None, ...]] = field(hash=False)  # each value's tile axes
    products: dict[ir.Expr, Product] = field(hash=False)
    # Without products: the axis of each dimension in every tile, the kernel's layout (any
    # rank). None: tiles of two axes, the row first (`_Frame`).
    axes: tuple[str, ...] | None = None


def analyze_fused(
    kernel: ir.Kernel, types: dict[ir.Expr, ValueType], dims: tuple[str, ...], blocks: dict[str, int]
) -> tuple[FusedKernel | None, list[Diagnostic]]:
    """The fused kernel's frame, or the diagnostics saying why not."""
    items = {item.dim: item for item in kernel.blocks}
    output_dims = {d for out in kernel.outputs for d in out.dims}
    products = [n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Binary) and n.op == "@"]
    batch = _batch_dims(products, types, dims)
    # A batch dimension takes one element per step, written so or not (a backend may ask
    # for the `block` statement to say so: the TPU's checks do).
    found = [
        Diagnostic(items[dim].position, batch_block_problem(dim)) for dim in batch if dim in blocks and blocks[dim] != 1
    ]
    found += _batch_reduction_problems(kernel, batch)
    found += _batch_order_problems(kernel, batch)
    swept = [d for d in dims if d in blocks and d not in output_dims and d not in batch]
    for dim in swept[1:]:
        found.append(
            Diagnostic(
                items[dim].position,
                f"one dimension that no output has can be blocked, and {swept[0]} is: leave {dim} unblocked",
            )
        )
    if found:
        return None, found
    row = _row_dim(products, types, batch)
    try:
        frame = _Frame(kernel, types, batch, row).axes()
        fused_products = {n: _product(n, types, frame) for n in products}
        for dim in blocks:
            if dim in output_dims and dim not in batch:
                _kept_dim_problem(kernel, types, dim, fused_products, items[dim])
    except ValueProblem as problem:
        return None, [problem.diagnostic]
    parallel = tuple(d for d in dims if d in blocks and d in output_dims and d not in batch)
    return FusedKernel(batch, row, parallel, frame, fused_products), []


def _batch_reduction_problems(kernel: ir.Kernel, batch: tuple[str, ...]) -> list[Diagnostic]:
    """A reduction or softmax over a product's batch dimension: each step holds one
    element of it, and nothing is carried across the steps of a batch dimension."""
    return [
        Diagnostic(
            node.args[1].position,
            f"{node.func}() over {node.args[1].id}, a batch dimension of a product (one element per step), is not"
            f" supported yet: give an output {node.args[1].id} and reduce it after the kernel",
        )
        for node in ir.walk(*(s.value for s in kernel.body))
        if isinstance(node, ir.Call)
        and node.func in FUNCTIONS
        and FUNCTIONS[node.func].typing in ("reduce", "softmax")
        and len(node.args) == 2
        and isinstance(node.args[1], ir.Name)
        and node.args[1].id in batch
    ]


def _batch_order_problems(kernel: ir.Kernel, batch: tuple[str, ...]) -> list[Diagnostic]:
    """An array that lists a product's batch dimension after one of its tiles' (each step
    holds one element of it: its tiles' dimensions come last)."""
    found = []
    for decl in kernel.outputs + kernel.inputs:
        tiled = [d for d in decl.dims if d not in batch]
        for dim, position in zip(decl.dims, decl.dim_positions):
            if dim in batch and tiled and decl.dims.index(tiled[0]) < decl.dims.index(dim):
                found.append(
                    Diagnostic(
                        position,
                        f"{dim}, a batch dimension of a product, comes after {tiled[0]} in '{decl.name}': an array of a"
                        " kernel with products lists its batch dimensions first",
                    )
                )
                break
    return found


def batch_block_problem(dim: str) -> str:
    """Why a product's batch dimension is blocked by 1."""
    return f"{dim} is a batch dimension of a product: it takes one element per step; write block {dim} = 1"


def layout_frame(types: dict[ir.Expr, ValueType], layout: tuple[str, ...], blocks, output_dims) -> FusedKernel:
    """The tiles of a kernel without products: each value holds each of its dimensions on
    that dimension's axis of the kernel's `layout`, and size 1 on the others."""
    frame = {node: tuple(d if d in t.dims else None for d in layout) for node, t in types.items()}
    parallel = tuple(d for d in layout if d in blocks and d in output_dims)
    return FusedKernel((), layout[0] if layout else None, parallel, frame, {}, axes=layout)


def array_axes(decl: ir.ArrayDecl, fused: FusedKernel) -> tuple[str | None, ...]:
    """How a kernel lays an array out: its batch dimensions, then its tile axes (a
    two-dimensional tile in its declared order; one dimension as the frame holds it; or,
    without products, over the kernel's layout)."""
    if fused.axes is not None:
        return tuple(d if d in decl.dims else None for d in fused.axes)
    batch = tuple(d for d in decl.dims if d in fused.batch)
    rest = [d for d in decl.dims if d not in fused.batch]
    if len(rest) == 2:
        return (*batch, *rest)
    if len(rest) == 1:
        return (*batch, *((rest[0], None) if rest[0] == fused.row else (None, rest[0])))
    return (*batch, None, None)


def _batch_dims(products: list[ir.Binary], types, dims) -> tuple[str, ...]:
    """Dimensions outside every product's matrices: its operands' leading ones."""
    matrix, every = set(), set()
    for node in products:
        for value in values_read(node):
            matrix |= set(types[value].dims[-2:])
            every |= set(types[value].dims)
    return tuple(d for d in dims if d in every - matrix)


def _row_dim(products, types, batch) -> str:
    """The first product's rows: every tile that has them holds them on its first axis."""
    value, transposed = product_operand(products[0].left)
    dims = [d for d in types[value].dims if d not in batch]
    return dims[-1] if transposed else dims[-2]


def _kept_dim_problem(kernel, types, dim, products, item) -> None:
    """A blocked dimension an output keeps must not be contracted or reduced: a block
    holds only part of it."""
    for node in ir.walk(*(s.value for s in kernel.body)):
        reduced = isinstance(node, ir.Call) and FUNCTIONS.get(node.func) and FUNCTIONS[node.func].reducer
        if reduced and isinstance(node.args[1], ir.Name) and node.args[1].id == dim:
            raise ValueProblem(
                node,
                f"{node.func}() over {dim} needs all of {dim}, and an output keeps {dim}, so it is not swept"
                f" (block {dim} at line {item.position.line}): leave {dim} unblocked",
            )
        if node in products and products[node].k == dim:
            raise ValueProblem(
                node,
                f"this product contracts {dim}, which an output keeps (block {dim} at line {item.position.line}):"
                f" leave {dim} unblocked",
            )


class _Frame:
    """Each value's tile axes: (row, column), None where it has size 1. The row dimension
    is always the first axis; a tile without it keeps its operands' order."""

    def __init__(self, kernel, types, batch, row):
        self.kernel, self.types, self.batch, self.row = kernel, types, set(batch), row
        self.lets = {named(s): s.value for s in kernel.body}  # an output a statement reads: its value
        self.inputs = {d.name: d for d in kernel.inputs}
        self.found: dict[ir.Expr, tuple] = {}

    def axes(self) -> dict[ir.Expr, tuple]:
        outputs = {d.name: d for d in self.kernel.outputs}
        for statement in self.kernel.body:
            axes = [a for a in self.of(statement.value) if a is not None]
            out = outputs.get(getattr(statement, "target", None))
            if out is not None and len(axes) == 2 and axes != [d for d in out.dims if d not in self.batch]:
                raise ValueProblem(
                    statement.value,
                    f"this value's tile is laid out ({', '.join(axes)}) but output '{out.name}' is"
                    f" {dims_text(out.dims)}; compute it in the output's order (y.T @ x.T is (x @ y).T)",
                )
        return self.found

    def of(self, node: ir.Expr) -> tuple:
        if node not in self.found:
            self.found[node] = self._of(node)
        return self.found[node]

    def _dims(self, node) -> list[str]:
        return [d for d in self.types[node].dims if d not in self.batch]

    def _of(self, node: ir.Expr) -> tuple:
        dims = self._dims(node)
        if len(dims) > 2:
            raise ValueProblem(
                node,
                f"a value of a fused kernel has at most two dimensions besides its batch ones, not {', '.join(dims)}",
            )
        children = [self.of(child) for child in values_read(node)]
        if isinstance(node, ir.Name) and node.id in self.lets:
            return self.of(self.lets[node.id])
        if isinstance(node, ir.Binary) and node.op == "@":
            lhs, rhs = children
            return (*[d for d in lhs if d not in rhs], *[d for d in rhs if d not in lhs])
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "reduce":
            reduced = tuple(None if axis == node.args[1].id else axis for axis in children[0])
            if reduced != self._rule(dims, reduced):
                raise ValueProblem(
                    node, f"this reduction leaves {dims[0]} on a tile's first axis; not supported in a fused kernel"
                )
            return reduced
        if isinstance(node, ir.Name) and node.id in self.inputs and len(dims) == 2:
            return tuple(d for d in self.inputs[node.id].dims if d not in self.batch)
        wide = next((axes for axes in children if None not in axes), None)
        axes = self._rule(dims, wide)
        for child, child_axes in zip(values_read(node), children):
            if any(a is not None and a != b for a, b in zip(child_axes, axes)):
                raise ValueProblem(
                    child,
                    f"this value's tile is laid out ({', '.join(a or '1' for a in child_axes)}) but meets one laid"
                    f" out ({', '.join(a or '1' for a in axes)}); not supported in a fused kernel",
                )
        return axes

    def _rule(self, dims, wide) -> tuple:
        """Tile axes for `dims`: the row dimension first; a 1-D value off it is a row
        (1, n); a 2-D one without it takes the order of a tile it is computed from."""
        dims = [d for d in dims if d is not None]
        if not dims:
            return (None, None)
        if len(dims) == 1:
            return (dims[0], None) if dims[0] == self.row else (None, dims[0])
        if self.row in dims:
            return (self.row, *[d for d in dims if d != self.row])
        return wide if wide is not None and set(wide) == set(dims) else tuple(dims)


def _product(node: ir.Binary, types, frame) -> Product:
    lhs, _ = product_operand(node.left)
    rhs, _ = product_operand(node.right)
    lhs_axes, rhs_axes = frame[lhs], frame[rhs]
    (k,) = [d for d in lhs_axes if d in rhs_axes]
    return Product(node, lhs, rhs, lhs_axes.index(k), rhs_axes.index(k), k)
