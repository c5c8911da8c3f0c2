"""The TPU plan of every kernel, from its tiles (analysis.fused) and what it carries
(analysis.carries): a grid of batch elements, blocks of the dimensions outputs keep
(parallel, unless an output lacks one) and, last, the steps of the swept dimension
(arbitrary), whose running values (a product's accumulator, a reduction's) live in
VMEM scratch, set at the first step and read at the last (`pl.when`). An elementwise
kernel carries nothing: one step per block."""

from __future__ import annotations

import re
from dataclasses import replace

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import tpu_dtype
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.carries import walk_outside
from pallasgen.analysis.fused import array_axes
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.tpu.plan import (
    AccumulatorPlan,
    BlockPlan,
    LINE_LENGTH,
    BlockTable,
    StripsPlan,
    TpuPlan,
    block_table,
    grid_comment,
    kernel_function_name,
    launcher_name,
    output_bytes,
    read_keywords,
    sum_code,
    tpu_return,
    tunable_dims,
    vmem_comment,
    residual_vmem_code,
    wrap,
)
from pallasgen.backends.base import ArrayBlocks, BlockAxis, GridAxis, Tiling, frame_grid_names
from pallasgen.backends.tpu.chips import (
    FUSED_BLOCK,
    chip_blocks,
    one_product_dims,
    STRIP_COLS,
    STRIP_ROWS,
    STRIPED_BLOCK,
    STRIPED_VMEM_LIMIT_BYTES,
)
from pallasgen.backends.tpu.tiling import accumulates_elementwise, holds_rows, kernel_vmem, tile_layouts
from pallasgen.frontend import ir
from pallasgen.lowering.fused import FrameSpelling, FusedLowering, RefPlacement, used_starts
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import (
    if_residuals,
    kernel_signature,
    parameter_list,
    partial_call,
    ref_load,
    ref_store,
    tuple_code,
)
from pallasgen.lowering.pyexpr import jnp_dtype

# What the VMEM comment of a kernel computed in strips says of its limit.
STRIPED_LIMIT = (
    f"The limit is {STRIPED_VMEM_LIMIT_BYTES >> 20} MiB whatever the blocks: their count leaves out a strip's"
    " working values and the lanes a (rows, 1) value pads to."
)


def grid_dims(checked: CheckedKernel) -> list[str]:
    """Batch dimensions, then the parallel blocks, then the swept dimension's steps; those
    of them that some output lacks (`in_every_output`) after the others, just before the
    swept one: Mosaic wants the parallel axes to be a prefix of the grid."""
    fused = checked.frame
    kept = [*fused.batch, *fused.parallel]
    swept = [checked.sweep.dim] if checked.sweep else []
    return sorted(kept, key=lambda d: not in_every_output(checked.kernel, d)) + swept


def in_every_output(kernel: ir.Kernel, dim: str) -> bool:
    """Whether every output has `dim`: then its blocks are independent (parallel). The
    blocks of one that an output lacks each write that output's same block, which the
    cores of a multicore chip would race on (dy's K beside dbias [N]): they run in order."""
    return all(dim in out.dims for out in kernel.outputs)


