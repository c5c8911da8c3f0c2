"""The Mosaic GPU half of a kernel's plan: `plgpu.kernel` over a grid of blocks.

Each program copies its blocks between global and shared memory by TMA
(`plgpu.emit_pipeline`) and computes on them in registers, in the WGMMA layout for
2-D blocks (vectors are loaded in its row or column layout and broadcast). A
product accumulates `plgpu.wgmma` over its K blocks in a pipeline, then applies the
epilogue to the accumulator and stores through shared memory. A kernel that reduces
its rows (or columns) sweeps their blocks in passes (`sweeps`); a rank-1 kernel that
reduces to scalars writes partial results per program, combined by its launcher
(`totals`). A fused kernel of one product runs as kernels in turn (`stages`).

Ragged edges are exact by padding: TMA needs every global stride but the last to be
a multiple of 16 bytes and each swizzled dimension a multiple of its tile, and a block
contiguous in its array (a vector's) is stored by one bulk copy, cut at the array's
end, whose bytes must be a multiple of 16. So the launcher pads the arrays with zeros
(a block of columns, 8 rows; a vector and a product's M, N and K to whole blocks: zeros
add nothing to a sum of products) and slices the outputs back. Sizes that are already
multiples pad nothing. Blocks past the padded edge are clipped by TMA. A reduction's
padded positions hold its identity (`sweeps`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.gpu.plan import comments_above
from pallasgen.backends.mosaic_gpu import choices
from pallasgen.backends.mosaic_gpu.fused import FusedPlanner
from pallasgen.backends.mosaic_gpu.sweeps import SweepPlanner, column_block
from pallasgen.backends.mosaic_gpu.totals import TotalsPlanner
from pallasgen.backends.mosaic_gpu.outer import PIPELINE_STAGES as OUTER_STAGES, OuterPlanner
from pallasgen.backends.mosaic_gpu.stages import chained_body, stages
from pallasgen.backends.mosaic_gpu.support import (
    EMITTER_OPTIONS,
    layout_of,
    SMEM_BUDGET,
    compact,
    copy_out,
    kernel_call,
    program_lines,
    spec_list,
    refusal,
    sized_dims,
)
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import LoweredKernel, elementwise_body, lower_kernel
from pallasgen.lowering.parts import (
    LINE_LENGTH,
    body_statements,
    if_residuals,
    load_statements,
    kernel_signature,
    parameter_list,
    read_where_used,
    saved_only,
    tuple_code,
)
from pallasgen.lowering.pyexpr import jnp_dtype
from pallasgen.lowering.signature import Keyword, KeywordGroup

BACKEND_KEYWORD = "gpu_backend"

TMA_MOST = 256  # elements a TMA copy takes along one dimension
ELEMENTWISE_ROWS = 64  # the WGMMA layout's row tile
ELEMENTWISE_COLUMNS = (128, 64, 32)  # the widest that fits SMEM_BUDGET is taken


@dataclass(frozen=True)
class MosaicGpuPlan:
    refused: tuple[str, ...]  # comment lines: why Mosaic GPU does not take the kernel (none: it does)
    function: str
    kernel_function: str
    kernel_parameters: str
    kernel_body: tuple[str, ...]
    parameters: str  # of the launcher
    launcher_body: tuple[str, ...]
    dispatch: str  # the launcher bound for the public function, or None
    stages: tuple[MosaicGpuPlan, ...] = ()  # kernels it calls in turn (stages: one fused product)
    table: tuple[str, ...] = ()  # a stage's product: its module-level table of tuned blocks and stages
    options_table: str = ""  # a product's: the `rt.GpuOptions` its public function chooses from
    on_hopper: bool = False  # the GPU kernel a call that names none runs from sm_90 on (`faster_on_hopper`)


def keyword_group(checked: CheckedKernel, with_triton: bool = True, residuals: bool = True) -> KeywordGroup:
    """The public `gpu_backend` keyword: which Pallas backend compiles for NVIDIA GPUs
    (only `with_triton`, in a module that has Triton kernels too); and a product's
    `mgpu_block_*` and `mgpu_stages` (`choices`): None by default, chosen at call time.
    Not `residuals`: it takes the kernel, but not the kernel that writes its residuals."""
    reason = refusal(checked)
    doc = []  # what gpu_backend means is documented by the runtime (rt.keyword_lines)
    if reason:
        said = (
            f"This kernel runs on Triton either way: {reason}."
            if with_triton
            else f"This kernel has no GPU kernel (the module has no Triton kernels): {reason}."
        )
        doc += textwrap.wrap(said, LINE_LENGTH - 12, initial_indent="  ", subsequent_indent="    ")
    elif not residuals:
        why = (
            refusal(checked.gradient.saving)
            or "its nested reductions, written as residuals too, are not planned in stages"
        )
        said = f"Under jax.grad it runs on Triton, which writes its residuals: {why}."
        doc += textwrap.wrap(said, LINE_LENGTH - 12, initial_indent="  ", subsequent_indent="    ")
    # a product's choices are documented by the runtime, from its public function's mosaic_gpu_options
    tunable = tuple(Keyword(k, "None") for k in choices.keywords(checked)) if choices.tunable(checked) else ()
    chooser = (Keyword(BACKEND_KEYWORD, "None"),) if with_triton else ()  # None: `faster_on_hopper` chooses
    return KeywordGroup((*chooser, *tunable), tuple(doc))


def faster_on_hopper(checked: CheckedKernel) -> bool:
    """Whether a call that names no `gpu_backend` runs Mosaic GPU's kernel from sm_90 on:
    a kernel with a matrix product (a product, batched too, attention, their backward
    kernels) ran faster on it than on Triton on an H200, and a row-wise one slower
    (benchmarks/RESULTS.md)."""
    return checked.has_products


def kernel_function_name(kernel: str) -> str:
    return f"_{kernel}_mosaic_gpu_kernel"


def launcher_name(kernel: str) -> str:
    return f"_{kernel}_mosaic_gpu"


def plan_mosaic_gpu(lowered: LoweredKernel, with_triton: bool = True, stage: bool = False) -> MosaicGpuPlan:
    """Its plan of a kernel; a kernel it does not take runs on Triton (`with_triton`: the
    module has Triton kernels), else on no GPU. A `stage` (of a kernel run as kernels in
    turn) chooses its own blocks: no public function calls its launcher."""
    checked = lowered.checked
    name = checked.kernel.name
    reason = refusal(checked)
    if reason:
        instead = "it runs on Triton" if with_triton else "without the triton target, it has no GPU kernel"
        refused = f"`{name}` has no Mosaic GPU kernel ({reason}): {instead}."
        comment = tuple(textwrap.wrap(refused, LINE_LENGTH - 14, initial_indent="# ", subsequent_indent="# "))
        return MosaicGpuPlan(comment, launcher_name(name), kernel_function_name(name), "", (), "", (), "None")
    if stages(checked):  # a fused kernel of one product, or nested reductions: kernels in turn
        return _plan_stages(lowered)
    if checked.framed:
        return FusedPlanner(_Planner(lowered)).plan()
    if checked.product:
        return _ProductPlanner(lowered).plan(stage)
    if len(checked.space.layout) == 1 and any(d.reductions for d in checked.space.dims):
        return TotalsPlanner(_Planner(lowered)).plan()
    if len(checked.space.layout) > 2 and any(d.reductions for d in checked.space.dims):
        return OuterPlanner(_Planner(lowered), _outer_columns(checked)).plan()
    if any(d.reductions for d in checked.space.dims):
        columns = checked.space.layout[-1]
        return SweepPlanner(_Planner(lowered)).plan(column_block(checked.kernel, columns))
    return _ElementwisePlanner(lowered).plan()


def _plan_stages(lowered: LoweredKernel) -> MosaicGpuPlan:
    """A fused kernel of one product as kernels in turn (`stages`), each planned as any."""
    chain = stages(lowered.checked)
    own = {*lowered.values.values(), *lowered.sizes.values(), *lowered.refs.values()}
    taken = lowered.namer.taken - own  # the module's names: a stage's launcher is a function of its own
    subs = [lower_kernel(s.checked, taken, public=False) for s in chain]
    plans = [plan_mosaic_gpu(sub, stage=True) for sub in subs]
    kernel, sizes = lowered.kernel, lowered.sizes
    params = [p.name for p in kernel.params]
    bound = [f"{sizes[d]}={sizes[d]}" for d in lowered.checked.dims] + [f"{p}={p}" for p in params]
    return MosaicGpuPlan(
        (),
        launcher_name(kernel.name),
        "",
        "",
        (),
        parameter_list(
            [lowered.values[d.name] for d in kernel.inputs],
            [sizes[d] for d in lowered.checked.dims]
            + params
            + (["residuals"] if lowered.residuals else [])
            + ["interpret"],
        ),
        chained_body(lowered, [(s, sub, p.function) for s, sub, p in zip(chain, subs, plans)]),
        f"functools.partial({launcher_name(kernel.name)}, {', '.join(bound)})",
        tuple(plans),
    )


def _outer_columns(checked: CheckedKernel) -> int:
    """The widest block of columns whose blocks fit SMEM_BUDGET in a kernel that reduces a
    dimension before its last two (`outer`): those of the inputs with it in flight, and
    one of each other array."""
    reduced = {d.name for d in checked.space.dims if d.reductions}
    arrays = checked.kernel.inputs + checked.kernel.outputs
    row_bytes = sum(DTYPES[d.dtype].bits // 8 * (OUTER_STAGES if reduced & set(d.dims) else 1) for d in arrays)
    fits = (c for c in ELEMENTWISE_COLUMNS if ELEMENTWISE_ROWS * c * row_bytes <= SMEM_BUDGET)
    return next(fits, ELEMENTWISE_COLUMNS[-1])


class _Planner:
    """What both kinds of kernel share: names, the launcher's padding and slicing."""

    def __init__(self, lowered: LoweredKernel):
        self.lowered, self.checked = lowered, lowered.checked
        self.kernel = self.checked.kernel
        self.kernel_function = kernel_function_name(self.kernel.name)
        self.namer = lowered.namer.fork()
        self.sizes, self.values, self.refs = lowered.sizes, lowered.values, lowered.refs
        self.smem = {d.name: self.namer.claim(f"{d.name}_smem") for d in self.kernel.inputs + self.kernel.outputs}
        self._padded = {d: self.namer.claim(f"padded_{self.sizes[d]}") for d in self.checked.dims}

    def padded(self, dim: str) -> str:
        """The launcher's name for a dimension's size padded to what TMA copies."""
        return self._padded[dim]

    def launcher(self, blocks: dict[str, int], multiples: dict[str, str], reshapes: list[str], kernel_call: list[str]):
        """The launcher's body: blocks, padded sizes, operands padded, the kernel, outputs
        sliced, a residual's only when asked (`residuals`; None otherwise)."""
        kernel, sizes = self.kernel, self.sizes
        lines = compact([f"{block_keyword(d)} = {b}" for d, b in blocks.items()])
        lines += compact(
            [*(f"{self.padded(d)} = {sizes[d]} + -{sizes[d]} % {m}" for d, m in multiples.items()), *reshapes]
        )
        outs = [self.values[o.name] for o in kernel.outputs]
        lines += [f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {kernel_call[0]}", *kernel_call[1:]]
        cropped = []
        for out, plan in zip(kernel.outputs, self.lowered.outputs):
            crop = f"{self.values[out.name]}[{', '.join(f':{sizes[d]}' for d in out.dims)}]"
            crop = crop if len(out.dims) == len(self.out_dims) else f"{crop}.reshape({plan.layout_shape})"
            cropped.append(f"({if_residuals(crop, plan)})" if plan.residual else crop)
        lines.append(f"return {', '.join(cropped)}")
        return tuple(lines)

    def padding(self, value: str, dims, multiples: dict[str, str]) -> str:
        return f"{value} = rt.mgpu_pad({value}, {tuple_code([self.padded(d) if d in multiples else self.sizes[d] for d in dims])})"

    def out_types(self, padded_dims, optional=False) -> str:
        """The kernel's `out_type`: each output's shape, padded along `padded_dims`;
        `optional`: a residual's only when the launcher's `residuals` asks (None otherwise:
        the kernel copies out to its Ref only where it is not None, `copy_out`)."""
        types = []
        for out, plan in zip(self.kernel.outputs, self.lowered.outputs):
            shape = tuple_code([self.padded(d) if d in padded_dims else self.sizes[d] for d in out.dims])
            shape = f"jax.ShapeDtypeStruct({shape}, {jnp_dtype(out.dtype)})"
            types.append(if_residuals(shape, plan) if optional else shape)
        return f"({', '.join(types)},)"

    def finish(self, signature, kernel_body, launcher_body, chosen=None, table=(), options_table="") -> MosaicGpuPlan:
        """The plan; `signature`: the kernel's refs, scratch refs and keywords; `chosen`: the
        launcher's keyword for each public one it takes, None by default where it chooses
        them itself (`table`), as a stage does."""
        kernel, checked = self.kernel, self.checked
        kernel_parameters, unpacked = kernel_signature(*signature)
        params = [p.name for p in kernel.params]
        chosen = chosen or {}
        launcher = parameter_list(
            [self.values[d.name] for d in kernel.inputs],
            [self.sizes[d] for d in checked.dims]
            + params
            + [f"{c}=None" if table else c for c in chosen.values()]
            + (["residuals"] if self.lowered.residuals else [])
            + ["interpret"],
        )
        bound = [f"{self.sizes[d]}={self.sizes[d]}" for d in checked.dims] + [f"{p}={p}" for p in params]
        bound += [f"{local}={keyword}" for keyword, local in chosen.items()]
        return MosaicGpuPlan(
            (),
            launcher_name(kernel.name),
            kernel_function_name(kernel.name),
            kernel_parameters,
            comments_above((*unpacked, *kernel_body)),
            launcher,
            launcher_body,
            f"functools.partial({launcher_name(kernel.name)}, {', '.join(bound)})",
            table=table,
            options_table=options_table,
        )


class _ElementwisePlanner(_Planner):
    """One program per block; each block's pipeline copies in its inputs, computes and copies out.
    Dimensions before the last two (batch) take one element per program: its refs there."""

    def plan(self) -> MosaicGpuPlan:
        kernel, sizes = self.kernel, self.sizes
        layout = self.out_dims = tuple(self.checked.space.layout)
        arrays = kernel.inputs + kernel.outputs
        batch, plane = layout[:-2], layout[-2:]
        minor = layout[-1]
        columns = self._columns(arrays) if len(layout) >= 2 else TMA_MOST
        blocks = {minor: columns} if len(layout) == 1 else {plane[0]: ELEMENTWISE_ROWS, minor: columns}
        multiples = {minor: block_keyword(minor)} if len(layout) == 1 else {plane[0]: "8", minor: block_keyword(minor)}
        program = {d: self.namer.claim(f"program_{d.lower()}") for d in layout}
        step = self.namer.claim("step")

        def own_dims(decl: ir.ArrayDecl) -> list[str]:
            return [d for d in layout_of(decl, layout, None) if d]

        def plane_dims(decl: ir.ArrayDecl) -> list[str]:
            return [d for d in own_dims(decl) if d in plane]

        def at_batch(decl: ir.ArrayDecl) -> str:
            index = [program[d] for d in own_dims(decl) if d in batch]
            return f"{self.refs[decl.name]}.at[{', '.join(index)}]" if index else self.refs[decl.name]

        def spec(decl: ir.ArrayDecl) -> str:
            dims = plane_dims(decl)
            shape = tuple_code([block_keyword(d) for d in dims])
            index = tuple_code([program[d] for d in dims])
            if len(dims) == 2:  # its last axis is the minor one
                return f"rt.mgpu_spec({shape}, lambda _: {index}, {jnp_dtype(decl.dtype)})"
            return f"plgpu.BlockSpec({shape}, lambda _: {index})"

        def load(decl: ir.ArrayDecl) -> str:
            if len(layout) == 1:
                return f"{self.smem[decl.name]}[...]"
            positions = tuple_code([str(plane.index(d)) for d in plane_dims(decl)])
            return f"rt.mgpu_load({self.smem[decl.name]}, {shape}, {positions})"

        def store(decl: ir.ArrayDecl, value: str) -> str:
            return f"{self.smem[decl.name]}[...] = {value}"

        shape = tuple_code([block_keyword(d) for d in plane])
        spelling = _BlockSpelling(
            self.sizes, {d: (f"{program[d]} * {block_keyword(d)}", shape, plane.index(d)) for d in plane}
        )
        emitter = self.lowered.emitter(spelling=spelling, **EMITTER_OPTIONS)
        # A vector assigned to an output is loaded broadcast already: the block's shape.
        body = elementwise_body(self.lowered, emitter, load, store, lambda _: shape)
        refs = [self.refs[d.name] for d in arrays]
        kernel_body = [
            *program_lines({d: program[d] for d in layout}),
            "",
            f"def {step}(_, {', '.join(self.smem[d.name] for d in arrays)}):",
            *(f"    {line}" for line in body),
            "",
            "plgpu.emit_pipeline(",
            f"    {step},",
            "    grid=(1,),",
            f"    in_specs={spec_list(spec(d) for d in kernel.inputs)},",
            f"    out_specs={spec_list(spec(d) for d in kernel.outputs)},",
            f")({', '.join(at_batch(d) for d in arrays)})",
        ]
        sized = [sizes[d] for d in layout if d in sized_dims(kernel)]
        keywords = [block_keyword(d) for d in plane] + sized + [p.name for p in kernel.params]
        reshapes = []
        for decl in kernel.inputs:
            dims, value = own_dims(decl), self.values[decl.name]
            if len(dims) < len(layout):  # laid out with size-1 axes by the public function
                reshapes.append(f"{value} = {value}.reshape({tuple_code([sizes[d] for d in dims])})")
            if multiples:
                reshapes.append(self.padding(value, dims, multiples))
        grid = [
            sizes[d] if d in batch else f"pl.cdiv({self.padded(d) if multiples else sizes[d]}, {block_keyword(d)})"
            for d in layout
        ]
        bound = ", ".join(f"{k}={k}" for k in keywords)
        call = kernel_call(
            f"functools.partial({kernel_function_name(kernel.name)}, {bound})",
            self.out_types(multiples),
            dict(zip(layout, grid)),
            [self.values[d.name] for d in kernel.inputs],
        )
        return self.finish((refs, [], keywords), kernel_body, self.launcher(blocks, multiples, reshapes, call))

    def _columns(self, arrays) -> int:
        """The widest block of columns whose blocks of every array fit SMEM_BUDGET."""
        row_bytes = sum(DTYPES[d.dtype].bits // 8 for d in arrays)
        return next(
            (c for c in ELEMENTWISE_COLUMNS if ELEMENTWISE_ROWS * c * row_bytes <= SMEM_BUDGET), ELEMENTWISE_COLUMNS[-1]
        )


class _BlockSpelling:
    """index() and size() in an elementwise kernel's block: `blocks` gives each
    dimension's (start, block shape, axis); round() as jnp's."""

    def __init__(self, sizes: dict[str, str], blocks: dict[str, tuple[str, str, int]]):
        self.sizes, self.blocks = sizes, blocks

    def positions(self, dim: str) -> str:
        start, shape, axis = self.blocks[dim]
        return f"rt.mgpu_positions({start}, {shape}, {axis})"

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"


class _ProductPlanner(_Planner):
    """One program per output block: a pipeline of K blocks into `plgpu.wgmma`, then the
    epilogue on the accumulator, stored through shared memory."""

    def plan(self, stage: bool) -> MosaicGpuPlan:
        kernel, checked, sizes, product = self.kernel, self.checked, self.sizes, self.checked.product
        layout = self.out_dims = tuple(kernel.outputs[0].dims)
        batch = layout[:-2]
        m, n, k = product.m, product.n, product.k
        multiples = {d: block_keyword(d) for d in (m, n, k)}
        rhs_n_major = choices.rhs_n_major(product)
        accumulator = self.namer.claim("acc", "product")
        program = {d: self.namer.claim(f"program_{d.lower()}") for d in layout}
        acc_ref, out_smem, barrier, step, scope, tiles_scope, pipeline_stages = (
            self.namer.claim(x)
            for x in (
                f"{accumulator}_ref",
                "out_smem",
                "barrier",
                "step",
                "accumulate",
                "epilogue",
                "stages",
            )
        )
        lhs, rhs = product.lhs, product.rhs
        lhs_smem, rhs_smem = self.smem[lhs.name], self.smem[rhs.name]
        epilogue = [d for d in kernel.inputs if d.name not in (lhs.name, rhs.name)]
        # Each output's tile in shared memory, copied out once the epilogue is done.
        tiles = {o.name: out_smem if not number else self.smem[o.name] for number, o in enumerate(kernel.outputs)}

        def at_batch(ref: str) -> str:
            return f"{ref}.at[{', '.join(program[d] for d in batch)}]" if batch else ref

        def tile(dims) -> str:
            return ", ".join(f"pl.ds({program[d]} * {block_keyword(d)}, {block_keyword(d)})" for d in dims)

        rhs_dims = (n, k) if rhs_n_major else (k, n)
        rhs_tile = f"{rhs_smem}.T" if rhs_n_major else rhs_smem
        specs = [
            f"rt.mgpu_spec(({block_keyword(m)}, {block_keyword(k)}), lambda s: ({program[m]}, s), {jnp_dtype(lhs.dtype.name)})",
            f"rt.mgpu_spec(({block_keyword(rhs_dims[0])}, {block_keyword(rhs_dims[1])}), "
            f"lambda s: {'(' + program[n] + ', s)' if rhs_n_major else '(s, ' + program[n] + ')'}, "
            f"{jnp_dtype(rhs.dtype.name)})",
        ]
        own = {d.name: [x for x in layout_of(d, layout, product) if x] for d in epilogue}
        loads = []
        for number, decl in enumerate(epilogue):
            loads.append(
                f"rt.mgpu_copy_in({self.refs[decl.name]}.at[{tile(own[decl.name])}], {self.smem[decl.name]}, {barrier}.at[{number}])"
            )
        tile_shape = tuple_code([block_keyword(m), block_keyword(n)])

        def load(decl: ir.ArrayDecl) -> str:
            positions = tuple_code([str((m, n).index(d)) for d in own[decl.name]])
            return f"rt.mgpu_load({self.smem[decl.name]}, {tile_shape}, {positions})"

        residuals = {self.refs[o.spec_name] for o in self.lowered.residuals}

        def store(decl: ir.ArrayDecl, value: str) -> str:
            line, ref = f"{tiles[decl.name]}[...] = {value}", self.refs[decl.name]
            return saved_only(ref, line) if ref in residuals else line

        emitter = self.lowered.emitter(overrides={product.node: accumulator}, **EMITTER_OPTIONS)
        epilogue_body = read_where_used(
            [
                f"{accumulator} = {acc_ref}[...]",
                *load_statements(kernel, self.values, checked, load),
                *body_statements(kernel, kernel.body, emitter, self.values, self.refs, checked, store),
            ]
        )
        refs = [self.refs[d.name] for d in kernel.inputs + kernel.outputs]
        copies = copy_out(
            [
                (
                    self.refs[o.name],
                    tiles[o.name],
                    f"{self.refs[o.name]}.at[{', '.join([*(program[d] for d in batch), tile((m, n))])}]",
                )
                for o in kernel.outputs
            ],
            residuals,
        )
        # A residual's tile only where the launcher passed its Ref: it is None otherwise.
        tile_types = [
            f"rt.mgpu_smem({tile_shape}, {jnp_dtype(o.dtype)})"
            + (f" if {self.refs[o.name]} is not None else None" if self.refs[o.name] in residuals else "")
            for o in kernel.outputs
        ]
        accumulate = [
            f"def {step}(_, {lhs_smem}, {rhs_smem}):",
            f"    plgpu.wgmma({acc_ref}, {lhs_smem}, {rhs_tile})",
            "    plgpu.wgmma_wait(0)",
            "",
            "plgpu.emit_pipeline(",
            f"    {step},",
            f"    grid=({self.refs[lhs.name]}.shape[-1] // {block_keyword(k)},),",
            f"    in_specs={spec_list(specs)},",
            f"    max_concurrent_steps={pipeline_stages},",
            f")({at_batch(self.refs[lhs.name])}, {at_batch(self.refs[rhs.name])})",
            *loads,
            "",
            f"def {tiles_scope}({', '.join(tiles.values())}):  # the outputs' tiles, where the pipeline's K blocks were",
            *(f"    {line}" for line in [*epilogue_body, *copies]),
            "",
            f"pl.run_scoped({tiles_scope}, {', '.join(tile_types)})",
        ]
        kernel_body = [
            *program_lines({d: program[d] for d in layout}),
            "",
            f"def {scope}({acc_ref}):  # the accumulator in registers, for this block's K steps and epilogue",
            *(f"    {line}" for line in accumulate),
            "",
            f"pl.run_scoped({scope}, plgpu.ACC({tile_shape}, {jnp_dtype(product.accumulator.name)}))",
        ]
        scratch = [
            f"plgpu.Barrier(num_barriers={max(1, len(epilogue))})",
            *(
                f"{'rt.mgpu_smem' if len(own[d.name]) == 2 else 'plgpu.SMEM'}"
                f"({tuple_code([block_keyword(x) for x in own[d.name]])}, {jnp_dtype(d.dtype)})"
                for d in epilogue
            ),
        ]
        signature = (
            refs,
            [barrier, *(self.smem[d.name] for d in epilogue)],
            [*(block_keyword(d) for d in (m, n, k)), pipeline_stages, *(p.name for p in kernel.params)],
        )
        reshapes = []
        lhs_value, rhs_value = self.values[lhs.name], self.values[rhs.name]
        if lhs.transposed:
            reshapes.append(f"{lhs_value} = jnp.swapaxes({lhs_value}, -1, -2)  # wgmma reads [M, K] tiles")
        if rhs_n_major and not rhs.transposed:
            reshapes.append(
                f"{rhs_value} = jnp.swapaxes({rhs_value}, -1, -2)  # {product.lhs.dtype.name} wgmma reads [N, K] tiles"
            )
        reshapes.append(self.padding(lhs_value, (*batch, m, k), multiples))
        reshapes.append(self.padding(rhs_value, (*batch, *rhs_dims), multiples))
        for decl in epilogue:
            value = self.values[decl.name]
            if len(own[decl.name]) < len(layout):
                reshapes.append(f"{value} = {value}.reshape({tuple_code([sizes[d] for d in own[decl.name]])})")
            reshapes.append(self.padding(value, own[decl.name], multiples))
        keywords = [*(block_keyword(d) for d in (m, n, k)), pipeline_stages, *(p.name for p in kernel.params)]
        grid = [*(sizes[d] for d in batch), *(f"{self.padded(d)} // {block_keyword(d)}" for d in (m, n))]
        call = kernel_call(
            f"functools.partial({kernel_function_name(kernel.name)}, {', '.join(f'{x}={x}' for x in keywords)})",
            self.out_types((m, n), optional=True),
            dict(zip(layout, grid)),
            [self.values[d.name] for d in kernel.inputs],
            scratch=spec_list(scratch),
        )
        chosen = {
            keyword: pipeline_stages if what == choices.STAGES else block_keyword(what)
            for keyword, what in choices.keywords(checked).items()
        }
        launcher = (*self.choose(chosen, stage), *self.launcher({}, multiples, reshapes, call))
        if stage:
            table = (f"{self.table_name} = {self.choices_table()}",)
            return self.finish(signature, kernel_body, launcher, chosen, table)
        return self.finish(signature, kernel_body, launcher, chosen, options_table=self.choices_table())

    def choices_table(self) -> str:
        """The kernel's `rt.GpuOptions` of blocks and stages by device kind (`rt.gpu_options`
        reads it): the built-in ones, and those `pallasgen tune --gpu` recorded."""
        checked, what = self.checked, choices.keywords(self.checked)
        built_in = choices.defaults(checked) | {choices.STAGES: choices.DEFAULT_STAGES}
        tuned: dict[str, dict] = {}
        for entry in sorted(checked.tuned_for("mosaic_gpu"), key=lambda t: (t.chip, t.sizes)):
            values = dict(entry.blocks) | dict(entry.options)
            key = tuple(dict(entry.sizes)[d] for d in checked.dims)
            tuned.setdefault(entry.chip, {})[key] = tuple_code([str(values[w]) for w in what.values()])
        rows = [f"None: {tuple_code([str(built_in[w]) for w in what.values()])}"]
        for kind, entries in tuned.items():
            inner = ", ".join(f"{tuple_code(list(map(str, at)))}: {values}" for at, values in entries.items())
            rows.append(f"{kind!r}: {{{inner}}}")
        return f"rt.GpuOptions({{{', '.join(rows)}}}, {tuple(checked.dims)!r})"

    @property
    def table_name(self) -> str:
        return f"_{self.kernel.name}_mosaic_gpu_options"

    def choose(self, chosen: dict[str, str], stage: bool) -> list[str]:
        """The launcher's first lines: a stage's blocks and stages from its table, then
        each checked (`rt.mgpu_check_choices`)."""
        checked, product = self.checked, self.checked.product
        names = ", ".join(chosen.values())
        blocks = choices.block_choices(checked)
        smem = self.namer.claim("smem_bytes")
        bytes_code = choices.smem_code(
            checked, {d: block_keyword(d) for d in blocks}, chosen[choices.PREFIX + choices.STAGES]
        )
        table = f"{self.table_name}.table, {tuple_code([self.sizes[d] for d in checked.dims])}"
        return [
            *([f"{names} = rt.gpu_options({table}, ({names}))"] if stage else []),
            f"{smem} = {bytes_code}",
            f"rt.mgpu_check_choices({self.kernel.name!r}, {' '.join(blocks)!r}, ({names}), {blocks[product.k]!r}, {smem})",
        ]
