"""Types of every expression in a kernel body, and the errors found on the way.

Literals and params are weak, like Python scalars in JAX; arrays promote as
`jnp.promote_types` does. Arithmetic on literals alone is computed as Python would,
since generated code leaves it to Python, so it must not raise there.
"""

from __future__ import annotations

import operator

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import BOOL, DTYPES, F32, FLOAT_MAX, I32, DType
from pallasgen.frontend.errors import MAX_REPORTED, Diagnostic, did_you_mean
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.product import OPERAND_DTYPES
from pallasgen.analysis.space import declared_dims
from pallasgen.analysis.valuetypes import ValueType, combine, merge_dims

COMPARISON_OPS = frozenset({"==", "!=", "<", "<=", ">", ">="})
LOGIC_OPS = frozenset({"&", "|", "^"})
SHIFT_OPS = frozenset({"<<", ">>"})


def infer_body(kernel: ir.Kernel, dims: tuple[str, ...]) -> tuple[dict[ir.Expr, ValueType], list[Diagnostic]]:
    """Types every expression in order of the statements; outputs are assigned once."""
    inference = _Inference(kernel, dims)
    for statement in kernel.body:
        inference.statement(statement)
    declared = [d.name for d in kernel.inputs + kernel.outputs + kernel.params]
    declared += [s.name for s in kernel.body if isinstance(s, ir.Let)]
    for out in kernel.outputs:
        if out.name not in inference.assigned and declared.count(out.name) == 1:  # else "already declared"
            inference.found.append(Diagnostic(out.position, f"output '{out.name}' is never assigned"))
    return inference.types, inference.found


