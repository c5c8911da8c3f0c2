"""Backward kernels of a kernel with one matrix product and an elementwise epilogue
(`z = gelu(x @ y + bias)`), derived from its spec.

The product's value, taken as an input `acc`, makes the epilogue an elementwise kernel,
whose reverse mode (gradients.reverse) gives the cotangent of the product, `dacc`, in
the operands' dtype (the products below take it to the MXU); an input broadcast over a
dimension (a bias [N]) gets its cotangent summed over it, as reverse.derive sums it.
Where the product's cotangent is an output's cotangent as it is (matmul, linear:
`z = x @ y`), it needs no computing. Then each operand's cotangent is one product
kernel, NAME_backward_x and NAME_backward_y: `dx = dacc @ y.T`, `dy = x.T @ dacc`, each
operand read as it is stored (`w.T` in the forward, `w` here), with the forward's
blocks by dimension name.

Fused, as XLA fuses them: each product kernel computes `dacc` from what the epilogue's
derivative reads (a computed operand: no kernel writes dacc to memory), and the one
whose contracted dimension a bias is summed over (dy = x.T @ dacc sweeps M, as
dbias = sum(dacc, M) does) carries that sum beside the product, as a second output.
Where the fused middle cannot lay a computed operand out (it would need its tile
transposed: scores' dk = dacc.T @ q, linear's dw = dy.T @ x), the epilogue's derivative
is an elementwise kernel of its own, NAME_backward_epilogue, and each sum one more,
NAME_backward_over_m.

What the forward pass saves: the product's value (the accumulator, as the residual
`acc`, which the kernel writes too under jax.grad) where the epilogue's derivative reads it (gelu,
relu), and nothing but the inputs where it does not (a scale, a bias).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from pallasgen.gradients import reverse
from pallasgen.gradients.backward import Argument, Derived, Residual, Step
from pallasgen.analysis.checks import CheckedKernel, check_kernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.hardware import GPU_BACKWARD_DEPTH, TPU_LANES, lane_tiles
from pallasgen.analysis.names import Namer
from pallasgen.analysis.product import Product, product_dims
from pallasgen.frontend import ir


def derive(checked: CheckedKernel) -> Derived | str | None:
    """The backward kernels of a kernel with one product (None: it has none, or it is a
    fused kernel), or what it has that they are not generated for yet."""
    product = checked.product
    if product is None:
        return None
    not_yet = _not_generated_yet(product)
    if not_yet:
        return not_yet
    kernel = checked.kernel
    forward = [*(d.name for d in kernel.inputs + kernel.outputs), *(p.name for p in kernel.params), *checked.dims]
    acc = Namer([*forward, *(s.name for s in kernel.body if isinstance(s, ir.Let))]).claim_spec("acc")
    epilogue, problems = check_kernel(_epilogue(kernel, product, acc))
    if problems:  # what the forward's checks pass, its epilogue passes: never expected
        return f"an epilogue that fails a check ({problems[0].message})"
    not_yet = reverse.not_generated_yet(epilogue)
    if not_yet:
        return f"{not_yet} in the product's epilogue"
    backward = reverse.Reverse(epilogue)
    steps, g = _epilogue_steps(kernel, product, backward, acc)
    if g is not None:
        steps = _fused(steps, _product_steps(kernel, product, g), g, backward.checked.space.layout)
    residuals = ()
    if any(a == Argument(acc, "residual") for step in steps for a in step.arguments):
        residuals = (Residual(acc, product.node),)
    return Derived(tuple(steps), residuals, backward.recomputed_names([s.kernel for s in steps]))


def _not_generated_yet(product: Product) -> str | None:
    """What the product has that its backward kernels are not generated for: an operand
    broadcast over a batch dimension (its cotangent sums over it too). The checks leave
    the operands nowhere else in the body."""
    if product.lhs.dims[:-2] != product.rhs.dims[:-2]:
        return "a product whose operands have different batch dimensions"
    return None


def _epilogue(kernel: ir.Kernel, product: Product, acc: str) -> ir.Kernel:
    """The kernel with its product an input `acc`, and without its operands: its epilogue,
    an elementwise kernel."""
    position = product.node.position
    dims = product_dims(product)
    decl = ir.ArrayDecl(acc, product.accumulator.name, dims, position, position, (position,) * len(dims))
    operands = {o.name for o in product.operands}
    return dataclasses.replace(
        kernel,
        inputs=(decl, *(d for d in kernel.inputs if d.name not in operands)),
        body=tuple(reverse.replaced(s, {product.node: ir.Name(acc, position)}) for s in kernel.body),
        blocks=tuple(b for b in kernel.blocks if b.dim in dims),
        accumulates=(),
        gpu_blocks=tuple(b for b in kernel.gpu_blocks if b.dim in dims),
        grad_none=(),
    )


def _epilogue_steps(kernel, product, backward: reverse.Reverse, acc: str):
    """The elementwise backward kernels of the epilogue, and the product's cotangent as
    the product kernels take it (None: it has none): the result of the first, or an
    output's cotangent as it is."""
    epilogue = backward.checked
    layout = epilogue.space.layout
    groups: dict[str, list[ir.ArrayDecl]] = defaultdict(list)
    for decl in epilogue.kernel.inputs:
        if decl.name in backward.cotangents:
            groups["".join(d for d in layout if d not in decl.dims)].append(decl)
    operand_dtype = product.lhs.dtype.name
    g = None
    if acc in backward.cotangents:
        g = _output_cotangent(kernel, backward, backward.cotangents[acc], operand_dtype)
        if g is not None:  # no epilogue kernel for it
            groups[""] = [d for d in groups[""] if d.name != acc]
    steps = []
    for dims, decls in groups.items():
        if not decls:
            continue
        name = f"{kernel.name}_backward_" + (f"over_{dims.lower()}" if dims else "epilogue")
        derived, arguments = backward.kernel(name, decls, dims)
        arguments = tuple(Argument(acc, "residual") if a == Argument(acc, "input") else a for a in arguments)
        results = tuple(d.name for d in decls)
        if dims:
            derived = dataclasses.replace(derived, gpu_blocks=_gpu_blocks(derived, set(layout), dims))
        if decls[0].name == acc:  # the product's cotangent, in its operands' dtype for the products
            derived, dacc = _in_dtype(derived, 0, operand_dtype)
            results = (dacc.name, *results[1:])
            g = dacc, Argument(dacc.name, "backward")
        steps.append(Step(derived, arguments, results))
    return steps, g


