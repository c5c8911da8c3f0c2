"""Trains a two-layer MLP with pallasgen kernels, forward and backward, and the same
model on plain jax.numpy (the kernels' references), from the same start, and prints
their losses side by side.

    .venv/bin/python benchmarks/train_mlp.py [--steps 30]

The model: logits = linear(matmul_bias_gelu(x, w1, b1), w2, b2), loss = the mean of
cross_entropy(logits, label). `jax.grad` of the loss runs the generated backward
kernels of all three (and on CPU, every kernel in Pallas interpret mode: times there
say nothing about TPU or GPU speed). The task: labels of a random teacher network,
which the model can learn. Parameters are kept in f32 and cast to bf16 for the kernels.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "generated"))

import losses  # noqa: E402  (the generated modules)
import matmul  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES = 256, 256, 512, 128


def model(kernels):
    """The loss of the MLP, built from the pallasgen kernels or from their references."""
    layer = matmul.matmul_bias_gelu if kernels else matmul.matmul_bias_gelu.reference
    linear = matmul.linear if kernels else matmul.linear.reference
    cross_entropy = losses.cross_entropy if kernels else losses.cross_entropy_reference

    def loss(params, x, label):
        w1, b1, w2, b2 = params
        hidden = layer(x, w1.astype(jnp.bfloat16), b1)
        logits = linear(hidden, w2.astype(jnp.bfloat16), b2)
        return jnp.mean(cross_entropy(logits, label))

    return loss


def start(seed: int):
    """The parameters (f32) and a data set labelled by a random teacher network."""
    rng = np.random.default_rng(seed)
    params = (
        rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        np.zeros(HIDDEN),
        rng.standard_normal((CLASSES, HIDDEN)) / np.sqrt(HIDDEN),  # linear's weight is [N, K]
        np.zeros(CLASSES),
    )
    x = rng.standard_normal((BATCH, FEATURES))
    teacher = rng.standard_normal((FEATURES, CLASSES))
    label = np.argmax(np.tanh(x @ teacher), axis=1)
    return (
        tuple(jnp.asarray(p, jnp.float32) for p in params),
        jnp.asarray(x, jnp.bfloat16),
        jnp.asarray(label, jnp.int32),
    )


def train(kernels: bool, steps: int, learning_rate: float, seed: int):
    """The loss before each step and the median seconds per step (after the first)."""
    params, x, label = start(seed)
    step = jax.jit(jax.value_and_grad(model(kernels)))
    losses_seen, seconds = [], []
    for _ in range(steps):
        began = time.perf_counter()
        value, grads = step(params, x, label)
        value.block_until_ready()
        seconds.append(time.perf_counter() - began)
        losses_seen.append(float(value))
        params = tuple(p - learning_rate * g for p, g in zip(params, grads))
    return losses_seen, float(np.median(seconds[1:] or seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ours, our_seconds = train(True, args.steps, args.learning_rate, args.seed)
    theirs, their_seconds = train(False, args.steps, args.learning_rate, args.seed)
    print(f"{jax.default_backend()}, jax {jax.__version__}: MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH}")
    print("step  loss (pallasgen kernels)  loss (jax.numpy)")
    for i in sorted({*range(0, args.steps, max(1, args.steps // 6)), args.steps - 1}):
        print(f"{i:4d}  {ours[i]:24.4f}  {theirs[i]:16.4f}")
    print(f"seconds per step: pallasgen {our_seconds:.4f}, jax.numpy {their_seconds:.4f}")
    gap = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"largest difference between the two losses: {gap:.2e}")


if __name__ == "__main__":
    main()
