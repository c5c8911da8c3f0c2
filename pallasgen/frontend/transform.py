"""Lark tree to the typed IR, keeping the position of every node."""

from __future__ import annotations

from lark import Token, Transformer, Tree, v_args

from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic, Position

MAX_EXPRESSION_DEPTH = 200


class TransformDiagnostic(Exception):
    """A tree that parsed but cannot become IR: too deep, or a name Python cannot use."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def to_ir(tree: Tree, source: str) -> ir.Spec:
    """Builds the IR; comment lines right above a kernel become its docstring."""
    _check_depth(tree)
    _check_names(tree)
    _check_numbers(tree)
    _check_grad(tree)
    kernels = _ToIR().transform(tree).children
    for kernel in kernels:
        _check_chained_depth(kernel)
    lines = source.split("\n")
    return ir.Spec(tuple(_with_doc(kernel, lines) for kernel in kernels))


def _check_depth(tree: Tree) -> None:
    """Refuses trees too deep for the recursive passes after this one."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPRESSION_DEPTH:
            raise TransformDiagnostic(
                Diagnostic(
                    _span(node),
                    f"expression nested more than {MAX_EXPRESSION_DEPTH} levels deep (or too long); split it with let",
                )
            )
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def _check_chained_depth(kernel: ir.Kernel) -> None:
    """Refuses a value nested too deep once the lets and outputs it reads are counted in:
    later passes (gradients, say) put them together into one expression."""
    depths: dict[str, int] = {}
    for statement in kernel.body:
        deepest, stack = 0, [(statement.value, 1)]
        while stack:
            node, depth = stack.pop()
            if isinstance(node, ir.Name):
                depth += depths.get(node.id, 1) - 1
            deepest = max(deepest, depth)
            children = [getattr(node, a) for a in ("operand", "left", "right", "value") if hasattr(node, a)]
            stack.extend((child, depth + 1) for child in [*children, *getattr(node, "args", ())])
        name = statement.name if isinstance(statement, ir.Let) else statement.target
        if deepest > MAX_EXPRESSION_DEPTH:
            raise TransformDiagnostic(
                Diagnostic(
                    statement.position,
                    f"'{name}' is computed through more than {MAX_EXPRESSION_DEPTH} levels of operations, counting"
                    " the lets and outputs it reads; split the kernel in two",
                )
            )
        depths.setdefault(name, deepest)


def _check_names(tree: Tree) -> None:
    """Refuses a name that is no Python identifier once normalized (such as one starting with ²)."""
    for token in tree.scan_values(lambda v: isinstance(v, Token) and v.type == "NAME"):
        if not token.isidentifier():
            raise TransformDiagnostic(Diagnostic(_token_position(token), f"'{token}' is not a valid name"))


MAX_INTEGER_DIGITS = 100  # far past every dtype (u64 has 20), and short of Python's int() limit


def _check_numbers(tree: Tree) -> None:
    """Refuses a whole number of more digits than any dtype holds (Python would not even read
    one of more than 4300 digits)."""
    for token in tree.scan_values(lambda v: isinstance(v, Token) and v.type == "NUMBER"):
        if not any(c in token for c in ".eE") and len(token) > MAX_INTEGER_DIGITS:
            raise TransformDiagnostic(
                Diagnostic(_token_position(token), f"a whole number of {len(token)} digits is too large for any dtype")
            )


def _check_grad(tree: Tree) -> None:
    """Refuses a `grad` statement other than `grad none` (the only one there is)."""
    for statement in tree.find_data("grad_decl"):
        (word,) = statement.children
        if word != "none":
            raise TransformDiagnostic(
                Diagnostic(_token_position(word), f"unknown gradient setting '{word}': the only one is `grad none`")
            )


def _with_doc(kernel: ir.Kernel, lines: list[str]) -> ir.Kernel:
    doc: list[str] = []
    index = kernel.position.line - 2
    while index >= 0 and lines[index].lstrip().startswith("#"):
        text = lines[index].lstrip()[1:]
        doc.insert(0, (text[1:] if text.startswith(" ") else text).rstrip())
        index -= 1
    return ir.Kernel(**{**kernel.__dict__, "doc": tuple(doc)})


def _token_position(token: Token) -> Position:
    return Position(token.line, token.column, token.end_line, token.end_column - 1)


def _span(tree: Tree) -> Position:
    meta = tree.meta
    return Position(meta.line, meta.column, meta.end_line, meta.end_column - 1)


INFINITY = "inf"  # the IEEE infinity literal: -inf masks a score out


