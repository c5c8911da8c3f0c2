"""Reductions over a dimension before the last two, on Mosaic GPU: whole tiles carried.

A kernel of rank 3 or more that reduces one dimension other than its last two (its
*plane*; `gqa_backward_over_r`: dk[B, G, T, D] = sum(dk_r[B, G, R, T, D], R)) runs one
program per block of the plane and element of the other kept dimensions. A TMA
pipeline (`plgpu.emit_pipeline`) steps through the reduced dimension one element at a
time (its block dimension squeezed), and each reduction's running value is a tile of
the block, merged position by position (`Reducer.merge`: sums, maxima, minima, means).
Once it is done, one more pipeline step computes the outputs from them (and from the
inputs without the reduced dimension) and copies them out.

Ragged edges: the plane is padded with zeros to whole blocks as in an elementwise kernel
(its positions past the end are computed and sliced off); the reduced dimension is
stepped element by element, so nothing of it is padded.
"""

from __future__ import annotations

from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.mosaic_gpu.support import (
    EMITTER_OPTIONS,
    layout_of,
    kernel_call,
    program_lines,
    reductions,
    sized_dims,
    spec_list,
)
from pallasgen.frontend import ir
from pallasgen.lowering.parts import assigned_together, tuple_code
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.lowering.reductions import compute_dtype, finish_code, identity

ROWS = 64  # the WGMMA layout's row tile: a block's rows
PIPELINE_STAGES = 2  # elements of the reduced dimension in flight


class _Spelling:
    """size() in a block (index() is refused: support.refusal), round() as jnp's."""

    def __init__(self, sizes: dict[str, str]):
        self.sizes = sizes

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"


