"""Backward kernels of a fused kernel with one matrix product, other than attention's: a
product of a computed operand (`bf16(h * rsqrt(mean(h * h, K) + 1e-6) * g) @ w`), a
product followed by reductions over its output's dimensions (`softmax(x @ w, N)`), or
both. They are derived from the spec by splitting it in three parts, each an ordinary
kernel whose backward kernels an existing derivation gives:

- each computed operand's *prologue*, a kernel of the inputs it reads with the operand
  as its output (elementwise, reductions over a dimension a block holds whole), which
  reverse mode (gradients.reverse) differentiates: its backward kernels take the
  operand's cotangent to the inputs' (NAME_lhs_backward, ..._over_m for a [K] scale);
  where the operand has products of its own (an FFN's hidden layer
  `bf16(silu(x @ w1) * (x @ w3))` before `@ w2`), this derivation or gradients.products
  differentiates it, and the kernel that computes it again saves their values too
  (NAME_lhs writes lhs, acc1, acc2); an operand of positions alone (a triangle) is a
  constant of the gradient, computed in the tiles of the kernels that read it;
- the product, of the operands as inputs, with its epilogue: where that is elementwise,
  gradients.products derives it as for any product kernel; where it reduces
  (softmax), the epilogue, the product's value taken as an input `acc`, is a reduction
  kernel that reverse mode differentiates to the product's cotangent `dacc`
  (NAME_backward), and `dx = dacc @ w.T`, `dw = x.T @ dacc` are product kernels as
  there (NAME_backward_x, NAME_backward_w); where it reduces over the dimension the
  kernel sweeps (linear + cross-entropy over V), the product kernels compute the product
  and `dacc` again in their tiles instead (`_recomputing_product`).

Saved or recomputed: the epilogue's derivative reads the kernel's outputs as the forward
pass saved them (softmax's `y * (dy - sum(dy * y, N))` reads `y`; recomputing it would
take the accumulator saved as well, as large as `y`). A computed operand and the row
statistics its derivative reads are computed again by a kernel of their own before the
others (NAME_lhs: it reads the operand's inputs once, as its derivative does anyway),
not saved by the forward pass: that would add an output of fewer dimensions than the
forward's grid (the operand [M, K] of a grid over M and N), written by every block of
the dimension it lacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pallasgen.gradients import products as product_gradients, reverse
from pallasgen.gradients.backward import Argument, Derived, Residual, Step
from pallasgen.analysis.checks import CheckedKernel, check_kernel
from pallasgen.analysis.hardware import TPU_LANES, lane_tiles
from pallasgen.analysis.infer import product_operand
from pallasgen.analysis.names import Namer
from pallasgen.analysis.product import find_products, product_of_inputs
from pallasgen.analysis.valuetypes import ValueType, combine
from pallasgen.frontend import ir


@dataclass(frozen=True)
class _Prologue:
    """A computed operand of the product, as a kernel of its own (`checked`), whose one
    output `name` is the operand's value."""

    name: str  # the operand's value, as the backward kernels pass it
    cotangent: str  # its cotangent, as they pass it
    value: ir.Expr  # the operand, as the forward body computes it
    checked: CheckedKernel


