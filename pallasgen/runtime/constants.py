"""Facts and rules that the generator and the runtime share. The build path imports this
module, so it imports no jax (tests/test_layers.py)."""

from __future__ import annotations

MIB = 1024 * 1024

# The values a generated function's `gpu_backend` keyword takes; the first is the default
# until benchmarks/gpu_check.py passes on a Hopper GPU with Mosaic GPU.
GPU_BACKENDS = ("triton", "mosaic_gpu")

# What a project may generate its kernels for (`[tool.pallasgen] targets`, default all):
# Mosaic on TPU, Triton and Mosaic GPU on NVIDIA GPUs. Each backend names its own
# (`Backend.target`).
TARGETS = ("tpu", *GPU_BACKENDS)

# The Triton launch options a generated function takes (`gpu NAME = VALUE` in a spec, and
# its `gpu_warps`, `gpu_stages` keywords), each with the values it allows.
GPU_LAUNCH_OPTIONS = {
    "warps": ("gpu_warps", (1, 2, 4, 8, 16, 32)),
    "stages": ("gpu_stages", (1, 2, 3, 4, 5, 6, 7, 8)),
}

# How a generated function names each keyword of a backend's launcher as its own: the
# TPU's block_m is block_m; Triton's block_m, num_warps, num_stages are gpu_block_m,
# gpu_warps, gpu_stages; Mosaic GPU's block_m, stages are mgpu_block_m, mgpu_stages.
LAUNCHER_KEYWORDS = {
    "tpu": ("", {}),
    "triton": ("gpu_", {"num_warps": "gpu_warps", "num_stages": "gpu_stages"}),
    "mosaic_gpu": ("mgpu_", {"stages": "mgpu_stages"}),
}


def public_keyword(backend: str, launcher_keyword: str) -> str:
    """The public keyword that gives a launcher's keyword (`LAUNCHER_KEYWORDS`)."""
    prefix, renamed = LAUNCHER_KEYWORDS[backend]
    return renamed.get(launcher_keyword, prefix + launcher_keyword)


# jax's `Device.device_kind` of each TPU generation, by the name that `--chip`, tuning
# files and generated tables give it.
TPU_DEVICE_KINDS = {
    "v5e": ("TPU v5 lite", "TPU v5e"),
    "v6e": ("TPU v6 lite", "TPU v6e"),
}

# Scoped VMEM that Mosaic grants a kernel by default on the smallest current TPU (v5e).
SCOPED_VMEM_BYTES = 16 * MIB
# VMEM of a TPU v5e or v6e core is 128 MiB; the most of it a generated launcher asks for
# when its blocks need more than the scoped default: the rest is headroom for Mosaic's own
# scratch and for the intermediates that the generator's VMEM count leaves out.
VMEM_LIMIT_BYTES = 100 * MIB

# A kernel without a matrix product, on a known chip it has no tuned entry for, grows
# its blocks at call time to about this many elements a grid step, within this much
# VMEM: every step costs a fixed ~600 cycles, so small steps leave a memory-bound kernel
# far behind XLA (softmax at 8192^2 with 8-row blocks: 0.98x XLA's estimate on v6e,
# 0.39x with 128 rows; benchmarks/RESULTS_TPU_ESTIMATES.md).
STEP_ELEMENTS = 1 << 20
STEP_VMEM_BYTES = 32 * MIB


def tiles_on_tpu(block: int, multiple: int, smallest_power_of_two: int | None = None, size: int | None = None) -> bool:
    """Whether Mosaic can tile a block of `block` elements: a multiple of `multiple`, or
    (for a one-dimensional array) a power of two of at least `smallest_power_of_two`, or
    the whole dimension (`size`, where known). The generator checks spec blocks by it, and
    a generated launcher the blocks of a call."""
    if block == size or block % multiple == 0:
        return True
    return bool(smallest_power_of_two) and block >= smallest_power_of_two and block & (block - 1) == 0
