"""The FlashAttention-2 backward pass of attention kernels, derived from the spec.

A fused kernel has the attention form when one output is `P @ v` with P the softmax
over T of scores `s` (`softmax(s, T)`, or `exp(s - max(s, T))` with the product divided
by `sum(p, T)`, p rounded to v's dtype for the product or not), and `s` is an
elementwise expression of one product `q @ k.T`, other inputs, params, literals and
index()/size() (a causal mask is a `where` of them). Any other output is `logsumexp(s, T)`.

Its backward pass is two kernels of the same fused kind, which recompute the
probabilities block by block from the saved log-sum-exp, `p = exp(s - lse)`:
`NAME_backward_dq` sweeps T (dq, and delta = sum(do * o) per query, less the
log-sum-exp's cotangent), `NAME_backward_dkdv` sweeps S on the transposed scores
(dk, dv). `ds = p * (dp - delta)` is taken back through the score expression to the
product by the derivative rules (analysis.derivatives): a `where` mask gives 0 where
it masks, which lets the fused sweep skip the blocks past a causal diagonal. A k, v
broadcast over a dimension of q (grouped-query attention's R) gets per-element
cotangents summed over it by a third kernel. A float input of the scores (ALiBi's slopes)
gets its cotangent from the dq kernel where it has no T, from the dkdv kernel where it
has, summed over what it is broadcast over by a kernel of its own (reverse.summing_step);
integer ones (segment ids) are read only. The forward pass saves the output and the
log-sum-exp: the kernel's `logsumexp` output, else a residual that the kernel writes
too under jax.grad, computed in the same sweep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pallasgen.gradients.backward import Argument, Derived, Residual, Step, is_float
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.derivatives import Builder
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.carries import value_key
from pallasgen.analysis.names import Namer
from pallasgen.gradients.reverse import arguments_and_rule, converted, replaced, substitute, sum_of, summing_step
from pallasgen.frontend import ir


@dataclass(frozen=True)
class Attention:
    """What the backward pass needs of an attention kernel's forward one."""

    output: ir.ArrayDecl  # o = softmax(s, T) @ v
    assign: ir.Assign  # o's statement
    lse: ir.ArrayDecl | None  # the output logsumexp(s, T), if any
    score: ir.Expr  # s, as the softmax reads it
    product: ir.Binary  # q @ k.T
    q: ir.ArrayDecl
    k: ir.ArrayDecl
    v: ir.ArrayDecl
    dim: str  # T, the dimension the softmax normalises over
    score_lets: tuple[ir.Let, ...]  # the forward lets that s reads, in order
    p_let: str  # the forward's name for the probabilities ("" where it has none)
    extras: tuple[ir.ArrayDecl, ...]  # the inputs s reads besides q and k (ALiBi's slopes)


def derive(checked: CheckedKernel) -> Derived | None:
    """The FlashAttention-2 backward kernels of an attention kernel; None for any other."""
    form = attention_form(checked)
    if form is None:
        return None
    return _Derivation(checked, form).derived()


# ------------------------------------------------------------------------- recognising it