class _Inference:
    def __init__(self, kernel: ir.Kernel, dims: tuple[str, ...]):
        self.kernel = kernel
        self.dims = dims
        self.unplaced = declared_dims(kernel) - set(dims)  # for errors reported already
        self.output_dims = kernel.outputs[0].dims if kernel.outputs else ()
        self.types: dict[ir.Expr, ValueType] = {}
        self.found: list[Diagnostic] = []
        self.outputs = {o.name: o for o in kernel.outputs}
        self.scope: dict[str, ValueType | None] = {}
        self.assigned = {s.target for s in kernel.body if isinstance(s, ir.Assign)}  # by any statement
        self.stored: set[str] = set()  # outputs assigned by the statements typed so far
        self.unknown: set[str] = set()  # names and dimensions reported unknown: once each
        self.statement_names = {getattr(s, "name", getattr(s, "target", None)) for s in kernel.body}
        self.hints_left = MAX_REPORTED  # "did you mean" for as many errors as a spec error shows
        # A name declared twice is an error at its second declaration: the first holds.
        for decl in kernel.inputs:
            self.scope.setdefault(decl.name, self._declared(decl))
        for param in kernel.params:
            dtype = DTYPES.get(param.dtype)
            weak = F32 if dtype is None or dtype.is_float else I32
            self.scope.setdefault(param.name, ValueType(weak, (), weak=True))

    def _declared(self, decl: ir.ArrayDecl) -> ValueType | None:
        """A declared array's type; None where its declaration has an error, reported in
        checks (an unknown dtype, a dimension twice or one the space could not place)."""
        dtype = DTYPES.get(decl.dtype)
        if dtype is None or len(set(decl.dims)) < len(decl.dims) or not set(decl.dims) <= set(self.dims):
            return None
        return ValueType(dtype, decl.dims)

    def statement(self, statement: ir.Statement) -> None:
        value = self.expr(statement.value)
        if isinstance(statement, ir.Let):
            self.scope.setdefault(statement.name, value)
            return
        out = self.outputs.get(statement.target)
        if out is None:
            if self.outputs:  # else "has no output" says it
                known = list(self.outputs)
                self.found.append(
                    Diagnostic(
                        statement.position,
                        f"'{statement.target}' is not an output{did_you_mean(statement.target, known)};"
                        " declare it with out, or use let for an intermediate value",
                    )
                )
            self.scope.setdefault(statement.target, value)  # so its uses are not errors too
            return
        if statement.target in self.stored:
            self.found.append(Diagnostic(statement.position, f"output '{statement.target}' is assigned twice"))
            return
        self.stored.add(statement.target)
        declared = self._declared(out)
        self.scope.setdefault(statement.target, declared)
        if value is None or declared is None:
            return
        extra = [d for d in value.dims if d not in out.dims]
        if extra:
            self.found.append(
                Diagnostic(
                    statement.value.position,
                    f"the value has dimensions {dims_text(value.dims)} but output '{out.name}' is {dims_text(out.dims)}"
                    f"; reduce {extra[0]} away, e.g. sum(..., {extra[0]})",
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
            return self.scope[node.id]
        if node.id in self.unknown or (node.id in self.outputs and node.id not in self.assigned):
            return None  # reported already, or its declaration is: "output ... is never assigned"
        if node.id in self.statement_names:  # not in scope yet: assigned later
            self.found.append(Diagnostic(node.position, f"'{node.id}' is used before it is assigned"))
        elif node.id in FUNCTIONS:
            self.found.append(Diagnostic(node.position, f"'{node.id}' is a function; call it: {node.id}(...)"))
        else:
            self.unknown.add(node.id)
            self.found.append(Diagnostic(node.position, f"unknown name '{node.id}'{self._hint(node.id)}"))
        return None

    def _hint(self, name: str) -> str:
        """A "did you mean" for an unknown name, for the first few only: it compares the
        name with every name in scope, and thousands of unknown names would take minutes."""
        if self.hints_left <= 0:
            return ""
        self.hints_left -= 1
        return did_you_mean(name, [*self.scope, *self.outputs])

    def _number(self, node: ir.Number) -> ValueType | None:
        if isinstance(node.value, float):
            if node.value == float("inf") and node.text != "inf":
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
            return self._matmul(node)
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
        if node.op in SHIFT_OPS:
            return self._shift(node, left, right, dims)
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

    def _shift(self, node: ir.Binary, left: ValueType, right: ValueType, dims) -> ValueType | None:
        """`x << n`, `x >> n` (arithmetic for signed x, logical for unsigned, as jnp): integers
        shifted by a literal amount less than their width, which every backend computes alike."""
        for side, t in ((node.left, left), (node.right, right)):
            if not t.dtype.is_integer or t.dtype == BOOL:
                self.found.append(Diagnostic(side.position, f"{node.op} needs integer operands, not {t.dtype.name}"))
                return None
        result = combine(left, right, dims)
        amount = constant_value(node.right)
        if not isinstance(amount, int) or not 0 <= amount < result.dtype.bits:
            shown = "" if amount is None else f", not {amount}"
            self.found.append(
                Diagnostic(
                    node.right.position,
                    f"a shift amount is a literal from 0 to {result.dtype.bits - 1} ({result.dtype.name}'s width"
                    f" less one){shown}",
                )
            )
            return None
        return result

    def _matmul(self, node: ir.Binary) -> ValueType | None:
        """A product of any two values: its operands are matrices, optionally transposed,
        whose contracted dimensions agree; floats accumulate in f32, integers in i32."""
        sides = [product_operand(side) for side in (node.left, node.right)]
        types = [self.expr(value) for value, _ in sides]
        if None in types:
            return None
        matrices = []
        for (value, transposed), side_type in zip(sides, types):
            if len(side_type.dims) < 2:
                self.found.append(
                    Diagnostic(
                        value.position,
                        f"{_operand_text(value, 'this operand')} is not a matrix ({dims_text(side_type.dims)}):"
                        " a product operand has two or more dimensions",
                    )
                )
                return None
            if side_type.dtype.name not in OPERAND_DTYPES:
                self.found.append(
                    Diagnostic(
                        value.position,
                        f"matrix products take {', '.join(OPERAND_DTYPES)} operands, not {side_type.dtype.name}",
                    )
                )
                return None
            dims = side_type.dims
            matrices.append((*dims[:-2], dims[-1], dims[-2]) if transposed else dims)
        (*_, m, k), (*_, k_right, n) = matrices
        if k != k_right:
            self.found.append(
                Diagnostic(
                    node.op_position,
                    f"the contracted dimensions differ: {_operand_text(sides[0][0], 'the left operand')} ends in {k}"
                    f" but {_operand_text(sides[1][0], 'the right one')} has {k_right} second to last"
                    f"{'; transpose one with .T' if k in matrices[1] else ''}",
                )
            )
            return None
        kept = [*dict.fromkeys([*matrices[0][:-2], *matrices[1][:-2]]), m, n]  # batch dimensions are shared
        if len(set(kept)) < len(kept) or k in kept:
            twice = next(d for d in [k, *kept] if d == k and k in kept or kept.count(d) > 1)
            self.found.append(
                Diagnostic(
                    node.op_position,
                    f"this product's result would have dimension {twice} twice ({', '.join([*kept, k])} with {k}"
                    " contracted); an array names each dimension once",
                )
            )
            return None
        left, right = types
        if left.dtype.is_float != right.dtype.is_float:
            self.found.append(
                Diagnostic(node.op_position, f"a product of {left.dtype.name} and {right.dtype.name}: cast one of them")
            )
            return None
        dims = set(matrices[0][:-1]) | set(matrices[1][:-2]) | {n}
        return ValueType(F32 if left.dtype.is_float else I32, tuple(d for d in self.dims if d in dims))

    def _call(self, node: ir.Call) -> ValueType | None:
        function = FUNCTIONS.get(node.func)
        if function is None:
            hint = did_you_mean(node.func, FUNCTIONS) or f"; the functions are {', '.join(sorted(FUNCTIONS))}"
            self.found.append(Diagnostic(node.func_position, f"unknown function '{node.func}'{hint}"))
            return None
        arity = function.arity
        if len(node.args) != arity:
            example = ""
            if function.typing in ("reduce", "softmax") and len(node.args) == 1 and self.dims:
                reduced = [d for d in self.dims if d not in self.output_dims] or self.dims[-1:]
                argument = node.args[0].id if isinstance(node.args[0], ir.Name) else "x"
                example = f": the value and the dimension it reduces, as in {node.func}({argument}, {reduced[0]})"
            self.found.append(
                Diagnostic(
                    node.position,
                    f"{node.func}() takes {arity} argument{'s' * (arity > 1)}, got {len(node.args)}{example}",
                )
            )
            return None
        if function.typing == "index":
            return self._index(node)
        if function.typing == "size":
            return None if self._dimension(node, node.args[0]) is None else ValueType(I32, (), weak=True)
        if function.typing in ("reduce", "softmax"):
            return self._reduction(node, function.reducer, keeps=function.typing == "softmax")
        args = [self.expr(arg) for arg in node.args]
        if any(arg is None for arg in args):
            return None
        dims = merge_dims(self.dims, *args)
        if function.typing == "cast":
            target = DTYPES[node.func]
            value = constant_value(node.args[0])
            if target.is_integer and type(value) is int and (problem := literal_problem(value, str(value), target)):
                self.found.append(Diagnostic(node.position, problem))  # jnp.int8(300) raises
                return None
            return ValueType(target, dims)
        if function.typing == "where":
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
        if function.typing == "float" and not result.dtype.is_float:
            return ValueType(F32, dims, weak=result.weak)
        return ValueType(result.dtype, dims, result.weak)

    def _dimension(self, node: ir.Call, arg: ir.Expr) -> str | None:
        """The dimension an argument names, or None after saying why it names none."""
        if isinstance(arg, ir.Name) and arg.id in self.dims:
            return arg.id
        if not self.dims or isinstance(arg, ir.Name) and arg.id in (self.unplaced | self.unknown) - set(self.scope):
            return None  # reported already: the kernel has no dimensions, or this one is unknown
        named_value = isinstance(arg, ir.Name) and arg.id in self.scope
        if node.func in ("max", "min") and (named_value or not isinstance(arg, ir.Name)):
            self.found.append(
                Diagnostic(
                    arg.position,
                    f"{node.func}(a, DIM) reduces a over a dimension; for the elementwise {node.func}imum of two"
                    f" values write {node.func}imum(a, b)",
                )
            )
        else:
            text = arg.id if isinstance(arg, ir.Name) else "this"
            if isinstance(arg, ir.Name):
                self.unknown.add(arg.id)
            self.found.append(
                Diagnostic(
                    arg.position,
                    f"{text} is not a dimension of this kernel{did_you_mean(text, self.dims)};"
                    f" {node.func}() takes a dimension name here, one of {', '.join(self.dims)}",
                )
            )
        return None

    def _index(self, node: ir.Call) -> ValueType | None:
        dim = self._dimension(node, node.args[0])
        return None if dim is None else ValueType(I32, (dim,))

    def _reduction(self, node: ir.Call, reducer, keeps: bool = False) -> ValueType | None:
        """A reduction's type; `keeps`: the result keeps the dimension (softmax)."""
        value = self.expr(node.args[0])
        dim = self._dimension(node, node.args[1])
        if value is None or dim is None:
            return None
        if dim not in value.dims:
            self.found.append(
                Diagnostic(
                    node.args[1].position,
                    f"the value reduced has dimensions {dims_text(value.dims)}, without {dim}; {node.func}() removes"
                    " a dimension the value has",
                )
            )
            return None
        if reducer.takes == "bools" and value.dtype != BOOL:
            self.found.append(
                Diagnostic(node.args[0].position, f"{node.func}() needs a bool value, not {value.dtype.name}")
            )
            return None
        if reducer.takes == "numbers" and value.dtype == BOOL:
            self.found.append(
                Diagnostic(node.args[0].position, f"{node.func}() needs numbers, not bool values; cast them: i32(...)")
            )
            return None
        dims = value.dims if keeps else tuple(d for d in value.dims if d != dim)
        if reducer.result == "sum":
            return ValueType(F32 if value.dtype.is_float else I32, dims)
        if reducer.result == "same":
            return ValueType(value.dtype, dims, value.weak)
        return ValueType({"f32": F32, "i32": I32, "bool": BOOL}[reducer.result], dims)

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
        elif isinstance(node, (ir.Unary, ir.Binary)) and isinstance(value := constant_value(node), int):
            self._literal_fits(node, value, "this constant", other)  # `x + 2 ** 31`, `x + ~(2 ** 31)`

    def _literal_fits(self, node: ir.Expr, value, text: str, context: ValueType) -> None:
        if context.weak:
            context = ValueType(I32 if isinstance(value, int) else F32, ())
        if context.dtype == BOOL or (isinstance(value, float) and not context.dtype.is_float):
            return
        problem = literal_problem(value, text, context.dtype)
        if problem:
            self.found.append(Diagnostic(node.position, problem))


def _operand_text(value: ir.Expr, otherwise: str) -> str:
    """How a message names a product operand: `'x'` where it is a name."""
    return f"'{value.id}'" if isinstance(value, ir.Name) else otherwise


def product_operand(node: ir.Expr) -> tuple[ir.Expr, bool]:
    """A product operand's value and whether it is transposed (`x.T`)."""
    if isinstance(node, ir.Attribute) and node.attr == "T":
        return node.value, True
    return node, False


def literal_problem(value: int | float, text: str, dtype: DType) -> str | None:
    """Why a literal cannot be a value of `dtype`, or None when it can."""
    if dtype.is_integer or dtype == BOOL:
        low, high = (0, 1) if dtype == BOOL else dtype.int_range()
        if isinstance(value, int) and not low <= value <= high:
            return f"{text} does not fit in {dtype.name} ({low} to {high})"
    elif abs(value) > FLOAT_MAX[dtype.name] and (abs(value) != float("inf") or text.lstrip("-") != "inf"):
        # inf, spelled so, is every float's; 1e400 reads as inf too, and is too large
        return f"{text} is too large for {dtype.name} (largest {FLOAT_MAX[dtype.name]:g})"
    return None


def _is_zero(node: ir.Expr) -> bool:
    return isinstance(node, ir.Number) and node.value == 0


def _is_negative(node: ir.Expr) -> bool:
    value = constant_value(node)
    return isinstance(value, (int, float)) and value < 0


# Arithmetic on literals as Python computes it (the generated code leaves it to Python).
PYTHON_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": lambda a, b: python_power(a, b),
    "^": operator.xor,
    "<<": lambda a, b: python_shift(a, b),
    ">>": operator.rshift,
}


def python_power(base, exponent):
    """Python's `**`, refusing integer powers too large to compute quickly."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 64:
        raise OverflowError
    return base**exponent


def python_shift(value, amount):
    """Python's `<<`, refusing shifts too large to compute quickly."""
    if amount > 64:
        raise OverflowError
    return value << amount


def constant_value(node: ir.Expr) -> int | float | None:
    """The value of an arithmetic expression of literals, as Python computes it; else None.

    Generated code leaves such expressions to Python, so they must not raise there.
    """
    if isinstance(node, ir.Number):
        return node.value
    if isinstance(node, ir.Unary) and node.op == "-":
        value = constant_value(node.operand)
        return None if value is None else -value
    if isinstance(node, ir.Unary) and node.op == "~":
        value = constant_value(node.operand)
        return ~value if type(value) is int else None
    if isinstance(node, ir.Binary) and node.op in PYTHON_OPS:
        left, right = constant_value(node.left), constant_value(node.right)
        if left is None or right is None:
            return None
        try:
            result = PYTHON_OPS[node.op](left, right)
        except (ZeroDivisionError, OverflowError, TypeError, ValueError):  # 1.5 ^ 2, 1 << -1
            return None
        return result if isinstance(result, (int, float)) else None
    return None


def constant_problem(node: ir.Binary) -> str | None:
    """Why Python cannot compute a binary operation on literals, or None."""
    left, right = constant_value(node.left), constant_value(node.right)
    if left is None or right is None or node.op not in PYTHON_OPS:
        return None
    try:
        result = PYTHON_OPS[node.op](left, right)
    except ZeroDivisionError:
        return "division by zero"
    except OverflowError:
        return "this constant overflows"
    except (TypeError, ValueError):  # reported by the operator's own checks
        return None
    if isinstance(result, complex):
        return "this constant is a complex number"
    if isinstance(result, float) and result != result or abs(result) == float("inf"):
        return "this constant is not a finite number"
    if isinstance(result, int) and abs(result) > 2**31:
        return "this constant does not fit in i32"
    return None


def dims_text(dims: tuple[str, ...]) -> str:
    return "[" + ", ".join(dims) + "]"
