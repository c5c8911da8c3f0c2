"""Reductions on Mosaic GPU: sweeps over the reduced dimension's blocks.

A kernel laid out over [M, N] that reduces one of them (its *swept* dimension) runs one
program per block of the other (its *kept* one): blocks are 64 rows (the WGMMA
layout's row tile) by a block of columns. Its reductions are computed in passes over
the swept dimension, one TMA pipeline (`plgpu.emit_pipeline`) each whose carry holds
the running values of each kept position: a pass takes the reductions whose
arguments read only the results of earlier passes (softmax: its max, then its sum of
exponentials; layer_norm: its mean, then its variance). Values of the kept dimension
alone are vectors in the WGMMA layout's row (or column) layout, broadcast over a
block where a block reads them. Once the passes are done, those outputs are computed
and copied out through shared memory; the [M, N] outputs are computed in one more
pass, each block copied out as it is done (two buffers in shared memory, one in
flight while the next is written).

Ragged edges are exact: the launcher pads the arrays with zeros to whole blocks, and
where the swept dimension is not a multiple of its block a reduction's padded
positions hold its identity before they are reduced (kept positions past the end are
computed and sliced off).
"""

from __future__ import annotations

from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.mosaic_gpu.support import (
    EMITTER_OPTIONS,
    SMEM_BUDGET,
    copy_out,
    kernel_call,
    sized_dims,
    spec_list,
)
from pallasgen.frontend import ir
from pallasgen.lowering.parts import assigned_together, saved_only, tuple_code, unpacked_results
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.lowering.reductions import accumulators, compute_dtype, finish_code, identity, reduced_dim

ROWS = 64  # the WGMMA layout's row tile: a program's rows
COLUMNS = (128, 64, 32)  # a pass's block of columns: the widest that fits SMEM_BUDGET
PIPELINE_STAGES = 2  # blocks of columns in flight


class Passes:
    """Which pass computes each reduction, and after which pass each let or output can be
    computed: one after the latest pass whose result it reads (through lets and outputs
    read by name; 0: none)."""

    def __init__(self, kernel: ir.Kernel):
        self.values = {_target(s): s.value for s in kernel.body}
        self.reductions: dict[ir.Call, int] = {}
        self.statements = {name: self.level(value) for name, value in self.values.items()}

    def level(self, node: ir.Expr) -> int:
        """The latest pass whose result `node` reads."""
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].reducer is not None:
            if node not in self.reductions:
                self.reductions[node] = self.level(node.args[0]) + 1
            return self.reductions[node]
        if isinstance(node, ir.Name) and node.id in self.values:
            return self.level(self.values[node.id])
        return max((self.level(c) for c in _children(node)), default=0)

    @property
    def count(self) -> int:
        return max(self.reductions.values(), default=0)


def _target(statement: ir.Statement) -> str:
    return statement.name if isinstance(statement, ir.Let) else statement.target


def _children(node: ir.Expr) -> tuple[ir.Expr, ...]:
    if isinstance(node, ir.Binary):
        return node.left, node.right
    if isinstance(node, ir.Unary):
        return (node.operand,)
    return getattr(node, "args", ())


class _Spelling:
    """index(), size() and round() in a block of a pass (reductions never reach it: each
    is computed by its pass, then read as a value)."""

    def __init__(self, sizes: dict[str, str], start: str, shape: str, axis: int):
        self.sizes, self.start, self.shape, self.axis = sizes, start, shape, axis

    def positions(self, dim: str) -> str:
        return f"rt.mgpu_positions({self.start}, {self.shape}, {self.axis})"

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"


