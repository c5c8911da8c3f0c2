"""How `jax.grad` differentiates each kernel: backward kernels derived from its spec,
checked like any kernel, and the forward values its forward pass saves for them.

A derivation (`DERIVATIONS`, the first that takes the kernel) gives the backward
kernels as `ir.Kernel`s in call order (gradients.backward). Where they read forward
values that are neither inputs nor outputs (residuals: a product's accumulator, a
row's log-sum-exp), the kernel's launchers are planned from a kernel derived here: the
kernel with the residuals as extra outputs (`launched`), which they write only when the
forward pass under `jax.grad` asks; or, where that kernel carries more than the kernel
does, it is a kernel of its own, NAME_with_residuals (`saved_apart`). Every derived kernel goes through the same checks,
lowering and backends as any other, and its nodes keep the positions of the forward
nodes they come from, so its diagnostics point at the spec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pallasgen.gradients import (
    attention as attention_gradients,
    fused as fused_gradients,
    products as product_gradients,
    reverse,
)
from pallasgen.gradients.backward import Argument, Residual, Step, is_float
from pallasgen.analysis.checks import CheckedKernel, Diagnostics, check_kernel
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic

# Each takes a checked kernel and gives its `Derived` backward kernels, what it has that
# none is generated for yet (a str), or None where it does not take that kernel.
DERIVATIONS = (attention_gradients.derive, fused_gradients.derive, product_gradients.derive, reverse.derive)


@dataclass(frozen=True)
class BackwardKernel:
    checked: CheckedKernel
    arguments: tuple[Argument, ...]  # its inputs, in order
    params: tuple[str, ...]  # the forward params it reads
    results: tuple[str, ...]  # what its outputs are, in order (gradients.backward.Step)


@dataclass(frozen=True)
class Gradient:
    """How `jax.grad` differentiates a kernel: by its backward kernels (none where no float
    input reaches a float output: then every cotangent is zero, or float0), or not at all:
    where the spec says `grad none`, or where they are `not_yet` generated."""

    kernels: tuple[BackwardKernel, ...] = ()
    saving: CheckedKernel | None = None  # the kernel with its outputs, then the residuals (`launched`)
    residuals: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()  # the forward values the backward kernels recompute
    turned_off: ir.GradNone | None = None
    not_yet: str | None = None  # what the kernel has that no backward kernel is generated for yet
    passed: tuple[tuple[str, str], ...] = ()  # (input, output): the output's cotangent is the input's, as it is

    @property
    def results(self) -> frozenset[str]:
        """What the backward kernels' outputs are: forward inputs' cotangents, and values
        that later backward kernels read (gradients.backward.Step)."""
        return frozenset(name for k in self.kernels for name in k.results)


def with_gradients(kernels: tuple[CheckedKernel, ...], backends=()) -> tuple[CheckedKernel, ...]:
    """The kernels, each with its `gradient`; raises `Diagnostics` if a backward kernel
    fails a check or takes another kernel's name."""
    names = {k.kernel.name: k.kernel for k in kernels}
    found: list[Diagnostic] = []
    result = []
    for checked in kernels:
        gradient, problems = differentiate(checked, backends, names)
        found.extend(problems)
        result.append(dataclasses.replace(checked, gradient=gradient))
    if found:
        raise Diagnostics(found)
    return tuple(result)


def every_kernel(kernels: tuple[CheckedKernel, ...]) -> tuple[CheckedKernel, ...]:
    """All that a module of `kernels` defines: each kernel, after the kernel that saves its
    residuals where that is apart (`saved_apart`, which its public function names), and
    before its backward kernels."""
    return tuple(k for checked in kernels for k in _with_derived_kernels(checked))


def _with_derived_kernels(checked: CheckedKernel) -> tuple[CheckedKernel, ...]:
    gradient = checked.gradient
    if not gradient:
        return (checked,)
    apart = (gradient.saving,) if saved_apart(checked) else ()
    return (*apart, checked, *(k.checked for k in gradient.kernels))


def saved_apart(checked: CheckedKernel) -> bool:
    """Whether the kernel that saves its residuals is a kernel of its own, NAME_with_residuals:
    where it carries more across its sweep than the kernel does (an argmax beside a max:
    a plain call would carry that too, and might lose a faster layout)."""
    saving = checked.gradient.saving if checked.gradient else None
    if saving is None or saving.sweep is None:
        return False
    return checked.sweep is None or len(saving.sweep.carries) > len(checked.sweep.carries)


def launched(checked: CheckedKernel) -> tuple[CheckedKernel, int]:
    """What a kernel's launchers run, and how many of its last outputs are residuals: the
    kernel that saves its residuals too, under the kernel's own name and tuned blocks
    (its launchers write them only when asked), or the kernel itself and 0 (it saves
    none, or saves them apart: `saved_apart`)."""
    saving = checked.gradient.saving if checked.gradient else None
    if saving is None or saved_apart(checked):
        return checked, 0
    kernel = dataclasses.replace(saving.kernel, name=checked.kernel.name, doc=checked.kernel.doc)
    residuals = len(saving.kernel.outputs) - len(checked.kernel.outputs)
    return dataclasses.replace(saving, kernel=kernel, tuned=checked.tuned), residuals


