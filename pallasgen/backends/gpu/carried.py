"""The GPU (Triton) plan of every kernel, as carried state (its frame: analysis.fused):
one program per batch element and block of the dimensions outputs keep; each program
loops over the swept dimension's blocks itself, its running values carried by the loop
(Triton has no scratch memory). Blocks are powers of two; a dimension held whole takes
the next power of two, and every load and store that can overhang its array is
masked."""

from __future__ import annotations

import textwrap
from dataclasses import replace

from pallasgen.analysis.checks import CheckedKernel, sweep_of
from pallasgen.analysis.dtypes import DTYPES, promote
from pallasgen.analysis.fused import FusedKernel, array_axes
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import ArrayBlocks, BlockAxis, GridAxis, Tiling, frame_grid_names
from pallasgen.backends.gpu.options import OPTIONS, gpu_block_keyword
from pallasgen.backends.gpu.plan import (
    GPU_DOC,
    SMALLEST_DOT_TILE,
    SMALLEST_INT8_DOT_DEPTH,
    GpuBlockPlan,
    GpuPlan,
    dispatch_arguments,
    kernel_function_name,
    launcher_name,
    comments_above,
    launcher_parameters,
    mentioned,
    out_shapes,
    shape_reads,
    tuned_fields,
)
from pallasgen.frontend import ir
from pallasgen.lowering.fused import FrameSpelling, FusedLowering, Placement, used_starts
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import (
    LINE_LENGTH,
    if_residuals,
    parameter_list,
    partial_call,
    saved_only,
    tuple_code,
    used_names,
)
from pallasgen.lowering.signature import Keyword, KeywordGroup

DEFAULT_BLOCK = 64  # rows of queries, keys per loop step: FlashAttention's tiles on Hopper


def on_triton(checked: CheckedKernel) -> CheckedKernel:
    """The kernel as a Triton program computes it: blocked along each dimension its GPU
    blocks name (`gpu block`, else Triton's defaults, `options.default_blocks`) whatever
    the TPU's blocks say; a lone product loops over its contracted dimension's blocks:
    the TPU may take a dimension whole that a program cannot hold (its operands would
    outgrow shared memory at large sizes). A framed kernel's GPU blocks are its TPU
    blocks' dimensions."""
    gpu_blocks = checked.settings["gpu"].blocks
    if set(gpu_blocks) <= set(checked.blocks):
        return checked
    frame, blocks = checked.frame, {**checked.blocks, **gpu_blocks}
    sweep, problems = sweep_of(checked.kernel, checked.types, blocks, frame.batch)
    if problems:
        return checked
    outputs = {d for decl in checked.kernel.outputs for d in decl.dims}
    parallel = tuple(d for d in checked.dims if d in blocks and d in outputs and d not in frame.batch)
    return replace(checked, blocks=blocks, sweep=sweep, frame=replace(frame, parallel=parallel))


def tunable_dims(checked: CheckedKernel) -> list[str]:
    checked = on_triton(checked)
    return [d for d in checked.dims if d in checked.blocks and d not in checked.batch]


def whole_dims(checked: CheckedKernel) -> list[str]:
    """Tile dimensions a program holds whole, in one block of the next power of two."""
    checked = on_triton(checked)
    fused = checked.frame
    tiles = {a for axes in fused.frame.values() for a in axes if a}
    tiles |= {d for decl in checked.kernel.inputs + checked.kernel.outputs for d in decl.dims if d not in fused.batch}
    return [d for d in checked.dims if d in tiles and d not in checked.blocks]


def dot_depth(checked: CheckedKernel, dim: str) -> int:
    """The least block of `dim` that Triton's dot takes as its depth where a product
    contracts `dim` (its operands converted to their common dtype), 1 where none does."""
    types = checked.types
    return max(
        (
            SMALLEST_INT8_DOT_DEPTH if promote(types[p.lhs].dtype, types[p.rhs].dtype).bits == 8 else SMALLEST_DOT_TILE
            for p in checked.frame.products.values()
            if p.k == dim
        ),
        default=1,
    )


