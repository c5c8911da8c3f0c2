"""The TPU (Mosaic) plan of a kernel, as plain data: grid, BlockSpecs, dimension
semantics, the accumulator in scratch memory, and the kernel body.

Templates only loop and branch over these plans; every decision is made here.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES, tpu_dtype
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import block_keyword
from pallasgen.analysis.product import Product
from pallasgen.backends.base import ArrayBlocks, BlockAxis, GridAxis, Tiling
from pallasgen.backends.tpu.chips import CHIPS, chip_blocks
from pallasgen.backends.tpu.tiling import (
    TilingRule,
    accumulates_elementwise,
    holds_rows,
    array_layouts,
    format_bytes,
    Vmem,
    tiling_rule,
    vmem,
    vmem_terms,
)
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import (
    array_positions,
    dot_code,
    grid_names,
    body_statements,
    kernel_statements,
    load_statements,
    parameter_list,
    partial_call,
    ref_load,
    ref_store,
    tuple_code,
)
from pallasgen.lowering.phases import indexed_dims, reduces, stepped_reductions, stepped_sweep
from pallasgen.lowering.pyexpr import jnp_dtype
from pallasgen.lowering.reductions import KernelSpelling
from pallasgen.lowering.signature import Keyword, KeywordGroup

COMMENT_WIDTH = 84


@dataclass(frozen=True)
class BlockPlan:
    keyword: str  # block_m
    default: int
    size: str  # the size variable it is clamped to: m
    dim: str


@dataclass(frozen=True)
class AccumulatorPlan:
    """Scratch accumulators over the steps of a blocked reduced dimension: a product's
    contracted one, or one that reductions remove."""

    scratch: tuple[tuple[str, str], ...]  # (comment, pltpu.VMEM(...))
    step: str  # the variable holding the reduced dimension's grid index
    axis: int
    init_function: str
    init: tuple[str, ...]  # at the first step: the accumulators set to their identities
    body: tuple[str, ...]  # each step: load, mask a ragged edge, accumulate
    finish_function: str  # at the last step: the kernel body, on the accumulated values
    skip: str | None = None  # a block where this is false adds nothing: its step is skipped
    strips: StripsPlan | None = None  # a step computed in strips of its rows


@dataclass(frozen=True)
class StripsPlan:
    """A step of a kernel that skips blocks, computed in strips of its block's rows (see
    the `rt.strips` helper): one function of a strip, called on views of the refs."""

    function: str  # the strip's function: the step's body, its refs and positions a strip's
    parameters: str
    call: str  # its call for the strip ((row, rows), (col, cols)) of the block
    whole_call: str  # its call for the whole block
    blocks: str  # the block's (rows, cols)
    whole: str  # a block where the skip's condition holds at every position
    keywords: tuple[str, str]  # the kernel's keywords: the strips of a whole block, of a partial one
    choice: str  # the launcher's line that computes them
    vmem_limit_mib: int  # the scoped VMEM limit it asks for


@dataclass(frozen=True)
class BlockTable:
    """The blocks a call that passes none takes, by chip (see `rt.tpu_blocks`)."""

    name: str  # the module-level dict
    comment: tuple[str, ...]
    chips: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (chip, ((sizes or "default", blocks), ...))
    choice: str  # the launcher's line that picks its blocks from the table


@dataclass(frozen=True)
class TpuPlan:
    function: str  # the launcher
    kernel_function: str
    blocks: tuple[BlockPlan, ...]
    block_table: BlockTable | None  # None when no dimension has a block keyword
    kernel_parameters: str  # of the kernel function: refs, then static keywords
    kernel_callable: str  # the kernel, with its static keywords bound by functools.partial
    parameters: str  # of the launcher
    binding: str  # the keywords the public function binds for the launcher
    tiling_checks: tuple[str, ...]  # call-time blocks checked against Mosaic's tiling rule
    conversions: tuple[str, ...]  # f16 inputs converted to f32 for the TPU kernel
    returns: str  # f16 outputs converted back from f32; empty when there are none
    grid: str
    grid_comment: tuple[str, ...]  # comment lines
    in_specs: tuple[tuple[str, str], ...]  # (comment, BlockSpec)
    out_specs: tuple[tuple[str, str], ...]
    out_shapes: tuple[tuple[str, str], ...]  # (jax.ShapeDtypeStruct, output name)
    dimension_semantics: tuple[str, ...]
    vmem_comment: tuple[str, ...]
    vmem_needed: str  # the blocks' VMEM in bytes, as code over the call-time blocks and sizes
    cost_estimate: str
    accumulator: AccumulatorPlan | None
    body: tuple[str, ...]  # the kernel body, or its last step when it accumulates
    tiling: Tiling  # what grid, in_specs, out_specs and dimension_semantics are written from
    vmem: Vmem  # what vmem_comment and vmem_needed count
    prologue: tuple[str, ...] = ()  # first, outside any pl.when: where this step's blocks start


def tunable_dims(checked: CheckedKernel) -> list[str]:
    """The blocked dimensions whose blocks are keywords, of any kernel (fused or not): all
    but its batch dimensions, which take one element per step and vanish from its tiles."""
    return [d for d in checked.dims if d in checked.blocks and d not in checked.batch]


def grows_blocks(checked: CheckedKernel) -> bool:
    """Whether a call with no `block_*` grows the chip's default blocks to large steps
    (`rt.grown`): a kernel without a matrix product that has blocks to grow."""
    return checked.product is None and bool(tunable_dims(checked))


def keyword_group(checked: CheckedKernel) -> KeywordGroup:
    """The public `block_*` keywords, and their lines of the docstring."""
    table = block_table_name(checked.kernel.name)
    return block_keywords(
        checked,
        tunable_dims(checked),
        lambda defaults: (
            f"    are tuned for the TPU and sizes, or the TPU's defaults ({table}),",
            f"    {'grown to large steps (rt.grown), ' if grows_blocks(checked) else ''}else {defaults}.",
        ),
    )


def block_keywords(checked: CheckedKernel, tunable, chosen) -> KeywordGroup:
    """The public keywords `block_*` of the `tunable` dimensions, and their docstring:
    `chosen(defaults)` gives the lines that say how a block not given is chosen."""
    keywords = tuple(Keyword(block_keyword(d), "None") for d in tunable)
    if not tunable:
        return KeywordGroup(keywords, ())
    names = ", ".join(block_keyword(d) for d in tunable)
    defaults = ", ".join(str(checked.blocks[d]) for d in tunable)
    first = f"  {names}: TPU block sizes; a block never exceeds its dimension. Those not given"
    return KeywordGroup(keywords, (first, *chosen(defaults)))


def block_table_name(kernel: str) -> str:
    return f"_{kernel}_tpu_blocks"


def _block_table(
    checked: CheckedKernel, tunable: list[str], sizes: dict[str, str], block_of: dict[str, str], vmem_needed: str
) -> BlockTable | None:
    """Each chip's default blocks, then the blocks tuned for it at given sizes; a kernel
    without a product also passes its blocks' bounds and a step's size (see `rt.tpu_blocks`)."""
    if not tunable:
        return None
    dims = checked.dims
    spec = tuple_code([str(checked.blocks[d]) for d in tunable])
    chips = [("None", (('"default"', spec),))]
    for chip in CHIPS:
        default = chip_blocks(checked, tunable, chip)
        entries = [('"default"', tuple_code([str(default[d]) for d in tunable]))]
        for tuned in sorted((t for t in checked.tuned_for("tpu") if t.chip == chip.name), key=lambda t: t.sizes):
            tuned_sizes, tuned_blocks = dict(tuned.sizes), dict(tuned.blocks)
            entries.append(
                (tuple_code([str(tuned_sizes[d]) for d in dims]), tuple_code([str(tuned_blocks[d]) for d in tunable]))
            )
        chips.append((f'"{chip.name}"', tuple(entries)))
    keywords = tuple_code([block_keyword(d) for d in tunable])
    comment = (
        f"TPU blocks {keywords} for a call that passes none, by chip: those `pallasgen tune` found"
        f" at the sizes {tuple_code(list(dims))} shown (the spec's .tuning.json file), the entry nearest"
        f" the call's sizes winning; else the chip's default. None: any other chip, and CPU (the spec's blocks)."
    )
    name = block_table_name(checked.kernel.name)
    arguments = [name, tuple_code([sizes[d] for d in dims]), keywords]
    if grows_blocks(checked):
        elements = " * ".join(block_of[d] for d in dims)
        step = f"lambda {', '.join(block_keyword(d) for d in tunable)}: ({elements}, {vmem_needed})"
        arguments.append(
            f"grow=functools.partial(rt.grown, bounds={tuple_code([sizes[d] for d in tunable])}, step={step})"
        )
    choice = f"{keywords} = rt.tpu_blocks({', '.join(arguments)})"
    return BlockTable(name, _wrap(comment), tuple(chips), choice)


def _squeezed(checked: CheckedKernel) -> set[str]:
    return set(checked.batch)


def kernel_function_name(kernel: str) -> str:
    return f"_{kernel}_kernel"


def launcher_name(kernel: str) -> str:
    return f"_{kernel}_tpu"


def plan_tpu(lowered: LoweredKernel) -> TpuPlan:
    checked = lowered.checked
    kernel, dims, product = checked.kernel, checked.dims, checked.product
    values, sizes, refs = lowered.values, lowered.sizes, lowered.refs
    namer = lowered.namer.fork()
    out_dims = checked.space.layout
    reducing = stepped_sweep(checked)
    stepped = reducing.dim if reducing else None
    # Parallel axes first; a blocked reduced dimension is the last, its steps in order.
    blocked = [d for d in dims if d in checked.blocks and d != stepped] + ([stepped] if stepped else [])
    squeezed = _squeezed(checked)
    tunable = tunable_dims(checked)
    index_names = grid_names(blocked, product)
    block_of = {d: block_keyword(d) if d in checked.blocks else sizes[d] for d in dims}

    def block_axis(dim: str | None, out_dim: str | None) -> BlockAxis:
        if out_dim in squeezed:  # one batch element per step; an array without it has size 1 there
            return BlockAxis(dim, "squeezed", index_names[out_dim] if dim else None)
        if dim is None:
            return BlockAxis(None, "one", None)
        return BlockAxis(dim, "block" if dim in checked.blocks else "whole", index_names.get(dim))

    accumulated = {checked.sweep.dim} if checked.sweep else set()  # its steps accumulate in order
    tiling = Tiling(
        grid=tuple(
            GridAxis(d, index_names[d], "arbitrary" if d in accumulated else "parallel", d in squeezed) for d in blocked
        ),
        arrays=tuple(
            ArrayBlocks(decl.name, tuple(block_axis(*p) for p in array_positions(decl, out_dims, product)))
            for decl in kernel.inputs + kernel.outputs
        ),
        looped=None,
    )
    block_specs = {a.name: tiling.block_spec(a, sizes) for a in tiling.arrays}

    accumulator_name = lowered.accumulator
    spelling, held_starts = KernelSpelling(
        tuple(d for d in out_dims if d not in squeezed),
        sizes,
        extents=block_of,
        starts={d: _block_start(d, blocked, squeezed) for d in blocked},
    ).holding(_last_step_positions(checked), namer)
    body = kernel_statements(
        kernel, lowered.emitter(tpu=True, spelling=spelling), values, refs, checked, ref_load(refs), ref_store(refs)
    )
    kernel_keywords = _kernel_keywords(checked, sizes, tunable)
    accumulator = None
    scratch_refs = []
    if stepped:
        accumulator, scratch_refs, body = _stepped(lowered, namer, stepped, blocked, block_of, spelling)
    if product is not None:
        k_blocked = product.k in checked.blocks
        step = namer.claim("step") if k_blocked else ""
        product_lines = _product_lines(product, values, refs, sizes, block_keyword(product.k), step, k_blocked)
        if k_blocked:
            acc_ref = namer.claim(f"{accumulator_name}_ref")
            scratch = (
                f"pltpu.VMEM(({block_of[product.m]}, {block_of[product.n]}), {jnp_dtype(product.accumulator.name)})"
            )
            accumulator = AccumulatorPlan(
                scratch=(
                    (f"{acc_ref}: the {product.accumulator.name} sum over {product.k} of one output tile", scratch),
                ),
                step=step,
                axis=len(blocked) - 1,
                init_function="_zero",
                init=(f"{acc_ref}[...] = jnp.zeros_like({acc_ref})",),
                body=tuple(product_lines[:-1] + [f"{acc_ref}[...] += {product_lines[-1]}"]),
                finish_function="_epilogue",
            )
            body = [f"{accumulator_name} = {acc_ref}[...]", *body]
            scratch_refs = [acc_ref]
        else:
            body = [*product_lines[:-1], f"{accumulator_name} = {product_lines[-1]}", *body]

    if held_starts:
        accumulator = replace(accumulator, body=(*held_starts, *accumulator.body))

    layouts = array_layouts(kernel, checked.space.layout, product)
    inputs = [values[d.name] for d in kernel.inputs]
    vmem_needed = _vmem_needed(kernel, checked.blocks, product, block_of, squeezed)
    semantics = tuple(g.semantics for g in tiling.grid)
    return TpuPlan(
        function=launcher_name(kernel.name),
        kernel_function=kernel_function_name(kernel.name),
        blocks=tuple(BlockPlan(block_keyword(d), checked.blocks[d], sizes[d], d) for d in tunable),
        block_table=_block_table(checked, tunable, sizes, block_of, vmem_needed),
        kernel_parameters=parameter_list(
            [refs[d.name] for d in kernel.inputs + kernel.outputs] + scratch_refs, kernel_keywords
        ),
        kernel_callable=partial_call(kernel_function_name(kernel.name), kernel_keywords),
        parameters=parameter_list(
            inputs,
            [sizes[d] for d in dims]
            + [block_keyword(d) for d in tunable]
            + [p.name for p in kernel.params]
            + ["interpret"],
        ),
        binding=", ".join(
            [f"{sizes[d]}={sizes[d]}" for d in dims]
            + [f"{block_keyword(d)}={block_keyword(d)}" for d in tunable]
            + [f"{p.name}={p.name}" for p in kernel.params]
        ),
        tiling_checks=tiling_check(kernel.name, [rule for d in tunable if (rule := tiling_rule(d, layouts))], sizes),
        conversions=tuple(
            f"{a.name} = {a.name}.astype(jnp.float32)  # f16 has no TPU vectors: computed as f32 (one more pass over {a.name})"
            for a in lowered.inputs
            if a.spec_dtype != tpu_dtype(a.spec_dtype)
        ),
        returns=_tpu_return(lowered),
        grid=tiling.grid_code(sizes),
        grid_comment=_wrap(grid_comment(blocked, dims, squeezed, semantics)),
        in_specs=tuple((a.comment, block_specs[a.spec_name]) for a in lowered.inputs),
        out_specs=tuple((a.comment, block_specs[a.spec_name]) for a in lowered.outputs),
        out_shapes=tuple(
            (f"jax.ShapeDtypeStruct({o.layout_shape}, {jnp_dtype(tpu_dtype(o.spec_dtype))})", o.spec_name)
            for o in lowered.outputs
        ),
        dimension_semantics=semantics,
        vmem_comment=_wrap(vmem_comment(vmem(kernel, checked.blocks, product), checked.blocks, dims)),
        vmem_needed=vmem_needed,
        cost_estimate=_cost_estimate(checked, values, sizes),
        accumulator=accumulator,
        body=tuple(body),
        tiling=tiling,
        vmem=vmem(kernel, checked.blocks, product),
    )


def _block_start(dim: str, blocked: list[str], squeezed: set[str]) -> str:
    """The first position of this step's block of `dim` (its one position, if squeezed)."""
    step = f"pl.program_id({blocked.index(dim)})"
    return step if dim in squeezed else f"{step} * {block_keyword(dim)}"


