"""The GPU (Triton) half of a kernel's plan.

Triton has no scratch memory and runs grid programs concurrently, so a product
loops over its contracted dimension inside one program, loading zeros past a
ragged end; every block is a power of two.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from . import ir
from .checks import CheckedKernel
from .gpu import OPTIONS
from .names import Namer, block_keyword
from .product import Product
from .planparts import dot_code, grid_names, layout_of, parameter_list, partial_call, tuple_code
from .pyexpr import jnp_dtype


@dataclass(frozen=True)
class GpuBlockPlan:
    keyword: str  # gpu_block_m, a keyword of the public function
    local: str  # block_m, inside the GPU function
    default: int
    size: str
    dim: str
    smallest: int  # Triton's dot needs tiles of at least 16 in each dimension


# Triton's tl.dot takes tiles of at least 16 rows, columns and depth.
SMALLEST_DOT_TILE = 16


@dataclass(frozen=True)
class GpuPlan:
    function: str
    kernel_function: str
    blocks: tuple[GpuBlockPlan, ...]  # the tunable ones (squeezed batch dims are not)
    options: tuple[tuple[str, str, int], ...]  # (public keyword, GPU function keyword, default)
    grid: str
    grid_comment: tuple[str, ...]
    in_specs: tuple[tuple[str, str], ...]  # (comment, BlockSpec)
    out_specs: tuple[tuple[str, str], ...]
    kernel_parameters: str
    kernel_callable: str
    parameters: str  # of the GPU launcher
    dispatch_arguments: str  # how the public function calls the launcher
    loop: tuple[str, ...]  # the K loop of a product, ending with the accumulator's assignment
    body: tuple[str, ...]


def plan_gpu(checked: CheckedKernel, namer: Namer, values, refs, sizes, comments, epilogue, accumulator) -> GpuPlan:
    kernel, product = checked.kernel, checked.product
    out_dims = kernel.outputs[0].dims
    squeezed = {d for d in out_dims[:-2] if checked.gpu_blocks.get(d) == 1} if product else set()
    grid_dims = list(out_dims)
    index_names = grid_names(grid_dims, product)

    def block_spec(layout: tuple[str | None, ...]) -> str:
        shape, index = [], []
        for dim in layout:
            if dim is None:
                shape.append("1")
                index.append("0")
            elif dim in squeezed:
                shape.append("None")
                index.append(index_names[dim])
            elif product is not None and dim == product.k:  # the program loops over it
                shape.append(sizes[dim])
                index.append("0")
            else:
                shape.append(block_keyword(dim))
                index.append(index_names[dim])
        return f"pl.BlockSpec({tuple_code(shape)}, lambda {', '.join(index_names.values())}: {tuple_code(index)})"

    def layout(decl: ir.ArrayDecl) -> tuple[str | None, ...]:
        return layout_of(decl, out_dims, product)

    tunable = [d for d in checked.dims if d not in squeezed]
    loop: list[str] = []
    kernel_keywords = [p.name for p in kernel.params]
    if product is not None:
        out_ref = refs[kernel.outputs[0].name]
        loop = _product_loop(product, namer, values, refs, sizes, accumulator, out_ref)
        kernel_keywords = [sizes[product.k], block_keyword(product.k), *kernel_keywords]
    grid = [sizes[d] if d in squeezed else f"pl.cdiv({sizes[d]}, {block_keyword(d)})" for d in grid_dims]
    return GpuPlan(
        function=f"_{kernel.name}_gpu",
        kernel_function=f"_{kernel.name}_gpu_kernel",
        blocks=tuple(
            GpuBlockPlan(
                f"gpu_{block_keyword(d)}",
                block_keyword(d),
                checked.gpu_blocks[d],
                sizes[d],
                d,
                SMALLEST_DOT_TILE if product and d in (product.m, product.n, product.k) else 1,
            )
            for d in tunable
        ),
        options=tuple((keyword, f"num_{name}", checked.gpu_options[name]) for name, (keyword, _) in OPTIONS.items()),
        grid=tuple_code(grid),
        grid_comment=tuple(textwrap.wrap(_grid_comment(grid_dims, product, squeezed), 84)),
        in_specs=tuple((comments[d.name], block_spec(layout(d))) for d in kernel.inputs),
        out_specs=tuple((comments[d.name], block_spec(layout(d))) for d in kernel.outputs),
        kernel_parameters=parameter_list([refs[d.name] for d in kernel.inputs + kernel.outputs], kernel_keywords),
        kernel_callable=partial_call(f"_{kernel.name}_gpu_kernel", kernel_keywords),
        parameters=parameter_list(
            [values[d.name] for d in kernel.inputs],
            [sizes[d] for d in checked.dims]
            + [block_keyword(d) for d in tunable]
            + [f"num_{name}" for name in OPTIONS]
            + [p.name for p in kernel.params]
            + ["interpret"],
        ),
        dispatch_arguments=", ".join(
            [values[d.name] for d in kernel.inputs]
            + [f"{sizes[d]}={sizes[d]}" for d in checked.dims]
            + [f"{block_keyword(d)}=gpu_{block_keyword(d)}" for d in tunable]
            + [f"num_{name}={keyword}" for name, (keyword, _) in OPTIONS.items()]
            + [f"{p.name}={p.name}" for p in kernel.params]
            + ["interpret=interpret"]
        ),
        loop=tuple(loop),
        body=tuple(epilogue),
    )


def _grid_comment(grid_dims: list[str], product: Product | None, squeezed: set[str]) -> str:
    steps = ", ".join(f"element of {d}" if d in squeezed else f"block of {d}" for d in grid_dims)
    if product is None:
        return f"One program per {steps}; programs run concurrently."
    return f"One program per {steps}; each loops over {product.k} itself (Triton has no scratch memory)."


def _product_loop(product: Product, namer: Namer, values, refs, sizes, accumulator: str, out_ref: str) -> list[str]:
    """`def accumulate(step, acc)`, summing one slice of the contracted dimension, and its loop."""
    k, block_k = sizes[product.k], block_keyword(product.k)
    step, start, inside, function = (namer.claim(n) for n in ("step", "start", "inside", "accumulate"))
    lhs, rhs = (values[o.name] for o in product.operands)
    lhs_ref, rhs_ref = (refs[o.name] for o in product.operands)
    # The contracted axis of each operand as stored: x[:, K] unless read transposed.
    lhs_slice = (
        f"{lhs_ref}.at[pl.ds({start}, {block_k}), :]"
        if product.lhs.transposed
        else f"{lhs_ref}.at[:, pl.ds({start}, {block_k})]"
    )
    rhs_slice = (
        f"{rhs_ref}.at[:, pl.ds({start}, {block_k})]"
        if product.rhs.transposed
        else f"{rhs_ref}.at[pl.ds({start}, {block_k}), :]"
    )
    lhs_mask = f"{inside}[:, None]" if product.lhs.transposed else f"{inside}[None, :]"
    rhs_mask = f"{inside}[None, :]" if product.rhs.transposed else f"{inside}[:, None]"
    accumulate = jnp_dtype(product.accumulator.name)
    dot = dot_code(product, lhs, rhs)
    out_shape = f"{out_ref}.shape"
    return [
        f"def {function}({step}, {accumulator}):",
        f"    {start} = {step} * {block_k}",
        f"    if {k} % {block_k}:  # a ragged {product.k}: load zeros past its end",
        f"        {inside} = {start} + jnp.arange({block_k}) < {k}",
        f"        {lhs} = pltriton.load({lhs_slice}, mask={lhs_mask}, other=0)",
        f"        {rhs} = pltriton.load({rhs_slice}, mask={rhs_mask}, other=0)",
        "    else:",
        f"        {lhs}, {rhs} = {lhs_slice.replace('.at[', '[')}, {rhs_slice.replace('.at[', '[')}",
        f"    return {accumulator} + {dot}",
        "",
        f"{accumulator} = jax.lax.fori_loop(0, pl.cdiv({k}, {block_k}), {function}, jnp.zeros({out_shape}, {accumulate}))",
    ]
