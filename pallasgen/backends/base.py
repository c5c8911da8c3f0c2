"""The interface every backend implements: its own spec checks and settings, the
public keywords it adds, the names its generated code takes, its plan of a kernel,
and the template that renders that plan; and the `Tiling` every plan carries: how it
cuts the arrays into blocks and walks them, as plain data."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.names import block_keyword
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import tuple_code
from pallasgen.lowering.signature import KeywordGroup


@dataclass(frozen=True)
class GridAxis:
    """One axis of a kernel's grid, in the grid's order."""

    dim: str
    index: str  # its name in index maps: i, j, k for a product's M, N, K, b for a batch
    semantics: str  # "parallel", or "arbitrary": its steps run in order, accumulating over `dim`
    per_element: bool  # one element of `dim` a step: a batch dimension squeezed out of the blocks


@dataclass(frozen=True)
class BlockAxis:
    """One axis of an array's block."""

    dim: str | None  # the array's dimension there; None: size 1 (it broadcasts, or a reduction removed it)
    extent: str  # "block": the dimension's block; "whole": all of it; "one": 1; "squeezed": one element, dropped
    index: str | None  # the grid index that picks the block along it; None: always block 0
    live: str | None = None  # where false, block 0 instead: a skipped step's block, never fetched anew

    @property
    def index_code(self) -> str:
        """The index map's entry for this axis."""
        if self.live:
            return f"jnp.where({self.live}, {self.index}, 0)"
        return self.index or "0"


@dataclass(frozen=True)
class ArrayBlocks:
    name: str  # as the spec names it
    axes: tuple[BlockAxis, ...]


@dataclass(frozen=True)
class Tiling:
    """How a plan cuts a kernel's arrays into blocks and walks them: its grid, BlockSpecs
    and dimension semantics are written from this."""

    grid: tuple[GridAxis, ...]
    arrays: tuple[ArrayBlocks, ...]  # the inputs, then the outputs
    looped: str | None  # a dimension each program loops over itself, in slices of its block (GPU)

    def grid_code(self, sizes: dict[str, str]) -> str:
        return tuple_code(
            [sizes[g.dim] if g.per_element else f"pl.cdiv({sizes[g.dim]}, {block_keyword(g.dim)})" for g in self.grid]
        )

    def block_spec(self, array: ArrayBlocks, sizes: dict[str, str]) -> str:
        """`pl.BlockSpec(shape, index map)` of one array, over the launcher's block and size names."""
        spelled = {"squeezed": lambda d: "None", "one": lambda d: "1", "block": block_keyword, "whole": sizes.get}
        shape = tuple_code([spelled[a.extent](a.dim) for a in array.axes])
        index = tuple_code([a.index_code for a in array.axes])
        return f"pl.BlockSpec({shape}, lambda {', '.join(g.index for g in self.grid)}: {index})"


class Backend(ABC):
    name: str  # "tpu": the key of its settings and plan
    template: str  # renders the plan: the kernel function, then its launcher

    @abstractmethod
    def check(
        self,
        kernel: ir.Kernel,
        space: IterationSpace,
        product: Product | None,
        blocks: dict[str, int],
        earlier: list[Diagnostic],
        fused=None,
    ) -> tuple[object, list[Diagnostic]]:
        """This backend's settings for a kernel (None if it has none), and diagnostics
        for what it cannot do; `earlier` are the diagnostics found so far; `fused`: a
        fused kernel's analysis (analysis.fused), when it is one."""

    @abstractmethod
    def keywords(self, checked: CheckedKernel) -> KeywordGroup:
        """The keywords it adds to the public function, and their docstring lines."""

    @abstractmethod
    def reserved_names(self, checked: CheckedKernel) -> set[str]:
        """Names its generated functions use, which spec names must not take."""

    @abstractmethod
    def function_names(self, kernel: str) -> tuple[str, ...]:
        """The module-level functions it generates for a kernel: its kernel and launcher."""

    @abstractmethod
    def plan(self, lowered: LoweredKernel) -> object:
        """Its plan of a kernel: plain data for its template."""

    @abstractmethod
    def blocks_at(self, plan, sizes: dict[str, int]) -> dict[str, int]:
        """The block of each dimension that `plan.tiling` gives a block ("block" extent), as
        its launcher clamps the default at these sizes."""

    def backward_keywords(self) -> tuple[str, ...]:
        """Keywords of every public function of its that choose how a kernel runs, not
        what it computes: `jax.grad` passes them on to the backward kernels."""
        return ()