def _last_step_positions(checked: CheckedKernel) -> set[str]:
    """The dimensions whose positions only the last step of an accumulating kernel reads,
    under pl.when: those read by what waits for its carries (not by the carried values)."""
    sweep = checked.sweep
    if sweep is None:
        return set()
    return indexed_dims([s.value for s in sweep.finish], computed=sweep.reductions)


def _kernel_keywords(checked: CheckedKernel, sizes, tunable: list[str]) -> list[str]:
    """The kernel function's static keywords: the sizes and blocks its body reads (all
    of them where it reduces or reads positions with index(); else those of a blocked
    contracted dimension, which its steps mask at a ragged edge), then the params."""
    product = checked.product
    if reduces(checked):
        read = list(checked.dims)
    elif product is not None and product.k in checked.blocks:
        read = [product.k]
    else:
        read = []
    blocks = [block_keyword(d) for d in tunable if d in read]
    return [*(sizes[d] for d in read), *blocks, *(p.name for p in checked.kernel.params)]


def _stepped(lowered: LoweredKernel, namer, dim: str, blocked, block_of, spelling):
    """Reductions over a blocked `dim`, one block per step into scratch accumulators:
    the accumulator plan, its scratch refs, and the body of the last step."""
    checked = lowered.checked
    kernel, values, refs = checked.kernel, lowered.values, lowered.refs
    sweep = checked.sweep
    step = namer.claim("step")
    emitter = lowered.emitter(tpu=True, spelling=spelling)
    elementwise, rows = accumulates_elementwise(kernel, dim), holds_rows(kernel, dim)
    reductions = stepped_reductions(
        lowered, namer, sweep, emitter, f"{step} * {block_keyword(dim)}", block_keyword(dim), True, elementwise, rows
    )
    if rows:
        shape = f"rt.rows_shape({block_of[dim]})"
    else:
        shape = tuple_code([block_of[d] if elementwise or d != dim else "1" for d in checked.space.layout])
    accs = [(r.node.func, acc) for r in reductions for acc in r.accumulators]
    lines = load_statements(kernel, values, checked, _rows_load(refs) if rows else ref_load(refs))
    lines += body_statements(kernel, sweep.step, emitter, values, refs, checked, ref_store(refs))
    lines += [line for r in reductions for line in r.step]
    last = lowered.emitter(tpu=True, spelling=spelling, overrides={r.node: r.result for r in reductions})
    body = [f"{r.result} = {r.finish}" for r in reductions]
    body += body_statements(kernel, sweep.finish, last, values, refs, checked, ref_store(refs))
    plan = AccumulatorPlan(
        scratch=tuple(
            (
                f"{acc.name}: the running {kind} over {dim}"
                + (" at each position of a block (reduced at the last step)" if elementwise else " of one block"),
                f"pltpu.VMEM({shape}, {acc.dtype})",
            )
            for kind, acc in accs
        ),
        step=step,
        axis=blocked.index(dim),
        init_function="_init",
        init=tuple(f"{acc.name}[...] = jnp.full({acc.name}.shape, {acc.initial}, {acc.dtype})" for _, acc in accs),
        body=tuple(lines),
        finish_function="_finish",
    )
    return plan, [acc.name for _, acc in accs], body


