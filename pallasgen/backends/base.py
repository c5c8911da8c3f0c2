"""The interface every backend implements: its own spec checks and settings, the
public keywords it adds, the names its generated code takes, its plan of a kernel,
and the template that renders that plan; what tuning, benchmarks and pictures ask of
its blocks (which are keywords, their defaults, the search space of `pallasgen tune`,
the memory they take); and the `Tiling` every plan carries: how it cuts the arrays into
blocks and walks them, as plain data.

Code outside `pallasgen/backends/` reaches a backend only through this interface (and
`pallasgen.backends`' `BACKENDS` and `backend_named`), never through a backend's own
modules (tests/test_layers.py checks)."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.names import block_keyword
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import tuple_code
from pallasgen.lowering.signature import KeywordGroup
from pallasgen.runtime.constants import TARGETS


def frame_grid_names(grid, batch) -> dict[str, str]:
    """Names of a carried-state kernel's grid indices in index maps: a batch dimension's
    own (b, h), i, j, k for the others, then i3, i4, ..."""
    names: dict[str, str] = {}
    roles = itertools.chain("ijk", (f"i{n}" for n in itertools.count(3)))
    for dim in grid:
        wanted = dim.lower() if dim in batch else next(roles)
        while wanted in names.values():
            wanted += "_"
        names[dim] = wanted
    return names


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
    target: str  # what `[tool.pallasgen] targets` calls it (runtime.constants.TARGETS): "triton" for "gpu"
    template: str  # renders the plan: the kernel function, then its launcher
    chip_names: tuple[str, ...] = ()  # the compile-only chips `--chip` names (the TPU's)

    def chip(self, name: str):
        """The chip `--chip NAME` names (its topology, clock and peaks)."""
        raise KeyError(f"{self.name} has no compile-only chips")

    @abstractmethod
    def check(
        self,
        kernel: ir.Kernel,
        space: IterationSpace,
        product: Product | None,
        blocks: dict[str, int],
        earlier: list[Diagnostic],
        checked=None,
    ) -> tuple[object, list[Diagnostic]]:
        """This backend's settings for a kernel (None if it has none), and diagnostics
        for what it cannot do; `earlier` are the diagnostics found so far; `checked`: the
        kernel as checked so far (its tiles, its sweep; no backend's settings yet), once
        it has passed every check before the backends' (None before)."""

    @abstractmethod
    def keywords(self, checked: CheckedKernel, targets: tuple[str, ...] = TARGETS) -> KeywordGroup:
        """The keywords it adds to the public function, and their docstring lines, in a
        module generated for `targets` (a keyword choosing between backends needs both)."""

    @abstractmethod
    def reserved_names(self, checked: CheckedKernel) -> set[str]:
        """Names its generated functions use, which spec names must not take."""

    @abstractmethod
    def function_names(self, kernel: str) -> tuple[str, ...]:
        """The module-level functions it generates for a kernel: its kernel and launcher."""

    @abstractmethod
    def plan(self, lowered: LoweredKernel, targets: tuple[str, ...] = TARGETS) -> object:
        """Its plan of a kernel, in a module generated for `targets`: plain data for its template."""

    def writes_residuals(self, checked: CheckedKernel, targets: tuple[str, ...] = TARGETS) -> bool:
        """Whether it plans a kernel that saves residuals for jax.grad as the kernel that
        writes them too when asked (gradients.derive.launched); where not, as the kernel
        alone, whose launcher takes no `residuals`: under jax.grad another backend's runs."""
        return True

    @abstractmethod
    def blocks_at(self, plan, sizes: dict[str, int]) -> dict[str, int]:
        """The block of each dimension that `plan.tiling` gives a block ("block" extent), as
        its launcher clamps the default at these sizes."""

    def backward_keywords(self, targets: tuple[str, ...] = TARGETS) -> tuple[str, ...]:
        """Keywords of every public function of its that choose how a kernel runs, not
        what it computes: `jax.grad` passes them on to the backward kernels (of those
        `keywords` adds in a module generated for `targets`)."""
        return ()

    # What tuning, benchmarks and pictures ask of its blocks. A search's choices are
    # named: each sets a block ("block", dimension) or an option ("option", name), as a
    # tuning file's entry keeps them (`TunedBlocks.blocks`, `.options`).

    def block_keyword(self, dim: str) -> str:
        """The public keyword that sets the block of `dim` on this backend."""
        return block_keyword(dim)

    def tunable_dims(self, checked: CheckedKernel) -> list[str]:
        """The dimensions whose blocks are public keywords (`block_keyword`): those a call,
        and `pallasgen tune`, may choose."""
        return []

    def default_blocks(self, checked: CheckedKernel) -> dict[str, int]:
        """The block of each dimension it blocks (of `tunable_dims`, and 1 of a batch
        dimension stepped one element at a time) that a call passing none takes where the
        device does not choose otherwise (a TPU chip's default, a tuned entry)."""
        return {}

    def default_options(self, checked: CheckedKernel) -> dict[str, int]:
        """The options (pipeline stages, warps) a call passing none takes, by name."""
        return {}

    def tuned_blocks_problem(self, checked: CheckedKernel, tuned: TunedBlocks) -> str | None:
        """Why a tuning file's entry for this backend does not fit the kernel, or None."""
        return f"blocks tuned for {self.name}, which takes none"

    def tuning_choices(self, checked: CheckedKernel) -> dict[str, tuple[str, str]]:
        """Each choice `pallasgen tune` makes, by its name in the search, with what it
        sets: ("block", dimension) or ("option", name)."""
        return {}

    def tuning_space(self, checked: CheckedKernel, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        """The values of each of `tuning_choices` that a search at `sizes` tries, in order."""
        return {}

    def tuning_problem(self, checked: CheckedKernel, chosen: dict[str, int]) -> str | None:
        """Why a set of choices (by `tuning_choices` name) cannot run, beyond each value
        being one of `tuning_space`'s (it overflows memory), or None: a search skips it."""
        return None

    def tuned_parts(
        self, checked: CheckedKernel, chosen: dict[str, int]
    ) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
        """A search's choices as a tuning entry keeps them: (blocks by dimension, options by name)."""
        parts = {"block": [], "option": []}
        for name, (kind, what) in self.tuning_choices(checked).items():
            parts[kind].append((what, chosen[name]))
        return tuple(parts["block"]), tuple(parts["option"])

    def tuning_start(
        self, checked: CheckedKernel, space: dict[str, tuple[int, ...]], previous: TunedBlocks | None = None
    ) -> dict[str, int]:
        """Where a search over `space` starts: the choices of `previous` (an entry tuned
        before) where it fits the kernel, else the defaults, each the nearest value tried."""
        if previous is not None and not self.tuned_blocks_problem(checked, previous):
            values = {"block": dict(previous.blocks), "option": dict(previous.options)}
        else:
            values = {"block": self.default_blocks(checked), "option": self.default_options(checked)}
        wanted = {name: values[kind][what] for name, (kind, what) in self.tuning_choices(checked).items()}
        return {name: min(space[name], key=lambda v: abs(v - value)) for name, value in wanted.items()}

    def block_problem(self, checked: CheckedKernel, dim: str, block: int) -> str | None:
        """Why blocking `dim` by `block` breaks this backend's rule for this kernel (the
        TPU's tiling rule), or None."""
        return None

    # The memory a program's blocks take: the TPU's VMEM, Mosaic GPU's shared memory.
    memory_budget: int | None = None  # what blocks may take without asking for more; None: not counted

    def memory_bytes(self, checked: CheckedKernel, blocks: dict[str, int]) -> int | None:
        """The memory that a program with these blocks (over the defaults) holds; None: not counted."""
        return None

    def build_warnings(self, checked: CheckedKernel) -> list[str]:
        """What `pallasgen build` warns of in a kernel on this backend, a message each: its
        default blocks cannot fit the memory a program may take at realistic sizes."""
        return []
