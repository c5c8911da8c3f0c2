"""Every user error in a spec is found here, with its position.

Each check is a small function from a kernel (and what earlier checks derived) to a
list of diagnostics; `check_spec` runs them in order and types every expression.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ir
from .dtypes import BOOL, DTYPES, F32, FLOAT_MAX, I32, DType
from .errors import Diagnostic, Position, did_you_mean
from .gpu import GPU_FUNCTION_LOCALS, OPTIONS, default_blocks, default_options, gpu_keywords, is_power_of_two
from .names import RESERVED, block_keyword
from .product import Product, analyze_product, find_products, operand_names, product_dims
from .tiling import array_layouts, tiling_problem, vmem_problem
from .valuetypes import ValueType, combine, merge_dims

FLOAT_FUNCTIONS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "silu", "sin", "cos"})
SAME_TYPE_FUNCTIONS = frozenset({"abs", "relu", "floor", "ceil"})
FUNCTION_ARITY = {
    **{name: 1 for name in FLOAT_FUNCTIONS | SAME_TYPE_FUNCTIONS},
    "maximum": 2,
    "minimum": 2,
    "clip": 3,
    "where": 3,
    **{name: 1 for name in DTYPES},
}
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "//", "%", "**"})
COMPARISON_OPS = frozenset({"==", "!=", "<", "<=", ">", ">="})
LOGIC_OPS = frozenset({"&", "|"})
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
    dims: tuple[str, ...]  # the iteration space: the outputs' dimensions, then a contracted one
    size_sources: dict[str, tuple[str, int]]  # dim -> (input name, axis) giving its size
    types: dict[ir.Expr, ValueType] = field(hash=False)
    blocks: dict[str, int]  # blocked dims -> default block size
    product: Product | None
    gpu_blocks: dict[str, int]  # every dim the GPU path blocks -> default block size
    gpu_options: dict[str, int]  # warps, stages


def check_spec(spec: ir.Spec) -> tuple[CheckedKernel, ...]:
    """Runs every check over every kernel; raises `Diagnostics` if any fails."""
    found = check_kernel_names(spec)
    checked = []
    for kernel in spec.kernels:
        result, problems = check_kernel(kernel)
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
    for kernel in spec.kernels:
        if kernel.name.endswith("_reference") and kernel.name[: -len("_reference")] in seen:
            found.append(Diagnostic(kernel.position, f"'{kernel.name}' is the name of another kernel's reference"))
    if not spec.kernels:
        found.append(Diagnostic(Position.point(1, 1), "no kernel in this spec"))
    return found


def check_kernel(kernel: ir.Kernel) -> tuple[CheckedKernel, list[Diagnostic]]:
    found: list[Diagnostic] = []
    for check in (check_declarations, check_dtypes, check_params):
        found.extend(check(kernel))
    product, problems = analyze_product(kernel)
    found.extend(problems)
    found.extend(check_accumulate(kernel, product))
    dims, sizes, problems = derive_dims(kernel, product)
    found.extend(problems)
    blocks, problems = check_blocks(kernel, dims, product)
    found.extend(problems)
    (gpu_blocks, gpu_options), problems = check_gpu(kernel, dims, product, found)
    found.extend(problems)
    types, problems = infer_body(kernel, dims, product)
    found.extend(problems)
    return CheckedKernel(kernel, dims, sizes, types, blocks, product, gpu_blocks, gpu_options), found


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
    dims = {d for decl in kernel.inputs + kernel.outputs for d in decl.dims}
    block_keywords = {block_keyword(d) for d in dims} | gpu_keywords(dims) | set(GPU_FUNCTION_LOCALS)
    for param in kernel.params:
        if param.name in RESERVED | block_keywords:
            found.append(
                Diagnostic(
                    param.position,
                    f"'{param.name}' cannot name a param: the generated code uses that name; rename it",
                )
            )
    if not kernel.outputs:
        found.append(Diagnostic(kernel.position, f"kernel '{kernel.name}' has no output"))
    return found


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


def check_accumulate(kernel: ir.Kernel, product: Product | None) -> list[Diagnostic]:
    found = []
    for extra in kernel.accumulates[1:]:
        found.append(Diagnostic(extra.position, "accumulate is given twice"))
    for acc in kernel.accumulates[:1]:
        if acc.dtype not in DTYPES:
            found.append(_unknown_dtype(acc.dtype, acc.position))
        elif not find_products(kernel):
            found.append(Diagnostic(acc.position, "accumulate applies only to a kernel with a matrix product (@)"))
    return found


def derive_dims(
    kernel: ir.Kernel, product: Product | None
) -> tuple[tuple[str, ...], dict[str, tuple[str, int]], list[Diagnostic]]:
    """The iteration space, where each size comes from, and the dimension rules."""
    found = []
    for decl in kernel.inputs + kernel.outputs:
        seen = set()
        for dim, position in zip(decl.dims, decl.dim_positions):
            if dim in seen:
                found.append(Diagnostic(position, f"dimension {dim} appears twice in '{decl.name}'"))
            seen.add(dim)
    if not kernel.outputs:
        return (), {}, found
    first = kernel.outputs[0]
    dims = first.dims
    if not dims:
        found.append(
            Diagnostic(first.position, f"output '{first.name}' is a scalar; outputs need at least one dimension")
        )
    for out in kernel.outputs[1:]:
        if out.dims != dims:
            found.append(
                Diagnostic(
                    out.position,
                    f"all outputs of a kernel have the same dimensions: '{out.name}' is {_dims(out.dims)}"
                    f" but '{first.name}' is {_dims(dims)}",
                )
            )
    operands = operand_names(kernel)
    for decl in kernel.inputs:
        if decl.name not in operands:
            found.extend(_subsequence_problems(decl, dims))
    if product is not None:
        value_dims = product_dims(product)
        if sorted(value_dims) != sorted(dims) or dims[-2:] != value_dims[-2:]:
            found.append(
                Diagnostic(
                    product.node.position,
                    f"the product is {_dims(value_dims)} but the outputs are {_dims(dims)}; they have the"
                    f" same dimensions, ending in {product.m}, {product.n}",
                )
            )
        elif product.k in dims:
            found.append(
                Diagnostic(product.node.position, f"the contracted dimension {product.k} cannot be an output dimension")
            )
        dims = (*dims, product.k)
    sizes: dict[str, tuple[str, int]] = {}
    for decl in kernel.inputs:
        for axis, dim in enumerate(decl.dims):
            sizes.setdefault(dim, (decl.name, axis))
    for out in kernel.outputs:
        for dim, position in zip(out.dims, out.dim_positions):
            if dim not in sizes:
                found.append(
                    Diagnostic(
                        position, f"no input has dimension {dim}, so its size is unknown when the kernel is called"
                    )
                )
    keywords: dict[str, str] = {}
    for dim in dims:
        other = keywords.setdefault(block_keyword(dim), dim)
        if other != dim:
            found.append(
                Diagnostic(first.position, f"dimensions {other} and {dim} would share the keyword {block_keyword(dim)}")
            )
    return dims, sizes, found


def _subsequence_problems(decl: ir.ArrayDecl, dims: tuple[str, ...]) -> list[Diagnostic]:
    last = -1
    for dim, position in zip(decl.dims, decl.dim_positions):
        if dim not in dims:
            return [
                Diagnostic(
                    position,
                    f"dimension {dim} of '{decl.name}' is not a dimension of the outputs {_dims(dims)}"
                    f"{did_you_mean(dim, dims)}; only a matrix product contracts a dimension",
                )
            ]
        if dims.index(dim) < last:
            return [
                Diagnostic(
                    position,
                    f"'{decl.name}' lists its dimensions {_dims(decl.dims)} in another order than the outputs"
                    f" {_dims(dims)}; broadcasting keeps the order",
                )
            ]
        last = dims.index(dim)
    return []


def check_blocks(
    kernel: ir.Kernel, dims: tuple[str, ...], product: Product | None
) -> tuple[dict[str, int], list[Diagnostic]]:
    """Block sizes name dimensions of the kernel, are positive, and tile on TPU."""
    blocks, found = _block_items(kernel.blocks, dims, "block", _block_size_problem)
    if found or not kernel.outputs:
        return blocks, found
    if product is not None:
        found.extend(_batch_block_problems(kernel, product, blocks))
    layouts = array_layouts(kernel, dims, product)
    for item in kernel.blocks:
        problem = tiling_problem(item.dim, item.size, layouts)
        if problem:
            found.append(Diagnostic(item.position, problem))
    known_dtypes = all(d.dtype in DTYPES for d in kernel.inputs + kernel.outputs)
    if kernel.blocks and known_dtypes and not found:
        problem = vmem_problem(kernel, blocks, product)
        if problem:
            found.append(Diagnostic(kernel.blocks[0].position, problem))
    return blocks, found


def _block_items(items, dims, what: str, size_problem) -> tuple[dict[str, int], list[Diagnostic]]:
    """Sizes of `block` or `gpu block` items that name a dimension once with a valid size."""
    found = []
    blocks: dict[str, int] = {}
    for item in items:
        if item.dim in blocks:
            found.append(Diagnostic(item.position, f"{what} size of {item.dim} is given twice"))
        elif item.dim not in dims:
            found.append(
                Diagnostic(item.position, f"{item.dim} is not a dimension of this kernel{did_you_mean(item.dim, dims)}")
            )
        elif problem := size_problem(item):
            found.append(Diagnostic(item.size_position, problem))
        else:
            blocks[item.dim] = item.size
    return blocks, found


def _block_size_problem(item: ir.BlockSize) -> str | None:
    if isinstance(item.size, float):
        return "a block size is a whole number"
    if not 1 <= item.size <= MAX_BLOCK:
        return f"a block size is between 1 and {MAX_BLOCK}"
    return None


def _batch_block_problems(kernel: ir.Kernel, product: Product, blocks: dict[str, int]) -> list[Diagnostic]:
    """A matmul kernel takes one batch element per step, so its tiles are matrices."""
    found = []
    out = kernel.outputs[0]
    for dim, position in list(zip(out.dims, out.dim_positions))[:-2]:
        if blocks.get(dim) != 1:
            item = next((b for b in kernel.blocks if b.dim == dim), None)
            found.append(
                Diagnostic(
                    item.position if item else position,
                    f"batch dimension {dim} of a matrix product is blocked by 1: write block {dim} = 1",
                )
            )
    return found


def check_gpu(
    kernel: ir.Kernel, dims: tuple[str, ...], product: Product | None, earlier: list[Diagnostic]
) -> tuple[tuple[dict[str, int], dict[str, int]], list[Diagnostic]]:
    """`gpu block` sizes are powers of two (Triton's rule) and `gpu` options are known."""
    batch = set(kernel.outputs[0].dims[:-2]) if product is not None and kernel.outputs else set()

    def gpu_size_problem(item: ir.BlockSize) -> str | None:
        if isinstance(item.size, float) or not is_power_of_two(item.size) or item.size > MAX_BLOCK:
            return f"a GPU block size is a power of two (Triton's rule), not {item.size}"
        if item.dim in batch and item.size != 1:
            return f"batch dimension {item.dim} of a matrix product is blocked by 1"
        return None

    blocks, found = _block_items(kernel.gpu_blocks, dims, "GPU block", gpu_size_problem)
    options: dict[str, int] = {}
    for option in kernel.gpu_options:
        if option.name not in OPTIONS:
            found.append(
                Diagnostic(
                    option.position,
                    f"unknown GPU option '{option.name}'{did_you_mean(option.name, OPTIONS)};"
                    f" options are {', '.join(OPTIONS)}",
                )
            )
        elif option.name in options:
            found.append(Diagnostic(option.position, f"GPU option {option.name} is given twice"))
        elif option.value not in OPTIONS[option.name][1] or isinstance(option.value, float):
            allowed = ", ".join(map(str, OPTIONS[option.name][1]))
            found.append(Diagnostic(option.value_position, f"gpu {option.name} is one of {allowed}"))
        else:
            options[option.name] = option.value
    if earlier or found or not kernel.outputs or not all(d.dtype in DTYPES for d in kernel.inputs + kernel.outputs):
        return (blocks, options), found
    return ({**default_blocks(kernel, product), **blocks}, {**default_options(product), **options}), found


def infer_body(
    kernel: ir.Kernel, dims: tuple[str, ...], product: Product | None
) -> tuple[dict[ir.Expr, ValueType], list[Diagnostic]]:
    """Types every expression in order of the statements; outputs are assigned once."""
    inference = _Inference(kernel, dims, product)
    for statement in kernel.body:
        inference.statement(statement)
    assigned = {s.target for s in kernel.body if isinstance(s, ir.Assign)}
    for out in kernel.outputs:
        if out.name not in assigned:
            inference.found.append(Diagnostic(out.position, f"output '{out.name}' is never assigned"))
    return inference.types, inference.found


class _Inference:
    def __init__(self, kernel: ir.Kernel, dims: tuple[str, ...], product: Product | None):
        self.kernel = kernel
        self.dims = dims
        self.product = product
        self.output_dims = kernel.outputs[0].dims if kernel.outputs else ()
        self.types: dict[ir.Expr, ValueType] = {}
        self.found: list[Diagnostic] = []
        self.outputs = {o.name: o for o in kernel.outputs}
        self.scope: dict[str, ValueType | None] = {}
        for decl in kernel.inputs:
            self.scope[decl.name] = _declared(decl)
        for param in kernel.params:
            dtype = DTYPES.get(param.dtype)
            weak = F32 if dtype is None or dtype.is_float else I32
            self.scope[param.name] = ValueType(weak, (), weak=True)

    def statement(self, statement: ir.Statement) -> None:
        value = self.expr(statement.value)
        if isinstance(statement, ir.Let):
            self.scope.setdefault(statement.name, value)
            return
        out = self.outputs.get(statement.target)
        if out is None:
            known = list(self.outputs)
            self.found.append(
                Diagnostic(
                    statement.position,
                    f"'{statement.target}' is not an output{did_you_mean(statement.target, known)};"
                    " declare it with out, or use let for an intermediate value",
                )
            )
            return
        if statement.target in self.scope:
            self.found.append(Diagnostic(statement.position, f"output '{statement.target}' is assigned twice"))
            return
        self.scope[statement.target] = _declared(out)
        if value is None or out.dtype not in DTYPES:
            return
        extra = [d for d in value.dims if d not in out.dims]
        if extra:
            self.found.append(
                Diagnostic(
                    statement.value.position,
                    f"the value has dimensions {_dims(value.dims)} but output '{out.name}' is {_dims(out.dims)}",
                )
            )
        if value.dtype == BOOL and DTYPES[out.dtype] != BOOL:
            self.found.append(
                Diagnostic(
                    statement.value.position,
                    f"a bool value cannot be stored in {out.dtype} output '{out.name}' implicitly;"
                    f" write {out.dtype}(...)",
                )
            )

    def expr(self, node: ir.Expr) -> ValueType | None:
        """The node's type, or None after reporting why it has none."""
        result = getattr(self, "_" + type(node).__name__.lower())(node)
        if result is not None:
            self.types[node] = result
        return result

    def _name(self, node: ir.Name) -> ValueType | None:
        if node.id in self.scope:
            value = self.scope[node.id]
            if self.product is not None and value is not None and not set(value.dims) <= set(self.output_dims):
                self.found.append(
                    Diagnostic(
                        node.position,
                        f"'{node.id}' has the contracted dimension {self.product.k}; use it only as an operand of @",
                    )
                )
                return None
            return value
        later = [s for s in self.kernel.body if getattr(s, "name", getattr(s, "target", None)) == node.id]
        if later:
            self.found.append(Diagnostic(node.position, f"'{node.id}' is used before it is assigned"))
        elif node.id in DTYPES or node.id in FUNCTION_ARITY:
            self.found.append(Diagnostic(node.position, f"'{node.id}' is a function; call it: {node.id}(...)"))
        else:
            known = [*self.scope, *(o for o in self.outputs)]
            self.found.append(Diagnostic(node.position, f"unknown name '{node.id}'{did_you_mean(node.id, known)}"))
        return None

    def _number(self, node: ir.Number) -> ValueType | None:
        if isinstance(node.value, float):
            if node.value == float("inf"):
                self.found.append(Diagnostic(node.position, f"{node.text} is too large for any float dtype"))
                return None
            return ValueType(F32, (), weak=True)
        if node.value > I32.int_range()[1] + 1:  # one more, for the literal in -2147483648
            self.found.append(
                Diagnostic(node.position, f"{node.text} is too large for an integer literal; write it as a float")
            )
            return None
        return ValueType(I32, (), weak=True)

    def _boolean(self, node: ir.Boolean) -> ValueType:
        return ValueType(BOOL, ())

    def _unary(self, node: ir.Unary) -> ValueType | None:
        operand = self.expr(node.operand)
        if operand is None:
            return None
        if node.op == "-" and operand.dtype == BOOL:
            self.found.append(Diagnostic(node.position, "cannot negate a bool value; use ~ for logical not"))
            return None
        if node.op == "~" and operand.dtype.is_float:
            self.found.append(Diagnostic(node.position, f"~ needs a bool or integer operand, not {operand.dtype.name}"))
            return None
        if node.op == "-" and isinstance(node.operand, ir.Number):
            self._literal_fits(node, -node.operand.value, "-" + node.operand.text, operand)
        return operand

    def _binary(self, node: ir.Binary) -> ValueType | None:
        if node.op == "@":
            if self.product is None or node != self.product.node:
                return None
            value_dims = set(product_dims(self.product))
            return ValueType(self.product.accumulator, tuple(d for d in self.dims if d in value_dims))
        left, right = self.expr(node.left), self.expr(node.right)
        if left is None or right is None:
            return None
        dims = merge_dims(self.dims, left, right)
        for literal, other in ((node.left, right), (node.right, left)):
            self._check_literal_against(literal, other)
        if node.op in COMPARISON_OPS:
            return ValueType(BOOL, dims)
        if node.op in LOGIC_OPS:
            for side, t in ((node.left, left), (node.right, right)):
                if t.dtype.is_float:
                    self.found.append(
                        Diagnostic(side.position, f"{node.op} needs bool or integer operands, not {t.dtype.name}")
                    )
                    return None
            return combine(left, right, dims)
        if left.dtype == BOOL and right.dtype == BOOL:
            self.found.append(
                Diagnostic(node.op_position, f"arithmetic on bool values; cast them first, e.g. i32(...) {node.op} ...")
            )
            return None
        if node.op in ("/", "//", "%") and _is_zero(node.right):
            self.found.append(Diagnostic(node.right.position, "division by zero"))
            return None
        if node.op == "**" and not left.dtype.is_float and _is_negative(node.right):
            self.found.append(Diagnostic(node.right.position, "an integer cannot be raised to a negative power"))
            return None
        problem = constant_problem(node)
        if problem:
            self.found.append(Diagnostic(node.position, problem))
            return None
        result = combine(left, right, dims)
        if node.op == "/" and result.dtype.is_integer:
            return ValueType(F32, dims, weak=result.weak)
        return result

    def _call(self, node: ir.Call) -> ValueType | None:
        arity = FUNCTION_ARITY.get(node.func)
        if arity is None:
            self.found.append(
                Diagnostic(
                    node.func_position, f"unknown function '{node.func}'{did_you_mean(node.func, FUNCTION_ARITY)}"
                )
            )
            return None
        if len(node.args) != arity:
            self.found.append(
                Diagnostic(
                    node.position, f"{node.func}() takes {arity} argument{'s' * (arity > 1)}, got {len(node.args)}"
                )
            )
            return None
        args = [self.expr(arg) for arg in node.args]
        if any(arg is None for arg in args):
            return None
        dims = merge_dims(self.dims, *args)
        if node.func in DTYPES:
            return ValueType(DTYPES[node.func], dims)
        if node.func == "where":
            condition, a, b = args
            if condition.dtype != BOOL:
                self.found.append(
                    Diagnostic(node.args[0].position, f"where() needs a bool condition, not {condition.dtype.name}")
                )
                return None
            self._check_literal_against(node.args[1], b)
            self._check_literal_against(node.args[2], a)
            return combine(a, b, dims)
        if any(arg.dtype == BOOL for arg in args):
            self.found.append(Diagnostic(node.position, f"{node.func}() needs numbers, not bool values"))
            return None
        result = args[0]
        for arg in args[1:]:
            result = combine(result, arg, dims)
        for arg_node in node.args:
            self._check_literal_against(arg_node, result)
        if node.func in FLOAT_FUNCTIONS and not result.dtype.is_float:
            return ValueType(F32, dims, weak=result.weak)
        return ValueType(result.dtype, dims, result.weak)

    def _attribute(self, node: ir.Attribute) -> ValueType | None:
        if node.attr == "T":
            self.found.append(Diagnostic(node.attr_position, ".T transposes an operand of @ only"))
        else:
            self.found.append(Diagnostic(node.attr_position, f"unknown attribute '.{node.attr}'; only .T exists"))
        return None

    def _check_literal_against(self, node: ir.Expr, other: ValueType) -> None:
        if other.weak:
            return
        if isinstance(node, ir.Number):
            self._literal_fits(node, node.value, node.text, other)
        elif isinstance(node, ir.Unary) and node.op == "-" and isinstance(node.operand, ir.Number):
            self._literal_fits(node, -node.operand.value, "-" + node.operand.text, other)

    def _literal_fits(self, node: ir.Expr, value, text: str, context: ValueType) -> None:
        if context.weak:
            context = ValueType(I32 if isinstance(value, int) else F32, ())
        if context.dtype == BOOL or (isinstance(value, float) and not context.dtype.is_float):
            return
        problem = literal_problem(value, text, context.dtype)
        if problem:
            self.found.append(Diagnostic(node.position, problem))


def literal_problem(value: int | float, text: str, dtype: DType) -> str | None:
    """Why a literal cannot be a value of `dtype`, or None when it can."""
    if dtype.is_integer or dtype == BOOL:
        low, high = (0, 1) if dtype == BOOL else dtype.int_range()
        if isinstance(value, int) and not low <= value <= high:
            return f"{text} does not fit in {dtype.name} ({low} to {high})"
    elif abs(value) > FLOAT_MAX[dtype.name]:
        return f"{text} is too large for {dtype.name} (largest {FLOAT_MAX[dtype.name]:g})"
    return None


def _declared(decl: ir.ArrayDecl) -> ValueType | None:
    dtype = DTYPES.get(decl.dtype)
    return None if dtype is None else ValueType(dtype, decl.dims)


def _is_zero(node: ir.Expr) -> bool:
    return isinstance(node, ir.Number) and node.value == 0


def _is_negative(node: ir.Expr) -> bool:
    value = constant_value(node)
    return isinstance(value, (int, float)) and value < 0


_PYTHON_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "**": lambda a, b: _power(a, b),
}


