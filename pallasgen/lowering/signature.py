"""A generated kernel's public signature, said once: its parameters, `static_argnames`,
the Keywords of its docstring and the names the generated code must not reuse all come
from here."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import DTYPES
from pallasgen.frontend import ir
from pallasgen.lowering.parts import parameter_list

# The keywords every kernel takes are documented by the runtime: in its docstring, and in
# each kernel's Keywords (rt.keyword_lines); the generator writes only what is particular
# to a kernel.
INTERPRET_DOC: tuple[str, ...] = ()


@dataclass(frozen=True)
class Keyword:
    """A keyword-only parameter of the public function: static under `jax.jit`."""

    name: str
    default: str  # Python source


@dataclass(frozen=True)
class KeywordGroup:
    """Keywords documented together by one line of Args (a backend's blocks, say)."""

    keywords: tuple[Keyword, ...]
    doc: tuple[str, ...]


@dataclass(frozen=True)
class Signature:
    arrays: tuple[str, ...]  # the input arrays' Python names, positional
    groups: tuple[KeywordGroup, ...]  # the backends' keywords, then the params, then interpret

    @property
    def keywords(self) -> tuple[Keyword, ...]:
        return tuple(k for group in self.groups for k in group.keywords)

    @property
    def parameters(self) -> str:
        return parameter_list(list(self.arrays), [f"{k.name}={k.default}" for k in self.keywords])

    @property
    def static_argnames(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keywords)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.static_argnames)

    @property
    def keywords_doc(self) -> tuple[str, ...]:
        return tuple(line for group in self.groups for line in group.doc)


def signature(arrays: list[str], backend_groups: list[KeywordGroup], params: tuple[ir.Param, ...]) -> Signature:
    """The public signature: arrays, each backend's keyword groups, params, `interpret`."""
    # documented by the runtime, from the public function's `params` and defaults (rt.keyword_lines)
    param_group = KeywordGroup(tuple(Keyword(p.name, param_default(p)) for p in params), ())
    interpret = KeywordGroup((Keyword("interpret", "None"),), INTERPRET_DOC)
    return Signature(tuple(arrays), (*backend_groups, param_group, interpret))


def param_default(param: ir.Param) -> str:
    """A param's default as Python source: a float param's is a float even where the spec
    writes a whole number (`= 9999999999`), which as a Python int would overflow int32."""
    dtype = DTYPES.get(param.dtype)
    if dtype is not None and dtype.is_float and isinstance(param.value, int):
        return repr(float(param.value))
    return repr(param.value)
