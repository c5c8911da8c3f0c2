"""Which kernels Mosaic GPU takes, and why not the others.

Each rule was found by lowering for CUDA without a GPU (`jax.export(...,
platforms=["cuda"])`) on jax 0.10.2 and 0.12: what fails on either line is refused
here, so a kernel taken lowers on both. A kernel refused keeps Triton, and its
`gpu_backend` docstring line says why.
"""

from __future__ import annotations

import re

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.product import Product
from pallasgen.backends.mosaic_gpu.stages import stages
from pallasgen.backends.mosaic_gpu.fused_support import fused_problem
from pallasgen.frontend import ir
from pallasgen.lowering.parts import LINE_LENGTH, saved_only

# Spec functions whose jax spelling has no Mosaic GPU lowering on one of the lines.
UNLOWERED_FUNCTIONS = {
    "index": "index() in a kernel of rank other than 2 that does not reduce is not on Mosaic GPU yet",
}

# Spec functions spelled otherwise here: jax.nn.relu is a custom_jvp (no lowering on jax
# 0.10.2) around this maximum; floor and ceil have no lowering, and are computed from
# round (helpers: exact); sqrt has none on jax 0.10.2, and is computed from rsqrt; exp
# lowers to an accurate expf, several instructions where `ex2` is one.
SPELLINGS = {
    "exp": "rt.mgpu_exp({})",
    "relu": "jnp.maximum({}, 0)",
    "floor": "rt.mgpu_floor({})",
    "ceil": "rt.mgpu_ceil({})",
    "sqrt": "rt.mgpu_sqrt({})",
}

# The options of a Mosaic GPU kernel's emitter (lowering.pyexpr.Emitter): Mosaic GPU has
# no 8-bit arithmetic, so narrow integers are computed in i32 and cast back, as jnp does.
EMITTER_OPTIONS = {"narrow_ints_in_i32": True, "codes": SPELLINGS}

# Shared memory a program's blocks may take (an H100 has 227 KiB per block).
SMEM_BUDGET = 160 * 1024

# A product's output tiles (PRODUCT_TILE square, one per output) in shared memory, beside
# its pipeline's K blocks (64 KiB): within an H100's 227 KiB per block.
PRODUCT_TILE = 128  # M and N of a product's block: one warpgroup's wgmma accumulator
OUTPUT_TILES_BUDGET = 128 * 1024

# Operand dtypes of a product that wgmma takes (f32 as TF32), with the depth of a K
# block: 128 bytes, one swizzled row.
WGMMA_DTYPES = {"bf16": 64, "f16": 64, "f32": 32, "i8": 128}


def program_lines(program: dict[str, str]) -> list[str]:
    """A kernel's first lines: the index of each grid dimension (`program` maps it to its
    name), in one assignment where that fits a line of the kernel's body."""
    names, values = list(program.values()), [f"jax.lax.axis_index({d!r})" for d in program]
    line = f"{', '.join(names)} = {', '.join(values)}"
    return [line] if len(line) <= LINE_LENGTH - 4 else [f"{n} = {v}" for n, v in zip(names, values)]


def spec_list(specs) -> str:
    """A list of BlockSpecs or scratch types: `[spec] * n` where all n are the same, and
    a run of n alike among others `*[spec] * n`."""
    specs = list(specs)
    if len(specs) > 1 and len(set(specs)) == 1:
        return f"[{specs[0]}] * {len(specs)}"
    runs: list[list] = []
    for spec in specs:
        if runs and runs[-1][0] == spec:
            runs[-1][1] += 1
        else:
            runs.append([spec, 1])
    return f"[{', '.join(spec if n == 1 else f'*[{spec}] * {n}' for spec, n in runs)}]"


