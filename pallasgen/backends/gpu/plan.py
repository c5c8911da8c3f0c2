"""The GPU (Triton) half of a kernel's plan.

Triton has no scratch memory and runs grid programs concurrently, so a reduction over
a blocked dimension loops over its blocks inside one program (products, planned as
carried state, are backends.gpu.fused's); every block is a power of two. Pallas's Triton backend does not mask a block that overhangs its array (a
BlockSpec is pointer arithmetic), so every load and store that can overhang is
masked here: `rt.inside` per dimension, None where the blocks tile it exactly.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import ArrayBlocks, BlockAxis, GridAxis, Tiling
from pallasgen.backends.gpu.options import OPTIONS, gpu_block_keyword, is_power_of_two
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import LoweredKernel, elementwise_body
from pallasgen.lowering.parts import (
    unpacked_results,
    WrittenSpecs,
    if_residuals,
    saved_only,
    LINE_LENGTH,
    array_positions,
    grid_names,
    body_statements,
    load_statements,
    parameter_list,
    used_names,
    partial_call,
    tuple_code,
)
from pallasgen.lowering.phases import indexed_dims, stepped_reductions, stepped_sweep
from pallasgen.lowering.reductions import KernelSpelling
from pallasgen.lowering.signature import Keyword, KeywordGroup

# gpu_block_*, gpu_warps, gpu_stages are documented by the runtime, from the public function's
# triton_options (rt.keyword_lines)
GPU_DOC: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuBlockPlan:
    keyword: str  # gpu_block_m, a keyword of the public function
    local: str  # block_m, inside the GPU function
    default: int
    size: str
    dim: str
    smallest: int  # the least tile Triton's dot takes along this dimension


# Triton's tl.dot takes tiles of at least 16 rows and columns, and a depth of at least
# 16, or 32 for 8-bit operands (the int8 tensor-core instruction's depth). Pallas emits
# Triton's dot without tl.dot's check of the depth: attention kernels whose dots had
# depth 4 and 1 compiled with XLA's Triton and gave wrong values on an H200 (issue 33).
SMALLEST_DOT_TILE = 16
SMALLEST_INT8_DOT_DEPTH = 32


@dataclass(frozen=True)
class GpuPlan(WrittenSpecs):
    function: str
    kernel_function: str
    blocks: tuple[GpuBlockPlan, ...]  # the tunable ones (squeezed batch dims are not)
    whole_blocks: tuple[tuple[str, str, str, int], ...]  # (local, size, dim, least block) of dimensions held whole
    options: tuple[tuple[str, str, int | None], ...]  # (public keyword, GPU function keyword, default)
    row_warps: str | None  # the values a program holds of whole rows, where they choose its warps
    prologue: tuple[str, ...]  # the launcher's lines before its pallas_call (operands swapped K-major, blocks fitted)
    tuned: tuple[tuple[str, dict], ...]  # (device kind, {sizes: blocks and options}) from tune --gpu
    dims: tuple[str, ...]  # the dimensions of the tuned entries' sizes, in their order
    grid: str
    grid_comment: tuple[str, ...]
    in_specs: tuple[tuple[str, str], ...]  # (comment, BlockSpec)
    out_specs: tuple[tuple[str, str], ...]
    out_shapes: tuple[tuple[str, str], ...]  # (jax.ShapeDtypeStruct, output name)
    kernel_parameters: str
    kernel_callable: str
    parameters: str  # of the GPU launcher
    dispatch_arguments: str  # the keywords the public function binds for the launcher
    masks: tuple[str, ...]  # the blocks read from the output's shape; which positions of them lie inside the arrays
    loop: tuple[str, ...]  # the loop over the swept dimension's blocks, ending with its running values' assignment
    body: tuple[str, ...]
    tiling: Tiling  # what grid, in_specs and out_specs are written from

    @property
    def options_table(self) -> str:
        """The `rt.GpuOptions` the public function chooses the launcher's blocks and
        options from: the spec's, and those tuned by GPU kind."""
        built_in = tuple_code([*(str(b.default) for b in self.blocks), *(str(o[2]) for o in self.options)])
        rows = [f"None: {built_in}", *(f"{kind!r}: {entries!r}" for kind, entries in self.tuned)]
        least = sorted({b.smallest for b in self.blocks})
        if len(least) > 1:
            least_code = f", least={tuple_code([str(b.smallest) for b in self.blocks])}"
        else:
            least_code = f", least={least[0]}" if least and least[0] > 1 else ""
        return f"rt.GpuOptions({{{', '.join(rows)}}}, {self.dims!r}{least_code})"


