"""What a kernel carries across the steps of a swept dimension: one `Sweep` per kernel
that has one, whatever the kernel.

A kernel's blocked dimension that no output has is *swept*: its blocks are the steps
of one pass, in order, and each `Carry` holds what the kernel computes across them: a
product's accumulator (`dot`), a reduction (its kind's record in the table of
reductions, `analysis.functions.Reducer`, says how it starts, combines and finishes)
or, where a value uses a running max as `exp(x - max(x, T))`, a running sum of it
(`expsum`) rescaled as the max grows (the online softmax of FlashAttention).
`Sweep.step` is what each step computes, `Sweep.finish` what waits for the carries'
results.

Every kernel's sweep comes from one walk of its body (`sweep_over`): a single product's
accumulator, a reducing kernel's running values, a fused kernel's several carries
alike; what cannot be swept in one pass is a spec error at the line that needs it.
Backends only place the carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.infer import product_operand
from pallasgen.analysis.valuetypes import ValueType
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic


@dataclass(frozen=True)
class Carry:
    """A value carried across the swept dimension's steps.

    `kind`: a reduction's name (`sum`, `max`, `logsumexp`, ...), `dot` (a product that
    contracts the swept dimension) or `expsum` (sum of exp(value - the running max of
    value), behind logsumexp and softmax). `value` is what is reduced (for `dot`, the
    product node). `scale`: the running max whose growth rescales it; `factors`: values
    that do not vary along the swept dimension, which multiply (`*`) or divide (`/`) each
    term and are applied once, at the end.
    """

    key: tuple
    kind: str
    node: ir.Expr
    value: ir.Expr
    scale: Carry | None = None
    factors: tuple[tuple[str, object], ...] = ()  # (op, ir.Expr or Carry)


@dataclass(frozen=True)
class Skip:
    """Blocks where `condition` is false at every position are skipped: every carry would
    only add its identity there (the `where` gives `otherwise`)."""

    where: ir.Call
    condition: ir.Expr


@dataclass(frozen=True)
class Sweep:
    """One pass over the blocks of `dim`: its carries, what each step computes and what
    the end does."""

    dim: str
    carries: tuple[Carry, ...]  # in the order a step updates them (a scale before what it scales)
    results: dict[ir.Expr, Carry] = field(hash=False)  # each reduction or product over `dim`: its carry
    step: tuple[ir.Statement, ...]  # lets each step computes
    finish: tuple[ir.Statement, ...]  # lets and outputs computed once the pass is done
    running: dict[ir.Expr, Carry] = field(default_factory=dict, hash=False)  # max() read in the pass: running max
    unfactored: dict[ir.Expr, ir.Expr] = field(default_factory=dict, hash=False)  # node whose factors wait: its core
    softmaxes: dict[ir.Expr, Carry] = field(default_factory=dict, hash=False)  # softmax() in the pass: its max
    terms: dict[tuple, str] = field(default_factory=dict, hash=False)  # expsum carry's key: its exp(x - max) let
    skip: Skip | None = None

    @property
    def reductions(self) -> tuple[ir.Expr, ...]:
        """The nodes whose values the carries hold at the end: reductions and products."""
        return tuple(self.results)


# The float value of a reduction's identity (`Reducer.identity`), where it has one.
IDENTITY_VALUES = {"zero": 0.0, "lowest": float("-inf"), "highest": float("inf")}


class ValueProblem(Exception):
    """A value that the kernel cannot compute as analyzed, with its diagnostic."""

    def __init__(self, node: ir.Expr, message: str):
        super().__init__(message)
        self.diagnostic = Diagnostic(node.position, message)


def sweep_over(kernel: ir.Kernel, types: dict[ir.Expr, ValueType], dim: str) -> tuple[Sweep | None, list[Diagnostic]]:
    """The pass over the blocks of `dim`: what each step carries (a product's accumulator,
    a reduction's running values, an online softmax), or the diagnostic saying why it
    cannot be swept in one pass."""
    try:
        return _Sweeper(kernel, types, dim).sweep(), []
    except ValueProblem as problem:
        return None, [problem.diagnostic]


def values_read(node: ir.Expr) -> list[ir.Expr]:
    """The values an expression reads (a call's dimension arguments are not values)."""
    if isinstance(node, ir.Call):
        typing = FUNCTIONS[node.func].typing
        return (
            [node.args[0]]
            if typing in ("reduce", "softmax")
            else [] if typing in ("index", "size") else list(node.args)
        )
    if isinstance(node, ir.Binary) and node.op == "@":
        return [product_operand(side)[0] for side in (node.left, node.right)]
    if isinstance(node, ir.Unary):
        return [node.operand]
    if isinstance(node, ir.Binary):
        return [node.left, node.right]
    return []


def _reduced(node: ir.Expr, dim: str) -> bool:
    return (
        isinstance(node, ir.Call)
        and FUNCTIONS[node.func].typing == "reduce"
        and isinstance(node.args[1], ir.Name)
        and node.args[1].id == dim
    )


@dataclass(frozen=True)
class _Info:
    """What a value is in the pass over the swept dimension.

    `phase`: "pre" (does not vary along it and reads no carry), "stream" (varies along
    it) or "post" (reads a carry: known once the pass is done). A stream value may be
    `scale`d by a running max (exp(x - max(x, T)) and what is linear in it), and carry
    `factors` that do not vary along the dimension, applied at the end.
    """

    phase: str
    scale: Carry | None = None
    factors: tuple[tuple[str, object], ...] = ()

    @property
    def plain(self) -> bool:
        return self.scale is None and not self.factors


class _Sweeper:
    """Walks the body once, deciding each value's phase and the carries."""

    def __init__(self, kernel, types, dim):
        self.kernel, self.types, self.dim = kernel, types, dim
        self.inputs = {d.name: d.dims for d in kernel.inputs}
        self.lets = {named(s): s.value for s in kernel.body}  # an output a statement reads: its value
        self.params = {p.name for p in kernel.params}
        self.carries: dict[tuple, Carry] = {}
        self.results: dict[ir.Expr, Carry] = {}
        self.running: dict[ir.Expr, Carry] = {}
        self.unfactored: dict[ir.Expr, ir.Expr] = {}
        self.softmaxes: dict[ir.Expr, Carry] = {}
        self.infos: dict[ir.Expr, _Info] = {}
        self.let_infos: dict[str, _Info] = {}

    def sweep(self) -> Sweep:
        for statement in self.kernel.body:
            self.let_infos[named(statement)] = self.info(statement.value)
        finish = [s for s in self.kernel.body if isinstance(s, ir.Assign) or self.let_infos[s.name].phase == "post"]
        in_step = self._names_read([c.value for c in self.carries.values()])
        in_finish = self._names_read([s.value for s in finish], skip=self.results) | {
            s.name for s in finish if isinstance(s, ir.Let)
        }
        # Each step computes the lets its carries read, and an output they read as a let
        # of its name (stored once the pass is done).
        lets = [s if isinstance(s, ir.Let) else ir.Let(s.target, s.value, s.position) for s in self.kernel.body]
        step = tuple(s for s in lets if s.name in in_step and self.let_infos[s.name].phase != "post")
        stepped = {s.name for s in step}
        return Sweep(
            self.dim,
            tuple(self.carries.values()),
            self.results,
            step=step,
            finish=tuple(s for s in self.kernel.body if s in finish or (isinstance(s, ir.Let) and s.name in in_finish)),
            running=self.running,
            unfactored=self.unfactored,
            softmaxes=self.softmaxes,
            terms={key: name for key, name in self._terms().items() if name in stepped},  # else computed apart
            skip=self._skip(),
        )

    def _terms(self) -> dict[tuple, str]:
        """Lets that hold exp(x - max(x, T)) for an expsum carry of x: its terms, computed once."""
        found = {}
        for name, value in self.lets.items():
            shifted = self._shifted_value(value)
            key = ("expsum", value_key(shifted, self.lets)) if shifted is not None else None
            if key in self.carries and key not in found:
                found[key] = name
        return found

    def _names_read(self, roots, skip=()) -> set[str]:
        """Lets the roots read, through lets too; not under the nodes in `skip`."""
        names, stack = set(), list(roots)
        while stack:
            node = stack.pop()
            for sub in walk_outside(node, skip):
                if isinstance(sub, ir.Name) and sub.id in self.lets and sub.id not in names:
                    names.add(sub.id)
                    stack.append(self.lets[sub.id])
        return names

    # -- phases ------------------------------------------------------------------------

    def info(self, node: ir.Expr) -> _Info:
        if node not in self.infos:
            self.infos[node] = self._info(node)
        return self.infos[node]

    def _dims(self, node) -> tuple[str, ...]:
        """A value's dimensions (an input a product reads whole may be left untyped)."""
        return self.types[node].dims if node in self.types else self.inputs[node.id]

    def _has_dim(self, node) -> bool:
        return self.dim in self._dims(node)

    def _info(self, node: ir.Expr) -> _Info:
        if isinstance(node, ir.Name):
            if node.id in self.lets:
                if node.id not in self.let_infos:
                    self.let_infos[node.id] = self.info(self.lets[node.id])
                return self.let_infos[node.id]
            return _Info("stream" if self._has_dim(node) else "pre")
        if isinstance(node, (ir.Number, ir.Boolean)):
            return _Info("pre")
        if isinstance(node, ir.Call) and node.func == "index":
            return _Info("stream" if node.args[0].id == self.dim else "pre")
        if isinstance(node, ir.Call) and node.func == "size":
            return _Info("pre")
        if _reduced(node, self.dim):
            return self._reduction(node)
        if isinstance(node, ir.Call) and node.func == "softmax" and node.args[1].id == self.dim:
            return self._softmax(node)
        if isinstance(node, ir.Binary) and node.op == "@" and self._contracts(node, self.dim):
            return self._dot(node)
        if isinstance(node, ir.Call) and node.func == "exp":
            shifted = self._shifted(node.args[0])
            if shifted is not None:
                return shifted
        children = [self.info(child) for child in values_read(node)]
        phase = self._phase(node, children)
        if all(c.plain for c in children) and not self._factor_of(node, children):
            return _Info(phase)
        return self._linear(node, children, phase)

    def _phase(self, node, children) -> str:
        phases = {c.phase for c in children}
        if "post" in phases and ("stream" in phases or self._has_dim(node)):
            post = next(child for child, c in zip(values_read(node), children) if c.phase == "post")
            if not self._factor_of(node, children):
                raise self._one_pass(node, post)
        if self._has_dim(node) or "stream" in phases:
            return "stream"
        return "post" if "post" in phases else "pre"

    def _factor_of(self, node, children) -> bool:
        """`stream * post` or `stream / post`: the post value becomes a factor."""
        if not (isinstance(node, ir.Binary) and node.op in ("*", "/")):
            return False
        left, right = children
        return (
            right.phase == "post"
            and left.phase == "stream"
            or (node.op == "*" and left.phase == "post" and right.phase == "stream")
        )

    def _linear(self, node, children, phase) -> _Info:
        """A value computed from scaled or factored stream values: still linear in them."""
        if isinstance(node, ir.Binary) and node.op in ("*", "/"):
            left, right = children
            if self._factor_of(node, children):
                stream_side, post_side = (node.left, node.right) if right.phase == "post" else (node.right, node.left)
                info = self.info(stream_side)
                self.unfactored[node] = stream_side
                return _Info("stream", info.scale, (*info.factors, (node.op, post_side)))
            if node.op == "/" and not right.plain:
                raise self._unsweepable(node, "divides by a value rescaled in the pass")
            scaled = [c for c in children if c.scale is not None]
            if len(scaled) > 1:
                raise self._unsweepable(node, "multiplies two values each rescaled in the pass")
            return _Info("stream", scaled[0].scale if scaled else None, left.factors + right.factors)
        if isinstance(node, ir.Unary) and node.op == "-":
            return children[0]
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "cast":
            return children[0]
        if isinstance(node, ir.Call) and node.func == "where":
            condition, a, b = children
            if condition.plain:
                for kept, other, other_node in ((a, b, node.args[2]), (b, a, node.args[1])):
                    if not kept.plain and other.plain and _is_zero(other_node):
                        return kept
                if a == b:
                    return a
        if isinstance(node, ir.Binary) and node.op in ("+", "-") and children[0] == children[1]:
            return children[0]
        raise self._unsweepable(node, "uses a value rescaled in the pass in a way no rescaling makes exact")

    def _shifted(self, argument: ir.Expr) -> _Info | None:
        """exp(x - max(y, T)): a stream value scaled by the running max of y."""
        resolved = self._resolve(argument)
        if not (isinstance(resolved, ir.Binary) and resolved.op == "-"):
            return None
        top = self._resolve(resolved.right)
        if not (isinstance(top, ir.Call) and top.func == "max" and _reduced(top, self.dim)):
            return None
        left = self.info(resolved.left)
        if not left.plain or left.phase == "post":
            return None
        running = self._max_carry(top)
        self.running[top] = running
        if resolved.right is not top:
            self.running[resolved.right] = running
        return _Info("stream", running)

    def _shifted_value(self, node) -> ir.Expr | None:
        """x, where `node` is exp(x - max(x, T)) (through lets); else None."""
        node = self._resolve(node)
        if not (isinstance(node, ir.Call) and node.func == "exp"):
            return None
        argument = self._resolve(node.args[0])
        if not (isinstance(argument, ir.Binary) and argument.op == "-"):
            return None
        top = self._resolve(argument.right)
        if isinstance(top, ir.Call) and top.func == "max" and _reduced(top, self.dim):
            if value_key(top.args[0], self.lets) == value_key(argument.left, self.lets):
                return argument.left
        return None

    def _resolve(self, node):
        while isinstance(node, ir.Name) and node.id in self.lets:
            node = self.lets[node.id]
        return node

    # -- carries -----------------------------------------------------------------------

    def _carry(self, key, kind, node, value, scale=None, factors=()) -> Carry:
        if key not in self.carries:
            self.carries[key] = Carry(key, kind, node, value, scale, factors)
        return self.carries[key]

    def _max_carry(self, node: ir.Call) -> Carry:
        value = node.args[0]
        info = self.info(value)
        if not info.plain or info.phase != "stream":
            raise self._unsweepable(node, "takes the max of a value rescaled in the pass")
        carry = self._carry(("max", value_key(value, self.lets)), "max", node, value)
        self.results[node] = carry
        return carry

    def _reduction(self, node: ir.Call) -> _Info:
        kind, value = node.func, node.args[0]
        info = self.info(value)
        if info.phase == "post":
            raise self._one_pass(node, value)
        if kind == "max":
            self._max_carry(node)
            return _Info("post")
        if kind == "logsumexp":
            if not info.plain:
                raise self._unsweepable(node, "takes logsumexp of a value rescaled in the pass")
            top = self._carry(("max", value_key(value, self.lets)), "max", node, value)
            self.results[node] = self._carry(("expsum", value_key(value, self.lets)), "expsum", node, value, top)
            return _Info("post")
        if not info.plain and not FUNCTIONS[kind].reducer.linear:
            raise self._unsweepable(node, f"takes {kind}() of a value rescaled in the pass")
        shifted = self._shifted_value(value)
        if kind == "sum" and shifted is not None and not info.factors:
            # sum(exp(x - max(x, T)), T): the same running sum logsumexp and softmax keep.
            self.results[node] = self._carry(
                ("expsum", value_key(shifted, self.lets)), "expsum", node, shifted, info.scale
            )
            return _Info("post")
        key = (kind, value_key(value, self.lets))
        self.results[node] = self._carry(key, kind, node, value, info.scale, info.factors)
        return _Info("post")

    def _softmax(self, node: ir.Call) -> _Info:
        value = node.args[0]
        info = self.info(value)
        if not info.plain or info.phase == "post":
            raise self._unsweepable(node, "takes softmax() of a value that needs the pass first")
        top = self._carry(("max", value_key(value, self.lets)), "max", node, value)
        total = self._carry(("expsum", value_key(value, self.lets)), "expsum", node, value, top)
        self.softmaxes[node] = top
        return _Info("stream", top, (("/", total),))

    def _contracts(self, node: ir.Binary, dim: str) -> bool:
        lhs, rhs = values_read(node)
        return dim in self._dims(lhs) and dim in self._dims(rhs) and dim not in self._dims(node)

    def _dot(self, node: ir.Binary) -> _Info:
        lhs, rhs = values_read(node)
        sides = [self.info(lhs), self.info(rhs)]
        if any(s.phase == "post" for s in sides):
            raise self._one_pass(node, lhs if sides[0].phase == "post" else rhs)
        scaled = [s for s in sides if s.scale is not None]
        if len(scaled) > 1:
            raise self._unsweepable(node, "multiplies two values each rescaled in the pass")
        factors = sides[0].factors + sides[1].factors
        key = ("dot", value_key(node, self.lets))
        self.results[node] = self._carry(key, "dot", node, node, scaled[0].scale if scaled else None, factors)
        return _Info("post")

    # -- skipping ----------------------------------------------------------------------

    def _skip(self) -> Skip | None:
        """A `where` on positions whose other branch is a constant that makes every carry
        add its identity: blocks where its condition is false everywhere are skipped."""
        for node in ir.walk(*(s.value for s in self.kernel.body)):
            if not (isinstance(node, ir.Call) and node.func == "where"):
                continue
            condition, _, otherwise = node.args
            if not _on_positions(condition, self.lets, self.params) or _constant(otherwise, {}, self.lets) is None:
                continue
            assumed = {node: _constant(otherwise, {}, self.lets)}
            if all(self._adds_identity(carry, assumed) for carry in self.carries.values()):
                return Skip(node, condition)
        return None

    def _adds_identity(self, carry: Carry, assumed) -> bool:
        if carry.kind == "dot":
            return any(_constant(side, assumed, self.lets) == 0.0 for side in values_read(carry.node))
        value = _constant(carry.value, assumed, self.lets)
        if carry.kind == "expsum":
            return value == float("-inf")
        return value is not None and value == _identity_value(carry.kind)

    # -- errors ------------------------------------------------------------------------

    def _one_pass(self, node, needed) -> ValueProblem:
        return ValueProblem(
            node,
            f"this needs {_describe(needed)} at each position of {self.dim}, known only after the pass over the"
            f" blocks of {self.dim}: leave {self.dim} unblocked (a block then holds all of it), or split the kernel",
        )

    def _unsweepable(self, node, what) -> ValueProblem:
        return ValueProblem(
            node,
            f"this {what}, so {self.dim} cannot be swept in one pass: leave {self.dim} unblocked, or split the kernel",
        )


def walk_outside(root: ir.Expr, skip) -> list[ir.Expr]:
    """The nodes under `root` (itself included), except those under a node in `skip`."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        if node not in skip:
            stack.extend(reversed([n for n in _all_children(node)]))
    return found


def _all_children(node: ir.Expr) -> list[ir.Expr]:
    if isinstance(node, ir.Call):
        return list(node.args)
    return [getattr(node, a) for a in ("operand", "left", "right", "value") if hasattr(node, a)]


def _describe(node: ir.Expr) -> str:
    if isinstance(node, ir.Call):
        return f"{node.func}() over its dimension"
    if isinstance(node, ir.Name):
        return f"'{node.id}'"
    return "a value computed from the whole pass"


def named(statement: ir.Statement) -> str:
    """The name a statement gives its value: a let's, or the output it assigns."""
    return statement.name if isinstance(statement, ir.Let) else statement.target


def _identity_value(kind: str) -> float | None:
    """What a step adds that changes no running value of a reduction that carries one
    (the others never skip; expsum and product carries are checked by their terms:
    exp(-inf) and a 0 operand)."""
    reducer = FUNCTIONS[kind].reducer
    return IDENTITY_VALUES.get(reducer.identity) if reducer.merge else None


def _is_zero(node: ir.Expr) -> bool:
    return isinstance(node, ir.Number) and node.value == 0


def value_key(node: ir.Expr, lets) -> tuple:
    """A value's structure, lets resolved: equal keys compute equal values."""
    if isinstance(node, ir.Name):
        return value_key(lets[node.id], lets) if node.id in lets else ("name", node.id)
    if isinstance(node, (ir.Number, ir.Boolean)):
        return ("const", node.value)
    if isinstance(node, ir.Unary):
        return (node.op, value_key(node.operand, lets))
    if isinstance(node, ir.Binary):
        return (node.op, value_key(node.left, lets), value_key(node.right, lets))
    if isinstance(node, ir.Attribute):
        return ("." + node.attr, value_key(node.value, lets))
    return (node.func, *(value_key(arg, lets) for arg in node.args))


def _on_positions(node: ir.Expr, lets, params) -> bool:
    """Whether a condition reads positions, and besides them only sizes, params and
    literals (through lets too): the same at every position of a block but for those."""
    reads = {"positions": False}

    def only_positions(node) -> bool:
        if isinstance(node, ir.Name):
            return only_positions(lets[node.id]) if node.id in lets else node.id in params
        if isinstance(node, (ir.Number, ir.Boolean)):
            return True
        if isinstance(node, ir.Call):
            if node.func in ("index", "size"):
                reads["positions"] = reads["positions"] or node.func == "index"
                return True
            return FUNCTIONS[node.func].typing == "cast" and only_positions(node.args[0])
        if isinstance(node, ir.Binary) and node.op == "@" or isinstance(node, ir.Attribute):
            return False
        return all(map(only_positions, _all_children(node)))

    return only_positions(node) and reads["positions"]


def _constant(node: ir.Expr, assumed, lets):
    """The value of `node` where each node in `assumed` has its given value, when that
    fixes it; None otherwise. A value it does not fix (an input read, a product, a
    running max) is taken as some finite number: on a skipped block the kernel reads no
    input at all, so, as flash attention does, it assumes what it would read is finite
    (`-inf - lse` is -inf, `0 * dp` is 0)."""
    inf = float("inf")
    if node in assumed:
        return assumed[node]
    if isinstance(node, ir.Name):
        return _constant(lets[node.id], assumed, lets) if node.id in lets else None
    if isinstance(node, ir.Number):
        return float(node.value)
    if isinstance(node, ir.Unary) and node.op == "-":
        value = _constant(node.operand, assumed, lets)
        return None if value is None else -value
    if isinstance(node, ir.Call) and node.func in ("exp", "softmax"):
        # softmax's terms are exp(x - the running max), its divisor applied at the end.
        value = _constant(node.args[0], assumed, lets)
        return 0.0 if value == -inf else None
    if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "cast":
        return _constant(node.args[0], assumed, lets)
    if isinstance(node, ir.Call) and node.func == "where":
        a, b = (_constant(x, assumed, lets) for x in node.args[1:])
        return a if a is not None and a == b else None
    if isinstance(node, ir.Binary) and node.op in ("+", "-", "*", "/"):
        left = _constant(node.left, assumed, lets)
        right = _constant(node.right, assumed, lets)
        if left is not None and right is not None:
            try:
                return {"+": left + right, "-": left - right, "*": left * right, "/": left / right}[node.op]
            except ZeroDivisionError:
                return None
        known, other = (left, node.right) if left is not None else (right, node.left)
        if known in (inf, -inf) and node.op in ("+", "-"):
            return known if node.op == "+" or left is not None else -known
        if known == 0.0 and node.op == "*":
            return 0.0
        if left == 0.0 and node.op == "/":
            return 0.0
        if known in (inf, -inf) and node.op in ("*", "/") and left is not None and _positive(other, lets):
            return known
    return None


def _positive(node, lets) -> bool:
    node = _resolve_lets(node, lets)
    return isinstance(node, ir.Number) and node.value > 0


def _resolve_lets(node, lets):
    while isinstance(node, ir.Name) and node.id in lets:
        node = lets[node.id]
    return node
