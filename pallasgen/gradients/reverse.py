"""Reverse mode over a kernel's statements: its backward kernels, derived as ordinary
`ir.Kernel`s that go through the same checks, lowering and backends as any other.

A kernel without a matrix product is differentiated here. Its backward kernels take
the inputs and one cotangent per float output; they take the cotangents through each
statement's derivative rules (analysis.derivatives), the last statement first, and
return one cotangent per float input. Every node of a derived kernel has the position
of the forward node it comes from, so its diagnostics point at the spec.

Cotangents have dimensions: that of a value of fewer dimensions than the kernel (an
output `mu: f32[M]`, a reduction's result) broadcasts by name where the rules read it,
and a contribution to such a value is summed over the dimensions it lacks. A sum over
a dimension a block holds whole is computed in the kernel. One over a blocked dimension
is left to a second backward kernel that sums the input's cotangent over it (one per
dimension summed: one kernel cannot hold both layouts), so an input broadcast over a
blocked dimension (a bias [N] of [M, N]) gets it there; where a reduction's rule needs
its cotangent summed over a blocked dimension first (`z * sum(x, N)` with M blocked),
an earlier backward kernel sums it, and the later ones read its result.

Reductions: `sum` broadcasts the cotangent, `mean` divides it by size(N), `logsumexp`
gives g * exp(x - lse), `softmax` y * (g - sum(g * y, N)). `max` and `min` give the
whole cotangent to the FIRST position of the extremum (argmax/argmin), where JAX splits
it evenly among ties: the two agree wherever the extremum is unique. `argmax`, `argmin`,
comparisons, casts to integers, index() and size() carry none.

Saved or recomputed, by cost: a reduction's value that the rules read (a row's max,
log-sum-exp or mean square, the argmax beside a max) is saved by the forward pass as a
residual: it is N times smaller than the values it reduces, while recomputing it would
take the backward kernel a reduction over N (a pass of its own where N is blocked, so
that there the backward kernels are elementwise over N). Every other forward value the rules read is computed again in the
backward kernel from its inputs (a pass over data it reads anyway). An output that the
body reads by name, or of fewer dimensions than the kernel (row statistics), is read as
the forward pass saved it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from pallasgen.gradients.backward import Argument, Derived, Residual, Step, is_float
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.derivatives import Builder, operator_rule
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.hardware import TPU_LANES, TPU_SUBLANES
from pallasgen.analysis.names import Namer
from pallasgen.frontend import ir


class NotYet(Exception):
    """Raised with what a kernel has that its backward kernels are not generated for yet."""


def derive(checked: CheckedKernel, saved_outputs=()) -> Derived | str:
    """The backward kernels of a kernel without a matrix product, or what it has that
    they are not generated for yet; the rules read the outputs named in `saved_outputs`
    as the forward pass saved them (see Reverse)."""
    not_yet = not_generated_yet(checked)
    if not_yet:
        return not_yet
    try:
        reverse = Reverse(checked, saved_outputs)
        groups: dict[str, list[ir.ArrayDecl]] = defaultdict(list)
        for decl in checked.kernel.inputs:
            if decl.name in reverse.contributions:
                groups["".join(reverse.summed(decl.name))].append(decl)
        steps = reverse.intermediate_steps()
        for dims, decls in groups.items():
            if len(dims) == 2:
                steps += _summed_twice(reverse, checked.kernel, decls, dims)
                continue
            name = f"{checked.kernel.name}_backward" + (f"_over_{dims.lower()}" if dims else "")
            derived, arguments = reverse.kernel(name, decls, dims)
            steps.append(Step(derived, arguments, tuple(d.name for d in decls)))
    except NotYet as error:
        return str(error)
    kernels = [s.kernel for s in steps]
    return Derived(tuple(steps), reverse.residuals(kernels), reverse.recomputed_names(kernels))


def _summed_twice(reverse: Reverse, forward: ir.Kernel, decls, dims: str) -> list[Step]:
    """The steps giving the cotangents of inputs broadcast over two blocked dimensions:
    one kernel sums them over one dimension, keeping the other in f32 partial sums, and
    one more sums those. Which is kept: the first whose block tiles the partial sums (an
    RMS norm's `w: [D]` over [B, S, D], B and S in blocks of 1 and 32, keeps S: [B, D]
    would take one row of B a block)."""
    blocks = {b.dim: b.size for b in forward.blocks}
    for kept, summed in (dims, dims[::-1]):
        partial = [tuple(d for d in reverse.layout if d in decl.dims or d == kept) for decl in decls]
        if all(_tiles(partial_dims, kept, blocks[kept]) for partial_dims in partial):
            derived, arguments = reverse.kernel(f"{forward.name}_backward_over_{summed.lower()}", decls, summed, kept)
            partials = tuple(o.name for o in derived.outputs)
            outs = [reverse.namer.claim_spec(f"d{decl.name}") for decl in decls]
            return [Step(derived, arguments, partials), summing_step(forward, derived.outputs, decls, outs, (kept,))]
    raise NotYet("an input broadcast over two blocked dimensions whose partial sums no block tiles")


def _tiles(dims: tuple[str, ...], dim: str, block: int) -> bool:
    """Whether a block of `block` along `dim` tiles f32 arrays of `dims` on the TPU: a
    multiple of the sublanes second-to-last, of the lanes last, any size before."""
    position = len(dims) - dims.index(dim)
    return position > 2 or block % (TPU_SUBLANES if position == 2 else TPU_LANES) == 0


def summing_step(forward: ir.Kernel, partials, decls, names: list[str], dims: tuple[str, ...]) -> Step:
    """The kernel that sums the partial cotangents of `decls` over `dims`, dimensions the
    inputs are broadcast over that a kernel computing them blocks (an input [S, D] of a
    kernel with B and H blocked: summed over H by the kernel that computes them, over B
    here): the inputs' cotangents, in their dtypes, under `names`. It takes the forward
    kernel's blocks of its arrays' dimensions, and of `dims` only the largest, which it
    sweeps (the longest, as a rule: an ALiBi slope's partial sums [B, H, S] are swept
    along S in blocks of 128, not along B in blocks of 1 with all of S at once); on the
    TPU only those that tile its arrays (analysis.hardware's rule)."""
    outs, body = [], []
    for partial, decl, name in zip(partials, decls, names):
        position = decl.position
        value = ir.Name(partial.name, position)
        for dim in dims:
            value = ir.Call("sum", (value, ir.Name(dim, position)), position, position)
        if decl.dtype != partial.dtype:
            value = ir.Call(decl.dtype, (value,), position, position)
        outs.append(dataclasses.replace(decl, name=name))
        body.append(ir.Assign(name, value, position))
    arrays = [*partials, *outs]

    def blocked(items, tpu: bool):
        fit = [i for i in items if any(i.dim in a.dims for a in arrays)]
        if tpu:
            fit = [i for i in fit if all(_tiles(a.dims, i.dim, i.size) for a in arrays if i.dim in a.dims)]
        swept = max((i for i in fit if i.dim in dims), key=lambda i: i.size, default=None)
        return tuple(i for i in fit if i.dim not in dims or i is swept)

    kernel = ir.Kernel(
        name=f"{forward.name}_backward_over_{'_'.join(d.lower() for d in dims)}",
        position=forward.position,
        doc=(
            f"The backward pass of `{forward.name}`: the cotangents {', '.join(o.name for o in outs)} of its inputs,"
            f" {', '.join(p.name for p in partials)} summed over {', '.join(dims)} (the inputs are broadcast over"
            f" {'it' if len(dims) == 1 else 'them'}).",
        ),
        inputs=tuple(partials),
        outputs=tuple(outs),
        params=(),
        body=tuple(body),
        blocks=blocked(forward.blocks, tpu=True),
        accumulates=(),
        gpu_blocks=blocked(forward.gpu_blocks, tpu=False),
        gpu_options=forward.gpu_options,
    )
    return Step(kernel, tuple(Argument(p.name, "backward") for p in partials), tuple(d.name for d in decls))


def not_generated_yet(checked: CheckedKernel) -> str | None:
    """What the kernel has that backward kernels are not generated for yet (None: they
    are): a product (the derivations before this one take every kernel with products),
    an input whose dimensions are in another order than the kernel's, or one broadcast
    over three blocked dimensions. (Reverse raises NotYet where a reduction's cotangent
    would need sums over two blocked dimensions first.)"""
    if checked.has_products:
        return "a matrix product"
    layout = checked.space.layout
    for decl in checked.kernel.inputs:
        if decl.dims != tuple(dim for dim in layout if dim in decl.dims):
            return "an input whose dimensions are in another order than the kernel's"
        if is_float(decl) and len([d for d in layout if d not in decl.dims and d in checked.blocks]) > 2:
            return "an input broadcast over three blocked dimensions"
    return None


class Reverse:
    """Reverse mode over one kernel's statements.

    `contributions` maps each float input that a float output depends on to the terms
    of its cotangent; `statements` are the lets that compute the cotangents of the
    kernel's lets and of the parts of expressions that several rules read. The forward
    values that rules read are named in `bound` and recomputed first (see
    `recomputation`), or read from the forward pass: residuals (`saved`) and outputs.

    A cotangent has at most the dimensions of its value, and the blocked dimensions it
    still has to be summed over (`summed`): the rules are linear in it and elementwise,
    so the sum can wait until a rule reduces or the input's cotangent is written.
    """

    def __init__(self, checked: CheckedKernel, saved_outputs=()):
        self.checked = checked
        kernel = checked.kernel
        self.types = checked.types
        self.layout = checked.space.layout
        self.whole = {dim for dim in self.layout if dim not in checked.blocks}  # a block holds all of it
        self.lets = {s.name: s for s in kernel.body if isinstance(s, ir.Let)}
        self.let_values = {s.value: s.name for s in kernel.body if isinstance(s, ir.Let)}
        self.inputs = {d.name: d for d in kernel.inputs}
        self.outputs = {d.name: d for d in kernel.outputs}
        read = {n.id for s in kernel.body for n in ir.walk(s.value) if isinstance(n, ir.Name)}
        # outputs the backward kernels read as the forward pass saved them
        self.saved_outputs = {o.name for o in kernel.outputs if o.name in read or o.dims != self.layout}
        self.saved_outputs |= set(saved_outputs)  # what a caller knows the forward pass saves
        forward = [*self.inputs, *self.lets, *(p.name for p in kernel.params), *checked.dims, *FUNCTIONS]
        self.namer = Namer([*forward, *self.saved_outputs])
        self.seeds = {o.name: self.namer.claim_spec(f"d{o.name}") for o in kernel.outputs if is_float(o)}
        self.dims_of: dict[str, tuple[str, ...]] = {
            **{d.name: d.dims for d in (*kernel.inputs, *kernel.outputs)},
            **{s.name: self.types[s.value].dims for s in self.lets.values()},
            **{self.seeds[o]: self.outputs[o].dims for o in self.seeds},
            **{p.name: () for p in kernel.params},
        }
        self.bound: dict[ir.Expr, str] = {}
        self.saved: dict[ir.Expr, Residual] = {}  # forward value -> the residual that saves it
        self.statements: list[ir.Let] = []
        self.contributions: dict[str, list[ir.Expr]] = defaultdict(list)
        self.naming = ""  # the forward statement being differentiated: it names temporaries
        self.counts: dict[str, int] = defaultdict(int)
        self.temporaries: dict[str, tuple[str, int]] = {}  # name -> (its prefix, its number)
        # cotangents summed over a blocked dimension by earlier backward kernels: each
        # one's declaration as they give it, its value, the dimension summed
        self.intermediates: list[tuple[ir.ArrayDecl, ir.Expr, str]] = []
        for statement in reversed(kernel.body):
            self._statement(statement)
        # each float input that a float output depends on -> its cotangent, the sum of its terms
        self.cotangents = {name: sum_of(terms) for name, terms in self.contributions.items() if name in self.inputs}

    def _statement(self, statement: ir.Statement) -> None:
        self.naming = statement.name if isinstance(statement, ir.Let) else statement.target
        terms = list(self.contributions.pop(self.naming, ()))
        value_dtype = self.types[statement.value].dtype.name
        if isinstance(statement, ir.Assign):
            if statement.target in self.seeds:
                seed = ir.Name(self.seeds[statement.target], statement.position)
                terms.insert(0, seed)
            out = self.outputs[statement.target]
            terms = [converted(t, out.dtype, value_dtype) for t in terms]
        by_summed: dict[tuple[str, ...], list[ir.Expr]] = defaultdict(list)
        for term in terms:  # terms still to be summed over other dimensions are not added to the rest
            by_summed[self._extra(term, statement.value)].append(term)
        for group in by_summed.values():
            total = sum_of(group)
            if not isinstance(total, ir.Name) and (isinstance(statement, ir.Let) or len(group) > 1):
                name = self.namer.claim(f"d{self.naming}", f"d{self.naming}_total")
                self._let(name, total, statement.position)
                total = ir.Name(name, statement.position)
            self._backprop(statement.value, total)

    def _let(self, name: str, value: ir.Expr, position) -> None:
        self.dims_of[name] = self.dims(value)
        self.statements.append(ir.Let(name, value, position))

    def _differentiable(self, node: ir.Expr) -> bool:
        value_type = self.types[node]
        return value_type.dtype.is_float and not value_type.weak

    def _extra(self, g: ir.Expr, node: ir.Expr) -> tuple[str, ...]:
        """The dimensions of cotangent `g` that `node`'s value lacks."""
        return tuple(d for d in self.dims(g) if d not in self.types[node].dims)

    def _backprop(self, node: ir.Expr, g: ir.Expr) -> None:
        """Takes `g`, the cotangent of `node`, to the inputs and lets it reads."""
        if not self._differentiable(node):
            return
        if isinstance(node, ir.Name):
            self.contributions[node.id].append(g)
            return
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].reducer and self._extra(g, node):
            g = self._summed_first(g, node)
        args, rule = arguments_and_rule(node)
        position = node.position
        holders = tuple(ir.Name(f"\0{i}", position) for i in range(len(args)))
        result_holder, g_holder = ir.Name("\0result", position), ir.Name("\0g", position)
        pending: list[tuple[str, ir.Expr]] = []

        def bind(expr: ir.Expr) -> ir.Expr:
            forward = substitute(expr, {**dict(zip(holders, args)), result_holder: node})
            if self._saved_reduction(forward) and g_holder not in ir.walk(expr):  # a forward value
                return ir.Name(self._residual(forward, new=True), position)
            pending.append((self._claim_temporary(), expr))
            return ir.Name(pending[-1][0], position)

        parts = rule(Builder(position, bind), holders, result_holder, g_holder)
        used = [(arg, part) for arg, part in zip(args, parts) if part is not None and self._differentiable(arg)]
        read = [n for _, e in pending for n in ir.walk(e)] + [n for _, part in used for n in ir.walk(part)]
        mapping: dict[ir.Expr, ir.Expr] = {h: self._value(a) for h, a in zip(holders, args) if h in read}
        if result_holder in read:
            mapping[result_holder] = self._value(node)
        if read.count(g_holder) > 1 and not isinstance(g, (ir.Name, ir.Number)):
            name = self._claim_temporary(cotangent=True)
            self._let(name, g, position)
            g = ir.Name(name, position)
        mapping[g_holder] = g
        for name, e in pending:
            self._let(name, substitute(e, mapping), position)
        for arg, part in used:
            part = converted(substitute(part, mapping), self.types[node].dtype.name, self.types[arg].dtype.name)
            self._backprop(arg, self._summed_where_whole(part, arg))

    def _summed_first(self, g: ir.Expr, node: ir.Call) -> ir.Expr:
        """`g`, the cotangent of the reduction `node` still to be summed over a blocked
        dimension, summed over it by an earlier backward kernel (`intermediates`): its
        result, by name. Sums over whole dimensions in `g` are taken after the one over
        the blocked dimension, at its end: the lowering gives a running sum over a
        blocked dimension of a value reduced over another the shape of the unreduced one."""
        extra = self._extra(g, node)
        if len(extra) > 1:
            raise NotYet(f"a cotangent summed over two blocked dimensions before {node.func}()")
        value_type, position = self.types[node], node.position
        name = self.namer.claim_spec(f"d{self.naming}_over_{extra[0].lower()}")
        decl = ir.ArrayDecl(
            name, value_type.dtype.name, value_type.dims, position, position, (position,) * len(value_type.dims)
        )
        whole = []  # its sums over whole dimensions, taken after the one over the blocked dimension
        while isinstance(g, ir.Call) and g.func == "sum" and g.args[1].id in self.whole:
            whole.append(g.args[1])
            g = g.args[0]
        total = ir.Call("sum", (g, ir.Name(extra[0], position)), position, position)
        for dim in reversed(whole):
            total = ir.Call("sum", (total, dim), position, position)
        self.intermediates.append((decl, converted(total, "f32", decl.dtype), extra[0]))
        self.dims_of[name] = value_type.dims
        return ir.Name(name, position)

    def _summed_where_whole(self, g: ir.Expr, node: ir.Expr) -> ir.Expr:
        """`g`, a contribution to `node`'s cotangent, summed over the dimensions it has and
        `node` lacks that a block holds whole; those blocked are summed later."""
        for dim in self._extra(g, node):
            if dim in self.whole:
                g = ir.Call("sum", (g, ir.Name(dim, g.position)), g.position, g.position)
        return g

    @staticmethod
    def _saved_reduction(node: ir.Expr) -> bool:
        """Whether `node` is a reduction (its result lacks the dimension it reduces): the
        forward pass saves it rather than the backward kernels compute it again."""
        return isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "reduce"

    def _residual(self, node: ir.Call, new: bool = False) -> str:
        """The name of the residual that saves the forward value `node` (a reduction): a
        value of the body, or `new`, one the body does not compute."""
        if node not in self.saved:
            func, dim = node.func, node.args[1].id
            name = self.namer.claim_spec(f"{func}_{dim.lower()}")
            dtype, dims = self._reduction_type(node) if new else ("", ())
            self.saved[node] = Residual(name, node, dtype, dims)
            self.dims_of[name] = dims if new else self.types[node].dims
        return self.saved[node].name

    def _reduction_type(self, node: ir.Call) -> tuple[str, tuple[str, ...]]:
        """The dtype and dimensions of a reduction of forward values that the body does not compute."""
        reducer = FUNCTIONS[node.func].reducer
        value = self.types[node.args[0]]
        dims = tuple(d for d in value.dims if d != node.args[1].id)
        wide = "f32" if value.dtype.is_float else "i32"
        return {"sum": wide, "same": value.dtype.name, "f32": "f32", "i32": "i32", "bool": "bool"}[reducer.result], dims

    def _claim_temporary(self, cotangent: bool = False) -> str:
        """A name for a value of the statement being differentiated: `h_1`, or `dh_1` for a cotangent."""
        prefix = f"d{self.naming}" if cotangent else self.naming
        self.counts[prefix] += 1
        name = self.namer.claim_spec(f"{prefix}_{self.counts[prefix]}")
        self.temporaries[name] = (prefix, self.counts[prefix])
        return name

    def _value(self, node: ir.Expr) -> ir.Expr:
        """A forward value that a rule reads, as the backward kernel names it: a leaf as it
        is, a let's value by the let's name, a saved output's by the output's name, a
        reduction by its residual's, any other by a name of its own (recomputed)."""
        if isinstance(node, (ir.Name, ir.Number, ir.Boolean)):
            return node
        if node in self.let_values:
            return ir.Name(self.let_values[node], node.position)
        outputs = {s.value: s.target for s in self.checked.kernel.body if isinstance(s, ir.Assign)}
        output = self.outputs.get(outputs.get(node, ""))
        if output is not None and output.name in self.saved_outputs and output.dtype == self.types[node].dtype.name:
            return ir.Name(output.name, node.position)
        if self._saved_reduction(node):
            return ir.Name(self._residual(node), node.position)
        if node not in self.bound:
            self.bound[node] = self.namer.claim_spec(outputs[node]) if node in outputs else self._claim_temporary()
            self.dims_of[self.bound[node]] = self.types[node].dims
        return ir.Name(self.bound[node], node.position)

    def dims(self, node: ir.Expr) -> tuple[str, ...]:
        """The dimensions of a value of a backward kernel, in the kernel's order."""
        if isinstance(node, ir.Name):
            return self.dims_of[node.id]
        if isinstance(node, ir.Call):
            function = FUNCTIONS[node.func]
            if function.typing in ("index", "size"):
                return (node.args[0].id,) if function.typing == "index" else ()
            if function.reducer is not None:
                reduced = () if function.typing == "softmax" else (node.args[1].id,)
                return tuple(d for d in self.dims(node.args[0]) if d not in reduced)
        children = [
            c for c in (getattr(node, "operand", None), getattr(node, "left", None), getattr(node, "right", None)) if c
        ]
        present = {d for child in [*children, *getattr(node, "args", ())] for d in self.dims(child)}
        return tuple(d for d in self.layout if d in present)

    def summed(self, name: str) -> tuple[str, ...]:
        """The blocked dimension an input's cotangent is still to be summed over, if any."""
        extra = {d for term in self.contributions[name] for d in self.dims(term) if d not in self.inputs[name].dims}
        return tuple(d for d in self.layout if d in extra)

    def _forward(self, node: ir.Expr, named: dict[ir.Expr, str]) -> ir.Expr:
        """A forward expression as a backward kernel computes it: the values in `named` and
        the reductions (residuals) read by their names."""
        if node in named:
            return ir.Name(named[node], node.position)
        if self._saved_reduction(node):
            return ir.Name(self._residual(node), node.position)
        if isinstance(node, ir.Unary):
            return dataclasses.replace(node, operand=self._forward(node.operand, named))
        if isinstance(node, ir.Binary):
            left, right = self._forward(node.left, named), self._forward(node.right, named)
            return dataclasses.replace(node, left=left, right=right)
        if isinstance(node, ir.Call):
            return dataclasses.replace(node, args=tuple(self._forward(a, named) for a in node.args))
        return node

    def recomputation(self) -> list[ir.Let]:
        """The forward values the rules read, computed again from the inputs, in the
        forward order: each let of the kernel, and each value named in `bound`, with the
        values named before it read by their names."""
        found = []
        for statement in self.checked.kernel.body:
            for node in _post_order(statement.value):
                if node in self.bound:
                    inner = {n: v for n, v in self.bound.items() if n != node}
                    found.append(ir.Let(self.bound[node], self._forward(node, inner), node.position))
            if isinstance(statement, ir.Let):
                found.append(ir.Let(statement.name, self._forward(statement.value, self.bound), statement.position))
        return found

    def kernel(
        self, name: str, decls: list[ir.ArrayDecl], summed: str, kept: str = ""
    ) -> tuple[ir.Kernel, tuple[Argument, ...]]:
        """The backward kernel that gives the cotangents of `decls` (summed over the
        dimension `summed`, if any), and the arrays it takes; with `kept`, a blocked
        dimension they are to be summed over too, partial cotangents in f32 that keep it
        (`dcos_b`: a later kernel sums them over B)."""
        outs = []
        assigns = []
        for decl in decls:
            terms = self.contributions[decl.name]
            if kept and any({kept, summed} - set(self.dims(t)) for t in terms):
                raise NotYet("an input broadcast over two blocked dimensions that only some of its uses have")
            if kept:
                out = self.namer.claim_spec(f"d{decl.name}_{kept.lower()}")
                dims = tuple(d for d in self.layout if d in decl.dims or d == kept)
                position = decl.position
                outs.append(ir.ArrayDecl(out, "f32", dims, position, decl.dtype_position, (position,) * len(dims)))
            else:
                out = self.namer.claim_spec(f"d{decl.name}")
                outs.append(dataclasses.replace(decl, name=out))
            with_dim = [t for t in terms if summed and summed in self.dims(t)]
            rest = [t for t in terms if t not in with_dim]
            dim = ir.Name(summed, decl.position)
            over = [ir.Call("sum", (sum_of(with_dim), dim), decl.position, decl.position)] if with_dim else []
            value = sum_of([*over, *([sum_of(rest)] if rest else [])])
            assigns.append(ir.Assign(out, value, decl.position))
        forward = self.checked.kernel
        cotangents = ", ".join(self.seeds[o.name] for o in forward.outputs if o.name in self.seeds)
        doc = (
            f"The backward pass of `{forward.name}`: the cotangents {', '.join(o.name for o in outs)} of its inputs,"
            f" from {cotangents}, those of its outputs"
            + (f", summed over {summed} (the inputs are broadcast over it)." if summed else "."),
        )
        return self._kernel(name, outs, assigns, doc, decls)

    def intermediate_steps(self) -> list[Step]:
        """The backward kernels that sum cotangents over a blocked dimension for the others."""
        steps = []
        for decl, value, dim in self.intermediates:
            doc = (
                f"Part of the backward pass of `{self.checked.kernel.name}`, generated from its spec:",
                f"{decl.name}, a cotangent summed over {dim}, which the next backward kernels read.",
            )
            name = f"{self.checked.kernel.name}_backward_{decl.name}"
            derived, arguments = self._kernel(name, [decl], [ir.Assign(decl.name, value, decl.position)], doc, [])
            steps.append(Step(derived, arguments, (decl.name,)))
        return steps

    def _kernel(self, name, outs, assigns, doc, decls) -> tuple[ir.Kernel, tuple[Argument, ...]]:
        """A backward kernel: the statements the assignments need, then them; and the arrays
        it takes (an input of `decls`, whose cotangent it gives, where no other gives a
        dimension's size)."""
        forward = self.checked.kernel
        body = self._numbered(_live([*self.recomputation(), *self.statements], assigns))
        read = {n.id for s in body for n in ir.walk(s.value) if isinstance(n, ir.Name)}
        arguments, ins = [], []
        earlier = {decl.name: decl for decl, _, _ in self.intermediates if decl not in outs}
        arrays = {*self.inputs, *self.saved_outputs, *(r.name for r in self.saved.values()), *self.seeds.values()}
        arrays |= set(earlier)
        sized = {d for name in read & arrays for d in self.dims_of[name]}
        for decl in forward.inputs:  # read, or the one that gives a dimension's size: no other has it
            if decl.name in read or decl in decls and not set(decl.dims) <= sized:
                arguments.append(Argument(decl.name, "input"))
                ins.append(decl)
                sized |= set(decl.dims)
        for out in forward.outputs:
            if out.name in self.saved_outputs and out.name in read:
                arguments.append(Argument(out.name, "output"))
                ins.append(out)
        for residual in self.saved.values():
            if residual.name in read:
                arguments.append(Argument(residual.name, "residual"))
                ins.append(self._declared(residual))
        for out in forward.outputs:
            if out.name in self.seeds and self.seeds[out.name] in read:
                arguments.append(Argument(out.name, "cotangent"))
                ins.append(dataclasses.replace(out, name=self.seeds[out.name]))
        for result, decl in earlier.items():
            if result in read:
                arguments.append(Argument(result, "backward"))
                ins.append(decl)
        derived = ir.Kernel(
            name=name,
            position=forward.position,
            doc=doc,
            inputs=tuple(ins),
            outputs=tuple(outs),
            params=tuple(p for p in forward.params if p.name in read),
            body=tuple(body),
            blocks=forward.blocks,
            accumulates=(),
            gpu_blocks=forward.gpu_blocks,
            gpu_options=forward.gpu_options,
        )
        return derived, tuple(arguments)

    def _declared(self, residual: Residual) -> ir.ArrayDecl:
        """A residual as a backward kernel's input."""
        value_type = self.types.get(residual.value)
        dtype = residual.dtype or value_type.dtype.name
        dims = residual.dims if residual.dtype else value_type.dims
        position = residual.value.position
        return ir.ArrayDecl(residual.name, dtype, dims, position, position, (position,) * len(dims))

    def residuals(self, kernels: list[ir.Kernel]) -> tuple[Residual, ...]:
        """The residuals that the backward kernels read."""
        read = {d.name for k in kernels for d in k.inputs}
        return tuple(r for r in self.saved.values() if r.name in read)

    def _numbered(self, body: list[ir.Statement]) -> list[ir.Statement]:
        """`body` with the temporaries of each statement (`h_3`, `h_1`, ...: numbered as the
        reverse pass met them) renumbered in the order the body defines them."""
        groups: dict[str, list[str]] = defaultdict(list)
        for statement in body:
            if isinstance(statement, ir.Let) and statement.name in self.temporaries:
                groups[self.temporaries[statement.name][0]].append(statement.name)
        renamed = {}
        for names in groups.values():
            renamed.update(zip(names, sorted(names, key=lambda name: self.temporaries[name][1])))
        return [_renamed(statement, renamed) for statement in body]

    def recomputed_names(self, kernels: list[ir.Kernel]) -> tuple[str, ...]:
        """The forward lets and outputs whose values the backward kernels compute again."""
        forward = {*self.lets, *(o.name for o in self.checked.kernel.outputs)}
        lets = (s.name for k in kernels for s in k.body if isinstance(s, ir.Let))
        return tuple(dict.fromkeys(name for name in lets if name in forward))


