"""Every bundled kernel (any module in generated/) under the TPU code paths, on CPU.

- TPU interpret mode (`interpret=pltpu.InterpretParams()`) simulates TPU memories
  and visits the parallel grid axes in a random order; results must still equal
  the references.
- Lowering for TPU with `interpret=False` on an abstract TPU device runs Mosaic's
  block-shape checks without hardware (PALLAS_NOTES.md section 4).

Kernels with a case in kernel_cases.py use its inputs and independent NumPy
reference too; any other kernel gets random inputs of its declared dtypes, sized
from its spec, and is compared with its generated reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice
from jax.experimental.pallas import tpu as pltpu

from kernel_cases import (
    CASES,
    NUMPY_DTYPES,
    SHAPE_CLASSES,
    assert_outputs_close,
    block_defaults,
    bundled_kernels,
    is_derived,
    generated_module,
    generic_tolerances,
    make_inputs,
    run_kernel,
    run_reference,
    signature_of,
    sizes_for,
)

# Kernels derived for jax.grad run under the TPU simulation in test_gradient_races.py.
KERNELS = [(module, kernel) for module, kernel in bundled_kernels() if kernel is None or not is_derived(module, kernel)]
KERNEL_IDS = [f"{module}.{kernel}" for module, kernel in KERNELS]
# The TPU simulation (InterpretParams) takes minutes a call for a fused kernel's grid of
# batch elements and steps at these small blocks: test_attention.py simulates those at
# sizes and blocks of their own.
SIMULATED = [(module, kernel) for module, kernel in KERNELS if module != "attention"]


def kernel_function(module, kernel):
    """The generated kernel; a module that failed to import raises its error here."""
    if kernel is None:
        generated_module.cache_clear()
        generated_module(module)
        pytest.fail(f"generated/{module}.py imports now but did not at collection")
    return getattr(generated_module(module), kernel)


@pytest.fixture
def tpu_interpret_state():
    """TPU interpret mode keeps global state; reset it after each test, failed or not."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize(("module", "kernel"), SIMULATED, ids=[f"{m}.{k}" for m, k in SIMULATED])
def test_kernel_matches_reference_in_tpu_interpret_mode(module, kernel, tpu_interpret_state):
    """On a ragged grid of small blocks, simulated TPU execution (uninitialized memory
    is NaN, out-of-bounds reads raise, parallel axes run in permuted order) gives the
    reference's results."""
    fn = kernel_function(module, kernel)
    inputs, outputs = signature_of(module, kernel)
    sizes, blocks = sizes_for(inputs, outputs, block_defaults(fn), "two-ragged-small-blocks")
    arrays = make_inputs(module, kernel, np.random.default_rng(4), sizes)
    got = run_kernel(module, kernel, arrays, **blocks, interpret=pltpu.InterpretParams())
    assert [out.dtype for out in got] == [NUMPY_DTYPES[out.dtype] for out in outputs]
    expected = run_reference(module, kernel, arrays)
    case = CASES.get(f"{module}.{kernel}")
    tolerances = case.tolerances_for(arrays) if case else generic_tolerances(outputs, expected)
    assert_outputs_close(got, expected, tolerances, f"{module}.{kernel} vs .reference")
    if case:
        assert_outputs_close(got, case.expected(*arrays), tolerances, f"{module}.{kernel} vs NumPy float64")


TPU = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")


def lower_for_tpu(fn, args):
    """Lowers `fn(*args)` for TPU on an abstract device: Pallas -> Mosaic, no hardware."""
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=TPU)
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=KERNEL_IDS)
def test_kernel_lowers_for_tpu(module, kernel, shape_class):
    """With `interpret=False` the kernel lowers to a Mosaic TPU custom call, for
    aligned, ragged and small shapes with default and with small blocks: every
    block shape passes Mosaic's (8, 128) rules."""
    fn = kernel_function(module, kernel)
    inputs, outputs = signature_of(module, kernel)
    sizes, blocks = sizes_for(inputs, outputs, block_defaults(fn), shape_class)
    args = [jax.ShapeDtypeStruct(op.shape(sizes), jnp.dtype(NUMPY_DTYPES[op.dtype])) for op in inputs]
    lowered = lower_for_tpu(functools.partial(fn, **blocks, interpret=False), args)
    assert "tpu_custom_call" in lowered.as_text()
