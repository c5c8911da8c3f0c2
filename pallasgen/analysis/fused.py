"""Fused kernels: several products, computed operands, reductions beside products.

A fused kernel is one `pallas_call` whose values are tiles of at most two dimensions
(its *frame*): a product's batch dimensions take one element per step and vanish from
the tiles. Its blocked dimensions that some output has are parallel grid axes; at most
one blocked dimension that no output has is *swept*: its blocks are the steps of one
pass, in order, and what the kernel computes across them is *carried* from step to
step (see `Carry`): a product's accumulator, a running sum or max, or, where a value
uses a running max as `exp(x - max(x, T))`, a running sum or product of that value
rescaled as the max grows (the online softmax of FlashAttention).

This module decides, from the typed spec, each value's tile axes (its frame), the
swept dimension and which carries a kernel needs and what cannot be swept in one pass (a spec error at the
line that needs it). It says nothing about how a backend places a carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pallasgen.analysis.carries import Carry, Skip, Sweep
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.infer import product_operand
from pallasgen.analysis.valuetypes import ValueType
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic

# The float value of a reduction's identity (`Reducer.identity`), where it has one.
IDENTITY_VALUES = {"zero": 0.0, "lowest": float("-inf"), "highest": float("inf")}


def is_fused(kernel: ir.Kernel) -> bool:
    """Whether a kernel needs the fused path: several products, a product of a value that
    is not an input array, or a product beside a reduction or softmax."""
    nodes = list(ir.walk(*(s.value for s in kernel.body)))
    products = [n for n in nodes if isinstance(n, ir.Binary) and n.op == "@"]
    if not products:
        return False
    inputs = {d.name for d in kernel.inputs}
    computed = any(
        not (isinstance(value, ir.Name) and value.id in inputs)
        for node in products
        for value, _ in map(product_operand, (node.left, node.right))
    )
    reduces = any(isinstance(n, ir.Call) and n.func in FUNCTIONS and FUNCTIONS[n.func].reducer for n in nodes)
    return len(products) > 1 or computed or reduces


@dataclass(frozen=True)
class Product:
    """One `@` of a fused kernel, as the tiles see it."""

    node: ir.Binary
    lhs: ir.Expr
    rhs: ir.Expr
    lhs_contracts: int  # the tile axis of the contracted dimension in each operand
    rhs_contracts: int
    k: str  # the contracted dimension


@dataclass(frozen=True)
class FusedKernel:
    """What the fused path derives from a checked kernel."""

    batch: tuple[str, ...]  # dimensions blocked by 1: one element per step
    row: str  # the first axis of every tile that has it
    parallel: tuple[str, ...]  # blocked dimensions some output has
    frame: dict[ir.Expr, tuple[str | None, str | None]] = field(hash=False)  # each value's tile axes
    products: dict[ir.Expr, Product] = field(hash=False)
    sweep: Sweep | None


class _Problem(Exception):
    def __init__(self, node: ir.Expr, message: str):
        super().__init__(message)
        self.diagnostic = Diagnostic(node.position, message)


def analyze_fused(
    kernel: ir.Kernel, types: dict[ir.Expr, ValueType], dims: tuple[str, ...], blocks: dict[str, int]
) -> tuple[FusedKernel | None, list[Diagnostic]]:
    """The fused kernel's frame, carries and pass, or the diagnostics saying why not."""
    items = {item.dim: item for item in kernel.blocks}
    output_dims = {d for out in kernel.outputs for d in out.dims}
    products = [n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Binary) and n.op == "@"]
    batch = _batch_dims(products, types, dims)
    found = []
    for dim in batch:
        if blocks.get(dim) != 1:
            anchor = items[dim].position if dim in items else kernel.position
            found.append(
                Diagnostic(
                    anchor,
                    f"{dim} is a batch dimension of a product: it takes one element per step; write block {dim} = 1",
                )
            )
    swept = [d for d in dims if d in blocks and d not in output_dims and d not in batch]
    for dim in swept[1:]:
        found.append(
            Diagnostic(
                items[dim].position,
                f"one dimension that no output has can be blocked, and {swept[0]} is: leave {dim} unblocked",
            )
        )
    if found:
        return None, found
    row = _row_dim(products, types, batch)
    try:
        frame = _Frame(kernel, types, batch, row).axes()
        fused_products = {n: _product(n, types, frame) for n in products}
        for dim in blocks:
            if dim in output_dims and dim not in batch:
                _kept_dim_problem(kernel, types, dim, fused_products, items[dim])
        sweep = _Sweeper(kernel, types, swept[0], fused_products).sweep() if swept else None
    except _Problem as problem:
        return None, [problem.diagnostic]
    parallel = tuple(d for d in dims if d in blocks and d in output_dims and d not in batch)
    return FusedKernel(batch, row, parallel, frame, fused_products, sweep), []


