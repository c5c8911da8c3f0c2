"""Spec expressions as Python source, with the fewest parentheses Python needs."""

from __future__ import annotations

import math
import operator

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import BOOL, DTYPES, tpu_dtype
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.infer import PYTHON_OPS
from pallasgen.analysis.valuetypes import ValueType, combine

# Python binding strength, loosest first.
_COMPARE, _OR, _XOR, _AND, _SHIFT, _SUM, _PRODUCT, _UNARY, _POWER, _ATOM = range(10)
_BINARY_PRECEDENCE = {
    **dict.fromkeys(("==", "!=", "<", "<=", ">", ">="), _COMPARE),
    "|": _OR,
    "^": _XOR,
    "&": _AND,
    "<<": _SHIFT,
    ">>": _SHIFT,
    "+": _SUM,
    "-": _SUM,
    **dict.fromkeys(("*", "/", "//", "%", "@"), _PRODUCT),
    "**": _POWER,
}
# Operators on narrow integers that the TPU kernel computes in i32.
NARROW_ARITHMETIC = frozenset({"+", "-", "*", "//", "%", "**", "&", "|", "^", "<<", ">>"})


def jnp_dtype(name: str) -> str:
    """`f32` -> `jnp.float32`."""
    return f"jnp.{DTYPES[name].jnp}" if name != "bool" else "jnp.bool_"