def converted(g: ir.Expr, dtype: str, to: str) -> ir.Expr:
    """`g`, a cotangent in `dtype`, converted to `to` (as JAX converts a cotangent back
    through the conversion that promoted its value)."""
    return g if dtype == to else ir.Call(to, (g,), g.position, g.position)


def arguments_and_rule(node: ir.Expr):
    """The operands of a call or operator, and its derivative rule from the function table."""
    if isinstance(node, ir.Call):
        return node.args, FUNCTIONS[node.func].derivative
    if isinstance(node, ir.Unary):
        return (node.operand,), operator_rule(node)
    return (node.left, node.right), operator_rule(node)


def sum_of(terms: list[ir.Expr]) -> ir.Expr:
    """The IR sum of `terms` (at least one), left to right."""
    total = terms[0]
    for term in terms[1:]:
        total = _add(total, term)
    return total


def _add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary("+", a, b, b.position, b.position)


def substitute(node: ir.Expr, mapping: dict[ir.Expr, ir.Expr]) -> ir.Expr:
    """`node` with each subexpression in `mapping` replaced."""
    if node in mapping:
        return mapping[node]
    if isinstance(node, ir.Unary):
        return dataclasses.replace(node, operand=substitute(node.operand, mapping))
    if isinstance(node, ir.Binary):
        return dataclasses.replace(node, left=substitute(node.left, mapping), right=substitute(node.right, mapping))
    if isinstance(node, ir.Call):
        return dataclasses.replace(node, args=tuple(substitute(a, mapping) for a in node.args))
    if isinstance(node, ir.Attribute):
        return dataclasses.replace(node, value=substitute(node.value, mapping))
    return node


