"""Reductions and positions as code, in the reference and in kernels.

Every value has the rank of the kernel's layout (IterationSpace.layout) in the
reference, and of its tile (analysis.fused) in kernels, so a reduction keeps the axis
it removes (size 1) and its result broadcasts by position.

In the reference they are plain jax.numpy. In kernels they compute in f32 (floats)
or i32 (integers and bools), which Mosaic and Triton both reduce, and use the
runtime's functions for argmax/argmin (first index on ties) and logsumexp. A reduced
dimension that is blocked is reduced step by step into accumulators: `Accumulator`s,
combined by `combine_code` and read back by `finish_code`. What each kind does is read
from its record in the one table of reductions (`analysis.functions.Reducer`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import DTYPES, DType
from pallasgen.analysis.functions import FUNCTIONS, Reducer
from pallasgen.frontend import ir
from pallasgen.lowering.parts import tuple_code

F32, I32 = "jnp.float32", "jnp.int32"
# Identities as code, by the dtype a kernel reduces in.
IDENTITY = {
    ("zero", F32): "0.0",
    ("zero", I32): "0",
    ("lowest", F32): "-jnp.inf",
    ("lowest", I32): "-2147483648",
    ("highest", F32): "jnp.inf",
    ("highest", I32): "2147483647",
    ("false", I32): "0",
    ("true", I32): "1",
}


def compute_dtype(kind: str, dtype: DType) -> DType:
    """The dtype a kernel reduces values of `dtype` in: f32 for floats and for reductions
    with an f32 result (mean, logsumexp); i32 for integers and bools."""
    return DTYPES["f32"] if _reducer(kind).result == "f32" or dtype.is_float else DTYPES["i32"]


def _reducer(kind: str) -> Reducer:
    return FUNCTIONS[kind].reducer


def _computed(kind: str, dtype: DType) -> str:
    return F32 if compute_dtype(kind, dtype).is_float else I32


def identity(kind: str, dtype: DType) -> str:
    """The value masked positions hold for this reduction, as code."""
    return IDENTITY[(_reducer(kind).identity, _computed(kind, dtype))]


def reference_reduction(kind: str, value: str, axis: int, dtype: DType) -> str:
    """`kind` of `value` (code, of `dtype`) over `axis`, kept, in plain jax.numpy."""
    wide = _computed(kind, dtype)
    return _reducer(kind).reference.format(value=value, axis=axis, wide=wide, wide_value=_as(value, dtype, wide))


def kernel_reduction(kind: str, value: str, axis: int, dtype: DType, size: str, padded: bool = False) -> str:
    """`kind` over a whole `axis` inside a kernel; `size` is the dimension's true size,
    and a `padded` block holds more positions than that (filled with the identity)."""
    computed = _as(value, dtype, _computed(kind, dtype))
    if padded:
        computed = f"rt.fill_past({computed}, 0, {size}, {axis}, {identity(kind, dtype)})"
    reducer = _reducer(kind)
    if reducer.merge:
        return finish_code(kind, [block_reduction(kind, computed, axis)], dtype, size)
    return reducer.whole.format(value=computed, axis=axis)


def kernel_softmax(value: str, axis: int, dtype: DType, size: str, padded: bool = False) -> str:
    """softmax over a whole `axis` inside a kernel, in f32 (`rt.softmax`); a `padded` block's
    positions past `size` are -inf first, so they take no share."""
    computed = _as(value, dtype, F32)
    if padded:
        computed = f"rt.fill_past({computed}, 0, {size}, {axis}, -jnp.inf)"
    return f"rt.softmax({computed}, {axis})"


def reference_positions(axis: int, rank: int, size: str) -> str:
    """`index(DIM)` in the reference: 0 to size-1 along `axis`, size 1 elsewhere."""
    shape = tuple_code([size if a == axis else "1" for a in range(rank)])
    return f"jax.lax.broadcasted_iota({I32}, {shape}, {axis})"


def kernel_positions(axis: int, rank: int, extent: str, start: str | None) -> str:
    """`index(DIM)` in a kernel: the block's `extent` positions from `start` (None: 0)."""
    iota = reference_positions(axis, rank, extent)
    return f"{start} + {iota}" if start else iota


