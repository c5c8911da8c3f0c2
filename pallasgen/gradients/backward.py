"""What a derivation of a kernel's gradient gives (gradients.derive checks it): the
backward kernels as `ir.Kernel`s in call order, the arrays each takes, and the forward
values that the forward pass saves for them (residuals)."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import DTYPES
from pallasgen.frontend import ir

@dataclass(frozen=True)
class Argument:
    """One array a backward kernel takes, by `source`: the forward input `name`
    ("input"), the forward output `name`, which the forward pass saves ("output"), the
    residual `name` ("residual"), the cotangent of the forward output `name`
    ("cotangent"), or the result `name` of an earlier backward kernel ("backward")."""

    name: str
    source: str


@dataclass(frozen=True)
class Step:
    """A backward kernel before its checks. `results` name its outputs, in order: a
    forward input's name stands for that input's cotangent (each input's comes from
    one step), any other name for a value that a later step takes as "backward"."""

    kernel: ir.Kernel
    arguments: tuple[Argument, ...]
    results: tuple[str, ...]


@dataclass(frozen=True)
class Residual:
    """A forward value the forward pass saves for the backward one, under `name`: a
    let (by its `ir.Name`), any subexpression of the forward body, or a value the body
    does not compute (`logsumexp(s, T)` beside `softmax(s, T)`), which then needs its
    `dtype` and `dims`."""

    name: str
    value: ir.Expr
    dtype: str = ""
    dims: tuple[str, ...] = ()


@dataclass(frozen=True)
class Derived:
    steps: tuple[Step, ...]
    residuals: tuple[Residual, ...] = ()
    recomputed: tuple[str, ...] = ()  # the forward values the steps compute again


def is_float(decl: ir.ArrayDecl) -> bool:
    return DTYPES[decl.dtype].is_float
