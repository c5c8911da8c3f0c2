"""Every user error in a spec is found here, with its position.

Each check is a small function from a kernel (and what earlier checks derived) to a
list of diagnostics; `check_kernel` runs them in order, then types every expression
(`infer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import BOOL, DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.carries import Sweep, sweep_over
from pallasgen.analysis.fused import FusedKernel, analyze_fused, layout_frame
from pallasgen.frontend.errors import Diagnostic, Position, did_you_mean
from pallasgen.analysis.infer import dims_text, infer_body, literal_problem
from pallasgen.analysis.names import RESERVED, block_keyword
from pallasgen.analysis.product import Product, find_products, single_product
from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.analysis.space import Dimension, IterationSpace, Reduction, declared_dims
from pallasgen.analysis.valuetypes import ValueType

MAX_BLOCK = 1 << 24


class Diagnostics(Exception):
    """Raised with every diagnostic of a spec that has errors."""

    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__(f"{len(diagnostics)} errors")
        self.diagnostics = diagnostics


@dataclass(frozen=True)
class CheckedKernel:
    """A kernel that passed every check, with what the checks derived."""

    kernel: ir.Kernel
    space: IterationSpace
    size_sources: dict[str, tuple[str, int]]  # dim -> (input name, axis) giving its size
    types: dict[ir.Expr, ValueType] = field(hash=False)
    blocks: dict[str, int]  # blocked dims -> default block size (the `block` statement)
    # Its matrix work where that is one product of two inputs (`analysis.product.single_product`),
    # a form a backend may plan as a product alone; its tiles are the frame's all the same.
    product: Product | None
    settings: dict[str, object] = field(hash=False)  # each backend's own, by backend name
    # From the spec's tuning file (pallasgen tune): each backend's tuned blocks, by backend name.
    tuned: dict[str, tuple[TunedBlocks, ...]] = field(default_factory=dict, hash=False)
    # Every kernel's tiles (analysis.fused): its products', or over the layout of a kernel
    # without products. The TPU and Triton plan every kernel from them, Mosaic GPU those
    # with products.
    frame: FusedKernel | None = None
    sweep: Sweep | None = None  # what any kernel carries across its swept dimension: see analysis.carries
    gradient: object = None  # how jax.grad differentiates it (gradients.derive.Gradient); None: not yet

    @property
    def dims(self) -> tuple[str, ...]:
        return self.space.names

    @property
    def framed(self) -> bool:
        """Whether it has products and no `product` alone: several, of a computed operand,
        or beside a reduction (`analysis.fused.is_framed`)."""
        return self.product is None and self.frame is not None and bool(self.frame.products)

    @property
    def batch(self) -> tuple[str, ...]:
        """The dimensions it steps one element at a time (blocked by 1, squeezed out of its
        tiles): its frame's batch dimensions, those outside every product's matrices."""
        return self.frame.batch if self.frame is not None else ()

    @property
    def has_products(self) -> bool:
        """Whether it has a matrix product (`@`), one or several."""
        return self.product is not None or self.framed

    def tuned_for(self, backend: str) -> tuple[TunedBlocks, ...]:
        """The blocks tuned for one backend (by its name), on each chip or GPU and size bucket."""
        return self.tuned.get(backend, ())


def check_spec(spec: ir.Spec, backends=()) -> tuple[CheckedKernel, ...]:
    """Runs every check over every kernel, the language's and then each backend's
    (`backend.check`); raises `Diagnostics` if any fails."""
    found = check_kernel_names(spec)
    checked = []
    for kernel in spec.kernels:
        result, problems = check_kernel(kernel, backends)
        if not problems:  # the backends' keywords are known only for a kernel that checks
            problems = backend_keyword_problems(result, backends)
        found.extend(problems)
        checked.append(result)
    if found:
        raise Diagnostics(found)
    return tuple(checked)


def check_kernel_names(spec: ir.Spec) -> list[Diagnostic]:
    found = []
    seen: set[str] = set()
    for kernel in spec.kernels:
        if kernel.name in seen:
            found.append(Diagnostic(kernel.position, f"kernel '{kernel.name}' is defined twice"))
        elif kernel.name in RESERVED or kernel.name.startswith("_"):
            found.append(
                Diagnostic(
                    kernel.position, f"'{kernel.name}' cannot name a kernel: the generated module uses that name"
                )
            )
        seen.add(kernel.name)
    if not spec.kernels:
        found.append(Diagnostic(Position.point(1, 1), "no kernel in this spec"))
    return found


def check_kernel(kernel: ir.Kernel, backends=()) -> tuple[CheckedKernel, list[Diagnostic]]:
    """Every check of one kernel, in one pass: its declarations, its iteration space and
    blocks, the types of its body, its tiles (its frame, `analysis.fused`) and what it
    carries across its swept dimension, then each backend's checks."""
    found: list[Diagnostic] = []
    for check in (check_declarations, check_dtypes, check_params):
        found.extend(check(kernel))
    products = find_products(kernel)
    space, sizes, space_problems = derive_space(kernel)
    found.extend(space_problems)
    unplaced = declared_dims(kernel) - set(space.names)
    blocks, problems = block_items(kernel.blocks, space.names, "block", block_size_problem, unplaced)
    found.extend(problems)
    types, type_problems = infer_body(kernel, space.names)
    if not space_problems and not products:  # a product's blocks follow its frame's rules
        blocks, problems = reduction_blocks(kernel, space, blocks, types)
        found.extend(problems)
    found.extend(type_problems)
    found.extend(check_accumulate(kernel, products, types))
    frame, sweep = None, None
    if not found:
        frame, problems = _frame(kernel, space, types, blocks)
        found.extend(problems)
    if frame is not None:
        sweep, problems = sweep_of(kernel, types, blocks, frame.batch)
        found.extend(problems)
    product = single_product(kernel) if not found else None
    if product is not None:
        space = _contracted(space, product)
    checked = CheckedKernel(kernel, space, sizes, types, blocks, product, {}, sweep=sweep, frame=frame)
    passed = None if found else checked  # the backends check its tiles once it has passed
    settings = {}
    for backend in backends:
        settings[backend.name], problems = backend.check(kernel, space, product, blocks, found, checked=passed)
        found.extend(problems)
    return replace(checked, settings=settings), found


