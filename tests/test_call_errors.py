"""A generated function called with the wrong arrays or blocks says which and why; lists
and scalars convert as jax.numpy converts them, and a call with a dimension of size 0
gives what jax.numpy gives."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_cases import as_tuple, generated_module


@pytest.fixture(scope="module")
def matmul():
    return generated_module("matmul")


def test_wrong_dtype_names_the_operand(matmul):
    x = np.zeros((8, 128), np.float32)
    with pytest.raises(TypeError, match=r"matmul_bias_gelu: x must be bfloat16, got float32"):
        matmul.matmul_bias_gelu(x, x.T, np.zeros(8, np.float32))


def test_wrong_rank_names_the_dimensions(matmul):
    with pytest.raises(ValueError, match=r"matmul: y must have dimensions \[K, N\], got shape \(128,\)"):
        matmul.matmul(np.zeros((8, 128), np.float32), np.zeros(128, np.float32))


def test_disagreeing_sizes_name_the_dimension(matmul):
    with pytest.raises(ValueError, match=r"matmul: y has K=64 but another operand has K=128"):
        matmul.matmul(np.zeros((8, 128), np.float32), np.zeros((64, 128), np.float32))


# --------------------------------------------------------------------------- zero-size calls
#
# A dimension of size 0 leaves nothing to tile: the call gives what jax.numpy gives,
# empty outputs of the right shapes and dtypes, or for an output reduced over the empty
# dimension the reduction of nothing.


def f32(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    ("module", "kernel", "shapes", "expected"),
    [
        ("add_vectors", "add_vectors", [(0,), (0,)], [((0,), np.float32)]),
        ("softmax", "softmax", [(0, 5)], [((0, 5), np.float32)]),
        ("softmax", "softmax", [(3, 0)], [((3, 0), np.float32)]),  # each row's max and sum of nothing
        ("matmul", "matmul", [(0, 8), (8, 16)], [((0, 16), np.float32)]),
        ("matmul", "matmul", [(8, 16), (16, 0)], [((8, 0), np.float32)]),
    ],
    ids=["elementwise", "reduction-no-rows", "reduction-empty-rows", "product-no-rows", "product-no-columns"],
)
def test_a_zero_size_dimension_gives_empty_outputs(module, kernel, shapes, expected):
    outputs = as_tuple(getattr(generated_module(module), kernel)(*(f32(*shape) for shape in shapes)))
    assert [(o.shape, o.dtype) for o in outputs] == expected


def test_a_product_over_an_empty_contracted_dimension_is_zero_as_in_numpy():
    x, y = f32(8, 0), f32(0, 16)
    np.testing.assert_array_equal(generated_module("matmul").matmul(x, y), x @ y)


def test_a_sum_over_an_empty_dimension_is_zero_as_in_numpy():
    x = f32(0, 5)
    np.testing.assert_array_equal(generated_module("reductions").column_sums(x), x.sum(axis=0))


# --------------------------------------------------------------------------- block keywords


@pytest.mark.parametrize(
    ("module", "kernel", "shapes", "keyword", "expected"),
    [
        ("add_vectors", "add_vectors", [(8,), (8,)], "block_n", "a positive int or None"),
        ("softmax", "softmax", [(8, 8)], "block_m", "a positive int or None"),
        ("matmul", "matmul", [(8, 8), (8, 8)], "block_k", "a positive int or None"),
        ("matmul", "matmul", [(8, 8), (8, 8)], "gpu_block_m", "a positive int or None"),
    ],
    ids=["elementwise", "reduction", "product", "product-gpu"],
)
@pytest.mark.parametrize("value", [0, -128, 128.0, True, "128"])
def test_a_bad_block_is_a_value_error_naming_the_keyword_and_value(module, kernel, shapes, keyword, expected, value):
    function = getattr(generated_module(module), kernel)
    message = f"{kernel}: {keyword} must be {expected}, got {value!r}"
    with pytest.raises(ValueError, match=f"(?m)^{re.escape(message)}$"):
        function(*(f32(*shape) for shape in shapes), **{keyword: value})


def test_a_gpu_block_of_none_is_chosen_at_call_time():
    """None (the default) takes the block tuned for the GPU (pallasgen tune --gpu), else the spec's."""
    module = generated_module("softmax")
    x = f32(8, 8)
    np.testing.assert_allclose(module.softmax(x, gpu_block_m=None), module.softmax_reference(x), rtol=1e-6)


# --------------------------------------------------------------------------- lists and scalars


@pytest.mark.parametrize(
    ("module", "kernel", "shapes"),
    [
        ("add_vectors", "add_vectors", [(5,), (5,)]),
        ("softmax", "softmax", [(3, 5)]),
        ("matmul", "matmul", [(3, 4), (4, 5)]),
    ],
    ids=["elementwise", "reduction", "product"],
)
def test_lists_convert_as_jax_numpy_converts_them(module, kernel, shapes):
    function = getattr(generated_module(module), kernel)
    arrays = [f32(*shape) for shape in shapes]
    np.testing.assert_array_equal(function(*(a.tolist() for a in arrays)), function(*arrays))
    np.testing.assert_array_equal(function(*(tuple(a.tolist()) for a in arrays)), function(*arrays))


def test_a_list_of_the_wrong_dtype_is_refused_as_an_array_would_be(matmul):
    with pytest.raises(TypeError, match=r"(?m)^matmul_bias_gelu: x must be bfloat16, got float32$"):
        matmul.matmul_bias_gelu([[1.0]], [[1.0]], [1.0])


def test_a_scalar_for_an_array_names_the_dimensions():
    with pytest.raises(ValueError, match=r"(?m)^softmax: x must have dimensions \[M, N\], got shape \(\)$"):
        generated_module("softmax").softmax(1.0)


@pytest.mark.parametrize("value", [None, [[1.0], [1.0, 2.0]]], ids=["None", "ragged-list"])
def test_what_does_not_convert_to_an_array_is_a_type_error_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"(?m)^add_vectors: y is not an array, nor converts to one \("):
        generated_module("add_vectors").add_vectors([1.0, 2.0], value)
