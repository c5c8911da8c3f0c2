"""What a kernel carries across the steps of a swept dimension: one `Sweep` per kernel
that has one, whatever the kernel.

A kernel's blocked dimension that no output has is *swept*: its blocks are the steps
of one pass, in order, and each `Carry` holds what the kernel computes across them: a
product's accumulator (`dot`), a reduction (its kind's record in the table of
reductions, `analysis.functions.Reducer`, says how it starts, combines and finishes)
or, in fused kernels, the online softmax's running sum (`expsum`), rescaled as its
running max grows. `Sweep.step` is what each step computes, `Sweep.finish` what waits
for the carries' results.

Fused kernels derive theirs in `analysis.fused`; a kernel with one product over input
arrays, or with reductions and no product, carries a product's accumulator over its
blocked contracted dimension or its reductions over its blocked reduced one
(`plain_sweep`). Backends only place the carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pallasgen.analysis.product import Product as PlainProduct
from pallasgen.analysis.space import IterationSpace
from pallasgen.frontend import ir


@dataclass(frozen=True)
class Carry:
    """A value carried across the swept dimension's steps.

    `kind`: a reduction's name (`sum`, `max`, `logsumexp`, ...), `dot` (a product that
    contracts the swept dimension) or `expsum` (sum of exp(value - the running max of
    value), behind logsumexp and softmax). `value` is what is reduced (for `dot`, the
    product node). `scale`: the running max whose growth rescales it; `factors`: values
    that do not vary along the swept dimension, which multiply (`*`) or divide (`/`) each
    term and are applied once, at the end.
    """

    key: tuple
    kind: str
    node: ir.Expr
    value: ir.Expr
    scale: Carry | None = None
    factors: tuple[tuple[str, object], ...] = ()  # (op, ir.Expr or Carry)


@dataclass(frozen=True)
class Skip:
    """Blocks where `condition` is false at every position are skipped: every carry would
    only add its identity there (the `where` gives `otherwise`)."""

    where: ir.Call
    condition: ir.Expr


@dataclass(frozen=True)
class Sweep:
    """One pass over the blocks of `dim`: its carries, what each step computes and what
    the end does; the fields after `finish` only fused kernels fill."""

    dim: str
    carries: tuple[Carry, ...]  # in the order a step updates them (a scale before what it scales)
    results: dict[ir.Expr, Carry] = field(hash=False)  # each reduction or product over `dim`: its carry
    step: tuple[ir.Statement, ...]  # lets each step computes
    finish: tuple[ir.Statement, ...]  # lets and outputs computed once the pass is done
    running: dict[ir.Expr, Carry] = field(default_factory=dict, hash=False)  # max() read in the pass: running max
    unfactored: dict[ir.Expr, ir.Expr] = field(default_factory=dict, hash=False)  # node whose factors wait: its core
    softmaxes: dict[ir.Expr, Carry] = field(default_factory=dict, hash=False)  # softmax() in the pass: its max
    terms: dict[tuple, str] = field(default_factory=dict, hash=False)  # expsum carry's key: its exp(x - max) let
    skip: Skip | None = None

    @property
    def reductions(self) -> tuple[ir.Expr, ...]:
        """The nodes whose values the carries hold at the end: reductions and products."""
        return tuple(self.results)


def plain_sweep(kernel: ir.Kernel, space: IterationSpace, product: PlainProduct | None, blocks) -> Sweep | None:
    """The sweep of a kernel that is not fused: over a product's blocked contracted
    dimension, one `dot` carry and the whole body after it; over a blocked reduced
    dimension, one carry per reduction of it (in source order, none shared), the lets
    that do not need their results each step, and the rest at the end."""
    if product is not None:
        if product.k not in blocks:
            return None
        dot = Carry(("dot", 0), "dot", product.node, product.node)
        return Sweep(product.k, (dot,), {product.node: dot}, (), kernel.body)
    dim = next((d for d in space.dims if d.reduced and d.reductions and d.name in blocks), None)
    if dim is None:
        return None
    carries = tuple(Carry((r.kind, n), r.kind, r.node, r.node.args[0]) for n, r in enumerate(dim.reductions))
    reductions = {c.node for c in carries}
    finals: set[str] = set()
    step, finish = [], []
    for statement in kernel.body:
        nodes = list(ir.walk(statement.value))
        needs_results = any(n in reductions for n in nodes) or any(
            isinstance(n, ir.Name) and n.id in finals for n in nodes
        )
        if isinstance(statement, ir.Let) and not needs_results:
            step.append(statement)
        else:
            finish.append(statement)
            if isinstance(statement, ir.Let):
                finals.add(statement.name)
    return Sweep(dim.name, carries, {c.node: c for c in carries}, tuple(step), tuple(finish))