class Emitter:
    """Writes typed expressions as Python, naming values through `names`."""

    def __init__(
        self,
        names: dict[str, str],
        types: dict[ir.Expr, ValueType],
        overrides: dict[ir.Expr, str],
        tpu: bool = False,
        spelling=None,
        lets: dict[str, ir.Expr] | None = None,
        narrow_ints_in_i32: bool = False,
        codes: dict[str, str] | None = None,
    ):
        self.names = names
        self.types = types
        self.overrides = overrides  # nodes computed elsewhere, such as the product, by variable
        # How reductions and index() are written here (lowering.reductions); None: no reductions.
        self.spelling = spelling
        self.lets = lets or {}  # each let's value, by spec name
        # For a TPU kernel: f16 computed as f32, and i8/u8/i16 compares, maximum, minimum and
        # clip widened to i32, which Mosaic lowers (it has no narrow-integer compare).
        self.tpu = tpu
        # Narrow integers widened as on TPU, without the TPU's f16 (Mosaic GPU: no i8 arithmetic).
        self.narrow_ints_in_i32 = tpu or narrow_ints_in_i32
        # Functions this kernel spells otherwise than FUNCTIONS does, by name (a backend's).
        self.codes = codes or {}
        self._python = False  # writing a value Python computes: constants through functions folded
        # Weak scalars that the kernel computes as f32 or i32 arrays (see _traced_choice), by the
        # dtype that the strong value they meet converts them to, as JAX converts a weak value.
        self._meeting: dict[ir.Expr, str] = {}

    def dtype(self, name: str) -> str:
        """A spec dtype as this kernel's code spells it."""
        return jnp_dtype(tpu_dtype(name) if self.tpu else name)

    def kernel_dtype(self, node: ir.Expr):
        """The dtype this kernel holds the value in (a TPU kernel holds f16 as f32)."""
        dtype = self.types[node].dtype
        return DTYPES[tpu_dtype(dtype.name)] if self.tpu else dtype

    def emit(self, node: ir.Expr) -> str:
        return self._emit(node)[0]

    def cast(self, node: ir.Expr, dtype: str) -> str:
        """The node's value as `dtype` (a spec dtype name), converting only if needed."""
        value_type = self.types[node]
        if value_type.dtype.name == dtype and not value_type.weak:
            return self.emit(node)
        return self._cast_code(node, dtype)[0]

    def _emit(self, node: ir.Expr) -> tuple[str, int]:
        code, level = self._emit_node(node)
        if node not in self._meeting:
            return code, level
        return f"{code if level == _ATOM else f'({code})'}.astype({self.dtype(self._meeting[node])})", _ATOM

    def _emit_node(self, node: ir.Expr) -> tuple[str, int]:
        if node in self.overrides:
            return self.overrides[node], _ATOM
        self._note_meetings(node)
        if self._python and self._through_function(node) and (value := self._folded(node)) is not None:
            return _python_literal(value)
        if isinstance(node, ir.Name):
            if self._python and self._through_function(node):  # a let that is not traced here
                return self._emit(self.lets[node.id])
            return self.names[node.id], _ATOM
        if isinstance(node, ir.Number):
            return ("jnp.inf" if node.value == float("inf") else repr(node.value)), _ATOM
        if isinstance(node, ir.Boolean):
            return repr(node.value), _ATOM
        if isinstance(node, (ir.Unary, ir.Binary)) and self._in_i32(node):
            return f"{self._widened_operation(node)}.astype({self.dtype(self.types[node].dtype.name)})", _ATOM
        if isinstance(node, ir.Unary):
            if node.op == "~" and self.types[node].dtype == BOOL:
                if self._static(node.operand):  # a Python bool (a traced not of one fails on Triton)
                    return f"(not {self._python_code(node.operand, _OR)})", _ATOM
                return f"jnp.logical_not({self.emit(node.operand)})", _ATOM
            return f"{node.op}{self._wrap(node.operand, _UNARY)}", _UNARY
        if isinstance(node, ir.Binary):
            level = _BINARY_PRECEDENCE[node.op]
            if node.op == "**" and (power := self._integer_power(node)) is not None:
                return power
            if node.op == "**":  # right-associative; binds tighter than a unary minus on its left
                left, right = self._wrap(node.left, _POWER + 1), self._wrap(node.right, _UNARY)
            else:
                left, right = self._wrap(node.left, level), self._wrap(node.right, level + 1)
            if level == _COMPARE:
                left, right = self._wrap(node.left, _OR), self._wrap(node.right, _OR)
                if self._narrow_int(node.left) or self._narrow_int(node.right):
                    left, right = self._widened(node.left), self._widened(node.right)
                elif self._bf16_compare(node):
                    left, right = self._in_f32(node.left), self._in_f32(node.right)
            return f"{left} {node.op} {right}", level
        if isinstance(node, ir.Call):
            code = self._call(node)
            return code, _binding(code)
        raise TypeError(f"no Python form for {type(node).__name__}")

    def _call(self, node: ir.Call) -> str:
        function = FUNCTIONS[node.func]
        if function.typing == "reduce":
            value = node.args[0]
            return self.spelling.reduction(node, self._wrap(value, _ATOM), self.kernel_dtype(value))
        if function.typing == "softmax":
            value = node.args[0]
            return self.spelling.softmax(node, self._wrap(value, _ATOM), self.kernel_dtype(value))
        if function.typing == "index":
            return self.spelling.positions(node.args[0].id)
        if function.typing == "size":
            return self.spelling.size(node.args[0].id)
        if node.func == "round" and self.spelling is not None:
            dtype = self.types[node.args[0]].dtype
            if not dtype.is_float:
                return self.emit(node.args[0])  # integers are already whole
            if dtype.bits < 32 and getattr(self.spelling, "round_helper", False):
                # The helper's floor(x + 0.5) in bf16 would round x + 0.5 itself (135.5 to 136).
                wide = f"{self._wrap(node.args[0], _ATOM)}.astype(jnp.float32)"
                return f"{self.spelling.rounded(wide)}.astype({jnp_dtype(dtype.name)})"
            return self.spelling.rounded(self.emit(node.args[0]))
        if function.typing == "cast":
            return self._cast_code(node.args[0], node.func)[0]
        if function.typing == "float":
            arg = self.types[node.args[0]]
            (operand,) = [self.emit(a) if arg.dtype.is_float else self._cast_code(a, "f32")[0] for a in node.args]
            return self._code(node).format(operand)
        if node.func == "where" and self.types[node].weak and self._static(node.args[0]):
            # A choice between literals or params by a condition known at trace time: a
            # Python conditional. (Pallas's Triton lowering gives the weak constants of
            # such a select the condition's dtype, bool, and fails.)
            condition, *branches = node.args
            a, b = (self._weak_branch(branch, self.types[node]) for branch in branches)
            return f"({a} if {self._python_code(condition, _COMPARE)} else {b})"
        if self._traced_choice(node):
            # A choice between weak scalars by a traced scalar condition: made between f32 (or
            # i32) constants, since Pallas's Triton lowering gives weak constants the bool
            # condition's dtype. What the choice meets converts it as JAX converts a weak value.
            condition, *branches = node.args
            strong = self.types[node].dtype.name
            a, b = (self.emit(x) if self._strengthened(x) else self._cast_code(x, strong)[0] for x in branches)
            return f"jnp.where({self.emit(condition)}, {a}, {b})"
        if node.func == "where" and self._packed_choice(node):
            # Mosaic cannot always select 16- or 8-bit values by a condition laid out for
            # 32 bits (between two scalars, say): the choice is made in 32 bits, cast back.
            wide = "f32" if self.types[node].dtype.is_float else "i32"
            condition, *branches = node.args
            a, b = (self.emit(x) if self.types[x].weak else self._cast_code(x, wide)[0] for x in branches)
            return f"jnp.where({self.emit(condition)}, {a}, {b}).astype({self.dtype(self.types[node].dtype.name)})"
        if function.narrow_ints_in_i32 and self._narrow_int(node):
            return f"{self._widened_call(node)}.astype({self.dtype(self.types[node].dtype.name)})"
        return self._code(node).format(", ".join(self.emit(arg) for arg in node.args))

    def _code(self, node: ir.Call) -> str:
        return self._spelled(node.func)

    def _spelled(self, func: str) -> str:
        """The spec function's code with `{}` for its arguments, as this backend spells it."""
        return self.codes.get(func, FUNCTIONS[func].code)

    def call(self, func: str, *args: str) -> str:
        """The spec function `func` on code `args`, as this backend spells it."""
        return self._spelled(func).format(", ".join(args))

    def _traced_choice(self, node: ir.Expr) -> bool:
        """A `where` of weak scalars by a condition traced with the kernel (from a param
        through a function, say)."""
        return (
            isinstance(node, ir.Call)
            and node.func == "where"
            and self.types[node].weak
            and not self.types[node].dims
            and not self._static(node.args[0])
        )

    def _strengthened(self, node: ir.Expr) -> bool:
        """A weak value the kernel computes as a strongly typed one: a traced choice, or a
        weak operation on one."""
        if not self.types[node].weak or node in self.overrides:
            return False
        if isinstance(node, ir.Name):
            return node.id in self.lets and self._strengthened(self.lets[node.id])
        return self._traced_choice(node) or any(map(self._strengthened, _values(node)))

    def _note_meetings(self, node: ir.Expr) -> None:
        """Where a strong value meets a strengthened one, the dtype it converts that one to."""
        if self.types[node].weak or not isinstance(node, (ir.Binary, ir.Call)):
            return
        operands = _values(node)[1:] if isinstance(node, ir.Call) and node.func == "where" else _values(node)
        strong = [self.types[x] for x in operands if not self.types[x].weak]
        for operand in filter(self._strengthened, operands):
            met = combine(self.types[operand], strong[0], ()) if strong else self.types[operand]
            if met.dtype != self.types[operand].dtype:
                self._meeting[operand] = met.dtype.name

    def _packed_choice(self, node: ir.Call) -> bool:
        """A TPU kernel's `where` of 16- or 8-bit values into an array (or of narrow
        integers, in a kernel that computes them in i32)."""
        result = self.types[node]
        if self.narrow_ints_in_i32 and not self.tpu:
            return self._narrow_int(node)
        bits = DTYPES[tpu_dtype(result.dtype.name)].bits if result.dtype != BOOL else 32
        return self.tpu and bits < 32 and bool(result.dims)

    def _static(self, node: ir.Expr) -> bool:
        """Whether Python computes the value as the kernel is traced: literals, params, and
        operators on them (directly or through lets), and constants through functions, which
        are folded as the code is generated (jnp functions would trace them)."""
        if isinstance(node, (ir.Number, ir.Boolean)):
            return True
        if isinstance(node, ir.Name):
            return self._static(self.lets[node.id]) if node.id in self.lets else self.types[node].weak
        if isinstance(node, ir.Unary):
            return self._static(node.operand)
        if isinstance(node, ir.Binary):
            return node.op != "@" and self._static(node.left) and self._static(node.right)
        return self._folded(node) is not None

    def _folded(self, node: ir.Expr) -> bool | int | float | None:
        """A constant's value as Python computes it, functions included; None where it reads
        a param or an array, or Python cannot compute it (log(-1.0), say)."""
        if isinstance(node, (ir.Number, ir.Boolean)):
            return node.value
        if isinstance(node, ir.Name):
            return self._folded(self.lets[node.id]) if node.id in self.lets else None
        values = [self._folded(x) for x in _values(node)]
        if not values or None in values:
            return None
        try:
            if isinstance(node, ir.Call):
                fold = FUNCTIONS[node.func].fold
                if fold is None:
                    return None
                value = fold(*values)
            elif isinstance(node, ir.Binary) and node.op == "**" and _whole_power(*values):
                value = pow(*values, 2**64)  # wrapped below, as the dtype wraps; quick for any exponent
            elif isinstance(node, ir.Binary):
                value = _PYTHON_OPERATORS[node.op](*values)
            else:
                value = -values[0] if node.op == "-" else ~values[0] if type(values[0]) is int else not values[0]
            dtype = self.types[node].dtype
            if dtype.is_float:
                return float(value)
            if dtype == BOOL:
                return bool(value)
            low, high = dtype.int_range()  # wrapped, as a cast to the dtype wraps
            return (int(value) - low) % (high - low + 1) + low
        except (ArithmeticError, TypeError, ValueError):  # a complex power is a TypeError here
            return None

    def _integer_power(self, node: ir.Binary) -> tuple[str, int] | None:
        """An integer power whose exponent is a constant, with the exponent folded (or the
        whole power, where the base is one too): a traced exponent (`jnp.abs(9)`) makes
        the power `lax.pow`, which a Pallas kernel computes otherwise than XLA does, where a
        Python one makes it `lax.integer_pow`, exact and wrapping in both."""
        if not self.types[node].dtype.is_integer or isinstance(self._folded(node.right), bool):
            return None
        if not isinstance(exponent := self._folded(node.right), int):
            return None
        if (value := self._folded(node)) is not None:
            return _python_literal(value)
        return f"{self._wrap(node.left, _POWER + 1)} ** {_python_literal(exponent)[0]}", _POWER

    def _through_function(self, node: ir.Expr) -> bool:
        """Whether computing the value calls a function, directly or through lets."""
        if isinstance(node, ir.Name):
            return node.id in self.lets and self._through_function(self.lets[node.id])
        return isinstance(node, ir.Call) or any(map(self._through_function, _operands(node)))

    def _python_code(self, node: ir.Expr, minimum: int) -> str:
        """A static value as Python computes it while the kernel is traced, to test or convert:
        its constants through functions folded now (jnp would stage them into the trace)."""
        self._python = True
        try:
            return self._wrap(node, minimum)
        finally:
            self._python = False

    def _weak_branch(self, node: ir.Expr, result: ValueType) -> str:
        """A weak branch of a `where`, as a Python float where the other branch makes the result one."""
        if result.dtype.is_float and not self.types[node].dtype.is_float:
            return f"float({self._python_code(node, _COMPARE)})"
        return self.emit(node)

    def _narrow_int(self, node: ir.Expr) -> bool:
        """Whether the kernel must widen this value: an array of i8, u8 or i16."""
        value_type = self.types[node]
        return (
            self.narrow_ints_in_i32
            and value_type.dtype.is_integer
            and value_type.dtype.bits < 32
            and not value_type.weak
        )

    def _in_i32(self, node: ir.Expr) -> bool:
        """Whether the TPU kernel computes this operation on narrow integers in i32:
        Mosaic has no i8 arithmetic and no narrow-integer compare, division or
        maximum, so arithmetic, maximum, minimum and clip are computed wide."""
        if not self._narrow_int(node) or node in self.overrides:
            return False
        if isinstance(node, ir.Call):
            return _narrows_in_i32(node)
        if isinstance(node, ir.Binary):
            return node.op in NARROW_ARITHMETIC
        return isinstance(node, ir.Unary)

    def _bf16_compare(self, node: ir.Binary) -> bool:
        """A TPU kernel's compare of bf16 values (nothing wider on either side). A v6e
        compares them in bf16, and its mask, laid out for 16 bits, cannot choose between
        32-bit values (Mosaic: "Invalid relayout"): they are compared in f32 instead."""
        strong = [t for t in (self.types[node.left], self.types[node.right]) if not t.weak]
        return self.tpu and bool(strong) and all(t.dtype.name == "bf16" for t in strong)

    def _in_f32(self, node: ir.Expr) -> str:
        """A side of a bf16 compare as f32: a weak one rounded to bf16 first, as JAX
        converts it to the array's dtype, so the compare gives what bf16 would."""
        if self.types[node].weak:
            return f"jnp.float32(jnp.bfloat16({self.emit(node)}))"
        return f"{self._wrap(node, _ATOM)}.astype(jnp.float32)"

    def _widened(self, node: ir.Expr) -> str:
        """The value as i32 if it is a narrow integer array, else as it is."""
        if not self._narrow_int(node):
            return self._wrap(node, _OR)
        return self._widened_atom(node)

    def _widened_atom(self, node: ir.Expr) -> str:
        """A narrow value as i32. maximum, minimum, clip and relu nested in one another stay
        in i32 (their results fit the narrow dtype); arithmetic is narrowed first, so that
        it wraps as the narrow dtype does before the next operation sees it."""
        if self._in_i32(node) and isinstance(node, ir.Call) and FUNCTIONS[node.func].in_range:
            return self._widened_operation(node)
        if self._narrow_int(node):
            return f"{self._wrap(node, _ATOM)}.astype(jnp.int32)"
        return self._wrap(node, _ATOM)

    def _widened_operation(self, node: ir.Expr) -> str:
        """A narrow-integer operation computed in i32, as an atom."""
        if isinstance(node, ir.Call):
            return self._widened_call(node)
        if isinstance(node, ir.Unary):
            return f"({node.op}{self._widened_atom(node.operand)})"
        left, right = self._widened_atom(node.left), self._widened_atom(node.right)
        if node.op == "//" and self.types[node].dtype.kind == "u":
            # Unsigned operands floor as they truncate; i32 floor division by zero gives -2
            # where XLA's unsigned division gives all ones, as truncating division does.
            return f"jax.lax.div({left}, {right})"
        return f"({left} {node.op} {right})"

    def _widened_call(self, node: ir.Call) -> str:
        """maximum, minimum or clip of narrow integers, computed in i32."""
        return self._code(node).format(", ".join(self._widened(arg) for arg in node.args))

    def _cast_code(self, node: ir.Expr, dtype: str) -> tuple[str, int]:
        if self.types[node].dims:
            return f"{self._wrap(node, _ATOM)}.astype({self.dtype(dtype)})", _ATOM
        return f"{self.dtype(dtype)}({self.emit(node)})", _ATOM

    def _wrap(self, node: ir.Expr, minimum: int) -> str:
        code, level = self._emit(node)
        return code if level >= minimum else f"({code})"