def _power(base, exponent):
    """Python's `**`, refusing integer powers too large to compute quickly."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 64:
        raise OverflowError
    return base**exponent


def constant_value(node: ir.Expr) -> int | float | None:
    """The value of an arithmetic expression of literals, as Python computes it; else None.

    Generated code leaves such expressions to Python, so they must not raise there.
    """
    if isinstance(node, ir.Number):
        return node.value
    if isinstance(node, ir.Unary) and node.op == "-":
        value = constant_value(node.operand)
        return None if value is None else -value
    if isinstance(node, ir.Binary) and node.op in _PYTHON_OPS:
        left, right = constant_value(node.left), constant_value(node.right)
        if left is None or right is None:
            return None
        try:
            result = _PYTHON_OPS[node.op](left, right)
        except (ZeroDivisionError, OverflowError):
            return None
        return result if isinstance(result, (int, float)) else None
    return None


def constant_problem(node: ir.Binary) -> str | None:
    """Why Python cannot compute a binary operation on literals, or None."""
    left, right = constant_value(node.left), constant_value(node.right)
    if left is None or right is None or node.op not in _PYTHON_OPS:
        return None
    try:
        result = _PYTHON_OPS[node.op](left, right)
    except ZeroDivisionError:
        return "division by zero"
    except OverflowError:
        return "this constant overflows"
    if isinstance(result, complex):
        return "this constant is a complex number"
    if isinstance(result, float) and result != result or abs(result) == float("inf"):
        return "this constant is not a finite number"
    if isinstance(result, int) and abs(result) > 2**31:
        return "this constant does not fit in i32"
    return None


def _unknown_dtype(name: str, position: Position) -> Diagnostic:
    return Diagnostic(position, f"unknown dtype '{name}'{did_you_mean(name, DTYPES)}; dtypes are {', '.join(DTYPES)}")


def _dims(dims: tuple[str, ...]) -> str:
    return "[" + ", ".join(dims) + "]"