def array_axes(decl: ir.ArrayDecl, fused: FusedKernel) -> tuple[str | None, ...]:
    """How a fused kernel lays an array out: its batch dimensions, then its tile axes (a
    two-dimensional tile in its declared order; one dimension as the frame holds it)."""
    batch = tuple(d for d in decl.dims if d in fused.batch)
    rest = [d for d in decl.dims if d not in fused.batch]
    if len(rest) == 2:
        return (*batch, *rest)
    if len(rest) == 1:
        return (*batch, *((rest[0], None) if rest[0] == fused.row else (None, rest[0])))
    return (*batch, None, None)


def _batch_dims(products: list[ir.Binary], types, dims) -> tuple[str, ...]:
    """Dimensions outside every product's matrices: its operands' leading ones."""
    matrix, every = set(), set()
    for node in products:
        for value in _children(node):
            matrix |= set(types[value].dims[-2:])
            every |= set(types[value].dims)
    return tuple(d for d in dims if d in every - matrix)


def _row_dim(products, types, batch) -> str:
    """The first product's rows: every tile that has them holds them on its first axis."""
    value, transposed = product_operand(products[0].left)
    dims = [d for d in types[value].dims if d not in batch]
    return dims[-1] if transposed else dims[-2]


def _kept_dim_problem(kernel, types, dim, products, item) -> None:
    """A blocked dimension an output keeps must not be contracted or reduced: a block
    holds only part of it."""
    for node in ir.walk(*(s.value for s in kernel.body)):
        reduced = isinstance(node, ir.Call) and FUNCTIONS.get(node.func) and FUNCTIONS[node.func].reducer
        if reduced and isinstance(node.args[1], ir.Name) and node.args[1].id == dim:
            raise _Problem(
                node,
                f"{node.func}() over {dim} needs all of {dim}, and an output keeps {dim}, so it is not swept"
                f" (block {dim} at line {item.position.line}): leave {dim} unblocked",
            )
        if node in products and products[node].k == dim:
            raise _Problem(
                node,
                f"this product contracts {dim}, which an output keeps (block {dim} at line {item.position.line}):"
                f" leave {dim} unblocked",
            )


class _Frame:
    """Each value's tile axes: (row, column), None where it has size 1. The row dimension
    is always the first axis; a tile without it keeps its operands' order."""

    def __init__(self, kernel, types, batch, row):
        self.kernel, self.types, self.batch, self.row = kernel, types, set(batch), row
        self.lets = {_named(s): s.value for s in kernel.body}  # an output a statement reads: its value
        self.inputs = {d.name: d for d in kernel.inputs}
        self.found: dict[ir.Expr, tuple] = {}

    def axes(self) -> dict[ir.Expr, tuple]:
        for statement in self.kernel.body:
            self.of(statement.value)
        return self.found

    def of(self, node: ir.Expr) -> tuple:
        if node not in self.found:
            self.found[node] = self._of(node)
        return self.found[node]

    def _dims(self, node) -> list[str]:
        return [d for d in self.types[node].dims if d not in self.batch]

    def _of(self, node: ir.Expr) -> tuple:
        dims = self._dims(node)
        if len(dims) > 2:
            raise _Problem(
                node,
                f"a value of a fused kernel has at most two dimensions besides its batch ones, not {', '.join(dims)}",
            )
        children = [self.of(child) for child in _children(node)]
        if isinstance(node, ir.Name) and node.id in self.lets:
            return self.of(self.lets[node.id])
        if isinstance(node, ir.Binary) and node.op == "@":
            lhs, rhs = children
            return (*[d for d in lhs if d not in rhs], *[d for d in rhs if d not in lhs])
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "reduce":
            reduced = tuple(None if axis == node.args[1].id else axis for axis in children[0])
            if reduced != self._rule(dims, reduced):
                raise _Problem(
                    node, f"this reduction leaves {dims[0]} on a tile's first axis; not supported in a fused kernel"
                )
            return reduced
        if isinstance(node, ir.Name) and node.id in self.inputs and len(dims) == 2:
            return tuple(d for d in self.inputs[node.id].dims if d not in self.batch)
        wide = next((axes for axes in children if None not in axes), None)
        axes = self._rule(dims, wide)
        for child, child_axes in zip(_children(node), children):
            if any(a is not None and a != b for a, b in zip(child_axes, axes)):
                raise _Problem(
                    child,
                    f"this value's tile is laid out ({', '.join(a or '1' for a in child_axes)}) but meets one laid"
                    f" out ({', '.join(a or '1' for a in axes)}); not supported in a fused kernel",
                )
        return axes

    def _rule(self, dims, wide) -> tuple:
        """Tile axes for `dims`: the row dimension first; a 1-D value off it is a row
        (1, n); a 2-D one without it takes the order of a tile it is computed from."""
        dims = [d for d in dims if d is not None]
        if not dims:
            return (None, None)
        if len(dims) == 1:
            return (dims[0], None) if dims[0] == self.row else (None, dims[0])
        if self.row in dims:
            return (self.row, *[d for d in dims if d != self.row])
        return wide if wide is not None and set(wide) == set(dims) else tuple(dims)