def out_shapes(lowered: LoweredKernel) -> tuple[tuple[str, str], ...]:
    """Each output's (jax.ShapeDtypeStruct, name), None for a residual not asked for."""
    return tuple(
        (if_residuals(f"jax.ShapeDtypeStruct({o.layout_shape}, {o.dtype})", o), o.spec_name) for o in lowered.outputs
    )


def keyword_group(checked: CheckedKernel) -> KeywordGroup:
    """The public `gpu_block_*`, `gpu_warps` and `gpu_stages` keywords: None by default,
    chosen at call time (`rt.gpu_options`)."""
    blocks = tuple(Keyword(gpu_block_keyword(d), "None") for d in tunable_gpu_dims(checked))
    options = tuple(Keyword(keyword, "None") for keyword, _ in OPTIONS.values())
    return KeywordGroup((*blocks, *options), GPU_DOC)


def tuned_fields(checked: CheckedKernel, tunable: list[str]) -> dict:
    """The GpuPlan fields of the call-time choice of blocks and options: the entries
    `pallasgen tune --gpu` recorded, by device kind, and the order of their sizes: the
    blocks' dimensions, then the others (`rt.triton_options` clamps each block by its
    dimension's size)."""
    dims = [*tunable, *(d for d in checked.dims if d not in tunable)]
    tuned: dict[str, dict] = {}
    for entry in sorted(checked.tuned_for("gpu"), key=lambda t: (t.chip, t.sizes)):
        at, blocks, options = dict(entry.sizes), dict(entry.blocks), dict(entry.options)
        key = tuple(at[d] for d in dims)
        tuned.setdefault(entry.chip, {})[key] = (*(blocks[d] for d in tunable), *(options[o] for o in OPTIONS))
    return {"tuned": tuple(tuned.items()), "dims": tuple(dims)}


def tuned_problem(checked: CheckedKernel, tunable: list[str], tuned) -> str | None:
    """Why a GPU entry of a tuning file does not fit this kernel, or None."""
    blocks, options = dict(tuned.blocks), dict(tuned.options)
    if sorted(blocks) != sorted(tunable):
        return f"GPU blocks for {', '.join(sorted(blocks)) or 'no dimension'}, but the kernel's GPU blocks are {', '.join(tunable) or 'none'}"
    if sorted(dict(tuned.sizes)) != sorted(checked.dims):
        return f"sizes of {', '.join(sorted(dict(tuned.sizes)))}, but the kernel's dimensions are {', '.join(checked.dims)}"
    for dim, block in blocks.items():
        if not is_power_of_two(block):
            return f"GPU block {dim}={block} is not a power of two"
    for name, (_, allowed) in OPTIONS.items():
        if options.get(name) not in allowed:
            return f"GPU option {name} is {options.get(name)!r}, not one of {', '.join(map(str, allowed))}"
    return None


def _squeezed(checked: CheckedKernel) -> set[str]:
    return set(checked.batch)


def tunable_gpu_dims(checked: CheckedKernel) -> list[str]:
    """Dimensions whose GPU blocks are keywords: all but squeezed batch dimensions and
    those held whole (reduced, unless blocked)."""
    squeezed, whole = _squeezed(checked), whole_dims(checked)
    return [d for d in checked.dims if d not in squeezed and d not in whole]


def whole_dims(checked: CheckedKernel) -> list[str]:
    """Reduced dimensions a program holds whole, in one block of the next power of two."""
    space = checked.space
    return [
        d.name
        for d in space.dims
        if d.reductions and d.name != space.contracted and not (d.reduced and d.name in checked.blocks)
    ]


def shape_reads(tiling: Tiling, array: str, ref: str) -> tuple[list[str], list[str]]:
    """The blocks a kernel reads from the shape of an array's block (`ref`), and the
    line that reads them (none: its block has no blocked axis)."""
    axes = next(a for a in tiling.arrays if a.name == array).axes
    names = [block_keyword(a.dim) if a.extent == "block" else "_" for a in axes if a.extent != "squeezed"]
    read = [name for name in names if name != "_"]
    return read, [f"{', '.join(names)}{',' if len(names) == 1 else ''} = {ref}.shape"] if read else []