def plan_tpu(lowered: LoweredKernel) -> TpuPlan:
    checked = lowered.checked
    launcher, kernel_function = launcher_name(checked.kernel.name), kernel_function_name(checked.kernel.name)
    kernel, fused = checked.kernel, checked.frame
    values, sizes, refs = lowered.values, lowered.sizes, lowered.refs
    namer = lowered.namer.fork()
    grid = grid_dims(checked)
    tunable = tunable_dims(checked)
    index_names = frame_grid_names(grid, fused.batch)
    extents = {d: block_keyword(d) if d in checked.blocks else sizes[d] for d in checked.dims}
    starts = {}
    prologue = []
    for axis, dim in enumerate(grid):
        if checked.sweep and dim == checked.sweep.dim:
            continue
        start = namer.claim(f"{dim.lower()}_start")
        starts[dim] = start
        block = "" if dim in fused.batch else f" * {block_keyword(dim)}"
        prologue.append(f"{start} = pl.program_id({axis}){block}")
    step = namer.claim("step")
    if checked.sweep:
        sweep_start = namer.claim(f"{checked.sweep.dim.lower()}_start")
        starts[checked.sweep.dim] = sweep_start
    spelling = FrameSpelling(fused, sizes, extents, starts)

    def emitter_for(overrides):
        return lowered.emitter(tpu=True, spelling=spelling, overrides=overrides)

    lowering = FusedLowering(
        lowered, namer, spelling, extents, RefPlacement(), emitter_for, ref_load(refs), mosaic=True
    )
    # A kernel that skips blocks computes each step in strips of rows: the positions in its
    # body are those of a strip, whose extents the strip function takes.
    strip_extents = None
    if striped(checked):
        strip_extents = {d: namer.claim(f"strip_{d.lower()}") for d in (fused.row, checked.sweep.dim)}
    body_spelling = FrameSpelling(fused, sizes, {**extents, **(strip_extents or {})}, starts)

    def body_emitter_for(overrides):
        return lowered.emitter(tpu=True, spelling=body_spelling, overrides=overrides)

    # A kernel whose only dimension is swept keeps block-shaped running values, held as rows
    # where it reads no position (see `accumulates_elementwise` and `holds_rows`).
    swept_dim = checked.sweep.dim if checked.sweep else None
    blockwise = swept_dim is not None and accumulates_elementwise(kernel, swept_dim)
    rows = swept_dim is not None and holds_rows(kernel, swept_dim)
    body_lowering = FusedLowering(
        lowered,
        namer,
        body_spelling,
        extents,
        RefPlacement(),
        body_emitter_for,
        _rows_load(refs) if rows else ref_load(refs),
        mosaic=True,
        blockwise=blockwise,
        rows=rows,
    )
    accumulator = None
    scratch_refs = []
    if checked.sweep:
        dim = checked.sweep.dim
        ragged = f"{sizes[dim]} % {block_keyword(dim)}"
        # A ragged block is masked from the step's index: a start computed up front cost
        # matmul's backward pass 2 cycles more on v5e (bench --chip).
        code = body_lowering.swept(ref_store(refs, lowered.residual_names), f"{step} * {block_keyword(dim)}", ragged)
        prologue.append(f"{sweep_start} = pl.program_id({len(grid) - 1}) * {block_keyword(dim)}")
        scratch_refs = [r.name for r in code.running]
        skip = lowering.live_block(starts)
        accumulator = AccumulatorPlan(
            scratch=tuple((f"{r.name}: {r.comment}", f"pltpu.VMEM({r.shape}, {r.dtype})") for r in code.running),
            step=step,
            axis=len(grid) - 1,
            init_function="_init",
            init=tuple(f"{r.name}[...] = jnp.full({r.name}.shape, {r.initial}, {r.dtype})" for r in code.running),
            body=(*code.before, *code.step),
            finish_function="_finish",
            skip=skip,
            strips=(
                _strips_plan(
                    checked,
                    refs,
                    code.running,
                    starts,
                    strip_extents,
                    lowering,
                    (*code.before, *code.step),
                    sizes,
                )
                if strip_extents
                else None
            ),
        )
        body = code.finish
    else:
        body = lowering.whole(ref_store(refs, lowered.residual_names)).step
    strips = accumulator.strips if accumulator else None
    keywords = [
        *(sizes[d] for d in checked.dims),
        *(block_keyword(d) for d in tunable),
        *(p.name for p in kernel.params),
    ]
    prologue = used_starts(
        [
            *body,
            *(accumulator.body if accumulator else ()),
            accumulator.skip if accumulator and accumulator.skip else "",
            *((strips.call,) if strips else ()),
        ],
        prologue,
    )
    keywords = read_keywords(keywords, [*prologue, *body, *(accumulator.code() if accumulator else ())])
    inputs = [values[d.name] for d in kernel.inputs]
    semantics = tuple("parallel" if in_every_output(kernel, d) else "arbitrary" for d in grid)
    layouts = tile_layouts(kernel, fused)
    live = None
    if accumulator is not None and accumulator.skip:
        # The swept dimension's blocks a step skips are not fetched: those index maps stay
        # on block 0 (an unchanged block index is not fetched again).
        at = {d: index_names[d] if d in fused.batch else f"{index_names[d]} * {extents[d]}" for d in grid}
        live = lowering.live_block(at)
    tiling = Tiling(
        grid=tuple(GridAxis(d, index_names[d], s, d in fused.batch) for d, s in zip(grid, semantics)),
        arrays=tuple(_array_blocks(decl, checked, index_names, live) for decl in kernel.inputs + kernel.outputs),
        looped=None,
    )
    helper, block_specs = _block_specs(tiling, sizes, live, namer)

    needed = kernel_vmem(checked, checked.blocks)
    # As (bytes, dims) terms; the residuals' blocks only where the launcher writes them.
    plain = kernel_vmem(checked, checked.blocks, lowered.plain).terms() if lowered.residuals else None
    vmem_needed = residual_vmem_code(needed.terms(), plain, extents, set(fused.batch))
    kernel_parameters, unpacked = kernel_signature(
        [refs[d.name] for d in kernel.inputs + kernel.outputs], scratch_refs, keywords
    )
    return TpuPlan(
        function=launcher,
        kernel_function=kernel_function,
        blocks=tuple(BlockPlan(block_keyword(d), checked.blocks[d], d) for d in tunable),
        block_table=_block_table(checked, tunable, sizes, layouts, vmem_needed, striped=strips is not None),
        kernel_parameters=kernel_parameters,
        kernel_callable=partial_call(kernel_function, keywords),
        parameters=parameter_list(
            inputs,
            [sizes[d] for d in checked.dims]
            + [block_keyword(d) for d in tunable]
            + [p.name for p in kernel.params]
            + (["residuals"] if lowered.residuals else [])
            + ["interpret"],
        ),
        binding=", ".join(
            [f"{sizes[d]}={sizes[d]}" for d in checked.dims]
            + [f"{block_keyword(d)}={block_keyword(d)}" for d in tunable]
            + [f"{p.name}={p.name}" for p in kernel.params]
        ),
        conversions=tuple(
            f"{a.name} = {a.name}.astype(jnp.float32)  # f16 has no TPU vectors: computed as f32 (one more pass over {a.name})"
            for a in lowered.inputs
            if a.spec_dtype != tpu_dtype(a.spec_dtype)
        ),
        returns=tpu_return(lowered),
        grid=tiling.grid_code(sizes),
        grid_comment=wrap(grid_comment(grid, checked.dims, set(fused.batch), semantics), 8),
        in_specs=tuple((a.comment, block_specs[d.name]) for a, d in zip(lowered.inputs, kernel.inputs)),
        out_specs=tuple(
            (a.comment, if_residuals(block_specs[d.name], a)) for a, d in zip(lowered.outputs, kernel.outputs)
        ),
        out_shapes=tuple(
            (
                if_residuals(f"jax.ShapeDtypeStruct({o.layout_shape}, {jnp_dtype(tpu_dtype(o.spec_dtype))})", o),
                o.spec_name,
            )
            for o in lowered.outputs
        ),
        dimension_semantics=semantics,
        vmem_comment=wrap(
            vmem_comment(needed, checked.blocks, checked.dims, STRIPED_LIMIT if strips else "", lowered.residual_names),
            4,
        ),
        vmem_needed=vmem_needed,
        vmem_limit=f"{STRIPED_VMEM_LIMIT_BYTES >> 20} * 2**20" if strips else f"rt.vmem_limit({vmem_needed})",
        cost_estimate=_cost_estimate(checked, values, sizes, lowered.residual_names),
        accumulator=accumulator,
        body=tuple(body),
        tiling=tiling,
        vmem=needed,
        prologue=(*unpacked, *prologue),
        helper=helper,
    )


