"""Fused kernels of one product on Mosaic GPU, and nested reductions to scalars: a chain
of kernels it takes, in turn.

A product of a computed operand (`rmsnorm_matmul`: a row statistic over K, then the
product) computes that operand first, as a kernel of its own whose output is an array
in global memory; a product whose result is reduced (`matmul_softmax`: a softmax over
N) writes its result (in its accumulator's dtype) as an array, and a kernel after it
computes the rest. Each stage is a kernel as a spec would write it, checked as one, and
planned as any other (`plan`); the values between them are exactly those the fused
kernel computes (each operand in its dtype, the product in its accumulator's), at the
cost of a round trip through global memory. A rank-1 kernel whose reductions to scalars
read other reductions (`sum((x - mean(x, N))^2, N)`) computes the innermost first, each a
0-d output read by the next kernel as a 0-d input.
"""

from __future__ import annotations

import dataclasses

from pallasgen.analysis.checks import CheckedKernel, check_kernel
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.fused import is_framed
from pallasgen.analysis.infer import product_operand
from pallasgen.analysis.names import Namer
from pallasgen.gradients.reverse import substitute
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import if_residuals, tuple_code


@dataclasses.dataclass(frozen=True)
class Stage:
    checked: CheckedKernel
    intermediates: tuple[str, ...]  # its outputs that later stages read (the others are the kernel's)


def stages(checked: CheckedKernel) -> tuple[Stage, ...] | None:
    """The kernels that compute a fused kernel of one product, or a rank-1 kernel's
    reductions to scalars of other reductions' results, in turn; None for other kernels,
    or where a stage fails a check."""
    if checked.framed:
        found = _product_kernels(checked)
    elif len(checked.space.layout) == 1 and any(_nested(c) for c in _reductions(checked.kernel.body)):
        found = _scalar_kernels(checked)
    else:
        return None
    if found is None:
        return None
    result = []
    for number, stage in enumerate(found):
        stage_checked, problems = check_kernel(stage)
        if problems or stage_checked.framed:
            return None
        later = {d.name for s in found[number + 1 :] for d in s.inputs}
        result.append(Stage(stage_checked, tuple(o.name for o in stage.outputs if o.name in later)))
    return tuple(result)


def _stage_name(kernel: ir.Kernel, number: int) -> str:
    """The name of a kernel's stage: its functions are named as a kernel's, after it
    (`_matmul_softmax_stage_1_mosaic_gpu_kernel`)."""
    return f"{kernel.name}_stage_{number}"


def _reductions(body) -> list[ir.Call]:
    return [n for n in ir.walk(*(s.value for s in body)) if isinstance(n, ir.Call) and FUNCTIONS[n.func].reducer]


def _nested(call: ir.Call) -> bool:
    """Whether a reduction's argument holds another reduction."""
    return any(isinstance(n, ir.Call) and FUNCTIONS[n.func].reducer for n in ir.walk(call.args[0]))


def _scalar_kernels(checked: CheckedKernel) -> list[ir.Kernel]:
    """A rank-1 kernel whose reductions to scalars read other reductions: the innermost
    first, each a 0-d output of a kernel of its own, read by the next as a 0-d input."""
    kernel, names, found = checked.kernel, _Names(checked.kernel), []
    body = kernel.body
    while True:
        calls = _reductions(body)
        inner = list(
            dict.fromkeys(
                c for c in calls if not _nested(c) and any(c in ir.walk(o.args[0]) for o in calls if o is not c)
            )
        )
        if not inner:
            break
        decls = [names.array(f"{c.func}_{c.args[1].id.lower()}", checked.types[c], c.position) for c in inner]
        name = _stage_name(kernel, len(found) + 1)
        found.append(
            stage_kernel(kernel, name, tuple(names.inputs), decls, body, {d.name: c for d, c in zip(decls, inner)})
        )
        mapping = {c: ir.Name(d.name, c.position) for d, c in zip(decls, inner)}
        body = tuple(dataclasses.replace(s, value=substitute(s.value, mapping)) for s in body)
        names.inputs += decls
    found.append(
        stage_kernel(kernel, _stage_name(kernel, len(found) + 1), tuple(names.inputs), kernel.outputs, body, {})
    )
    return found