def kernel_call(
    function: str, out_type: str, grid: dict[str, str], arguments, scratch: str | None = None, warpgroups=None
) -> list[str]:
    """The launcher's call of its kernel (`rt.mgpu_kernel`): `function` (a partial) over
    `grid` ({name: programs}), its arguments, its scratch and computing warpgroups."""
    return [
        "rt.mgpu_kernel(",
        f"    {function},",
        f"    out_type={out_type},",
        f"    grid={{{', '.join(f'{name!r}: {count}' for name, count in grid.items())}}},",
        *([f"    scratch_types={scratch},"] if scratch is not None else []),
        *([f"    warpgroups={warpgroups},"] if warpgroups is not None else []),
        "    interpret=interpret,",
        f")({', '.join(arguments)})",
    ]


def copy_out(copies, residuals=frozenset()) -> list[str]:
    """The kernel's last lines: each (output's Ref, its tile in shared memory, its place
    in global memory) copied out by TMA (`rt.mgpu_copy_out`); a residual's (its Ref one
    of `residuals`) only where the launcher passed one (`saved_only`), after the rest."""
    lines = []
    kept = [f"({smem}, {at})" for ref, smem, at in copies if ref not in residuals]
    if kept:
        lines.append(f"rt.mgpu_copy_out({', '.join(kept)})")
    lines += [saved_only(ref, f"rt.mgpu_copy_out(({smem}, {at}))") for ref, smem, at in copies if ref in residuals]
    return lines


def compact(lines: list[str], width: int = LINE_LENGTH - 4) -> list[str]:
    """Assignments (`name = value`, one a line, in order) in fewer lines, as the same
    values computed in the same order: a value assigned and then only passed on once
    is written where it is passed (`x = f(x)` after `x = g(x)`: `x = f(g(x))`), and
    values that need no name assigned before them in the line share one assignment
    (`a, b = f(x), g(y)`), within `width`."""
    pairs: list[tuple[str, str]] = []
    for line in lines:
        name, value = line.split(" = ", 1)
        uses = re.findall(rf"\b{name}\b", value)
        if pairs and pairs[-1][0] == name and len(uses) == 1 and "#" not in pairs[-1][1]:
            value = re.sub(rf"\b{name}\b", lambda _: pairs.pop()[1], value)
        pairs.append((name, value))
    out: list[list[tuple[str, str]]] = []
    for name, value in pairs:
        group = out[-1] if out else None
        words = set(re.findall(r"\w+", value))
        joined = group and [*group, (name, value)]
        if (
            group
            and "#" not in value
            and all("#" not in v and n != name and n not in words for n, v in group)
            and len(f"{', '.join(n for n, _ in joined)} = {', '.join(v for _, v in joined)}") <= width
        ):
            group.append((name, value))
        else:
            out.append([(name, value)])
    return [f"{', '.join(n for n, _ in g)} = {', '.join(v for _, v in g)}" for g in out]


def layout_of(decl: ir.ArrayDecl, out_dims: tuple[str, ...], product: Product | None) -> tuple[str | None, ...]:
    """The dimensions an array is blocked over here: a product operand keeps its own; any
    other array is laid out over the kernel's layout `out_dims` (IterationSpace.layout),
    None where it lacks a dimension (it broadcasts there, or a reduction removed it)."""
    if product is not None and decl.name in {o.name for o in product.operands}:
        return decl.dims
    return tuple(d if d in decl.dims else None for d in out_dims)


