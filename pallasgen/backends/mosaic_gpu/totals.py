"""Reductions of a rank-1 kernel to scalars on Mosaic GPU: partial results per program,
combined by the launcher.

The launcher pads each [N] input with zeros to whole blocks of ROWS x `columns`
elements and lays it out as rows of `columns`; a program per block computes each
reduction's argument in registers (WGMMA layout), reduces every row of it and copies
those ROWS partial results out. The launcher reduces the partials (sum, max or min:
reductions that merge one running value, `Reducer.merge`), finishes each reduction
(mean: / N) and computes the outputs from them. argmax and argmin write each row's best
value and its first position (the launcher takes the position of the first best row),
logsumexp each row's max and sum of exp(x - max) (the launcher takes the logsumexp of
max + log(sum)). Positions past N hold the reduction's identity.
"""

from __future__ import annotations

from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.mosaic_gpu.support import (
    EMITTER_OPTIONS,
    SMEM_BUDGET,
    SPELLINGS,
    kernel_call,
    reductions,
    spec_list,
)
from pallasgen.frontend import ir
from pallasgen.lowering.parts import if_residuals, tuple_code
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.lowering.reductions import compute_dtype, finish_code, identity

# Reductions with a pair of running values, and what their second partial result is.
SECOND = {"argmax": "index", "argmin": "index", "logsumexp": "total"}
ROWS = 64  # the WGMMA layout's row tile: a block's rows, each reduced to one partial result
COLUMNS = (128, 64, 32)  # a row's elements: the widest whose blocks fit SMEM_BUDGET


class _Spelling:
    """index() and size() in a block (its flat positions), round() anywhere."""

    def __init__(self, sizes: dict[str, str], positions: str):
        self.sizes, self._positions = sizes, positions

    def positions(self, dim: str) -> str:
        return self._positions

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"