def attention_form(checked: CheckedKernel) -> Attention | None:
    """The kernel's attention form, or None where it has none."""
    kernel = checked.kernel
    if not checked.framed or checked.sweep is None:
        return None
    lets = {s.name: s.value for s in kernel.body if isinstance(s, ir.Let)}
    inputs = {d.name: d for d in kernel.inputs}
    outputs = {d.name: d for d in kernel.outputs}
    assigns = [s for s in kernel.body if isinstance(s, ir.Assign)]
    found = [(a, _softmax_product(a.value, lets, inputs)) for a in assigns]
    found = [(a, f) for a, f in found if f is not None]
    if len(found) != 1:
        return None
    assign, (score, dim, v, p_let) = found[0]
    lse = None
    for other in assigns:
        if other is assign:
            continue
        value = other.value
        if lse is not None or not (_is_call(value, "logsumexp") and _is_dim(value.args[1], dim)):
            return None
        if value_key(value.args[0], lets) != value_key(score, lets):
            return None
        lse = outputs[other.target]
    product = _score_product(score, lets, inputs, {p.name for p in kernel.params})
    if product is None:
        return None
    q, k = inputs[product.left.id], inputs[product.right.value.id]
    if checked.sweep.dim != dim or k.dims[-2] != dim or v.dims[-2] != dim or k.dims[-1] != q.dims[-1]:
        return None
    read = {n.id for n in ir.walk(score) if isinstance(n, ir.Name)}
    score_lets = []
    for statement in reversed(kernel.body):
        if isinstance(statement, ir.Let) and statement.name in read:
            score_lets.insert(0, statement)
            read |= {n.id for n in ir.walk(statement.value) if isinstance(n, ir.Name)}
    extras = tuple(d for d in kernel.inputs if d.name in read and d not in (q, k))
    return Attention(
        outputs[assign.target], assign, lse, score, product, q, k, v, dim, tuple(score_lets), p_let, extras
    )


def _softmax_product(value: ir.Expr, lets, inputs):
    """(s, T, v, the probabilities' let) where `value` is `softmax(s, T) @ v` or
    `(p @ v) / sum(p, T)` with p = exp(s - max(s, T)), or with `bf16(p) @ v` for a bf16
    v (FlashAttention's rounding, which the backward pass's dv takes too); None otherwise."""
    if isinstance(value, ir.Binary) and value.op == "@" and _is_input(value.right, inputs):
        softmax = _through(value.left, lets)
        if _is_call(softmax, "softmax") and isinstance(softmax.args[1], ir.Name):
            return softmax.args[0], softmax.args[1].id, inputs[value.right.id], ""
    if not (isinstance(value, ir.Binary) and value.op == "/"):
        return None
    product, total = _through(value.left, lets), _through(value.right, lets)
    if not (isinstance(product, ir.Binary) and product.op == "@" and _is_input(product.right, inputs)):
        return None
    if not (_is_call(total, "sum") and isinstance(total.args[1], ir.Name)):
        return None
    v, probabilities = inputs[product.right.id], product.left
    if _is_call(probabilities, v.dtype):
        probabilities = probabilities.args[0]
    if value_key(total.args[0], lets) != value_key(probabilities, lets):
        return None
    p, dim = _through(probabilities, lets), total.args[1].id
    if not (_is_call(p, "exp") and isinstance(p.args[0], ir.Binary) and p.args[0].op == "-"):
        return None
    score, top = p.args[0].left, _through(p.args[0].right, lets)
    if not (
        _is_call(top, "max") and _is_dim(top.args[1], dim) and value_key(top.args[0], lets) == value_key(score, lets)
    ):
        return None
    p_let = probabilities.id if isinstance(probabilities, ir.Name) else ""
    return score, dim, v, p_let


def _score_product(score: ir.Expr, lets, inputs, params) -> ir.Binary | None:
    """The one product `q @ k.T` of input arrays that the scores read, where they are an
    elementwise expression of it, other inputs, params, literals and index()/size(); else
    None."""
    products = []
    stack = [score]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.Name):
            if node.id in lets:
                stack.append(lets[node.id])
            elif node.id not in params and node.id not in inputs:
                return None
        elif isinstance(node, ir.Binary) and node.op == "@":
            transposed = node.right
            if not (
                _is_input(node.left, inputs)
                and isinstance(transposed, ir.Attribute)
                and transposed.attr == "T"
                and _is_input(transposed.value, inputs)
            ):
                return None
            products.append(node)
        elif isinstance(node, ir.Call) and FUNCTIONS[node.func].typing in ("index", "size"):
            continue
        elif isinstance(node, ir.Call):
            if FUNCTIONS[node.func].reducer or FUNCTIONS[node.func].derivative is None:
                return None
            stack.extend(node.args)
        elif isinstance(node, ir.Unary):
            stack.append(node.operand)
        elif isinstance(node, ir.Binary):
            stack.extend((node.left, node.right))
        elif not isinstance(node, (ir.Number, ir.Boolean)):
            return None
    return products[0] if len(products) == 1 else None