def derive(checked: CheckedKernel) -> Derived | str | None:
    """The backward kernels of a fused kernel with one product outside the others (None
    for any other kernel), or what it has that they are not generated for yet."""
    kernel = checked.kernel
    products = find_products(kernel)
    outer = [p for p in products if not any(p in ir.walk(q.left, q.right) for q in products if q is not p)]
    if not checked.framed or len(outer) != 1:
        return None
    node = outer[0]
    if len(products) > 1:
        checked = _hidden_in_lanes(checked, node)
        kernel = checked.kernel
    lets = [s for s in kernel.body if isinstance(s, ir.Let)]
    forward = [*(d.name for d in kernel.inputs + kernel.outputs), *(p.name for p in kernel.params)]
    namer = Namer([*forward, *checked.dims, *(s.name for s in lets)])
    prologues, constants, decls = [], {}, []
    operands = []
    checked, converted = _converted_operands(checked, node)
    inputs = {d.name for d in kernel.inputs}
    for side_name, side in (("lhs", node.left), ("rhs", node.right)):
        value, transposed = product_operand(side)
        value = converted.get(value, value)
        if isinstance(value, ir.Name) and value.id in inputs:
            operands.append(side)
            continue
        name = namer.claim_spec(side_name)
        constant = _constant(value, {s.name: s.value for s in lets}, inputs)
        if constant is not None:
            constants[name] = constant
            decls.append(_declared(checked, name, value))
        else:
            prologue, problem = _prologue(checked, name, value, namer.claim_spec(f"d{name}"))
            if problem:
                return problem
            prologues.append(prologue)
        operand = ir.Name(name, value.position)  # read as the product reads the value: `bf16(w).T` as `rhs.T`
        operands.append(dataclasses.replace(side, value=operand) if transposed else operand)
    product_kernel, problem = _product_kernel(checked, node, operands, prologues, decls)
    if problem:
        return problem
    derived = _product_derived(product_kernel, namer, frozenset(constants))
    if isinstance(derived, str):
        return derived
    steps, residuals, recomputed = list(derived.steps), list(derived.residuals), list(derived.recomputed)
    for decl in decls:
        steps = _with_constant(steps, decl, constants[decl.name], kernel)
        if isinstance(steps, str):
            return steps
    # The operands as the forward computes them (an input it converts, as it reads it).
    written = {cast: value for value, cast in converted.items()}
    back = {ir.Name(p.name, p.value.position): written.get(p.value, p.value) for p in prologues}
    back |= {ir.Name(name, value.position): value for name, value in constants.items()}
    residuals = [dataclasses.replace(r, value=reverse.substitute(r.value, back)) for r in residuals]
    for prologue in prologues:
        found = _prologue_steps(prologue, steps, namer)
        if isinstance(found, str):
            return found
        steps, more = found
        recomputed.extend(more)
    return Derived(tuple(steps), tuple(residuals), tuple(dict.fromkeys(recomputed)))


def _hidden_in_lanes(checked: CheckedKernel, node: ir.Binary) -> CheckedKernel:
    """The kernel with the block of the outer product's contracted dimension rounded up to
    a lane tile: the hidden layer of a product of products (`h @ w2`'s N), which no
    forward array holds last, is the last dimension of h and its cotangent in the
    backward kernels (`block N = 64` is a TPU forward's, not a backward's)."""
    contracted = checked.frame.products[node].k
    blocks = tuple(
        dataclasses.replace(b, size=lane_tiles(b.size)) if b.dim == contracted else b for b in checked.kernel.blocks
    )
    return dataclasses.replace(checked, kernel=dataclasses.replace(checked.kernel, blocks=blocks))


def _converted_operands(checked: CheckedKernel, node: ir.Binary):
    """The kernel as its product computes: an operand of a narrower float dtype than the
    other is converted first, as jnp converts it (`x @ y` with x bf16 and y f32 is
    `f32(x) @ y`), so that it is a computed operand and the product's operands share a
    dtype. Its types then hold the cast."""
    values = [product_operand(side)[0] for side in (node.left, node.right)]
    common = combine(*(checked.types[v] for v in values), ()).dtype
    converted = {
        v: ir.Call(common.name, (v,), v.position, v.position) for v in values if checked.types[v].dtype != common
    }
    types = {cast: ValueType(common, checked.types[v].dims) for v, cast in converted.items()}
    return dataclasses.replace(checked, types={**checked.types, **types}), converted


def _constant(value: ir.Expr, lets: dict[str, ir.Expr], inputs: set[str]) -> ir.Expr | None:
    """The operand `value` with the lets it reads written out, where it reads no input:
    a value of positions, sizes, params and literals (a triangle `f32(index(U) <= index(T))`),
    a constant of the gradient; else None."""
    read = [n for n in ir.walk(value) if isinstance(n, ir.Name) and n.id in lets]
    while read:
        value = reverse.substitute(value, {n: lets[n.id] for n in read})
        read = [n for n in ir.walk(value) if isinstance(n, ir.Name) and n.id in lets]
    return None if _names(value) & inputs else value


def _declared(checked: CheckedKernel, name: str, value: ir.Expr) -> ir.ArrayDecl:
    value_type, position = checked.types[value], value.position
    dims = value_type.dims
    return ir.ArrayDecl(name, value_type.dtype.name, dims, position, position, (position,) * len(dims))