def comments_above(lines, indent: int = 4) -> tuple[str, ...]:
    """A function body's lines (at `indent`), each comment after code that would not fit
    a line with it moved to a line of its own above the code (black would split the code)."""
    out = []
    for line in lines:
        code, _, comment = line.partition("  # ")
        if comment and indent + len(line) > LINE_LENGTH and "#" not in code and code.count('"') % 2 == 0:
            out += [f"{code[: len(code) - len(code.lstrip())]}# {comment}", code]
        else:
            out.append(line)
    return tuple(out)


def mentioned(names, lines) -> list[str]:
    """The `names` that `lines` (a kernel's code) read: the statics it takes."""
    words = set(re.findall(r"\w+", "\n".join(lines)))
    return [name for name in names if name in words]


def kernel_function_name(kernel: str) -> str:
    return f"_{kernel}_gpu_kernel"


def launcher_name(kernel: str) -> str:
    return f"_{kernel}_gpu"


def plan_gpu(lowered: LoweredKernel) -> GpuPlan:
    """The plan of a kernel without products (those are planned as carried state, by
    backends.gpu.fused): elementwise, or reducing over dimensions held whole or swept."""
    checked = lowered.checked
    namer, refs, sizes = lowered.namer.fork(), lowered.refs, lowered.sizes
    comments = {a.spec_name: a.comment for a in (*lowered.inputs, *lowered.outputs)}
    settings = checked.settings["gpu"]
    kernel = checked.kernel
    out_dims = checked.space.layout
    squeezed = _squeezed(checked)
    whole = whole_dims(checked)
    stepped = stepped_sweep(checked)
    looped = stepped.dim if stepped else None
    grid_dims = [d for d in out_dims if d not in whole and d != looped]
    index_names = grid_names(grid_dims)
    tunable = tunable_gpu_dims(checked)
    inside = {d: namer.claim(f"in_{d.lower()}") for d in [*tunable, *whole]}
    whole_mask = namer.claim("inside")

    def block_axis(dim: str | None, out_dim: str | None) -> BlockAxis:
        if out_dim in squeezed:  # one batch element per program; an array without it has size 1 there
            return BlockAxis(dim, "squeezed", index_names[out_dim] if dim else None)
        if dim is None:
            return BlockAxis(None, "one", None)
        if dim == looped:  # all of it: the program loops over its slices
            return BlockAxis(dim, "whole", None)
        return BlockAxis(dim, "block", None if dim in whole else index_names[dim])

    tiling = Tiling(
        grid=tuple(GridAxis(d, index_names[d], "parallel", d in squeezed) for d in grid_dims),
        arrays=tuple(
            ArrayBlocks(decl.name, tuple(block_axis(*p) for p in array_positions(decl, out_dims)))
            for decl in kernel.inputs + kernel.outputs
        ),
        looped=looped,
    )
    block_specs = {a.name: tiling.block_spec(a, sizes) for a in tiling.arrays}

    def visible(decl: ir.ArrayDecl) -> list[str | None]:
        """The axes of an array's block as the kernel sees it: a dimension, or None (size 1)."""
        return [dim for dim, out_dim in array_positions(decl, out_dims) if out_dim not in squeezed]

    def mask(axes: list[str | None], whole: bool = True) -> str | None:
        """The mask of a block with these axes (its `inside` per axis, or the output
        block's mask), or None if no axis can overhang."""
        if not any(axes):
            return None
        if whole and axes == visible(kernel.outputs[0]):
            return whole_mask
        return tuple_code([inside[d] if d else "None" for d in axes])

    def load(decl: ir.ArrayDecl) -> str:
        axes_mask = mask(visible(decl))
        return f"rt.load({refs[decl.name]}, {axes_mask})" if axes_mask else f"{refs[decl.name]}[...]"

    def store(decl: ir.ArrayDecl, value: str) -> str:
        axes_mask = mask(visible(decl))
        line = (
            f"rt.store({refs[decl.name]}, {value}, {axes_mask})" if axes_mask else f"{refs[decl.name]}[...] = {value}"
        )
        return saved_only(refs[decl.name], line) if decl.name in lowered.residual_names else line

    out_axes = visible(kernel.outputs[0])
    masks = [
        f"{inside[d]} = rt.inside(pl.program_id({grid_dims.index(d)}) * {block_keyword(d)}, {block_keyword(d)}, {sizes[d]})"
        for d in grid_dims
        if d not in squeezed
    ]
    masks += [f"{inside[d]} = rt.inside(0, {block_keyword(d)}, {sizes[d]})" for d in whole]
    out_shape = tuple_code([block_keyword(d) if d else "1" for d in out_axes])
    out_mask = mask(out_axes, whole=False)
    masks.append(f"{whole_mask} = {f'rt.mask({out_shape}, {out_mask[1:-1]})' if out_mask else None}")
    spelling = KernelSpelling(
        tuple(d for d in out_dims if d not in squeezed),
        sizes,
        extents={d: block_keyword(d) for d in out_dims},
        starts={
            d: f"pl.program_id({grid_dims.index(d)})" + ("" if d in squeezed else f" * {block_keyword(d)}")
            for d in grid_dims
        },
        padded=frozenset(whole),
        round_helper=True,
    )
    emitter = lowered.emitter(spelling=spelling)
    loop: list[str] = []
    if looped:
        loop, body = _reduction_loop(lowered, namer, looped, spelling, load, store, mask, visible, inside)
    else:
        body = elementwise_body(lowered, emitter, load, store)
    read, read_line = shape_reads(tiling, kernel.outputs[0].name, refs[kernel.outputs[0].name])
    kernel_keywords = [*(sizes[d] for d in tunable), *(block_keyword(d) for d in tunable)]
    kernel_keywords += [*(sizes[d] for d in whole), *(block_keyword(d) for d in whole)]
    kernel_keywords = [name for name in kernel_keywords if name not in read] + [p.name for p in kernel.params]
    # A program that holds whole rows takes its warps from their size where the spec sets none.
    spec_warps = any(option.name == "warps" for option in kernel.gpu_options)
    row_warps = " * ".join(block_keyword(d) for d in [*tunable, *whole]) if whole and not spec_warps else None
    return GpuPlan(
        function=launcher_name(kernel.name),
        kernel_function=kernel_function_name(kernel.name),
        blocks=tuple(
            GpuBlockPlan(gpu_block_keyword(d), block_keyword(d), settings.blocks[d], sizes[d], d, 1) for d in tunable
        ),
        whole_blocks=tuple((block_keyword(d), sizes[d], d, 1) for d in whole),
        options=tuple(
            (keyword, f"num_{name}", None if name == "warps" and row_warps else settings.options[name])
            for name, (keyword, _) in OPTIONS.items()
        ),
        row_warps=row_warps,
        prologue=(),
        **tuned_fields(checked, tunable),
        grid=tiling.grid_code(sizes),
        grid_comment=tuple(textwrap.wrap(_grid_comment(grid_dims, squeezed, whole, looped), LINE_LENGTH - 16)),
        in_specs=tuple((comments[d.name], block_specs[d.name]) for d in kernel.inputs),
        out_specs=tuple(
            (comments[d.name], if_residuals(block_specs[d.name], o)) for d, o in zip(kernel.outputs, lowered.outputs)
        ),
        out_shapes=out_shapes(lowered),
        kernel_parameters=parameter_list([refs[d.name] for d in kernel.inputs + kernel.outputs], kernel_keywords),
        kernel_callable=partial_call(kernel_function_name(kernel.name), kernel_keywords),
        parameters=launcher_parameters(lowered, tunable),
        dispatch_arguments=dispatch_arguments(checked, sizes, tunable),
        masks=(*read_line, *masks),
        loop=comments_above(loop),
        body=comments_above(body),
        tiling=tiling,
    )