def _rows_load(refs):
    """Loads of a kernel whose only dimension is held as rows (`holds_rows`): a block of
    it as `rt.as_rows` holds it, a scalar as it is."""
    plain = ref_load(refs)
    return lambda decl: f"rt.as_rows({plain(decl)})" if decl.dims else plain(decl)


def tiling_check(kernel: str, rules: list[TilingRule], sizes) -> tuple[str, ...]:
    """The generated call-time check of the blocks against their tiling rules."""
    if not rules:
        return ()
    items = []
    for rule in rules:
        fields = [block_keyword(rule.dim), sizes[rule.dim], str(rule.multiple), repr(rule.describe())]
        fields += [str(rule.smallest_power_of_two)] if rule.smallest_power_of_two else []
        items.append(f"{block_keyword(rule.dim)}=({', '.join(fields)})")
    return (f"rt.check_tiling({repr(kernel)}, {', '.join(items)})",)


def _tpu_return(lowered: LoweredKernel) -> str:
    """What the TPU launcher returns when f16 outputs come back as f32; empty if none do."""
    outputs = lowered.outputs
    if all(o.spec_dtype == tpu_dtype(o.spec_dtype) for o in outputs):
        return ""
    return ", ".join(
        o.name if o.spec_dtype == tpu_dtype(o.spec_dtype) else f"{o.name}.astype({o.dtype})" for o in outputs
    )