def replaced(statement: ir.Statement, mapping: dict[ir.Expr, ir.Expr]) -> ir.Statement:
    """The statement with each subexpression in `mapping` replaced."""
    return dataclasses.replace(statement, value=substitute(statement.value, mapping))


def _renamed(statement: ir.Statement, renamed: dict[str, str]) -> ir.Statement:
    """The statement with the names in `renamed` replaced, where it defines and reads them."""
    reads = [n for n in ir.walk(statement.value) if isinstance(n, ir.Name) and n.id in renamed]
    value = substitute(statement.value, {n: ir.Name(renamed[n.id], n.position) for n in reads})
    if isinstance(statement, ir.Let):
        return ir.Let(renamed.get(statement.name, statement.name), value, statement.position)
    return ir.Assign(statement.target, value, statement.position)


def _post_order(node: ir.Expr):
    """Every node under `node`, each after its children."""
    children = (
        (node.operand,)
        if isinstance(node, ir.Unary)
        else (node.left, node.right) if isinstance(node, ir.Binary) else getattr(node, "args", ())
    )
    for child in children:
        yield from _post_order(child)
    yield node


def _live(lets: list[ir.Let], assigns: list[ir.Assign]) -> list[ir.Statement]:
    """The lets that the assignments read, directly or through other lets, then the assignments."""
    needed = {n.id for s in assigns for n in ir.walk(s.value) if isinstance(n, ir.Name)}
    kept = []
    for let in reversed(lets):
        if let.name in needed:
            kept.append(let)
            needed |= {n.id for n in ir.walk(let.value) if isinstance(n, ir.Name)}
    return [*reversed(kept), *assigns]
