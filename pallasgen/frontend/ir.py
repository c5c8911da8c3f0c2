"""The typed IR of a spec: frozen dataclasses that keep every source position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Union

from pallasgen.frontend.errors import Position


@dataclass(frozen=True)
class Name:
    id: str
    position: Position


@dataclass(frozen=True)
class Number:
    value: int | float
    text: str
    position: Position


@dataclass(frozen=True)
class Boolean:
    value: bool
    position: Position


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Expr
    position: Position


@dataclass(frozen=True)
class Binary:
    op: str
    left: Expr
    right: Expr
    position: Position
    op_position: Position


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    position: Position
    func_position: Position


@dataclass(frozen=True)
class Attribute:
    value: Expr
    attr: str
    position: Position
    attr_position: Position


Expr = Union[Name, Number, Boolean, Unary, Binary, Call, Attribute]


def walk(*roots: Expr) -> Iterator[Expr]:
    """Every node under the roots, each before its children, left to right (no recursion)."""
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        yield node
        children = [getattr(node, a) for a in ("operand", "left", "right", "value") if hasattr(node, a)]
        stack.extend(reversed([*children, *getattr(node, "args", ())]))


@dataclass(frozen=True)
class ArrayDecl:
    """An `in` or `out` array: `x: f32[M, N]`."""

    name: str
    dtype: str
    dims: tuple[str, ...]
    position: Position
    dtype_position: Position
    dim_positions: tuple[Position, ...]


@dataclass(frozen=True)
class Param:
    """`param NAME: DTYPE = NUMBER`, a static scalar keyword argument."""

    name: str
    dtype: str
    value: int | float
    text: str
    position: Position
    dtype_position: Position
    value_position: Position


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr
    position: Position


@dataclass(frozen=True)
class Assign:
    target: str
    value: Expr
    position: Position


Statement = Union[Let, Assign]


@dataclass(frozen=True)
class BlockSize:
    """One `DIM = SIZE` item of a `block` statement."""

    dim: str
    size: int | float
    position: Position
    size_position: Position


@dataclass(frozen=True)
class GpuOption:
    """One `NAME = VALUE` item of a `gpu` statement: `gpu warps = 8, stages = 3`."""

    name: str
    value: int | float
    position: Position
    value_position: Position


@dataclass(frozen=True)
class Accumulate:
    dtype: str
    position: Position


@dataclass(frozen=True)
class GradNone:
    """`grad none`: the kernel is never differentiated, so it gets no backward kernel."""

    position: Position


@dataclass(frozen=True)
class Kernel:
    name: str
    position: Position
    doc: tuple[str, ...]
    inputs: tuple[ArrayDecl, ...]
    outputs: tuple[ArrayDecl, ...]
    params: tuple[Param, ...]
    body: tuple[Statement, ...]
    blocks: tuple[BlockSize, ...]
    accumulates: tuple[Accumulate, ...]
    gpu_blocks: tuple[BlockSize, ...]
    gpu_options: tuple[GpuOption, ...]
    grad_none: tuple[GradNone, ...] = ()


@dataclass(frozen=True)
class Spec:
    kernels: tuple[Kernel, ...]
