"""A kernel body split around a reduced dimension that is blocked: what each step
computes, and what only the last step can (it needs the reductions' results)."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES, DType
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.frontend import ir


@dataclass(frozen=True)
class Phases:
    dim: str  # the blocked reduced dimension
    reductions: tuple[ir.Call, ...]  # over `dim`, in source order
    each_step: tuple[ir.Statement, ...]  # lets that do not need the reductions' results
    last_step: tuple[ir.Statement, ...]  # lets that do, and every output


def stepped_dim(checked: CheckedKernel) -> str | None:
    """The reduced dimension (other than a product's) that is blocked, if any."""
    return next(
        (d.name for d in checked.space.dims if d.reduced and d.reductions and d.name != checked.space.contracted
         and d.name in checked.blocks),
        None,
    )


def split_phases(checked: CheckedKernel, dim: str) -> Phases:
    reductions = tuple(r.node for r in checked.space.dim(dim).reductions)
    finals: set[str] = set()
    each_step, last_step = [], []
    for statement in checked.kernel.body:
        nodes = list(ir.walk(statement.value))
        needs_results = any(n in reductions for n in nodes) or any(
            isinstance(n, ir.Name) and n.id in finals for n in nodes
        )
        if isinstance(statement, ir.Let) and not needs_results:
            each_step.append(statement)
        else:
            last_step.append(statement)
            if isinstance(statement, ir.Let):
                finals.add(statement.name)
    return Phases(dim, reductions, tuple(each_step), tuple(last_step))


def compute_dtype(kind: str, dtype: DType) -> DType:
    """The dtype a kernel reduces in: f32 for floats, mean and logsumexp; else i32."""
    return DTYPES["f32"] if kind in ("mean", "logsumexp") or dtype.is_float else DTYPES["i32"]


def reduces(checked: CheckedKernel) -> bool:
    """Whether the body reduces over a dimension (other than by a product) or reads
    positions with index()."""
    calls = [n for n in ir.walk(*(s.value for s in checked.kernel.body)) if isinstance(n, ir.Call)]
    return any(FUNCTIONS[n.func].reducer or n.func == "index" for n in calls)