def _product(node: ir.Binary, types, frame) -> Product:
    lhs, _ = product_operand(node.left)
    rhs, _ = product_operand(node.right)
    lhs_axes, rhs_axes = frame[lhs], frame[rhs]
    (k,) = [d for d in lhs_axes if d in rhs_axes]
    return Product(node, lhs, rhs, lhs_axes.index(k), rhs_axes.index(k), k)


def _children(node: ir.Expr) -> list[ir.Expr]:
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

    def __init__(self, kernel, types, dim, products):
        self.kernel, self.types, self.dim, self.products = kernel, types, dim, products
        self.lets = {_named(s): s.value for s in kernel.body}  # an output a statement reads: its value
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
            self.let_infos[_named(statement)] = self.info(statement.value)
        finish = [s for s in self.kernel.body if isinstance(s, ir.Assign) or self.let_infos[s.name].phase == "post"]
        in_step = self._names_read([c.value for c in self.carries.values()])
        in_finish = self._names_read([s.value for s in finish], skip=self.results) | {
            s.name for s in finish if isinstance(s, ir.Let)
        }
        # Each step computes the lets its carries read, and an output they read as a let
        # of its name (stored once the pass is done).
        lets = [s if isinstance(s, ir.Let) else ir.Let(s.target, s.value, s.position) for s in self.kernel.body]
        return Sweep(
            self.dim,
            tuple(self.carries.values()),
            self.results,
            step=tuple(s for s in lets if s.name in in_step and self.let_infos[s.name].phase != "post"),
            finish=tuple(s for s in self.kernel.body if s in finish or (isinstance(s, ir.Let) and s.name in in_finish)),
            running=self.running,
            unfactored=self.unfactored,
            softmaxes=self.softmaxes,
            terms=self._terms(),
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

    def _has_dim(self, node) -> bool:
        return self.dim in self.types[node].dims

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
        if isinstance(node, ir.Binary) and node.op == "@" and self.products[node].k == self.dim:
            return self._dot(node)
        if isinstance(node, ir.Call) and node.func == "exp":
            shifted = self._shifted(node.args[0])
            if shifted is not None:
                return shifted
        children = [self.info(child) for child in _children(node)]
        phase = self._phase(node, children)
        if all(c.plain for c in children) and not self._factor_of(node, children):
            return _Info(phase)
        return self._linear(node, children, phase)

    def _phase(self, node, children) -> str:
        phases = {c.phase for c in children}
        if "post" in phases and ("stream" in phases or self._has_dim(node)):
            post = next(child for child, c in zip(_children(node), children) if c.phase == "post")
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

    def _dot(self, node: ir.Binary) -> _Info:
        product = self.products[node]
        sides = [self.info(product.lhs), self.info(product.rhs)]
        if any(s.phase == "post" for s in sides):
            raise self._one_pass(node, product.lhs if sides[0].phase == "post" else product.rhs)
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
            product = self.products[carry.node]
            return any(_constant(side, assumed, self.lets) == 0.0 for side in (product.lhs, product.rhs))
        value = _constant(carry.value, assumed, self.lets)
        if carry.kind == "expsum":
            return value == float("-inf")
        return value is not None and value == _identity_value(carry.kind)

    # -- errors ------------------------------------------------------------------------

    def _one_pass(self, node, needed) -> _Problem:
        return _Problem(
            node,
            f"this needs {_describe(needed)} at each position of {self.dim}, known only after the pass over the"
            f" blocks of {self.dim}: leave {self.dim} unblocked (a block then holds all of it), or split the kernel",
        )

    def _unsweepable(self, node, what) -> _Problem:
        return _Problem(
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


def _named(statement: ir.Statement) -> str:
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
