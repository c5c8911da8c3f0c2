"""Reductions on Mosaic GPU: sweeps over the reduced dimension's blocks.

A kernel laid out over [M, N] that reduces one of them (its *swept* dimension) runs one
program per block of the other (its *kept* one): blocks are 64 rows (the WGMMA
layout's row tile) by a block of columns. Its reductions are computed in passes over
the swept dimension, one TMA pipeline (`plgpu.emit_pipeline`) each whose carry holds
the running values of each kept position. A pass is a kernel of its own, as a spec
would write it, whose reductions over the swept dimension (blocked) are carried state
(analysis.carries) written by lowering.fused, as the TPU's and Triton's kernels are; the
reductions of earlier passes are its inputs. A reduction that reads another (`Passes`:
its level) is in a later pass, unless one pass can carry both (softmax's max and its
sum of exp(x - max), rescaled as the max grows); layer_norm's variance, which needs the
finished mean, is not. Values of the kept dimension alone are vectors in the WGMMA
layout's row (or column) layout, spread over a block where a block reads them; values
of the swept dimension alone are loaded spread over the block. Once the passes are done,
the kept outputs are computed and copied out through shared memory; the [M, N] outputs
are computed in one more pass (its kernel has no reductions), each block copied out as
it is done (two buffers in shared memory, one in flight while the next is written).

Ragged edges are exact: the launcher pads the arrays with zeros to whole blocks, and
where the swept dimension is not a multiple of its block a reduction's padded
positions hold its identity before they are reduced (kept positions past the end are
computed and sliced off).
"""

from __future__ import annotations

import dataclasses
import re