def _block_table(checked: CheckedKernel, tunable, sizes, layouts, vmem_needed: str, striped=False) -> BlockTable | None:
    """The spec's blocks, and each chip's tuned entries, for a call that passes none; on a
    known chip, untuned, its tiles' rows and swept dimension grow (`rt.grown`) up to
    FUSED_BLOCK while a step stays within the elements and VMEM `rt.grown` allows. A kernel
    computed in strips grows up to STRIPED_BLOCK, and a power of two within its dimension,
    while a strip of its step stays within them. A kernel of one product, holding no
    dimension but its K whole, does not grow at call time: each chip has its default
    blocks (`chip_blocks`, its MXU's). A kernel without products grows every block from
    the spec's (`rt.grown`)."""
    if not tunable:
        return None
    fused = checked.frame
    if not fused.products or one_product_dims(checked) is not None:
        # Without products every block grows, while a step's elements (of every dimension) allow.
        elements = " * ".join(block_keyword(d) if d in checked.blocks else sizes[d] for d in checked.dims)
        step = f"({elements}, {vmem_needed})" if not fused.products else ""
        return block_table(
            checked, tunable, sizes, layouts, lambda chip: chip_blocks(checked, tunable, chip).values(), step
        )
    grown = {fused.row, *([checked.sweep.dim] if checked.sweep else [])}
    largest = STRIPED_BLOCK if striped else FUSED_BLOCK
    bounds = [largest if d in grown else checked.blocks[d] for d in tunable]
    elements = " * ".join(
        f"min({block_keyword(d)}, {STRIP_ROWS})" if striped and d == fused.row else block_keyword(d) for d in tunable
    )
    spec = [checked.blocks[d] for d in tunable]
    return block_table(
        checked, tunable, sizes, layouts, lambda chip: spec, f"({elements}, {vmem_needed})", tuple(bounds), striped
    )