def _frame(kernel: ir.Kernel, space: IterationSpace, types, blocks: dict[str, int]):
    """The kernel's tiles (`analysis.fused`), or the diagnostics saying why not."""
    if find_products(kernel):
        return analyze_fused(kernel, types, space.names, blocks)
    output_dims = {d for out in kernel.outputs for d in out.dims}
    return layout_frame(types, space.layout, blocks, output_dims), []


def sweep_of(kernel: ir.Kernel, types, blocks: dict[str, int], batch) -> tuple[Sweep | None, list[Diagnostic]]:
    """The pass over the kernel's blocked dimension that no output has (other than a
    batch one), if any: what it carries (`analysis.carries`)."""
    output_dims = {d for out in kernel.outputs for d in out.dims}
    dim = next((d for d in blocks if d not in output_dims and d not in batch), None)
    return sweep_over(kernel, types, dim) if dim else (None, [])


def _product_kernel_dims(kernel: ir.Kernel) -> tuple[str, ...]:
    """A kernel with products: its dimensions are the outputs', then the others in the
    inputs' order."""
    dims: list[str] = []
    for decl in kernel.outputs + kernel.inputs:
        dims.extend(d for d in decl.dims if d not in dims)
    return tuple(dims)


def check_declarations(kernel: ir.Kernel) -> list[Diagnostic]:
    """Names are unique; params do not take the generated keywords."""
    found = []
    seen: dict[str, str] = {}
    named = [(d, "an input") for d in kernel.inputs] + [(d, "an output") for d in kernel.outputs]
    named += [(p, "a param") for p in kernel.params] + [(s, "a let") for s in kernel.body if isinstance(s, ir.Let)]
    for item, what in named:
        if item.name in seen:
            found.append(Diagnostic(item.position, f"'{item.name}' is already declared as {seen[item.name]}"))
        else:
            seen[item.name] = what
    keywords = {block_keyword(d) for d in declared_dims(kernel)}
    found.extend(reserved_param_problems(kernel, RESERVED | keywords))
    if not kernel.outputs:
        found.append(Diagnostic(kernel.position, f"kernel '{kernel.name}' has no output"))
    for item, what in named:
        if item.name == "inf":
            found.append(Diagnostic(item.position, "'inf' is the infinity literal; it cannot name a value"))
    return found