def _through(node: ir.Expr, lets) -> ir.Expr:
    """The value a name of a let stands for (through lets of lets); any other node as it is."""
    while isinstance(node, ir.Name) and node.id in lets:
        node = lets[node.id]
    return node


def _is_call(node: ir.Expr, func: str) -> bool:
    return isinstance(node, ir.Call) and node.func == func


def _is_dim(node: ir.Expr, dim: str) -> bool:
    return isinstance(node, ir.Name) and node.id == dim


def _is_input(node: ir.Expr, inputs) -> bool:
    return isinstance(node, ir.Name) and node.id in inputs


# -------------------------------------------------------------------------- deriving it

_PRODUCT = "\0product"  # the key of q @ k.T among the cotangents the walk back gives


@dataclass(frozen=True)
class _Extra:
    """A float input of the scores besides q and k, and the output that gives its
    cotangent: the input's own (`summed` empty) or partial sums in f32 that keep the
    dimensions of the kernel's grid, summed over `summed` by a kernel of their own."""

    decl: ir.ArrayDecl
    partial: ir.ArrayDecl
    summed: tuple[str, ...]

    @property
    def result(self) -> str:
        return self.partial.name if self.summed else self.decl.name


class _Derivation:
    """The backward kernels of one attention kernel (see the module's docstring)."""

    def __init__(self, checked: CheckedKernel, form: Attention):
        self.checked, self.form = checked, form
        kernel = checked.kernel
        self.lets = {s.name: s.value for s in kernel.body if isinstance(s, ir.Let)}
        self.let_names = {s.value: s.name for s in kernel.body if isinstance(s, ir.Let)}
        # The backward kernels' names: those of the forward that they read, and their own.
        read = [*(d.name for d in kernel.inputs), *(s.name for s in form.score_lets), *(p.name for p in kernel.params)]
        self.taken = [*read, *checked.dims, *FUNCTIONS]
        self.namer = Namer(self.taken)
        self.n = {"s": form.score.id} if isinstance(form.score, ir.Name) else {}
        for name in ("s", "p", "o", "do", "lse", "dlse", "delta", "dq", "dk", "dv", "dp", "ds"):
            self.n.setdefault(name, self.namer.claim_spec(name))
        self.taken.extend(self.n.values())
        forward_names = [*(d.name for d in (*kernel.inputs, *kernel.outputs)), *self.lets, *read, *checked.dims]
        self.residual_name = Namer([*forward_names, *FUNCTIONS]).claim_spec("lse")
        self.position = form.assign.position
        self.b = Builder(self.position, lambda expr: expr)  # what it builds is read once
        self.bound: list[ir.Let] = []

    # -- names and nodes

    def name(self, key: str) -> ir.Name:
        return ir.Name(self.n[key], self.position)

    def dim(self, dim: str) -> ir.Name:
        return ir.Name(dim, self.position)

    def decl(self, like: ir.ArrayDecl, name: str, dtype: str = "", dims: tuple[str, ...] | None = None):
        dims = like.dims if dims is None else dims
        return dataclasses.replace(
            like,
            name=name,
            dtype=dtype or like.dtype,
            dims=dims,
            dim_positions=(like.position,) * len(dims),
        )

    def cast(self, value: ir.Expr, dtype: str) -> ir.Expr:
        return value if dtype == "f32" else self.b.call(dtype, value)

    # -- the derivation

    def derived(self) -> Derived | str:
        form = self.form
        lse_source = "output" if form.lse is not None else "residual"
        lse_name = form.lse.name if form.lse is not None else self.residual_name
        residuals = ()
        if form.lse is None:
            value = self.b.call("logsumexp", form.score, self.dim(form.dim))
            residuals = (Residual(lse_name, value, "f32", form.q.dims[:-1]),)
        broadcast = [d for d in form.q.dims[:-2] if d not in form.k.dims]
        if len(broadcast) > 1:
            return "keys and values broadcast over two dimensions of the queries"
        sides = self._extra_sides()
        if isinstance(sides, str):
            return sides
        query_side, key_side = sides
        dq = self._dq_kernel(lse_name, lse_source, query_side)
        dkdv = self._dkdv_kernel(lse_name, lse_source, broadcast[0] if broadcast else None, key_side)
        steps = [dq, dkdv]
        if broadcast:
            steps.append(self._summed(broadcast[0], dkdv))
        steps.extend(self._extras_summed([*query_side, *key_side]))
        recomputed = tuple(dict.fromkeys([*(s.name for s in form.score_lets), *([form.p_let] if form.p_let else [])]))
        return Derived(tuple(steps), residuals, recomputed)

    def _extra_sides(self):
        """The float inputs of the scores besides q and k that their derivative reaches, as
        `_Extra`s in two lists: those without T get their cotangents from the dq kernel
        (summed over T there), those with T from the dkdv kernel (summed over S); or what
        is not generated yet."""
        form = self.form
        s_dim = form.q.dims[-2]
        sides = ([], [])
        self.bound, self.bound_names = [], Namer(self.taken)
        reached = self._walk_back(self.name("ds"), {d.name for d in form.extras if is_float(d)})
        for decl in form.extras:
            if decl.name not in reached:  # an integer input, or one read by a condition only: no cotangent
                continue
            if s_dim in decl.dims and form.dim in decl.dims:
                return f"an input of the scores over both {s_dim} and {form.dim} ({decl.name})"
            key_side = form.dim in decl.dims
            dims = (*form.q.dims[:-2], form.dim) if key_side else form.q.dims[:-1]
            summed = tuple(d for d in dims if d not in decl.dims)
            if not summed and dims != decl.dims:
                return f"an input of the scores with its dimensions in another order than theirs ({decl.name})"
            name = self.namer.claim_spec(f"d{decl.name}" + (f"_{''.join(summed).lower()}" if summed else ""))
            partial = self.decl(decl, name, "f32" if summed else decl.dtype, dims)
            sides[key_side].append(_Extra(decl, partial, summed))
        self.taken.extend(e.partial.name for side in sides for e in side)
        return sides

    def _extras_summed(self, extras: list[_Extra]) -> list[Step]:
        """The kernels that sum the extra inputs' partial cotangents, one for each set of
        dimensions they are summed over."""
        groups: dict[tuple[str, ...], list[_Extra]] = {}
        for extra in extras:
            if extra.summed:
                groups.setdefault(extra.summed, []).append(extra)
        return [
            summing_step(
                self.checked.kernel,
                [e.partial for e in group],
                [e.decl for e in group],
                [self.namer.claim_spec(f"d{e.decl.name}") for e in group],
                summed,
            )
            for summed, group in groups.items()
        ]

    def _extra_outputs(self, extras: list[_Extra], cotangents: dict[str, ir.Expr], dim: str, exact_delta=False):
        """Each extra input's cotangent from this kernel, summed over its sweep's `dim`; in
        the dq kernel (`exact_delta`) as if `ds` took the exact delta, sum(p * dp, T) less
        the log-sum-exp's cotangent, not the one of the output rounded to its dtype: each
        gains (delta - exact) times the sum of its cotangent where p is the scores'. A sum
        over every query of a slope times the distance (ALiBi's) amplifies that rounding
        (1% of dslope where jax.vjp of the reference is exact); dq, a sum over T alone,
        keeps it, as FlashAttention-2 does."""
        b, position, statements = self.b, self.position, []
        if exact_delta and extras:
            before = len(self.bound)
            weights = self._walk_back(self.name("p"), {e.decl.name for e in extras})
            exact = b.call("sum", b.mul(self.name("p"), self.name("dp")), self.dim(dim))
            if self.form.lse is not None:
                exact = b.op(exact, "-", self.name("dlse"))
            error = ir.Name(self.namer.claim_spec(f"{self.n['delta']}_error"), position)
            statements = [*self.bound[before:], ir.Let(error.id, b.op(self.name("delta"), "-", exact), position)]
        for extra in extras:
            value = b.call("sum", cotangents[extra.decl.name], self.dim(dim))
            if statements:
                value = b.op(value, "+", b.mul(error, b.call("sum", weights[extra.decl.name], self.dim(dim))))
            statements.append(ir.Assign(extra.partial.name, self.cast(value, extra.partial.dtype), extra.decl.position))
        return [e.partial for e in extras], statements, [e.result for e in extras]

    def _lse_inputs(self, lse_name: str, lse_source: str):
        form = self.form
        dims = form.q.dims[:-1]
        decl = self.decl(form.q, self.n["lse"], "f32", dims)
        return [(decl, Argument(lse_name, lse_source))]

    def _score_lets(self) -> list[ir.Let]:
        """The forward lets that the scores read, and `s` itself where it is no let."""
        lets = list(self.form.score_lets)
        if not isinstance(self.form.score, ir.Name):
            lets.append(ir.Let(self.n["s"], self.form.score, self.position))
        return lets

    def _inputs(self) -> list:
        form = self.form
        return [(d, Argument(d.name, "input")) for d in (form.q, form.k, form.v, *form.extras)]

    def _dq_kernel(self, lse_name: str, lse_source: str, extras: list[_Extra]) -> Step:
        form, b = self.form, self.b
        o, do, q, k, v = self.name("o"), self.name("do"), form.q, form.k, form.v
        ins = [
            *self._inputs(),
            (self.decl(form.output, self.n["o"]), Argument(form.output.name, "output")),
            (self.decl(form.output, self.n["do"]), Argument(form.output.name, "cotangent")),
            *self._lse_inputs(lse_name, lse_source),
        ]
        delta = b.call("sum", b.op(b.call("f32", do), "*", b.call("f32", o)), self.dim(form.output.dims[-1]))
        if form.lse is not None:
            ins.append(
                (self.decl(form.q, self.n["dlse"], "f32", form.q.dims[:-1]), Argument(form.lse.name, "cotangent"))
            )
            delta = b.op(delta, "-", self.name("dlse"))
        transposed_v = ir.Attribute(ir.Name(v.name, self.position), "T", self.position, self.position)
        body = [
            *self._score_lets(),
            ir.Let(self.n["p"], b.call("exp", b.op(self.name("s"), "-", self.name("lse"))), self.position),
            ir.Let(self.n["dp"], b.op(self.name("do"), "@", transposed_v), self.position),
            ir.Assign(self.n["delta"], delta, self.position),
            ir.Let(self.n["ds"], b.mul(self.name("p"), b.op(self.name("dp"), "-", self.name("delta"))), self.position),
        ]
        lets, cotangents = self._bound_cotangents(extras)
        body.extend(lets)
        dq = b.op(self.cast(cotangents[_PRODUCT], k.dtype), "@", ir.Name(k.name, self.position))
        body.append(ir.Assign(self.n["dq"], dq, form.product.position))
        extra_outs, extra_assigns, extra_results = self._extra_outputs(extras, cotangents, form.dim, exact_delta=True)
        body.extend(extra_assigns)
        outs = (self.decl(q, self.n["dq"]), self.decl(q, self.n["delta"], "f32", q.dims[:-1]), *extra_outs)
        what = "dq, and delta = sum(do * o) per query" + "".join(f", {o.name}" for o in extra_outs)
        kernel = self._kernel("dq", f"{what}: one pass over T", ins, outs, body)
        return Step(kernel, tuple(a for _, a in ins), (q.name, self.n["delta"], *extra_results))

    def _dkdv_kernel(self, lse_name: str, lse_source: str, broadcast: str | None, extras: list[_Extra]) -> Step:
        form, b = self.form, self.b
        q, k, v = form.q, form.k, form.v
        ins = [
            *self._inputs(),
            (self.decl(form.output, self.n["do"]), Argument(form.output.name, "cotangent")),
            *self._lse_inputs(lse_name, lse_source),
            (self.decl(q, self.n["delta"], "f32", q.dims[:-1]), Argument(self.n["delta"], "backward")),
        ]
        if broadcast is None:
            outs = (self.decl(k, self.n["dk"]), self.decl(v, self.n["dv"]))
        else:  # one per element of the broadcast dimension, in f32 until they are summed
            dims, suffix = (*q.dims[:-2], *k.dims[-2:]), broadcast.lower()
            names = (
                self.namer.claim_spec(f"{self.n['dk']}_{suffix}"),
                self.namer.claim_spec(f"{self.n['dv']}_{suffix}"),
            )
            outs = tuple(self.decl(d, name, "f32", dims) for d, name in zip((k, v), names))
        at = self.position
        transposed = ir.Binary(
            "@", ir.Name(k.name, at), ir.Attribute(ir.Name(q.name, at), "T", at, at), form.product.position, at
        )
        transposed_do = ir.Attribute(self.name("do"), "T", at, at)
        body = [
            *self._score_lets(),
            ir.Let(self.n["p"], b.call("exp", b.op(self.name("s"), "-", self.name("lse"))), at),
            ir.Assign(outs[1].name, b.op(self.cast(self.name("p"), v.dtype), "@", self.name("do")), at),
            ir.Let(self.n["dp"], b.op(ir.Name(v.name, at), "@", transposed_do), at),
            ir.Let(self.n["ds"], b.mul(self.name("p"), b.op(self.name("dp"), "-", self.name("delta"))), at),
        ]
        lets, cotangents = self._bound_cotangents(extras)
        body.extend(lets)
        dk = b.op(self.cast(cotangents[_PRODUCT], q.dtype), "@", ir.Name(q.name, at))
        body.append(ir.Assign(outs[0].name, dk, form.product.position))
        extra_outs, extra_assigns, extra_results = self._extra_outputs(extras, cotangents, q.dims[-2])
        body.extend(extra_assigns)
        body = [replaced(s, {form.product: transposed}) for s in body]
        what = "dk, dv" + "".join(f", {o.name}" for o in extra_outs) + ": one pass over S"
        what += f" (per element of {broadcast}, summed next)" if broadcast else ""
        kernel = self._kernel("dkdv", what, ins, (*outs, *extra_outs), body)
        results = (k.name, v.name) if broadcast is None else tuple(o.name for o in outs)
        return Step(kernel, tuple(a for _, a in ins), (*results, *extra_results))

    def _summed(self, dim: str, dkdv: Step) -> Step:
        """dk, dv summed over the dimension of q that k and v are broadcast over."""
        form, b = self.form, self.b
        ins = [(d, Argument(d.name, "backward")) for d in dkdv.kernel.outputs]
        outs = (self.decl(form.k, self.n["dk"]), self.decl(form.v, self.n["dv"]))
        body = [
            ir.Assign(o.name, b.call("sum", ir.Name(i.name, self.position), self.dim(dim)), self.position)
            for (i, _), o in zip(ins, outs)
        ]
        blocks = tuple(item for item in self.checked.kernel.blocks if item.dim in form.k.dims)
        gpu_blocks = tuple(item for item in self.checked.kernel.gpu_blocks if item.dim in form.k.dims)
        kernel = self._kernel(f"over_{dim.lower()}", f"dk, dv summed over {dim}", ins, outs, body, blocks, gpu_blocks)
        return Step(kernel, tuple(a for _, a in ins), (form.k.name, form.v.name))

    def _kernel(self, suffix, what, ins, outs, body, blocks=None, gpu_blocks=None) -> ir.Kernel:
        forward = self.checked.kernel
        read = {n.id for s in body for n in ir.walk(s.value) if isinstance(n, ir.Name)}
        return ir.Kernel(
            name=f"{forward.name}_backward_{suffix}",
            position=forward.position,
            doc=(f"The backward pass of `{forward.name}` (FlashAttention-2): {what}.",),
            inputs=tuple(d for d, _ in ins),
            outputs=tuple(outs),
            params=tuple(p for p in forward.params if p.name in read),
            body=tuple(body),
            blocks=forward.blocks if blocks is None else blocks,
            accumulates=(),
            gpu_blocks=forward.gpu_blocks if gpu_blocks is None else gpu_blocks,
            gpu_options=forward.gpu_options,
        )

    # -- ds taken back through the score expression

    def _bound_cotangents(self, extras: list[_Extra]) -> tuple[list[ir.Let], dict[str, ir.Expr]]:
        """The cotangents of `q @ k.T` (under `_PRODUCT`) and of the `extras` from that of
        the scores (`ds`), by one walk back through the score expression; and the lets its
        derivative rules bind (the same names in both kernels)."""
        self.bound, self.bound_names = [], Namer(self.taken)
        return self.bound, self._walk_back(self.name("ds"), {_PRODUCT, *(e.decl.name for e in extras)})

    def _walk_back(self, g: ir.Name, targets: set[str]) -> dict[str, ir.Expr]:
        """The cotangents of `targets` where `g` is the scores' (of those it reaches),
        binding lets in `self.bound` (g_1, g_2, ...)."""
        self.targets, self.bound_prefix, self.bound_count = targets, g.id, 0
        found: dict[str, list[ir.Expr]] = {target: [] for target in targets}
        for target, contribution in self._back(self.form.score, g):
            found[target].append(contribution)
        return {target: sum_of(terms) for target, terms in found.items() if terms}

    def _target(self, node: ir.Expr) -> str | None:
        """What `node` is the cotangent of, where it is a wanted one: the product or an extra input."""
        if node == self.form.product:
            return _PRODUCT if _PRODUCT in self.targets else None
        return node.id if isinstance(node, ir.Name) and node.id in self.targets else None

    def _back(self, node: ir.Expr, g: ir.Expr) -> list[tuple[str, ir.Expr]]:
        """The contributions of `g`, the cotangent of `node`, to the wanted cotangents."""
        target = self._target(node)
        if target is not None:
            return [(target, g)]
        if isinstance(node, ir.Name):
            return self._back(self.lets[node.id], g) if node.id in self.lets else []
        if not any(self._target(n) is not None for n in self._walk(node)):
            return []
        args, rule = arguments_and_rule(node)
        position = node.position
        g_holder = ir.Name("\0g", position)

        def bind(expr: ir.Expr) -> ir.Expr:
            self.bound_count += 1
            name = self.bound_names.claim_spec(f"{self.bound_prefix}_{self.bound_count}")
            self.bound.append(ir.Let(name, substitute(expr, {g_holder: g}), position))
            return ir.Name(name, position)

        values = tuple(self._value(a) for a in args)
        parts = rule(Builder(position, bind), values, self._value(node), g_holder)
        if (
            not isinstance(g, (ir.Name, ir.Number))
            and sum(n == g_holder for p in parts if p is not None for n in ir.walk(p)) > 1
        ):
            g = bind(g)
        types = self.checked.types
        found = []
        for arg, part in zip(args, parts):
            if part is None:
                continue
            part = converted(substitute(part, {g_holder: g}), types[node].dtype.name, types[arg].dtype.name)
            found.extend(self._back(arg, part))
        return found

    def _value(self, node: ir.Expr) -> ir.Expr:
        """A forward value as the backward kernel reads it: a let's by its name."""
        return ir.Name(self.let_names[node], node.position) if node in self.let_names else node

    def _walk(self, node: ir.Expr):
        """The nodes under `node`, through the lets it reads."""
        for n in ir.walk(node):
            yield n
            if isinstance(n, ir.Name) and n.id in self.lets:
                yield from self._walk(self.lets[n.id])
