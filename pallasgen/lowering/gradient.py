"""How a generated kernel is differentiated: its public function (`rt.kernel`) runs the
forward kernel as a `jax.custom_vjp` whose backward pass is `_NAME_vjp`, which calls the
kernel's backward kernels (gradients.derive). Where they read the kernel's outputs or
residuals, the forward pass under jax.grad saves them (`saves`), its launchers writing
the residuals too (or NAME_with_residuals, where that is apart). Keywords and params stay static: they are bound, not
differentiated."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.gradients.derive import Gradient, saved_apart
from pallasgen.analysis.names import Namer
from pallasgen.lowering.parts import LINE_LENGTH, parameter_list

DOC_WIDTH = LINE_LENGTH - 12  # a docstring's lines, indented by 4, with room to spare


@dataclass(frozen=True)
class BackwardCall:
    results: str  # what the call is assigned to: `dx` or `dx, dy`
    function: str  # the backward kernel's public function
    arguments: str


@dataclass(frozen=True)
class GradientPlan:
    vjp_function: str  # the backward pass
    vjp_parameters: str
    doc: tuple[str, ...]  # what the forward pass saves and what the backward recomputes
    public_doc: tuple[str, ...]  # the lines the public function's docstring adds
    saves: tuple[str, ...]  # the spec names of what the forward pass saves (none: its inputs)
    saving: str | None  # the kernel that writes the residuals saved, where it is apart (NAME_with_residuals)
    calls: tuple[BackwardCall, ...]
    returns: str  # the inputs' cotangents (None: none, as integer inputs have)
    refusal: tuple[str, tuple[str, ...]] | None  # the error jax.grad raises, if any: its type, its message in pieces
    # every cotangent zero (no float input reaches a float output): `rt.no_cotangents` is the backward pass
    zeros: bool = False


def vjp_function_name(kernel: str) -> str:
    """The module-level function that differentiating a kernel adds: its backward pass."""
    return f"_{kernel}_vjp"


def plan_gradient(
    checked: CheckedKernel,
    values: dict[str, str],
    spec_path: str,
    taken: frozenset[str],
    passed_on: tuple[str, ...] = (),
) -> GradientPlan | None:
    """The plan of a kernel's differentiation; None where it has no `gradient`.

    `values` are the Python names of its arrays; `taken`: module-level names;
    `passed_on`: keywords (beside `interpret`) that the backward kernels take from the call.
    """
    gradient: Gradient | None = checked.gradient
    if gradient is None:
        return None
    kernel = checked.kernel
    vjp_function = vjp_function_name(kernel.name)
    arrays = [values[d.name] for d in kernel.inputs]
    refusal = _refusal(kernel.name, gradient, spec_path)
    params = list(dict.fromkeys(p for k in gradient.kernels for p in k.params))
    vjp_keywords = [*params, *passed_on, "interpret"] if refusal is None else []
    # The backward pass's own names: the arrays it unpacks and the cotangents, off the
    # backward kernels it calls and its parameters.
    namer = Namer(taken | {k.checked.kernel.name for k in gradient.kernels} | {*vjp_keywords})
    read = {(a.name, a.source) for k in gradient.kernels for a in k.arguments}
    names = {
        **{(d.name, "input"): namer.claim_spec(values[d.name]) for d in kernel.inputs},
        **{(o.name, "output"): namer.claim_spec(values[o.name]) for o in kernel.outputs if (o.name, "output") in read},
        **{(r, "residual"): namer.claim_spec(r) for r in gradient.residuals},
        **{(o.name, "cotangent"): namer.claim(f"d{o.name}") for o in kernel.outputs},
    }
    inputs = {d.name for d in kernel.inputs}
    results = {d.name: namer.claim(f"d{d.name}") for d in kernel.inputs if d.name in gradient.results}
    results |= {input: names[(output, "cotangent")] for input, output in gradient.passed}
    for backward in gradient.kernels:
        names.update({(r, "backward"): namer.claim_spec(r) for r in backward.results if r not in inputs})
    calls = []
    for backward in gradient.kernels:
        arguments = [names[(a.name, a.source)] for a in backward.arguments]
        calls.append(
            BackwardCall(
                ", ".join(results[r] if r in inputs else names[(r, "backward")] for r in backward.results),
                backward.checked.kernel.name,
                ", ".join([*arguments, *(f"{k}={k}" for k in (*backward.params, *passed_on, "interpret"))]),
            )
        )
    saved_keys = [
        *((d.name, "input") for d in kernel.inputs),
        *((o.name, "output") for o in kernel.outputs),
        *((r, "residual") for r in gradient.residuals),
    ]
    if any(source in ("output", "residual") for _, source in read):
        kept = [key for key in saved_keys if key in read]
        saves = tuple(name for name, _ in kept)
    else:  # the forward pass saves its inputs, read or not
        kept, saves = [(d.name, "input") for d in kernel.inputs], ()
    cotangents = [names[(o.name, "cotangent")] for o in kernel.outputs]
    # jax.grad's backward pass takes what the forward pass saved, then the outputs' cotangents
    parameters = ["*saved_and_cotangents"] if refusal else [*(names[key] for key in kept), *cotangents]
    return GradientPlan(
        vjp_function=vjp_function,
        vjp_parameters=parameter_list(parameters, vjp_keywords),
        doc=_doc(checked, gradient),
        public_doc=_public_doc(gradient, vjp_function),
        saves=saves,
        saving=gradient.saving.kernel.name if saves and saved_apart(checked) else None,
        calls=tuple(calls),
        returns=", ".join(results.get(d.name, "None") for d in kernel.inputs) + ("," if len(arrays) == 1 else ""),
        refusal=refusal,
        zeros=refusal is None and not gradient.kernels and not gradient.passed,
    )


def _refusal(name: str, gradient: Gradient, spec_path: str) -> tuple[str, tuple[str, ...]] | None:
    """The error that jax.grad of a kernel raises, if it is not differentiable: its type,
    and its message in pieces of a line each."""
    if gradient.turned_off is not None:
        where = f"{spec_path}:{gradient.turned_off.position.line}"
        error, text = (
            "TypeError",
            f"{name} is not differentiable: its spec turns gradients off (`grad none` at {where})",
        )
    elif gradient.not_yet is not None:
        error, text = "NotImplementedError", (
            f"{name} ({spec_path}) is not differentiable: its spec has {gradient.not_yet},"
            " for which pallasgen generates no backward kernels yet"
        )
    else:
        return None
    # a piece a line, indented by 8 and quoted: black then keeps each on its own line
    lines = textwrap.wrap(text, LINE_LENGTH - 11)
    return error, tuple(line + " " for line in lines[:-1]) + (lines[-1],)


def _public_doc(gradient: Gradient, vjp_function: str) -> tuple[str, ...]:
    """What the public function's docstring says of its gradient."""
    if gradient.turned_off is not None:
        text = "Gradients: none; its spec says `grad none`, and jax.grad of it raises a TypeError."
    elif gradient.not_yet is not None:
        text = f"Gradients: not generated yet for {gradient.not_yet}: jax.grad of it raises NotImplementedError."
    elif gradient.kernels:
        kernels = ", ".join(k.checked.kernel.name for k in gradient.kernels)
        text = f"Gradients: jax.grad runs the generated backward kernels {kernels} ({vjp_function})."
        text += f" It passes {_passed(gradient)} as it is: the derivative is 1." if gradient.passed else ""
    elif gradient.passed:
        text = f"Gradients: jax.grad passes {_passed(gradient)}, with no backward kernel: the derivative is 1."
    else:
        text = "Gradients: zeros (float0 for integer inputs), with no backward kernel: no float input reaches a float output."
    return ("", *textwrap.wrap(text, DOC_WIDTH))