def backend_keyword_problems(checked: CheckedKernel, backends) -> list[Diagnostic]:
    """Params that would take a keyword a backend adds to the public function
    (`gpu_backend`, `mgpu_stages`, ...) or a name its generated code uses."""
    taken = set()
    for backend in backends:
        taken.update(k.name for k in backend.keywords(checked).keywords)
        taken.update(backend.reserved_names(checked))
    return reserved_param_problems(checked.kernel, taken)


def reserved_param_problems(kernel: ir.Kernel, reserved) -> list[Diagnostic]:
    """Params that would take a name the generated code uses (`reserved`)."""
    return [
        Diagnostic(param.position, f"'{param.name}' cannot name a param: the generated code uses that name; rename it")
        for param in kernel.params
        if param.name in reserved
    ]


def check_dtypes(kernel: ir.Kernel) -> list[Diagnostic]:
    found = []
    for decl in kernel.inputs + kernel.outputs:
        if decl.dtype not in DTYPES:
            found.append(_unknown_dtype(decl.dtype, decl.dtype_position))
    return found


def check_params(kernel: ir.Kernel) -> list[Diagnostic]:
    found = []
    for param in kernel.params:
        dtype = DTYPES.get(param.dtype)
        if dtype is None:
            found.append(_unknown_dtype(param.dtype, param.dtype_position))
        elif dtype == BOOL:
            found.append(Diagnostic(param.dtype_position, "params are numbers; bool params are not supported"))
        elif dtype.is_integer and isinstance(param.value, float):
            found.append(
                Diagnostic(
                    param.value_position, f"param '{param.name}' is {dtype.name} but {param.text} is not an integer"
                )
            )
        else:
            problem = literal_problem(param.value, param.text, dtype)
            if problem:
                found.append(Diagnostic(param.value_position, problem))
    return found


def check_accumulate(kernel: ir.Kernel, products: list[ir.Binary], types) -> list[Diagnostic]:
    """`accumulate` is given once, for a kernel with products, and names the dtype they
    accumulate in (`analysis.infer`: f32 for float operands, i32 for integers)."""
    found = []
    for extra in kernel.accumulates[1:]:
        found.append(Diagnostic(extra.position, "accumulate is given twice"))
    for acc in kernel.accumulates[:1]:
        if acc.dtype not in DTYPES:
            found.append(_unknown_dtype(acc.dtype, acc.position))
        elif not products:
            found.append(Diagnostic(acc.position, "accumulate applies only to a kernel with a matrix product (@)"))
        elif products[0] in types and types[products[0]].dtype.name != acc.dtype:
            accumulator = types[products[0]].dtype
            kind = "float" if accumulator.is_float else "integer"
            found.append(
                Diagnostic(acc.position, f"{kind} operands accumulate in {accumulator.name} on TPU, not {acc.dtype}")
            )
    return found


def derive_space(kernel: ir.Kernel) -> tuple[IterationSpace, dict[str, tuple[str, int]], list[Diagnostic]]:
    """The iteration space, where each size comes from, and the dimension rules (those of
    a kernel with products are its frame's, `analysis.fused`)."""
    found = repeated_dims(kernel)
    if not kernel.outputs:
        return IterationSpace(()), {}, found
    first = kernel.outputs[0]
    sizes: dict[str, tuple[str, int]] = {}
    for decl in kernel.inputs:
        for axis, dim in enumerate(decl.dims):
            sizes.setdefault(dim, (decl.name, axis))
    unsized: set[str] = set()  # output dimensions no input has: reported once each
    for out in kernel.outputs:
        for dim, position in zip(out.dims, out.dim_positions):
            if dim not in sizes and dim not in unsized:
                unsized.add(dim)
                found.append(
                    Diagnostic(
                        position, f"no input has dimension {dim}, so its size is unknown when the kernel is called"
                    )
                )
    if find_products(kernel):
        dims, problems = _product_kernel_dims(kernel), []
    else:
        dims, problems = _layout(kernel, unsized)
    found.extend(problems)
    keywords: dict[str, str] = {}
    for dim in dims:
        other = keywords.setdefault(block_keyword(dim), dim)
        if other != dim:
            found.append(
                Diagnostic(first.position, f"dimensions {other} and {dim} would share the keyword {block_keyword(dim)}")
            )
    return _space(kernel, dims), sizes, found