def _output_cotangent(kernel, backward, cotangent: ir.Expr, dtype: str):
    """Where the product's cotangent is an output's cotangent converted only to wider
    floats and back (`f32(dz)` of a bf16 `z`, maybe by a let), that cotangent's
    declaration as the products take it and its argument; else None."""
    widest = DTYPES[dtype].bits
    lets = {s.name: s.value for s in backward.statements}
    while isinstance(cotangent, ir.Name) and cotangent.id in lets or _is_conversion(cotangent):
        if isinstance(cotangent, ir.Name):
            cotangent = lets[cotangent.id]
            continue
        converted = DTYPES[cotangent.func]
        if not converted.is_float:
            return None
        widest = min(widest, converted.bits)
        cotangent = cotangent.args[0]
    outputs = {backward.seeds[o.name]: o for o in kernel.outputs if o.name in backward.seeds}
    if not isinstance(cotangent, ir.Name) or cotangent.id not in outputs:
        return None
    output = outputs[cotangent.id]
    if output.dtype != dtype or widest < DTYPES[dtype].bits:
        return None
    return dataclasses.replace(output, name=cotangent.id), Argument(output.name, "cotangent")


def _is_conversion(node: ir.Expr) -> bool:
    return isinstance(node, ir.Call) and node.func in DTYPES and len(node.args) == 1


def _in_dtype(kernel: ir.Kernel, index: int, dtype: str) -> tuple[ir.Kernel, ir.ArrayDecl]:
    """The kernel with its output `index` converted to `dtype`, and that output."""
    output = kernel.outputs[index]
    if output.dtype == dtype:
        return kernel, output
    converted = dataclasses.replace(output, dtype=dtype)
    body = tuple(
        (
            dataclasses.replace(s, value=ir.Call(dtype, (s.value,), s.value.position, s.value.position))
            if isinstance(s, ir.Assign) and s.target == output.name
            else s
        )
        for s in kernel.body
    )
    outputs = tuple(converted if o is output else o for o in kernel.outputs)
    return dataclasses.replace(kernel, outputs=outputs, body=body), converted


