"""Every kernel derived for jax.grad (the kernels that save residuals and the backward
kernels of the bundled specs) on a simulated multicore TPU (`pltpu.InterpretParams`
with race detection), at small blocks and ragged sizes of several blocks per
dimension: no race, and the answer of its reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from kernel_cases import ROOT, generated_module
from test_matmul_kernels import race_detection, races_found

from pallasgen.gradients.derive import every_kernel
from pallasgen.analysis.names import block_keyword
from pallasgen.backends import backend_named
from pallasgen.devices import runner
from pallasgen.workspace.pipeline import check_source

SMALLEST_BLOCKS = (8, 16, 32, 64, 128, 256)


def derived_kernels() -> list[tuple[str, object]]:
    """(module stem, checked kernel) of every kernel derived for jax.grad from a bundled spec."""
    found = []
    for path in sorted((ROOT / "specs").glob("*.pallas")):
        kernels = check_source(path.read_text(encoding="utf-8"), str(path))
        found += [(path.stem, k) for k in every_kernel(kernels) if k not in kernels]
    return found


def small_blocks_and_sizes(checked) -> tuple[dict[str, int], dict[str, int]]:
    """The smallest legal TPU block of each tunable dimension, and sizes of two blocks
    and a ragged part of each (a dimension of fixed blocks: two of them; one taken
    whole: 40)."""
    tpu = backend_named("tpu")
    blocks = {}
    for dim in tpu.tunable_dims(checked):
        blocks[dim] = next(b for b in SMALLEST_BLOCKS if not tpu.block_problem(checked, dim, b))
    sizes = {dim: 2 * blocks[dim] + 3 if dim in blocks else 2 * checked.blocks.get(dim, 20) for dim in checked.dims}
    return blocks, sizes


@pytest.mark.parametrize(
    "stem, checked", derived_kernels(), ids=lambda v: getattr(getattr(v, "kernel", None), "name", v)
)
def test_a_derived_kernel_has_no_race_on_a_simulated_multicore_tpu(stem, checked):
    module = generated_module(stem)
    blocks, sizes = small_blocks_and_sizes(checked)
    inputs = runner.random_inputs(checked, sizes, seed=3)
    name = checked.kernel.name
    keywords = {block_keyword(d): b for d, b in blocks.items()}
    try:
        # finished before its races are read and its state is reset
        got = jax.block_until_ready(getattr(module, name)(*inputs, **keywords, interpret=race_detection(cores=4)))
        raced = races_found()
    finally:
        pltpu.reset_tpu_interpret_mode_state()
    assert not raced
    want = getattr(module, name).reference(*inputs)
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    for g, w, decl in zip(got, want, checked.kernel.outputs, strict=True):
        tolerance = runner.TOLERANCE.get(decl.dtype, 0.0)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tolerance, atol=tolerance)