def launcher_parameters(lowered: LoweredKernel, tunable) -> str:
    """The GPU launcher's parameters: the input arrays, then sizes, blocks, launch options,
    params, `residuals` where it has some, and `interpret` as keywords."""
    checked, kernel = lowered.checked, lowered.kernel
    return parameter_list(
        [lowered.values[d.name] for d in kernel.inputs],
        [lowered.sizes[d] for d in checked.dims]
        + [block_keyword(d) for d in tunable]
        + [f"num_{name}" for name in OPTIONS]
        + [p.name for p in kernel.params]
        + (["residuals"] if lowered.residuals else [])
        + ["interpret"],
    )


def dispatch_arguments(checked: CheckedKernel, sizes, tunable) -> str:
    """The keywords the public function binds for the GPU launcher."""
    return ", ".join(
        [f"{sizes[d]}={sizes[d]}" for d in checked.dims]
        + [f"{block_keyword(d)}={gpu_block_keyword(d)}" for d in tunable]
        + [f"num_{name}={keyword}" for name, (keyword, _) in OPTIONS.items()]
        + [f"{p.name}={p.name}" for p in checked.kernel.params]
    )


def _reduction_loop(lowered: LoweredKernel, namer, dim: str, spelling, load, store, mask, visible, inside):
    """Reductions over a blocked `dim`: the program loops over its blocks, carrying the
    running values. Returns the loop's lines and the body after it."""
    checked = lowered.checked
    kernel, values, refs, sizes = checked.kernel, lowered.values, lowered.refs, lowered.sizes
    layout = checked.space.layout
    block = block_keyword(dim)
    sweep = checked.sweep
    index, start, function = (namer.claim(n) for n in ("index", "start", "accumulate"))
    with_dim = {d.name for d in kernel.inputs if dim in d.dims}
    before = [d.name for d in kernel.inputs if d.name not in with_dim]
    outside = [s for s in sweep.step if dim not in checked.types[s.value].dims]
    inside_loop = [s for s in sweep.step if dim in checked.types[s.value].dims]
    spelling, held_starts = spelling.holding(indexed_dims([*(s.value for s in inside_loop), *sweep.reductions]), namer)
    spelling = spelling.starting(dim, start)
    emitter = lowered.emitter(spelling=spelling)

    def sliced_load(decl: ir.ArrayDecl) -> str:
        axes = visible(decl)
        indexer = ", ".join(f"pl.ds({start}, {block})" if d == dim else ":" for d in axes)
        return f"rt.load({refs[decl.name]}.at[{indexer}], {tuple_code([inside[d] if d else 'None' for d in axes])})"

    reductions = stepped_reductions(lowered, namer, sweep, emitter, start, block, in_refs=False)
    shape = tuple_code(["1" if d == dim else block_keyword(d) for d in layout])
    running = [acc.name for r in reductions for acc in r.accumulators]
    init = [f"jnp.full({shape}, {acc.initial}, {acc.dtype})" for r in reductions for acc in r.accumulators]
    step_lines = [line for r in reductions for line in r.step]
    carried = ", ".join(running)  # a lone running value is carried bare
    outer, finished = unpacked_results(running, [(r.result, r.finish) for r in reductions])
    lone = len(running) == 1
    step_lines, last = list(step_lines), f"return {carried}"
    if lone and step_lines[-1].startswith(f"{carried} = "):  # its new value, returned
        last = f"return {step_lines.pop().removeprefix(f'{carried} = ')}"
    loop = [
        *held_starts,
        *load_statements(kernel, values, checked, load, only=before),
        *body_statements(kernel, outside, emitter, values, refs, checked, store),
        f"def {function}({index}, {carried if lone else 'running'}):",
        *([] if lone else [f"    {carried} = running"]),
        f"    {start} = {index} * {block}",
        f"    {inside[dim]} = rt.inside({start}, {block}, {sizes[dim]})",
        *(
            f"    {values[d.name]} = {sliced_load(d)}"
            for d in kernel.inputs
            if d.name in with_dim and d.name in used_names(kernel)
        ),
        *(f"    {line}" for line in body_statements(kernel, inside_loop, emitter, values, refs, checked, store)),
        *(f"    {line}" for line in step_lines),
        f"    {last}",
        "",
        f"{outer.rstrip(',')} = jax.lax.fori_loop(0, pl.cdiv({sizes[dim]}, {block}), {function}, {init[0] if lone else tuple_code(init)})",
    ]
    last = lowered.emitter(spelling=spelling, overrides={r.node: r.result for r in reductions})
    body = list(finished)
    body += body_statements(kernel, sweep.finish, last, values, refs, checked, store)
    return loop, body


def _grid_comment(grid_dims: list[str], squeezed: set[str], whole=(), looped=None) -> str:
    steps = ", ".join(f"element of {d}" if d in squeezed else f"block of {d}" for d in grid_dims) or "call"
    held = f" Each holds all of {', '.join(whole)} (a power-of-two block)." if whole else ""
    loops = f" Each loops over {looped} itself, accumulating in order." if looped else ""
    return f"One program per {steps}; programs run concurrently.{held}{loops}"
