"""A generated function called with the wrong arrays says which operand and why."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_cases import generated_module


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
