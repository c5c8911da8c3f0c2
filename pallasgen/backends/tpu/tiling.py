"""TPU block-shape rules and the VMEM a block configuration needs."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from pallasgen.frontend import ir
from pallasgen.frontend.text import format_bytes
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.dtypes import DTYPES, DType, tpu_dtype
from pallasgen.analysis.hardware import TPU_LANES, TPU_SUBLANES
from pallasgen.lowering.fused import carried_parts, carried_tile
from pallasgen.lowering.reductions import merges
from pallasgen.analysis.fused import FusedKernel, array_axes

from pallasgen.runtime.constants import (  # noqa: F401
    SCOPED_VMEM_BYTES,
    VMEM_LIMIT_BYTES,
    tiles_on_tpu,
    tiling_rule_words,
)

# VMEM of a TPU v5e or v6e core (the runtime's constants hold the scoped default and the
# most a launcher asks for).
VMEM_CAPACITY_BYTES = 128 * 1024 * 1024
SUBLANES, LANES = TPU_SUBLANES, TPU_LANES

Layout = tuple[tuple[str | None, ...], DType]


def tile_layouts(kernel: ir.Kernel, fused: FusedKernel) -> list[Layout]:
    """Each array's block as Mosaic sees it, and its dtype: its tile axes (batch ones
    squeezed; "(1)" where it has size 1, which is whole)."""
    layouts = []
    for decl in kernel.inputs + kernel.outputs:
        axes = array_axes(decl, fused)[len([d for d in decl.dims if d in fused.batch]) :]
        layouts.append((tuple(a or "(1)" for a in axes), DTYPES[decl.dtype]))
    return layouts


@dataclass(frozen=True)
class TilingRule:
    """What Mosaic needs of a block of `dim` for one array: a multiple of `multiple`, or
    (a one-dimensional array) a power of two of at least `smallest_power_of_two`; the
    whole dimension is always legal. `held`: how the array holds `dim` (see
    constants.tiling_rule_words, which words the rule for spec-time and call-time errors)."""

    dim: str
    multiple: int
    held: str
    smallest_power_of_two: int | None = None

    def describe(self) -> str:
        """The rule in words: why it applies, and what it asks."""
        return tiling_rule_words(self.dim, self.multiple, self.held, self.smallest_power_of_two)

    def allows(self, size: int) -> bool:
        return tiles_on_tpu(size, self.multiple, self.smallest_power_of_two)


def tiling_bits(dtype: DType) -> int:
    """Bits of one element as a TPU kernel holds it: bool is 32-bit in VMEM, and f16 is
    computed as f32 (dtypes.tpu_dtype)."""
    return 32 if dtype.name == "bool" else DTYPES[tpu_dtype(dtype.name)].bits


def tiling_rule(dim: str, layouts: list[Layout]) -> TilingRule | None:
    """The TPU tiling rule that blocking `dim` must meet: the strictest that any array
    holding it sets (their multiples are powers of two, so the largest covers the rest)."""
    rules = []
    for dims, dtype in layouts:
        if dim not in dims:
            continue
        bits = tiling_bits(dtype)
        position = len(dims) - dims.index(dim)
        if len(dims) == 1:
            rules.append(TilingRule(dim, 1024, f"1-D {dtype.name}", LANES * (32 // bits)))
        elif position == 1:
            rules.append(TilingRule(dim, LANES, "lanes"))
        elif position == 2:
            rules.append(TilingRule(dim, SUBLANES * (32 // bits), f"{dtype.name} rows"))
    return max(rules, key=lambda rule: (rule.multiple, rule.smallest_power_of_two or 0), default=None)


def block_choices(rule: TilingRule | None, size: int) -> tuple[int, ...]:
    """The blocks worth trying of a dimension of `size` that `rule` tiles (None: any
    block): the rule's multiple times each power of two below the size, then the whole
    dimension."""
    choices, block = [], max(rule.multiple, rule.smallest_power_of_two or 0) if rule else 1
    while block < size:
        choices.append(block)
        block *= 2
    return (*choices, size)


def tiling_problem(dim: str, size: int, layouts: list[Layout]) -> str | None:
    """Why blocking `dim` by `size` breaks the TPU tiling rule, or None."""
    rule = tiling_rule(dim, layouts)
    if rule is None or rule.allows(size):
        return None
    return f"block {dim} = {size} breaks the TPU tiling rule: {rule.describe()}; use {_round_up(size, rule.multiple)} or leave {dim} unblocked"


def accumulates_elementwise(kernel: ir.Kernel, dim: str) -> bool:
    """Whether the TPU kernel's reductions over its blocked `dim` keep block-shaped running
    values, merged position by position each step and reduced once, at the last: when
    `dim` is the kernel's only dimension (its reductions end in scalars: reducing a block
    across lanes and sublanes every step doubled the compiler's estimate against XLA's)
    and each reduction merges so."""
    reductions = {n.func for n in _reductions(kernel)}
    return _dims(kernel) == {dim} and bool(reductions) and all(merges(kind) for kind in reductions)


def holds_rows(kernel: ir.Kernel, dim: str) -> bool:
    """Whether the TPU kernel holds its one-dimensional blocks of `dim` as rows of 128
    lanes (`rt.as_rows`): when it keeps block-shaped running values and never asks for
    positions (`index()`). Mosaic handles a long single row poorly: a block of 2^20 int8
    comparisons to a count was estimated at 256,176 cycles as one row and 52,931 as rows
    on v5e (XLA: 72,571), and 5% to 7% fewer for int32."""
    return accumulates_elementwise(kernel, dim) and not any(n.func == "index" for n in _calls(kernel))


def _reductions(kernel: ir.Kernel) -> list[ir.Call]:
    return [n for n in _calls(kernel) if n.func in FUNCTIONS and FUNCTIONS[n.func].reducer]


def _calls(kernel: ir.Kernel) -> list[ir.Call]:
    return [n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Call)]


def _dims(kernel: ir.Kernel) -> set[str]:
    return {d for decl in kernel.inputs + kernel.outputs for d in decl.dims}


@dataclass(frozen=True)
class VmemPart:
    """One buffer VMEM holds, `buffers` times: `element_bytes` times the product of the
    blocks of `dims` (a dimension taken whole counts as 1, unknown, unless given)."""

    what: str  # the array it holds, or what it is: "f32 accumulator"
    array: str | None  # the array whose blocks it holds (double-buffered), if any
    buffers: int
    element_bytes: int
    dims: tuple[str, ...]

    def bytes(self, blocks: dict[str, int]) -> int:
        """One buffer's bytes."""
        return self.element_bytes * prod(blocks.get(d, 1) for d in self.dims)


