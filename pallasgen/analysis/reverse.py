"""Reverse mode over an elementwise kernel's statements: its backward kernels, derived
as ordinary `ir.Kernel`s that go through the same checks, lowering and backends as any other.

An elementwise kernel (no product, reduction, index() or size()) is differentiated
here. Its backward kernel takes the inputs and one cotangent per float output, and
recomputes from the inputs the forward values it needs (the forward pass saves nothing
else); it then takes the cotangents through each statement's derivative rules
(analysis.derivatives), the last statement first, and returns one cotangent per float
input. An input broadcast over a dimension (a bias [N] of [M, N]) gets its cotangent
summed over that dimension, by a second backward kernel (one per dimension summed):
one kernel cannot hold both layouts. Every node of a derived kernel has the position of
the forward node it comes from, so its diagnostics point at the spec.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from pallasgen.analysis.backward import Argument, Derived, Step, is_float
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.derivatives import Builder, operator_rule
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import Namer
from pallasgen.frontend import ir


def derive(checked: CheckedKernel) -> Derived | str:
    """The backward kernels of an elementwise kernel, or what it has that they are not
    generated for yet."""
    not_yet = not_generated_yet(checked)
    if not_yet:
        return not_yet
    kernel = checked.kernel
    layout = checked.space.layout
    summed = {d.name: [dim for dim in layout if dim not in d.dims] for d in kernel.inputs if is_float(d)}
    reverse = Reverse(checked)
    groups: dict[str, list[ir.ArrayDecl]] = defaultdict(list)
    for decl in kernel.inputs:
        if decl.name in reverse.cotangents:
            groups["".join(summed[decl.name])].append(decl)
    steps = []
    for dim, decls in groups.items():
        name = f"{kernel.name}_backward" + (f"_over_{dim.lower()}" if dim else "")
        derived, arguments = reverse.kernel(name, decls, dim)
        steps.append(Step(derived, arguments, tuple(d.name for d in decls)))
    return Derived(tuple(steps), recomputed=reverse.recomputed_names([s.kernel for s in steps]))


def not_generated_yet(checked: CheckedKernel) -> str | None:
    """What the kernel has that backward kernels are not generated for yet (None: they
    are): anything but an elementwise body whose outputs have all its dimensions and
    whose float inputs are broadcast over one dimension at most."""
    if checked.product is not None or checked.fused is not None:
        return "a matrix product"
    for node in ir.walk(*(s.value for s in checked.kernel.body)):
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].reducer:
            return "a reduction"
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing in ("index", "size"):
            return "index() or size()"
    layout = checked.space.layout
    if any(o.dims != layout for o in checked.kernel.outputs):
        return "an output of fewer dimensions than the kernel's"
    for decl in checked.kernel.inputs:
        if decl.dims != tuple(dim for dim in layout if dim in decl.dims):
            return "an input whose dimensions are in another order than the kernel's"
        if is_float(decl) and len(layout) - len(decl.dims) > 1:
            return "an input broadcast over two dimensions"
    return None


class Reverse:
    """Reverse mode over one elementwise kernel's statements.

    `cotangents` maps each float input that a float output depends on to its cotangent
    (the sum of its contributions); `statements` are the lets that compute the
    cotangents of the kernel's lets and of the parts of expressions that several rules
    read. The forward values that rules read are named in `bound` and recomputed first
    (see `recomputation`).

    Every cotangent is taken per element of the kernel's layout (the outputs all have
    it): an input broadcast over a dimension sums its contributions over it afterwards.
    """

    def __init__(self, checked: CheckedKernel):
        self.checked = checked
        kernel = checked.kernel
        self.types = checked.types
        self.lets = {s.name: s for s in kernel.body if isinstance(s, ir.Let)}
        self.let_values = {s.value: s.name for s in kernel.body if isinstance(s, ir.Let)}
        self.inputs = {d.name: d for d in kernel.inputs}
        forward = [*self.inputs, *self.lets, *(p.name for p in kernel.params), *checked.dims, *FUNCTIONS]
        self.namer = Namer(forward)
        self.seeds = {o.name: self.namer.claim(f"d{o.name}") for o in kernel.outputs if is_float(o)}
        self.bound: dict[ir.Expr, str] = {}
        self.statements: list[ir.Let] = []
        self.contributions: dict[str, list[ir.Expr]] = defaultdict(list)
        self.cotangents: dict[str, ir.Expr] = {}
        self.naming = ""  # the forward statement being differentiated: it names temporaries
        self.counts: dict[str, int] = defaultdict(int)
        self.temporaries: dict[str, tuple[str, int]] = {}  # name -> (its prefix, its number)
        for statement in reversed(kernel.body):
            self._statement(statement)
        for name, contributions in self.contributions.items():
            if name in self.inputs:
                self.cotangents[name] = _sum(contributions)

    def _statement(self, statement: ir.Statement) -> None:
        self.naming = statement.name if isinstance(statement, ir.Let) else statement.target
        if isinstance(statement, ir.Assign):
            if statement.target not in self.seeds:
                return
            seed = ir.Name(self.seeds[statement.target], statement.position)
            out = next(o for o in self.checked.kernel.outputs if o.name == statement.target)
            self._backprop(statement.value, _converted(seed, out.dtype, self.types[statement.value].dtype.name))
        elif self.contributions.get(statement.name):
            total = _sum(self.contributions[statement.name])
            if not isinstance(total, ir.Name):  # else it is named already
                name = self.namer.claim(f"d{statement.name}")
                self.statements.append(ir.Let(name, total, statement.position))
                total = ir.Name(name, statement.position)
            self._backprop(statement.value, total)

    def _differentiable(self, node: ir.Expr) -> bool:
        value_type = self.types[node]
        return value_type.dtype.is_float and not value_type.weak

    def _backprop(self, node: ir.Expr, g: ir.Expr) -> None:
        """Takes `g`, the cotangent of `node`, to the inputs and lets it reads."""
        if not self._differentiable(node):
            return
        if isinstance(node, ir.Name):
            self.contributions[node.id].append(g)
            return
        args, rule = _arguments_and_rule(node)
        position = node.position
        holders = tuple(ir.Name(f"\0{i}", position) for i in range(len(args)))
        result_holder, g_holder = ir.Name("\0result", position), ir.Name("\0g", position)
        pending: list[tuple[str, ir.Expr]] = []

        def bind(expr: ir.Expr) -> ir.Expr:
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
            self.statements.append(ir.Let(name, g, position))
            g = ir.Name(name, position)
        mapping[g_holder] = g
        self.statements.extend(ir.Let(name, _substitute(e, mapping), position) for name, e in pending)
        for arg, part in used:
            part = _converted(_substitute(part, mapping), self.types[node].dtype.name, self.types[arg].dtype.name)
            self._backprop(arg, part)

    def _claim_temporary(self, cotangent: bool = False) -> str:
        """A name for a value of the statement being differentiated: `h_1`, or `dh_1` for a cotangent."""
        prefix = f"d{self.naming}" if cotangent else self.naming
        self.counts[prefix] += 1
        name = self.namer.claim(f"{prefix}_{self.counts[prefix]}")
        self.temporaries[name] = (prefix, self.counts[prefix])
        return name

    def _value(self, node: ir.Expr) -> ir.Expr:
        """A forward value that a rule reads, as the backward kernel names it: a leaf as it
        is, a let's value by the let's name, any other by a name of its own (recomputed)."""
        if isinstance(node, (ir.Name, ir.Number, ir.Boolean)):
            return node
        if node in self.let_values:
            return ir.Name(self.let_values[node], node.position)
        if node not in self.bound:
            outputs = {s.value: s.target for s in self.checked.kernel.body if isinstance(s, ir.Assign)}
            self.bound[node] = self.namer.claim(outputs[node]) if node in outputs else self._claim_temporary()
        return ir.Name(self.bound[node], node.position)

    def recomputation(self) -> list[ir.Let]:
        """The forward values the rules read, computed again from the inputs, in the
        forward order: each let of the kernel, and each value named in `bound`, with the
        values named before it read by their names."""
        found = []
        for statement in self.checked.kernel.body:
            for node in _post_order(statement.value):
                if node in self.bound:
                    inner = {n: ir.Name(v, n.position) for n, v in self.bound.items() if n != node}
                    found.append(ir.Let(self.bound[node], _substitute(node, inner), node.position))
            if isinstance(statement, ir.Let):
                named = {n: ir.Name(v, n.position) for n, v in self.bound.items()}
                found.append(ir.Let(statement.name, _substitute(statement.value, named), statement.position))
        return found

    def kernel(self, name: str, decls: list[ir.ArrayDecl], summed: str) -> tuple[ir.Kernel, tuple[Argument, ...]]:
        """The backward kernel that gives the cotangents of `decls` (summed over the
        dimension `summed`, if any), and the arrays it takes."""
        forward = self.checked.kernel
        outs = []
        assigns = []
        for decl in decls:
            out = self.namer.claim(f"d{decl.name}")
            outs.append(dataclasses.replace(decl, name=out))
            value = self.cotangents[decl.name]
            if summed:
                dim = ir.Name(summed, decl.position)
                value = ir.Call("sum", (value, dim), decl.position, decl.position)
            assigns.append(ir.Assign(out, value, decl.position))
        body = self._numbered(_live([*self.recomputation(), *self.statements], assigns))
        read = {n.id for s in body for n in ir.walk(s.value) if isinstance(n, ir.Name)}
        arguments, ins = [], []
        for decl in forward.inputs:
            if decl.name in read:
                arguments.append(Argument(decl.name, "input"))
                ins.append(decl)
        for out in forward.outputs:
            if out.name in self.seeds and self.seeds[out.name] in read:
                arguments.append(Argument(out.name, "cotangent"))
                ins.append(dataclasses.replace(out, name=self.seeds[out.name]))
        outputs = ", ".join(o.name for o in outs)
        cotangents = ", ".join(self.seeds[o.name] for o in forward.outputs if o.name in self.seeds)
        doc = (
            f"The backward pass of `{forward.name}`, generated from its spec: the cotangents {outputs}",
            f"of its inputs from {cotangents}, those of its outputs"
            + (f", summed over {summed} (the inputs are broadcast over it)." if summed else "."),
        )
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


def _converted(g: ir.Expr, dtype: str, to: str) -> ir.Expr:
    """`g`, a cotangent in `dtype`, converted to `to` (as JAX converts a cotangent back
    through the conversion that promoted its value)."""
    return g if dtype == to else ir.Call(to, (g,), g.position, g.position)


def _arguments_and_rule(node: ir.Expr):
    if isinstance(node, ir.Call):
        return node.args, FUNCTIONS[node.func].derivative
    if isinstance(node, ir.Unary):
        return (node.operand,), operator_rule(node)
    return (node.left, node.right), operator_rule(node)


def _sum(terms: list[ir.Expr]) -> ir.Expr:
    total = terms[0]
    for term in terms[1:]:
        total = ir.Binary("+", total, term, term.position, term.position)
    return total


def _substitute(node: ir.Expr, mapping: dict[ir.Expr, ir.Expr]) -> ir.Expr:
    """`node` with each subexpression in `mapping` replaced."""
    if node in mapping:
        return mapping[node]
    if isinstance(node, ir.Unary):
        return dataclasses.replace(node, operand=_substitute(node.operand, mapping))
    if isinstance(node, ir.Binary):
        return dataclasses.replace(node, left=_substitute(node.left, mapping), right=_substitute(node.right, mapping))
    if isinstance(node, ir.Call):
        return dataclasses.replace(node, args=tuple(_substitute(a, mapping) for a in node.args))
    return node


def replaced(statement: ir.Statement, mapping: dict[ir.Expr, ir.Expr]) -> ir.Statement:
    """The statement with each subexpression in `mapping` replaced."""
    return dataclasses.replace(statement, value=_substitute(statement.value, mapping))


def _renamed(statement: ir.Statement, renamed: dict[str, str]) -> ir.Statement:
    """The statement with the names in `renamed` replaced, where it defines and reads them."""
    reads = [n for n in ir.walk(statement.value) if isinstance(n, ir.Name) and n.id in renamed]
    value = _substitute(statement.value, {n: ir.Name(renamed[n.id], n.position) for n in reads})
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
