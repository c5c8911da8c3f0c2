"""The functions a spec may call: one record each, read by type inference, the code
emitters and the cost estimate."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import DTYPES


@dataclass(frozen=True)
class Function:
    """A spec function.

    `typing` says how the result's dtype follows from the arguments':
    - "float": a float argument's dtype; an integer argument is converted to f32 first;
    - "same": the argument's dtype;
    - "promote": the arguments' promoted dtype;
    - "where": a bool condition, then the promoted dtype of the two values;
    - "cast": the dtype the function is named after.
    `code` spells it in jax, `{}` standing for the arguments. `transcendental` counts
    it as such in the cost estimate; `narrow_ints_in_i32` computes i8/u8/i16 arguments
    in i32 on TPU, which has no narrow-integer form of it.
    """

    name: str
    arity: int
    typing: str
    code: str
    transcendental: bool = False
    narrow_ints_in_i32: bool = False


def _float(name: str, code: str) -> Function:
    return Function(name, 1, "float", code, transcendental=True)


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        _float("exp", "jnp.exp({})"),
        _float("log", "jnp.log({})"),
        _float("sqrt", "jnp.sqrt({})"),
        _float("rsqrt", "jax.lax.rsqrt({})"),
        _float("tanh", "jnp.tanh({})"),
        _float("sigmoid", "jax.nn.sigmoid({})"),
        _float("gelu", "jax.nn.gelu({}, approximate=True)"),
        _float("silu", "jax.nn.silu({})"),
        _float("sin", "jnp.sin({})"),
        _float("cos", "jnp.cos({})"),
        Function("abs", 1, "same", "jnp.abs({})"),
        Function("relu", 1, "same", "jax.nn.relu({})"),
        Function("floor", 1, "same", "jnp.floor({})"),
        Function("ceil", 1, "same", "jnp.ceil({})"),
        Function("maximum", 2, "promote", "jnp.maximum({})", narrow_ints_in_i32=True),
        Function("minimum", 2, "promote", "jnp.minimum({})", narrow_ints_in_i32=True),
        Function("clip", 3, "promote", "jnp.clip({})", narrow_ints_in_i32=True),
        Function("where", 3, "where", "jnp.where({})"),
        *(Function(name, 1, "cast", "") for name in DTYPES),
    )
}
