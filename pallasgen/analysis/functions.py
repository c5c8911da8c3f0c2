"""The functions a spec may call: one record each, read by type inference, the code
emitters and the cost estimate."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.dtypes import DTYPES


@dataclass(frozen=True)
class Reducer:
    """How a reduction types its result and what its masked positions hold.

    `result`: "sum" (f32 for floats, i32 for ints and bools), "f32", "same", "i32" or
    "bool". `identity`: the value that leaves the result unchanged, "zero", "lowest"
    or "highest" of the dtype it reduces in, "false" or "true". `takes`: the argument
    dtypes it accepts, "numbers", "bools", or "any".
    """

    result: str
    identity: str
    takes: str = "numbers"


@dataclass(frozen=True)
class Function:
    """A spec function.

    `typing` says how the result's dtype follows from the arguments':
    - "float": a float argument's dtype; an integer argument is converted to f32 first;
    - "same": the argument's dtype;
    - "promote": the arguments' promoted dtype;
    - "where": a bool condition, then the promoted dtype of the two values;
    - "cast": the dtype the function is named after;
    - "reduce": `reducer` says; the second argument names the dimension removed;
    - "index": i32 positions along the dimension named by the argument.
    `code` spells it in jax, `{}` standing for the arguments. `transcendental` counts
    it as such in the cost estimate; `narrow_ints_in_i32` computes i8/u8/i16 arguments
    in i32 on TPU, which has no narrow-integer form of it, and `in_range` says its
    result always fits its arguments' dtype (nested in another such call it stays i32).
    """

    name: str
    arity: int
    typing: str
    code: str
    transcendental: bool = False
    narrow_ints_in_i32: bool = False
    in_range: bool = False
    reducer: Reducer | None = None  # a reduction over a named dimension: f(x, DIM)


def _float(name: str, code: str) -> Function:
    return Function(name, 1, "float", code, transcendental=True)


def _reduction(name: str, reducer: Reducer, transcendental: bool = False) -> Function:
    return Function(name, 2, "reduce", "", transcendental=transcendental, reducer=reducer)


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
        Function("abs", 1, "same", "jnp.abs({})", narrow_ints_in_i32=True),
        Function("relu", 1, "same", "jax.nn.relu({})", narrow_ints_in_i32=True, in_range=True),
        Function("floor", 1, "same", "jnp.floor({})"),
        Function("ceil", 1, "same", "jnp.ceil({})"),
        Function("maximum", 2, "promote", "jnp.maximum({})", narrow_ints_in_i32=True, in_range=True),
        Function("minimum", 2, "promote", "jnp.minimum({})", narrow_ints_in_i32=True, in_range=True),
        Function("clip", 3, "promote", "jnp.clip({})", narrow_ints_in_i32=True, in_range=True),
        Function("round", 1, "same", "jnp.round({})"),
        Function("where", 3, "where", "jnp.where({})"),
        Function("index", 1, "index", ""),
        _reduction("sum", Reducer("sum", "zero", takes="any")),
        _reduction("mean", Reducer("f32", "zero")),
        _reduction("max", Reducer("same", "lowest")),
        _reduction("min", Reducer("same", "highest")),
        _reduction("argmax", Reducer("i32", "lowest")),
        _reduction("argmin", Reducer("i32", "highest")),
        _reduction("logsumexp", Reducer("f32", "lowest"), transcendental=True),
        _reduction("any", Reducer("bool", "false", takes="bools")),
        _reduction("all", Reducer("bool", "true", takes="bools")),
        *(Function(name, 1, "cast", "") for name in DTYPES),
    )
}
