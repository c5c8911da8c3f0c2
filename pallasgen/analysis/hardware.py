"""Hardware facts that stages below the backends need too (gradient derivation blocks
the kernels it derives by them), kept here, jax-free, so that each is written once:
the backends (backends.tpu.tiling, backends.gpu) read them from here."""

from __future__ import annotations

# A TPU vector register is SUBLANES x LANES 32-bit elements: a block whose last dimension
# is a multiple of LANES (and second-to-last of SUBLANES) tiles in any position.
TPU_SUBLANES, TPU_LANES = 8, 128

# The GPU (Triton) block of what a derived backward kernel sums over where the forward
# sets none (gradients.products._gpu_blocks says why: Triton's defaults spilled registers).
GPU_BACKWARD_DEPTH = 32


def lane_tiles(size: int) -> int:
    """`size` rounded up to a whole number of TPU lane tiles."""
    return -(-size // TPU_LANES) * TPU_LANES