class OuterPlanner:
    """The plan of a kernel that reduces a dimension before its last two (see the module)."""

    def __init__(self, planner, columns: int):
        self.base = planner  # the shared _Planner: names, padding, the launcher
        self.kernel, self.checked, self.lowered = planner.kernel, planner.checked, planner.lowered
        self.namer, self.sizes, self.values, self.refs = planner.namer, planner.sizes, planner.values, planner.refs
        self.columns = columns
        self.reductions = reductions(self.kernel)
        self.reduced = self.reductions[0].args[1].id  # support.refusal: one dimension for all

    def plan(self):
        kernel, base, sizes, reduced = self.kernel, self.base, self.sizes, self.reduced
        layout = base.out_dims = tuple(self.checked.space.layout)
        plane = layout[-2:]
        outer = [d for d in layout[:-2] if d != reduced]
        program = {d: self.namer.claim(f"program_{d.lower()}") for d in (*outer, *plane)}
        shape = tuple_code([block_keyword(d) for d in plane])
        blocks = {plane[0]: ROWS, plane[1]: self.columns}
        multiples = {plane[0]: "8", plane[1]: block_keyword(plane[1])}
        swept = [d for d in kernel.inputs if reduced in d.dims]
        rest = [d for d in kernel.inputs if reduced not in d.dims]
        smem = base.smem
        reduce_step, write_step, carry = (self.namer.claim(x) for x in ("reduce", "write", "carry"))
        running = {n: self.namer.claim(f"{n.func}_running") for n in self.reductions}
        results = {
            n: self.namer.claim(f"{n.func}_{reduced.lower()}", f"{n.func}_over_{reduced.lower()}")
            for n in self.reductions
        }

        def own(decl):
            return [d for d in layout_of(decl, layout, None) if d]

        def ref_at(decl) -> str:
            index = [program[d] for d in own(decl) if d in outer]
            return f"{self.refs[decl.name]}.at[{', '.join(index)}]" if index else self.refs[decl.name]

        def spec(decl, stepped: bool) -> str:
            dims = [d for d in own(decl) if d in plane or (stepped and d == reduced)]
            block = tuple_code(["None" if d == reduced else block_keyword(d) for d in dims])
            index = tuple_code(["s" if d == reduced else program[d] for d in dims])
            if len([d for d in dims if d in plane]) == 2:  # its last axis is the plane's second
                return f"rt.mgpu_spec({block}, lambda s: {index}, {jnp_dtype(decl.dtype)})"
            return f"plgpu.BlockSpec({block}, lambda s: {index})"

        def loads(decls) -> list[str]:
            pairs = []
            for decl in decls:
                positions = tuple_code([str(plane.index(d)) for d in own(decl) if d in plane])
                pairs.append((self.values[decl.name], f"rt.mgpu_load({smem[decl.name]}, {shape}, {positions})"))
            return assigned_together(pairs)

        emitter = Emitter(self.lowered.names, self.checked.types, {}, spelling=_Spelling(sizes), **EMITTER_OPTIONS)
        names, initial, update = list(running.values()), [], []
        for node in self.reductions:
            kind, dtype = node.func, emitter.kernel_dtype(node.args[0])
            computed = compute_dtype(kind, dtype)
            initial.append(
                f"plgpu.layout_cast(jnp.full({shape}, {identity(kind, dtype)}, {jnp_dtype(computed.name)}), plgpu.Layout.WGMMA)"
            )
            value = emitter.cast(node.args[0], computed.name)
            update.append(f"{running[node]} = {FUNCTIONS[kind].reducer.merge.format(running[node], value)}")
        carried = tuple_code(names)
        body = [
            *program_lines({d: program[d] for d in (*outer, *plane)}),
            "",
            f"def {reduce_step}(_, {', '.join([*(smem[d.name] for d in swept), carry])}):",
            f"    {carried} = {carry}",
            *(f"    {line}" for line in loads(swept)),
            *(f"    {line}" for line in update),
            f"    return {carried}",
            "",
            f"{carried} = plgpu.emit_pipeline(",
            f"    {reduce_step},",
            f"    grid=({sizes[reduced]},),",
            f"    in_specs={spec_list(spec(d, True) for d in swept)},",
            f"    max_concurrent_steps={PIPELINE_STAGES},",
            f"    init_carry={tuple_code(initial)},",
            f")({', '.join(ref_at(d) for d in swept)})",
        ]
        for node in self.reductions:
            dtype = emitter.kernel_dtype(node.args[0])
            body.append(f"{results[node]} = {finish_code(node.func, [running[node]], dtype, sizes[reduced])}")
        finished = Emitter(
            self.lowered.names, self.checked.types, dict(results), spelling=_Spelling(sizes), **EMITTER_OPTIONS
        )
        outs = {o.name: o for o in kernel.outputs}
        write = [
            f"{smem[s.target]}[...] = {finished.cast(s.value, outs[s.target].dtype)}"
            for s in kernel.body
            if isinstance(s, ir.Assign)
        ]
        body += [
            "",
            f"def {write_step}(_, {', '.join(smem[d.name] for d in (*rest, *kernel.outputs))}):",
            *(f"    {line}" for line in loads(rest)),
            *(f"    {line}" for line in write),
            "",
            "plgpu.emit_pipeline(",
            f"    {write_step},",
            "    grid=(1,),",
            f"    in_specs={spec_list(spec(d, False) for d in rest)},",
            f"    out_specs={spec_list(spec(d, False) for d in kernel.outputs)},",
            f")({', '.join(ref_at(d) for d in (*rest, *kernel.outputs))})",
        ]
        sized = [sizes[d] for d in layout if d in sized_dims(kernel) or d == reduced]
        keywords = [block_keyword(d) for d in plane] + sized + [p.name for p in kernel.params]
        reshapes = []
        for decl in kernel.inputs:
            dims, value = own(decl), self.values[decl.name]
            if len(dims) < len(layout):  # laid out with size-1 axes by the public function
                reshapes.append(f"{value} = {value}.reshape({tuple_code([sizes[d] for d in dims])})")
            reshapes.append(base.padding(value, dims, multiples))
        grid = [sizes[d] if d in outer else f"pl.cdiv({base.padded(d)}, {block_keyword(d)})" for d in (*outer, *plane)]
        call = kernel_call(
            f"functools.partial({base.kernel_function}, {', '.join(f'{k}={k}' for k in keywords)})",
            base.out_types(multiples),
            dict(zip((*outer, *plane), grid)),
            [self.values[d.name] for d in kernel.inputs],
        )
        refs = [self.refs[d.name] for d in (*kernel.inputs, *kernel.outputs)]
        return base.finish((refs, [], keywords), body, base.launcher(blocks, multiples, reshapes, call))