def _with_constant(steps: list[Step], decl: ir.ArrayDecl, value: ir.Expr, forward: ir.Kernel) -> list[Step] | str:
    """The product's steps with the operand `decl`, a constant of the gradient, computed
    in their tiles from `value` wherever they read it (no kernel writes the triangle of a
    cumulative sum), each taking for the sizes of its dimensions a forward input that has
    them where no other array it takes has, and the forward params it reads."""
    argument = Argument(decl.name, "input")
    params = tuple(p for p in forward.params if p.name in _names(value))
    found = []
    for step in steps:
        if argument not in step.arguments:
            found.append(step)
            continue
        held = {d for i, a in zip(step.kernel.inputs, step.arguments) if a != argument for d in i.dims}
        sizes = []
        for dim in decl.dims:
            if dim not in held:
                given = next(d for d in forward.inputs if dim in d.dims)
                sizes.append((given, Argument(given.name, "input")))
                held |= set(given.dims)
        computed = _computed_in(step, argument, value, sizes, params)
        if computed is None:
            return "an operand of positions alone that a backward kernel cannot compute in its tiles"
        found.append(computed)
    return found


def _prologue(checked: CheckedKernel, name: str, value: ir.Expr, cotangent: str):
    """The kernel that computes the operand `value` from the inputs and lets it reads,
    as its output `name`; or what makes it one that is not generated yet."""
    kernel = checked.kernel
    read = _names(value)
    statements = []
    for statement in reversed(kernel.body):
        if isinstance(statement, ir.Let) and statement.name in read:
            statements.insert(0, statement)
            read |= _names(statement.value)
    value_type = checked.types[value]
    position = value.position
    dims = value_type.dims
    decl = ir.ArrayDecl(name, value_type.dtype.name, dims, position, position, (position,) * len(dims))
    inputs = tuple(d for d in kernel.inputs if d.name in read)
    used = {d for i in inputs for d in i.dims} | set(dims)
    prologue = dataclasses.replace(
        kernel,
        name=f"{kernel.name}_{name}",
        doc=(
            f"Part of the backward pass of `{kernel.name}`, generated from its spec: its product's",
            f"operand {name}, computed again from its inputs, and the row statistics its derivative reads.",
        ),
        inputs=inputs,
        outputs=(decl,),
        params=tuple(p for p in kernel.params if p.name in read),
        body=(*statements, ir.Assign(name, value, position)),
        blocks=tuple(b for b in kernel.blocks if b.dim in used),
        accumulates=(),
        gpu_blocks=tuple(b for b in kernel.gpu_blocks if b.dim in used),
        grad_none=(),
    )
    prologue_checked, problems = check_kernel(prologue)
    if problems:
        return None, f"a computed operand that fails a check on its own ({problems[0].message})"
    return _Prologue(name, cotangent, value, prologue_checked), None


def _product_kernel(checked: CheckedKernel, node: ir.Binary, operands, prologues, constants):
    """The kernel with each computed operand an input (the prologues' outputs, and the
    `constants`' declarations), and without what only they read: its product and
    epilogue; or what makes it one that is not generated yet."""
    kernel = checked.kernel
    product = dataclasses.replace(node, left=operands[0], right=operands[1])
    body = [reverse.replaced(s, {node: product}) for s in kernel.body]
    read = set()
    for statement in reversed(body):
        if isinstance(statement, ir.Assign) or statement.name in read:
            read |= _names(statement.value)
    body = [s for s in body if isinstance(s, ir.Assign) or s.name in read]
    for prologue in prologues:
        shared = {d.name for d in prologue.checked.kernel.inputs} | {
            s.name for s in prologue.checked.kernel.body if isinstance(s, ir.Let)
        }
        if shared & read:
            return None, "a computed operand of a product whose inputs the rest of the kernel reads too"
    decls = (*(p.checked.kernel.outputs[0] for p in prologues), *constants)
    product_kernel = dataclasses.replace(
        kernel,
        inputs=(*decls, *(d for d in kernel.inputs if d.name in read)),
        body=tuple(body),
        grad_none=(),
    )
    product_checked, problems = check_kernel(product_kernel)
    if problems:
        return None, f"a product of computed operands that fails a check on its own ({problems[0].message})"
    return product_checked, None