def _passed(gradient: Gradient) -> str:
    """The cotangents the backward pass passes on as they are: `z's cotangent on as x's and y's`."""
    said = []
    for output in dict.fromkeys(output for _, output in gradient.passed):
        inputs = [f"{i}'s" for i, o in gradient.passed if o == output]
        listed = inputs[0] if len(inputs) == 1 else f"{', '.join(inputs[:-1])} and {inputs[-1]}"
        said.append(f"{output}'s cotangent on as {listed}")
    return "; ".join(said)


def _doc(checked: CheckedKernel, gradient: Gradient) -> tuple[str, ...]:
    """The backward pass's docstring: what it runs, what the forward pass saves for it and
    what it computes again."""
    kernel = checked.kernel
    if gradient.turned_off is not None:
        return (f"`{kernel.name}` has no backward pass: its spec says `grad none`.",)
    if gradient.not_yet is not None:
        return (f"`{kernel.name}` has no backward pass yet: none is generated for {gradient.not_yet}.",)
    if not gradient.kernels and gradient.passed:
        text = f"`{kernel.name}`'s backward pass, for jax.grad: it passes {_passed(gradient)}, with no backward kernel."
        return tuple(textwrap.wrap(text + " The derivative is 1.", DOC_WIDTH))
    if not gradient.kernels:
        text = (
            f"The cotangents of `{kernel.name}`'s inputs, for jax.grad: none (zeros, or float0 for integer"
            " inputs), since no float input reaches a float output."
        )
        return tuple(textwrap.wrap(text, DOC_WIDTH))
    inputs = ", ".join(d.name for d in kernel.inputs)
    integers = [d.name for d in kernel.inputs if not DTYPES[d.dtype].is_float]
    read = {(a.name, a.source) for k in gradient.kernels for a in k.arguments}
    outputs = [o.name for o in kernel.outputs if (o.name, "output") in read]
    saved = [
        f"its input{'s' * (len(kernel.inputs) > 1)} {inputs}",
        *([f"its outputs {', '.join(outputs)}"] if outputs else []),
        *([f"the residuals {', '.join(gradient.residuals)}"] if gradient.residuals else []),
    ]
    saves = f"{'; '.join(saved[:-1])} and {saved[-1]}" if len(saved) > 1 else saved[0]
    recomputed = f"; the backward kernels recompute {', '.join(gradient.recomputed)}" if gradient.recomputed else ""
    text = f"`{kernel.name}`'s backward pass, for jax.grad: the forward pass saves {saves}{recomputed}."
    if integers:
        text += f" Integer and bool inputs ({', '.join(integers)}) get None: float0 cotangents."
    text += f" It passes {_passed(gradient)} as it is: the derivative is 1." if gradient.passed else ""
    return tuple(textwrap.wrap(text, DOC_WIDTH))
