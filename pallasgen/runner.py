"""`pallasgen run`: a generated kernel on random inputs, checked against its reference.

This is the only part of pallasgen that imports jax, and only when it runs.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .checks import CheckedKernel
from .dtypes import DTYPES

DEFAULT_SIZE = 384  # not a multiple of most blocks, so edge blocks are exercised
DEFAULT_BATCH = 4
# Error allowed per element, as a fraction of 1 + |reference|, per output dtype.
TOLERANCE = {"f32": 1e-4, "f16": 1e-2, "bf16": 2e-2}


@dataclass(frozen=True)
class RunResult:
    kernel: str
    output: str
    max_error: float  # the largest |kernel - reference|
    tolerance: float  # per element: tolerance * (1 + |reference|)
    mismatches: int  # elements beyond it (a NaN on one side only counts)
    seconds: float

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def load_module(path: Path):
    """Imports a generated module from its file."""
    name = f"pallasgen_generated_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def sizes_for(checked: CheckedKernel, given: dict[str, int]) -> dict[str, int]:
    """Every dimension's size: as given, else a default (small for a product's batch)."""
    out_dims = checked.kernel.outputs[0].dims
    batch = set(out_dims[:-2]) if checked.product else set()
    return {d: given.get(d, DEFAULT_BATCH if d in batch else DEFAULT_SIZE) for d in checked.dims}


def random_inputs(checked: CheckedKernel, sizes: dict[str, int], seed: int):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for decl in checked.kernel.inputs:
        shape = tuple(sizes[d] for d in decl.dims)
        dtype = DTYPES[decl.dtype]
        if dtype.name == "bool":
            array = rng.random(shape) < 0.5
        elif dtype.is_integer:
            low, high = dtype.int_range()
            array = rng.integers(max(low, -1000), min(high, 1000) + 1, shape)
        else:
            array = rng.standard_normal(shape)
        arrays.append(jnp.asarray(array, dtype=jnp.dtype(dtype.jnp)))
    return arrays


def run_kernel(module, checked: CheckedKernel, sizes: dict[str, int], seed: int) -> list[RunResult]:
    """Runs the kernel and its reference on the same random inputs; one result per output."""
    import numpy as np

    kernel = getattr(module, checked.kernel.name)
    reference = getattr(module, f"{checked.kernel.name}_reference")
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
        got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
        same = (got64 == want64) | (np.isnan(got64) & np.isnan(want64))
        error = np.where(same, 0.0, np.abs(got64 - want64))
        tolerance = TOLERANCE.get(decl.dtype, 0.0)
        mismatches = int(np.sum(~(same | (error <= tolerance * (1.0 + np.abs(want64))))))
        max_error = float(np.max(error, initial=0.0))
        report.append(RunResult(checked.kernel.name, decl.name, max_error, tolerance, mismatches, seconds))
    return report
