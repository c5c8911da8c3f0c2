"""The backends, one folder each behind one interface (`base.Backend`), and the one
dispatch over them: every kernel is checked, planned and rendered for each backend a
project targets (`[tool.pallasgen] targets`, by `Backend.target`; default all)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.gradients.derive import every_kernel, launched
from pallasgen.backends.base import Backend
from pallasgen.backends.gpu import GpuBackend
from pallasgen.backends.mosaic_gpu import MosaicGpuBackend
from pallasgen.backends.tpu import TpuBackend
from pallasgen.lowering.gradient import plan_gradient, vjp_function_name
from pallasgen.lowering.kernel import KernelPlan, lower_kernel, plan_kernel
from pallasgen.runtime.constants import TARGETS

BACKENDS: tuple[Backend, ...] = (TpuBackend(), GpuBackend(), MosaicGpuBackend())
assert tuple(backend.target for backend in BACKENDS) == TARGETS


def targeted(targets: tuple[str, ...] = TARGETS) -> tuple[Backend, ...]:
    """The backends of `targets` (their `Backend.target`s), in BACKENDS' order."""
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; the targets are {', '.join(TARGETS)}")
    return tuple(backend for backend in BACKENDS if backend.target in targets)

@dataclass(frozen=True)
class ModulePlan:
    spec_path: str
    kernels: tuple[KernelPlan, ...]
    templates: tuple[str, ...]  # each backend's, rendered per kernel after the public function
    targets: tuple[str, ...] = TARGETS  # those it is generated for

    @property
    def saves_residuals(self) -> bool:
        """Whether a kernel's launchers write residuals when asked (`LoweredKernel.residuals`)."""
        return any(o.residual for k in self.kernels for o in k.outputs)


def plan_module(spec_path: str, kernels: tuple[CheckedKernel, ...], targets: tuple[str, ...] = TARGETS) -> ModulePlan:
    """The module's plan for `targets`: each kernel, then its backward kernels (gradients.derive)."""
    backends = targeted(targets)
    targets = tuple(backend.target for backend in backends)
    kernels = every_kernel(kernels)
    module_names = frozenset({
        name
        for k in kernels
        for name in (
            *(name for backend in backends for name in backend.function_names(k.kernel.name)),
            vjp_function_name(k.kernel.name),
        )
    })
    plans = tuple(_plan_kernel(k, module_names, spec_path, backends, targets) for k in kernels)
    return ModulePlan(spec_path, plans, tuple(backend.template for backend in backends), targets)


def backend_named(name: str) -> Backend:
    return next(backend for backend in BACKENDS if backend.name == name)


def plan_backends(checked: CheckedKernel, targets: tuple[str, ...] | None = None) -> dict[str, object]:
    """Each targeted backend's plan of one kernel, by backend name, as a module of it alone
    has it; `targets` None: those it was checked for."""
    if targets is None:
        targets = tuple(backend.target for backend in BACKENDS if backend.name in checked.settings)
    module = plan_module("", (checked,), targets)
    return next(k for k in module.kernels if k.name == checked.kernel.name).backends


def _plan_kernel(
    checked: CheckedKernel,
    module_names: frozenset[str],
    spec_path: str,
    backends: tuple[Backend, ...],
    targets: tuple[str, ...],
) -> KernelPlan:
    run, residuals = launched(checked)  # with its residuals as outputs too, where jax.grad saves some
    # A backend that takes the kernel but not with its residuals plans it alone (see `writes_residuals`).
    runs = {b.name: run if b.writes_residuals(checked, targets) else checked for b in backends}
    groups = [backend.keywords(runs[backend.name], targets) for backend in backends]
    public_keywords = {k.name for group in groups for k in group.keywords}
    reserved = {name for backend in backends for name in backend.reserved_names(runs[backend.name])}
    taken = frozenset(module_names | public_keywords | reserved)
    lowered = lower_kernel(run, taken, residuals, checked.kernel if residuals else None)
    public = lower_kernel(checked, taken) if residuals else lowered
    backend_plans = {b.name: b.plan(lowered if runs[b.name] is run else public, targets) for b in backends}
    plan = plan_kernel(lowered, groups, backend_plans, public)
    passed_on = tuple(name for backend in backends for name in backend.backward_keywords(targets))
    gradient = plan_gradient(checked, lowered.values, spec_path, module_names, passed_on)
    if gradient is None:
        return plan
    return dataclasses.replace(plan, gradient=gradient, doc=(*plan.doc, *gradient.public_doc))