def _product_steps(kernel: ir.Kernel, product: Product, g) -> list[Step]:
    """`dx = dacc @ y.T` and `dy = x.T @ dacc` (as the operands are stored) for each float
    operand: one product kernel each."""
    g_decl, g_argument = g
    inputs = {d.name: d for d in kernel.inputs}
    x, y = (inputs[o.name] for o in product.operands)
    steps = []
    for target, other, contracted in ((x, y, product.n), (y, x, product.m)):
        if not DTYPES[target.dtype].is_float:
            continue
        body, read = _product(target, (g_decl, other), contracted, product.node)
        arguments = tuple(g_argument if decl is g_decl else Argument(decl.name, "input") for decl in read)
        out = dataclasses.replace(target, name=Namer([d.name for d in read]).claim_spec(f"d{target.name}"))
        dims = {*target.dims, contracted}
        doc = (
            f"The backward pass of `{kernel.name}`: the cotangent {out.name} of its input {target.name},"
            f" from {g_decl.name}, that of its product.",
        )
        derived = ir.Kernel(
            name=f"{kernel.name}_backward_{target.name}",
            position=kernel.position,
            doc=doc,
            inputs=read,
            outputs=(out,),
            params=(),
            body=(ir.Assign(out.name, body, product.node.position),),
            blocks=_blocks(kernel, dims, target.dims[-2:]),
            accumulates=kernel.accumulates,
            gpu_blocks=_gpu_blocks(kernel, dims, contracted),
            gpu_options=kernel.gpu_options,
        )
        steps.append(Step(derived, arguments, (target.name,)))
    return steps


def _fused(elementwise: list[Step], products: list[Step], g, layout) -> list[Step]:
    """The product steps with the elementwise ones folded in: each computes the product's
    cotangent from what the epilogue kernel reads (a computed operand; no kernel writes
    it), and the one that contracts a dimension also gives the sums over it (a bias's
    cotangent, summed over M in the same pass as dy = x.T @ dacc). An elementwise step
    that gives more than the product's cotangent, a sum over a dimension no product
    contracts, or a fused kernel that fails a check stays a kernel of its own."""
    g_decl, g_argument = g
    epilogue = next((s for s in elementwise if g_argument.source == "backward" and s.results == (g_decl.name,)), None)
    if g_argument.source == "backward" and epilogue is None:
        return [*elementwise, *products]
    sums = {
        step: "".join(d for d in layout if d not in step.kernel.outputs[0].dims)
        for step in elementwise
        if step is not epilogue
    }
    fused, folded = [], set()
    for step in products:
        inputs = {d for decl in step.kernel.inputs for d in decl.dims}
        contracted = "".join(d for d in layout if d in inputs - set(step.kernel.outputs[0].dims))
        parts = [s for s, dims in sums.items() if dims == contracted]
        candidate = _fused_step(step, epilogue, parts, g_decl)
        if candidate is None:
            return [*elementwise, *products]
        fused.append(candidate)
        folded.update(parts)
    return [*(s for s in elementwise if s in sums and s not in folded), *fused]


def _fused_step(step: Step, epilogue: Step | None, sums: list[Step], g_decl: ir.ArrayDecl) -> Step | None:
    """The product step computing its cotangent operand `g_decl` as `epilogue` does (if
    given), with the sums' outputs beside its own; None where the parts' names clash or
    the fused kernel fails a check."""
    parts = [*([epilogue] if epilogue else []), *sums]
    if not parts:
        return step
    product_kernel = step.kernel
    (assign,) = product_kernel.body
    lets: dict[str, ir.Let] = {}
    for part in parts:
        for statement in part.kernel.body:
            if isinstance(statement, ir.Let) and lets.setdefault(statement.name, statement) != statement:
                return None
    body: list[ir.Statement] = list(lets.values())
    if epilogue is not None:
        computed = epilogue.kernel.body[-1]
        body.append(ir.Let(g_decl.name, computed.value, computed.position))
    sum_assigns = [s for part in sums for s in part.kernel.body if isinstance(s, ir.Assign)]
    arrays: dict[str, tuple[ir.ArrayDecl, Argument]] = {}  # the parts' inputs, then the other operand
    read = [pair for part in parts for pair in zip(part.kernel.inputs, part.arguments)]
    read += [pair for pair in zip(product_kernel.inputs, step.arguments) if not epilogue or pair[0] != g_decl]
    for decl, argument in read:
        if arrays.setdefault(decl.name, (decl, argument)) != (decl, argument):
            return None
    outputs = (product_kernel.outputs[0], *(o for part in sums for o in part.kernel.outputs))
    taken = [*arrays, *lets, *(o.name for o in outputs[1:]), g_decl.name]
    if len({o.name for o in outputs}) < len(outputs) or outputs[0].name in taken or set(lets) & set(arrays):
        return None
    target = step.results[0]
    doc = (
        f"The backward pass of `{product_kernel.name.rsplit('_backward_', 1)[0]}`: the cotangent {outputs[0].name}"
        f" of its input {target}, from {g_decl.name}, that of its product"
        + (", computed here from the epilogue's derivative" if epilogue else "")
        + (f"; and {', '.join(o.name for o in outputs[1:])}, summed in the same pass." if sums else "."),
    )
    params = {p.name: p for part in parts for p in part.kernel.params}
    for product in _orientations(assign, g_decl.name):
        fused = dataclasses.replace(
            product_kernel,
            doc=doc,
            inputs=tuple(decl for decl, _ in arrays.values()),
            outputs=outputs,
            params=tuple(params.values()),
            body=(*body, product, *sum_assigns),
        )
        if not check_kernel(fused)[1]:
            results = (target, *(r for part in sums for r in part.results))
            return Step(fused, tuple(argument for _, argument in arrays.values()), results)
    return None


