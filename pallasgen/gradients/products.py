"""Backward kernels of a kernel with one matrix product and an elementwise epilogue
(`z = gelu(x @ y + bias)`), or several products of inputs in one (SwiGLU's
`silu(x @ w1) * (x @ w3)`), derived from its spec.

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

Several products: each is an input of the epilogue (acc1, acc2, ...), saved where its
derivative reads it, and its cotangent dacc1, dacc2, ... goes to the product kernels as
above; an operand of several products gets one kernel that sums them
(`dx = dacc1 @ w1.T + dacc2 @ w3.T`). Where the epilogue's derivative computes the
cotangents of several products, it is a kernel of its own (see `_fused`).
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
from pallasgen.analysis.product import Product, find_products, product_dims, products_of_inputs
from pallasgen.frontend import ir


def derive(checked: CheckedKernel, constants: frozenset[str] = frozenset()) -> Derived | str | None:
    """The backward kernels of a kernel with one product, or several products of inputs in
    an elementwise epilogue (None: it has neither), or what it has that they are not
    generated for yet. The inputs named in `constants` get no cotangent (gradients.fused's
    operands of positions alone)."""
    products = _products(checked)
    if products is None:
        return _several_not_yet(checked.kernel) if checked.framed else None
    for product in products:
        not_yet = _not_generated_yet(product, constants)
        if not_yet:
            return not_yet
    kernel = checked.kernel
    forward = [*(d.name for d in kernel.inputs + kernel.outputs), *(p.name for p in kernel.params), *checked.dims]
    namer = Namer([*forward, *(s.name for s in kernel.body if isinstance(s, ir.Let))])
    accs = tuple(namer.claim_spec("acc" if len(products) == 1 else f"acc{i}") for i in range(1, len(products) + 1))
    epilogue_kernel = _epilogue(kernel, products, accs)
    not_yet = operand_beside(epilogue_kernel, products)
    if not_yet:
        return not_yet
    epilogue, problems = check_kernel(epilogue_kernel)
    if problems:  # what the forward's checks pass, its epilogue passes: never expected
        return f"an epilogue that fails a check ({problems[0].message})"
    if any(d.reductions for d in epilogue.space.dims):
        return "several products whose values are reduced, other than attention's"
    not_yet = reverse.not_generated_yet(epilogue)
    if not_yet:
        return f"{not_yet} in the product's epilogue"
    backward = reverse.Reverse(epilogue)
    if any(len(backward.summed(name)) > 1 for name in backward.cotangents):
        return "an input broadcast over two blocked dimensions of a product's value"
    steps, gs = _epilogue_steps(kernel, products, backward, accs)
    if any(g is not None for g in gs):
        product_steps = _product_steps(kernel, products, gs, constants)
        if isinstance(product_steps, str):
            return product_steps
        steps = _fused(steps, product_steps, gs, backward.checked.space.layout)
    read = {a for step in steps for a in step.arguments}
    residuals = tuple(Residual(acc, p.node) for acc, p in zip(accs, products) if Argument(acc, "residual") in read)
    return Derived(tuple(steps), residuals, backward.recomputed_names([s.kernel for s in steps]))


def _products(checked: CheckedKernel) -> tuple[Product, ...] | None:
    """The products this derivation takes: the kernel's single product, or several
    products of inputs (the fused middle's, each of inputs of one dtype)."""
    if checked.product is not None:
        return (checked.product,)
    products = products_of_inputs(checked.kernel) if checked.framed else None
    return products if products is not None and len(products) > 1 else None


def _several_not_yet(kernel: ir.Kernel) -> str | None:
    """What a kernel of several products that are not all of inputs, and that
    gradients.fused does not take, has that no backward kernel is generated for: a
    product of a product beside another product (`(x @ w1) @ w2 + x @ w3`), or a computed
    operand among several products."""
    products = find_products(kernel)
    if len(products) < 2:
        return None
    sides = [side for node in products for side in (node.left, node.right)]
    if any(n in products for side in sides for n in ir.walk(side)):
        return "a product of a product beside another product"
    return "several products, one of a computed operand"


def _not_generated_yet(product: Product, constants: frozenset[str]) -> str | None:
    """What the product has that its backward kernels are not generated for: an operand
    broadcast over a batch dimension (its cotangent sums over it too), other than one of
    the `constants`, which has none."""
    batches = [o.dims[:-2] for o in product.operands if o.name not in constants]
    if product.lhs.dims[:-2] != product.rhs.dims[:-2] and len(batches) == 2:
        return "a product whose operands have different batch dimensions"
    return None


def operand_beside(epilogue: ir.Kernel, products: tuple[Product, ...]) -> str | None:
    """What an epilogue that reads a product's operand beside its value has (the
    epilogue takes the products' results, not their operands); None where it reads none."""
    read = {n.id for s in epilogue.body for n in ir.walk(s.value) if isinstance(n, ir.Name)}
    operands = [o.name for product in products for o in product.operands if o.name in read]
    return f"an output that reads the product's operand {operands[0]} beside the product" if operands else None


def _epilogue(kernel: ir.Kernel, products: tuple[Product, ...], accs: tuple[str, ...]) -> ir.Kernel:
    """The kernel with each product an input `acc`, and without their operands: its
    epilogue, an elementwise kernel."""
    decls, replaced, dims = [], {}, set()
    for product, acc in zip(products, accs):
        position = product.node.position
        value_dims = product_dims(product)
        decls.append(
            ir.ArrayDecl(acc, product.accumulator.name, value_dims, position, position, (position,) * len(value_dims))
        )
        replaced[product.node] = ir.Name(acc, position)
        dims |= set(value_dims)
    operands = {o.name for product in products for o in product.operands}
    return dataclasses.replace(
        kernel,
        inputs=(*decls, *(d for d in kernel.inputs if d.name not in operands)),
        body=tuple(reverse.replaced(s, replaced) for s in kernel.body),
        blocks=tuple(b for b in kernel.blocks if b.dim in dims),
        accumulates=(),
        gpu_blocks=tuple(b for b in kernel.gpu_blocks if b.dim in dims),
        grad_none=(),
    )


def _epilogue_steps(kernel, products, backward: reverse.Reverse, accs: tuple[str, ...]):
    """The elementwise backward kernels of the epilogue, and each product's cotangent as
    the product kernels take it (None: it has none): a result of the first, or an
    output's cotangent as it is."""
    epilogue = backward.checked
    layout = epilogue.space.layout
    groups: dict[str, list[ir.ArrayDecl]] = defaultdict(list)
    for decl in epilogue.kernel.inputs:
        if decl.name in backward.cotangents:
            groups["".join(d for d in layout if d not in decl.dims)].append(decl)
    dtypes = {acc: product.lhs.dtype.name for acc, product in zip(accs, products)}
    gs = {}
    for acc in accs:
        if acc in backward.cotangents:
            gs[acc] = _output_cotangent(kernel, backward, backward.cotangents[acc], dtypes[acc])
            if gs[acc] is not None:  # no epilogue kernel for it
                groups[""] = [d for d in groups[""] if d.name != acc]
    steps = []
    for dims, decls in groups.items():
        if not decls:
            continue
        name = f"{kernel.name}_backward_" + (f"over_{dims.lower()}" if dims else "epilogue")
        derived, arguments = backward.kernel(name, decls, dims)
        arguments = tuple(
            Argument(a.name, "residual") if a.name in dtypes and a.source == "input" else a for a in arguments
        )
        results = [d.name for d in decls]
        if dims:
            derived = dataclasses.replace(derived, gpu_blocks=_gpu_blocks(derived, set(layout), dims))
        for index, acc in enumerate(results):
            if acc in dtypes:  # a product's cotangent, in its operands' dtype for the products
                derived, dacc = _in_dtype(derived, index, dtypes[acc])
                results[index] = dacc.name
                gs[acc] = dacc, Argument(dacc.name, "backward")
        steps.append(Step(derived, arguments, tuple(results)))
    return steps, tuple(gs.get(acc) for acc in accs)


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


def _product_steps(kernel: ir.Kernel, products: tuple[Product, ...], gs, constants=frozenset()) -> list[Step] | str:
    """`dx = dacc @ y.T` and `dy = x.T @ dacc` (as the operands are stored) for each float
    operand but the `constants`: one product kernel each, the sum of its products where it
    is an operand of several (`dx = dacc1 @ w1.T + dacc3 @ w3.T`)."""
    inputs = {d.name: d for d in kernel.inputs}
    terms = defaultdict(list)  # each operand -> (the cotangent, the other operand, the dimension contracted, node)
    for product, g in zip(products, gs):
        if g is None:
            continue
        x, y = (inputs[o.name] for o in product.operands)
        terms[x.name].append((g, y, product.n, product.node))
        terms[y.name].append((g, x, product.m, product.node))
    steps = []
    for name, uses in terms.items():
        target = inputs[name]
        if not DTYPES[target.dtype].is_float or name in constants:
            continue
        values, read, arguments = [], {}, {}
        for (g_decl, g_argument), other, contracted, node in uses:
            value, factors = _product(target, (g_decl, other), contracted, node)
            values.append(value)
            for decl in factors:
                read.setdefault(decl.name, decl)
                arguments.setdefault(decl.name, g_argument if decl is g_decl else Argument(decl.name, "input"))
        out = dataclasses.replace(target, name=Namer(list(read)).claim_spec(f"d{target.name}"))
        contracted = tuple(dict.fromkeys(c for _, _, c, _ in uses))
        dims = {*target.dims, *contracted}
        cotangents = list(dict.fromkeys(g_decl.name for (g_decl, _), *_ in uses))
        of = (
            f"{cotangents[0]}, that of its product"
            if len(cotangents) == 1
            else f"{', '.join(cotangents)}, those of its products"
        )
        node = uses[0][3]
        derived = ir.Kernel(
            name=f"{kernel.name}_backward_{target.name}",
            position=kernel.position,
            doc=(
                f"The backward pass of `{kernel.name}`: the cotangent {out.name} of its input {target.name}, from {of}.",
            ),
            inputs=tuple(read.values()),
            outputs=(out,),
            params=(),
            body=(ir.Assign(out.name, reverse.sum_of(values), node.position),),
            blocks=_blocks(kernel, dims, target.dims[-2:]),
            accumulates=kernel.accumulates,
            gpu_blocks=_gpu_blocks(kernel, dims, *contracted),
            gpu_options=kernel.gpu_options,
        )
        if len(uses) > 1 and check_kernel(derived)[1]:
            return f"a sum of products for the cotangent of {target.name} that fails a check ({check_kernel(derived)[1][0].message})"
        steps.append(Step(derived, tuple(arguments.values()), (target.name,)))
    return steps


def _fused(elementwise: list[Step], products: list[Step], gs, layout) -> list[Step]:
    """The product steps with the elementwise ones folded in: each computes the product's
    cotangent from what the epilogue kernel reads (a computed operand; no kernel writes
    it), and the one that contracts a dimension also gives the sums over it (a bias's
    cotangent, summed over M in the same pass as dy = x.T @ dacc). An elementwise step
    that gives more than one product's cotangent, a sum over a dimension no product
    contracts, or a fused kernel that fails a check stays a kernel of its own: each
    product kernel would compute the cotangents of several products again, reading
    every product's saved value at each step (swiglu's backward at M=1024, K=1024,
    N=2048, blocks of 512: 503,462 cycles by v5e's estimate so, 378,896 apart)."""
    cotangents = {decl.name: decl for decl, _ in filter(None, gs)}
    computed = [decl.name for decl, argument in filter(None, gs) if argument.source == "backward"]
    epilogue = next((s for s in elementwise if s.results == tuple(computed)), None) if computed else None
    if len(computed) > 1 or computed and epilogue is None:
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
        parts = [s for s, dims in sums.items() if dims == contracted and s not in folded]
        candidate = _fused_step(step, epilogue, parts, cotangents)
        if candidate is None:
            return [*elementwise, *products]
        fused.append(candidate)
        folded.update(parts)
    return [*(s for s in elementwise if s in sums and s not in folded), *fused]


def _fused_step(
    step: Step, epilogue: Step | None, sums: list[Step], cotangents: dict[str, ir.ArrayDecl]
) -> Step | None:
    """The product step computing the cotangent it reads as `epilogue` does (if given),
    with the sums' outputs beside its own; None where the parts' names clash or the
    fused kernel fails a check."""
    product_kernel = step.kernel
    (assign,) = product_kernel.body
    reads = [d.name for d in product_kernel.inputs if d.name in cotangents]  # the products' cotangents
    g = epilogue.results[0] if epilogue and epilogue.results[0] in reads else None
    parts = [*([epilogue] if g else []), *sums]
    if not parts:
        return step
    lets: dict[str, ir.Let] = {}
    for part in parts:
        for statement in part.kernel.body:
            if isinstance(statement, ir.Let) and lets.setdefault(statement.name, statement) != statement:
                return None
    body: list[ir.Statement] = list(lets.values())
    if g:
        computed = epilogue.kernel.body[-1]
        body.append(ir.Let(g, computed.value, computed.position))
    sum_assigns = [s for part in sums for s in part.kernel.body if isinstance(s, ir.Assign)]
    arrays: dict[str, tuple[ir.ArrayDecl, Argument]] = {}  # the parts' inputs, then the other operand
    read = [pair for part in parts for pair in zip(part.kernel.inputs, part.arguments)]
    read += [pair for pair in zip(product_kernel.inputs, step.arguments) if pair[0].name != g]
    for decl, argument in read:
        if arrays.setdefault(decl.name, (decl, argument)) != (decl, argument):
            return None
    outputs = (product_kernel.outputs[0], *(o for part in sums for o in part.kernel.outputs))
    taken = [*arrays, *lets, *(o.name for o in outputs[1:]), *reads]
    if len({o.name for o in outputs}) < len(outputs) or outputs[0].name in taken or set(lets) & set(arrays):
        return None
    target = step.results[0]
    of = f"{reads[0]}, that of its product" if len(reads) == 1 else f"{', '.join(reads)}, those of its products"
    doc = (
        f"The backward pass of `{product_kernel.name.rsplit('_backward_', 1)[0]}`: the cotangent {outputs[0].name}"
        f" of its input {target}, from {of}"
        + (", computed here from the epilogue's derivative" if g else "")
        + (f"; and {', '.join(o.name for o in outputs[1:])}, summed in the same pass." if sums else "."),
    )
    params = {p.name: p for part in parts for p in part.kernel.params}
    for product in _orientations(assign, g):
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


def _orientations(assign: ir.Assign, name: str | None):
    """The product `assign`, then (given a `name`) it with the operand `name` transposed:
    a value the kernel computes is laid out in the kernel's dimension order, which may be
    the other way round from the array it stands for."""
    yield assign
    if name is None:
        return
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


def _gpu_blocks(kernel: ir.Kernel, dims: set[str], *shallower: str) -> tuple[ir.BlockSize, ...]:
    """The forward's GPU blocks of `dims`, and GPU_BACKWARD_DEPTH for the dimension `shallower`
    (a product's contracted one, a sum's) where the forward has none: at Triton's
    defaults (64 of a 16-bit product's contracted dimension, 64 rows of a sum), sm_90's
    ptxas spilled 4 to 8 bytes of registers in dx = dacc @ y.T at 8 rows, and in
    matmul_bias_gelu's sum of gelu's derivative over M (tests/test_compiled.py)."""
    blocks = [b for b in kernel.gpu_blocks if b.dim in dims]
    for dim in shallower:
        if all(b.dim != dim for b in blocks):
            blocks.append(ir.BlockSize(dim, GPU_BACKWARD_DEPTH, kernel.position, kernel.position))
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