def default_gpu_blocks(kernel: ir.Kernel, blocks: dict[str, int], fused, given: dict[str, int]) -> dict[str, int]:
    """The default GPU block of each dimension the TPU blocks (batch ones: 1): `given`
    (the spec's `gpu block`), else 64, no less than a dot's tile."""
    return {
        d: 1 if d in fused.batch else given.get(d, max(SMALLEST_DOT_TILE, min(DEFAULT_BLOCK, size)))
        for d, size in blocks.items()
    }


def gpu_blocks(checked: CheckedKernel) -> dict[str, int]:
    settings = checked.settings["gpu"].blocks
    return {d: settings[d] for d in tunable_dims(checked)}


def keyword_group(checked: CheckedKernel) -> KeywordGroup:
    blocks = tuple(Keyword(gpu_block_keyword(d), "None") for d in gpu_blocks(checked))
    options = tuple(Keyword(keyword, "None") for keyword, _ in OPTIONS.values())
    return KeywordGroup((*blocks, *options), GPU_DOC)


def k_major_swaps(checked: CheckedKernel) -> frozenset[str]:
    """The inputs the launcher swaps to K-major (their last two axes): those of 32 or 8 bits
    read only as products' operands whose tiles hold the contracted dimension first (x.T's
    [K, M], y's [K, N]). Hopper's wgmma transposes a shared-memory tile of 16-bit values
    only; Triton moves any other through shared memory a byte or a word at a time, which
    left f32 products at 0.17x and int8 at 0.27x of XLA on an H200 (benchmarks/RESULTS.md).
    The swap is one pass over the operand in HBM, as Mosaic GPU's launchers make it."""
    fused = checked.frame
    contracted = {p.lhs: p.lhs_contracts for p in fused.products.values()}
    contracted |= {p.rhs: p.rhs_contracts for p in fused.products.values()}
    uses: dict[str, list[ir.Expr]] = {}
    for node in ir.walk(*(s.value for s in checked.kernel.body)):
        if isinstance(node, ir.Name):
            uses.setdefault(node.id, []).append(node)
    return frozenset(
        d.name
        for d in checked.kernel.inputs
        if DTYPES[d.dtype].bits != 16
        and d.name in uses
        and all(contracted.get(node) == 0 and None not in fused.frame[node] for node in uses[d.name])
    )


def _swapped(fused: FusedKernel, swapped: frozenset[str]) -> FusedKernel:
    """The frame as the kernel sees it once the `swapped` inputs have their last two axes
    swapped: their tiles' axes reversed, the products contracting their other axis."""

    def turned(node) -> bool:
        return isinstance(node, ir.Name) and node.id in swapped

    frame = {node: axes[::-1] if turned(node) else axes for node, axes in fused.frame.items()}
    products = {
        node: replace(
            p,
            lhs_contracts=1 - p.lhs_contracts if turned(p.lhs) else p.lhs_contracts,
            rhs_contracts=1 - p.rhs_contracts if turned(p.rhs) else p.rhs_contracts,
        )
        for node, p in fused.products.items()
    }
    return replace(fused, frame=frame, products=products)