def _product_lines(product: Product, values, refs, sizes, block_k: str, step: str, k_blocked: bool) -> list[str]:
    """Load both operands, mask a ragged contracted edge, and the product expression (last)."""
    lhs, rhs = (values[o.name] for o in product.operands)
    dtype = tpu_dtype(product.lhs.dtype.name)  # both operands have it
    packed = DTYPES[dtype].bits < 32
    lines = [f"{lhs}, {rhs} = {refs[product.lhs.name]}[...], {refs[product.rhs.name]}[...]"]
    if k_blocked:
        k = sizes[product.k]
        lines.append(
            f"if {k} % {block_k}:  # a ragged {product.k}: zero both operands past its end, so padding never reaches the sum"
        )
        if packed:
            lines.append(f"    # Selected in 32 bits: Mosaic cannot select {dtype} blocks of fewer than 5 rows.")
        lhs_axis = 0 if product.lhs.transposed else 1
        rhs_axis = 1 if product.rhs.transposed else 0
        for value, axis in ((lhs, lhs_axis), (rhs, rhs_axis)):
            inside = f"{step} * {block_k} + jax.lax.broadcasted_iota(jnp.int32, {value}.shape, {axis}) < {k}"
            if packed:
                wide = "jnp.float32" if DTYPES[dtype].is_float else "jnp.int32"
                lines.append(f"    {value} = jnp.where({inside}, {value}.astype({wide}), 0).astype({jnp_dtype(dtype)})")
            else:
                lines.append(f"    {value} = jnp.where({inside}, {value}, 0)")
    dot = dot_code(product, lhs, rhs)
    if product.rhs.transposed and not product.lhs.transposed:
        # x @ y.T with a one-row y: Pallas lowers it as a vector product, which fails for all
        # but f32, and an f32 result of one column fails to broadcast over its epilogue.
        accumulate = jnp_dtype(product.accumulator.name)
        lines.append(f"# Where {product.n} is 1, Mosaic cannot lower this product (or its epilogue): multiply and sum.")
        vector = f"jnp.sum({lhs}.astype({accumulate}) * {rhs}.astype({accumulate}), axis=1, keepdims=True)"
        dot = f"({vector} if {rhs}.shape[0] == 1 else {dot})"
    return [*lines, dot]