def _product_derived(checked: CheckedKernel, namer: Namer, constants: frozenset[str]) -> Derived | str:
    """The backward kernels of the kernel of one product of inputs, none for the operands
    named in `constants`: gradients.products' where its epilogue is elementwise, else
    `_reduced_epilogue`'s."""
    if not checked.framed:
        return product_gradients.derive(checked, constants)
    return _reduced_epilogue(checked, namer, constants)


def _reduced_epilogue(checked: CheckedKernel, namer: Namer, constants: frozenset[str]) -> Derived | str:
    """The backward kernels of a product of inputs whose epilogue reduces: the epilogue's,
    by reverse mode, with its outputs read as saved, giving the product's cotangent in
    the operands' dtype; then one product kernel per operand."""
    kernel = checked.kernel
    product = product_of_inputs(kernel)  # of one dtype: `_converted_operands`
    acc = namer.claim_spec("acc")
    epilogue_kernel = product_gradients._epilogue(kernel, (product,), (acc,))
    not_yet = product_gradients.operand_beside(epilogue_kernel, (product,))
    if not_yet:
        return not_yet
    epilogue, problems = check_kernel(epilogue_kernel)
    if problems:
        return f"an epilogue that fails a check ({problems[0].message})"
    if epilogue.has_products:
        return "a product in a product's epilogue"
    derived = reverse.derive(epilogue, saved_outputs=[o.name for o in kernel.outputs])
    if isinstance(derived, str):
        return f"{derived} in the product's epilogue"
    dacc = namer.claim_spec("dacc")
    steps, g = [], None
    for step in derived.steps:
        arguments = tuple(Argument(acc, "residual") if a == Argument(acc, "input") else a for a in step.arguments)
        derived_kernel, results = step.kernel, step.results
        if acc in results:  # the product's cotangent, in its operands' dtype for the products
            index = results.index(acc)
            derived_kernel, decl = product_gradients._in_dtype(derived_kernel, index, product.lhs.dtype.name)
            results = (*results[:index], dacc, *results[index + 1 :])
            g = decl, Argument(dacc, "backward")
        steps.append(Step(derived_kernel, arguments, results))
    if g is not None:
        steps += product_gradients._product_steps(_blocked(kernel, product), (product,), (g,), constants)
    back = {ir.Name(acc, product.node.position): product.node}
    residuals = [dataclasses.replace(r, value=reverse.substitute(r.value, back)) for r in derived.residuals]
    if any(Argument(acc, "residual") in step.arguments for step in steps):
        swept = [b.dim for b in kernel.blocks if b.dim in _reduced_dims(epilogue)]
        if not swept:
            residuals.insert(0, Residual(acc, product.node))
        else:
            steps = _recomputing_product(steps, acc, dacc, product, kernel)
            if isinstance(steps, str):
                return steps
    return Derived(tuple(steps), tuple(residuals), derived.recomputed)


def _recomputing_product(steps: list[Step], acc: str, dacc: str, product, kernel: ir.Kernel) -> list[Step] | str:
    """The product kernels with the product's cotangent computed in their tiles from the
    product computed again, where the epilogue reduces the product's value over the
    dimension the kernel sweeps (fused linear + cross-entropy over a vocabulary V: saving
    `x @ w` would keep [M, V] whole). As Liger's kernel: `dx = g(x @ w) @ w.T` sweeps V,
    `dw = x.T @ g(x @ w)` sweeps M, g the epilogue's derivative reading the saved
    log-sum-exp; neither the product nor its cotangent reaches memory."""
    (epilogue,) = [step for step in steps if dacc in step.results]
    if epilogue.results != (dacc,) or any(Argument(acc, "residual") in s.arguments for s in steps if s is not epilogue):
        return "an epilogue over a swept dimension whose derivative gives more than the product's cotangent"
    # the derivative's statements, after the product computed again (as lets: a fused
    # kernel lays a let's tile out on its own, which the transposed read in dw needs)
    (assign,) = [s for s in epilogue.kernel.body if isinstance(s, ir.Assign)]
    position = assign.position
    lets = [
        ir.Let(acc, product.node, position),
        *(s for s in epilogue.kernel.body if isinstance(s, ir.Let)),
        ir.Let(dacc, assign.value, position),
    ]
    argument = Argument(acc, "residual")
    inputs = [(d, a) for d, a in zip(epilogue.kernel.inputs, epilogue.arguments) if a != argument]
    inputs += [(d, Argument(d.name, "input")) for d in kernel.inputs if d.name in (o.name for o in product.operands)]
    found = []
    for step in steps:
        if step is epilogue:
            continue
        if Argument(dacc, "backward") in step.arguments:
            whole = dataclasses.replace(  # the product's contracted dimension, as the forward holds it
                step.kernel,
                blocks=tuple(b for b in step.kernel.blocks if b.dim != product.k),
                gpu_blocks=tuple(b for b in step.kernel.gpu_blocks if b.dim != product.k),
            )
            step = dataclasses.replace(step, kernel=whole)
            value = ir.Name(dacc, position)
            step = _computed_in(step, Argument(dacc, "backward"), value, inputs, epilogue.kernel.params, lets)
            if step is None:
                return "a product kernel that cannot compute the product again in its tiles"
        found.append(step)
    return found