def plan_gpu(lowered: LoweredKernel) -> GpuPlan:
    lowered = replace(lowered, checked=on_triton(lowered.checked))
    swapped = k_major_swaps(lowered.checked)
    if swapped:
        lowered = replace(lowered, checked=replace(lowered.checked, frame=_swapped(lowered.checked.frame, swapped)))
    checked = lowered.checked
    kernel, fused = checked.kernel, checked.frame
    namer, values, refs, sizes = lowered.namer.fork(), lowered.values, lowered.refs, lowered.sizes
    settings = checked.settings["gpu"]
    swept = checked.sweep.dim if checked.sweep else None
    grid = [*fused.batch, *fused.parallel]
    index_names = frame_grid_names(grid, fused.batch)
    tunable = tunable_dims(checked)
    whole = whole_dims(checked)
    extents = {d: block_keyword(d) for d in [*tunable, *whole]}
    inside = {d: namer.claim(f"in_{d.lower()}") for d in [*tunable, *whole]}
    first = {  # where this program's block of each grid dimension starts
        d: f"pl.program_id({axis})" + ("" if d in fused.batch else f" * {block_keyword(d)}")
        for axis, d in enumerate(grid)
    }
    starts = {d: namer.claim(f"{d.lower()}_start") for d in grid}
    prologue = [f"{starts[d]} = {first[d]}" for d in grid]
    masks = [
        f"{inside[d]} = rt.inside({first[d]}, {block_keyword(d)}, {sizes[d]})" for d in grid if d not in fused.batch
    ]
    masks += [f"{inside[d]} = rt.inside(0, {block_keyword(d)}, {sizes[d]})" for d in whole]
    sweep_start = namer.claim(f"{swept.lower()}_start") if swept else None
    if swept:
        starts[swept] = sweep_start
    spelling = FrameSpelling(fused, sizes, extents, starts, padded=frozenset(whole), round_helper=True)

    def layout(decl: ir.ArrayDecl) -> tuple[str | None, ...]:
        axes = array_axes(decl, fused)
        return (*axes[:-2], axes[-1], axes[-2]) if decl.name in swapped else axes

    def axes(decl):
        return [a for a in layout(decl) if a not in fused.batch]

    def block_axis(dim: str | None) -> BlockAxis:
        if dim in fused.batch:
            return BlockAxis(dim, "squeezed", index_names[dim])
        if dim is None:
            return BlockAxis(None, "one", None)
        if dim == swept:  # all of it: the program loops over its slices
            return BlockAxis(dim, "whole", None)
        return BlockAxis(dim, "block", None if dim in whole else index_names[dim])

    def block_axes(decl: ir.ArrayDecl) -> tuple[BlockAxis, ...]:
        return tuple(block_axis(d) for d in layout(decl))

    tiling = Tiling(
        grid=tuple(GridAxis(d, index_names[d], "parallel", d in fused.batch) for d in grid),
        arrays=tuple(ArrayBlocks(decl.name, block_axes(decl)) for decl in kernel.inputs + kernel.outputs),
        looped=swept,
    )
    block_specs = {a.name: tiling.block_spec(a, sizes) for a in tiling.arrays}

    # A block mask that the blocks of three or more arrays share (not sliced along the swept
    # dimension), the first output's, is computed once.
    shared = axes(kernel.outputs[0])
    sharing = [
        d
        for d in (*kernel.inputs, *kernel.outputs)
        if swept not in d.dims and axes(d) == shared and (d in kernel.outputs or d.name in used_names(kernel))
    ]
    whole_mask = namer.claim("inside") if any(shared) and len(sharing) > 2 else None
    if whole_mask:
        shape = tuple_code([block_keyword(d) if d else "1" for d in shared])
        masks.append(f"{whole_mask} = rt.mask({shape}, {', '.join(inside[d] if d else 'None' for d in shared)})")

    def mask(decl) -> str | None:
        visible = axes(decl)
        if not any(visible):
            return None
        if whole_mask and decl in sharing:
            return whole_mask
        return tuple_code([inside[d] if d else "None" for d in visible])  # `inside` per axis

    # A kernel with products reads 0 past every input's end: a ragged block's positions
    # reach its dots as zeros (never as whatever memory holds: NaN times 0 is NaN).
    other = ", other=0" if fused.products else ""

    def load(decl: ir.ArrayDecl) -> str:
        if swept in decl.dims:
            indexer = ", ".join(
                f"pl.ds({sweep_start}, {block_keyword(swept)})" if d == swept else ":" for d in axes(decl)
            )
            return f"rt.load({refs[decl.name]}.at[{indexer}], {mask(decl)}{other})"
        return f"rt.load({refs[decl.name]}, {mask(decl)}{other})" if mask(decl) else f"{refs[decl.name]}[...]"

    def store(decl: ir.ArrayDecl, value: str) -> str:
        line = (
            f"rt.store({refs[decl.name]}, {value}, {mask(decl)})" if mask(decl) else f"{refs[decl.name]}[...] = {value}"
        )
        return saved_only(refs[decl.name], line) if decl.name in lowered.residual_names else line

    def emitter_for(overrides):
        return lowered.emitter(spelling=spelling, overrides=overrides)

    lowering = FusedLowering(lowered, namer, spelling, extents, Placement(), emitter_for, load, loads_fill_zeros=True)
    loop: list[str] = []
    if swept:
        code = lowering.swept(store, sweep_start, f"{sizes[swept]} % {block_keyword(swept)}")
        loop = _loop(code, namer, swept, sweep_start, sizes, inside)
        body = list(code.finish)
    else:
        body = list(lowering.whole(store).step)
    # Where this program's blocks start, for positions and skipped blocks.
    loop = tuple([*used_starts([*loop, *body], prologue), *loop]) if loop else ()
    body = body if loop else [*used_starts(body, prologue), *body]
    every = [*(sizes[d] for d in checked.dims), *(block_keyword(d) for d in [*tunable, *whole])]
    read, read_line = shape_reads(tiling, kernel.outputs[0].name, refs[kernel.outputs[0].name])
    every = [name for name in every if name not in read]
    keywords = mentioned([*every, *(p.name for p in kernel.params)], [*masks, *loop, *body])
    comments = {a.spec_name: a.comment for a in (*lowered.inputs, *lowered.outputs)}
    swaps = []
    for decl in kernel.inputs:
        if decl.name in swapped:
            read = (*decl.dims[:-2], decl.dims[-1], decl.dims[-2])
            comments[decl.name] += f", swapped to [{', '.join(read)}]"
            swaps.append(
                f"{values[decl.name]} = jnp.swapaxes({values[decl.name]}, -1, -2)  # {decl.dtype} wgmma reads K-major tiles only"
            )
    defaults = gpu_blocks(checked)
    # A program without products that holds whole rows takes its warps from their size where
    # the spec sets none (a kernel's products choose its warps).
    spec_warps = any(option.name == "warps" for option in kernel.gpu_options)
    held = whole and not spec_warps and not fused.products
    row_warps = " * ".join(block_keyword(d) for d in [*tunable, *whole]) if held else None
    return GpuPlan(
        function=launcher_name(kernel.name),
        kernel_function=kernel_function_name(kernel.name),
        blocks=tuple(
            GpuBlockPlan(
                gpu_block_keyword(d),
                block_keyword(d),
                defaults[d],
                sizes[d],
                d,
                max(SMALLEST_DOT_TILE, dot_depth(checked, d)) if checked.has_products else 1,
            )
            for d in tunable
        ),
        whole_blocks=tuple((block_keyword(d), sizes[d], d, dot_depth(checked, d)) for d in whole),
        options=tuple(
            (keyword, f"num_{name}", None if name == "warps" and row_warps else settings.options[name])
            for name, (keyword, _) in OPTIONS.items()
        ),
        row_warps=row_warps,
        prologue=(*swaps, *_dot_fit(checked, tunable, whole, swept)),
        **tuned_fields(checked, tunable),
        grid=tiling.grid_code(sizes),
        grid_comment=tuple(textwrap.wrap(_grid_comment(grid, fused, whole, swept), LINE_LENGTH - 16)),
        in_specs=tuple((comments[d.name], block_specs[d.name]) for d in kernel.inputs),
        out_specs=tuple(
            (comments[d.name], if_residuals(block_specs[d.name], o)) for d, o in zip(kernel.outputs, lowered.outputs)
        ),
        out_shapes=out_shapes(lowered),
        kernel_parameters=parameter_list([refs[d.name] for d in kernel.inputs + kernel.outputs], keywords),
        kernel_callable=partial_call(kernel_function_name(kernel.name), keywords),
        parameters=launcher_parameters(lowered, tunable),
        dispatch_arguments=dispatch_arguments(checked, sizes, tunable),
        masks=(*read_line, *masks),
        loop=comments_above(loop),
        body=comments_above(body),
        tiling=tiling,
    )


