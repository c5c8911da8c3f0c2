"""A kernel's iteration space: each dimension parallel, or reduced by the reductions it
carries (a matrix product's contracted dimension is reduced by a `dot`).

Arrays are laid out over the space's `layout` order: every value a kernel computes
has that rank, with size 1 where it lacks a dimension, so values broadcast by
position and a reduction keeps the axis it removes (size 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.frontend import ir


@dataclass(frozen=True)
class Reduction:
    """One reduction over a dimension: `kind` is `dot` for a matrix product, else the
    reducing function's name; `node` is the `@` or the call."""

    kind: str
    node: ir.Expr


@dataclass(frozen=True)
class Dimension:
    name: str
    kept: bool  # some output has it: its grid axis (if blocked) is parallel
    reductions: tuple[Reduction, ...] = ()

    @property
    def reduced(self) -> bool:
        """No output has it: the kernel reduces it away."""
        return not self.kept


@dataclass(frozen=True)
class IterationSpace:
    dims: tuple[Dimension, ...]  # in layout order
    contracted: str | None = None  # a matrix product's K: its operands keep their own layout

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def layout(self) -> tuple[str, ...]:
        """The dimensions arrays other than a product's operands are laid out over."""
        return tuple(d.name for d in self.dims if d.name != self.contracted)

    @property
    def reduced(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims if d.reduced)

    def dim(self, name: str) -> Dimension:
        return next(d for d in self.dims if d.name == name)


def declared_dims(kernel: ir.Kernel) -> set[str]:
    """The dimensions the kernel's arrays declare. The space holds each of them unless
    deriving it failed, with an error already reported: a later check that meets one
    missing from the space stays quiet rather than call it unknown."""
    return {d for decl in kernel.inputs + kernel.outputs for d in decl.dims}