def merges(kind: str) -> bool:
    """Whether the reduction carries one running value, merged position by position (so
    its running value may be block-shaped and reduced once, at the last step)."""
    return _reducer(kind).merge is not None


def block_reduction(kind: str, value: str, axis: int) -> str:
    """`value` (computed wide) reduced over `axis`, kept, for a reduction that `merges`."""
    return f"jnp.{_reducer(kind).block}({value}, axis={axis}, keepdims=True)"


def rows_reduction(kind: str, value: str) -> str:
    """Block-shaped running values held as rows (`rt.as_rows`) reduced to one position, for a
    reduction that `merges`."""
    return f"jnp.{_reducer(kind).block}({value}, keepdims=True).reshape(1)"


def running_parts(kind: str) -> tuple[str | None, ...]:
    """What each running value of a reduction is called beside the others (None: a lone one)."""
    return tuple(r.part for r in _reducer(kind).running)


@dataclass(frozen=True)
class Accumulator:
    name: str  # a scratch Ref (TPU) or a loop-carried value (GPU)
    dtype: str  # jnp.float32
    initial: str  # its identity, as code


def accumulators(kind: str, dtype: DType, names: list[str]) -> list[Accumulator]:
    """The running values of a reduction over steps, one per name."""
    found = []
    for name, running in zip(names, _reducer(kind).running):
        computed = _computed(kind, dtype) if running.dtype == "wide" else I32
        found.append(Accumulator(name, computed, IDENTITY[(running.start, computed)]))
    return found


def combine_code(
    kind: str, running: list[str], value: str, axis: int, dtype: DType, start: str, elementwise: bool = False
) -> str:
    """The running values after one more block `value` (`start`: its first position);
    `elementwise`: block-shaped running values, merged position by position."""
    computed = _as(value, dtype, _computed(kind, dtype))
    reducer = _reducer(kind)
    if reducer.merge:
        block = computed if elementwise else block_reduction(kind, computed, axis)
        return reducer.merge.format(running[0], block)
    return reducer.step.format(*running, value=computed, start=start, axis=axis)


def finish_code(kind: str, running: list[str], dtype: DType, size: str) -> str:
    """The reduction's value from its running values after the last step."""
    reducer = _reducer(kind)
    value = reducer.finish.format(*running, size=size)
    return _narrowed(value, dtype) if reducer.result == "same" else value


def reduced_dim(node: ir.Call) -> str:
    return node.args[1].id


def _as(value: str, dtype: DType, target: str) -> str:
    """`value` converted to `target` (jnp.float32 or jnp.int32) unless already of it."""
    if (target == F32 and dtype.name == "f32") or (target == I32 and dtype.name == "i32"):
        return value
    return f"{value}.astype({target})"


def _narrowed(code: str, dtype: DType) -> str:
    """A max or min computed wide, back in the reduced values' dtype."""
    if dtype.name in ("f32", "i32"):
        return code
    return f"{code}.astype(jnp.{dtype.jnp if dtype.name != 'bool' else 'bool_'})"


class ReferenceSpelling:
    """Reductions and positions in the plain jax.numpy reference."""

    def __init__(self, layout: tuple[str, ...], sizes: dict[str, str]):
        self.layout, self.sizes = layout, sizes

    def reduction(self, node: ir.Call, value: str, dtype: DType) -> str:
        return reference_reduction(node.func, value, self.layout.index(reduced_dim(node)), dtype)

    def positions(self, dim: str) -> str:
        return reference_positions(self.layout.index(dim), len(self.layout), self.sizes[dim])

    def softmax(self, node: ir.Call, value: str, dtype: DType) -> str:
        return f"jax.nn.softmax({_as(value, dtype, F32)}, axis={self.layout.index(reduced_dim(node))})"

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"