def column_block(kernel: ir.Kernel, columns: str) -> int:
    """The widest block of columns whose pipelined blocks fit SMEM_BUDGET: each input's
    blocks in flight and two buffers per [M, N] output (PIPELINE_STAGES of each)."""
    arrays = [d for d in (*kernel.inputs, *kernel.outputs) if columns in d.dims]
    column_bytes = sum(PIPELINE_STAGES * DTYPES[d.dtype].bits // 8 * (ROWS if len(d.dims) == 2 else 1) for d in arrays)
    return next((c for c in COLUMNS if c * column_bytes <= SMEM_BUDGET), COLUMNS[-1])


class SweepPlanner:
    """The plan of a kernel over [M, N] whose reductions all reduce one of them (see the module)."""

    def __init__(self, planner):
        self.base = planner  # the shared _Planner: names, padding, the launcher
        self.kernel, self.checked, self.lowered = planner.kernel, planner.checked, planner.lowered
        self.rows, self.columns = self.checked.space.layout
        self.levels = Passes(self.kernel)
        self.passes = self.levels.reductions
        self.swept = reduced_dim(next(iter(self.passes)))  # support.refusal: one dimension for all
        self.axis = self.checked.space.layout.index(self.swept)  # the swept dimension's axis in blocks
        self.kept = self.checked.space.layout[1 - self.axis]
        self.namer, self.sizes, self.values, self.refs = planner.namer, planner.sizes, planner.values, planner.refs
        self.statements = {_target(s): s for s in self.kernel.body}
        self.arrays = {d.name: d for d in (*self.kernel.inputs, *self.kernel.outputs)}
        self.shape = tuple_code([block_keyword(self.rows), block_keyword(self.columns)])
        self.start, self.indices, self.carry = (self.namer.claim(x) for x in ("start", "indices", "carry"))
        self.results = {
            node: self.namer.claim(
                f"{node.func}_{reduced_dim(node).lower()}", f"{node.func}_over_{reduced_dim(node).lower()}"
            )
            for node in self.passes
        }

    def is_kept(self, name: str) -> bool:
        """Whether a value (input, let or output) is a vector of the kept dimension: it
        lacks the swept one."""
        dims = self.arrays[name].dims if name in self.arrays else self.checked.types[self.statements[name].value].dims
        return self.swept not in dims and self.kept in dims

    def spread(self, vector: str) -> str:
        """A vector of the kept dimension broadcast over a block."""
        return f"rt.mgpu_spread({vector}, {self.shape}, {1 - self.axis})"

    def emitter(self, in_block: bool) -> Emitter:
        """Expressions in a block of a pass (`in_block`: vectors of the kept dimension
        broadcast over it), or per kept position once passes are done."""
        names = dict(self.lowered.names)
        if in_block:
            names |= {n: self.spread(names[n]) for n in self.arrays | self.statements if self.is_kept(n)}
        overrides = {node: self.spread(result) if in_block else result for node, result in self.results.items()}
        lets = {s.name: s.value for s in self.kernel.body if isinstance(s, ir.Let)}
        spelling = _Spelling(self.sizes, self.start, self.shape, self.axis)
        return Emitter(names, self.checked.types, overrides, spelling=spelling, lets=lets, **EMITTER_OPTIONS)

    def block_reads(self, roots) -> tuple[list[ir.ArrayDecl], list[ir.Let]]:
        """The inputs and lets of blocks that computing `roots` in a block reads, in order
        (not those inside reductions: their results are read)."""
        names: set[str] = set()
        pending = list(roots)
        while pending:
            node = pending.pop()
            if node in self.passes:
                continue
            known = isinstance(node, ir.Name) and (node.id in self.arrays or node.id in self.statements)
            if known and not self.is_kept(node.id) and node.id not in names:
                names.add(node.id)
                if node.id in self.statements:
                    pending.append(self.statements[node.id].value)
            pending.extend(_children(node))
        inputs = [d for d in self.kernel.inputs if d.name in names]
        lets = [s for s in self.kernel.body if isinstance(s, ir.Let) and s.name in names]
        return inputs, lets

    def plan(self, columns: int):
        kernel, rows, cols = self.kernel, self.rows, self.columns
        base = self.base
        base.out_dims = (rows, cols)
        kept, swept = self.kept, self.swept
        program = self.namer.claim(f"program_{kept.lower()}")
        blocks = {rows: ROWS, cols: columns}
        multiples = {rows: block_keyword(rows), cols: block_keyword(cols)}
        kept_inputs = [d for d in kernel.inputs if self.is_kept(d.name)]
        kept_outputs = [d for d in kernel.outputs if self.is_kept(d.name)]
        block_outputs = [d for d in kernel.outputs if not self.is_kept(d.name)]
        barrier = self.namer.claim("barrier")
        smem = base.smem
        out_smem = {d.name: self.namer.claim(f"{d.name}_buffers") for d in block_outputs}
        by = next(d for d in (*kernel.inputs, *kernel.outputs) if swept in d.dims)
        steps = f"{self.refs[by.name]}.shape[{by.dims.index(swept)}] // {block_keyword(swept)}"
        kept_at = f"pl.ds({program} * {block_keyword(kept)}, {block_keyword(kept)})"

        body = [f"{program} = jax.lax.axis_index({kept!r})"]
        for number, decl in enumerate(kept_inputs):
            body += [
                f"rt.mgpu_copy_in({self.refs[decl.name]}.at[{kept_at}], {smem[decl.name]}, {barrier}.at[{number}])",
                f"{self.values[decl.name]} = rt.mgpu_load_vector({smem[decl.name]}, {1 - self.axis})",
            ]
        body += self._kept_statements(0)
        for number in range(1, self.levels.count + 1):
            body += self._reduction_pass(number, program, steps)
            body += self._kept_statements(number)
        for decl in kept_outputs:
            body.append(f"{smem[decl.name]}[...] = {self.values[decl.name]}")
        copies = [(self.refs[d.name], smem[d.name], f"{self.refs[d.name]}.at[{kept_at}]") for d in kept_outputs]
        residuals = {self.refs[o.spec_name] for o in self.lowered.residuals}
        if block_outputs:  # the kept outputs' copies run on beside the output pass's
            if kept_outputs:
                body.append("plgpu.commit_smem()")
                for ref, tile, at in copies:
                    copy = f"plgpu.copy_smem_to_gmem({tile}, {at})"
                    body.append(saved_only(ref, copy) if ref in residuals else copy)
            body += self._output_pass(block_outputs, out_smem, program, steps)
            body.append("plgpu.wait_smem_to_gmem(0)")
        else:
            body += copy_out(copies, residuals)

        # A barrier per input of the kept dimension alone, for its one copy in.
        scratch = [f"plgpu.Barrier(num_barriers={len(kept_inputs)})"] if kept_inputs else []
        scratch += [
            f"plgpu.SMEM(({block_keyword(kept)},), {jnp_dtype(d.dtype)})" for d in (*kept_inputs, *kept_outputs)
        ]
        scratch += [
            f"rt.mgpu_smem((2, {block_keyword(rows)}, {block_keyword(cols)}), {jnp_dtype(d.dtype)})"
            for d in block_outputs
        ]
        refs = [self.refs[d.name] for d in (*kernel.inputs, *kernel.outputs)]
        scratch_refs = [
            *([barrier] if kept_inputs else []),
            *(smem[d.name] for d in (*kept_inputs, *kept_outputs)),
            *(out_smem[d.name] for d in block_outputs),
        ]
        sized = [self.sizes[kept]] if kept in sized_dims(kernel) else []
        keywords = [
            block_keyword(rows),
            block_keyword(cols),
            self.sizes[swept],
            *sized,
            *(p.name for p in kernel.params),
        ]
        reshapes = []
        for decl in kernel.inputs:
            dims, value = decl.dims, self.values[decl.name]
            if len(dims) < 2:  # laid out with a size-1 axis by the public function
                reshapes.append(f"{value} = {value}.reshape({tuple_code([self.sizes[d] for d in dims])})")
            reshapes.append(base.padding(value, dims, multiples))
        call = kernel_call(
            f"functools.partial({base.kernel_function}, {', '.join(f'{k}={k}' for k in keywords)})",
            base.out_types(multiples, optional=True),
            {kept: f"{base.padded(kept)} // {block_keyword(kept)}"},
            [self.values[d.name] for d in kernel.inputs],
            scratch=spec_list(scratch),
        )
        return base.finish((refs, scratch_refs, keywords), body, base.launcher(blocks, multiples, reshapes, call))

    def _block_spec(self, decl: ir.ArrayDecl, program: str) -> str:
        cols = block_keyword(self.columns)
        if len(decl.dims) == 2:
            index = f"({program}, s)" if self.axis == 1 else f"(s, {program})"
            return f"rt.mgpu_spec(({block_keyword(self.rows)}, {cols}), lambda s: {index}, {jnp_dtype(decl.dtype)})"
        return f"plgpu.BlockSpec(({block_keyword(self.swept)},), lambda s: (s,))"

    def _block_loads(self, inputs) -> list[str]:
        positions = {d.name: "(0, 1)" if len(d.dims) == 2 else f"({self.axis},)" for d in inputs}
        return assigned_together(
            [
                (self.values[d.name], f"rt.mgpu_load({self.base.smem[d.name]}, {self.shape}, {positions[d.name]})")
                for d in inputs
            ]
        )

    def _pipeline(self, step: str, inputs, program: str, steps: str, carry: str | None) -> list[str]:
        return [
            "plgpu.emit_pipeline(",
            f"    {step},",
            f"    grid=({steps},),",
            f"    in_specs={spec_list(self._block_spec(d, program) for d in inputs)},",
            f"    max_concurrent_steps={PIPELINE_STAGES},",
            *([f"    init_carry={carry},"] if carry else []),
            f")({', '.join(self.refs[d.name] for d in inputs)})",
        ]

    def _reduction_pass(self, number: int, program: str, steps: str) -> list[str]:
        """The pipeline that computes the reductions of pass `number`, and their results."""
        nodes = [n for n, p in self.passes.items() if p == number]
        inputs, lets = self.block_reads([n.args[0] for n in nodes])
        emitter = self.emitter(in_block=True)
        size = self.sizes[self.swept]
        running, initial, update, results = [], [], [], []
        for node in nodes:
            kind, dtype = node.func, emitter.kernel_dtype(node.args[0])
            computed = compute_dtype(kind, dtype)
            result = self.results[node]
            accs = accumulators(kind, dtype, [f"{result}_{part}" for part in ("running", "index")])
            names = [a.name for a in accs]
            running += names
            initial += [
                f"rt.mgpu_full({block_keyword(self.kept)}, {a.initial}, {a.dtype}, {1 - self.axis})" for a in accs
            ]
            block = f"{result}_block"
            value, ragged = emitter.cast(node.args[0], computed.name), f"{size} % {block_keyword(self.swept)}"
            update += [
                f"{block} = rt.mgpu_fill_past({value}, {self.start}, {size}, {self.axis}, {identity(kind, dtype)}, ragged={ragged})",
                f"{', '.join(names)} = {self._combined(kind, names, block)}",
            ]
            results.append((result, finish_code(kind, names, dtype, size)))
        step = self.namer.claim(f"reduce_{number}")
        outer, finished = unpacked_results(running, results)
        if len(running) == 1:  # the carry is the one running value itself
            carried, unpack, initial_carry, outer = running[0], [], initial[0], outer.rstrip(",")
        else:
            carried, initial_carry = tuple_code(running), tuple_code(initial)
            unpack = [f"    {carried} = {self.carry}"]
        pipeline = self._pipeline(step, inputs, program, steps, initial_carry)
        parameter = running[0] if len(running) == 1 else self.carry
        return [
            f"def {step}({', '.join([self.indices, *(self.base.smem[d.name] for d in inputs), parameter])}):",
            *unpack,
            f"    {self.start} = {self.indices}[0] * {block_keyword(self.swept)}",
            *(f"    {line}" for line in self._block_loads(inputs)),
            *(f"    {self.values[s.name]} = {emitter.emit(s.value)}" for s in lets),
            *(f"    {line}" for line in update),
            f"    return {carried}",
            "",
            f"{outer} = {pipeline[0]}",
            *pipeline[1:],
            *finished,
        ]

    def _combined(self, kind: str, running: list[str], block: str) -> str:
        reducer, axis = FUNCTIONS[kind].reducer, self.axis
        if reducer.merge:
            return reducer.merge.format(running[0], f"jnp.{reducer.block}({block}, axis={axis})")
        if kind == "logsumexp":
            return f"rt.mgpu_logsumexp_step({running[0]}, {running[1]}, {block}, {axis})"
        largest = kind == "argmax"
        return f"rt.mgpu_argbest_step({running[0]}, {running[1]}, {block}, {self.start}, {axis}, largest={largest})"

    def _kept_statements(self, number: int) -> list[str]:
        """The lets and outputs of the kept dimension alone that can be computed once pass
        `number` is done, and not before."""
        emitter = self.emitter(in_block=False)
        lines = []
        for statement in self.kernel.body:
            name = _target(statement)
            if not self.is_kept(name) or self.levels.statements[name] != number:
                continue
            if isinstance(statement, ir.Assign):
                value = emitter.cast(statement.value, self.arrays[name].dtype)
            else:
                value = emitter.emit(statement.value)
            lines.append(f"{self.values[name]} = {value}")
        return lines

    def _output_pass(self, outputs, buffers, program: str, steps: str) -> list[str]:
        """The pipeline that computes the [M, N] outputs block by block and copies each out."""
        kernel = self.kernel
        statements = [s for s in kernel.body if isinstance(s, ir.Assign) and not self.is_kept(s.target)]
        inputs, lets = self.block_reads([s.value for s in statements])
        emitter = self.emitter(in_block=True)
        step = self.namer.claim("write")
        slot = self.namer.claim("slot")
        lines = [
            f"def {step}({', '.join([self.indices, *(self.base.smem[d.name] for d in inputs)])}):",
            f"    {self.start} = {self.indices}[0] * {block_keyword(self.swept)}",
            *(f"    {line}" for line in self._block_loads(inputs)),
            *(f"    {self.values[s.name]} = {emitter.emit(s.value)}" for s in lets),
            f"    {slot} = {self.indices}[0] % 2",
            "    # This slot's copy out, two blocks ago, has read it: the last block's may be in flight.",
            "    plgpu.wait_smem_to_gmem(1, wait_read_only=True)",
        ]
        for statement in statements:
            out = self.arrays[statement.target]
            lines.append(f"    {buffers[out.name]}[{slot}] = {emitter.cast(statement.value, out.dtype)}")
        lines.append("    plgpu.commit_smem()")
        kept = f"pl.ds({program} * {block_keyword(self.kept)}, {block_keyword(self.kept)})"
        swept = f"pl.ds({self.start}, {block_keyword(self.swept)})"
        at = f"{kept}, {swept}" if self.axis == 1 else f"{swept}, {kept}"
        lines += [
            f"    plgpu.copy_smem_to_gmem({buffers[o.name]}.at[{slot}], {self.refs[o.name]}.at[{at}])" for o in outputs
        ]
        return [*lines, "", *self._pipeline(step, inputs, program, steps, None)]
