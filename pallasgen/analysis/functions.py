"""The functions a spec may call: one record each, read by type inference, the code
emitters and the cost estimate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pallasgen.analysis import derivatives as d
from pallasgen.analysis.dtypes import DTYPES


@dataclass(frozen=True)
class Running:
    """One value a reduction carries from step to step over a blocked dimension: `part`
    names it beside the others (None for a lone one); its dtype is the one the reduction
    computes in (`wide`), or "i32" (positions); `start` is its value before the first
    step, an identity as `Reducer.identity` names them."""

    part: str | None
    start: str
    dtype: str = "wide"


@dataclass(frozen=True)
class Reducer:
    """A reduction kind, the one table of it: how it types its result, what its masked
    positions hold, and what it carries across the steps of a blocked dimension.

    `result`: "sum" (f32 for floats, i32 for ints and bools), "f32", "same", "i32" or
    "bool"; with "f32" it computes in f32, else in the widest dtype of its argument's
    kind (f32, i32), and a "same" result is narrowed back at the end. `identity`: the
    value that leaves the result unchanged, "zero", "lowest" or "highest" of the dtype
    it reduces in, "false" or "true". `takes`: the argument dtypes it accepts,
    "numbers", "bools", or "any".

    Carried over steps: `running` values start at their identities; a step adds a
    block by `block` (the jnp reduction of a block, kept) merged by `merge` (position
    by position too, so a running value may be block-shaped and reduced once, at the
    end), or by the module's helper `step` where the running values are a pair
    (logsumexp's are two carries of their own: a running max and its exp-sum);
    `finish` reads the result from them (`{0}`, `{1}`: the running values, `{size}`
    the dimension's size). A reduction over a whole block in one step is `whole`, and
    `reference` spells it in plain jax.numpy (`{value}`, `{axis}`: the reduced axis,
    kept; `{wide}`: the dtype it computes in, `{wide_value}` the value in it). `linear`: a sum of its terms, so a
    running max that grows rescales it (the online softmax).
    """

    result: str
    identity: str
    reference: str
    takes: str = "numbers"
    running: tuple[Running, ...] = ()
    block: str | None = None
    merge: str | None = None
    step: str | None = None
    finish: str = "{0}"
    whole: str | None = None
    linear: bool = False


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
    - "index": i32 positions along the dimension named by the argument;
    - "size": the size of the dimension named by the argument, an i32 scalar;
    - "softmax": like "reduce", but the result keeps the dimension.
    `code` spells it in jax, `{}` standing for the arguments. `transcendental` counts
    it as such in the cost estimate; `narrow_ints_in_i32` computes i8/u8/i16 arguments
    in i32 on TPU, which has no narrow-integer form of it, and `in_range` says its
    result always fits its arguments' dtype (nested in another such call it stays i32).
    `fold` computes it in Python, for constants folded as code is generated (None:
    not foldable; a cast's result is converted to its dtype by the caller).
    `derivative` is its rule for backward kernels (analysis.derivatives), a
    reduction's beside its `reducer`.
    """

    name: str
    arity: int
    typing: str
    code: str
    transcendental: bool = False
    narrow_ints_in_i32: bool = False
    in_range: bool = False
    reducer: Reducer | None = None  # a reduction over a named dimension: f(x, DIM)
    fold: Callable | None = None
    derivative: Callable | None = None


def _gelu(x: float) -> float:
    """jax.nn.gelu(x, approximate=True)."""
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _float(name: str, code: str, fold: Callable, derivative: Callable) -> Function:
    return Function(name, 1, "float", code, transcendental=True, fold=fold, derivative=derivative)


def _reduction(name: str, reducer: Reducer, derivative: Callable, transcendental: bool = False) -> Function:
    return Function(name, 2, "reduce", "", transcendental=transcendental, reducer=reducer, derivative=derivative)


_KEPT = "jnp.{}({{value}}, axis={{axis}}, keepdims=True)"
_MAXIMUM, _MINIMUM = "jnp.maximum({}, {})", "jnp.minimum({}, {})"


def _merged(block: str, merge: str, start: str) -> dict:
    """A reduction that carries one value: a block reduced by jnp.`block`, merged by `merge`."""
    return {"running": (Running(None, start),), "block": block, "merge": merge}


def _arg_best(name: str, best: str, start: str, largest: bool) -> Reducer:
    """argmax/argmin: the first position of the best value (ties take the first); over
    steps, the best value so far and its position."""
    return Reducer(
        "i32",
        start,
        f"jnp.{name}({{value}}, axis={{axis}}, keepdims=True).astype(jnp.int32)",
        running=(Running(best, start), Running("index", "zero", dtype="i32")),
        step=f"rt.argbest_step({{0}}, {{1}}, {{value}}, {{start}}, {{axis}}, largest={largest})",
        finish="{1}",
        whole=f"rt.argbest({{value}}, {{axis}}, largest={largest})",
    )


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        _float("exp", "jnp.exp({})", math.exp, d.exp),
        _float("log", "jnp.log({})", math.log, d.log),
        _float("sqrt", "jnp.sqrt({})", math.sqrt, d.sqrt),
        _float("rsqrt", "jax.lax.rsqrt({})", lambda x: 1 / math.sqrt(x), d.rsqrt),
        _float("tanh", "jnp.tanh({})", math.tanh, d.tanh),
        _float("sigmoid", "jax.nn.sigmoid({})", lambda x: 1 / (1 + math.exp(-x)), d.sigmoid),
        _float("gelu", "jax.nn.gelu({}, approximate=True)", _gelu, d.gelu),
        _float("silu", "jax.nn.silu({})", lambda x: x / (1 + math.exp(-x)), d.silu),
        _float("sin", "jnp.sin({})", math.sin, d.sin),
        _float("cos", "jnp.cos({})", math.cos, d.cos),
        Function("abs", 1, "same", "jnp.abs({})", narrow_ints_in_i32=True, fold=abs, derivative=d.absolute),
        Function(
            "relu",
            1,
            "same",
            "jax.nn.relu({})",
            narrow_ints_in_i32=True,
            in_range=True,
            fold=lambda x: max(x, 0),
            derivative=d.relu,
        ),
        Function("floor", 1, "same", "jnp.floor({})", fold=math.floor, derivative=d.none),
        Function("ceil", 1, "same", "jnp.ceil({})", fold=math.ceil, derivative=d.none),
        Function(
            "maximum",
            2,
            "promote",
            "jnp.maximum({})",
            narrow_ints_in_i32=True,
            in_range=True,
            fold=max,
            derivative=d.extremum,
        ),
        Function(
            "minimum",
            2,
            "promote",
            "jnp.minimum({})",
            narrow_ints_in_i32=True,
            in_range=True,
            fold=min,
            derivative=d.extremum,
        ),
        Function(
            "clip",
            3,
            "promote",
            "jnp.clip({})",
            narrow_ints_in_i32=True,
            in_range=True,
            fold=lambda x, lo, hi: min(max(x, lo), hi),
            derivative=d.clip,
        ),
        Function("round", 1, "same", "jnp.round({})", fold=round, derivative=d.none),  # half to even, as jnp.round
        Function(
            "where", 3, "where", "jnp.where({})", fold=lambda condition, a, b: a if condition else b, derivative=d.where
        ),
        Function("index", 1, "index", "", derivative=d.none),
        Function("size", 1, "size", "", derivative=d.none),
        _reduction(
            "sum",
            Reducer(
                "sum",
                "zero",
                "jnp.sum({value}, axis={axis}, keepdims=True, dtype={wide})",
                takes="any",
                **_merged("sum", "{} + {}", "zero"),
                linear=True,
            ),
            d.reduced_sum,
        ),
        _reduction(
            "mean",
            Reducer(
                "f32",
                "zero",
                "jnp.mean({value}, axis={axis}, keepdims=True, dtype={wide})",
                **_merged("sum", "{} + {}", "zero"),
                finish="{0} / {size}",
                linear=True,
            ),
            d.reduced_mean,
        ),
        _reduction(
            "max", Reducer("same", "lowest", _KEPT.format("max"), **_merged("max", _MAXIMUM, "lowest")), d.reduced_max
        ),
        _reduction(
            "min", Reducer("same", "highest", _KEPT.format("min"), **_merged("min", _MINIMUM, "highest")), d.reduced_min
        ),
        _reduction("argmax", _arg_best("argmax", "max", "lowest", largest=True), d.none),
        _reduction("argmin", _arg_best("argmin", "min", "highest", largest=False), d.none),
        _reduction(
            "logsumexp",
            Reducer(
                "f32",
                "lowest",
                "jax.nn.logsumexp({wide_value}, axis={axis}, keepdims=True)",
                running=(Running("max", "lowest"), Running("sum", "zero")),
                finish="rt.logsumexp_finish({0}, {1})",
                whole="rt.logsumexp({value}, {axis})",
            ),
            d.logsumexp,
            transcendental=True,
        ),
        # exp(x - max(x, N)) / sum(exp(x - max(x, N)), N): f32, with the shape of x.
        Function(
            "softmax",
            2,
            "softmax",
            "",
            transcendental=True,
            reducer=Reducer("f32", "lowest", "jax.nn.softmax({wide_value}, axis={axis})"),
            derivative=d.softmax,
        ),
        _reduction(
            "any",
            Reducer(
                "bool",
                "false",
                _KEPT.format("any"),
                takes="bools",
                **_merged("max", _MAXIMUM, "false"),
                finish="{0} > 0",
            ),
            d.none,
        ),
        _reduction(
            "all",
            Reducer(
                "bool", "true", _KEPT.format("all"), takes="bools", **_merged("min", _MINIMUM, "true"), finish="{0} > 0"
            ),
            d.none,
        ),
        *(Function(name, 1, "cast", "", fold=lambda x: x, derivative=d.unchanged) for name in DTYPES),
    )
}