def _cost_estimate(checked: CheckedKernel, values, sizes) -> str:
    """Flops, transcendentals and bytes, so that XLA schedules around the kernel sensibly."""
    kernel, product = checked.kernel, checked.product
    elements = " * ".join(sizes[d] for d in checked.space.layout)
    nodes = list(ir.walk(*(s.value for s in kernel.body)))
    transcendental = sum(isinstance(n, ir.Call) and FUNCTIONS[n.func].transcendental for n in nodes)
    elementwise = sum(isinstance(n, (ir.Binary, ir.Unary, ir.Call)) for n in nodes) - transcendental
    if product is not None:
        flops = " + ".join([f"2 * {elements} * {sizes[product.k]}", *_times(elementwise - 1, elements)])
    else:
        flops = " + ".join(_times(elementwise, elements)) or "0"
    inputs = ", ".join(values[d.name] for d in kernel.inputs)
    outputs = " + ".join(f"{elements} * {DTYPES[d.dtype].bytes}" for d in kernel.outputs)
    return (
        f"pl.CostEstimate(flops={flops}, transcendentals={''.join(_times(transcendental, elements)) or '0'},"
        f" bytes_accessed=rt.nbytes({inputs}) + {outputs})"
    )


def _times(count: int, elements: str) -> list[str]:
    """`count * elements` as code, or nothing when count is 0."""
    return [] if count <= 0 else [elements] if count == 1 else [f"{count} * {elements}"]