def _reduced_dims(checked: CheckedKernel) -> set[str]:
    """The dimensions that a kernel's reductions reduce."""
    return {d.name for d in checked.space.dims if d.reductions}


def _blocked(kernel: ir.Kernel, product) -> ir.Kernel:
    """The kernel with a block for each dimension of the product that it takes whole (the
    N a softmax reduces): its largest block rounded up to a lane tile, as product_gradients
    blocks an output taken whole, so that the product kernels' blocks stay bounded where
    that dimension is the one they contract (dx = dacc @ w.T)."""
    size = lane_tiles(max((b.size for b in kernel.blocks), default=TPU_LANES))
    whole = [d for d in (product.m, product.n, product.k) if all(b.dim != d for b in kernel.blocks)]
    added = tuple(ir.BlockSize(d, size, kernel.position, kernel.position) for d in whole)
    return dataclasses.replace(kernel, blocks=kernel.blocks + added)


def _prologue_steps(prologue: _Prologue, steps: list[Step], namer: Namer):
    """`steps` (the product's) reading the operand from a kernel that computes it again,
    then the prologue's backward kernels, which take the operand's cotangent (the
    product's steps' result) to the inputs'; and the forward values computed again. Or
    what the prologue has that they are not generated for yet."""
    derived = _operand_derived(prologue.checked)
    if isinstance(derived, str):
        return f"{derived} in a computed operand of a product"
    kernel = prologue.checked.kernel
    inputs = {d.name for d in kernel.inputs}
    # the residuals of the prologue's reverse mode (its row statistics) and its own
    # intermediates, passed between the backward kernels under names no forward array has
    renamed = {r.name: namer.claim_spec(r.name) for r in derived.residuals}
    renamed |= {n: namer.claim_spec(n) for s in derived.steps for n in s.results if n not in inputs}

    def operand(argument: Argument) -> Argument:  # as the product's steps read it
        if argument.name == prologue.name and argument.source == "input":
            return Argument(prologue.name, "backward")
        return argument

    def passed(argument: Argument) -> Argument:  # as the prologue's backward kernels read it
        if argument.name == prologue.name and argument.source == "cotangent":
            return Argument(prologue.cotangent, "backward")
        if argument.name == prologue.name and argument.source == "output":
            return Argument(prologue.name, "backward")
        if argument.source in ("residual", "backward"):
            return Argument(renamed[argument.name], "backward")
        return argument

    product_steps = [
        _inlined(
            Step(
                s.kernel,
                tuple(operand(a) for a in s.arguments),
                tuple(prologue.cotangent if r == prologue.name else r for r in s.results),
            ),
            prologue,
        )
        for s in steps
    ]
    backward = [
        Step(s.kernel, tuple(passed(a) for a in s.arguments), tuple(renamed.get(r, r) for r in s.results))
        for s in derived.steps
    ]
    read = {a for s in product_steps + backward for a in s.arguments}
    wanted = [r for r in derived.residuals if Argument(renamed[r.name], "backward") in read]
    recomputing = []
    if wanted or Argument(prologue.name, "backward") in read:
        recomputing = [_recomputing(prologue, wanted, renamed)]
    recomputed = [s.name for s in kernel.body if isinstance(s, ir.Let)] if recomputing else []
    recomputed += [prologue.name, *(r.name for r in wanted)] if recomputing else []
    return [*recomputing, *product_steps, *backward], [*recomputed, *derived.recomputed]


