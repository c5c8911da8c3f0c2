"""Fused kernels on Mosaic GPU (attention and its gradients): one program per batch
element and block of the dimensions outputs keep, sweeping the swept dimension's
blocks with running values (the online softmax), as analysis.fused derives them and
lowering.fused writes them.

A program is warp-specialized, as jax's own Hopper attention (`ops/gpu/attention_mgpu.py`):
its last warpgroup copies the swept dimension's blocks into shared memory by TMA, two in
flight (`rt.mgpu_warp_specialized`), while each of the others, two where their tiles fit
shared memory beside those blocks and else one (chosen at the call, with a forward
pass's swept block: 128 rows where they fit, else 64; `rt.mgpu_swept_block`), computes
its own block of the first parallel dimension (attention's queries) from them: it
copies its blocks that do not vary along the swept dimension in once, runs the pass over
the shared blocks with its running values (and the values read before the pass) as the
pipeline's carry, then computes its outputs, writes them to shared memory
(an output takes the tile of an input not read after the pass) and copies them out. A
block where the kernel's `where` on positions is false everywhere (causal attention) is
not computed (`jax.lax.cond`; it is still copied in). All programs are one grid axis
(Mosaic GPU's grid has three), decoded into each batch index and block.

Tiles are 2-D values in the WGMMA register layout; a value of one dimension of a tile
(a running max, a row's sum, `lse`) is a vector in the layout's row or column layout,
spread over a tile where it meets one. Products run on `wgmma` with an f32
accumulator: an input tile is read from shared memory where it lies, and an operand
that is a value is written to a tile there first (wgmma could read a 16-bit left one
from registers, but Mosaic GPU's interpreter, the check without a GPU, cannot); an f32
value times a 16-bit operand is two 16-bit products, of its high and low parts (exact
to about 2^-16, finer than TF32).

Ragged edges are exact: the launcher pads the arrays with zeros (blocked dimensions to
whole blocks, dimensions held whole to a multiple of 64) and slices the outputs back;
past the swept dimension's end, running values take their identity and computed
product operands 0 (lowering.fused), and reductions over a dimension held whole take
their identity past its size.
"""

from __future__ import annotations

import re

from pallasgen.analysis.carries import Carry
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.fused import array_axes
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.gpu.plan import mentioned
from pallasgen.backends.mosaic_gpu.fused_support import product_dtypes
from pallasgen.backends.mosaic_gpu.support import EMITTER_OPTIONS, compact, copy_out, kernel_call, spec_list
from pallasgen.frontend import ir
from pallasgen.lowering.fused import FrameSpelling, FusedLowering, Placement, Running
from pallasgen.lowering.parts import assigned_together, if_residuals, tuple_code
from pallasgen.lowering.pyexpr import _ATOM, Emitter, jnp_dtype
from pallasgen.lowering.reductions import compute_dtype, finish_code, identity, reduced_dim
from pallasgen.runtime.constants import MGPU_SWEPT_STAGES as PIPELINE_STAGES

BLOCK = 64  # rows of a block of each blocked dimension but the swept one: the WGMMA layout's row tile
WHOLE_MULTIPLE = 64  # a dimension held whole is padded to a multiple of this (one swizzled row)
WIDEST = 256  # the widest dimension held whole: wgmma's widest accumulator


def _children(node: ir.Expr) -> list[ir.Expr]:
    if isinstance(node, ir.Call):
        return list(node.args)
    return [getattr(node, a) for a in ("operand", "left", "right", "value") if hasattr(node, a)]


class _Spelling(FrameSpelling):
    """Reductions over a tile's axis to a vector (no size-1 axis: Mosaic GPU's layouts
    have none), positions as vectors, softmax over a dimension held whole."""

    def reduction(self, node: ir.Call, value: str, dtype) -> str:
        dim = reduced_dim(node)
        axis = self.axis(node.args[0], dim)
        computed = compute_dtype(node.func, dtype)
        if computed.name != dtype.name:
            value = f"{value}.astype({jnp_dtype(computed.name)})"
        if dim in self.padded:
            value = f"rt.mgpu_fill_past({value}, 0, {self.sizes[dim]}, {axis}, {identity(node.func, dtype)})"
        block = f"jnp.{FUNCTIONS[node.func].reducer.block}({value}, axis={axis})"
        return finish_code(node.func, [block], dtype, self.sizes[dim])

    def softmax(self, node: ir.Call, value: str, dtype) -> str:
        dim = reduced_dim(node)
        axis = self.axis(node.args[0], dim)
        value = value if dtype.name == "f32" else f"{value}.astype(jnp.float32)"
        if dim in self.padded:
            value = f"rt.mgpu_fill_past({value}, 0, {self.sizes[dim]}, {axis}, -jnp.inf)"
        return f"rt.mgpu_softmax({value}, {axis})"

    def positions(self, dim: str) -> str:
        if dim in self.batch:
            return self.starts[dim]
        axis = 0 if self.row == dim else 1
        return f"rt.mgpu_vector_positions({self.starts.get(dim, '0')}, {self.extents[dim]}, {axis})"

    def rounded(self, value: str) -> str:
        return f"jnp.round({value})"


