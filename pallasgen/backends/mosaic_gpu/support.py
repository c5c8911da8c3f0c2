"""Which kernels Mosaic GPU takes, and why not the others.

Each rule was found by lowering for CUDA without a GPU (`jax.export(...,
platforms=["cuda"])`) on jax 0.10.2 and 0.12: what fails on either line is refused
here, so a kernel taken lowers on both. A kernel refused keeps Triton, and its
`gpu_backend` docstring line says why.
"""

from __future__ import annotations

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.frontend import ir

# Spec functions whose jax spelling has no Mosaic GPU lowering on one of the lines.
UNLOWERED_FUNCTIONS = {
    "sqrt": "sqrt has no Mosaic GPU lowering on jax 0.10.2",
    "relu": "jax.nn.relu (a custom_jvp) has no Mosaic GPU lowering on jax 0.10.2",
    "floor": "floor has no Mosaic GPU lowering",
    "ceil": "ceil has no Mosaic GPU lowering",
    "index": "index() needs an iota in the WGMMA layout, not written yet",
    "size": "size() is not spelled for Mosaic GPU yet",
}

# Operand dtypes of a product that wgmma takes (f32 as TF32), with the depth of a K
# block: 128 bytes, one swizzled row.
WGMMA_DTYPES = {"bf16": 64, "f16": 64, "f32": 32, "i8": 128}


def refusal(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take this kernel, or None if it does."""
    kernel, product = checked.kernel, checked.product
    if checked.fused is not None:
        return "fused kernels (several products, computed operands, attention) are not on Mosaic GPU yet"
    if any(d.reductions for d in checked.space.dims if product is None or d.name != product.k):
        return "reductions are not on Mosaic GPU yet"
    arrays = kernel.inputs + kernel.outputs
    if any(d.dtype == "bool" for d in arrays):
        return "bool arrays do not take the swizzled shared-memory layout Mosaic GPU copies through"
    if any(not d.dims for d in kernel.inputs):
        return "a 0-d input is not copied to Mosaic GPU's shared memory yet"
    if product is None and len(checked.space.layout) > 2:
        return "elementwise kernels of rank above 2 are not on Mosaic GPU yet"
    for statement in kernel.body:
        if isinstance(statement, ir.Assign):
            out = next(o for o in kernel.outputs if o.name == statement.target)
            if checked.types[statement.value].dims != out.dims:
                return f"{out.name} is broadcast to its dimensions, not written on Mosaic GPU yet"
    if any(tuple(o.dims) != tuple(checked.space.layout) for o in kernel.outputs):
        return "an output without every dimension of the kernel is not on Mosaic GPU yet"
    for node in ir.walk(*(s.value for s in kernel.body)):
        problem = _node_problem(checked, node)
        if problem:
            return problem
    return _product_problem(checked) if product is not None else None


def _node_problem(checked: CheckedKernel, node: ir.Expr) -> str | None:
    if isinstance(node, ir.Call) and node.func in UNLOWERED_FUNCTIONS:
        return UNLOWERED_FUNCTIONS[node.func]
    if isinstance(node, ir.Unary) and node.op == "~":
        return "logical not (~) has no Mosaic GPU lowering on jax 0.12"
    if isinstance(node, ir.Binary) and node.op in ("%", "//") and checked.types[node].dtype.kind == "f":
        return f"a float {node.op} has no Mosaic GPU lowering"
    computed = isinstance(node, (ir.Unary, ir.Binary)) and getattr(node, "op", "") != "@"
    computed |= isinstance(node, ir.Call) and node.func in FUNCTIONS and FUNCTIONS[node.func].typing != "cast"
    operands = [n for n in (node, *_children(node)) if n in checked.types]
    if computed and any(checked.types[n].dtype.name in ("i8", "u8") for n in operands):
        return "Mosaic GPU computes on 8-bit values only by bitwise operations"
    return None


def _children(node: ir.Expr) -> tuple[ir.Expr, ...]:
    if isinstance(node, ir.Binary):
        return node.left, node.right
    if isinstance(node, ir.Unary):
        return (node.operand,)
    return getattr(node, "args", ())


def _product_problem(checked: CheckedKernel) -> str | None:
    product, kernel = checked.product, checked.kernel
    if product.lhs.dtype.name not in WGMMA_DTYPES or product.rhs.dtype != product.lhs.dtype:
        return f"wgmma takes bf16, f16, f32 or i8 operands of one dtype, not {product.lhs.dtype.name}"
    if len(kernel.outputs) != 1:
        return "a product with several outputs is not on Mosaic GPU yet"
    operands = {o.name for o in product.operands}
    for decl in kernel.inputs:
        if decl.name not in operands and not set(decl.dims) <= {product.m, product.n}:
            return f"epilogue input {decl.name} has dimensions beyond {product.m} and {product.n}"
    return None
