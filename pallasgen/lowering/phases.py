"""Reductions over a blocked reduced dimension as code, one block per step: the carries
of the kernel's sweep (analysis.carries), each step's lines and each result's value."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.carries import Sweep
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.frontend import ir
from pallasgen.lowering.reductions import (
    Accumulator,
    accumulators,
    block_reduction,
    combine_code,
    compute_dtype,
    finish_code,
    identity,
    rows_reduction,
    running_parts,
)


def stepped_sweep(checked: CheckedKernel) -> Sweep | None:
    """The kernel's sweep over a blocked reduced dimension (not a product's), if any."""
    sweep = checked.sweep
    return sweep if sweep is not None and sweep.dim != checked.space.contracted else None


def reduces(checked: CheckedKernel) -> bool:
    """Whether the body reduces over a dimension (other than by a product) or reads
    positions or sizes with index() and size()."""
    calls = [n for n in ir.walk(*(s.value for s in checked.kernel.body)) if isinstance(n, ir.Call)]
    return any(FUNCTIONS[n.func].reducer or n.func in ("index", "size") for n in calls)


def indexed_dims(roots, computed=()) -> set[str]:
    """The dimensions whose positions index() reads in the expressions `roots`, apart
    from those under the nodes in `computed` (whose values come from elsewhere)."""
    elsewhere = set(ir.walk(*computed))
    calls = [n for n in ir.walk(*roots) if isinstance(n, ir.Call) and n.func == "index" and n not in elsewhere]
    return {n.args[0].id for n in calls}


@dataclass(frozen=True)
class SteppedReduction:
    """One reduction over a blocked dimension, as code: its running values, the lines
    each step adds a block with, and its value once the steps are done."""

    node: ir.Call
    result: str  # the variable holding its value after the last step
    accumulators: tuple[Accumulator, ...]
    step: tuple[str, ...]
    finish: str


def stepped_reductions(
    lowered, namer, sweep: Sweep, emitter, start: str, block: str, in_refs: bool, elementwise=False, rows=False
) -> list[SteppedReduction]:
    """The reductions over `sweep.dim`, one block per step from position `start`. The
    running values are scratch Refs (`in_refs`, TPU: `name_ref[...]`) or values a loop
    carries (GPU); `elementwise`: block-shaped, reduced at the last step; `rows`: those
    blocks are one-dimensional, held as rows of 128 lanes (`rt.as_rows`)."""
    checked, sizes, dim = lowered.checked, lowered.sizes, sweep.dim
    axis = checked.space.layout.index(dim)
    suffix = "_ref" if in_refs else ""
    found = []
    for node in sweep.reductions:
        kind, dtype = node.func, emitter.kernel_dtype(node.args[0])
        result = namer.claim(f"{kind}_{dim.lower()}", f"{kind}_over_{dim.lower()}")
        names = [namer.claim(f"{result}_{part}{suffix}") for part in (p or "running" for p in running_parts(kind))]
        accs = accumulators(kind, dtype, names)
        values = [f"{acc.name}[...]" if in_refs else acc.name for acc in accs]
        computed = compute_dtype(kind, dtype)
        block_value = namer.claim(f"{result}_block")
        value = emitter.cast(node.args[0], computed.name)
        ragged = f"{sizes[dim]} % {block}"
        step = (
            f"{block_value} = {_filled(value, start, sizes[dim], axis, identity(kind, dtype), rows, ragged)}",
            f"{', '.join(values)} = {combine_code(kind, values, block_value, axis, computed, start, elementwise)}",
        )
        finals = values
        if elementwise:
            finals = [rows_reduction(kind, values[0]) if rows else block_reduction(kind, values[0], axis)]
        found.append(SteppedReduction(node, result, tuple(accs), step, finish_code(kind, finals, dtype, sizes[dim])))
    return found


def _filled(value: str, start: str, size: str, axis: int, identity: str, rows: bool, ragged: str) -> str:
    """`value` with `identity` at its positions past `size` when the last block is `ragged`."""
    if rows:
        return f"rt.fill_past_rows({value}, {start}, {size}, {identity}, ragged={ragged})"
    return f"rt.fill_past({value}, {start}, {size}, {axis}, {identity}, ragged={ragged})"
