"""Pieces that every backend's plan of a kernel shares."""

from __future__ import annotations

import re
from collections import Counter

from pallasgen.frontend import ir
from pallasgen.analysis.infer import product_operand
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.lowering.pyexpr import Emitter

# Black's line length for generated code (the project's own); every width a plan wraps
# comments and docstrings to, or fits code into, is counted back from it.
LINE_LENGTH = 120


def assigned_together(pairs: list[tuple[str, str]], width: int = LINE_LENGTH - 16) -> list[str]:
    """`name = value` for each (name, value), consecutive ones in one tuple assignment
    (`x, y = x_ref[...], y_ref[...]`) while its line fits `width`: for values that read
    none of the names, as loads do."""
    lines, group = [], []
    for pair in [*pairs, None]:
        joined = group + [pair] if pair else group
        text = f"{', '.join(n for n, _ in joined)} = {', '.join(v for _, v in joined)}"
        if pair and (not group or len(text) <= width):
            group = joined
            continue
        if group:
            lines.append(f"{', '.join(n for n, _ in group)} = {', '.join(v for _, v in group)}")
        group = [pair]
    return lines


def unpacked_results(running: list[str], finishes: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """The target that unpacks a loop's `running` values, and the lines that finish each
    (result, code) of `finishes`: a result whose code is one of the running values is
    unpacked into its own name (no `sum_n = sum_n_running`; a second result of the same
    value is assigned the first), and the others it leaves out are `_`."""
    direct: dict[str, str] = {}
    lines = []
    for result, code in finishes:
        if code in running and code not in direct:
            direct[code] = result
        else:
            lines.append(f"{result} = {direct.get(code, code)}")
    read = " ".join(line.split(" = ", 1)[1] for line in lines)
    targets = [direct.get(name, name if re.search(rf"\b{name}\b", read) else "_") for name in running]
    return ", ".join(targets) + ("," if len(targets) == 1 else ""), lines


def read_where_used(lines: list[str]) -> list[str]:
    """`lines` with a running value read from its Ref (`acc = acc_ref[...]`) and used only
    by the next line read there instead (`z_ref[...] = acc_ref[...]`): the same reads in
    the same order."""
    found: list[str] = []
    for line in lines:
        if found:
            name, _, value = found[-1].partition(" = ")
            pattern = re.compile(rf"\b{re.escape(name)}\b")
            later = lines[len(found) :]
            if re.fullmatch(r"\w+_ref\[\.\.\.\]", value) and sum(len(pattern.findall(x)) for x in later) == 1:
                if pattern.search(line):
                    found[-1] = pattern.sub(lambda _: value, line)
                    continue
        found.append(line)
    return found


def written_specs(specs: tuple[tuple[str, str], ...]) -> tuple[tuple[tuple[str, str], ...], int]:
    """(comment, code) pairs as a list or tuple of them writes them, and a count: where
    every entry is the same, one pair whose comment names them all, `count` times; else
    each run of n alike as one pair `*[code] * n`, its comment naming the run."""
    runs: list[list] = []
    for comment, code in specs:
        if runs and runs[-1][1] == code:
            runs[-1][0].append(comment)
        else:
            runs.append([[comment], code])
    if len(runs) == 1 and len(specs) > 1:
        return ((_joined_comment(runs[0][0]), runs[0][1]),), len(specs)
    return (
        tuple((_joined_comment(c), code if len(c) == 1 else f"*[{code}] * {len(c)}") for c, code in runs),
        1,
    )


class WrittenSpecs:
    """A launcher plan's in_specs, out_specs and out_shape as its template writes them
    (written_specs): from its `in_specs` and `out_specs`, (comment, BlockSpec) pairs,
    and its `out_shapes`, (jax.ShapeDtypeStruct, output name) pairs."""

    @property
    def written_in_specs(self) -> tuple[tuple[tuple[str, str], ...], int]:
        return written_specs(self.in_specs)

    @property
    def written_out_specs(self) -> tuple[tuple[tuple[str, str], ...], int]:
        return written_specs(self.out_specs)

    @property
    def written_out_shapes(self) -> tuple[tuple[tuple[str, str], ...], int]:
        return written_specs(tuple((name, shape) for shape, name in self.out_shapes))


def _joined_comment(comments: list[str]) -> str:
    """One comment for several arrays alike: `x, y: f32[N]` from `x: f32[N]` and `y: f32[N]`."""
    names, rests = zip(*(comment.partition(": ")[::2] for comment in comments))
    if len(set(rests)) == 1:
        return f"{', '.join(names)}: {rests[0]}" if rests[0] else ", ".join(names)
    return "; ".join(comments)


def tuple_code(items) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def parameter_list(positional: list[str], keyword_only: list[str]) -> str:
    """`a, b, *, c, d`: a function's parameters, keyword-only ones after `*`."""
    return ", ".join([*positional, *(["*", *keyword_only] if keyword_only else [])])


def kernel_signature(refs: list[str], scratch: list[str], keywords: list[str]) -> tuple[str, tuple[str, ...]]:
    """A kernel's parameters and the lines its body opens with. Its scratch refs come last:
    named in the signature, or, where naming each would take a line apiece (black writes
    parameters that do not fit one line one to a line: an attention kernel's 27),
    gathered by `*scratch` and unpacked by the body's first line. The choice does not
    depend on the kernel's name, so that kernels alike but for their names stay alike."""
    named = parameter_list([*refs, *scratch], keywords)
    fits = 4 + len(named) + 1 <= LINE_LENGTH  # a line of their own: indented, maybe a comma added
    if len(scratch) < 2 or fits or "scratch" in {*refs, *scratch, *keywords}:  # a spec's param may be named so
        return named, ()
    return ", ".join([*refs, "*scratch", *keywords]), (f"{', '.join(scratch)} = scratch",)


def partial_call(function: str, keywords: list[str]) -> str:
    """`function`, or `functools.partial(function, k=k, ...)` binding the given names."""
    if not keywords:
        return function
    return f"functools.partial({function}, {', '.join(f'{name}={name}' for name in keywords)})"


def ref_load(refs):
    return lambda decl: f"{refs[decl.name]}[...]"


def ref_store(refs, residuals=frozenset()):
    """An output's store into its Ref; a residual's (of `residuals`, spec names) only where
    the launcher asked for the residuals (`saved_only`)."""

    def store(decl, value):
        line = f"{refs[decl.name]}[...] = {value}"
        return saved_only(refs[decl.name], line) if decl.name in residuals else line

    return store


def saved_only(ref: str, line: str) -> str:
    """`line`, which writes a residual's Ref, where the launcher passed one: a launcher
    passes None for each residual unless its `residuals` keyword asks for them (the
    forward pass under jax.grad). One line: black breaks it after the colon."""
    return f"if {ref} is not None: {line}"


def if_residuals(code: str, array) -> str:
    """A launcher's `code` for an output (its BlockSpec, its shape): None for a residual
    (an ArrayPlan's `residual`) unless the launcher's `residuals` keyword asks for it."""
    return f"{code} if residuals else None" if array.residual else code


def contracted_inputs(checked: CheckedKernel) -> dict[str, bool]:
    """The inputs read only as products' operands, each with whether a product reads it
    transposed (`x.T`): kernels block them as declared, and the reference contracts them so."""
    nodes = list(ir.walk(*(s.value for s in checked.kernel.body)))  # a value read twice is walked twice
    read: dict[str, list[bool]] = {}
    for node in nodes:
        if isinstance(node, ir.Binary) and node.op == "@":
            for side in (node.left, node.right):
                value, transposed = product_operand(side)
                if isinstance(value, ir.Name):
                    read.setdefault(value.id, []).append(transposed)
    uses = Counter(n.id for n in nodes if isinstance(n, ir.Name))
    inputs = {d.name for d in checked.kernel.inputs}
    return {name: any(t) for name, t in read.items() if name in inputs and uses[name] == len(t)}


def load_statements(kernel, values, checked, load, only=None) -> list[str]:
    """Loads of the inputs the body uses (of those in `only`, if given), operands aside."""
    used = used_names(kernel)
    operands = set(contracted_inputs(checked))
    wanted = [d for d in kernel.inputs if d.name in used - operands and (only is None or d.name in only)]
    return assigned_together([(values[d.name], load(d)) for d in wanted])


def body_statements(kernel, statements, emitter: Emitter, values, refs, checked, store, shape_of=None) -> list[str]:
    """`statements` of the body in order: lets, and each output's value, converted or
    broadcast to its block, and stored by `store(decl, value)`; with no `store` (the
    reference), each output is a value broadcast to `shape_of(decl)`."""
    used = used_names(kernel)
    outputs = {o.name: o for o in kernel.outputs}
    body = []
    for statement in statements:
        if isinstance(statement, ir.Let):
            body.append(f"{values[statement.name]} = {emitter.emit(statement.value)}")
            continue
        out = outputs[statement.target]
        value_type = checked.types[statement.value]
        if value_type.dims == out.dims:
            value = emitter.cast(statement.value, out.dtype)
        else:
            shape = shape_of(out) if shape_of else f"{refs[out.name]}.shape"
            value = broadcast(emitter, statement.value, value_type, out.dtype, shape)
        if store is None:
            body.append(f"{values[out.name]} = {value}")
        elif out.name in used:
            computed = [] if value == values[out.name] else [f"{values[out.name]} = {value}"]  # else in scope
            body += [*computed, store(out, values[out.name])]
        else:
            body.append(store(out, value))
    return body


def broadcast(emitter: Emitter, node: ir.Expr, value_type, dtype: str, shape: str) -> str:
    """A value with fewer dimensions than its output, filled out to `shape`."""
    if not value_type.dims:
        return f"jnp.full({shape}, {emitter.emit(node)}, {emitter.dtype(dtype)})"
    return f"jnp.broadcast_to({emitter.cast(node, dtype)}, {shape})"


def used_names(kernel: ir.Kernel) -> set[str]:
    return {node.id for node in ir.walk(*(s.value for s in kernel.body)) if isinstance(node, ir.Name)}


def array_comment(decl: ir.ArrayDecl, contracted: dict[str, bool]) -> str:
    """`x: f32[M, N]`, and `, read transposed` where a product reads it so (`contracted`:
    the inputs read only as products' operands, each with whether one reads it transposed)."""
    return f"{decl.name}: {decl.dtype}[{', '.join(decl.dims)}]" + (
        ", read transposed" if contracted.get(decl.name) else ""
    )