def _orientations(assign: ir.Assign, name: str):
    """The product `assign`, then it with the operand `name` transposed: a value the
    kernel computes is laid out in the kernel's dimension order, which may be the other
    way round from the array it stands for."""
    yield assign
    flip = {}
    for side in (assign.value.left, assign.value.right):
        value, transposed = (side.value, True) if isinstance(side, ir.Attribute) else (side, False)
        if isinstance(value, ir.Name) and value.id == name:
            flip[side] = value if transposed else ir.Attribute(value, "T", side.position, side.position)
    yield reverse.replaced(assign, flip)


def _blocks(kernel: ir.Kernel, dims: set[str], outputs: tuple[str, ...]) -> tuple[ir.BlockSize, ...]:
    """The forward's blocks of `dims`; and where the forward takes one of the product's
    `outputs` whole (scores' D, contracted there), the forward's largest block rounded up
    to a lane tile, so that the backward's output and accumulator blocks stay bounded (a
    D of 64 is still one block)."""
    blocks = [b for b in kernel.blocks if b.dim in dims]
    largest = max((b.size for b in kernel.blocks), default=TPU_LANES)
    for dim in outputs:
        if all(b.dim != dim for b in kernel.blocks):
            blocks.append(ir.BlockSize(dim, lane_tiles(largest), kernel.position, kernel.position))
    return tuple(blocks)


def _gpu_blocks(kernel: ir.Kernel, dims: set[str], shallower: str) -> tuple[ir.BlockSize, ...]:
    """The forward's GPU blocks of `dims`, and GPU_BACKWARD_DEPTH for the dimension `shallower`
    (a product's contracted one, a sum's) where the forward has none: at Triton's
    defaults (64 of a 16-bit product's contracted dimension, 64 rows of a sum), sm_90's
    ptxas spilled 4 to 8 bytes of registers in dx = dacc @ y.T at 8 rows, and in
    matmul_bias_gelu's sum of gelu's derivative over M (tests/test_compiled.py)."""
    blocks = [b for b in kernel.gpu_blocks if b.dim in dims]
    if all(b.dim != shallower for b in blocks):
        blocks.append(ir.BlockSize(shallower, GPU_BACKWARD_DEPTH, kernel.position, kernel.position))
    return tuple(blocks)


def _product(target: ir.ArrayDecl, factors, contracted: str, node: ir.Binary):
    """The product of the two `factors` over `contracted` that has `target`'s matrix
    dimensions in its stored order, each factor transposed where it is stored the other
    way round; and the factors in the order it reads them."""
    rows, columns = target.dims[-2:]
    left = next(f for f in factors if rows in f.dims)
    right = next(f for f in factors if f is not left)
    position = node.position

    def read(decl: ir.ArrayDecl, wanted: tuple[str, str]) -> ir.Expr:
        name = ir.Name(decl.name, position)
        return name if decl.dims[-2:] == wanted else ir.Attribute(name, "T", position, position)

    value = ir.Binary(
        "@", read(left, (rows, contracted)), read(right, (contracted, columns)), position, node.op_position
    )
    return value, (left, right)
