"""The interface every backend implements: its own spec checks and settings, the
public keywords it adds, the names its generated code takes, its plan of a kernel,
and the template that renders that plan."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.signature import KeywordGroup


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
    ) -> tuple[object, list[Diagnostic]]:
        """This backend's settings for a kernel (None if it has none), and diagnostics
        for what it cannot do; `earlier` are the diagnostics found so far."""

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

    def helper_values(self) -> dict[str, object]:
        """Values the module's shared helpers (helpers.py.j2) take from this backend."""
        return {}