class _SpreadingEmitter(Emitter):
    """Expressions on tiles and vectors: a vector operand of a tile's operation is
    spread over the tile (`rt.mgpu_spread`), as broadcasting would a size-1 axis."""

    def __init__(self, *args, frame, extents, tiles, **options):
        super().__init__(*args, **options)
        self.frame, self.extents, self.tiles = frame, extents, tiles
        self._spread: dict[ir.Expr, str] = {}

    def _emit(self, node: ir.Expr):
        code, level = super()._emit(node)
        if node in self._spread:
            return f"rt.mgpu_spread({code}, {self._spread[node]})", _ATOM
        return code, level

    def _emit_node(self, node: ir.Expr):
        axes = self.frame.get(node)
        if axes and None not in axes and node not in self.overrides:
            for child in _children(node):
                spread = spread_code(self.frame.get(child), axes, self.extents)
                if spread and child not in self.tiles:
                    self._spread[child] = spread
        return super()._emit_node(node)


def spread_code(vector_axes, tile_axes, extents) -> str | None:
    """`shape, axis` of `rt.mgpu_spread` for a vector laid out along `vector_axes` that meets
    a tile along `tile_axes`; None if it is no vector of that tile."""
    if not vector_axes or None in tile_axes or [a is None for a in vector_axes].count(True) != 1:
        return None
    (dim,) = [a for a in vector_axes if a]
    if dim not in tile_axes:
        return None
    return f"{tuple_code([extents[a] for a in tile_axes])}, {tile_axes.index(dim)}"