@dataclass(frozen=True)
class Vmem:
    """The VMEM a kernel's blocks need, part by part; `total` is their sum."""

    parts: tuple[VmemPart, ...]
    limit: int  # the most a launcher asks of a TPU v5e or v6e

    def total(self, blocks: dict[str, int]) -> int:
        return sum(part.buffers * part.bytes(blocks) for part in self.parts)

    def terms(self) -> list[tuple[int, tuple[str, ...]]]:
        """Its parts as (bytes, dims) terms, each `bytes` times the product of the blocks
        of `dims`; parts over the same dims merged, in order of first appearance."""
        terms: dict[tuple[str, ...], int] = {}
        for part in self.parts:
            terms[part.dims] = terms.get(part.dims, 0) + part.buffers * part.element_bytes
        return [(count, dims) for dims, count in terms.items()]

    def formula(self, blocks: dict[str, int]) -> str:
        """`2 buffers x (x 1.0 MiB + z 1.0 MiB) + f32 accumulator 2.0 MiB + 3 lets x 4.0 MiB`:
        every part, in bytes at `blocks`; parts alike (lets, or the same name) of the same
        bytes counted together."""
        buffered = [p for p in self.parts if p.buffers == 2]
        terms = [f"2 buffers x ({' + '.join(f'{p.what} {format_bytes(p.bytes(blocks))}' for p in buffered)})"]
        alike: dict[tuple[str, int], list[VmemPart]] = {}
        for part in self.parts:
            if part.buffers != 2:
                label = "lets" if part.what.startswith("let ") else part.what
                alike.setdefault((label, part.bytes(blocks)), []).append(part)
        for (label, size), parts in alike.items():
            count = sum(p.buffers for p in parts)
            if label == "lets" and len(parts) > 1:
                terms.append(f"{len(parts)} lets x {format_bytes(size)}")
            else:
                times = f"{count} x " if count > 1 else ""
                terms.append(f"{parts[0].what} {times}{format_bytes(size)}")
        return " + ".join(terms)


def kernel_vmem(checked, blocks: dict[str, int], kernel: ir.Kernel | None = None) -> Vmem:
    """What a step of a checked kernel holds in VMEM at `blocks` (`kernel`: the checked
    one, or it without its residuals). A kernel with products: its arrays' blocks as its
    tiles hold them, double-buffered, what it carries across its swept dimension, and
    its products' working tiles. Measured on v5e (libtpu's scoped allocation,
    benchmarks/RESULTS_TPU_ESTIMATES.md): a dot's result is not held apart from its
    accumulator (matmul at 512 x 1024 x 1024 needs the 18 MiB counted); a computed
    operand or an epilogue is (matmul_relu_backward_x needs 24.1 MiB, its arrays and
    accumulator 22). A kernel without products: `vmem`."""
    kernel = kernel or checked.kernel
    if not checked.has_products:
        return vmem(kernel, blocks)
    frame, sweep = checked.frame, checked.sweep
    parts = [
        VmemPart(
            decl.name,
            decl.name,
            2,
            DTYPES[decl.dtype].bytes,
            tuple(d for d in array_axes(decl, frame) if d and d not in frame.batch),
        )
        for decl in kernel.inputs + kernel.outputs
    ]
    if sweep is not None:
        blockwise = accumulates_elementwise(kernel, sweep.dim)
        for carry in sweep.carries:
            what = {"dot": f"{checked.types[carry.node].dtype.name} accumulator", "expsum": "running sum of exp"}.get(
                carry.kind, f"running {carry.kind}"
            )
            dims = carried_tile(carry, frame, sweep.dim, blockwise)
            parts.append(VmemPart(what, None, len(carried_parts(carry)), 4, dims))
    parts += [VmemPart("working tile", None, 1, 4, dims) for dims in _working_tiles(kernel, frame).values()]
    return Vmem(tuple(parts), VMEM_LIMIT_BYTES)


