"""The bundled elementwise and reduction kernels in generated/, run in Pallas interpret
mode on CPU (reductions have more tests of their own in test_reductions.py).

Each kernel is checked against its generated `NAME.reference` and against an
independent float64 NumPy reference (tests/kernel_cases.py), over block-aligned,
ragged and smaller-than-one-block shapes, with default and with small explicit
block sizes, and with NaN and infinity in the inputs. `interpret=None`, the
default, means interpret mode on CPU.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from kernel_cases import (
    BF16,
    CASES,
    NUMPY_DTYPES,
    SHAPE_CLASSES,
    assert_outputs_close,
    block_defaults,
    bundled_kernels,
    generated_module,
    has_matmul,
    kernel_of,
    run_kernel,
    run_reference,
    sizes_for,
    WithResiduals,
)

CASE_LIST = list(CASES.values())
CASE_IDS = list(CASES)


def inputs_for(case, shape_class, seed=0):
    """(block keywords, input arrays) for a case in a shape class."""
    kernel = kernel_of(case.module, case.kernel)
    sizes, blocks = sizes_for(case.inputs, case.outputs, block_defaults(kernel), shape_class)
    return blocks, case.make_inputs(np.random.default_rng(seed), sizes)


def check_against_references(case, arrays, got, **params):
    """Against the generated reference (a kernel's residuals have none) and NumPy's."""
    tolerances = case.tolerances_for(arrays)
    if not isinstance(kernel_of(case.module, case.kernel), WithResiduals):
        reference = run_reference(case.module, case.kernel, arrays, **params)
        assert_outputs_close(got, reference, tolerances, f"{case.id} vs _reference")
    assert_outputs_close(got, case.expected(*arrays, **params), tolerances, f"{case.id} vs NumPy float64")


def test_every_bundled_elementwise_kernel_has_an_independent_reference():
    """Each kernel in generated/ without a matrix product (elementwise or reducing) has a
    NumPy reference here, and each reference here has its kernel."""
    found = bundled_kernels()
    assert all(kernel is not None for _, kernel in found), f"a generated module fails to import: {found}"
    elementwise = {(module, kernel) for module, kernel in found if not has_matmul(module, kernel)}
    saving = {(m, k) for m, k in elementwise if getattr(generated_module(m), k)._residuals}  # with_residuals too
    assert {f"{m}.{k}" for m, k in elementwise} | {f"{m}.{k}_with_residuals" for m, k in saving} == set(CASE_IDS)


@pytest.mark.parametrize("case", CASE_LIST, ids=CASE_IDS)
def test_block_keywords_are_named_after_the_dimensions(case):
    """Each blocked dimension DIM has a `block_<dim>` keyword with a positive default."""
    defaults = block_defaults(kernel_of(case.module, case.kernel))
    dims = {dim for operand in case.inputs for dim in operand.dims}
    assert defaults and set(defaults) <= {f"block_{dim.lower()}" for dim in dims}
    assert all(isinstance(value, int) and value > 0 for value in defaults.values())


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
@pytest.mark.parametrize("case", CASE_LIST, ids=CASE_IDS)
def test_kernel_matches_references(case, shape_class):
    """Interpret-mode results have the declared dtypes and shapes, and equal the
    generated reference and the float64 NumPy reference within the dtype's tolerance."""
    blocks, arrays = inputs_for(case, shape_class)
    for operand, array in zip(case.inputs, arrays, strict=True):
        assert array.dtype == NUMPY_DTYPES[operand.dtype], operand
    got = run_kernel(case.module, case.kernel, arrays, **blocks)
    assert [out.dtype for out in got] == [NUMPY_DTYPES[out.dtype] for out in case.outputs]
    check_against_references(case, arrays, got)


PARAM_CASES = [case for case in CASE_LIST if case.params]


@pytest.mark.parametrize("case", PARAM_CASES, ids=[case.id for case in PARAM_CASES])
def test_param_keyword_is_used_by_the_kernel(case):
    """A non-default `param` keyword changes the result, exactly as in the references."""
    blocks, arrays = inputs_for(case, "ragged-small-blocks", seed=1)
    got = run_kernel(case.module, case.kernel, arrays, **blocks, **case.params)
    check_against_references(case, arrays, got, **case.params)
    default = run_kernel(case.module, case.kernel, arrays, **blocks)
    assert any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(got, default))


SPECIALS = (np.nan, np.inf, -np.inf)


def plant_specials(arrays, rng):
    """Copies of the arrays with NaN, +inf and -inf at random places in each float
    input, and one in every input's last element (the ragged corner block)."""
    planted = []
    for index, array in enumerate(arrays):
        if array.dtype.kind != "f" and array.dtype != BF16:
            planted.append(array)
            continue
        array = array.copy()
        flat = array.reshape(-1)
        positions = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
        for k, position in enumerate(positions):
            flat[position] = SPECIALS[k % 3]
        flat[-1] = SPECIALS[index % 3]
        planted.append(array)
    return planted


# Reductions leave NaN unspecified (LANGUAGE.md): only kernels whose results on NaN and
# infinities are specified take this test.
SPECIALS_CASES = [case for case in CASE_LIST if case.specials]


@pytest.mark.parametrize("case", SPECIALS_CASES, ids=[case.id for case in SPECIALS_CASES])
def test_nan_and_inf_inputs_propagate_like_the_references(case):
    """NaN, +inf and -inf in the inputs give NaN and infinities in the same output
    positions as both references, on a ragged grid of small blocks."""
    blocks, arrays = inputs_for(case, "ragged-small-blocks", seed=2)
    arrays = plant_specials(arrays, np.random.default_rng(3))
    got = run_kernel(case.module, case.kernel, arrays, **blocks)
    floats = [out.astype(np.float64) for out in got if out.dtype.kind == "f" or out.dtype == BF16]
    if floats:  # integer outputs (a quantizer) define what NaN and inf become instead
        assert any(np.isnan(out).any() for out in floats), "the planted values reach the output"
    check_against_references(case, arrays, got)


def first_of_each_module(cases):
    """The first case of each module: which kernel runs where is the runtime's, the same for each."""
    firsts = {}
    for case in cases:
        firsts.setdefault(case.module, case)
    return list(firsts.values())


FIRST_OF_EACH_MODULE = first_of_each_module(CASE_LIST)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU default")
@pytest.mark.parametrize("case", FIRST_OF_EACH_MODULE, ids=[case.id for case in FIRST_OF_EACH_MODULE])
def test_interpret_none_means_interpret_mode_on_cpu(case):
    """On CPU, `interpret=None` gives exactly what `interpret=True` gives, and
    `interpret=False` is passed on to Pallas, which cannot compile for CPU."""
    blocks, arrays = inputs_for(case, "two-ragged-small-blocks", seed=5)
    default = run_kernel(case.module, case.kernel, arrays, **blocks)
    interpreted = run_kernel(case.module, case.kernel, arrays, **blocks, interpret=True)
    for a, b in zip(default, interpreted, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception, match="interpret"):
        run_kernel(case.module, case.kernel, arrays, **blocks, interpret=False)
