"""Facts and rules that the generator and the runtime share. The build path imports this
module, so it imports no jax (tests/test_layers.py)."""

from __future__ import annotations

MIB = 1024 * 1024


def default_sizes(dims) -> dict[str, str]:
    """A generated kernel's keyword for each dimension's size where its decorator names
    none (`rt.kernel`'s `sizes`): the dimension's name in lower case, in the order the
    outputs, then the inputs, first name them (`dims`: their dimensions in that order)."""
    return {dim: dim.lower() for dim in dims}


# The values a generated function's `gpu_backend` keyword names (None, its default, lets
# the kernel choose by the GPU: `support.gpu_kernel`).
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


# What a Mosaic GPU product may choose (`mgpu_block_*`, `mgpu_stages`; its K blocks depend
# on its dtypes), and what bounds the choice on an H100 or H200.
MGPU_BLOCKS_M = (64, 128)  # one warpgroup's wgmma rows, once or twice
MGPU_BLOCKS_N = (64, 128, 256)  # wgmma's N: a multiple of 8 up to 256
MGPU_STAGES = (1, 2, 3, 4, 5, 6)
MGPU_ACCUMULATOR_MOST = 128 * 128  # f32 elements of one warpgroup's accumulator: 128 registers a thread
# The shared memory a GPU gives one block (KiB), by CUDA compute capability: 227 on Hopper
# (an H100, an H200) and Blackwell data-centre GPUs; 99 on those not listed.
SHARED_KIB_BY_CAPABILITY = {(7, 0): 96, (7, 2): 96, (7, 5): 64, (8, 0): 163, (8, 7): 163, (9, 0): 227, (10, 0): 227}
MGPU_SMEM_PER_BLOCK = SHARED_KIB_BY_CAPABILITY[9, 0] * 1024  # an H100's (or H200's)
# A warp-specialized Mosaic GPU pipeline (attention's): blocks of the swept dimension in
# flight, and the registers a thread of the warpgroup that copies them in keeps (as jax's
# own kernels), the rest going to the warpgroups that compute.
MGPU_SWEPT_STAGES = 2
MGPU_MEMORY_REGISTERS = 40
# The swept dimension's blocks, largest first: the call takes the first whose tiles fit
# (rt.mgpu_swept_block). An H200 ran attention's forward pass 17% (full) and 23% (causal)
# faster at 128 keys than at 64 (benchmarks/RESULTS.md, the probes).
MGPU_SWEPT_BLOCKS = (128, 64)
# Shared memory a warp-specialized pipeline takes beside its buffers (its barriers, their
# alignment): Mosaic GPU's count of attention's at D = 192 (232,496 bytes) less the buffers'.
MGPU_PIPELINE_KIB = 3

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


def block_keyword(dim: str) -> str:
    """The keyword argument that sets a dimension's block size: `M` -> `block_m`."""
    return f"block_{dim.lower()}"


def tiling_rule_words(dim: str, multiple: int, held: str, smallest_power_of_two: int | None = None) -> str:
    """Mosaic's tiling rule for blocks of `dim` in words, as spec errors and call-time errors
    give it. `held` says how the arrays that set the rule hold the dimension: "lanes" (the
    last dimension of their blocks), "DTYPE rows" (the second-to-last, of DTYPE values) or
    "1-D DTYPE" (the one dimension of a DTYPE array)."""
    if held == "lanes":
        why = f"{dim} is the last dimension of a block"
    elif held.endswith(" rows"):
        why = f"{dim} is the second-to-last dimension of a block of {held.removesuffix(' rows')} values"
    else:
        why = f"{dim} is the dimension of a one-dimensional {held.removeprefix('1-D ')} array"
    if smallest_power_of_two:
        return f"{why}, so it is a multiple of {multiple} or a power of two of at least {smallest_power_of_two}"
    return f"{why}, so it is a multiple of {multiple}"


def tiles_on_tpu(block: int, multiple: int, smallest_power_of_two: int | None = None, size: int | None = None) -> bool:
    """Whether Mosaic can tile a block of `block` elements: a multiple of `multiple`, or
    (for a one-dimensional array) a power of two of at least `smallest_power_of_two`, or
    the whole dimension (`size`, where known). The generator checks spec blocks by it, and
    a generated launcher the blocks of a call."""
    if block == size or block % multiple == 0:
        return True
    return bool(smallest_power_of_two) and block >= smallest_power_of_two and block & (block - 1) == 0