@v_args(tree=True)
class _ToIR(Transformer):
    # Expressions

    def name(self, tree):
        (token,) = tree.children
        if token == INFINITY:
            return ir.Number(float("inf"), INFINITY, _token_position(token))
        return ir.Name(str(token), _token_position(token))

    def number(self, tree):
        (token,) = tree.children
        return ir.Number(_number(token), str(token), _token_position(token))

    def true(self, tree):
        return ir.Boolean(True, _span(tree))

    def false(self, tree):
        return ir.Boolean(False, _span(tree))

    def unary(self, tree):
        op, operand = tree.children
        return ir.Unary(str(op), operand, _span(tree))

    def binary(self, tree):
        left, op, right = tree.children
        return ir.Binary(str(op), left, right, _span(tree), _token_position(op))

    def call(self, tree):
        func, *args = tree.children
        args = tuple(arg for arg in args if arg is not None)
        return ir.Call(str(func), args, _span(tree), _token_position(func))

    def attribute(self, tree):
        value, attr = tree.children
        return ir.Attribute(value, str(attr), _span(tree), _token_position(attr))

    # Statements

    def name_list(self, tree):
        return list(tree.children)

    def array_type(self, tree):
        dtype, *dims = tree.children
        return dtype, [dim for dim in dims if dim is not None]

    def input_decl(self, tree):
        return ("in", _arrays(*tree.children))

    def output_decl(self, tree):
        return ("out", _arrays(*tree.children))

    def let_stmt(self, tree):
        name, value = tree.children
        return ("body", ir.Let(str(name), value, _token_position(name)))

    def assign_stmt(self, tree):
        target, value = tree.children
        return ("body", ir.Assign(str(target), value, _token_position(target)))

    def signed_number(self, tree):
        minus, token = tree.children
        value = _number(token)
        return (-value if minus else value), tree

    def param_decl(self, tree):
        name, dtype, (value, number_tree) = tree.children
        param = ir.Param(
            str(name),
            str(dtype),
            value,
            "".join(str(t) for t in number_tree.children if t is not None),
            _token_position(name),
            _token_position(dtype),
            _span(number_tree),
        )
        return ("param", [param])

    def block_item(self, tree):
        dim, minus, size = tree.children
        value, position = _signed(minus, size)
        return ir.BlockSize(str(dim), value, _token_position(dim), position)

    def block_decl(self, tree):
        return ("block", list(tree.children))

    def gpu_block_decl(self, tree):
        return ("gpu_block", list(tree.children))

    def option_item(self, tree):
        name, minus, number = tree.children
        value, position = _signed(minus, number)
        return ir.GpuOption(str(name), value, _token_position(name), position)

    def gpu_option_decl(self, tree):
        return ("gpu_option", list(tree.children))

    def accumulate_decl(self, tree):
        (dtype,) = tree.children
        return ("accumulate", [ir.Accumulate(str(dtype), _token_position(dtype))])

    def grad_decl(self, tree):
        return ("grad_none", [ir.GradNone(_span(tree))])  # `grad none`: see _check_grad

    def kernel(self, tree):
        name, *statements = tree.children
        parts: dict[str, list] = {
            kind: []
            for kind in ("in", "out", "param", "body", "block", "accumulate", "gpu_block", "gpu_option", "grad_none")
        }
        for kind, items in statements:
            parts[kind].extend(items if isinstance(items, list) else [items])
        return ir.Kernel(
            name=str(name),
            position=_token_position(name),
            doc=(),
            inputs=tuple(parts["in"]),
            outputs=tuple(parts["out"]),
            params=tuple(parts["param"]),
            body=tuple(parts["body"]),
            blocks=tuple(parts["block"]),
            accumulates=tuple(parts["accumulate"]),
            gpu_blocks=tuple(parts["gpu_block"]),
            gpu_options=tuple(parts["gpu_option"]),
            grad_none=tuple(parts["grad_none"]),
        )


def _arrays(names: list[Token], array_type) -> list[ir.ArrayDecl]:
    dtype, dims = array_type
    return [
        ir.ArrayDecl(
            str(name),
            str(dtype),
            tuple(str(dim) for dim in dims),
            _token_position(name),
            _token_position(dtype),
            tuple(_token_position(dim) for dim in dims),
        )
        for name in names
    ]


def _signed(minus: Token | None, number: Token) -> tuple[int | float, Position]:
    """A number with an optional minus sign, and the span of both."""
    value = _number(number)
    start = minus if minus is not None else number
    return (-value if minus else value), Position(start.line, start.column, number.end_line, number.end_column - 1)


def _number(token: Token) -> int | float:
    text = str(token)
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)
