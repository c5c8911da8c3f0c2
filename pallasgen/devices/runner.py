"""`pallasgen run`: a generated kernel on random inputs, checked against its reference.

This is the only part of pallasgen that imports jax, and only when it runs.
"""

from __future__ import annotations

import math
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.product import batch_dims

# Default sizes of the dimensions `--size` does not give (see `sizes_for`).
ELEMENTS_PER_ARRAY = 2**20
UNBLOCKED_SIZE = 384
PRODUCT_BATCH_SIZE = 4
# Error allowed per element, as a fraction of 1 + |reference|, per output dtype;
# other dtypes (integers, bool) are compared exactly.
TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 2e-2}
# A gradient takes ten times its input dtype's allowance: it goes through more rounding
# (the forward's values recomputed, then the chain rule), most near a quotient's pole.
GRADIENT_TOLERANCE_FACTOR = 10


@dataclass(frozen=True)
class RunResult:
    kernel: str
    output: str
    elements: int
    mismatches: int  # elements beyond their allowance (a NaN on one side only counts)
    tolerance: float  # allowance per element: tolerance * (1 + |reference|) + floor; 0 is exact
    worst: tuple[float, float, float, float]  # (kernel, reference, |difference|, allowance) where worst
    seconds: float
    floor: float = 0.0  # a gradient's: its dtype's allowance of the cotangent's root mean square

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def describe(self, sizes: dict[str, int]) -> str:
        """One line: the verdict, the worst element against its own allowance, the time."""
        shape = ", ".join(f"{d}={n}" for d, n in sizes.items())
        got, want, difference, allowed = self.worst
        verdict = "OK" if self.ok else f"MISMATCH in {self.mismatches} of {self.elements} elements"
        if self.tolerance == 0:
            detail = "compared exactly" + ("" if self.ok else f"; worst element {got:.6g}, reference {want:.6g}")
        else:
            detail = (
                f"worst element {got:.6g}, reference {want:.6g}: |diff| {difference:.3g}"
                f" {'within' if difference <= allowed else 'beyond'} the {allowed:.3g} allowed there"
                f" ({self.tolerance:.0e} x (1 + |reference|)"
                + (f" + {self.floor:.3g}, a sum's rounding by the cotangents' size)" if self.floor else ")")
            )
        return (
            f"{self.kernel}.{self.output} [{shape}]: {verdict}, {detail};"
            f" {self.seconds * 1e3:.1f} ms for the first call, compilation included"
        )


def load_module(source: str, path: Path) -> types.ModuleType:
    """A generated module executed from its text, which `path` holds or would hold."""
    module = types.ModuleType(f"pallasgen_generated_{path.stem}")
    module.__file__ = str(path)
    module.__pallasgen_source__ = source  # for a process of its own to load it again (devices.apart)
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def sizes_for(checked: CheckedKernel, given: dict[str, int]) -> dict[str, int]:
    """Every dimension's size: as given, else a default that keeps each array small.

    A blocked dimension defaults to one and a half blocks, so that its last block is a
    ragged edge; an unblocked one to UNBLOCKED_SIZE, a product's batch dimension to
    PRODUCT_BATCH_SIZE. Then, while an array holds more than ELEMENTS_PER_ARRAY
    elements, its largest defaulted dimension is halved.
    """
    kernel = checked.kernel
    batch = set(batch_dims(checked.product)) if checked.product else set()

    def default(dim: str) -> int:
        if dim in batch:
            return PRODUCT_BATCH_SIZE
        if dim in checked.blocks:
            return max(1, checked.blocks[dim] * 3 // 2)
        return UNBLOCKED_SIZE

    sizes = {d: given[d] if d in given else default(d) for d in checked.dims}
    arrays = [decl.dims for decl in kernel.inputs + kernel.outputs]
    while True:
        over = [dims for dims in arrays if math.prod(sizes[d] for d in dims) > ELEMENTS_PER_ARRAY]
        shrinkable = [d for dims in over for d in dims if d not in given and sizes[d] > 1]
        if not shrinkable:
            return sizes
        largest = max(shrinkable, key=sizes.__getitem__)
        sizes[largest] //= 2


def random_inputs(checked: CheckedKernel, sizes: dict[str, int], seed: int):
    """Random inputs of these sizes; raises MemoryError if they cannot be allocated."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for decl in checked.kernel.inputs:
        shape = tuple(sizes[d] for d in decl.dims)
        dtype = DTYPES[decl.dtype]
        try:
            if dtype.name == "bool":
                array = rng.random(shape) < 0.5
            elif dtype.is_integer:
                low, high = dtype.int_range()
                array = rng.integers(max(low, -1000), min(high, 1000) + 1, shape)
            else:
                array = rng.standard_normal(shape)
        except (ValueError, OverflowError) as error:  # NumPy: a shape too large to describe
            raise MemoryError(str(error)) from None
        arrays.append(jnp.asarray(array, dtype=jnp.dtype(dtype.jnp)))
    return arrays


def run_kernel(module, checked: CheckedKernel, sizes: dict[str, int], seed: int) -> list[RunResult]:
    """Runs the kernel and its reference on the same random inputs; one result per output."""
    kernel = getattr(module, checked.kernel.name)
    reference = getattr(module, checked.kernel.name).reference
    inputs = random_inputs(checked, sizes, seed)
    start = time.perf_counter()
    results = kernel(*inputs)
    results = results if isinstance(results, tuple) else (results,)
    for result in results:
        result.block_until_ready()
    seconds = time.perf_counter() - start
    expected = reference(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    report = []
    for decl, got, want in zip(checked.kernel.outputs, results, expected):
        tolerance = TOLERANCE.get(decl.dtype, 0.0)
        report.append(_compare(checked.kernel.name, decl.name, got, want, tolerance, seconds))
    return report


def has_gradient(checked: CheckedKernel) -> bool:
    """Whether `jax.grad` of the kernel gives cotangents other than zeros: by backward
    kernels, or passed on as they are."""
    gradient = checked.gradient
    return has_backward_kernels(checked) or bool(gradient and gradient.passed)


def has_backward_kernels(checked: CheckedKernel) -> bool:
    """Whether `jax.grad` of the kernel runs generated backward kernels."""
    gradient = checked.gradient
    return gradient is not None and bool(gradient.kernels) and not gradient.turned_off and not gradient.not_yet


def why_no_backward(checked: CheckedKernel) -> str:
    """Why `jax.grad` of the kernel runs no generated backward kernel."""
    gradient = checked.gradient
    if gradient.turned_off is not None:
        return f"its spec says `grad none` at line {gradient.turned_off.position.line}"
    if gradient.not_yet is not None:
        return f"none is generated yet for {gradient.not_yet}"
    if gradient.passed:
        return "its backward pass passes the cotangents on as they are"
    return "no float input reaches a float output"


def random_cotangents(checked: CheckedKernel, sizes: dict[str, int], seed: int):
    """Random cotangents of the kernel's float outputs at these sizes (drawn from `seed + 1`,
    so that they differ from the inputs drawn from `seed`)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    return tuple(
        jnp.asarray(rng.standard_normal(tuple(sizes[d] for d in decl.dims)), jnp.dtype(DTYPES[decl.dtype].jnp))
        for decl in checked.kernel.outputs
        if DTYPES[decl.dtype].is_float
    )


