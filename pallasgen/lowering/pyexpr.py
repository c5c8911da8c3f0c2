"""Spec expressions as Python source, with the fewest parentheses Python needs."""

from __future__ import annotations

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import BOOL, DTYPES, tpu_dtype
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.valuetypes import ValueType

# Python binding strength, loosest first.
_COMPARE, _OR, _AND, _SUM, _PRODUCT, _UNARY, _POWER, _ATOM = range(8)
_BINARY_PRECEDENCE = {
    **dict.fromkeys(("==", "!=", "<", "<=", ">", ">="), _COMPARE),
    "|": _OR,
    "&": _AND,
    "+": _SUM,
    "-": _SUM,
    **dict.fromkeys(("*", "/", "//", "%", "@"), _PRODUCT),
    "**": _POWER,
}
# Operators on narrow integers that the TPU kernel computes in i32.
NARROW_ARITHMETIC = frozenset({"+", "-", "*", "//", "%", "**", "&", "|"})


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
    ):
        self.names = names
        self.types = types
        self.overrides = overrides  # nodes computed elsewhere, such as the product, by variable
        # How reductions and index() are written here (lowering.reductions); None: no reductions.
        self.spelling = spelling
        # For a TPU kernel: f16 computed as f32, and i8/u8/i16 compares, maximum, minimum and
        # clip widened to i32, which Mosaic lowers (it has no narrow-integer compare).
        self.tpu = tpu

    def dtype(self, name: str) -> str:
        """A spec dtype as this kernel's code spells it."""
        return jnp_dtype(tpu_dtype(name) if self.tpu else name)

    def emit(self, node: ir.Expr) -> str:
        return self._emit(node)[0]

    def cast(self, node: ir.Expr, dtype: str) -> str:
        """The node's value as `dtype` (a spec dtype name), converting only if needed."""
        value_type = self.types[node]
        if value_type.dtype.name == dtype and not value_type.weak:
            return self.emit(node)
        return self._cast_code(node, dtype)[0]

    def _emit(self, node: ir.Expr) -> tuple[str, int]:
        if node in self.overrides:
            return self.overrides[node], _ATOM
        if isinstance(node, ir.Name):
            return self.names[node.id], _ATOM
        if isinstance(node, ir.Number):
            text = repr(node.value)
            return text, _ATOM
        if isinstance(node, ir.Boolean):
            return repr(node.value), _ATOM
        if isinstance(node, (ir.Unary, ir.Binary)) and self._in_i32(node):
            return f"{self._widened_operation(node)}.astype({self.dtype(self.types[node].dtype.name)})", _ATOM
        if isinstance(node, ir.Unary):
            if node.op == "~" and self.types[node].dtype == BOOL:
                return f"jnp.logical_not({self.emit(node.operand)})", _ATOM
            return f"{node.op}{self._wrap(node.operand, _UNARY)}", _UNARY
        if isinstance(node, ir.Binary):
            level = _BINARY_PRECEDENCE[node.op]
            if node.op == "**":  # right-associative; binds tighter than a unary minus on its left
                left, right = self._wrap(node.left, _POWER + 1), self._wrap(node.right, _UNARY)
            else:
                left, right = self._wrap(node.left, level), self._wrap(node.right, level + 1)
            if level == _COMPARE:
                left, right = self._wrap(node.left, _OR), self._wrap(node.right, _OR)
                if self._narrow_int(node.left) or self._narrow_int(node.right):
                    left, right = self._widened(node.left), self._widened(node.right)
            return f"{left} {node.op} {right}", level
        if isinstance(node, ir.Call):
            code = self._call(node)
            return code, _binding(code)
        raise TypeError(f"no Python form for {type(node).__name__}")

    def _call(self, node: ir.Call) -> str:
        function = FUNCTIONS[node.func]
        if function.typing == "reduce":
            value = node.args[0]
            return self.spelling.reduction(node, self._wrap(value, _ATOM), self.types[value].dtype)
        if function.typing == "index":
            return self.spelling.positions(node.args[0].id)
        if node.func == "round" and self.spelling is not None:
            if not self.types[node.args[0]].dtype.is_float:
                return self.emit(node.args[0])  # integers are already whole
            return self.spelling.rounded(self.emit(node.args[0]))
        if function.typing == "cast":
            return self._cast_code(node.args[0], node.func)[0]
        if function.typing == "float":
            arg = self.types[node.args[0]]
            (operand,) = [self.emit(a) if arg.dtype.is_float else self._cast_code(a, "f32")[0] for a in node.args]
            return function.code.format(operand)
        if function.narrow_ints_in_i32 and self._narrow_int(node):
            return f"{self._widened_call(node)}.astype({self.dtype(self.types[node].dtype.name)})"
        return function.code.format(", ".join(self.emit(arg) for arg in node.args))

    def _narrow_int(self, node: ir.Expr) -> bool:
        """Whether the TPU kernel must widen this value: an array of i8, u8 or i16."""
        value_type = self.types[node]
        return self.tpu and value_type.dtype.is_integer and value_type.dtype.bits < 32 and not value_type.weak

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
        return f"({self._widened_atom(node.left)} {node.op} {self._widened_atom(node.right)})"

    def _widened_call(self, node: ir.Call) -> str:
        """maximum, minimum or clip of narrow integers, computed in i32."""
        return FUNCTIONS[node.func].code.format(", ".join(self._widened(arg) for arg in node.args))

    def _cast_code(self, node: ir.Expr, dtype: str) -> tuple[str, int]:
        if self.types[node].dims:
            return f"{self._wrap(node, _ATOM)}.astype({self.dtype(dtype)})", _ATOM
        return f"{self.dtype(dtype)}({self.emit(node)})", _ATOM

    def _wrap(self, node: ir.Expr, minimum: int) -> str:
        code, level = self._emit(node)
        return code if level >= minimum else f"({code})"


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