from pallasgen.analysis.checks import CheckedKernel, check_kernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import Namer, block_keyword
from pallasgen.backends.mosaic_gpu.fused import _Lowering, _SpreadingEmitter, _Spelling
from pallasgen.backends.mosaic_gpu.stages import stage_kernel
from pallasgen.backends.mosaic_gpu.support import (
    EMITTER_OPTIONS,
    SMEM_BUDGET,
    copy_out,
    kernel_call,
    sized_dims,
    spec_list,
)
from pallasgen.frontend import ir
from pallasgen.gradients.reverse import substitute
from pallasgen.lowering.fused import Placement
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import saved_only, tuple_code, unpacked_results
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.lowering.reductions import reduced_dim

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

        # A reduction whose value a kept statement is, exactly, is that statement's value:
        # its pass computes it under that name. Others get names of their own.
        exact: dict[ir.Expr, str] = {}
        for name, statement in self.statements.items():
            if self.is_kept(name) and statement.value in self.passes:
                exact.setdefault(statement.value, name)
        spec_names = Namer([*self.arrays, *(p.name for p in self.kernel.params), *self.statements])
        self.specs: dict[ir.Expr, str] = {}  # each reduction's name in the kernels of the passes
        self.results: dict[ir.Expr, str] = {}  # its Python name
        for node in self.passes:
            dim = reduced_dim(node).lower()
            if node in exact:
                self.specs[node], self.results[node] = exact[node], self.values[exact[node]]
            else:
                self.specs[node] = spec_names.claim(f"{node.func}_{dim}")
                self.results[node] = self.namer.claim(f"{node.func}_{dim}", f"{node.func}_over_{dim}")
        self.program = self.namer.claim(f"program_{self.kept.lower()}")

    def is_kept(self, name: str) -> bool:
        """Whether a value (input, let or output) is a vector of the kept dimension: it
        lacks the swept one."""
        dims = self.arrays[name].dims if name in self.arrays else self.checked.types[self.statements[name].value].dims
        return self.swept not in dims and self.kept in dims

    def _kept_decl(self, name: str) -> ir.ArrayDecl:
        """A kept value (let or output) as an input of a pass's kernel: computed before it."""
        statement = self.statements[name]
        dtype = self.arrays[name].dtype if name in self.arrays else self.checked.types[statement.value].dtype.name
        at = statement.value.position
        return ir.ArrayDecl(name, dtype, (self.kept,), at, at, (at,))

    def _result_decl(self, node: ir.Expr) -> ir.ArrayDecl:
        """A reduction's result as an output of its pass's kernel, or an input of later ones."""
        at = node.position
        return ir.ArrayDecl(self.specs[node], self.checked.types[node].dtype.name, (self.kept,), at, at, (at,))

    def _pass_kernel(self, number: int, outputs, assigned: dict[str, ir.Expr], swept: bool) -> CheckedKernel | None:
        """The kernel of a pass that starts after level `number - 1` (`Passes`; after the
        last: the output pass), as a spec would write it: the reductions of earlier levels
        and the kept values computed before it are inputs (vectors of the kept dimension),
        the block's lets its own; `swept`: its dimension blocked, so that its reductions are
        carried over its blocks. None where that kernel fails a check (it reads what it has not)."""
        earlier = {n: ir.Name(self.specs[n], n.position) for n, level in self.passes.items() if level < number}
        kept = [n for n in self.statements if self.is_kept(n) and self.levels.statements[n] < number]
        results = [self._result_decl(n) for n in earlier if self.specs[n] not in self.statements]
        # The block's lets, and its outputs read by name as lets of that name (as
        # analysis.carries takes them); one that reads a value this pass computes by its
        # name reads it as written (a pass's kernel reads its results after the pass).
        lets = []
        for statement in self.kernel.body:
            name = _target(statement)
            if not self.is_kept(name) and name not in assigned:
                named = [n for n in ir.walk(statement.value) if isinstance(n, ir.Name) and n.id in assigned]
                value = substitute(statement.value, {n: assigned[n.id] for n in named})
                lets.append(ir.Let(name, substitute(value, earlier), statement.position))
        body = [
            *lets,
            *(ir.Assign(name, substitute(value, earlier), value.position) for name, value in assigned.items()),
        ]
        inputs = (*self.kernel.inputs, *(self._kept_decl(n) for n in kept), *results)
        kernel = stage_kernel(self.kernel, f"{self.kernel.name}_pass_{number}", inputs, outputs, body, {})
        at = self.kernel.position
        blocks = (ir.BlockSize(self.swept, ROWS, at, at),) if swept else ()
        checked, problems = check_kernel(dataclasses.replace(kernel, blocks=blocks))
        return None if problems else checked

    def _reductions_kernel(self, first: int, last: int) -> CheckedKernel | None:
        """The kernel of one pass that computes the reductions of levels `first` to `last`:
        a later one carried online where it reads an earlier one (softmax's sum of
        exp(x - max), rescaled as the max grows: analysis.carries)."""
        nodes = [n for n, level in self.passes.items() if first <= level <= last]
        outputs = [self._result_decl(n) for n in nodes]
        return self._pass_kernel(first, outputs, {self.specs[n]: n for n in nodes}, True)

    def _passes(self) -> list[tuple[int, int, CheckedKernel]]:
        """The passes, each the (first, last) of the levels it computes and its kernel: as
        many levels in one pass as analysis.carries carries together."""
        found, first = [], 1
        while first <= self.levels.count:
            last, checked = first, self._reductions_kernel(first, first)
            assert checked is not None, "a pass reads the kernel's values and earlier passes' results"
            while last < self.levels.count and (merged := self._reductions_kernel(first, last + 1)) is not None:
                last, checked = last + 1, merged
            found.append((first, last, checked))
            first = last + 1
        return found

    def _lowering(self, checked: CheckedKernel) -> _Lowering:
        """lowering.fused's writer of a pass's kernel, in this kernel's names."""
        values = {**self.values, **{self.specs[n]: self.results[n] for n in self.passes}}
        names = {**self.lowered.names, **values}
        lowered = LoweredKernel(checked, self.namer, values, self.sizes, self.refs, names, "", (), ())
        extents = {d: block_keyword(d) for d in (self.rows, self.columns)}
        starts = {self.swept: self.start, self.kept: f"{self.program} * {block_keyword(self.kept)}"}
        spelling = _Positions(checked.frame, self.sizes, extents, starts, self.shape)
        lets = {s.name: s.value for s in checked.kernel.body if isinstance(s, ir.Let)}
        running = set(checked.sweep.running) if checked.sweep else set()
        # Values along the swept dimension alone are blocks: such an input is loaded spread
        # over the block, index() is the block's positions (`_Positions`).
        tile = (self.rows, self.columns)
        swept = tuple(d if d == self.swept else None for d in tile)
        frame = {node: tile if axes == swept else axes for node, axes in checked.frame.frame.items()}

        def emitter_for(overrides):
            return _SpreadingEmitter(
                names,
                checked.types,
                overrides,
                spelling=spelling,
                lets=lets,
                frame=frame,
                extents=extents,
                tiles=running,
                **EMITTER_OPTIONS,
            )

        placement = Placement()
        return _Lowering(
            None, lowered, self.namer, spelling, extents, placement, emitter_for, self._load, running_suffix=True
        )

    def _load(self, decl: ir.ArrayDecl) -> str | None:
        """A block of an input along the swept dimension, one along it alone spread over the
        block (None: a value in scope already)."""
        if decl.name not in self.arrays or self.swept not in decl.dims:
            return None
        positions = "(0, 1)" if len(decl.dims) == 2 else f"({self.axis},)"
        return f"rt.mgpu_load({self.base.smem[decl.name]}, {self.shape}, {positions})"

    def plan(self, columns: int):
        kernel, rows, cols = self.kernel, self.rows, self.columns
        base = self.base
        base.out_dims = (rows, cols)
        kept, swept, program = self.kept, self.swept, self.program
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
        for number, (first, last, checked) in enumerate(self._passes(), 1):
            body += self._reduction_pass(number, checked, steps)
            for level in range(first, last + 1):
                body += self._kept_statements(level)
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
            body += self._output_pass(block_outputs, out_smem, steps)
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

    def _block_spec(self, decl: ir.ArrayDecl) -> str:
        cols = block_keyword(self.columns)
        if len(decl.dims) == 2:
            index = f"({self.program}, s)" if self.axis == 1 else f"(s, {self.program})"
            return f"rt.mgpu_spec(({block_keyword(self.rows)}, {cols}), lambda s: {index}, {jnp_dtype(decl.dtype)})"
        return f"plgpu.BlockSpec(({block_keyword(self.swept)},), lambda s: (s,))"

    def _pipeline(self, step: str, inputs, steps: str, carry: str | None) -> list[str]:
        return [
            "plgpu.emit_pipeline(",
            f"    {step},",
            f"    grid=({steps},),",
            f"    in_specs={spec_list(self._block_spec(d) for d in inputs)},",
            f"    max_concurrent_steps={PIPELINE_STAGES},",
            *([f"    init_carry={carry},"] if carry else []),
            f")({', '.join(self.refs[d.name] for d in inputs)})",
        ]

    def _streamed(self, checked: CheckedKernel) -> list[ir.ArrayDecl]:
        """The inputs a pass's kernel reads block by block."""
        return [d for d in checked.kernel.inputs if d.name in self.arrays and self.swept in d.dims]

    def _reduction_pass(self, number: int, checked: CheckedKernel, steps: str) -> list[str]:
        """Pass `number`: the pipeline that computes its kernel's reductions (`_passes`),
        carried over the swept dimension's blocks (lowering.fused), and their results."""
        lowering = self._lowering(checked)
        values = lowering.lowered.values
        ragged = f"{self.sizes[self.swept]} % {block_keyword(self.swept)}"
        code = lowering.swept(lambda decl, value: f"{values[decl.name]} = {value}", self.start, ragged)
        running = [r.name for r in code.running]
        initial = [
            f"rt.mgpu_full({block_keyword(r.dims[0])}, {r.initial}, {r.dtype}, {lowering.vector_axes[r.name]})"
            for r in code.running
        ]
        step = self.namer.claim(f"reduce_{number}")
        if len(running) == 1:  # the carry is the one running value itself
            carried, unpack, initial_carry = running[0], [], initial[0]
        else:
            carried, initial_carry = tuple_code(running), tuple_code(initial)
            unpack = [f"    {', '.join(running)} = {self.carry}"]
        inputs = self._streamed(checked)
        pipeline = self._pipeline(step, inputs, steps, initial_carry)
        parameter = running[0] if len(running) == 1 else self.carry
        outer, finish = unpacked_results(running, [line.split(" = ", 1) for line in _passed_on(list(code.finish))])
        return [
            *code.before,
            f"def {step}({', '.join([self.indices, *(self.base.smem[d.name] for d in inputs), parameter])}):",
            *unpack,
            f"    {self.start} = {self.indices}[0] * {block_keyword(self.swept)}",
            *(f"    {line}" for line in code.step),
            f"    return {carried}",
            "",
            f"{outer.rstrip(',')} = {pipeline[0]}",
            *pipeline[1:],
            *finish,
        ]

    def _kept_statements(self, number: int) -> list[str]:
        """The lets and outputs of the kept dimension alone that can be computed once the
        reductions of level `number` are done, and not before (one that is a reduction's
        value as it is: its pass computes it)."""
        overrides = dict(self.results)
        lets = {s.name: s.value for s in self.kernel.body if isinstance(s, ir.Let)}
        spelling = _Spelling(self.checked.frame, self.sizes, {}, {})
        emitter = Emitter(
            self.lowered.names, self.checked.types, overrides, spelling=spelling, lets=lets, **EMITTER_OPTIONS
        )
        lines = []
        for statement in self.kernel.body:
            name = _target(statement)
            if not self.is_kept(name) or self.levels.statements[name] != number or statement.value in self.passes:
                continue
            if isinstance(statement, ir.Assign):
                value = emitter.cast(statement.value, self.arrays[name].dtype)
            else:
                value = emitter.emit(statement.value)
            lines.append(f"{self.values[name]} = {value}")
        return lines

    def _output_pass(self, outputs, buffers, steps: str) -> list[str]:
        """The pipeline that computes the [M, N] outputs block by block and copies each out."""
        statements = {
            s.target: s.value for s in self.kernel.body if isinstance(s, ir.Assign) and not self.is_kept(s.target)
        }
        checked = self._pass_kernel(self.levels.count + 1, outputs, statements, False)
        assert checked is not None, "an output pass reads the kernel's values and its passes' results"
        lowering = self._lowering(checked)
        slot = self.namer.claim("slot")
        code = lowering.whole(lambda decl, value: f"{buffers[decl.name]}[{slot}] = {value}")
        first_store = next(i for i, line in enumerate(code.step) if line.startswith(tuple(buffers.values())))
        inputs = self._streamed(checked)
        step = self.namer.claim("write")
        lines = [
            f"def {step}({', '.join([self.indices, *(self.base.smem[d.name] for d in inputs)])}):",
            f"    {self.start} = {self.indices}[0] * {block_keyword(self.swept)}",
            *(f"    {line}" for line in code.step[:first_store]),
            f"    {slot} = {self.indices}[0] % 2",
            "    # This slot's copy out, two blocks ago, has read it: the last block's may be in flight.",
            "    plgpu.wait_smem_to_gmem(1, wait_read_only=True)",
            *(f"    {line}" for line in code.step[first_store:]),
            "    plgpu.commit_smem()",
        ]
        kept = f"pl.ds({self.program} * {block_keyword(self.kept)}, {block_keyword(self.kept)})"
        swept = f"pl.ds({self.start}, {block_keyword(self.swept)})"
        at = f"{kept}, {swept}" if self.axis == 1 else f"{swept}, {kept}"
        lines += [
            f"    plgpu.copy_smem_to_gmem({buffers[o.name]}.at[{slot}], {self.refs[o.name]}.at[{at}])" for o in outputs
        ]
        return [*lines, "", *self._pipeline(step, inputs, steps, None)]


class _Positions(_Spelling):
    """index() of the swept dimension as the block's positions (support.refusal: the only
    index() of such a kernel)."""

    def __init__(self, frame, sizes, extents, starts, shape: str):
        super().__init__(frame, sizes, extents, starts)
        self.shape = shape

    def positions(self, dim: str) -> str:
        return f"rt.mgpu_positions({self.starts[dim]}, {self.shape}, {0 if self.row == dim else 1})"


def _passed_on(lines: list[str]) -> list[str]:
    """`lines` with a value assigned and then only passed on, once, to a name of its own
    (`r = total / n`, `mu = r`) assigned to that name at once (`mu = total / n`)."""
    out: list[str] = []
    for number, line in enumerate(lines):
        name, value = line.split(" = ", 1)
        later = "\n".join(lines[number + 1 :])
        if out and re.fullmatch(r"\w+", value) and out[-1].split(" = ", 1)[0] == value:
            if not re.search(rf"\b{value}\b", later):
                out[-1] = f"{name} = {out[-1].split(' = ', 1)[1]}"
                continue
        out.append(line)
    return out