def refusal(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take this kernel, or None if it does."""
    kernel, product = checked.kernel, checked.product
    chain = stages(checked)
    if chain:  # one product, of computed operands or reduced, or nested reductions: kernels in turn
        return next((reason for reason in (refusal(s.checked) for s in chain) if reason), None)
    if checked.framed:
        return fused_problem(checked)
    reduces = any(d.reductions for d in checked.space.dims if product is None or d.name != product.k)
    if reduces and product is not None:
        return "reductions beside a product are not on Mosaic GPU yet"
    arrays = kernel.inputs + kernel.outputs
    if any(d.dtype == "bool" for d in arrays):
        return "bool arrays do not take the swizzled shared-memory layout Mosaic GPU copies through"
    if any(not d.dims for d in kernel.inputs) and not (len(checked.space.layout) == 1 and reduces):
        return "a 0-d input is not copied to Mosaic GPU's shared memory yet"
    if reduces:
        problem = _reduction_problem(checked)
        if problem:
            return problem
    for statement in kernel.body:
        if isinstance(statement, ir.Assign):
            out = next(o for o in kernel.outputs if o.name == statement.target)
            value_dims = checked.types[statement.value].dims
            if not value_dims and out.dims:  # a vector is loaded broadcast
                return f"{out.name} is assigned a scalar, not written on Mosaic GPU yet"
            lacking = [d for d in out.dims if d not in value_dims]
            if reduces and lacking:  # its passes' kernels take an output's dimensions from its value
                return (
                    f"{out.name} is broadcast over {', '.join(lacking)}, which its value lacks: not on Mosaic GPU yet"
                )
    if not reduces and any(tuple(o.dims) != tuple(checked.space.layout) for o in kernel.outputs):
        return "an output without every dimension of the kernel is not on Mosaic GPU yet"
    for node in ir.walk(*(s.value for s in kernel.body)):
        problem = _node_problem(checked, node, reduces and len(checked.space.layout) <= 2)
        if problem:
            return problem
    return _product_problem(checked) if product is not None else None


def _reduction_problem(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take a kernel that reduces, or None: it takes an [M, N]
    kernel that reduces one of them (backends.mosaic_gpu.sweeps), and reductions to scalars."""
    kernel, layout = checked.kernel, checked.space.layout
    if len(layout) == 1:
        return _totals_problem(checked)
    if len(layout) != 2:
        return _outer_problem(checked)
    calls = [n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Call)]
    swept = {c.args[1].id for c in calls if FUNCTIONS[c.func].reducer is not None}
    if len(swept) > 1:
        return f"reductions over {' and '.join(sorted(swept))} in one kernel are not on Mosaic GPU yet"
    (dim,) = swept
    kept = next(d for d in layout if d != dim)
    for call in calls:
        if call.func == "softmax":
            return "softmax() is not on Mosaic GPU yet"
        if call.func == "index" and call.args[0].id != dim:
            return f"index({call.args[0].id}) in a kernel that reduces {dim} is not on Mosaic GPU yet"
        if FUNCTIONS[call.func].reducer is not None and kept not in checked.types[call.args[0]].dims:
            # its pass's kernel would carry a value of no kept position (sweeps: vectors of one)
            return f"{call.func}() over {dim} of a value without {kept} is not on Mosaic GPU yet"
    if any(kept not in o.dims for o in kernel.outputs):
        return f"an output without {kept} is not on Mosaic GPU yet"
    if not any(dim in d.dims for d in kernel.inputs + kernel.outputs):
        return f"a kernel that reduces {dim} and reads no array with {dim} is not on Mosaic GPU yet"
    return None