class TotalsPlanner:
    """The plan of a rank-1 kernel whose outputs are scalars computed from reductions (see the module)."""

    def __init__(self, planner):
        self.base = planner  # the shared _Planner: names, padding, finishing the plan
        self.kernel, self.checked, self.lowered = planner.kernel, planner.checked, planner.lowered
        self.namer, self.sizes, self.values, self.refs = planner.namer, planner.sizes, planner.values, planner.refs
        (self.dim,) = self.checked.space.layout
        self.reductions = reductions(self.kernel)
        # Each reduction's partial results: one array, or two (SECOND) for a pair of running values.
        self.partials, self.partial_refs, self.partial_smem = {}, {}, {}
        for n in self.reductions:
            parts = ["", f"_{SECOND[n.func]}"] if n.func in SECOND else [""]
            self.partials[n] = [self.namer.claim(f"{n.func}{p}_partials") for p in parts]
            self.partial_refs[n] = [self.namer.claim(f"{n.func}{p}_partials_ref") for p in parts]
            self.partial_smem[n] = [self.namer.claim(f"{n.func}{p}_smem") for p in parts]
        self.blocks = {n: self.namer.claim(f"{n.func}_block") for n in self.reductions}
        self.results = {
            n: self.namer.claim(f"{n.func}_{self.dim.lower()}", f"{n.func}_over_{self.dim.lower()}")
            for n in self.reductions
        }

    def plan(self):
        kernel, base, dim, sizes = self.kernel, self.base, self.dim, self.sizes
        columns = block_keyword(dim)
        shape = tuple_code([str(ROWS), columns])
        program, positions, step = (self.namer.claim(x) for x in ("program", "positions", "step"))
        spelling = _Spelling(sizes, positions)
        emitter = Emitter(self.lowered.names, self.checked.types, {}, spelling=spelling, **EMITTER_OPTIONS)
        used = {n.id for r in self.reductions for n in ir.walk(r.args[0]) if isinstance(n, ir.Name)}
        inputs = [d for d in kernel.inputs if d.name in used and d.dims] or [d for d in kernel.inputs if d.dims][:1]
        # 0-d inputs (an earlier stage's results: `stages`) come as ROWS copies, one per row.
        scalars = [d for d in kernel.inputs if d.name in used and not d.dims]
        rows = {d.name: self.namer.claim(f"{self.values[d.name]}_rows") for d in scalars}
        barrier = self.namer.claim("barrier")
        smem = [base.smem[d.name] for d in inputs]
        body = [
            f"{self.values[d.name]} = rt.mgpu_load({base.smem[d.name]}, {shape}, (0, 1))"
            for d in inputs
            if d.name in used
        ]
        body += [
            f"{self.values[d.name]} = rt.mgpu_spread(rt.mgpu_load_vector({base.smem[d.name]}, 0), {shape}, 0)"
            for d in scalars
        ]
        body.append(
            f"{positions} = rt.mgpu_positions({program} * {ROWS}, {shape}, 0) * {columns} + rt.mgpu_positions(0, {shape}, 1)"
        )
        for node in self.reductions:
            kind, dtype = node.func, emitter.kernel_dtype(node.args[0])
            block = self.blocks[node]
            body += [
                f"{block} = {emitter.cast(node.args[0], compute_dtype(kind, dtype).name)}",
                f"if {sizes[dim]} % ({ROWS} * {columns}):  # a ragged {dim}: its identity past the end",
                f"    {block} = jnp.where({positions} < {sizes[dim]}, {block}, {identity(kind, dtype)})",
                *self._partial_lines(node, block, shape, positions),
            ]
        specs = spec_list(f"rt.mgpu_spec({shape}, lambda _: ({program}, 0), {jnp_dtype(d.dtype)})" for d in inputs)
        kernel_body = [
            f"{program} = jax.lax.axis_index({dim!r})",
            *(
                f"rt.mgpu_copy_in({self.refs[d.name]}, {base.smem[d.name]}, {barrier}.at[{number}])"
                for number, d in enumerate(scalars)
            ),
            "",
            f"def {step}(_, {', '.join(smem)}):",
            *(f"    {line}" for line in body),
            "",
            f"plgpu.emit_pipeline({step}, grid=(1,), in_specs={specs})({', '.join(self.refs[d.name] for d in inputs)})",
            "rt.mgpu_copy_out("
            + ", ".join(
                f"({smem}, {ref}.at[pl.ds({program} * {ROWS}, {ROWS})])"
                for n in self.reductions
                for smem, ref in zip(self.partial_smem[n], self.partial_refs[n])
            )
            + ")",
        ]
        partial_types = {}
        for n in self.reductions:
            first = jnp_dtype(compute_dtype(n.func, emitter.kernel_dtype(n.args[0])).name)
            partial_types[n] = [
                first,
                *(["jnp.int32" if SECOND[n.func] == "index" else first] if n.func in SECOND else []),
            ]
        partials = [name for n in self.reductions for name in self.partials[n]]
        padded = base.padded(dim)
        keywords = [columns, sizes[dim], *(p.name for p in kernel.params)]
        launcher = [
            f"{columns} = {self._columns(inputs)}",
            f"{padded} = {sizes[dim]} + -{sizes[dim]} % ({ROWS} * {columns})",
            *(
                f"{self.values[d.name]} = rt.mgpu_pad({self.values[d.name]}, ({padded},)).reshape(-1, {columns})"
                for d in inputs
            ),
            *(f"{rows[d.name]} = jnp.broadcast_to(jnp.reshape({self.values[d.name]}, ()), ({ROWS},))" for d in scalars),
        ]
        call = kernel_call(
            f"functools.partial({base.kernel_function}, {', '.join(f'{k}={k}' for k in keywords)})",
            "("
            + "".join(
                f"jax.ShapeDtypeStruct(({padded} // {columns},), {t}), "
                for n in self.reductions
                for t in partial_types[n]
            )
            + ")",
            {dim: f"{padded} // ({ROWS} * {columns})"},
            [*(self.values[d.name] for d in inputs), *rows.values()],
            scratch="["
            + ", ".join(
                [
                    *(f"plgpu.SMEM(({ROWS},), {t})" for n in self.reductions for t in partial_types[n]),
                    *(f"plgpu.SMEM(({ROWS},), {jnp_dtype(d.dtype)})" for d in scalars),
                    *([f"plgpu.Barrier(num_barriers={len(scalars)})"] if scalars else []),
                ]
            )
            + "]",
        )
        launcher += [f"{', '.join(partials)}, = {call[0]}", *call[1:]]
        for node in self.reductions:
            kind, dtype = node.func, emitter.kernel_dtype(node.args[0])
            launcher.append(f"{self.results[node]} = {self._combined(node, dtype)}")
        finished = Emitter(self.lowered.names, self.checked.types, dict(self.results), spelling=spelling)
        outs = {o.name: o for o in kernel.outputs}
        for statement in kernel.body:
            out = outs[statement.target]
            launcher.append(f"{self.values[out.name]} = {finished.cast(statement.value, out.dtype)}")
        returned = [
            f"({if_residuals(out, p)})" if p.residual else out
            for o, p in zip(kernel.outputs, self.lowered.outputs)
            for out in [f"jnp.asarray({self.values[o.name]}, {jnp_dtype(o.dtype)}).reshape({p.layout_shape})"]
        ]
        launcher.append(f"return {', '.join(returned)}")
        refs = [self.refs[d.name] for d in (*inputs, *scalars)]
        refs += [r for n in self.reductions for r in self.partial_refs[n]]
        scratch = [s for n in self.reductions for s in self.partial_smem[n]] + [base.smem[d.name] for d in scalars]
        return base.finish((refs, [*scratch, *([barrier] if scalars else [])], keywords), kernel_body, tuple(launcher))

    def _partial_lines(self, node: ir.Call, block: str, shape: str, positions: str) -> list[str]:
        """A block's partial results of a reduction, row by row, into shared memory."""
        smem, kind = self.partial_smem[node], node.func
        if kind not in SECOND:
            return [f"{smem[0]}[...] = jnp.{FUNCTIONS[kind].reducer.block}({block}, axis=1)"]
        top = self.namer.claim(f"{block}_top")
        if kind == "logsumexp":  # each row's max, and its sum of exp(x - max)
            exp = SPELLINGS["exp"].format(f"{block} - rt.mgpu_spread({top}, {shape}, 0)")
            return [
                f"{top} = jnp.max({block}, axis=1)",
                f"{smem[0]}[...] = {top}",
                f"{top} = jnp.where({top} > -jnp.inf, {top}, 0.0)",
                f"{smem[1]}[...] = jnp.sum({exp}, axis=1)",
            ]
        best = "max" if kind == "argmax" else "min"  # each row's best value, and its first position
        return [
            f"{top} = jnp.{best}({block}, axis=1)",
            f"{smem[0]}[...] = {top}",
            f"{smem[1]}[...] = jnp.min(jnp.where({block} == rt.mgpu_spread({top}, {shape}, 0), {positions}, 2147483647), axis=1)",
        ]

    def _combined(self, node: ir.Call, dtype) -> str:
        """The reduction over the whole dimension, from every block's partial results (rows
        in order of position: the first best row holds the first best position)."""
        parts, kind = self.partials[node], node.func
        if kind == "logsumexp":
            return f"jax.nn.logsumexp(rt.logsumexp_finish({parts[0]}, {parts[1]}))"
        if kind in ("argmax", "argmin"):
            return f"{parts[1]}[jnp.{kind}({parts[0]})]"
        combined = f"jnp.{FUNCTIONS[kind].reducer.block}({parts[0]})"
        return finish_code(kind, [combined], dtype, self.sizes[self.dim])

    def _columns(self, inputs) -> int:
        row_bytes = sum(DTYPES[d.dtype].bits // 8 for d in inputs)
        return next((c for c in COLUMNS if ROWS * c * row_bytes <= SMEM_BUDGET), COLUMNS[-1])
