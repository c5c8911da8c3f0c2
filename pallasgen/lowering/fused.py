"""A kernel's body as code, for any backend that plans it as carried state: what each
step of the pass over the swept dimension computes and how its carries combine, and
what the last step writes (an elementwise kernel: its one step).

Every value is a tile laid out as `analysis.fused` framed it. Backends place the
carries (`Placement`: TPU scratch Refs read and written with `[...]`, values a GPU
loop carries) and say where blocks start; the rest is decided here once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pallasgen.analysis.dtypes import promote
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.carries import Carry, named, walk_outside
from pallasgen.analysis.fused import FusedKernel
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import elementwise_body, reference_call
from pallasgen.lowering.parts import assigned_together, body_statements, read_where_used, tuple_code
from pallasgen.lowering.pyexpr import jnp_dtype
from pallasgen.lowering.reductions import (
    accumulators,
    block_reduction,
    rows_reduction,
    combine_code,
    compute_dtype,
    finish_code,
    identity,
    kernel_positions,
    kernel_reduction,
    kernel_softmax,
    reduced_dim,
    running_parts,
)

F32 = "jnp.float32"


@dataclass(frozen=True)
class Running:
    """One running value of a carry: its name (a Ref or a loop variable), tile shape and
    dtype as code, its value before the first step, and what it is, for a comment."""

    name: str
    shape: str
    dtype: str
    initial: str
    comment: str
    dims: tuple[str, ...]  # the dimensions of its tile (the others are 1)


def carried_tile(carry: Carry, frame: FusedKernel, dim: str, blockwise: bool) -> tuple[str, ...]:
    """The dimensions of the tile each running value of `carry` over the swept `dim`
    holds: a product's, its result's; a reduction's, its operand's but `dim` (unless
    `blockwise`: block-shaped running values, merged position by position)."""
    if carry.kind == "dot":
        return tuple(a for a in frame.frame[carry.node] if a)
    return tuple(a for a in frame.frame[carry.value] if a and (a != dim or blockwise))


def carried_parts(carry: Carry) -> tuple[str | None, ...]:
    """What each running value of `carry` is called beside the others (None: a lone one;
    argmax keeps the max and its position)."""
    return running_parts(carry.kind) if carry.kind in FUNCTIONS else (None,)  # not dot, expsum


@dataclass(frozen=True)
class FusedCode:
    running: tuple[Running, ...]
    step: tuple[str, ...]  # one step of the pass (or the whole body, with no pass)
    skip: str | None  # a condition on the block's positions: the step adds nothing when false
    finish: tuple[str, ...]  # after the last step: the outputs
    before: tuple[str, ...] = ()  # what the pass reads but does not vary along it: loads, lets (_hoisted)
    held: tuple[str, ...] = ()  # the names `before` assigns that a step reads


class Placement:
    """Where a backend keeps running values: as values (a loop's carries) by default.
    There a value computed before the pass is in scope in every step and after it."""

    hoists = True

    def read(self, name: str) -> str:
        return name

    def write(self, name: str, value: str) -> str:
        return self.write_all([name], value)

    def write_all(self, names: list[str], value: str) -> str:
        """The running values `names` set to a tuple's values."""
        return f"{', '.join(names)} = {value}"


class RefPlacement(Placement):
    """Running values in scratch Refs (TPU): read and written whole. Each step is a
    program of its own: a value it does not carry is computed in each (attention dq's
    delta computed once into a scratch Ref instead estimated no faster on v5e or v6e)."""

    hoists = False

    def read(self, name: str) -> str:
        return f"{name}[...]"

    def write_all(self, names: list[str], value: str) -> str:
        return f"{', '.join(f'{n}[...]' for n in names)} = {value}"


class FrameSpelling:
    """Reductions, positions and sizes on a fused kernel's tiles (see analysis.fused):
    a value's tile axes say where each dimension lies. `extents[dim]` is a block's extent
    and `starts[dim]` its first position (code); `padded`: dimensions held whole in a
    larger block (a GPU's power of two), whose positions past the size are filled first."""

    def __init__(self, fused: FusedKernel, sizes, extents, starts, padded=frozenset(), round_helper=False):
        self.frame, self.sizes, self.extents, self.starts, self.padded = fused.frame, sizes, extents, starts, padded
        self.batch, self.row, self.axes = fused.batch, fused.row, fused.axes
        self.round_helper = round_helper  # Triton has no round: the runtime's round_half_even

    def axis(self, node: ir.Expr, dim: str) -> int:
        return self.frame[node].index(dim)

    def reduction(self, node: ir.Call, value: str, dtype) -> str:
        dim = reduced_dim(node)
        axis = self.axis(node.args[0], dim)
        return kernel_reduction(node.func, value, axis, dtype, self.sizes[dim], padded=dim in self.padded)

    def softmax(self, node: ir.Call, value: str, dtype) -> str:
        dim = reduced_dim(node)
        return kernel_softmax(value, self.axis(node.args[0], dim), dtype, self.sizes[dim], padded=dim in self.padded)

    def positions(self, dim: str) -> str:
        if dim in self.batch:
            return self.starts[dim]
        if self.axes is not None:  # a kernel without products: each dimension on its axis of the layout
            return kernel_positions(self.axes.index(dim), len(self.axes), self.extents[dim], self.starts.get(dim))
        axis = 0 if self.row == dim else 1
        return kernel_positions(axis, 2, self.extents[dim], self.starts.get(dim))

    def size(self, dim: str) -> str:
        return self.sizes[dim]

    def rounded(self, value: str) -> str:
        return f"rt.round_half_even({value})" if self.round_helper else f"jnp.round({value})"


def dot_code(product, lhs: str, rhs: str, accumulate: str) -> str:
    """The product of two tiles, contracting the axes the frame says."""
    if (product.lhs_contracts, product.rhs_contracts) == (1, 0):
        return f"jnp.dot({lhs}, {rhs}, preferred_element_type={accumulate})"
    contract = f"((({product.lhs_contracts},), ({product.rhs_contracts},)), ((), ()))"
    return f"jax.lax.dot_general({lhs}, {rhs}, {contract}, preferred_element_type={accumulate})"


class FusedLowering:
    """Writes a kernel's body. `lowered` names its values; `spelling` spells
    reductions and positions; `extents` gives each dimension's block extent as code;
    `placement` keeps the running values; `emitter_for(overrides)` makes an emitter."""

    def __init__(
        self,
        lowered,
        namer,
        spelling: FrameSpelling,
        extents,
        placement: Placement,
        emitter_for,
        load,
        mosaic=False,
        loads_fill_zeros=False,
        blockwise=False,
        rows=False,
    ):
        self.lowered, self.namer, self.spelling = lowered, namer, spelling
        # Whether `load` reads 0 past an input's end (Triton's masked loads): a product's
        # operand that is such a load, or a cast of one, needs no filling of its own.
        self.loads_fill_zeros = loads_fill_zeros
        self.checked = lowered.checked
        self.fused: FusedKernel = self.checked.frame
        self.extents, self.placement, self.emitter_for, self.load = extents, placement, emitter_for, load
        self.types = self.checked.types
        # Mosaic's limit on a product: x @ y.T with a one-row y (`_product_term`, `rt.dot_t`).
        self.mosaic = mosaic
        # `blockwise`: running values the shape of a block, merged position by position each
        # step and reduced once, after the last (every carry's kind merges so); `rows`: those
        # blocks are one-dimensional, held as rows of 128 lanes (`rt.as_rows`).
        self.blockwise, self.rows = blockwise, rows

    # -- shared ------------------------------------------------------------------------

    def _prepare(self, roots, overrides, emitter, extra=None) -> None:
        """Fills `overrides` for the products (and `extra` nodes) under `roots`, inner first."""
        nodes = [n for n in ir.walk(*roots)]
        for node in reversed(nodes):
            if node in overrides:
                continue
            if extra is not None and node in extra:
                overrides[node] = extra[node](emitter)
            elif isinstance(node, ir.Binary) and node.op == "@":
                overrides[node] = self._dot(node, emitter)

    def _dot(self, node: ir.Binary, emitter) -> str:
        product = self.fused.products[node]
        lhs, rhs = self._operands(node, emitter)
        return self._product_term(product, lhs, rhs, self._accumulate(node))

    def _product_term(self, product, lhs: str, rhs: str, accumulate: str) -> str:
        """The product of two tiles; on Mosaic, x @ y.T is `rt.dot_t`'s (a one-row y)."""
        if self.mosaic and (product.lhs_contracts, product.rhs_contracts) == (1, 1):
            return f"rt.dot_t({lhs}, {rhs}, {accumulate})"
        return dot_code(product, lhs, rhs, accumulate)

    def _fill_operand(self, value: str, node: ir.Expr, axis: int) -> str:
        """`value`, a product's operand, with 0 past the swept dimension's end on a ragged
        last block (`rt.fill_past`)."""
        if self.loads_fill_zeros and self._loaded(node):
            return value
        size = self.lowered.sizes[self.checked.sweep.dim]
        return f"rt.fill_past({value}, {self.start}, {size}, {axis}, 0, ragged={self.ragged})"

    def _loaded(self, node: ir.Expr) -> bool:
        """Whether a value is an input as loaded, or a cast of one."""
        while isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "cast":
            node = node.args[0]
        return isinstance(node, ir.Name) and node.id in {d.name for d in self.checked.kernel.inputs}

    def _operands(self, node, emitter) -> tuple[str, str]:
        """Both operands, converted to their common dtype as jnp.matmul would."""
        product = self.fused.products[node]
        common = promote(self.types[product.lhs].dtype, self.types[product.rhs].dtype).name
        return emitter.cast(product.lhs, common), emitter.cast(product.rhs, common)

    def _accumulate(self, node) -> str:
        return jnp_dtype(self.types[node].dtype.name)

    def _loads(self, statements, extra_roots=(), skip=()) -> list[str]:
        return assigned_together(self._load_pairs(statements, extra_roots, skip))

    def _load_pairs(self, statements, extra_roots=(), skip=()) -> list[tuple[str, str]]:
        """(value, load) of the inputs the statements and roots read (not under nodes in `skip`)."""
        roots = [*(s.value for s in statements), *extra_roots]
        used = {n.id for root in roots for n in walk_outside(root, skip) if isinstance(n, ir.Name)}
        return [(self.lowered.values[d.name], self.load(d)) for d in self.checked.kernel.inputs if d.name in used]

    def _store_all(self, statements, emitter, store) -> list[str]:
        kernel, lowered = self.checked.kernel, self.lowered
        return body_statements(kernel, statements, emitter, lowered.values, lowered.refs, self.checked, store)

    def _shape(self, node: ir.Expr) -> str:
        axes = self.fused.frame[node]
        return tuple_code([self.extents[a] if a else "1" for a in axes])

    # -- a kernel with no pass ---------------------------------------------------------

    def whole(self, store) -> FusedCode:
        kernel = self.checked.kernel
        overrides: dict = {}
        emitter = self.emitter_for(overrides)
        self._prepare([s.value for s in kernel.body], overrides, emitter)
        call = reference_call(self.lowered, emitter)
        if call is None:
            lines = self._loads(kernel.body) + self._store_all(kernel.body, emitter, store)
        else:  # the reference's code to the letter: said once, there (`elementwise_body`)
            lines = elementwise_body(self.lowered, emitter, self.load, store)
        return FusedCode((), tuple(lines), None, ())

    # -- a pass over the swept dimension ----------------------------------------------

    def swept(self, store, start: str, ragged: str) -> FusedCode:
        """`start`: the step's first position along the swept dimension (code); `ragged`:
        a condition (code) true when the last block overhangs the dimension."""
        sweep = self.checked.sweep
        dim = sweep.dim
        self.start, self.ragged = start, ragged
        names = {carry.key: self._carry_names(carry) for carry in sweep.carries}
        running = [r for carry in sweep.carries for r in self._running(carry, names[carry.key])]
        scales = {c.scale.key for c in sweep.carries if c.scale is not None}
        scales |= {c.key for c in sweep.running.values()} | {c.key for c in sweep.softmaxes.values()}

        overrides: dict = {}
        emitter = self.emitter_for(overrides)
        shift = {key: self.namer.claim(f"{names[key][0].removesuffix('_ref')}_shift") for key in scales}
        rescale = {key: self.namer.claim(f"{names[key][0].removesuffix('_ref')}_rescale") for key in scales}
        for node, carry in sweep.running.items():
            overrides[node] = shift[carry.key]
        # Each expsum's terms exp(x - the running max) are computed once: a let's, or a
        # variable set right after the max grows; softmax over the pass reads them.
        terms = {key: self.lowered.values[name] for key, name in sweep.terms.items()}
        for carry in sweep.carries:
            if carry.kind == "expsum" and carry.key not in terms:
                terms[carry.key] = self.namer.claim(f"{names[carry.key][0].removesuffix('_ref')}_terms")
        self.terms, self.fresh_terms = terms, {k for k in terms if k not in sweep.terms}
        extra = {}
        for node, carry in sweep.softmaxes.items():
            extra[node] = lambda e, carry=carry: terms[("expsum", carry.key[1])]
        for node, core in sweep.unfactored.items():
            extra[node] = lambda e, core=core: e.emit(core)

        loads = self._load_pairs(sweep.step, [c.value for c in sweep.carries])
        varying = {self.lowered.values[d.name] for d in self.checked.kernel.inputs if dim in d.dims}
        held = [load for load in loads if load[0] not in varying]
        self.hoisted = self._hoisted(sweep) if self.placement.hoists else ()
        once = {self.lowered.values[s.name]: emitter.emit(s.value) for s in self.hoisted}
        before = assigned_together(held) + [f"{name} = {value}" for name, value in once.items()]
        in_scope = [name for name, _ in held] + list(once)  # what `before` assigns, in order
        self.held = set(in_scope)
        lines = assigned_together([load for load in loads if load[0] in varying])
        pending = [c for c in sweep.carries if c.kind == "max"]
        emitted: set[str] = {s.name for s in self.hoisted}
        lets = {s.name: s for s in sweep.step}

        def ready(carry):
            return _lets_read(carry.value, lets) <= emitted

        def flush():
            for carry in [c for c in pending if ready(c)]:
                pending.remove(carry)
                self._prepare([carry.value], overrides, emitter, extra)
                expsum = ("expsum", carry.key[1])
                if expsum in self.fresh_terms and not isinstance(carry.value, ir.Name):
                    # The logits both the running max and exp(logits - max) read: computed once.
                    logits = self.namer.claim("logits")
                    lines.append(f"{logits} = {emitter.emit(carry.value)}")
                    overrides[carry.value] = logits
                lines.extend(
                    self._max_step(carry, names[carry.key], emitter, shift.get(carry.key), rescale.get(carry.key))
                )
                if expsum in self.fresh_terms:
                    value = emitter.cast(carry.value, "f32")
                    lines.append(f"{terms[expsum]} = {emitter.call('exp', f'{value} - {shift[carry.key]}')}")

        flush()
        for statement in sweep.step:
            if statement in self.hoisted:
                continue
            self._prepare([statement.value], overrides, emitter, extra)
            lines.append(f"{self.lowered.values[statement.name]} = {emitter.emit(statement.value)}")
            emitted.add(statement.name)
            flush()
        for carry in sweep.carries:
            if carry.kind == "max":
                continue
            roots = [carry.value] if carry.kind != "dot" else list(self._dot_roots(carry))
            self._prepare(roots, overrides, emitter, extra)
            scale = rescale[carry.scale.key] if carry.scale is not None else None
            lines.extend(self._step(carry, names[carry.key], emitter, scale, shift))

        finish = self._finish(sweep, names, store)
        skip = self._skip_condition(emitter)
        step_text = "\n".join(lines)
        carried = [name for name in in_scope if re.search(rf"\b{name}\b", step_text)]
        return FusedCode(tuple(running), tuple(lines), skip, tuple(finish), tuple(before), tuple(carried))

    def _hoisted(self, sweep) -> tuple[ir.Let, ...]:
        """The lets of a step computed once, before the pass: reductions of values that do
        not vary along it (attention's delta = sum(do * o, D)), and lets of those."""
        kernel = self.checked.kernel
        fixed = {d.name for d in kernel.inputs if sweep.dim not in d.dims} | {p.name for p in kernel.params}
        fixed |= set(self.checked.dims)  # a reduction's dimension
        special = {*sweep.results, *sweep.running, *sweep.softmaxes, *sweep.unfactored}
        found: list[ir.Let] = []
        for statement in sweep.step:
            nodes = list(ir.walk(statement.value))
            read = {n.id for n in nodes if isinstance(n, ir.Name)}
            done = {s.name for s in found}
            if sweep.dim in self.types[statement.value].dims or not read <= fixed | done:
                continue
            if any(n in special or _product(n) or _positional(n) for n in nodes):
                continue
            if read & done or any(isinstance(n, ir.Call) and FUNCTIONS[n.func].reducer for n in nodes):
                found.append(statement)
        return tuple(found)

    def _finish_statements(self, sweep, overrides) -> tuple[tuple[ir.Statement, ...], tuple[ir.Expr, ...]]:
        """The statements after the pass, but the lets computed before it, which are in
        scope: an output among them is stored by its name (set in `overrides`). And the
        nodes whose inputs need no load: the carries' and those."""
        hoisted = {s.name: self.lowered.values[s.name] for s in self.hoisted}
        outputs = {s.value: hoisted[s.target] for s in sweep.finish if named(s) in hoisted}
        overrides.update(outputs)
        statements = tuple(s for s in sweep.finish if not (isinstance(s, ir.Let) and s.name in hoisted))
        return statements, (*sweep.results, *outputs)

    def _carry_names(self, carry: Carry) -> list[str]:
        base = {"dot": "acc", "expsum": "sum_exp"}.get(carry.kind, carry.kind)
        base = f"{base}_{self.checked.sweep.dim.lower()}"
        return [self._claim(base if p is None else f"{base}_{p}") + self._suffix() for p in carried_parts(carry)]

    def _claim(self, wanted: str) -> str:
        """A running value's name."""
        return self.namer.claim(wanted)

    def _suffix(self) -> str:
        return "_ref" if isinstance(self.placement, RefPlacement) else ""

    def _value_dtype(self, carry: Carry):
        """The dtype the kernel holds a carry's values in (a TPU kernel holds f16 as f32)."""
        return self.emitter_for({}).kernel_dtype(carry.value) if carry.kind != "dot" else None

    def _running(self, carry: Carry, names: list[str]) -> list[Running]:
        dim = self.checked.sweep.dim
        if carry.kind == "dot":
            shape = self._shape(carry.node)
            tile = carried_tile(carry, self.fused, dim, self.blockwise)
            return [Running(names[0], shape, self._accumulate(carry.node), "0", f"the product over {dim}", tile)]
        axes = self.fused.frame[carry.value]
        tile = carried_tile(carry, self.fused, dim, self.blockwise)
        shape = tuple_code([self.extents[a] if a in tile else "1" for a in axes])
        shape = f"rt.rows_shape({self.extents[dim]})" if self.rows else shape
        if carry.kind == "expsum":
            return [Running(names[0], shape, F32, "0.0", f"the sum of exp(value - its running max) over {dim}", tile)]
        where = " at each position of a block (reduced after the last step)" if self.blockwise else ""
        return [
            Running(name, shape, acc.dtype, acc.initial, f"the running {carry.kind} over {dim}{where}", tile)
            for name, acc in zip(names, accumulators(carry.kind, self._value_dtype(carry), names))
        ]

    def _axis(self, node, dim) -> int:
        return self.fused.frame[node].index(dim)

    def _masked(self, name: str, value: str, node: ir.Expr, fill: str) -> list[str]:
        """`name = value`, with `fill` past the swept dimension's end on a ragged last block."""
        dim = self.checked.sweep.dim
        axis = self._axis(node, dim)
        size = self.lowered.sizes[dim]
        if self.rows:
            return [f"{name} = rt.fill_past_rows({value}, {self.start}, {size}, {fill}, ragged={self.ragged})"]
        return [f"{name} = rt.fill_past({value}, {self.start}, {size}, {axis}, {fill}, ragged={self.ragged})"]

    def _max_step(self, carry: Carry, names, emitter, shift, rescale) -> list[str]:
        """The running max after this block; where it rescales others, the shift a step
        subtracts (finite: 0 while every value so far is -inf) and the rescale factor."""
        (name,) = names
        dim = self.checked.sweep.dim
        block = self.namer.claim(f"{name.removesuffix('_ref')}_block")
        value = emitter.cast(carry.value, compute_dtype("max", self._value_dtype(carry)).name)
        lines = self._masked(block, value, carry.value, identity("max", self._value_dtype(carry)))
        top = block if self.blockwise else f"jnp.max({block}, axis={self._axis(carry.value, dim)}, keepdims=True)"
        if shift is None:
            return lines + [self.placement.write(name, f"jnp.maximum({self.placement.read(name)}, {top})")]
        previous = self.namer.claim(f"{name.removesuffix('_ref')}_previous")
        new = self.namer.claim(f"{name.removesuffix('_ref')}_new")
        return lines + [
            f"{previous} = {self.placement.read(name)}",
            f"{new} = jnp.maximum({previous}, {top})",
            f"{shift} = jnp.where({new} > -jnp.inf, {new}, 0.0)  # a row of -inf so far subtracts 0",
            f"{rescale} = {emitter.call('exp', f'{previous} - {shift}')}  # what the terms so far are worth now",
            self.placement.write(name, new),
        ]

    def _dot_roots(self, carry: Carry):
        product = self.fused.products[carry.node]
        return product.lhs, product.rhs

    def _step(self, carry: Carry, names, emitter, scale, shift) -> list[str]:
        dim = self.checked.sweep.dim
        read = [self.placement.read(n) for n in names]
        if carry.kind == "dot":
            product = self.fused.products[carry.node]
            lhs, rhs = self._operands(carry.node, emitter)
            base = names[0].removesuffix("_ref")
            lines, operands = [], []
            for side, code, node, axis in (
                ("lhs", lhs, product.lhs, product.lhs_contracts),
                ("rhs", rhs, product.rhs, product.rhs_contracts),
            ):
                filled = self._fill_operand(code, node, axis)
                if filled != code:  # a filled operand is named: the product reads it
                    operands.append(self.namer.claim(f"{base}_{side}"))
                    lines.append(f"{operands[-1]} = {filled}")
                else:
                    operands.append(code)
            term = self._product_term(product, *operands, self._accumulate(carry.node))
            kept = f"{scale} * {read[0]}" if scale else read[0]
            return lines + [self.placement.write(names[0], f"{kept} + {term}")]
        axis = self._axis(carry.value, dim)
        block = self.namer.claim(f"{names[0].removesuffix('_ref')}_block")
        if carry.kind == "expsum":
            lines = self._masked(block, self.terms[carry.key], carry.value, "0.0")
            term = f"jnp.sum({block}, axis={axis}, keepdims=True)"
            return lines + [self.placement.write(names[0], f"{scale} * {read[0]} + {term}")]
        kind, dtype = carry.kind, self._value_dtype(carry)
        computed = compute_dtype(kind, dtype)
        value = emitter.cast(carry.value, computed.name)
        lines = self._masked(block, value, carry.value, identity(kind, dtype))
        if scale:
            term = f"jnp.sum({block}, axis={axis}, keepdims=True)"
            return lines + [self.placement.write(names[0], f"{scale} * {read[0]} + {term}")]
        combined = combine_code(kind, read, block, axis, computed, self.start, self.blockwise)
        return lines + [self.placement.write_all(names, combined)]

    def _finish(self, sweep, names, store) -> list[str]:
        dim = self.checked.sweep.dim
        size = self.lowered.sizes[dim]
        lines: list[str] = []
        finals: dict[tuple, str] = {}
        for carry in sorted(sweep.carries, key=lambda c: bool(c.factors)):
            read = [self.placement.read(n) for n in names[carry.key]]
            if carry.kind in ("dot", "expsum"):
                value = read[0]
            else:
                value = finish_code(carry.kind, self._reduced(carry, read), self._value_dtype(carry), size)
            for op, factor in carry.factors:
                factor_code = finals[factor.key] if isinstance(factor, Carry) else None
                value = f"{value} {op} {factor_code}" if factor_code else value
            stem = names[carry.key][0].removesuffix("_ref")
            # A scratch Ref's value keeps the name its Ref was named after (claimed for it).
            single_ref = isinstance(self.placement, RefPlacement) and len(names[carry.key]) == 1
            if value in names[carry.key] and all(isinstance(f, Carry) for _, f in carry.factors):
                finals[carry.key] = value  # a carried value that is final as it is: no copy
                continue
            name = stem if single_ref else self.namer.claim(stem)
            lines.append(f"{name} = {value}")
            finals[carry.key] = name
        overrides: dict = {}
        for node, carry in sweep.results.items():
            if isinstance(node, ir.Call) and node.func == "logsumexp":
                top = finals[("max", carry.key[1])]
                overrides[node] = f"rt.logsumexp_finish({top}, {finals[carry.key]})"
            else:
                overrides[node] = finals[carry.key]
        statements, computed = self._finish_statements(sweep, overrides)
        emitter = self.emitter_for(overrides)
        self._prepare([s.value for s in statements], overrides, emitter)
        # Factors that are values of the last step (not carries) are applied here.
        for carry in sweep.carries:
            for op, factor in carry.factors:
                if not isinstance(factor, Carry):
                    self._prepare([factor], overrides, emitter)
                    lines.append(f"{finals[carry.key]} = {finals[carry.key]} {op} {emitter.emit(factor)}")
        factors = [f for c in sweep.carries for _, f in c.factors if not isinstance(f, Carry)]
        stores = self._store_all(statements, emitter, store)
        # A carry the end reads only through another (the max behind logsumexp) needs no line of its own.
        read = [line for line in [*lines, *stores]]
        lines = [
            line for line in lines if _assigned(line) not in finals.values() or _read_later(_assigned(line), line, read)
        ]
        loads = self._loads(statements, factors, skip=computed)
        return read_where_used([*loads, *lines, *stores])

    def _reduced(self, carry: Carry, read: list[str]) -> list[str]:
        """The running values `read` of a carry after the last step, `blockwise` ones reduced."""
        if not self.blockwise:
            return read
        if self.rows:
            return [rows_reduction(carry.kind, read[0])]
        return [block_reduction(carry.kind, read[0], self._axis(carry.value, self.checked.sweep.dim))]

    def _skip_condition(self, emitter, starts=None) -> str | None:
        skip = self.checked.sweep.skip
        if skip is None:
            return None
        return _Bounds(self, emitter, starts or self.spelling.starts).possible(skip.condition)

    def live_block(self, starts: dict[str, str]) -> str | None:
        """Whether the block whose dimensions start at `starts` adds anything (None: every
        block does): what a backend's index maps read to fetch no block it skips."""
        return self._skip_condition(self.emitter_for({}), starts)

    def whole_block(self) -> str | None:
        """Whether the skip's condition holds at every position of the step's block (None:
        no skip), so that no position of it is masked."""
        skip = self.checked.sweep.skip
        if skip is None:
            return None
        return _Bounds(self, self.emitter_for({}), self.spelling.starts).certain(skip.condition)


def used_starts(lines: list[str], starts: list[str]) -> list[str]:
    """The lines `name = ...` of `starts` whose name some line of `lines` reads."""
    text = "\n".join(lines)
    return [line for line in starts if re.search(rf"\b{re.escape(line.split(' = ')[0])}\b", text)]


def _product(node: ir.Expr) -> bool:
    return isinstance(node, ir.Binary) and node.op == "@"


def _positional(node: ir.Expr) -> bool:
    return isinstance(node, ir.Call) and node.func in ("index", "size")


def _lets_read(node: ir.Expr, lets) -> set[str]:
    return {n.id for n in ir.walk(node) if isinstance(n, ir.Name) and n.id in lets}


def _assigned(line: str) -> str:
    return line.split(" = ")[0]


def _read_later(name: str, line: str, lines: list[str]) -> bool:
    """Whether a line other than `line` reads `name`."""
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(pattern.search(other) for other in lines if other is not line)


def _grouped(code: str) -> str:
    """`code` in parentheses where a sum in it would otherwise bind wrongly."""
    return f"({code})" if " + " in code or " - " in code else code


# A comparison of two values over a block, each known to lie in a range (low_a to
# high_a, low_b to high_b): true at some position of the block (_POSSIBLE), or at every
# position (_CERTAIN).
_POSSIBLE = {
    ">=": "{high_a} >= {low_b}",
    ">": "{high_a} > {low_b}",
    "<=": "{low_a} <= {high_b}",
    "<": "{low_a} < {high_b}",
    "==": "({low_a} <= {high_b}) & ({low_b} <= {high_a})",
}
_CERTAIN = {
    ">=": "{low_a} >= {high_b}",
    ">": "{low_a} > {high_b}",
    "<=": "{high_a} <= {low_b}",
    "<": "{high_a} < {low_b}",
    "==": "({low_a} == {high_a}) & ({low_b} == {high_b}) & ({low_a} == {low_b})",
}


class _Bounds:
    """The least and greatest value an expression of positions takes over a block, as
    code: whether a comparison can hold anywhere in the block."""

    def __init__(self, lowering: FusedLowering, emitter, starts):
        self.lowering, self.emitter, self.starts = lowering, emitter, starts
        self.lets = {s.name: s.value for s in lowering.checked.kernel.body if isinstance(s, ir.Let)}

    def possible(self, node: ir.Expr) -> str:
        return self._bound(node, _POSSIBLE, "True")

    def certain(self, node: ir.Expr) -> str:
        """Code true only where a condition holds at every position of the block."""
        return self._bound(node, _CERTAIN, "False")

    def _bound(self, node: ir.Expr, comparisons: dict[str, str], unknown: str) -> str:
        """The condition over the block's ranges of positions, each comparison by its rule
        in `comparisons`; `unknown` where a side's range is not known."""
        while isinstance(node, ir.Name) and node.id in self.lets:
            node = self.lets[node.id]
        if isinstance(node, ir.Binary) and node.op in ("&", "|"):
            left, right = (self._bound(side, comparisons, unknown) for side in (node.left, node.right))
            return f"({left}) {node.op} ({right})"
        if isinstance(node, ir.Binary) and node.op in comparisons:
            if self.range(node.left) is None or self.range(node.right) is None:
                return unknown
            (low_a, high_a), (low_b, high_b) = self.range(node.left), self.range(node.right)
            return comparisons[node.op].format(low_a=low_a, high_a=high_a, low_b=low_b, high_b=high_b)
        return unknown

    def range(self, node: ir.Expr) -> tuple[str, str] | None:
        """(least, greatest) as code, or None where this cannot bound it."""
        while isinstance(node, ir.Name) and node.id in self.lets:
            node = self.lets[node.id]
        if isinstance(node, ir.Call) and node.func == "index":
            dim = node.args[0].id
            spelling = self.lowering.spelling
            start = self.starts.get(dim) or "0"
            if dim in spelling.batch:
                return start, start
            return start, f"{start} + {spelling.extents[dim]} - 1"
        if isinstance(node, ir.Binary) and node.op in ("+", "-"):
            if self.range(node.left) is None or self.range(node.right) is None:
                return None
            (la, ha), (lb, hb) = self.range(node.left), self.range(node.right)
            if node.op == "+":
                return f"{la} + {lb}", f"{ha} + {hb}"
            return f"{la} - {_grouped(hb)}", f"{ha} - {_grouped(lb)}"
        if isinstance(node, ir.Unary) and node.op == "-":
            inner = self.range(node.operand)
            return None if inner is None else (f"-{_grouped(inner[1])}", f"-{_grouped(inner[0])}")
        if isinstance(node, ir.Call) and FUNCTIONS[node.func].typing == "cast":
            return self.range(node.args[0])
        if any(isinstance(n, ir.Call) and n.func == "index" for n in ir.walk(node)):
            return None
        code = self.emitter.emit(node)
        return code, code