def run_gradient(module, checked: CheckedKernel, sizes: dict[str, int], seed: int) -> list[RunResult]:
    """`jax.vjp` of the kernel (its generated backward kernels) against `jax.vjp` of its
    reference, at the same random inputs and random cotangents of its float outputs; one
    result per float input, `grad(NAME)`."""
    import jax

    kernel = getattr(module, checked.kernel.name)
    reference = getattr(module, checked.kernel.name).reference
    inputs = random_inputs(checked, sizes, seed)
    decls = checked.kernel.inputs
    wrt = [n for n, decl in enumerate(decls) if DTYPES[decl.dtype].is_float]
    float_outputs = [n for n, decl in enumerate(checked.kernel.outputs) if DTYPES[decl.dtype].is_float]

    def differentiated(function):
        def of_floats(*floats):
            arrays = list(inputs)
            for n, array in zip(wrt, floats):
                arrays[n] = array
            results = function(*arrays)
            results = results if isinstance(results, tuple) else (results,)
            return tuple(results[n] for n in float_outputs)

        return of_floats

    primals = [inputs[n] for n in wrt]
    cotangents = random_cotangents(checked, sizes, seed)
    start = time.perf_counter()
    _, backward = jax.vjp(differentiated(kernel), *primals)
    got = backward(cotangents)
    for array in got:
        array.block_until_ready()
    seconds = time.perf_counter() - start
    want = jax.vjp(differentiated(reference), *primals)[1](cotangents)
    return [
        _compare(
            checked.kernel.name,
            f"grad({decls[n].name})",
            g,
            w,
            GRADIENT_TOLERANCE_FACTOR * TOLERANCE[decls[n].dtype],
            seconds,
            floor=TOLERANCE[decls[n].dtype] * _root_mean_square(w),
        )
        for n, g, w in zip(wrt, got, want)
    ]


def _root_mean_square(values) -> float:
    """A cotangent's typical size: where a product's sum cancels (swiglu's dx of 200 terms
    of tens each, near 0), each term's rounding (bf16) adds up to that scale, not the
    element's."""
    import numpy as np

    finite = np.nan_to_num(np.asarray(values, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0


def _compare(kernel: str, output: str, got, want, tolerance: float, seconds: float, floor: float = 0.0) -> RunResult:
    import numpy as np

    got64, want64 = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    same = (got64 == want64) | (np.isnan(got64) & np.isnan(want64))
    difference = np.where(same, 0.0, np.nan_to_num(np.abs(got64 - want64), nan=np.inf, posinf=np.inf))
    allowed = tolerance * (1.0 + np.abs(np.nan_to_num(want64, nan=0.0, posinf=0.0, neginf=0.0))) + floor
    mismatches = int(np.sum(difference > allowed))
    # The element closest to, or furthest past, its allowance.
    worst = int(np.argmax(difference / allowed if tolerance else difference))
    measures = (got64[worst], want64[worst], difference[worst], allowed[worst])
    return RunResult(kernel, output, got64.size, mismatches, tolerance, tuple(map(float, measures)), seconds, floor)
