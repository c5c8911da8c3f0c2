"""The matrix product of a kernel: its operands, dimensions and accumulator."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import DTYPES, F32, I32, DType
from pallasgen.frontend.errors import Diagnostic

OPERAND_DTYPES = ("f32", "bf16", "f16", "i8")


@dataclass(frozen=True)
class Operand:
    name: str
    transposed: bool
    dims: tuple[str, ...]  # as stored
    dtype: DType

    @property
    def matrix_dims(self) -> tuple[str, ...]:
        """The dimensions as the product sees them, after `.T`."""
        if not self.transposed:
            return self.dims
        return (*self.dims[:-2], self.dims[-1], self.dims[-2])


@dataclass(frozen=True)
class Product:
    node: ir.Binary
    lhs: Operand
    rhs: Operand
    m: str
    n: str
    k: str  # the contracted dimension
    accumulator: DType

    @property
    def operands(self) -> tuple[Operand, Operand]:
        return self.lhs, self.rhs


def find_products(kernel: ir.Kernel) -> list[ir.Binary]:
    """Every `@` in the kernel body, in source order."""
    found = [n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Binary) and n.op == "@"]
    return sorted(found, key=lambda n: (n.position.line, n.position.column))


def analyze_product(kernel: ir.Kernel) -> tuple[Product | None, list[Diagnostic]]:
    """The kernel's one product (None if it has none, or its operands are not matrices
    of inputs), and diagnostics for anything it cannot compute."""
    products = find_products(kernel)
    if not products:
        return None, []
    found = [
        Diagnostic(extra.op_position, "a kernel computes one matrix product; split the others into their own kernels")
        for extra in products[1:]
    ]
    node = products[0]
    inputs = {d.name: d for d in kernel.inputs}
    operands = []
    for side in (node.left, node.right):
        operand, problem = _operand(side, inputs)
        if problem:
            found.append(problem)
        operands.append(operand)
    if found or None in operands:
        return None, found
    lhs, rhs = operands
    for operand, side in zip(operands, (node.left, node.right)):
        if len(operand.dims) < 2:
            found.append(
                Diagnostic(
                    side.position, f"'{operand.name}' is not a matrix: a product operand has two or more dimensions"
                )
            )
    if found:
        return None, found
    *_, m, k = lhs.matrix_dims
    *_, k_right, n = rhs.matrix_dims
    if k != k_right:
        return None, [
            *found,
            Diagnostic(
                node.op_position,
                f"the contracted dimensions differ: '{lhs.name}' ends in {k} but '{rhs.name}' has {k_right}"
                f" second to last{'; transpose one with .T' if k in rhs.dims else ''}",
            ),
        ]
    if lhs.dtype != rhs.dtype:
        found.append(
            Diagnostic(
                node.op_position,
                f"'{lhs.name}' is {lhs.dtype.name} but '{rhs.name}' is {rhs.dtype.name}; the operands of @ share a dtype",
            )
        )
    elif lhs.dtype.name not in OPERAND_DTYPES:
        found.append(
            Diagnostic(
                node.op_position, f"matrix products take {', '.join(OPERAND_DTYPES)} operands, not {lhs.dtype.name}"
            )
        )
    accumulator, problems = _accumulator(kernel, lhs.dtype)
    found.extend(problems)
    # The product is known even when its dtypes are wrong, so later checks do not
    # mistake its operands for elementwise inputs.
    return Product(node, lhs, rhs, m, n, k, accumulator), found


def operand_names(kernel: ir.Kernel) -> set[str]:
    """Names used inside the operands of any `@`, whether or not the product is valid."""
    sides = [side for node in find_products(kernel) for side in (node.left, node.right)]
    return {node.id for node in ir.walk(*sides) if isinstance(node, ir.Name)}


def batch_dims(product: Product) -> tuple[str, ...]:
    """The product's batch dimensions: the left operand's, then the right's it lacks
    (the output holds them, in its own order, before M and N: `product_fits`)."""
    batch = list(product.lhs.dims[:-2])
    batch += [d for d in product.rhs.dims[:-2] if d not in batch]
    return tuple(batch)


def product_dims(product: Product) -> tuple[str, ...]:
    """The dimensions of the product's value: batch dimensions from both sides, then M and N."""
    return (*batch_dims(product), product.m, product.n)


def product_fits(product: Product, output_dims: tuple[str, ...]) -> bool:
    """Whether the product's value has the outputs' dimensions, ending in the same two,
    and the contracted dimension is not among them."""
    value_dims = product_dims(product)
    return (
        sorted(value_dims) == sorted(output_dims)
        and output_dims[-2:] == value_dims[-2:]
        and product.k not in output_dims
    )


def _operand(node: ir.Expr, inputs: dict[str, ir.ArrayDecl]) -> tuple[Operand | None, Diagnostic | None]:
    transposed = isinstance(node, ir.Attribute) and node.attr == "T"
    target = node.value if transposed else node
    if not isinstance(target, ir.Name) or target.id not in inputs:
        return None, Diagnostic(
            node.position, "a matrix product operand is an input array, optionally transposed: x @ y, q @ k.T"
        )
    decl = inputs[target.id]
    if decl.dtype not in DTYPES or len(set(decl.dims)) < len(decl.dims):
        return None, None  # reported in checks: an unknown dtype, a dimension twice
    return Operand(decl.name, transposed, decl.dims, DTYPES[decl.dtype]), None


def _accumulator(kernel: ir.Kernel, operand_dtype: DType) -> tuple[DType, list[Diagnostic]]:
    default = F32 if operand_dtype.is_float else I32
    if not kernel.accumulates or kernel.accumulates[0].dtype not in DTYPES:
        return default, []
    chosen = kernel.accumulates[0]
    if chosen.dtype != default.name:
        kind = "float" if operand_dtype.is_float else "integer"
        return default, [
            Diagnostic(chosen.position, f"{kind} operands accumulate in {default.name} on TPU, not {chosen.dtype}")
        ]
    return DTYPES[chosen.dtype], []