def _outer_problem(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take a kernel of rank above 2 that reduces, or None: it
    takes one that sums, averages, maximizes or minimizes one dimension before its last
    two, every array with those two (backends.mosaic_gpu.outer)."""
    kernel, layout = checked.kernel, checked.space.layout
    calls = reductions(kernel)
    swept = {c.args[1].id for c in calls}
    if len(swept) > 1 or swept & set(layout[-2:]):
        return "reductions of a kernel of rank above 2 other than of one dimension before its last two are not on Mosaic GPU yet"
    if any(isinstance(s, ir.Let) for s in kernel.body):
        return "lets in a kernel of rank above 2 that reduces are not on Mosaic GPU yet"
    if any(not set(layout[-2:]) <= set(d.dims) for d in kernel.inputs + kernel.outputs):
        return f"an array without {' and '.join(layout[-2:])} in a kernel that reduces beside them is not on Mosaic GPU yet"
    (dim,) = swept
    if any(len(o.dims) != len(layout) - 1 for o in kernel.outputs):
        return f"an output without a dimension besides {dim} is not on Mosaic GPU yet"
    for call in calls:
        if FUNCTIONS[call.func].reducer.merge is None:
            return f"{call.func}() over a dimension before the last two is not on Mosaic GPU yet"
        read = {n.id for n in ir.walk(call.args[0]) if isinstance(n, ir.Name)}
        if any(dim not in d.dims for d in kernel.inputs if d.name in read):
            return f"a reduction over {dim} of an input without {dim} is not on Mosaic GPU yet"
        if any(_reductions_in(call.args[0])):
            return "a reduction of another reduction's result over a dimension before the last two is not on Mosaic GPU yet"
    return None


def _totals_problem(checked: CheckedKernel) -> str | None:
    """Why Mosaic GPU does not take a rank-1 kernel that reduces, or None: it takes one
    whose outputs are scalars computed from sums, means, maxima, minima, argmax, argmin
    and logsumexp (`totals`)."""
    kernel = checked.kernel
    if not kernel.inputs:
        return "a kernel that reduces to a scalar and reads no array is not on Mosaic GPU yet"
    if any(isinstance(s, ir.Let) for s in kernel.body):
        return "lets in a kernel that reduces to a scalar are not on Mosaic GPU yet"
    if any(o.dims for o in kernel.outputs):
        return "an output with a dimension beside a reduction to a scalar is not on Mosaic GPU yet"
    for call in reductions(kernel):
        if FUNCTIONS[call.func].reducer.merge is None and call.func not in ("argmax", "argmin", "logsumexp"):
            return f"{call.func}() to a scalar is not on Mosaic GPU yet"
        if any(_reductions_in(call.args[0])):
            return "a reduction to a scalar of another reduction's result is not on Mosaic GPU yet"
    return None


def sized_dims(kernel: ir.Kernel) -> set[str]:
    """The dimensions whose size() the kernel reads: its kernel function takes their sizes."""
    calls = (n for n in ir.walk(*(s.value for s in kernel.body)) if isinstance(n, ir.Call))
    return {c.args[0].id for c in calls if c.func == "size"}


def reductions(kernel: ir.Kernel) -> list[ir.Call]:
    """The kernel's reductions, each once, in order."""
    return list(dict.fromkeys(_reductions_in(*(s.value for s in kernel.body))))


def _reductions_in(*nodes: ir.Expr):
    return (n for n in ir.walk(*nodes) if isinstance(n, ir.Call) and FUNCTIONS[n.func].reducer is not None)


def _node_problem(checked: CheckedKernel, node: ir.Expr, reduces: bool) -> str | None:
    if isinstance(node, ir.Call) and node.func == "index" and checked.product is not None:
        return "index() in a product's epilogue is not on Mosaic GPU yet"
    spelled = (
        node.func == "index" and (reduces or len(checked.space.layout) == 2) if isinstance(node, ir.Call) else False
    )
    if isinstance(node, ir.Call) and node.func in UNLOWERED_FUNCTIONS and not spelled:
        return UNLOWERED_FUNCTIONS[node.func]
    if isinstance(node, ir.Unary) and node.op == "~":
        return "logical not (~) has no Mosaic GPU lowering on jax 0.12"
    if isinstance(node, ir.Binary) and node.op in ("%", "//") and checked.types[node].dtype.kind == "f":
        return f"a float {node.op} has no Mosaic GPU lowering"
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
    if any(o.dims != kernel.outputs[0].dims for o in kernel.outputs):
        return "a product's outputs of different dimensions are not on Mosaic GPU yet"
    tiles = sum(PRODUCT_TILE * PRODUCT_TILE * DTYPES[o.dtype].bits // 8 for o in kernel.outputs)
    if tiles > OUTPUT_TILES_BUDGET:
        return f"a product's output tiles take {tiles // 1024} KiB of shared memory, more than Mosaic GPU's plan allows"
    operands = {o.name for o in product.operands}
    for decl in kernel.inputs:
        if decl.name not in operands and not set(decl.dims) <= {product.m, product.n}:
            return f"epilogue input {decl.name} has dimensions beyond {product.m} and {product.n}"
    return None
