"""Which fused kernels (analysis.fused: attention, its gradients) Mosaic GPU takes, and
why not the others (backends.mosaic_gpu.fused writes those it takes).

Its products run on `wgmma`, whose right operand is a tile in shared memory and whose
left one is a tile there or a 16-bit value in registers, contracted along its columns;
an f32 value meets a 16-bit operand as two 16-bit parts (see `fused`). Running values
other than products, maxima and exp-sums merge one value per row (sum, max, min, mean).
"""

from __future__ import annotations

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.frontend import ir

WGMMA_16 = ("bf16", "f16")  # the dtypes a product's operands take on wgmma here


def product_dtypes(checked: CheckedKernel, node: ir.Binary) -> tuple[str, str | None]:
    """The 16-bit dtype a fused product runs in, and whether its left operand (an f32
    value) is split into two parts of it (None: not split)."""
    product = checked.frame.products[node]
    lhs, rhs = (checked.types[v].dtype.name for v in (product.lhs, product.rhs))
    if lhs == "f32" and rhs in WGMMA_16:
        return rhs, rhs
    return lhs, None


def fused_problem(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take this fused kernel, or None if it does."""
    fused, kernel = checked.frame, checked.kernel
    if checked.sweep is None:
        return "a fused kernel without a swept dimension is not on Mosaic GPU yet"
    for node, product in fused.products.items():
        lhs, rhs = (checked.types[v].dtype.name for v in (product.lhs, product.rhs))
        split = lhs == "f32" and rhs in WGMMA_16
        if not split and (lhs not in WGMMA_16 or rhs != lhs):
            return f"a fused product of {lhs} and {rhs} is not on Mosaic GPU yet (wgmma here: bf16 or f16 operands)"
        if product.lhs_contracts == 0:
            return "a fused product whose left tile is contracted along its rows is not on Mosaic GPU yet"
    split, swept = (fused.parallel[0] if fused.parallel else None), checked.sweep.dim
    for decl in kernel.inputs:
        if split in decl.dims and swept in decl.dims:
            return (
                f"an input read along the swept dimension in blocks of {split} ({decl.name}) is not on Mosaic GPU's"
                f" fused form (its warpgroups compute blocks of {split} each, and share the blocks it copies in)"
            )
    inputs = {d.name for d in kernel.inputs}
    for carry in checked.sweep.carries:
        if carry.kind == "dot" and all(
            isinstance(v, ir.Name) and v.id in inputs
            for v in (fused.products[carry.node].lhs, fused.products[carry.node].rhs)
        ):
            return (
                "a product of two inputs over the swept dimension is not on Mosaic GPU's fused form"
                " (it holds the product's columns whole, up to 256)"
            )

        if carry.kind in ("dot", "expsum"):
            continue
        if FUNCTIONS[carry.kind].reducer.merge is None:
            return f"{carry.kind}() over the swept dimension of a fused kernel is not on Mosaic GPU yet"
    for node in ir.walk(*(s.value for s in kernel.body)):
        if isinstance(node, ir.Call) and node.func != "softmax" and FUNCTIONS[node.func].reducer is not None:
            if FUNCTIONS[node.func].reducer.merge is None and node not in checked.sweep.results:
                return f"{node.func}() over a tile of a fused kernel is not on Mosaic GPU yet"
    arrays = kernel.inputs + kernel.outputs
    if any(not [d for d in a.dims if d not in fused.batch] for a in arrays):
        return "an array of a fused kernel with batch dimensions alone is not on Mosaic GPU yet"
    if any(a.dtype == "bool" for a in arrays):
        return "bool arrays do not take the swizzled shared-memory layout Mosaic GPU copies through"
    return None