def _dot_fit(checked: CheckedKernel, tunable, whole, swept) -> tuple[str, ...]:
    """Where a kernel's one dot has an operand held whole along a dimension (its blocks
    grow with the call's size), the launcher's line that halves the other blocks until its
    operands fit shared memory (pipelined in `num_stages` copies where the program loops
    over the swept dimension) and its product its warps' registers (`rt.fit_dot_blocks`).
    Attention's two dots hold only the head's dimension whole, which their default blocks
    leave room for."""
    fused = checked.frame
    if len(fused.products) != 1:
        return ()
    (product,) = fused.products.values()
    operands = [fused.frame[x] for x in (product.lhs, product.rhs)]
    held = sorted({d for axes in operands for d in axes if d in whole})
    fitted = [d for d in tunable if any(d in axes for axes in operands)]
    if not held or not fitted:
        return ()
    names = ", ".join(block_keyword(d) for d in fitted)
    values = " + ".join(" * ".join(block_keyword(d) for d in axes if d) for axes in operands)
    size = promote(checked.types[product.lhs].dtype, checked.types[product.rhs].dtype).bits // 8
    values = f"{'num_stages * ' if swept else ''}{size} * ({values})"
    result = " * ".join(block_keyword(d) for d in fused.frame[product.node] if d)
    least = tuple_code([str(max(SMALLEST_DOT_TILE, dot_depth(checked, d))) for d in fitted])
    one = "," if len(fitted) == 1 else ""
    return (
        f"# The dot's operands (all of {', '.join(held)}) in shared memory, its product in registers: halved to fit.",
        f"{names}{one} = rt.fit_dot_blocks({checked.kernel.name!r}, ({names}{one}), {least},"
        f" lambda {names}: {values}, lambda {names}: {result}, num_warps)",
    )


