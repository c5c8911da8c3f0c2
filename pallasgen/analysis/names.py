"""Python names for what a spec names: user names never collide with generated ones."""

from __future__ import annotations

import keyword

from pallasgen.runtime.constants import (
    block_keyword,
)  # noqa: F401 (written there: the runtime's errors name blocks too)

# Names the generated module itself defines or imports at module level (`rt`: pallasgen's
# runtime, pallasgen/runtime/support.py).
MODULE_NAMES = frozenset(
    {"functools", "jax", "jnp", "np", "pl", "pltpu", "pltriton", "plgpu", "math", "warnings", "rt"}
)
# Names the generated wrapper functions use for their own keywords and locals.
WRAPPER_NAMES = frozenset({"interpret", "grid", "sizes", "kernel"})
# Builtins the generated code calls (templates/*.j2); a spec name must never shadow one.
BUILTINS_USED = frozenset({"min", "max", "sum", "len", "zip", "ValueError", "TypeError"})
# Functions the TPU kernel template defines inside a kernel.
KERNEL_NAMES = frozenset({"_zero", "_epilogue", "_init", "_step", "_finish"})
RESERVED = MODULE_NAMES | WRAPPER_NAMES | KERNEL_NAMES | BUILTINS_USED | frozenset(keyword.kwlist)


class Namer:
    """Hands out Python identifiers, unique within one scope, avoiding `taken`.

    The spec's own names (`claim_spec`) keep their spelling wherever it is free: a public
    argument reads as the spec wrote it, and only a name that truly collides (`pl`, a
    keyword, a generated function's name) is marked with a trailing `_`. The generator's
    own names (`claim`) yield to them: where the wanted name is taken they take an
    alternative that says their role (`size_s` beside a spec's `s`), else a number
    (`acc_s_2`), never a trailing `_`.
    """

    def __init__(self, taken=()):
        self._taken = set(RESERVED) | set(taken)

    def claim(self, wanted: str, *alternatives: str) -> str:
        """A generated name: `wanted`, else the first of `alternatives` that is free, else
        `wanted` numbered from 2."""
        number = 1
        name = next((n for n in (wanted, *alternatives) if n not in self._taken), None)
        while name is None or name in self._taken:
            number += 1
            name = f"{wanted}_{number}"
        self._taken.add(name)
        return name

    def claim_spec(self, wanted: str) -> str:
        """A name the spec wrote (or a derived kernel's, named as a spec would): as spelled,
        else with `_` appended until it is free."""
        name = wanted
        while name in self._taken:
            name += "_"
        self._taken.add(name)
        return name

    @property
    def taken(self) -> frozenset[str]:
        """Every name taken so far."""
        return frozenset(self._taken)

    def fork(self) -> Namer:
        """A namer for another function: it avoids every name taken so far, independently."""
        return Namer(self._taken)
