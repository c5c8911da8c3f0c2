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
    np.testing.assert_allclose(module.softmax(x, gpu_block_m=None), module.softmax.reference(x), rtol=1e-6)


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


# --------------------------------------------------------------------------- params and launch keywords
#
# A param is static: a Python number of the param's kind, fixed when the call is traced.
# Anything else, and a traced value, is refused before jax sees it, naming the kernel.


@pytest.fixture(scope="module")
def attention():
    return generated_module("attention")


def bf16(*shape):
    import ml_dtypes

    return f32(*shape).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("value", [None, "abc", True, [0.5], 1 + 2j], ids=["None", "str", "bool", "list", "complex"])
def test_a_param_that_is_not_a_number_of_its_kind_is_a_type_error_naming_it(attention, value):
    q = bf16(1, 1, 8, 16)
    message = f"attention: scale must be a Python number (float32), got {value!r}"
    with pytest.raises(TypeError, match=f"(?m)^{re.escape(message)}$"):
        attention.attention(q, q, q, scale=value)


@pytest.mark.parametrize(
    "value", [1, 0.5, np.float32(0.5), np.int64(2)], ids=["int", "float", "np.float32", "np.int64"]
)
def test_a_param_takes_any_real_python_or_numpy_number(attention, value):
    q = bf16(1, 1, 8, 16)
    o, lse = attention.attention(q, q, q, scale=value)
    want_o, want_lse = attention.attention.reference(q, q, q, scale=value)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(want_lse), rtol=1e-2)


def test_a_traced_param_is_refused_as_static(attention):
    import jax

    q = bf16(1, 1, 8, 16)
    with pytest.raises(TypeError, match=r"(?m)^attention: scale is static and must be a Python number, got a traced"):
        jax.jit(lambda s: attention.attention(q, q, q, scale=s))(0.5)


def test_a_jax_array_for_a_block_is_refused_as_static():
    import jax.numpy as jnp

    with pytest.raises(TypeError, match=r"(?m)^softmax: block_m is static and must be a Python number, got a jax"):
        generated_module("softmax").softmax(f32(8, 8), block_m=jnp.int32(8))


@pytest.mark.parametrize("value", ["abc", object()], ids=["str", "object"])
def test_an_array_argument_that_jax_cannot_take_names_the_argument(value):
    with pytest.raises(TypeError, match=r"(?m)^softmax: x is not an array, nor converts to one \("):
        generated_module("softmax").softmax(value)


@pytest.mark.parametrize(
    ("keyword", "value", "expected"),
    [
        ("gpu_warps", -1, "one of 1, 2, 4, 8, 16, 32 or None"),
        ("gpu_warps", 3, "one of 1, 2, 4, 8, 16, 32 or None"),
        ("gpu_warps", 4.0, "one of 1, 2, 4, 8, 16, 32 or None"),
        ("gpu_stages", "x", "one of 1, 2, 3, 4, 5, 6, 7, 8 or None"),
        ("gpu_stages", True, "one of 1, 2, 3, 4, 5, 6, 7, 8 or None"),
        ("interpret", "yes", "None, True, False or a pltpu.InterpretParams (plgpu.InterpretGPUParams on Mosaic GPU)"),
        ("interpret", 1, "None, True, False or a pltpu.InterpretParams (plgpu.InterpretGPUParams on Mosaic GPU)"),
    ],
)
def test_launch_keywords_are_checked_on_every_platform(keyword, value, expected):
    message = f"softmax: {keyword} must be {expected}, got {value!r}"
    with pytest.raises(ValueError, match=f"(?m)^{re.escape(message)}$"):
        generated_module("softmax").softmax(f32(8, 8), **{keyword: value})


def test_interpret_takes_interpret_params():
    from jax.experimental.pallas import tpu as pltpu

    module = generated_module("softmax")
    x = f32(8, 8)
    np.testing.assert_allclose(
        module.softmax(x, interpret=pltpu.InterpretParams()), module.softmax.reference(x), rtol=1e-6
    )


def test_attention_over_no_keys_is_a_clear_error():
    """Every query's max over T=0 is undefined (the reference fails too): a clear error."""
    q, k = bf16(1, 1, 8, 16), bf16(1, 1, 0, 16)
    with pytest.raises(ValueError, match=r"(?m)^attention: T=0 leaves "):
        generated_module("attention").attention(q, k, k)