def grid_comment(blocked, dims, squeezed: set[str], semantics: tuple[str, ...]) -> str:
    """What the grid's axes are, and how they run: as `semantics`, each axis's dimension semantics."""
    if not blocked:
        return "A single step: every dimension is taken whole."
    steps = ", ".join(f"element of {d}" if d in squeezed else f"block of {d}" for d in blocked)
    whole = [d for d in dims if d not in blocked]
    taken = f" ({', '.join(whole)} taken whole)" if whole else ""
    ordered = [d for d, kind in zip(blocked, semantics) if kind == "arbitrary"]
    if not ordered:
        return f"One step per {steps}{taken}; steps are independent, so every axis is parallel."
    independent = [d for d, kind in zip(blocked, semantics) if kind == "parallel"]
    clauses = [f"steps along {', '.join(independent)} are independent (parallel)"] if independent else []
    clauses.append(f"steps along {', '.join(ordered)} accumulate in order (arbitrary)")
    sentence = "; ".join(clauses)
    return f"One step per {steps}{taken}. {sentence[0].upper()}{sentence[1:]}."


def vmem_comment(needed: Vmem, blocks: dict[str, int], dims) -> str:
    """The VMEM at the default blocks, and every part of it."""
    whole = [d for d in dims if d not in blocks]
    per = f" per unit of {' x '.join(whole)}" if whole else ""
    return f"VMEM at the default blocks{per}: {format_bytes(needed.total(blocks))} = {needed.formula(blocks)}."


def _vmem_needed(kernel: ir.Kernel, blocks: dict[str, int], product, block_of, squeezed) -> str:
    """`vmem_bytes` as code: the call-time blocks (or sizes, for dimensions taken whole)
    in place of the defaults; a squeezed batch dimension is one element."""
    terms = []
    for count, term_dims in vmem_terms(kernel, blocks, product):
        factors = [block_of[d] for d in term_dims if d not in squeezed]
        terms.append(" * ".join([str(count), *factors]))
    return " + ".join(terms)


def _wrap(text: str) -> tuple[str, ...]:
    return tuple(textwrap.wrap(text, COMMENT_WIDTH))