def striped(checked: CheckedKernel) -> bool:
    """Whether a kernel computes each step in strips of rows (see the `rt.add_in_strips` helper):
    it skips blocks by a condition on the positions of its rows and swept dimension only,
    two dimensions both blocked (not so a kernel that sweeps its rows' dimension: dk of
    `logsumexp(where(index(S) >= index(T), q @ k.T, -inf), T)` sweeps S), and its last
    step reads no position."""
    fused = checked.frame
    if not checked.sweep or not checked.sweep.skip or fused.row not in checked.blocks:
        return False
    if fused.row == checked.sweep.dim:
        return False
    dims = {fused.row, checked.sweep.dim}
    read = [n for n in ir.walk(checked.sweep.skip.condition) if isinstance(n, ir.Call) and n.func == "index"]
    outside = [n for s in checked.sweep.finish for n in walk_outside(s.value, checked.sweep.results)]
    finish = [n for n in outside if isinstance(n, ir.Call) and n.func == "index"]
    return all(n.args[0].id in dims for n in read) and not finish


def _strips_plan(checked, refs, running, starts, strip_extents, lowering, body, sizes) -> StripsPlan:
    """The strip function's parameters (the refs its body reads, the strip's first
    positions and extents) and the call that computes the step in strips."""
    kernel, fused = checked.kernel, checked.frame
    row, dim = fused.row, checked.sweep.dim

    def view(name, axes):
        index = ["rows" if a == row else "cols" if a == dim else "None" for a in axes]
        while index and index[-1] == "None":
            index.pop()
        return f"rt.strip_view({name}, {', '.join(index)})" if index else name

    text = "\n".join(body)
    arrays = []
    for decl in kernel.inputs:
        ref = refs[decl.name]
        if re.search(rf"\b{re.escape(ref)}\b", text):
            batch = len([d for d in decl.dims if d in fused.batch])
            arrays.append((ref, array_axes(decl, fused)[batch:]))
    arrays += [(r.name, (row,) if row in r.dims else ()) for r in running]
    parameters = [name for name, _ in arrays] + [starts[row], starts[dim], strip_extents[row], strip_extents[dim]]
    views = f"lambda rows, cols: ({', '.join(view(name, axes) for name, axes in arrays)},)"
    positions = ", ".join([starts[row], starts[dim], block_keyword(row), block_keyword(dim)])
    blocks = tuple_code([block_keyword(row), block_keyword(dim)])
    counts = tuple_code([f"pl.cdiv({sizes[d]}, {block_keyword(d)})" for d in (row, dim)])
    return StripsPlan(
        function="_strip",
        parameters=", ".join(parameters),
        call=(
            f"rt.add_in_strips(_strip, {views}, {blocks}, {tuple_code([starts[row], starts[dim]])}, {counts},"
            f" height={STRIP_ROWS}, chunk={STRIP_COLS}, {_lambda('seen', positions, lowering.live_block(starts))},"
            f" {_lambda('whole', positions, lowering.whole_block())})"
        ),
    )


def _rows_load(refs):
    """Loads of a kernel whose only dimension is held as rows (`holds_rows`): a block of
    it as `rt.as_rows` holds it, a scalar as it is."""
    plain = ref_load(refs)
    return lambda decl: f"rt.as_rows({plain(decl)})" if decl.dims else plain(decl)


def _lambda(keyword: str, parameters: str, body: str) -> str:
    """`keyword=lambda parameters: body`, a keyword of a call in the kernel; its body in
    parentheses where it is too long for one line, so that black breaks the line there."""
    code = f"{keyword}=lambda {parameters}: {body}"
    return code if len(code) <= LINE_LENGTH - 9 else f"{keyword}=lambda {parameters}: ({body})"