def differentiate(checked: CheckedKernel, backends, taken: dict[str, ir.Kernel]) -> tuple[Gradient, list]:
    """The kernel's gradient and the diagnostics of its derived kernels."""
    kernel = checked.kernel
    if kernel.grad_none:
        return Gradient(turned_off=kernel.grad_none[0]), []
    if not any(is_float(d) for d in kernel.inputs) or not any(is_float(d) for d in kernel.outputs):
        return Gradient(), []
    derived = next(d for d in (derive(checked) for derive in DERIVATIONS) if d is not None)
    if isinstance(derived, str):
        return Gradient(not_yet=derived), []
    forward = {d.name for d in kernel.inputs}
    steps = _read(derived.steps, forward)
    read = {a for step in steps for a in step.arguments}
    residuals = tuple(r for r in derived.residuals if Argument(r.name, "residual") in read)
    copies = [(step, _passed_on(step, forward)) for step in steps]
    passed = tuple(pair for _, pairs in copies for pair in pairs)
    derived = dataclasses.replace(
        derived, steps=tuple(step for step, pairs in copies if not pairs), residuals=residuals
    )
    derived_kernels = [step.kernel for step in derived.steps]
    if derived.residuals:
        derived_kernels.insert(0, _saving_kernel(checked, derived.residuals))
    found = [_name_taken(kernel.name, k.name, taken) for k in derived_kernels if k.name in taken]
    if found:
        return Gradient(), found
    checked_kernels = {}
    for derived_kernel in derived_kernels:
        derived_checked, problems = check_kernel(derived_kernel, backends)
        found.extend(
            Diagnostic(
                p.position,
                f"in the kernel '{derived_kernel.name}' derived for jax.grad (`grad none` turns it off): {p.message}",
            )
            for p in problems
        )
        checked_kernels[derived_kernel.name] = derived_checked
    if found:
        return Gradient(), found
    backward = tuple(
        BackwardKernel(
            checked_kernels[step.kernel.name],
            step.arguments,
            tuple(p.name for p in step.kernel.params),
            step.results,
        )
        for step in derived.steps
    )
    saving = checked_kernels[derived_kernels[0].name] if derived.residuals else None
    residuals = tuple(r.name for r in derived.residuals)
    return Gradient(backward, saving, residuals, derived.recomputed, passed=passed), []


def _read(steps: tuple[Step, ...], forward: set[str]) -> list[Step]:
    """The steps that give a forward input's cotangent or what a later step reads: not the
    cotangent of a value no input's depends on (an integer weight's `bf16(w)`)."""
    wanted, kept = set(forward), []
    for step in reversed(steps):
        if wanted & set(step.results):
            kept.insert(0, step)
            wanted |= {a.name for a in step.arguments if a.source == "backward"}
    return kept


def _passed_on(step: Step, forward: set[str]) -> tuple[tuple[str, str], ...]:
    """Where a backward kernel would copy cotangents and nothing else (`add`'s: dx = dz,
    dy = dz), each (forward input, forward output) whose cotangent the input's is, as
    it is: no kernel is needed. Empty where it computes anything, casts or broadcasts, or
    gives a value that a later backward kernel reads (not one of the `forward` inputs')."""
    kernel = step.kernel
    if not set(step.results) <= forward:
        return ()
    inputs = {d.name: (d, a) for d, a in zip(kernel.inputs, step.arguments)}
    outputs = {d.name: (d, result) for d, result in zip(kernel.outputs, step.results)}
    passed = []
    for statement in kernel.body:
        if not (isinstance(statement, ir.Assign) and isinstance(statement.value, ir.Name)):
            return ()
        decl, argument = inputs.get(statement.value.id, (None, None))
        out, result = outputs[statement.target]
        if argument is None or argument.source != "cotangent" or (decl.dtype, decl.dims) != (out.dtype, out.dims):
            return ()
        passed.append((result, argument.name))
    return tuple(passed)


def _name_taken(forward: str, name: str, taken: dict[str, ir.Kernel]) -> Diagnostic:
    return Diagnostic(
        taken[name].position,
        f"'{name}' is the name of a kernel derived from '{forward}' for jax.grad;"
        f" rename this kernel, or say `grad none` in '{forward}'",
    )


def _saving_kernel(checked: CheckedKernel, residuals: tuple[Residual, ...]) -> ir.Kernel:
    """`NAME_with_residuals`: the kernel, with each residual an output besides its own.
    A residual that is a let is assigned from it; a value of the body becomes an output
    assigned where its statement computes it, read from there on by its name; any other
    is assigned last."""
    kernel = checked.kernel
    body = list(kernel.body)
    lets = {s.name: s.value for s in kernel.body if isinstance(s, ir.Let)}
    outputs = []
    for residual in residuals:
        position = residual.value.position
        is_let = isinstance(residual.value, ir.Name) and residual.value.id in lets
        if residual.dtype:
            dtype, dims = residual.dtype, residual.dims
        else:
            value_type = checked.types[lets[residual.value.id] if is_let else residual.value]
            dtype, dims = value_type.dtype.name, value_type.dims
        outputs.append(ir.ArrayDecl(residual.name, dtype, dims, position, position, (position,) * len(dims)))
        assign = ir.Assign(residual.name, residual.value, position)
        if is_let:
            at = next(i for i, s in enumerate(body) if isinstance(s, ir.Let) and s.name == residual.value.id)
            body.insert(at + 1, assign)
            continue
        at = next((i for i, s in enumerate(body) if residual.value in ir.walk(s.value)), None)
        if at is None:  # a value the body does not compute: computed last
            body.append(assign)
            continue
        name = ir.Name(residual.name, position)
        body[at:] = [reverse.replaced(s, {residual.value: name}) for s in body[at:]]
        body.insert(at, assign)
    doc = (
        f"`{kernel.name}` as `jax.grad` runs it forward: its outputs, then what its",
        f"backward kernels read that it does not output ({', '.join(r.name for r in residuals)}).",
    )
    return dataclasses.replace(
        kernel,
        name=f"{kernel.name}_with_residuals",
        doc=doc,
        outputs=(*kernel.outputs, *outputs),
        body=tuple(body),
        grad_none=(),
    )