def repeated_dims(kernel: ir.Kernel) -> list[Diagnostic]:
    found = []
    for decl in kernel.inputs + kernel.outputs:
        seen = set()
        for dim, position in zip(decl.dims, decl.dim_positions):
            if dim in seen:
                found.append(Diagnostic(position, f"dimension {dim} appears twice in '{decl.name}'"))
            seen.add(dim)
    return found


def reduction_blocks(
    kernel: ir.Kernel, space: IterationSpace, blocks: dict[str, int], types=None
) -> tuple[dict[str, int], list[Diagnostic]]:
    """The blocks without those of reduced dimensions that must be left unblocked, and
    why: a reduced dimension is blocked only where no output keeps it, one such
    dimension per kernel, and no reduction over it needs another reduction over it first.
    A reduction that `types` (the body's types, where given) lacks is wrong, and
    reported: it says nothing of its dimension."""
    found = []
    refused = set()
    items = {item.dim: item for item in kernel.blocks}
    stepped = []
    for dim in space.dims:
        if dim.name not in blocks or not dim.reductions or dim.reductions[0].kind == "dot":
            continue
        if types is not None and any(r.node not in types for r in dim.reductions):
            refused.add(dim.name)
            continue
        call = dim.reductions[0].node
        where = f"{call.func}(..., {dim.name}) at line {call.position.line}"
        if dim.kept:
            refused.add(dim.name)
            keeper = next(out.name for out in kernel.outputs if dim.name in out.dims)
            found.append(
                Diagnostic(
                    items[dim.name].position,
                    f"{dim.name} is reduced ({where}) and output '{keeper}' keeps it, so a block holds all of"
                    f" {dim.name}: leave {dim.name} unblocked",
                )
            )
        elif stepped:
            refused.add(dim.name)
            found.append(
                Diagnostic(
                    items[dim.name].position,
                    f"one reduced dimension of a kernel can be blocked, and {stepped[0]} is: leave {dim.name}"
                    " unblocked",
                )
            )
        else:
            stepped.append(dim.name)
            nested = _nested_problems(dim)
            found.extend(nested)
            if nested:
                refused.add(dim.name)
    return {dim: size for dim, size in blocks.items() if dim not in refused}, found


def _nested_problems(dim: Dimension) -> list[Diagnostic]:
    """Reductions over a blocked dimension inside another over it (two passes over it)."""
    found = []
    for reduction in dim.reductions:
        for inner in list(ir.walk(reduction.node.args[0]))[1:]:
            if isinstance(inner, ir.Call) and inner in {r.node for r in dim.reductions}:
                found.append(
                    Diagnostic(
                        inner.position,
                        f"{reduction.node.func}() over {dim.name} needs this {inner.func}() over {dim.name} first,"
                        f" a second pass over a blocked {dim.name}: leave {dim.name} unblocked"
                        + (" (or use logsumexp)" if inner.func == "max" else ""),
                    )
                )
    return found


def _layout(kernel: ir.Kernel, unsized: set[str]) -> tuple[tuple[str, ...], list[Diagnostic]]:
    """The dimension order every array is laid out over: that of the first array, inputs
    then outputs, that has every dimension of the kernel. The others follow its order;
    where they cannot, dimensions already reported `unsized` go unmentioned."""
    arrays = [*kernel.inputs, *kernel.outputs]
    every = {d for decl in arrays for d in decl.dims}
    if not every:
        return (), [
            Diagnostic(kernel.position, f"every array of kernel '{kernel.name}' is a scalar; a kernel has a dimension")
        ]
    parent = next((decl for decl in [*kernel.outputs, *arrays] if set(decl.dims) == every), None)
    if parent is None:  # an array has a dimension the outputs lack, and no reduction explains it
        widest = max(kernel.outputs, key=lambda out: len(out.dims))
        problems = [problem for decl in arrays for problem in _subsequence_problems(decl, widest.dims, unsized)]
        return widest.dims, problems
    found = []
    for decl in arrays:
        found.extend(_subsequence_problems(decl, parent.dims, unsized))
    return parent.dims, found


