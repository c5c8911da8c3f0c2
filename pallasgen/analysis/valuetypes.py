"""Value types of spec expressions: a dtype, the named dimensions, and weakness.

Literals and params are *weak*, like Python scalars in JAX: they take the dtype of
the array they meet. Promotion between arrays follows `jnp.promote_types`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import BOOL, F32, I32, DType, promote


@dataclass(frozen=True)
class ValueType:
    dtype: DType
    dims: tuple[str, ...]
    weak: bool = False


def combine(a: ValueType, b: ValueType, dims: tuple[str, ...]) -> ValueType:
    """The type of a binary arithmetic operation, with `dims` already merged."""
    if a.weak and b.weak:
        weak_float = a.dtype.is_float or b.dtype.is_float
        return ValueType(F32 if weak_float else I32, dims, weak=True)
    if a.weak or b.weak:
        weak, strong = (a, b) if a.weak else (b, a)
        if weak.dtype.is_float and not strong.dtype.is_float:
            return ValueType(F32, dims, weak=True)
        if weak.dtype == I32 and strong.dtype == BOOL:
            return ValueType(I32, dims, weak=True)
        return ValueType(strong.dtype, dims)
    return ValueType(promote(a.dtype, b.dtype), dims)


def merge_dims(order: tuple[str, ...], *types: ValueType) -> tuple[str, ...]:
    """The union of the operands' dimensions, in the kernel's dimension order."""
    present = {dim for t in types for dim in t.dims}
    return tuple(dim for dim in order if dim in present)
