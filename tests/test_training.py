"""The README's training example (benchmarks/train_mlp.py): a two-layer MLP trained with
jax.grad through pallasgen kernels, against the same model on their jax.numpy references."""

from __future__ import annotations

import jax
import numpy as np
from kernel_cases import ROOT, load_module


def test_the_mlp_learns_with_pallasgen_kernels_as_it_does_on_jax_numpy():
    train_mlp = load_module(ROOT / "benchmarks" / "train_mlp.py", "_pallasgen_train_mlp")
    ours, _ = train_mlp.train(kernels=True, steps=8, learning_rate=0.5, seed=0)
    theirs, _ = train_mlp.train(kernels=False, steps=8, learning_rate=0.5, seed=0)
    assert ours[-1] < 0.5 * ours[0]
    np.testing.assert_allclose(ours, theirs, rtol=2e-3)


def test_the_kernels_loss_is_differentiated_by_generated_backward_kernels():
    train_mlp = load_module(ROOT / "benchmarks" / "train_mlp.py", "_pallasgen_train_mlp")
    params, x, label = train_mlp.start(0)
    jaxpr = str(jax.make_jaxpr(jax.grad(train_mlp.model(kernels=True)))(params, x, label))
    for backward in ("cross_entropy_backward", "linear_backward", "matmul_bias_gelu_backward_y"):
        assert backward in jaxpr