def _values(node: ir.Expr) -> tuple[ir.Expr, ...]:
    """The values an operation reads: its operands, or a call's arguments but dimensions."""
    if isinstance(node, ir.Call):
        typing = FUNCTIONS[node.func].typing
        return (
            node.args[:1]
            if typing in ("reduce", "softmax")
            else () if typing in ("index", "size") else tuple(node.args)
        )
    return _operands(node)


def _operands(node: ir.Expr) -> tuple[ir.Expr, ...]:
    if isinstance(node, ir.Unary):
        return (node.operand,)
    if isinstance(node, ir.Binary):
        return node.left, node.right
    return ()


_PYTHON_OPERATORS = {
    **PYTHON_OPS,
    "&": operator.and_,
    "|": operator.or_,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _whole_power(base, exponent) -> bool:
    """Whether `base ** exponent` is an integer power that folds modulo 2**64."""
    return type(base) is int and type(exponent) is int and exponent >= 0


def _python_literal(value: bool | int | float) -> tuple[str, int]:
    """A folded value as Python source, with its binding strength."""
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")', _ATOM
    return repr(value), _UNARY if value < 0 else _ATOM


def _narrows_in_i32(node: ir.Call) -> bool:
    function = FUNCTIONS.get(node.func)
    return function is not None and function.narrow_ints_in_i32


def _binding(code: str) -> int:
    """How tightly generated `code` binds: the loosest operator outside its brackets
    (generated code writes binary operators between spaces), or an atom if none."""
    depth, words, word = 0, [], ""
    for char in code:
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if depth == 0 and char == " ":
            words.append(word)
            word = ""
        else:
            word += char
    operators = [_BINARY_PRECEDENCE[w] for w in words[1:] if w in _BINARY_PRECEDENCE]
    return min(operators, default=_ATOM)