def _working_tiles(kernel: ir.Kernel, frame) -> dict[object, tuple[str, ...]]:
    """The 32-bit tiles Mosaic holds around a kernel's products, by the value each holds:
    an operand computed in the kernel, and a product's value that an epilogue reads
    (stored as it is, it goes out from its accumulator)."""
    inputs = {d.name for d in kernel.inputs}
    stored = {s.value for s in kernel.body if isinstance(s, ir.Assign)}
    found = {}
    for node, product in frame.products.items():
        values = [v for v in (product.lhs, product.rhs) if not (isinstance(v, ir.Name) and v.id in inputs)]
        for value in values + ([node] if node not in stored else []):
            key = value.id if isinstance(value, ir.Name) else value  # a let read twice is held once
            found.setdefault(key, tuple(a for a in frame.frame[value] if a and a not in frame.batch))
    return found


def vmem(kernel: ir.Kernel, blocked) -> Vmem:
    """A kernel without products: double-buffered inputs and outputs, and each
    reduction's 32-bit working copy of a block (f32 or i32), with as many running values
    again where they are block-shaped; and each let, as a 32-bit block of its
    dimensions: Mosaic keeps a value that several expressions read (a backward kernel's
    recomputed values and cotangents: bias_gelu's needed 30.5 MiB of scoped VMEM at
    1024 x 1024 blocks on v5e, its blocks 12 MiB)."""
    parts = [
        VmemPart(decl.name, decl.name, 2, DTYPES[decl.dtype].bytes, decl.dims)
        for decl in kernel.inputs + kernel.outputs
    ]
    dims = tuple(dict.fromkeys(d for decl in kernel.inputs + kernel.outputs for d in decl.dims))
    reductions = [node.func for node in _reductions(kernel)]
    parts += [VmemPart(f"{func}'s 32-bit copy of a block", None, 1, 4, dims) for func in reductions]
    parts += [VmemPart(f"let {name}", None, 1, 4, let_dims) for name, let_dims in _let_dims(kernel).items()]
    if any(accumulates_elementwise(kernel, d) for d in blocked):  # block-shaped running values too
        parts += [VmemPart(f"{func}'s running values", None, 1, 4, dims) for func in reductions]
    return Vmem(tuple(parts), VMEM_LIMIT_BYTES)


def _let_dims(kernel: ir.Kernel) -> dict[str, tuple[str, ...]]:
    """Each let's dimensions, in the kernel's order: those of the arrays and lets it reads,
    but those its reductions remove."""
    order = tuple(dict.fromkeys(d for decl in kernel.inputs + kernel.outputs for d in decl.dims))
    known = {decl.name: set(decl.dims) for decl in kernel.inputs + kernel.outputs}

    def dims_of(node: ir.Expr) -> set[str]:
        if isinstance(node, ir.Name):
            return known.get(node.id, set())
        if isinstance(node, ir.Call) and node.func in FUNCTIONS:
            function = FUNCTIONS[node.func]
            # A call with the wrong arguments (`sum(x)`, `max(x, 0)`) is reported elsewhere.
            named = [arg.id if isinstance(arg, ir.Name) else None for arg in node.args]
            if function.typing == "reduce" and len(node.args) == 2:
                return dims_of(node.args[0]) - {named[1]}
            if function.typing in ("index", "size"):
                return set(named[:1]) - {None} if function.typing == "index" else set()
        children = [getattr(node, a) for a in ("operand", "left", "right", "value") if hasattr(node, a)]
        return set().union(*map(dims_of, [*children, *getattr(node, "args", ())]))

    found = {}
    for statement in kernel.body:
        if isinstance(statement, ir.Let):
            known[statement.name] = dims_of(statement.value)
            found[statement.name] = tuple(d for d in order if d in known[statement.name])
    return found


def vmem_bytes(kernel: ir.Kernel, blocks: dict[str, int]) -> int:
    """`vmem`'s total; dimensions taken whole count as 1 (unknown)."""
    return vmem(kernel, blocks).total(blocks)


def vmem_problem(needed: Vmem, blocks: dict[str, int]) -> str | None:
    """Blocks beyond Mosaic's scoped default are fine (the launcher raises its limit);
    beyond what the launcher may ask of the chip they are not."""
    if needed.total(blocks) <= VMEM_LIMIT_BYTES:
        return None
    return (
        f"these blocks need {format_bytes(needed.total(blocks))} of VMEM ({needed.formula(blocks)}), more than the"
        f" {format_bytes(VMEM_LIMIT_BYTES)} a kernel may ask of a TPU v5e's or v6e's"
        f" {format_bytes(VMEM_CAPACITY_BYTES)}; use smaller blocks"
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