def _loop(code, namer, dim, start, sizes, inside) -> list[str]:
    """The program's loop over the blocks of `dim`, carrying the running values; a block
    the skip condition rules out leaves them as they are."""
    index, function, step = namer.claim("index"), namer.claim("accumulate"), namer.claim("step")
    carried = ", ".join(r.name for r in code.running)  # a lone running value is carried bare
    initial = ", ".join(f"jnp.full({r.shape}, {r.initial}, {r.dtype})" for r in code.running)
    initial = f"({initial})" if len(code.running) > 1 else initial
    block = block_keyword(dim)
    # A lone running value the step reassigns needs no unpacking where no cond wraps the step.
    running = carried if len(code.running) == 1 and not code.skip else "running"
    unpack = [] if running == carried else [f"{carried} = running"]
    body = [
        f"def {function}({index}, {running}):",
        f"    {start} = {index} * {block}",
        f"    {inside[dim]} = rt.inside({start}, {block}, {sizes[dim]})",
    ]
    if code.skip:
        body += [
            "",
            f"    def {step}():",
            *(f"        {line}" for line in unpack),
            *(f"        {line}" for line in code.step),
            f"        return {carried}",
            "",
            "    # A block where the `where` on positions below is false everywhere adds nothing: skipped.",
            f"    return jax.lax.cond({code.skip}, {step}, lambda: running)",
        ]
    else:
        step_lines, last = list(code.step), f"return {carried}"
        if running == carried and step_lines[-1].startswith(f"{carried} = "):  # its new value, returned
            last = f"return {step_lines.pop().removeprefix(f'{carried} = ')}"
        body += [*(f"    {line}" for line in [*unpack, *step_lines, last])]
    return [
        *code.before,
        *body,
        "",
        f"{carried} = jax.lax.fori_loop(0, pl.cdiv({sizes[dim]}, {block}), {function}, {initial})",
    ]


def _grid_comment(grid, fused, whole, swept) -> str:
    steps = ", ".join(f"element of {d}" if d in fused.batch else f"block of {d}" for d in grid) or "call"
    held = f" Each holds all of {', '.join(whole)} (a power-of-two block)." if whole else ""
    loops = f" Each loops over {swept}'s blocks, carrying running values." if swept else ""
    return f"One program per {steps}; programs run concurrently.{held}{loops}"
