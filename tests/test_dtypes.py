"""pallasgen's static type rules agree with what JAX actually does.

`pallasgen.dtypes.promote` must equal `jnp.promote_types` for every pair of spec
dtypes, and `pallasgen.valuetypes.combine` must give the dtype and weakness that
JAX gives an operation between arrays and Python scalars (spec literals and params
are weak, like Python scalars).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallasgen.analysis.dtypes import DTYPES, F32, I32, promote
from pallasgen.analysis.valuetypes import ValueType, combine

NAMES = list(DTYPES)
PAIRS = list(itertools.product(NAMES, repeat=2))


def jax_result(fn):
    """What JAX produces for `fn()`: its result's dtype and weak_type, found by tracing
    (jax.eval_shape) instead of running, so no operation is compiled."""
    result = jax.eval_shape(fn)
    return result.dtype, result.weak_type


PAIR_IDS = [f"{a}-{b}" for a, b in PAIRS]

# Weak operands as pallasgen types them, and the Python scalar JAX sees for each.
WEAK = {
    "int-literal": (ValueType(I32, (), weak=True), 1),
    "float-literal": (ValueType(F32, (), weak=True), 1.0),
}


@pytest.mark.parametrize("name", NAMES)
def test_dtype_table_describes_the_jax_dtype(name):
    """Each spec dtype names a JAX dtype with the stated kind and width."""
    dtype = DTYPES[name]
    actual = jnp.dtype(dtype.jnp)
    assert actual.itemsize * 8 == dtype.bits
    assert dtype.is_float == bool(jnp.issubdtype(actual, jnp.floating))
    assert dtype.is_integer == bool(jnp.issubdtype(actual, jnp.integer))
    assert (dtype.kind == "u") == bool(jnp.issubdtype(actual, jnp.unsignedinteger))
    assert (dtype.kind == "b") == (actual == np.dtype(bool))


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=PAIR_IDS)
def test_promote_equals_jnp_promote_types(a, b):
    """promote(a, b) is jnp.promote_types(a, b) for strongly typed operands."""
    expected = jnp.promote_types(DTYPES[a].jnp, DTYPES[b].jnp)
    assert jnp.dtype(promote(DTYPES[a], DTYPES[b]).jnp) == expected


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=PAIR_IDS)
def test_combine_of_two_arrays_matches_jax_addition(a, b):
    """Two strong operands combine to the dtype of `x + y`, and the result is strong."""
    result = combine(ValueType(DTYPES[a], ("N",)), ValueType(DTYPES[b], ("N",)), ("N",))
    actual = jax_result(lambda: jnp.zeros(3, DTYPES[a].jnp) + jnp.zeros(3, DTYPES[b].jnp))
    assert (jnp.dtype(result.dtype.jnp), result.weak) == actual


@pytest.mark.parametrize("weak", WEAK)
@pytest.mark.parametrize("strong", NAMES)
def test_combine_of_array_and_python_scalar_matches_jax(strong, weak):
    """An array with a weak scalar, in either order, has the dtype and weakness of
    `jnp.zeros(3, dtype) + 1` (or `+ 1.0`): e.g. i8 + 1 stays i8, i8 + 1.0 is a weak f32,
    bool + 1 is a weak i32, bf16 + 1.0 stays bf16."""
    weak_type, scalar = WEAK[weak]
    strong_type = ValueType(DTYPES[strong], ("N",))
    dtype = DTYPES[strong].jnp
    for result, actual in (
        (combine(strong_type, weak_type, ("N",)), jax_result(lambda: jnp.zeros(3, dtype) + scalar)),
        (combine(weak_type, strong_type, ("N",)), jax_result(lambda: scalar + jnp.zeros(3, dtype))),
    ):
        assert (jnp.dtype(result.dtype.jnp), result.weak) == actual
        assert result.dims == ("N",)


@pytest.mark.parametrize(("a", "b"), list(itertools.product(WEAK, repeat=2)))
def test_combine_of_two_weak_scalars_matches_jax(a, b):
    """Two weak operands stay weak: int with int is a weak i32, any float makes a weak f32.

    JAX's view of weak+weak is taken from weakly typed arrays (jnp.asarray of a
    Python scalar), since Python would add two scalars itself.
    """
    (type_a, scalar_a), (type_b, scalar_b) = WEAK[a], WEAK[b]
    actual = jax_result(lambda: jnp.asarray(scalar_a) + jnp.asarray(scalar_b))
    result = combine(type_a, type_b, ())
    assert (jnp.dtype(result.dtype.jnp), result.weak) == actual


@pytest.mark.parametrize("strong", NAMES)
def test_weak_result_combines_again_like_jax(strong):
    """A weak intermediate (bool + 1, a weak i32) then meets a strong array as JAX's does."""
    intermediate = combine(ValueType(DTYPES["bool"], ("N",)), WEAK["int-literal"][0], ("N",))
    result = combine(intermediate, ValueType(DTYPES[strong], ("N",)), ("N",))
    actual = jax_result(lambda: (jnp.zeros(3, bool) + 1) + jnp.zeros(3, DTYPES[strong].jnp))
    assert (jnp.dtype(result.dtype.jnp), result.weak) == actual
