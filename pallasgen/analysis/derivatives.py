"""Derivative rules, one per spec function (set in `functions.FUNCTIONS`) and one per
operator (`OPERATOR_DERIVATIVES`), written as builders of IR expressions so that a
backward kernel is an ordinary kernel.

A rule takes a `Builder` (which places every node it makes at the forward node's
position), the call's arguments and its result as expressions, and `g`, the result's
cotangent; it gives each argument's cotangent contribution, or None where that argument
gets none (a constant function, a condition). The contribution is in the result's dtype:
the caller converts it to the argument's dtype where they differ, and sums the
contributions of an argument used more than once. Each rule is JAX's own, so that
gradients agree with `jax.vjp` of the reference at ties and kinks too (tests compare
them point by point).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pallasgen.frontend import ir
from pallasgen.frontend.errors import Position

Expr = ir.Expr
Contributions = tuple[Expr | None, ...]


class Builder:
    """Makes IR expressions at one position: that of the forward node they derive from.

    `bind` names a value that a rule reads more than once (a `let` of the backward
    kernel), so that it is computed once.
    """

    def __init__(self, position: Position, bind: Callable[[Expr], Expr]):
        self.position = position
        self.bind = bind

    def number(self, value: int | float) -> Expr:
        if value < 0:
            return self.neg(self.number(-value))
        return ir.Number(value, repr(value), self.position)

    def neg(self, x: Expr) -> Expr:
        return ir.Unary("-", x, self.position)

    def op(self, left: Expr | int | float, op: str, right: Expr | int | float) -> Expr:
        left, right = (self.number(v) if isinstance(v, (int, float)) else v for v in (left, right))
        return ir.Binary(op, left, right, self.position, self.position)

    def call(self, func: str, *args: Expr | int | float) -> Expr:
        args = tuple(self.number(a) if isinstance(a, (int, float)) else a for a in args)
        return ir.Call(func, args, self.position, self.position)

    def mul(self, *factors: Expr | int | float) -> Expr:
        product = factors[0]
        for factor in factors[1:]:
            product = self.op(product, "*", factor)
        return product

    def where(self, condition: Expr, a: Expr | int | float, b: Expr | int | float) -> Expr:
        return self.call("where", condition, a, b)


Rule = Callable[[Builder, tuple[Expr, ...], Expr, Expr], Contributions]


def _balanced(b: Builder, mine: Expr, other: Expr, result: Expr, g: Expr) -> Expr:
    """The cotangent of one side of `maximum` or `minimum`: all of `g` where this side is
    the result alone, half where both are (a tie), none elsewhere (JAX's _balanced_eq)."""
    return b.where(b.op(mine, "==", result), b.where(b.op(other, "==", result), b.mul(0.5, g), g), 0)


def extremum(b: Builder, args, result, g) -> Contributions:
    """maximum(x, y), minimum(x, y)."""
    x, y = args
    return _balanced(b, x, y, result, g), _balanced(b, y, x, result, g)


def clip(b: Builder, args, result, g) -> Contributions:
    """clip(x, lo, hi), which jnp computes as minimum(hi, maximum(lo, x))."""
    x, lo, hi = args
    low = b.bind(b.call("maximum", lo, x))
    below = b.bind(_balanced(b, low, hi, result, g))
    return _balanced(b, x, lo, low, below), _balanced(b, lo, x, low, below), _balanced(b, hi, low, result, g)


def gelu(b: Builder, args, result, g) -> Contributions:
    """gelu(x) = x c(x), c = 0.5 (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi): its
    derivative is c(x) + 0.5 x (1 - tanh^2) k (1 + 3 * 0.044715 x^2)."""
    (x,) = args
    k = math.sqrt(2 / math.pi)
    t = b.bind(b.call("tanh", b.mul(k, b.op(x, "+", b.mul(0.044715, x, x, x)))))
    cdf = b.mul(0.5, b.op(1, "+", t))
    slope = b.mul(0.5, x, b.op(1, "-", b.mul(t, t)), b.mul(k, b.op(1, "+", b.mul(0.134145, x, x))))
    return (b.mul(g, b.op(cdf, "+", slope)),)


def silu(b: Builder, args, result, g) -> Contributions:
    """silu(x) = x * sigmoid(x)."""
    (x,) = args
    s = b.bind(b.call("sigmoid", x))
    return (b.mul(g, b.mul(s, b.op(1, "+", b.mul(x, b.op(1, "-", s))))),)


def none(b: Builder, args, result, g) -> Contributions:
    """A function whose derivative is zero where it has one (floor, ceil, round), or that
    yields no float (comparisons, casts to integers)."""
    return tuple(None for _ in args)


def unchanged(b: Builder, args, result, g) -> Contributions:
    """A cast between floats: the cotangent converts back (the caller converts it)."""
    return (g,)


def _unary(derivative: Callable[[Builder, Expr, Expr, Expr], Expr]) -> Rule:
    """A rule of one argument from its cotangent's expression in (b, x, result, g)."""
    return lambda b, args, result, g: (derivative(b, args[0], result, g),)


exp = _unary(lambda b, x, y, g: b.mul(g, y))
log = _unary(lambda b, x, y, g: b.op(g, "/", x))
sqrt = _unary(lambda b, x, y, g: b.mul(g, b.op(0.5, "/", y)))
rsqrt = _unary(lambda b, x, y, g: b.mul(g, b.mul(-0.5, b.op(y, "/", x))))
tanh = _unary(lambda b, x, y, g: b.mul(b.op(g, "+", b.mul(g, y)), b.op(1, "-", y)))
sigmoid = _unary(lambda b, x, y, g: b.mul(g, b.mul(y, b.op(1, "-", y))))
sin = _unary(lambda b, x, y, g: b.mul(g, b.call("cos", x)))
cos = _unary(lambda b, x, y, g: b.neg(b.mul(g, b.call("sin", x))))
absolute = _unary(lambda b, x, y, g: b.where(b.op(x, ">=", 0), g, b.neg(g)))  # at 0: g, as JAX has it
relu = _unary(lambda b, x, y, g: b.where(b.op(x, ">", 0), g, 0))  # at 0: none, as jax.nn.relu has it


def where(b: Builder, args, result, g) -> Contributions:
    """where(condition, x, y): the condition gets none."""
    condition, _, _ = args
    return None, b.where(condition, g, 0), b.where(condition, 0, g)


def _power(b: Builder, args, result, g) -> Contributions:
    """x ** y: jnp's integer_pow for an integer literal exponent (x ** 0 gets none), else
    lax.pow's rule (y's log taken of 1 where x is 0)."""
    x, y = args
    if isinstance(y, ir.Number) and isinstance(y.value, int):
        n = y.value
        if n in (0, 1):
            return (None if n == 0 else g), None
        power = x if n == 2 else b.op(x, "**", b.number(n - 1))
        return b.mul(g, b.mul(n, power)), None
    dx = b.mul(g, b.mul(y, b.op(x, "**", b.op(y, "-", 1))))
    dy = b.mul(g, b.mul(b.call("log", b.where(b.op(x, "==", 0), 1, x)), result))
    return dx, dy


# Reductions f(x, DIM) (set beside each `Reducer` in functions.FUNCTIONS): the dimension
# argument gets none. A cotangent `g` lacks DIM and broadcasts over it by name.
def reduced_sum(b: Builder, args, result, g) -> Contributions:
    """sum(x, N): each element gets `g`."""
    return g, None


def reduced_mean(b: Builder, args, result, g) -> Contributions:
    """mean(x, N): each element gets `g / size(N)`."""
    return b.op(g, "/", b.call("size", args[1])), None


def _first_extremum(arg_best: str) -> Rule:
    """max(x, N), min(x, N): the FIRST position of the extremum (as arg_best gives it) takes
    the whole cotangent, the others none. JAX instead splits it evenly among tied
    positions: the two agree wherever the extremum is unique."""

    def rule(b: Builder, args, result, g) -> Contributions:
        x, dim = args
        first = b.bind(b.call(arg_best, x, dim))
        return b.where(b.op(b.call("index", dim), "==", first), g, 0), None

    return rule


reduced_max, reduced_min = _first_extremum("argmax"), _first_extremum("argmin")


def logsumexp(b: Builder, args, result, g) -> Contributions:
    """logsumexp(x, N) = lse: each element gets g * exp(x - lse)."""
    return b.mul(g, b.call("exp", b.op(args[0], "-", result))), None


def softmax(b: Builder, args, result, g) -> Contributions:
    """softmax(x, N) = y: x gets y * (g - sum(g * y, N))."""
    return b.mul(result, b.op(g, "-", b.call("sum", b.mul(g, result), args[1]))), None


# Each operator's rule: unary ones by "-" and "~" with the operand's cotangent; binary
# ones by their symbol. "@" is a matrix product: its rule is not written yet.
OPERATOR_DERIVATIVES: dict[str, Rule | None] = {
    "neg": _unary(lambda b, x, y, g: b.neg(g)),
    "~": none,
    "+": lambda b, args, result, g: (g, g),
    "-": lambda b, args, result, g: (g, b.neg(g)),
    "*": lambda b, args, result, g: (b.mul(g, args[1]), b.mul(g, args[0])),
    "/": lambda b, args, result, g: (
        b.op(g, "/", args[1]),
        b.op(b.mul(b.neg(g), args[0]), "/", b.mul(args[1], args[1])),
    ),
    "//": none,
    "%": lambda b, args, result, g: (g, b.mul(b.neg(g), b.call("floor", b.op(args[0], "/", args[1])))),
    "**": _power,
    **dict.fromkeys(("==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "<<", ">>"), none),
    "@": None,
}


def operator_rule(node: ir.Unary | ir.Binary) -> Rule | None:
    """The rule of an operator node (None: not written yet)."""
    if isinstance(node, ir.Unary):
        return OPERATOR_DERIVATIVES["neg" if node.op == "-" else node.op]
    return OPERATOR_DERIVATIVES[node.op]
