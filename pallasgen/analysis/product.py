"""The matrix product of a kernel: its operands, dimensions and accumulator."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.frontend import ir
from pallasgen.analysis.dtypes import DTYPES, F32, I32, DType
from pallasgen.analysis.functions import FUNCTIONS

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


def product_of_inputs(kernel: ir.Kernel) -> Product | None:
    """The kernel's one product where its operands are matrices of input arrays (each
    optionally transposed) of one dtype: its operands, dimensions and accumulator. None
    for any other kernel."""
    products = products_of_inputs(kernel)
    return products[0] if products is not None and len(products) == 1 else None


def products_of_inputs(kernel: ir.Kernel) -> tuple[Product, ...] | None:
    """The kernel's products, in source order, where each is of input matrices of one
    dtype (`silu(x @ w1) * (x @ w3)`); None where it has none or any other."""
    inputs = {d.name: d for d in kernel.inputs}
    products = []
    for node in find_products(kernel):
        lhs, rhs = (_operand(side, inputs) for side in (node.left, node.right))
        if lhs is None or rhs is None or lhs.dtype != rhs.dtype:
            return None
        *_, m, k = lhs.matrix_dims
        *_, _, n = rhs.matrix_dims
        products.append(Product(node, lhs, rhs, m, n, k, F32 if lhs.dtype.is_float else I32))
    return tuple(products) or None


def single_product(kernel: ir.Kernel) -> Product | None:
    """`product_of_inputs` where it is the kernel's whole matrix work, the form a backend
    may plan as a product alone (Mosaic GPU's wgmma pipeline): nothing reduced beside
    it, and every output and every other input laid out as its value's dimensions."""
    product = product_of_inputs(kernel)
    if product is None or any(
        isinstance(n, ir.Call) and n.func in FUNCTIONS and FUNCTIONS[n.func].reducer
        for n in ir.walk(*(s.value for s in kernel.body))
    ):
        return None
    dims = kernel.outputs[0].dims
    if any(out.dims != dims for out in kernel.outputs) or not product_fits(product, dims):
        return None
    operands = {o.name for o in product.operands}
    others = [d.dims for d in kernel.inputs if d.name not in operands]
    return product if all(_in_order(other, dims) for other in others) else None


def _in_order(dims: tuple[str, ...], of: tuple[str, ...]) -> bool:
    """Whether `dims` are some of `of`'s, in its order (as an input broadcasts by position)."""
    return set(dims) <= set(of) and sorted(dims, key=of.index) == list(dims)


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


def _operand(node: ir.Expr, inputs: dict[str, ir.ArrayDecl]) -> Operand | None:
    """An input matrix read as an operand, optionally transposed; None for any other value."""
    transposed = isinstance(node, ir.Attribute) and node.attr == "T"
    target = node.value if transposed else node
    if not isinstance(target, ir.Name) or target.id not in inputs:
        return None
    decl = inputs[target.id]
    if decl.dtype not in DTYPES or len(decl.dims) < 2:
        return None
    return Operand(decl.name, transposed, decl.dims, DTYPES[decl.dtype])