def _reductions(kernel: ir.Kernel) -> list[ir.Call]:
    """Every reduction call in the kernel body, in source order."""
    calls = [
        node
        for node in ir.walk(*(s.value for s in kernel.body))
        if isinstance(node, ir.Call) and node.func in FUNCTIONS and FUNCTIONS[node.func].reducer
    ]
    return sorted(calls, key=lambda n: (n.position.line, n.position.column))


def _space(kernel: ir.Kernel, dims: tuple[str, ...]) -> IterationSpace:
    """Each dimension kept (an output has it) or reduced, with the reductions over it. A
    kernel with products has its reductions in its frame and its carries
    (`analysis.carries`)."""
    output_dims = {d for out in kernel.outputs for d in out.dims}
    calls = [] if find_products(kernel) else _reductions(kernel)
    over = {d: tuple(Reduction(c.func, c) for c in calls if _reduced_dim(c) == d) for d in dims}
    return IterationSpace(tuple(Dimension(d, kept=d in output_dims, reductions=over[d]) for d in dims))


def _contracted(space: IterationSpace, product: Product) -> IterationSpace:
    """The space of a kernel whose matrix work is its `single_product`: the contracted
    dimension, last, reduced by a `dot`; the other arrays are laid out without it."""
    kept = tuple(d for d in space.dims if d.name != product.k)
    contracted = Dimension(product.k, kept=False, reductions=(Reduction("dot", product.node),))
    return IterationSpace((*kept, contracted), contracted=product.k)


def _reduced_dim(call: ir.Call) -> str | None:
    dim = call.args[1] if len(call.args) == 2 else None
    return dim.id if isinstance(dim, ir.Name) else None


def _subsequence_problems(decl: ir.ArrayDecl, dims: tuple[str, ...], unsized: set[str]) -> list[Diagnostic]:
    """Why `decl` does not list a subsequence of the outputs' `dims`. Where an output has
    a dimension no input has (`unsized`, reported), the outputs' dimensions are in doubt:
    a dimension missing from them goes unmentioned."""
    last = -1
    for dim, position in zip(decl.dims, decl.dim_positions):
        if dim in unsized or (dim not in dims and unsized):
            continue
        if dim not in dims:
            return [
                Diagnostic(
                    position,
                    f"dimension {dim} of '{decl.name}' is not a dimension of the outputs {dims_text(dims)}"
                    f"{did_you_mean(dim, dims)}; only a matrix product contracts a dimension",
                )
            ]
        if dims.index(dim) < last:
            return [
                Diagnostic(
                    position,
                    f"'{decl.name}' lists its dimensions {dims_text(decl.dims)} in another order than the outputs"
                    f" {dims_text(dims)}; broadcasting keeps the order",
                )
            ]
        last = dims.index(dim)
    return []


def block_items(items, dims, what: str, size_problem, unplaced=frozenset()) -> tuple[dict[str, int], list[Diagnostic]]:
    """Sizes of `block` or `gpu block` items that name a dimension once with a valid size.
    Items naming an `unplaced` dimension (declared, but the space lacks it for an error
    reported already), or any dimension of a kernel that has none, are left out
    without a word."""
    found = []
    blocks: dict[str, int] = {}
    for item in items:
        if item.dim in blocks:
            found.append(Diagnostic(item.position, f"{what} size of {item.dim} is given twice"))
        elif item.dim in unplaced or not dims:  # no dimensions: the kernel's error says why
            continue
        elif item.dim not in dims:
            found.append(
                Diagnostic(item.position, f"{item.dim} is not a dimension of this kernel{did_you_mean(item.dim, dims)}")
            )
        elif problem := size_problem(item):
            found.append(Diagnostic(item.size_position, problem))
        else:
            blocks[item.dim] = item.size
    return blocks, found


def block_size_problem(item: ir.BlockSize) -> str | None:
    if isinstance(item.size, float):
        return "a block size is a whole number"
    if not 1 <= item.size <= MAX_BLOCK:
        return f"a block size is between 1 and {MAX_BLOCK}"
    return None


def _unknown_dtype(name: str, position: Position) -> Diagnostic:
    return Diagnostic(position, f"unknown dtype '{name}'{did_you_mean(name, DTYPES)}; dtypes are {', '.join(DTYPES)}")