def _array_blocks(decl: ir.ArrayDecl, checked: CheckedKernel, index_names, live=None) -> ArrayBlocks:
    """An array's blocks; with `live`, a block of the swept dimension that a step skips
    is block 0."""
    fused = checked.frame
    axes = []
    for dim in array_axes(decl, fused):
        if dim in fused.batch:
            axes.append(BlockAxis(dim, "squeezed", index_names[dim]))
        elif dim is None:
            axes.append(BlockAxis(None, "one", None))
        elif dim not in checked.blocks:
            axes.append(BlockAxis(dim, "whole", None))
        elif live and checked.sweep and dim == checked.sweep.dim:
            axes.append(BlockAxis(dim, "block", index_names[dim], live))
        else:
            axes.append(BlockAxis(dim, "block", index_names[dim]))
    return ArrayBlocks(decl.name, tuple(axes))


def _block_specs(tiling: Tiling, sizes, live: str | None, namer) -> tuple[tuple[str, ...], dict[str, str]]:
    """Each array's `pl.BlockSpec`, by name, and the launcher's lines that define the
    function their index maps call for the swept dimension's block where a step may be
    skipped (`live`: whether it adds anything), with its comment; none where none is."""
    if not live:
        return (), {a.name: tiling.block_spec(a, sizes) for a in tiling.arrays}
    axis = next(a for array in tiling.arrays for a in array.axes if a.live)
    function = namer.claim(f"{axis.dim.lower()}_block")
    indices = [g.index for g in tiling.grid if re.search(rf"\b{re.escape(g.index)}\b", f"{live} {axis.index}")]
    call = f"{function}({', '.join(indices)})"
    specs = {
        array.name: tiling.block_spec(
            replace(array, axes=tuple(replace(a, index=call, live=None) if a.live else a for a in array.axes)), sizes
        )
        for array in tiling.arrays
    }
    comment = f"A step's block of {axis.dim}; a skipped step's is block 0, fetched at most once."
    lines = (
        *(f"# {line}" for line in wrap(comment, 4)),
        f"def {function}({', '.join(indices)}):",
        f"    return {axis.index_code}",
    )
    return lines, specs


def _leading(terms: list[tuple[int, list[str]]]) -> list[tuple[int, list[str]]]:
    """The terms whose factors no other term's include and exceed."""
    return [(n, f) for n, f in terms if not any(set(f) < set(other) for _, other in terms)]


def _cost_estimate(checked: CheckedKernel, values, sizes, residuals=frozenset()) -> str:
    """Flops of every product (2 per multiply-add) and of every other operation (1 per
    element of its value; a reduction's, of its operand's), exp and other transcendentals
    once per element of their value, each count's leading terms only (a term over a part
    of another's dimensions is left out); and the bytes of the arrays."""
    kernel, fused = checked.kernel, checked.frame
    flops, transcendentals = [], []
    nodes = list(dict.fromkeys(ir.walk(*(s.value for s in kernel.body))))  # a value used twice is computed once
    for node in nodes:
        if not isinstance(node, (ir.Binary, ir.Unary, ir.Call)) or node not in checked.types:
            continue
        reduces = isinstance(node, ir.Call) and FUNCTIONS[node.func].reducer
        elements = [sizes[d] for d in checked.types[node.args[0] if reduces else node].dims]
        if isinstance(node, ir.Binary) and node.op == "@":
            flops.append((2, [*elements, sizes[fused.products[node].k]]))
        elif isinstance(node, ir.Call) and FUNCTIONS[node.func].transcendental:
            transcendentals.append((1, elements))
        else:
            flops.append((1, elements))
    flops, transcendentals = _leading(flops), _leading(transcendentals)
    inputs = ", ".join(values[d.name] for d in kernel.inputs)
    # Without products, each output counts as the layout's size: counted as their own, the
    # estimate of softmax's forward and backward passes (bench --chip v5e --grad) was 40%
    # worse, XLA scheduling the forward pass's residuals differently.
    layout = [sizes[d] for d in checked.space.layout]
    outputs = output_bytes(kernel, residuals, lambda out: [sizes[d] for d in out.dims] if fused.products else layout)
    return (
        f"pl.CostEstimate(flops={sum_code(flops)}, transcendentals={sum_code(transcendentals)},"
        f" bytes_accessed=rt.nbytes({inputs}) + {outputs})"
    )