class _Lowering(FusedLowering):
    """lowering.fused's body with Mosaic GPU's vectors and wgmma products."""

    def __init__(self, planner, *args, running_suffix=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.planner, self.running_suffix = planner, running_suffix
        self.vector_axes: dict[str, int] = {}  # a running vector's name: its axis in the tile

    # -- products ----------------------------------------------------------------------

    def direct(self, value: ir.Expr, dtype: str) -> bool:
        """Whether a product operand is an input read from shared memory as it lies."""
        decl = self.planner.inputs.get(value.id) if isinstance(value, ir.Name) else None
        return decl is not None and decl.dtype == dtype

    def _dot(self, node: ir.Binary, emitter) -> str:
        lines, code = self.product(node, emitter, masked=False)
        assert not lines
        return code

    def product(self, node: ir.Binary, emitter, masked: bool, acc: str | None = None) -> tuple[list[str], str]:
        """The lines before a product and its code (`rt.mgpu_dot`), added to `acc` if given;
        `masked`: computed operands take 0 past the swept dimension's end on a ragged last
        block."""
        product = self.fused.products[node]
        dtype, split = product_dtypes(self.checked, node)
        lines, operands = [], []
        for value, contracts in ((product.lhs, product.lhs_contracts), (product.rhs, product.rhs_contracts)):
            if self.direct(value, dtype):
                operands.append(self.planner.smem[value.id])
                continue
            code = emitter.cast(value, "f32" if split and value is product.lhs else dtype)
            if masked:
                name = self.namer.claim("operand")
                size = self.lowered.sizes[self.checked.sweep.dim]
                lines.append(
                    f"{name} = rt.mgpu_fill_past({code}, {self.start}, {size}, {contracts}, 0, ragged={self.ragged})"
                )
                code = name
            operands.append(code)
        keywords = []
        if split:
            keywords.append(f"split={jnp_dtype(split)}")
        if not self.direct(product.lhs, dtype):
            tiles = [self.planner.scratch(self.fused.frame[product.lhs], dtype) for _ in range(2 if split else 1)]
            keywords.append(f"lhs_scratch=({', '.join(tiles)},)")
        if not self.direct(product.rhs, dtype):
            keywords.append(f"rhs_scratch={self.planner.scratch(self.fused.frame[product.rhs], dtype)}")
        if product.rhs_contracts == 1:
            keywords.append("transposed=True")
        result = self.types[node].dtype.name
        if acc is not None and result == "f32":
            keywords.append(f"acc={acc}")
        shape = self._shape(node)
        code = f"rt.mgpu_dot({shape}, {', '.join(operands)}{''.join(', ' + k for k in keywords)})"
        if result != "f32":
            code = f"{code}.astype({jnp_dtype(result)})"
        return lines, code if acc is None or result == "f32" else f"{acc} + {code}"

    def _load_pairs(self, statements, extra_roots=(), skip=()) -> list[tuple[str, str]]:
        """(value, load) of the inputs the statements read as values (not those a product
        reads from shared memory)."""
        roots = [*(s.value for s in statements), *extra_roots]
        used, stack = set(), list(roots)
        while stack:
            node = stack.pop()
            if isinstance(node, ir.Name):
                used.add(node.id)
            if node in skip:
                continue
            if node in self.fused.products:
                product = self.fused.products[node]
                dtype, _ = product_dtypes(self.checked, node)
                stack += [v for v in (product.lhs, product.rhs) if not self.direct(v, dtype)]
                continue
            stack += _children(node)
        loads = [(self.lowered.values[d.name], self.load(d)) for d in self.checked.kernel.inputs if d.name in used]
        return [(value, load) for value, load in loads if load is not None]  # None: a value in scope

    # -- running values ----------------------------------------------------------------

    def _claim(self, wanted: str) -> str:
        """A running value's name: `sum_n`, or (`running_suffix`) `sum_n_running` where the
        kernel has a `sum_n` (a reduction's result that its pass computes, `sweeps`)."""
        return self.namer.claim(wanted, *([f"{wanted}_running"] if self.running_suffix else []))

    def carry_axes(self, carry: Carry) -> tuple:
        """A carry's tile axes once the pass is done (the swept one gone)."""
        if carry.kind == "dot":
            return self.fused.frame[carry.node]
        return tuple(None if a == self.checked.sweep.dim else a for a in self.fused.frame[carry.value])

    def _running(self, carry: Carry, names: list[str]) -> list[Running]:
        found = super()._running(carry, names)
        if carry.kind == "dot":
            return found
        axes = self.carry_axes(carry)
        (dim,) = [a for a in axes if a]
        for running in found:
            self.vector_axes[running.name] = axes.index(dim)
        return [Running(r.name, tuple_code([self.extents[dim]]), r.dtype, r.initial, r.comment, r.dims) for r in found]

    def _masked(self, name: str, value: str, node: ir.Expr, fill: str) -> list[str]:
        dim = self.checked.sweep.dim
        axis, size = self._axis(node, dim), self.lowered.sizes[dim]
        return [f"{name} = rt.mgpu_fill_past({value}, {self.start}, {size}, {axis}, {fill}, ragged={self.ragged})"]

    def _max_step(self, carry: Carry, names, emitter, shift, rescale) -> list[str]:
        """The running max after this block (a vector); where it rescales others, the
        shift spread over the block's tile, and the rescale factor (a vector)."""
        (name,) = names
        dim = self.checked.sweep.dim
        axis = self._axis(carry.value, dim)
        dtype = self._value_dtype(carry)
        block = self.namer.claim(f"{name.removesuffix('_running')}_block")
        value = emitter.cast(carry.value, compute_dtype("max", dtype).name)
        lines = self._masked(block, value, carry.value, identity("max", dtype))
        top = f"jnp.max({block}, axis={axis})"
        if shift is None:
            return lines + [f"{name} = jnp.maximum({name}, {top})"]
        previous, new, vector = (self.namer.claim(f"{name}_{x}") for x in ("previous", "new", "shift_vector"))
        return lines + [
            f"{previous} = {name}",
            f"{new} = jnp.maximum({previous}, {top})",
            f"{vector} = jnp.where({new} > -jnp.inf, {new}, 0.0)  # a row of -inf so far subtracts 0",
            f"{shift} = rt.mgpu_spread({vector}, {block}.shape, {1 - axis})",
            f"{rescale} = {emitter.call('exp', f'{previous} - {vector}')}  # what the terms so far are worth now",
            f"{name} = {new}",
        ]

    def _step(self, carry: Carry, names, emitter, scale, shift) -> list[str]:
        dim = self.checked.sweep.dim
        (name,) = names[:1]
        if carry.kind == "dot":
            rescaled = []
            if scale:
                axes = self.fused.frame[carry.node]
                spread = f"rt.mgpu_spread({scale}, {name}.shape, {self._scale_axis(carry, axes)})"
                rescaled = [f"{name} = {spread} * {name}"]
            lines, term = self.product(carry.node, emitter, masked=True, acc=name)
            return rescaled + lines + [f"{name} = {term}"]
        axis = self._axis(carry.value, dim)
        block = self.namer.claim(f"{name.removesuffix('_running')}_block")
        if carry.kind == "expsum":
            lines = self._masked(block, self.terms[carry.key], carry.value, "0.0")
            return lines + [f"{name} = {scale} * {name} + jnp.sum({block}, axis={axis})"]
        kind, dtype = carry.kind, self._value_dtype(carry)
        computed = compute_dtype(kind, dtype)
        lines = self._masked(block, emitter.cast(carry.value, computed.name), carry.value, identity(kind, dtype))
        reducer = FUNCTIONS[kind].reducer
        if scale:
            return lines + [f"{name} = {scale} * {name} + jnp.sum({block}, axis={axis})"]
        if reducer.merge is None:  # argmax, argmin: the best value and its first position
            largest = kind == "argmax"
            best = f"rt.mgpu_argbest_step({', '.join(names)}, {block}, {self.start}, {axis}, largest={largest})"
            return lines + [f"{', '.join(names)} = {best}"]
        return lines + [f"{name} = {reducer.merge.format(name, f'jnp.{reducer.block}({block}, axis={axis})')}"]

    def _scale_axis(self, carry: Carry, axes) -> int:
        """The axis of a dot carry's tile that its scale (a running max's vector) runs along."""
        scale_axes = self.carry_axes(carry.scale)
        (dim,) = [a for a in scale_axes if a]
        return axes.index(dim)

    def _finish(self, sweep, names, store) -> list[str]:
        size = self.lowered.sizes[sweep.dim]
        lines: list[str] = []
        finals: dict[tuple, str] = {}
        for carry in sorted(sweep.carries, key=lambda c: bool(c.factors)):
            read = names[carry.key]
            value = (
                read[0]
                if carry.kind in ("dot", "expsum")
                else finish_code(carry.kind, read, self._value_dtype(carry), size)
            )
            for op, factor in carry.factors:
                if isinstance(factor, Carry):
                    value = f"{value} {op} {self._fitted(finals[factor.key], self.carry_axes(factor), carry)}"
            if value in read and all(isinstance(f, Carry) for _, f in carry.factors):
                finals[carry.key] = value  # a carried value that is final as it is: no copy
                continue
            finals[carry.key] = self.namer.claim(read[0])
            lines.append(f"{finals[carry.key]} = {value}")
        overrides: dict = {}
        for node, carry in sweep.results.items():
            if isinstance(node, ir.Call) and node.func == "logsumexp":
                overrides[node] = f"rt.logsumexp_finish({finals[('max', carry.key[1])]}, {finals[carry.key]})"
            else:
                overrides[node] = finals[carry.key]
        statements, computed = self._finish_statements(sweep, overrides)
        emitter = self.emitter_for(overrides)
        self._prepare([s.value for s in statements], overrides, emitter)
        for carry in sweep.carries:  # factors that are values of the last step, not carries
            for op, factor in carry.factors:
                if not isinstance(factor, Carry):
                    self._prepare([factor], overrides, emitter)
                    fitted = self._fitted(emitter.emit(factor), self.fused.frame[factor], carry)
                    lines.append(f"{finals[carry.key]} = {finals[carry.key]} {op} {fitted}")
        factors = [f for c in sweep.carries for _, f in c.factors if not isinstance(f, Carry)]
        stores = self._store_all(statements, emitter, store)
        loads = [pair for pair in self._load_pairs(statements, factors, skip=computed) if pair[0] not in self.held]
        return assigned_together(loads) + lines + stores  # what was read before the pass is in scope

    def _fitted(self, code: str, axes, carry: Carry) -> str:
        """A factor's value as it multiplies or divides a carry: spread if it is a vector of
        the carry's tile."""
        spread = spread_code(axes, self.carry_axes(carry), self.extents)
        return f"rt.mgpu_spread({code}, {spread})" if spread else code


class FusedPlanner:
    """The plan of a fused kernel that support.refusal takes (see the module)."""

    def __init__(self, planner):
        self.base = planner  # the shared _Planner: names, finishing the plan
        self.lowered, self.checked, self.kernel = planner.lowered, planner.checked, planner.kernel
        self.fused = self.checked.frame
        self.namer, self.sizes, self.values, self.refs = planner.namer, planner.sizes, planner.values, planner.refs
        self.smem = planner.smem
        self.inputs = {d.name: d for d in self.kernel.inputs}
        self.scratches: list[tuple[str, str]] = []  # (name, its plgpu.SMEM)
        fused, dims = self.fused, self.checked.dims
        tiles = {a for axes in fused.frame.values() for a in axes if a}
        tiles |= {d for decl in self.kernel.inputs + self.kernel.outputs for d in decl.dims if d not in fused.batch}
        self.blocked = [d for d in dims if d in tiles and d in self.checked.blocks]
        self.whole = [d for d in dims if d in tiles and d not in self.checked.blocks]
        self.padded = {d: planner.padded(d) for d in self.blocked} | {d: block_keyword(d) for d in self.whole}
        self.grid = [*fused.batch, *fused.parallel]  # one program per element of each, decoded from one axis
        self.index = {
            d: self.namer.claim(f"{d.lower()}_index" if d in fused.batch else f"{d.lower()}_block") for d in self.grid
        }
        self.starts = {d: self.index[d] for d in fused.batch}
        self.starts |= {d: self.namer.claim(f"{d.lower()}_start") for d in fused.parallel}
        self.starts[self.checked.sweep.dim] = self.namer.claim(f"{self.checked.sweep.dim.lower()}_start")
        self.split = fused.parallel[0] if fused.parallel else None  # the warpgroups share out its blocks
        self.wg, self.warpgroups = self.namer.claim("wg"), self.namer.claim("warpgroups")
        self.tile_bytes: list[str] = []  # of each computing warpgroup's tiles in shared memory

    def scratch(self, axes, dtype: str) -> str:
        """A shared-memory tile for a product's operand that is a value."""
        name = self.namer.claim("operand_smem")
        self.scratches.append((name, f"rt.mgpu_smem({self._tile_shape(axes, dtype)}, {jnp_dtype(dtype)})"))
        return name

    def _tile_shape(self, dims, dtype: str) -> str:
        """A tile's shape in shared memory, one per computing warpgroup; its bytes noted."""
        self.tile_bytes.append(" * ".join([str(DTYPES[dtype].bits // 8), *(block_keyword(d) for d in dims)]))
        return tuple_code([self.warpgroups, *(block_keyword(d) for d in dims)])

    def plan(self):
        kernel = self.kernel
        code, lowering = self._code()
        streamed = [d for d in kernel.inputs if self.checked.sweep.dim in d.dims]
        once = [d for d in kernel.inputs if d not in streamed]
        out = kernel.outputs[0]  # the blocks of its tile in shared memory, read from the tile's shape
        read = [block_keyword(d) for d in out.dims if d not in self.fused.batch]
        taken = self._taken_tiles(once, code.finish)
        own = [d for d in [*once, *kernel.outputs] if d not in taken]
        scratch = [(self.smem[d.name], self._smem_type(d)) for d in own] + self.scratches
        barriers = [self.namer.claim("barrier") for _ in once]  # a warpgroup's, for each input copied once
        scratch += [(b, f"plgpu.Barrier(num_barriers={self.warpgroups})") for b in barriers]
        gathered, ref = self.namer.claim("scratch"), self.namer.claim("ref")
        names = [name for name, _ in scratch]
        computed = f"a block of {self.split} each" if self.split else "the program's blocks"
        wg, warpgroups = self.wg, self.warpgroups
        body = [
            f"# the first `{warpgroups}` warpgroups compute {computed}, the last copies {self.checked.sweep.dim}'s blocks in",
            f'{wg}, {warpgroups} = jax.lax.axis_index("wg"), jax.lax.axis_size("wg") - 1',
            f"{', '.join(names)}{',' if len(names) == 1 else ''} = ({ref}.at[{wg}] for {ref} in {gathered})",
            *self._taking(taken),
            f"{', '.join(read)}{',' if len(read) == 1 else ''} = {self.smem[out.name]}.shape",
            *self._program(),
            *self._pipeline(code, lowering, streamed, once, barriers),
        ]
        every = [*(self.sizes[d] for d in self.checked.dims), *(block_keyword(d) for d in self.blocked + self.whole)]
        every = [name for name in every if name not in read]
        keywords = mentioned([*every, *(p.name for p in kernel.params)], body)
        refs = [self.refs[d.name] for d in kernel.inputs + kernel.outputs]
        signature = ([*refs, f"*{gathered}", *keywords], [], [])
        return self.base.finish(signature, body, self._launcher(keywords, [t for _, t in scratch], streamed))

    def _taken_tiles(self, once, finish) -> dict:
        """The outputs whose tiles are those of inputs copied once (same blocks, same dtype)
        that nothing after the pass reads: each output's input."""
        read_after = "\n".join(finish)
        free = [d for d in once if not re.search(rf"\b{self.smem[d.name]}\b", read_after)]
        taken = {}
        for out in self.kernel.outputs:
            tile = (self._tile_dims(out), out.dtype)
            match = next((d for d in free if (self._tile_dims(d), d.dtype) == tile), None)
            if match is not None:
                free.remove(match)
                taken[out] = match
        return taken

    def _taking(self, taken) -> list[str]:
        """The line naming the tiles outputs take from inputs, and why they may."""
        if not taken:
            return []
        outs, ins = [self.smem[o.name] for o in taken], [self.smem[d.name] for d in taken.values()]
        read, held = " and ".join(d.name for d in taken.values()), " and ".join(o.name for o in taken)
        tiles = "its tile then holds" if len(outs) == 1 else "their tiles then hold"
        return [f"{', '.join(outs)} = {', '.join(ins)}  # {read} not read after the pass: {tiles} {held}"]

    def _tile_dims(self, decl) -> list[str]:
        return [d for d in decl.dims if d not in self.fused.batch]

    def _code(self):
        """The pass's code (lowering.fused, Mosaic GPU's way) and its lowering."""
        fused, sizes, swept = self.fused, self.sizes, self.checked.sweep.dim
        extents = {d: block_keyword(d) for d in self.blocked + self.whole}
        spelling = _Spelling(fused, sizes, extents, self.starts, padded=frozenset(self.whole))
        lets = {s.name: s.value for s in self.kernel.body if isinstance(s, ir.Let)}

        def load(decl):
            axes = [a for a in array_axes(decl, fused) if a not in fused.batch]
            if None not in axes:
                return f"plgpu.layout_cast({self.smem[decl.name]}[...], plgpu.Layout.WGMMA)"
            return f"rt.mgpu_load_vector({self.smem[decl.name]}, {axes.index(next(a for a in axes if a))})"

        def store(decl, value):
            return f"{self.smem[decl.name]}[...] = {value}"

        def emitter_for(overrides):
            return _SpreadingEmitter(
                self.lowered.names,
                self.checked.types,
                overrides,
                spelling=spelling,
                lets=lets,
                frame=fused.frame,
                extents=extents,
                tiles=set(self.checked.sweep.running),
                **EMITTER_OPTIONS,
            )

        lowering = _Lowering(self, self.lowered, self.namer, spelling, extents, Placement(), emitter_for, load)
        return lowering.swept(store, self.starts[swept], f"{sizes[swept]} % {block_keyword(swept)}"), lowering

    def _count(self, dim: str) -> str:
        """How many programs (batch elements or blocks) a grid dimension has."""
        return self.sizes[dim] if dim in self.fused.batch else f"pl.cdiv({self.sizes[dim]}, {self._span(dim)})"

    def _span(self, dim: str) -> str:
        """A program's positions along a dimension it blocks: one block, or one per warpgroup."""
        block = block_keyword(dim)
        return f"{self.warpgroups} * {block}" if dim == self.split else block

    def _program(self) -> list[str]:
        """Which batch element and blocks this program computes, decoded from its index."""
        indices = ", ".join(self.index[d] for d in self.grid) + ("," if len(self.grid) == 1 else "")
        counts = ", ".join(self._count(d) for d in self.grid[1:])
        lines = [f"{indices} = rt.mgpu_grid_indices({counts})"] if self.grid else []  # one program: none
        for d in self.fused.parallel:
            index = f"({self.index[d]} * {self.warpgroups} + {self.wg})" if d == self.split else self.index[d]
            lines.append(f"{self.starts[d]} = {index} * {block_keyword(d)}")
        return lines

    def _at(self, decl) -> str:
        """The ref's view a program reads or writes: its batch element and its blocks of
        the dimensions outputs keep (all of the swept one and those held whole)."""
        parts = []
        for d in decl.dims:
            if d in self.fused.batch:
                parts.append(self.index[d])
            elif d in self.fused.parallel:
                parts.append(f"pl.ds({self.starts[d]}, {block_keyword(d)})")
            else:
                parts.append(":")
        while parts and parts[-1] == ":":
            parts.pop()
        return f"{self.refs[decl.name]}.at[{', '.join(parts)}]" if parts else self.refs[decl.name]

    def _smem_type(self, decl) -> str:
        """A block of an array copied once, or of an output, in shared memory."""
        dims = self._tile_dims(decl)
        shape, dtype = self._tile_shape(dims, decl.dtype), jnp_dtype(decl.dtype)
        if len(dims) == 2:
            return f"rt.mgpu_smem({shape}, {dtype})"
        return f"plgpu.SMEM({shape}, {dtype})"

    def _wrapped_span(self, dim: str) -> str:
        """`_span` as an operand of `%`."""
        span = self._span(dim)
        return f"({span})" if " " in span else span

    def _spec(self, decl) -> str:
        """The pipeline's block of an input along the swept dimension (of its view, `_at`:
        a block of each dimension a program holds a block of, all of one held whole)."""
        swept = self.checked.sweep.dim
        dims = self._tile_dims(decl)
        index_map = tuple_code(["i" if d == swept else "0" for d in dims])
        shape = tuple_code([block_keyword(d) for d in dims])
        if len(dims) == 2:
            return f"rt.mgpu_spec({shape}, lambda i: {index_map}, {jnp_dtype(decl.dtype)})"
        return f"plgpu.BlockSpec({shape}, lambda i: {index_map})"

    def _pipeline(self, code, lowering, streamed, once, barriers) -> list[str]:
        """The pass over the swept dimension's blocks, warp-specialized: a pipeline whose
        last warpgroup copies the blocks in while the others each run `program` over them,
        carrying the running values (and the values read before the pass, which the step
        reads); a block the skip's condition rules out leaves them as they are."""
        swept, namer = self.checked.sweep.dim, self.namer
        steps, carried, step, compute, program, pipeline = (
            namer.claim(x) for x in ("indices", "carry", "step", "compute", "program", "pipeline")
        )
        names = [r.name for r in code.running]
        unpacked = ", ".join([*names, *code.held]) + ("," if len(names) + len(code.held) == 1 else "")
        initial = []
        for r in code.running:
            if r.name in lowering.vector_axes:
                (extent,) = [block_keyword(d) for d in r.dims]
                initial.append(f"rt.mgpu_full({extent}, {r.initial}, {r.dtype}, {lowering.vector_axes[r.name]})")
            else:
                initial.append(f"plgpu.layout_cast(jnp.full({r.shape}, {r.initial}, {r.dtype}), plgpu.Layout.WGMMA)")
        if len(initial) > 1 and len(set(initial)) == 1 and not code.held:
            first = f"({initial[0]},) * {len(initial)}"
        else:
            first = tuple_code([*initial, *code.held])
        step_body = [f"{unpacked} = {carried}", *code.step, f"return {unpacked}"]
        lines = [
            f"def {step}({', '.join([steps, *(self.smem[d.name] for d in streamed), carried])}):",
            f"    {self.starts[swept]} = {steps}[0] * {block_keyword(swept)}",
        ]
        if code.skip:
            lines += [
                f"    def {compute}():",
                *(f"        {line}" for line in step_body),
                "",
                "    # A block where the `where` on positions below is false everywhere adds nothing: skipped.",
                f"    return jax.lax.cond({code.skip}, {compute}, lambda: {carried})",
            ]
        else:
            lines += [f"    {line}" for line in step_body]
        copies = [
            f"rt.mgpu_copy_in({self._at(decl)}, {self.smem[decl.name]}, {barrier})"
            for decl, barrier in zip(once, barriers)
        ]
        finals = ", ".join(names) + (", *_" if code.held else "," if len(names) == 1 else "")
        outputs = copy_out(
            [(self.refs[d.name], self.smem[d.name], self._at(d)) for d in self.kernel.outputs],
            {self.refs[o.spec_name] for o in self.lowered.residuals},
        )
        return lines + [
            "",
            f"def {program}({pipeline}):  # a computing warpgroup's blocks: copied in, the pass over {swept}, written out",
            *(
                f"    {line}"
                for line in [*copies, *code.before, f"{finals} = {pipeline}({first})", *code.finish, *outputs]
            ),
            "",
            "rt.mgpu_warp_specialized(",
            f"    {step},",
            f"    {program},",
            f"    {self.warpgroups},",
            f"    grid=({self._count(swept)},),",
            f"    in_specs={spec_list(self._spec(d) for d in streamed)},",
            f")({', '.join(self._at(d) for d in streamed)})",
        ]

    def _swept_block_grows(self) -> bool:
        """Whether the call may take the swept dimension's block larger (rt.mgpu_swept_block):
        where one product's tile spans it (a forward pass's scores). A backward pass's two
        (its scores and dp) would hold twice the registers at 128 rows: kept at 64."""
        swept = self.checked.sweep.dim
        return sum(swept in self.checked.types[node].dims for node in self.fused.products) == 1

    def _launcher(self, keywords, scratch_types, streamed) -> tuple[str, ...]:
        """Blocks, the warpgroups, the arrays padded, the kernel, its outputs sliced back to
        their layout."""
        kernel, sizes = self.kernel, self.sizes
        swept = self.checked.sweep.dim
        grows = self._swept_block_grows()
        lines = compact([f"{block_keyword(d)} = {BLOCK}" for d in self.blocked if d != swept or not grows])
        for d in self.whole:
            lines += [
                f"{block_keyword(d)} = {sizes[d]} + -{sizes[d]} % {WHOLE_MULTIPLE}",
                f'rt.mgpu_check_whole("{kernel.name}", "{d}", {sizes[d]}, {block_keyword(d)}, {WIDEST})',
            ]
        blocks = [
            " * ".join(
                [str(PIPELINE_STAGES * DTYPES[d.dtype].bits // 8), *(block_keyword(a) for a in self._tile_dims(d))]
            )
            for d in streamed
        ]
        tiles, most = f"{spec_list(self.tile_bytes)}, {spec_list(blocks)}", "" if self.split else ", most=1"
        if grows:
            lines.append(
                f"{block_keyword(swept)}, {self.warpgroups} = rt.mgpu_swept_block("
                f'"{kernel.name}", {sizes[swept]}, lambda {block_keyword(swept)}: ({tiles}){most})'
            )
        else:
            lines.append(f'{self.warpgroups} = rt.mgpu_warpgroups("{kernel.name}", {tiles}{most})')
        padding = [f"{self.padded[d]} = {sizes[d]} + -{sizes[d]} % {self._wrapped_span(d)}" for d in self.blocked]
        for decl, plan in zip(kernel.inputs, self.lowered.inputs):
            value = self.values[decl.name]
            own, padded = (tuple_code([p.get(d, sizes[d]) for d in decl.dims]) for p in ({}, self.padded))
            if plan.expand:  # from the public function's layout (size-1 axes) to its own
                value = f"{value}.reshape({own})"
            padding.append(f"{self.values[decl.name]} = rt.mgpu_pad({value}, {padded})")
        lines += compact(padding)
        out_types = ", ".join(
            if_residuals(
                f"jax.ShapeDtypeStruct({tuple_code([self.padded.get(d, sizes[d]) for d in o.dims])}, {jnp_dtype(o.dtype)})",
                plan,
            )
            for o, plan in zip(kernel.outputs, self.lowered.outputs)
        )
        call = kernel_call(
            f"functools.partial({self.base.kernel_function}, {', '.join(f'{k}={k}' for k in keywords)})",
            f"({out_types},)",
            {"programs": " * ".join(self._count(d) for d in self.grid) or "1"},
            [self.values[d.name] for d in kernel.inputs],
            scratch=spec_list(scratch_types),
            warpgroups=self.warpgroups,
        )
        lines += [f"{', '.join(self.values[o.name] for o in kernel.outputs)}, = {call[0]}", *call[1:]]
        returned = [
            f"({if_residuals(crop, plan)})" if plan.residual else crop
            for out, plan in zip(kernel.outputs, self.lowered.outputs)
            for crop in [
                f"{self.values[out.name]}[{', '.join(f':{sizes[d]}' for d in out.dims)}]"
                + (f".reshape({plan.layout_shape})" if plan.restore else "")
            ]
        ]
        return tuple([*lines, f"return {', '.join(returned)}"])
