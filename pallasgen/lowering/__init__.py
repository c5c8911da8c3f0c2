"""Lowering shared by every backend: Python names, expressions as code, the public signature and the jax.numpy reference."""
