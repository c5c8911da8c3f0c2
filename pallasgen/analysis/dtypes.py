"""Spec dtypes and JAX's type promotion between them, without importing jax."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # as written in specs: f32
    jnp: str  # as jax.numpy names it: float32
    kind: str  # "b" bool, "u" unsigned, "i" signed, "f" float
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_integer(self) -> bool:
        return self.kind in "ui"

    @property
    def bytes(self) -> int:
        return max(1, self.bits // 8)

    def int_range(self) -> tuple[int, int]:
        if self.kind == "u":
            return 0, 2**self.bits - 1
        return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1


DTYPES = {
    d.name: d
    for d in (
        DType("f32", "float32", "f", 32),
        DType("bf16", "bfloat16", "f", 16),
        DType("f16", "float16", "f", 16),
        DType("i32", "int32", "i", 32),
        DType("i16", "int16", "i", 16),
        DType("i8", "int8", "i", 8),
        DType("u8", "uint8", "u", 8),
        DType("bool", "bool", "b", 8),
    )
}
BOOL = DTYPES["bool"]
F32 = DTYPES["f32"]
I32 = DTYPES["i32"]

def tpu_dtype(name: str) -> str:
    """The dtype a TPU kernel computes a spec dtype in: f16 as f32 (TPUs have no f16 vectors)."""
    return "f32" if name == "f16" else name


FLOAT_MAX = {"f32": 3.4028234663852886e38, "bf16": 3.3895313892515355e38, "f16": 65504.0}


def promote(a: DType, b: DType) -> DType:
    """The dtype JAX gives a binary operation on two strongly typed arrays."""
    if a == b:
        return a
    if a.kind == "b" or b.kind == "b":
        return b if a.kind == "b" else a
    if a.is_float and b.is_float:
        return a if a.bits > b.bits else b if b.bits > a.bits else F32
    if a.is_float or b.is_float:
        return a if a.is_float else b
    if a.kind == b.kind:
        return a if a.bits > b.bits else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.bits > unsigned.bits:
        return signed
    return DTYPES["i16"] if unsigned.bits == 8 else I32