def _product_kernels(checked: CheckedKernel) -> list[ir.Kernel] | None:
    """A fused kernel of one product: its computed operands first, the product, and
    after it what reduces its result; None where it has several products."""
    kernel = checked.kernel
    products = [n for n in ir.walk(*(s.value for s in kernel.body)) if _is_product(n)]
    if len(products) != 1:
        return None
    (product,) = products
    names = _Names(kernel)
    found: list[ir.Kernel] = []
    apart = [o for o in kernel.outputs if not _reads(kernel, o.name, product)]
    if apart:  # outputs the product does not reach (a bias's cotangent beside dy): a kernel first
        found.append(stage_kernel(kernel, _stage_name(kernel, 1), kernel.inputs, apart, kernel.body, {}))
    sides = {}
    for side in ("left", "right"):
        value, transposed = product_operand(getattr(product, side))
        if isinstance(value, ir.Name) and value.id in {d.name for d in kernel.inputs}:
            continue
        name = names.name("lhs" if side == "left" else "rhs")
        stage, decl, transposed = _operand_kernel(
            kernel, _stage_name(kernel, len(found) + 1), name, checked.types[value], value, transposed
        )
        found.append(stage)
        read = ir.Name(decl.name, value.position)
        sides[side] = ir.Attribute(read, "T", value.position, value.position) if transposed else read
        names.inputs.append(decl)
    rest = dataclasses.replace(product, **sides)
    body = tuple(dataclasses.replace(s, value=substitute(s.value, {product: rest})) for s in kernel.body)
    inputs = tuple(names.inputs)
    outputs = tuple(o for o in kernel.outputs if o not in apart)
    final = stage_kernel(kernel, _stage_name(kernel, len(found) + 1), inputs, outputs, body, {})
    if is_framed(final):  # the product's result is reduced: written out first
        decl = names.array("acc", checked.types[product], product.position)
        found.append(stage_kernel(kernel, _stage_name(kernel, len(found) + 1), inputs, (decl,), (), {decl.name: rest}))
        read = ir.Name(decl.name, product.position)
        body = tuple(dataclasses.replace(s, value=_softmax_spelled(substitute(s.value, {rest: read}))) for s in body)
        final = stage_kernel(kernel, _stage_name(kernel, len(found) + 1), (*inputs, decl), outputs, body, {})
    found.append(final)
    return found


def _operand_kernel(kernel: ir.Kernel, name: str, array: str, value_type, value: ir.Expr, transposed: bool):
    """The stage that writes a computed operand, its array, and whether the product reads
    that array transposed: in the order of the dimensions its inputs broadcast to (a
    transposed operand's type lists them as the product reads them)."""
    dims = tuple(value_type.dims)
    orders = [(dims, transposed)]
    if len(dims) >= 2:
        orders.append(((*dims[:-2], dims[-1], dims[-2]), not transposed))
    for order, reads_transposed in orders:
        at = value.position
        decl = ir.ArrayDecl(array, value_type.dtype.name, order, at, at, (at,) * len(order))
        stage = stage_kernel(kernel, name, kernel.inputs, (decl,), kernel.body, {array: value})
        if not check_kernel(stage)[1]:
            break
    return stage, decl, reads_transposed


def _reads(kernel: ir.Kernel, output: str, node: ir.Expr) -> bool:
    """Whether the statement assigning `output` reads `node`, itself or through lets."""
    lets = {s.name: s.value for s in kernel.body if isinstance(s, ir.Let)}
    pending = [s.value for s in kernel.body if isinstance(s, ir.Assign) and s.target == output]
    seen: set[str] = set()
    while pending:
        for found in ir.walk(pending.pop()):
            if found == node:
                return True
            if isinstance(found, ir.Name) and found.id in lets and found.id not in seen:
                seen.add(found.id)
                pending.append(lets[found.id])
    return False


class _Names:
    """The arrays between stages, named apart from the kernel's names."""

    def __init__(self, kernel: ir.Kernel):
        self.inputs = list(kernel.inputs)
        self.namer = Namer(
            [d.name for d in (*kernel.inputs, *kernel.outputs)]
            + [p.name for p in kernel.params]
            + [s.name for s in kernel.body if isinstance(s, ir.Let)]
        )
        self.name = self.namer.claim

    def array(self, wanted: str, value_type, position) -> ir.ArrayDecl:
        name = self.name(wanted)
        dims = tuple(value_type.dims)
        return ir.ArrayDecl(name, value_type.dtype.name, dims, position, position, (position,) * len(dims))