def _operand_derived(checked: CheckedKernel) -> Derived | str:
    """The backward kernels of a computed operand's kernel: reverse mode's, or where it
    has products (an FFN's hidden layer `bf16(silu(x @ w1) * (x @ w3))` before `@ w2`)
    this derivation's or gradients.products'."""
    if not checked.has_products:
        return reverse.derive(checked)
    derived = derive(checked)
    return product_gradients.derive(checked) if derived is None else derived


def _inlined(step: Step, prologue: _Prologue) -> Step:
    """The step computing the operand itself where it reads it and the operand is an
    elementwise value of inputs (`bf16(w)`: the kernel reads w's int8 and converts it in
    its tiles, and no kernel writes the bf16 copy); else the step as it is."""
    argument = Argument(prologue.name, "backward")
    checked = prologue.checked
    if (
        argument not in step.arguments
        or len(checked.kernel.body) > 1
        or checked.has_products
        or any(d.reductions for d in checked.space.dims)
    ):
        return step
    (assign,) = checked.kernel.body
    inputs = [(decl, Argument(decl.name, "input")) for decl in checked.kernel.inputs]
    return _computed_in(step, argument, assign.value, inputs, checked.kernel.params) or step


def _computed_in(step: Step, argument: Argument, value: ir.Expr, inputs, params, lets=()) -> Step | None:
    """The step with the array it takes as `argument` computed in its tiles from `value`,
    which reads `inputs` ((decl, argument) pairs), `params` and the `lets` put first;
    None where the kernel that gives fails a check, or takes an array of one of their
    names otherwise."""
    kernel = step.kernel
    name = kernel.inputs[step.arguments.index(argument)].name
    arrays = {decl.name: (decl, a) for decl, a in zip(kernel.inputs, step.arguments) if a != argument}
    for decl, given in inputs:
        if arrays.setdefault(decl.name, (decl, given)) != (decl, given):
            return None
    position = value.position
    reads = [n for s in kernel.body for n in ir.walk(s.value) if isinstance(n, ir.Name) and n.id == name]
    read_transposed = [
        n for s in kernel.body for n in ir.walk(s.value) if isinstance(n, ir.Attribute) and n.value in reads
    ]
    # the value as computed is laid out in the kernel's dimension order: as stored, or the other way round
    for mapping in (
        dict.fromkeys(reads, value),
        {**dict.fromkeys(reads, ir.Attribute(value, "T", position, position)), **dict.fromkeys(read_transposed, value)},
    ):
        inlined = dataclasses.replace(
            kernel,
            inputs=tuple(decl for decl, _ in arrays.values()),
            params=(*kernel.params, *(p for p in params if p not in kernel.params)),
            body=(*lets, *(reverse.replaced(s, mapping) for s in kernel.body)),
        )
        if not check_kernel(inlined)[1]:
            return Step(inlined, tuple(a for _, a in arrays.values()), step.results)
    return None


def _recomputing(prologue: _Prologue, residuals: list[Residual], renamed: dict[str, str]) -> Step:
    """The prologue's kernel with the residuals its backward kernels read as outputs
    after the operand: each assigned where the body computes it, read from there on by
    its name (or computed last where the body does not compute it)."""
    checked = prologue.checked
    kernel = checked.kernel
    body = list(kernel.body)
    outputs = list(kernel.outputs)
    for residual in residuals:
        position = residual.value.position
        value_type = checked.types.get(residual.value)
        dtype = residual.dtype or value_type.dtype.name
        dims = residual.dims if residual.dtype else value_type.dims
        outputs.append(ir.ArrayDecl(residual.name, dtype, dims, position, position, (position,) * len(dims)))
        at = next((i for i, s in enumerate(body) if residual.value in ir.walk(s.value)), None)
        assign = ir.Assign(residual.name, residual.value, position)
        if at is None:
            body.append(assign)
            continue
        name = ir.Name(residual.name, position)
        body[at:] = [reverse.replaced(s, {residual.value: name}) for s in body[at:]]
        body.insert(at, assign)
    recomputing = dataclasses.replace(kernel, outputs=tuple(outputs), body=tuple(body))
    arguments = tuple(Argument(d.name, "input") for d in kernel.inputs)
    return Step(recomputing, arguments, (prologue.name, *(renamed[r.name] for r in residuals)))


def _names(node: ir.Expr) -> set[str]:
    return {n.id for n in ir.walk(node) if isinstance(n, ir.Name)}