def stage_kernel(kernel: ir.Kernel, name: str, inputs, outputs, body, assigned: dict[str, ir.Expr]) -> ir.Kernel:
    """A stage: `outputs` from `body`'s statements (and `assigned`: output -> value), with
    the lets, inputs and params they read, in the kernel's order."""
    statements = [s for s in body if not isinstance(s, ir.Assign) or s.target in {o.name for o in outputs}]
    statements += [ir.Assign(target, value, value.position) for target, value in assigned.items()]
    lets = {s.name: s for s in statements if isinstance(s, ir.Let)}
    read: set[str] = set()
    pending = [s.value for s in statements if isinstance(s, ir.Assign)]
    while pending:
        for node in ir.walk(pending.pop()):
            if isinstance(node, ir.Name) and node.id not in read:
                read.add(node.id)
                if node.id in lets:
                    pending.append(lets[node.id].value)
    kept = tuple(s for s in statements if isinstance(s, ir.Assign) or s.name in read)
    return dataclasses.replace(
        kernel,
        name=name,
        inputs=tuple(d for d in inputs if d.name in read),
        outputs=tuple(outputs),
        params=tuple(p for p in kernel.params if p.name in read),
        body=kept,
        blocks=(),
        accumulates=kernel.accumulates if any(_is_product(n) for s in kept for n in ir.walk(s.value)) else (),
        gpu_blocks=(),
        gpu_options=(),
        grad_none=(),
    )


def _is_product(node: ir.Expr) -> bool:
    return isinstance(node, ir.Binary) and node.op == "@"


def _softmax_spelled(node: ir.Expr) -> ir.Expr:
    """`node` with each softmax(x, D) written as the reductions it is (as the reference's
    `rt.softmax`): exp(x - max(x, D)) / sum(exp(x - max(x, D)), D)."""
    calls = [n for n in ir.walk(node) if isinstance(n, ir.Call) and n.func == "softmax"]
    if not calls:
        return node
    call = calls[-1]  # innermost first: its argument holds no softmax
    at, func_at = call.position, call.func_position
    x, dim = call.args
    top = ir.Call("max", (x, dim), at, func_at)
    e = ir.Call("exp", (ir.Binary("-", x, top, at, at),), at, func_at)
    spelled = ir.Binary("/", e, ir.Call("sum", (e, dim), at, func_at), at, at)
    return _softmax_spelled(substitute(node, {call: spelled}))


def chained_body(lowered: LoweredKernel, staged: list[tuple[Stage, LoweredKernel, str]]) -> tuple[str, ...]:
    """The launcher's body of a kernel in stages: each stage's launcher (`staged`: with
    its lowering and launcher's name) called in turn, the arrays between them passed on."""
    names, namer, sizes = dict(lowered.values), lowered.namer.fork(), lowered.sizes
    params = {p.name for p in lowered.kernel.params}
    lines = []
    for stage, sub, function in staged:
        names |= {name: namer.claim(name) for name in stage.intermediates}
        kernel = stage.checked.kernel
        arguments = [names[d.name] for d in kernel.inputs]
        arguments += [f"{sub.sizes[d]}={sizes[d]}" for d in stage.checked.dims]
        arguments += [f"{p.name}={p.name}" for p in kernel.params if p.name in params] + ["interpret=interpret"]
        outs = [names[o.name] for o in kernel.outputs]
        lines.append(f"{', '.join(outs)} = {function}({', '.join(arguments)})")
        lines += [
            f"{names[o.name]} = {names[o.name]}.reshape({tuple_code([sizes[d] for d in o.dims])})"
            for o in kernel.outputs
            if o.name in stage.intermediates
        ]
    outs = [f"{names[o.spec_name]}.reshape({o.layout_shape})" for o in lowered.outputs]
    outs = [f"({if_residuals(out, o)})" if o.residual else out for out, o in zip(outs, lowered.outputs)]
    return (*lines, f"return {', '.join(outs)}")
