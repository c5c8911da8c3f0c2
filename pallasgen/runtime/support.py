"""The code that every generated module shares, imported there as `rt`.

A generated function (`kernel`: its reference, and the launch declared as data) checks
its call (`operands`, `check_blocks`), answers a call with an empty dimension
(`without_elements`), and runs the kernel built for the platform it is compiled for
(`on_platform`): Mosaic on TPU, Triton or Mosaic GPU on NVIDIA GPUs
(`gpu_kernel`), the TPU kernel interpreted elsewhere. Its TPU and GPU launchers choose
blocks at call time (`tpu_blocks`, `gpu_options`), and its kernel bodies call the small
functions below (masks, running reductions, Mosaic GPU layouts).

Keywords every generated function takes beside its arrays and params:

- `block_*`: TPU block sizes; a block never exceeds its dimension. None: the blocks
  tuned for the TPU compiled for and the call's sizes (`pallasgen tune`), else the
  chip's defaults, else the spec's.
- `gpu_block_*`, `gpu_warps`, `gpu_stages`: the same on NVIDIA GPUs (Triton; powers of
  two). None: those `pallasgen tune --gpu` timed best on the GPU at the nearest sizes,
  else the spec's.
- `gpu_backend`: on NVIDIA GPUs, "triton" or "mosaic_gpu" (sm_90 and later). None (the
  default): Mosaic GPU from sm_90 on for a kernel whose `kernel(...)` says
  `on_hopper="mosaic_gpu"` (those with a matrix product: faster there on an H200, as
  Triton is for the others; benchmarks/RESULTS.md), else Triton. A kernel that
  Mosaic GPU does not take runs on Triton either way (its docstring says why).
- `mgpu_block_*`, `mgpu_stages` (products): Mosaic GPU's blocks (wgmma tiles) and K
  pipeline depth. None: those `pallasgen tune --gpu --gpu-backend mosaic_gpu` timed
  best on the GPU at the nearest sizes, else the built-in ones.
- `interpret`: None compiles on TPU and GPU and interprets elsewhere; False always
  compiles; True or a `pltpu.InterpretParams` interprets the TPU kernel on any platform.
- each param of the spec: a static Python (or NumPy) number of the param's kind.

`Kernel` (a generated function, made by `kernel`) checks these on every platform before jax sees the call:
none is a traced value, and a call that jax could not take fails with a TypeError or
ValueError that names the kernel.

A module generated for some targets only (`[tool.pallasgen] targets`) has only their
keywords (`gpu_backend` only with both GPU targets) and kernels; without "tpu", the
Triton kernel is the one interpreted, and with neither, nothing is (`on_platform`).

Importing this module changes no process-wide state: the warning filter that silences
the Triton backend's deprecation applies only while a kernel lowers for CUDA, and the
primitive behind `platform_dependent` is registered with jax on first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import textwrap
import warnings
from typing import NamedTuple

import jax
import jax.extend.core
import jax.interpreters.batching
import jax.interpreters.mlir
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from pallasgen.runtime.constants import (
    default_sizes,
    GPU_BACKENDS,
    GPU_LAUNCH_OPTIONS,
    MGPU_ACCUMULATOR_MOST,
    MGPU_BLOCKS_M,
    MGPU_BLOCKS_N,
    MGPU_MEMORY_REGISTERS,
    MGPU_PIPELINE_KIB,
    MGPU_SMEM_PER_BLOCK,
    MGPU_SWEPT_BLOCKS,
    MGPU_SWEPT_STAGES,
    MGPU_STAGES,
    SCOPED_VMEM_BYTES,
    SHARED_KIB_BY_CAPABILITY,
    STEP_ELEMENTS,
    STEP_VMEM_BYTES,
    TPU_DEVICE_KINDS,
    VMEM_LIMIT_BYTES,
    block_keyword,
    public_keyword,
    tiles_on_tpu,
    tiling_rule_words,
)

try:
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError:  # jax 0.10.2 imports it only with absl-py (pallasgen's jax extra brings it)
    plgpu = None

# The values each Triton launch keyword (gpu_warps, gpu_stages) takes beside None.
_LAUNCH_OPTIONS = dict(GPU_LAUNCH_OPTIONS.values())
_LOG2E = 1.4426950408889634  # log2(e), as Mosaic GPU's own approximate exp takes it
# What `interpret` takes beside None, True and False: the TPU interpreter's parameters, and
# on jax 0.12 Mosaic GPU's (its kernels run in Mosaic GPU's interpreter with them).
_INTERPRET_PARAMS = tuple(
    params
    for params in (getattr(pltpu, "InterpretParams", None), getattr(plgpu, "InterpretGPUParams", None))
    if params is not None
)

# The TPU generation of each `Device.device_kind`, as tuning tables name it.
TPU_CHIPS = {kind: chip for chip, kinds in TPU_DEVICE_KINDS.items() for kind in kinds}


def gpu_kernel(kernel, gpu_backend, triton, mosaic_gpu, on_hopper=None):
    """The GPU kernel that `gpu_backend` names: Triton's, or Mosaic GPU's where the kernel
    has one (`mosaic_gpu` None: it has not, and runs on Triton). None names `on_hopper`'s
    from sm_90 on where the kernel has one, else Triton's."""
    if gpu_backend is None:
        capability = gpu_capability()
        gpu_backend = on_hopper if on_hopper and capability and capability >= (9, 0) else "triton"
    if gpu_backend not in GPU_BACKENDS:
        choices = " or ".join(f'"{name}"' for name in GPU_BACKENDS)
        raise ValueError(f"{kernel}: gpu_backend must be {choices} or None, got {gpu_backend!r}")
    if gpu_backend == "triton" or mosaic_gpu is None:
        return triton

    def on_mosaic_gpu(*arrays, **keywords):  # called only where the module lowers for CUDA
        if plgpu is None:
            raise ImportError(f'{kernel}: gpu_backend="mosaic_gpu" needs absl-py on jax 0.10.2 (pip install absl-py)')
        return mosaic_gpu(*arrays, **keywords)

    return on_mosaic_gpu


def _gpu_device():
    """The GPU being compiled for: the default device if it is a GPU, else the first GPU
    (None without one)."""
    device = jax.config.jax_default_device
    if getattr(device, "platform", None) == "gpu":
        return device
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:  # no GPU backend
        return None


def gpu_device_kind():
    """The kind of the GPU being compiled for, as tuning tables name it, or None."""
    return getattr(_gpu_device(), "device_kind", None)


def gpu_capability():
    """The CUDA compute capability (major, minor) of the GPU being compiled for, or None
    (no GPU here, or not an NVIDIA one)."""
    capability = getattr(_gpu_device(), "compute_capability", None)
    return tuple(int(part) for part in capability.split(".")) if capability else None


def shared_memory_per_block():
    """The bytes of shared memory a program may take on the GPU being compiled for; an
    H100's where no GPU is here (an export, as the compile tier's)."""
    capability = gpu_capability()
    return MGPU_SMEM_PER_BLOCK if capability is None else 1024 * SHARED_KIB_BY_CAPABILITY.get(capability, 99)


def gpu_options(table, sizes, given):
    """The blocks and launch options of a GPU call (Triton's, or Mosaic GPU's blocks and
    stages): those `given` (not None) as they are, the others from `table`: for the GPU
    compiled for (see `gpu_device_kind`), the tuned entry whose sizes are nearest the
    call's (in powers of two), else the built-in ones, `table[None]`."""

    def distance(tuned_sizes):
        return sum(abs(a.bit_length() - b.bit_length()) for a, b in zip(tuned_sizes, sizes))

    if None not in given:
        return given
    kind = gpu_device_kind() if len(table) > 1 else None  # table[None] alone: nothing tuned
    tuned = table.get(kind) if kind is not None else None
    chosen = tuned[min(tuned, key=distance)] if tuned else table[None]
    return tuple(value if value is not None else choice for value, choice in zip(given, chosen))


class GpuOptions(NamedTuple):
    """A GPU launcher's choices (Triton's blocks, then num_warps and num_stages; Mosaic
    GPU's blocks and stages; in the order of its keywords), which the public function
    makes before it calls the launcher (`triton_options`, `gpu_options`): `table` maps a
    GPU kind to its tuned choices, by the sizes they were tuned at, in the order of
    `dims`; None to the spec's. `least`: a Triton block's least (one for all, or one each)."""

    table: dict
    dims: tuple
    least: object = 1


def triton_options(table, sizes, given, least=1):
    """`gpu_options` of a Triton launcher, its blocks (the first of `given`, one for each
    of the first `sizes`) each a power of two from `least` (one for all, or one each) up
    to its dimension's next power of two: a small dimension is one masked block."""
    chosen = gpu_options(table, sizes, given)
    count = len(given) - len(GPU_LAUNCH_OPTIONS)
    least = least if isinstance(least, tuple) else (least,) * count
    blocks = (max(low, min(b, pl.next_power_of_2(size))) for b, size, low in zip(chosen, sizes, least))
    return (*blocks, *chosen[count:])


def row_warps(values):
    """The warps of a Triton program that holds `values` of each array of whole rows (None
    in its table: no spec or tuned entry says): one per 1024 of them, 4 to 32. With four,
    ptxas spills a row of 32768 f32 (softmax's backward: 14 KiB a thread) to local memory."""
    return max(4, min(32, values // 1024))


# The most values of its product a Triton program holds: 128 KiB, half a multiprocessor's
# register file (ptxas spilled 30 KiB a thread of a 64x2048 f32 tile); and the most a
# thread holds without spilling, half of its 255 registers (a 64x512 f32 product on four
# warps, 256 a thread, spilled 860 stores and took ptxas 38 s to compile; 32x512, none
# and 5.5 s).
PRODUCT_VALUES_MOST = 32768
PRODUCT_VALUES_A_THREAD = 128


def fit_dot_blocks(kernel, blocks, least, operand_bytes, product_values, num_warps):
    """A Triton program's blocks, each a power of two no less than `least`, halved while
    its dot's operand blocks (`operand_bytes` of the blocks, stages counted) and half as
    much again (Triton's layout conversions) pass the shared memory of a GPU block, or its
    product's values (`product_values` of the blocks) pass PRODUCT_VALUES_A_THREAD for
    each of the `num_warps` warps' threads, or PRODUCT_VALUES_MOST: each time, the block
    whose halving leaves the least excess. The least blocks are kept where their product
    only spills; raises where they pass the shared memory or PRODUCT_VALUES_MOST."""
    budget, blocks = shared_memory_per_block(), list(blocks)
    in_registers = min(num_warps * 32 * PRODUCT_VALUES_A_THREAD, PRODUCT_VALUES_MOST)

    def excess(b):
        return max(3 * operand_bytes(*b) / 2 / budget, product_values(*b) / in_registers)

    while excess(blocks) > 1:
        halved = [blocks[:i] + [b // 2] + blocks[i + 1 :] for i, b in enumerate(blocks) if b // 2 >= least[i]]
        if not halved:
            break
        blocks = min(halved, key=excess)
    if 3 * operand_bytes(*blocks) / 2 > budget or product_values(*blocks) > PRODUCT_VALUES_MOST:
        raise ValueError(
            f"{kernel}: at its least blocks a Triton program holds {product_values(*blocks)} values of its product"
            f" (at most {PRODUCT_VALUES_MOST}) and {operand_bytes(*blocks) // 1024} KiB of operands in shared memory"
            f" and Triton about half as much again (at most {budget // 1024} KiB here); on Hopper, use"
            ' gpu_backend="mosaic_gpu"'
        )
    return tuple(blocks)


def mgpu_check_whole(kernel, dim, size, block, most):
    """Refuses a dimension of `size` that Mosaic GPU would hold whole in one `block` (its
    size padded to what TMA copies) larger than `most`, before anything compiles."""
    if block > most:
        raise ValueError(
            f'{kernel}: gpu_backend="mosaic_gpu" holds {dim} whole, up to {most}; got {dim}={size}'
            ' (use gpu_backend="triton")'
        )


def _mgpu_smem_kib(warpgroups, tiles, blocks):
    """Shared memory, in KiB, that `warpgroups` computing warpgroups' `tiles` (their bytes)
    take beside the swept `blocks` in flight (bytes of each input's), which they share:
    each buffer takes whole KiB (swizzled tiles are aligned so), and the pipeline's
    barriers some more."""

    def kib(sizes):
        return sum(-(-size // 1024) for size in sizes)

    return kib(warpgroups * size for size in tiles) + kib(blocks) + MGPU_PIPELINE_KIB


def mgpu_warpgroups(kernel, tiles, blocks, most=2):
    """How many warpgroups compute a warp-specialized Mosaic GPU program: `most`, or fewer
    where theirs do not fit a block's shared memory (`_mgpu_smem_kib`). Refuses, before
    anything compiles, a program whose one warpgroup would not fit."""
    for warpgroups in range(most, 0, -1):
        needed = _mgpu_smem_kib(warpgroups, tiles, blocks)
        if needed * 1024 <= MGPU_SMEM_PER_BLOCK:
            return warpgroups
    raise ValueError(
        f'{kernel}: gpu_backend="mosaic_gpu" needs {needed} KiB of shared memory at these sizes, more than the'
        f' {MGPU_SMEM_PER_BLOCK // 1024} KiB of a block (use gpu_backend="triton")'
    )


def mgpu_swept_block(kernel, size, sizes, most=2):
    """The swept dimension's block and the computing warpgroups: the first of
    MGPU_SWEPT_BLOCKS that `size` needs (past the next one's) and at which `most`
    warpgroups' tiles fit beside the blocks in flight (`sizes(block)`: their bytes, as
    mgpu_warpgroups takes them); else the last, with as many warpgroups as fit."""
    blocks = MGPU_SWEPT_BLOCKS
    for block, smaller in zip(blocks, blocks[1:]):
        if size > smaller and _mgpu_smem_kib(most, *sizes(block)) * 1024 <= MGPU_SMEM_PER_BLOCK:
            return block, most
    return blocks[-1], mgpu_warpgroups(kernel, *sizes(blocks[-1]), most=most)


def mgpu_warp_specialized(step, program, warpgroups, grid, in_specs):
    """A pass over the swept dimension's blocks (`grid`, `in_specs`), warp-specialized: the
    last warpgroup copies the blocks in by TMA, MGPU_SWEPT_STAGES in flight, while each of
    the first `warpgroups` runs `program`, which calls the pipeline with its initial carry:
    the pipeline calls `step(indices, *blocks, carry)` for each block, which returns the
    next carry, and returns the last."""
    return plgpu.emit_pipeline_warp_specialized(
        step,
        grid=grid,
        in_specs=in_specs,
        max_concurrent_steps=MGPU_SWEPT_STAGES,
        num_compute_wgs=warpgroups,
        memory_registers=MGPU_MEMORY_REGISTERS,
        wg_axis="wg",
        compute_context=program,
    )


def mgpu_check_choices(kernel, dims, chosen, depths, smem):
    """Refuses Mosaic GPU blocks and stages it cannot run, before anything compiles:
    `chosen` are a product's blocks of its M, N and K (`dims`, the kernel's names of
    them: the keywords are mgpu_block_<dim>) and its stages, `depths` the K blocks that
    wgmma takes of its dtype, `smem` the bytes of shared memory that they take."""
    keywords = [f"mgpu_block_{dim.lower()}" for dim in dims.split()] + ["mgpu_stages"]
    for keyword, value, allowed in zip(keywords, chosen, (MGPU_BLOCKS_M, MGPU_BLOCKS_N, depths, MGPU_STAGES)):
        if type(value) is not int or value not in allowed:
            raise ValueError(
                f"{kernel}: {keyword} must be one of {', '.join(map(str, allowed))} or None, got {value!r}"
            )
    if chosen[0] * chosen[1] > MGPU_ACCUMULATOR_MOST:
        raise ValueError(
            f"{kernel}: a Mosaic GPU accumulator of {chosen[0] * chosen[1]} elements (mgpu_block_* of M times N)"
            f" is more than one warpgroup's registers hold ({MGPU_ACCUMULATOR_MOST})"
        )
    if smem > MGPU_SMEM_PER_BLOCK:
        raise ValueError(
            f"{kernel}: these Mosaic GPU blocks and stages take {smem // 1024} KiB of shared memory,"
            f" more than the {MGPU_SMEM_PER_BLOCK // 1024} KiB of a block: choose smaller ones or fewer stages"
        )


def mgpu_pad(array, shape):
    """`array` padded with zeros at the end of each axis to `shape` (itself if it has it)."""
    if array.shape == shape:
        return array
    return jnp.pad(array, [(0, padded - size) for size, padded in zip(array.shape, shape)])


def mgpu_swizzled(dtype, columns):
    """The shared-memory tiling and swizzle of a 2-D block `columns` wide, as wgmma and
    the WGMMA register layout read it."""
    swizzle = plgpu.find_swizzle(columns * jnp.dtype(dtype).itemsize * 8)
    return plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(swizzle)


def mgpu_spec(shape, index_map, dtype):
    """A pipeline's BlockSpec of 2-D blocks of `dtype`, tiled and swizzled in shared
    memory as wgmma and the WGMMA layout read them (`mgpu_swizzled`)."""
    return plgpu.BlockSpec(shape, index_map, transforms=mgpu_swizzled(dtype, shape[-1]))


def mgpu_smem(shape, dtype):
    """Scratch shared memory of `shape` whose last two axes are tiled and swizzled as
    `mgpu_spec`'s blocks."""
    return plgpu.SMEM(shape, dtype, transforms=mgpu_swizzled(dtype, shape[-1]))


def mgpu_grid_indices(*counts):
    """This program's index along each axis of its grid, decoded from its index in the
    kernel's one-dimensional grid ("programs"), the last axis fastest: `counts` are the
    programs along each axis but the first."""
    program = jax.lax.axis_index("programs")
    indices = []
    for count in reversed(counts):
        indices.append(jax.lax.rem(program, count))
        program = jax.lax.div(program, count)
    return (program, *reversed(indices))


def mgpu_copy_in(ref, smem, barrier):
    """Copies a block of global memory (`ref`) into shared memory by TMA and waits for it."""
    plgpu.copy_gmem_to_smem(ref, smem, barrier)
    plgpu.barrier_wait(barrier)


def mgpu_copy_out(*tiles):
    """Copies each (tile in shared memory, its place in global memory) out by TMA, once
    the kernel's writes to shared memory are visible to it, and waits for the copies."""
    plgpu.commit_smem()
    for smem, ref in tiles:
        plgpu.copy_smem_to_gmem(smem, ref)
    plgpu.wait_smem_to_gmem(0)


def mgpu_load(ref, shape, dims):
    """A block in the WGMMA register layout, of `shape`: a 2-D block as it is, a vector
    along `dims` (its position in `shape`) in the layout's row or column, broadcast."""
    if len(dims) == len(shape):
        return plgpu.layout_cast(ref[...], plgpu.Layout.WGMMA)
    vector = plgpu.layout_cast(ref[...], plgpu.Layout.WGMMA.reduce(1 - dims[0]))
    return jax.lax.broadcast_in_dim(vector, shape, dims)


def mgpu_spread(vector, shape, dim):
    """A vector along axis `dim` of a block (the WGMMA layout's row or column layout)
    broadcast over the block's other axis."""
    return jax.lax.broadcast_in_dim(vector, shape, (dim,))


def mgpu_load_vector(ref, dim):
    """A vector along axis `dim` of a block, from shared memory, in the WGMMA layout's row
    (0) or column (1) layout."""
    return plgpu.layout_cast(ref[...], plgpu.Layout.WGMMA.reduce(1 - dim))


def mgpu_full(size, value, dtype, dim):
    """A running value per position along axis `dim` of a block, `value` in each."""
    return plgpu.layout_cast(jnp.full((size,), value, dtype), plgpu.Layout.WGMMA.reduce(1 - dim))


def mgpu_positions(start, shape, axis):
    """The positions of a block along `axis`, from `start`, in the WGMMA layout."""
    return start + plgpu.broadcasted_iota(jnp.int32, shape, axis, layout=plgpu.Layout.WGMMA)


def mgpu_vector_positions(start, size, axis):
    """The positions of a block along `axis` of a tile, from `start`: a vector in the
    WGMMA layout's row (0) or column (1) layout."""
    layout = plgpu.Layout.WGMMA.reduce(1 - axis)
    return start + plgpu.broadcasted_iota(jnp.int32, (size,), 0, layout=layout)


def mgpu_fill_past(value, start, size, axis, identity, ragged=True):
    """`value` (a tile, or a vector along `axis` of one) with `identity` at the
    positions along `axis` (from `start`) past `size`: never the padding that TMA copied
    there. `value` itself where `ragged` is false (blocks tile `size`)."""
    if not ragged:
        return value
    if value.ndim == 1:
        positions = mgpu_vector_positions(start, value.shape[0], axis)
    else:
        positions = mgpu_positions(start, value.shape, axis)
    return jnp.where(positions < size, value, identity)


def mgpu_exp(x):
    """exp(x) as 2 ** (x * log2(e)): one `ex2.approx` instruction, as Triton's and CUDA's
    fast exp, where Mosaic GPU lowers jnp.exp to an accurate expf (benchmarks/RESULTS.md:
    attention's time). Within about 2^-22 relative, and the rounding of x * log2(e) (2^-24
    times |x|)."""
    return jnp.exp2(x * _LOG2E)


def mgpu_softmax(x, axis):
    """softmax of a tile along `axis` (in f32), its row (or column) max and sum spread back."""
    top = jnp.max(x, axis=axis)
    e = mgpu_exp(x - mgpu_spread(jnp.where(top > -jnp.inf, top, 0.0), x.shape, 1 - axis))
    return e / mgpu_spread(jnp.sum(e, axis=axis), x.shape, 1 - axis)


def mgpu_kernel(body, out_type, grid, interpret, scratch_types=(), warpgroups=None):
    """plgpu.kernel of `body` over `grid` ({name: programs}); with `warpgroups`, that
    many computing warpgroups and one more that copies, their index named "wg". Compiled
    (not `interpret`ed), the body's products take a computed operand from registers and
    accumulate in place (mgpu_dot), which Mosaic GPU's interpreter does not run."""
    threads = {} if warpgroups is None else dict(num_threads=warpgroups + 1, thread_name="wg")
    kernel = plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch_types,
        grid=tuple(grid.values()),
        grid_names=tuple(grid),
        interpret=interpret,
        **threads,
    )

    def traced(*arrays):  # the body is traced while the kernel is called
        compiled = _MGPU_COMPILED.set(not interpret)
        try:
            return kernel(*arrays)
        finally:
            _MGPU_COMPILED.reset(compiled)

    return traced


# Whether the Mosaic GPU kernel being traced is compiled rather than interpreted (mgpu_kernel).
_MGPU_COMPILED = contextvars.ContextVar("mgpu_compiled", default=False)


def mgpu_dot(shape, lhs, rhs, split=None, lhs_scratch=None, rhs_scratch=None, transposed=False, acc=None):
    """lhs @ rhs by wgmma, in an f32 accumulator of `shape`, added to `acc` if given. Each
    operand is a tile in shared memory, or a value written to its scratch tile there first
    (`lhs_scratch`: one per part); an f32 `lhs` meeting a 16-bit `rhs` is `split` into two
    of that dtype (its high part and the rest). `transposed`: `rhs` holds [N, K]. Compiled
    (mgpu_kernel), a value `lhs` stays in registers, which wgmma reads, and the product
    accumulates into `acc` in place."""
    compiled = _MGPU_COMPILED.get()
    parts = [lhs]
    if split is not None:
        high = lhs.astype(split)
        parts = [high, (lhs - high.astype(jnp.float32)).astype(split)]
    if lhs_scratch is not None and compiled:
        parts = [plgpu.layout_cast(part, plgpu.Layout.WGMMA) for part in parts]
    elif lhs_scratch is not None:
        for part, ref in zip(parts, lhs_scratch):
            ref[...] = part
        parts = lhs_scratch
    if rhs_scratch is not None:
        rhs_scratch[...] = rhs
        rhs = rhs_scratch
    if (lhs_scratch is not None and not compiled) or rhs_scratch is not None:
        plgpu.commit_smem()
    if transposed:
        rhs = rhs.T

    def accumulate(acc_ref):
        for part in parts:
            plgpu.wgmma(acc_ref, part, rhs)

    if acc is not None and compiled:
        return pl.run_state(accumulate)(plgpu.ACC.init(acc))

    def accumulated(acc_ref):
        accumulate(acc_ref)
        return acc_ref[...]

    product = pl.run_scoped(accumulated, plgpu.ACC(shape, jnp.float32))
    return product if acc is None else acc + product


def mgpu_floor(x):
    """floor(x), which Mosaic GPU does not lower, exactly: x rounded to a whole number,
    less one where that rounded up (integers are whole already)."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        return x
    rounded = jnp.round(x)
    return jnp.where(rounded > x, rounded - 1, rounded)


def mgpu_ceil(x):
    """ceil(x), which Mosaic GPU does not lower, exactly (signed zeros too): -floor(-x)."""
    return -mgpu_floor(-x) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x


def mgpu_sqrt(x):
    """sqrt(x), which Mosaic GPU does not lower on jax 0.10.2, from rsqrt: x * rsqrt(x)
    and one Newton step (within an ulp; its residual 1/2 - r*y/2 cannot overflow), in
    f32 (16-bit floats rounded once, back); 0 (of either sign) and inf are themselves,
    negatives NaN."""
    dtype = jnp.result_type(x)
    wide = x.astype(jnp.float32)
    r = jax.lax.rsqrt(wide)
    y = wide * r
    y = y + y * (0.5 - 0.5 * r * y)
    return jnp.where(wide == 0, wide, jnp.where(wide == jnp.inf, wide, y)).astype(dtype)


def mgpu_argbest_step(best, index, x, start, axis, largest):
    """The running (value, first index) of the largest (or smallest) value along `axis`
    after one more block `x` whose positions there start at `start`."""
    block_best = jnp.max(x, axis=axis) if largest else jnp.min(x, axis=axis)
    hits = jnp.where(x == mgpu_spread(block_best, x.shape, 1 - axis), mgpu_positions(start, x.shape, axis), 2147483647)
    better = block_best > best if largest else block_best < best  # ties keep the earlier index
    return jnp.where(better, block_best, best), jnp.where(better, jnp.min(hits, axis=axis), index)


class NotGenerated(NotImplementedError):
    """A kernel called on a platform that its module has no kernel for: the project's
    `[tool.pallasgen] targets` left that platform's backend out."""


_NOT_GENERATED = object()  # a backend's kernel that the module was not generated with


def on_platform(
    kernel,
    arrays,
    *,
    tpu=_NOT_GENERATED,
    triton=_NOT_GENERATED,
    mosaic_gpu=_NOT_GENERATED,
    gpu_backend=None,
    on_hopper=None,
    interpret,
):
    """Runs `kernel` on `arrays` as built for the platform being compiled for: `tpu`,
    else on NVIDIA GPUs the kernel that `gpu_backend` names (`gpu_kernel`: `triton`, or
    `mosaic_gpu` where it is not None; None: `on_hopper`'s from sm_90 on, else `triton`).
    Each takes the arrays and `interpret`.

    The choice follows the lowering platform, not the host, so ahead-of-time compiles
    and exports (for one platform, or for several at once) get the right kernel: Mosaic
    on TPU, Triton (or Mosaic GPU) on NVIDIA GPUs, and elsewhere (CPU) the TPU kernel in
    interpret mode, or compiled if `interpret` is False. A true `interpret` (or `pltpu.InterpretParams`) interprets the TPU kernel
    on every platform.

    A module generated for some targets only (`[tool.pallasgen] targets`) passes only
    their kernels: without `tpu`, the Triton kernel is the one interpreted (on CPU, or
    with a true `interpret`); without `gpu_backend`, the GPU kernel is the one there is.
    A platform with no kernel raises `NotGenerated`, naming the kernel and its targets.
    """
    given = {"tpu": tpu, "triton": triton, "mosaic_gpu": mosaic_gpu}
    targets = [name for name, function in given.items() if function is not _NOT_GENERATED]

    def missing(platform, why=""):
        def refuse(*arrays, **keywords):
            raise NotGenerated(
                f"{kernel}: no kernel for {platform}{why}: its module was generated for"
                f" {', '.join(targets)} only ([tool.pallasgen] targets in pyproject.toml);"
                " add the target there and run `pallasgen build`"
            )

        return refuse

    if triton is _NOT_GENERATED and mosaic_gpu is _NOT_GENERATED:
        gpu = missing("NVIDIA GPUs")
    elif triton is _NOT_GENERATED:
        if mosaic_gpu is None:  # Mosaic GPU does not take it: there is no kernel to run anywhere
            missing("any platform", " (Mosaic GPU does not take it; its docstring says why)")()
        gpu = mosaic_gpu
    elif mosaic_gpu is _NOT_GENERATED:
        gpu = triton
    else:
        gpu = gpu_kernel(kernel, gpu_backend, triton, mosaic_gpu, on_hopper)
    # What runs interpreted: the TPU kernel, else Triton's (Mosaic GPU has no interpret mode).
    interpreted = next((given[name] for name in ("tpu", "triton") if name in targets), None)
    if interpreted is None:
        interpreted = missing("CPU or interpret mode", " (Mosaic GPU kernels are not interpreted)")
    if interpret:
        return interpreted(*arrays, interpret=interpret)
    return platform_dependent(
        arrays,
        tpu=functools.partial(tpu if "tpu" in targets else missing("TPU"), interpret=False),
        cuda=functools.partial(gpu, interpret=False),
        default=functools.partial(interpreted, interpret=interpret is None),
        # Mosaic GPU's kernel alone: it gives the shapes (the default one refuses).
        traced=functools.partial(mosaic_gpu, interpret=False) if targets == ["mosaic_gpu"] else None,
    )


def kernel(
    *,
    inputs,
    outputs,
    sizes=None,
    params=None,
    tpu_blocks=None,
    triton_options=None,
    mosaic_gpu_options=None,
    vjp=None,
    saves=None,
    residuals=None,
    saving=None,
    on_hopper=None,
    **launchers,
):
    """The public function of a generated kernel, made from its reference (the function it
    decorates: the same computation in plain jax.numpy, kept as `.reference`) and what
    launching its kernels takes: its `inputs` and `outputs` as the spec declares them (see
    `declared_arrays`), each dimension's size keyword by default `default_sizes`, the rest
    as `Kernel` takes them. Its docstring is the reference's
    with the arrays as Args and Returns (`with_arrays`) and its blocks and params as
    Keywords (`keyword_lines`), declared once, here."""

    def public(reference):
        arrays = {"inputs": declared_arrays(inputs), "outputs": declared_arrays(outputs)}
        named = [d for array in (*arrays["outputs"].values(), *arrays["inputs"].values()) for d in array[1]]
        made = Kernel(
            reference,
            **arrays,
            sizes=sizes or default_sizes(named),
            params=params or {},
            launchers=launchers,
            tpu_blocks=tpu_blocks,
            triton_options=triton_options,
            mosaic_gpu_options=mosaic_gpu_options,
            vjp=vjp,
            saves=saves,
            residuals=declared_arrays(residuals or ()),
            saving=saving,
            on_hopper=on_hopper,
        )
        keywords = keyword_lines(reference, params or {}, tpu_blocks, mosaic_gpu_options, triton_options, launchers)
        made.__doc__ = with_arrays(reference, inputs, outputs, keywords)
        return made

    return public


def with_arrays(reference, inputs, outputs, keywords=()):
    """The reference's docstring with Args (each input array, named as the function's
    parameter, of its declared type) and Returns (each output's) after its summary: before
    its first section (Keywords, Gradients), if any; and `keywords` (lines) first in its
    Keywords section, which they open where it has none.

    "x: f32[N] as [1, N]" reads "x: f32[N]": the spec's declaration, not the kernels' layout."""
    lines = inspect.cleandoc(reference.__doc__ or "").splitlines()
    names = list(inspect.signature(reference).parameters)
    args = [f"  {name}: {_declaration(array)[1]}." for name, array in zip(names, inputs)]
    returns = "; ".join(f"{name}: {declared}" for name, declared, _ in map(_declaration, outputs))
    sections = ["Args:", *args, "", "Returns:", f"  {returns}.", ""]
    first = next((i for i, line in enumerate(lines) if line == "Keywords:" or line.startswith("Gradients:")), None)
    if first is None:
        lines, first = [*lines, ""], len(lines) + 1
    if keywords and lines[first : first + 1] == ["Keywords:"]:
        lines[first + 1 : first + 1] = keywords
    elif keywords:
        lines[first:first] = ["Keywords:", *keywords, ""]
    return "\n".join([*lines[:first], *sections, *lines[first:]]).rstrip("\n")


def keyword_lines(reference, params, tpu_blocks=None, mosaic_gpu_options=None, triton_options=None, launchers=()):
    """The Keywords a kernel's docstring says, from what its decorator declares once: its
    TPU blocks and the spec's (`tpu_blocks`), Triton's choices (`triton_options`), a
    product's Mosaic GPU choices (`mosaic_gpu_options`), the GPU backend where it has both
    (`launchers`), `interpret`, and each param (`params`: its dtype) with its default
    (the reference's). The module's docstring (above) says what each means in full."""
    said = []
    if tpu_blocks is not None and tpu_blocks.tiling:
        names = ", ".join(block_keyword(dim) for dim in tpu_blocks.tiling)
        spec = ", ".join(map(str, tpu_blocks.chips[None]["default"]))
        said.append(f"{names}: TPU blocks (None: as its tpu_blocks choose; the spec's: {spec}).")
    if triton_options is not None:
        said.append(
            "gpu_block_*, gpu_warps, gpu_stages: Triton's blocks (powers of two) and launch options"
            " (None: as its triton_options choose by GPU kind and sizes)."
        )
    if mosaic_gpu_options is not None:
        said.append(
            "mgpu_block_*, mgpu_stages: Mosaic GPU's blocks (wgmma tiles) and K pipeline depth"
            " (None: as its mosaic_gpu_options choose by GPU kind and sizes)."
        )
    if "triton" in launchers and "mosaic_gpu" in launchers:
        said.append(
            'gpu_backend: "triton" or "mosaic_gpu" (sm_90 on); None: Mosaic GPU from sm_90 on where its'
            " on_hopper says so, else Triton."
        )
    said.append("interpret: None interprets where no kernel compiles (as on CPU); True or False forces it.")
    defaults = inspect.signature(reference).parameters
    spec_names = {jnp.dtype(dtype): name for name, dtype in SPEC_DTYPES.items()}
    for name, dtype in params.items():
        said.append(f"{name}: a static {spec_names[jnp.dtype(dtype)]} (default {defaults[name].default!r}).")
    # as wide as the generator wraps docstrings (its line length less 12), as it wrapped these
    return [line for text in said for line in textwrap.wrap(text, 108, initial_indent="  ", subsequent_indent="    ")]


# The spec's dtypes, by the names it gives them (analysis.dtypes.DTYPES: a test checks the two agree).
SPEC_DTYPES = {
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
    "i32": jnp.int32,
    "i16": jnp.int16,
    "i8": jnp.int8,
    "u8": jnp.uint8,
    "bool": jnp.bool_,
}


def declared_arrays(declared):
    """A kernel's arrays, each declared as the spec declares it ("x: bf16[M, K]"), then
    " as [LAYOUT]" where the kernels hold it with size 1 along dimensions it lacks, as
    `Kernel` takes them: "bias: f32[N] as [1, N]" -> {"bias": (jnp.float32, ("N",), (1, "N"))}."""

    def dims(text):
        return tuple(int(d) if d.isdigit() else d for d in text.split(", ") if d)

    arrays = {}
    for array in declared:
        name, own, layout = _declaration(array)
        dtype, _, own = own.removesuffix("]").partition("[")
        arrays[name] = (SPEC_DTYPES[dtype], dims(own))
        if layout:
            arrays[name] += (dims(layout.removeprefix("[").removesuffix("]")),)
    return arrays


def _declaration(array):
    """ "bias: f32[N] as [1, N]" -> ("bias", "f32[N]", "[1, N]"); the layout "" where none."""
    name, _, rest = array.partition(": ")
    own, _, layout = rest.partition(" as ")
    return name, own, layout


class Kernel:
    """A generated kernel's public function: `jax.jit` of its launch, with every keyword
    static, whose calls are checked before jax sees them.

    - `inputs`, `outputs`: each array's spec name, (dtype, dimensions) and, where the
      kernels hold it with size 1 along dimensions it lacks, that layout: (1, "N") for
      an [N] beside [M, N] arrays.
    - `sizes`: the launchers' keyword for each dimension's size.
    - `params`: each param's dtype (its default is the reference's).
    - `tpu`, `triton`, `mosaic_gpu` (in `launchers`): the launcher of each backend the
      module was generated for (Mosaic GPU's None where it takes no such kernel). Each
      takes the arrays, and as keywords the sizes, params and `interpret` it names, and
      its blocks: a public keyword each, `LAUNCHER_KEYWORDS` says how named.
    - `tpu_blocks` (a `TpuBlocks`), `triton_options`, `mosaic_gpu_options` (`GpuOptions`):
      the TPU launcher's table of blocks, the Triton launcher's of blocks and options, a
      Mosaic GPU product's of blocks and stages, from which a call chooses those it
      leaves None before it launches.
    - `on_hopper`: the GPU backend a call that names none runs from sm_90 on (None: Triton).
    - `vjp`: the backward pass, `vjp(*saved, *cotangents, **keywords)`: the arrays saved,
      then the outputs' cotangents (None: the kernel is not differentiated by backward
      kernels; `no_cotangents`: every cotangent is zero); `saves`: the names of the arrays it reads,
      by default the inputs; `residuals`: those of them that are neither inputs nor
      outputs, declared as `outputs` are, which the launchers write after the outputs when
      their `residuals` keyword is true (`with_residuals`), as the forward pass under
      jax.grad asks; or `saving`: the kernel that writes them, apart (NAME_with_residuals).

    A call checks its keywords (`_check_keywords`, `check_blocks`), its arrays' dtypes,
    ranks and sizes (`operands`), answers an empty dimension (`without_elements`), and
    runs the kernel built for the platform compiled for (`on_platform`). `trace`, `lower`,
    `eval_shape` and `clear_cache` are jax's, without the checks; they are methods, not
    attributes: a function that wraps this one (`jax.vmap`) copies its attributes, and a
    copied `trace` would trace this function rather than the wrapper.
    """

    def __init__(
        self,
        reference,
        *,
        inputs,
        outputs,
        sizes,
        params,
        launchers,
        tpu_blocks,
        triton_options,
        mosaic_gpu_options,
        vjp,
        saves,
        residuals,
        saving,
        on_hopper,
    ):
        functools.update_wrapper(self, reference)
        self.reference = reference
        self._inputs, self._outputs, self._sizes, self._params = inputs, outputs, sizes, params
        self._defaults = {
            name: parameter.default
            for name, parameter in inspect.signature(reference).parameters.items()
            if name in params
        }
        self._launchers = {
            backend: _launcher_binding(backend, function, sizes, params) for backend, function in launchers.items()
        }
        options = {keyword for _, binding in self._launchers.values() for keyword in binding.values()}
        if "triton" in launchers and "mosaic_gpu" in launchers:
            options.add("gpu_backend")
        self.options = (*sorted(options - set(sizes.values()) - set(params) - {"residuals"}), "interpret")
        vjp = no_cotangents(len(inputs)) if vjp is no_cotangents else vjp
        self._vjp, self._saves, self._residuals, self._saving_kernel = vjp, saves, residuals, saving
        self._on_hopper = on_hopper
        self.tpu_blocks = tpu_blocks._replace(kernel=reference.__name__, sizes=tuple(sizes)) if tpu_blocks else None
        self.triton_options, self.mosaic_gpu_options = triton_options, mosaic_gpu_options
        choosers = {  # what chooses the blocks (and GPU options) a call leaves None, by launcher
            "tpu": (_with_tpu_blocks, self.tpu_blocks),
            "triton": (functools.partial(_with_gpu_options, prefix="gpu_block_", triton=True), triton_options),
            "mosaic_gpu": (functools.partial(_with_gpu_options, prefix="mgpu_", triton=False), mosaic_gpu_options),
        }
        self._choosers = {b: functools.partial(c, table) for b, (c, table) in choosers.items() if table is not None}

        def call(*arrays, residuals=False, **keywords):
            return self._call(*arrays, residuals=residuals, **keywords)

        call.__name__ = call.__qualname__ = reference.__name__  # as jax names the jitted function
        self._jitted = jax.jit(call, static_argnames=(*params, *self.options, "residuals"))

    def __call__(self, *arrays, **keywords):
        return self._checked_call(arrays, keywords, residuals=False)

    def with_residuals(self, *arrays, **keywords):
        """The call's outputs, then the residuals its forward pass saves under jax.grad
        (`residuals`), as the kernels compute them; not differentiable."""
        if self._saving_kernel is not None:
            return self._saving_kernel(*arrays, **self._saving_keywords(keywords))
        if not self._residuals:
            raise TypeError(f"{self.__name__} saves no residuals for jax.grad: it has no with_residuals")
        return self._checked_call(arrays, keywords, residuals=True)

    def _saving_keywords(self, keywords):
        """The call's keywords that the kernel saving the residuals apart takes."""
        saving = self._saving_kernel
        return {k: v for k, v in keywords.items() if k in saving.options or k in saving._params}

    def _checked_call(self, arrays, keywords, residuals):
        name = self.__name__
        if len(arrays) != len(self._inputs):
            raise TypeError(f"{name} takes {len(self._inputs)} arrays ({', '.join(self._inputs)}), got {len(arrays)}")
        unknown = sorted(set(keywords) - set(self._params) - set(self.options))
        if unknown:
            taken = ", ".join((*self._params, *self.options))
            raise TypeError(f"{name} got an unexpected keyword {unknown[0]!r}; it takes {taken}")
        keywords = _check_keywords(name, self._params, keywords)
        check_blocks(name, may_be_none=True, **{k: v for k, v in keywords.items() if k.startswith(_BLOCKS)})
        try:
            return self._jitted(*arrays, residuals=residuals, **keywords)
        except (TypeError, ValueError):
            _refuse_non_arrays(name, zip(self._inputs, arrays))
            raise

    def trace(self, *args, **keywords):
        return self._jitted.trace(*args, **keywords)

    def lower(self, *args, **keywords):
        return self._jitted.lower(*args, **keywords)

    def eval_shape(self, *args, **keywords):
        return self._jitted.eval_shape(*args, **keywords)

    def clear_cache(self):
        return self._jitted.clear_cache()

    @property
    def output_names(self):
        return tuple(self._outputs)

    def _call(self, *arrays, residuals, **keywords):
        """The jitted call: checked arrays, then the kernel (differentiable by `vjp`; with
        its `residuals` after its outputs, not differentiable)."""
        operands_ = {name: (array, spec[0], spec[1]) for (name, spec), array in zip(self._inputs.items(), arrays)}
        arrays, sizes = operands(self.__name__, operands_)
        params = {name: keywords.get(name, self._defaults[name]) for name in self._params}
        options = {name: keywords.get(name) for name in self.options}
        if 0 in sizes.values():  # a dimension of size 0: nothing for a kernel to compute
            shapes = [(tuple(sizes[d] for d in spec[1]), spec[0]) for spec in self._outputs.values()]
            if residuals:
                empty = ", ".join(f"{dim}=0" for dim, size in sizes.items() if size == 0)
                raise ValueError(
                    f"{self.__name__}.with_residuals: {empty}: no kernel runs, so it computes no residuals"
                )
            return without_elements(self.__name__, sizes, self.reference, shapes, *arrays, **params)
        forward = functools.partial(self._launch, sizes=sizes, params=params, options=options)
        if residuals:
            return forward(*arrays, residuals=True)
        if self._vjp is None:
            return forward(*arrays)
        given = {**params, **options}
        wanted = inspect.signature(self._vjp).parameters
        keywords = {k: v for k, v in given.items() if k in wanted}
        several = len(self._outputs) > 1

        def backward(saved, cotangents):
            return self._vjp(*saved, *(cotangents if several else (cotangents,)), **keywords)

        saving = functools.partial(self._saving, forward=forward, given=given) if self._saves else None
        return differentiable(forward, backward, *arrays, saving=saving)

    def _launch(self, *arrays, sizes, params, options, residuals=False):
        """The kernel of the platform compiled for, on `arrays` laid out as it holds them:
        its outputs, then (`residuals`) the residuals."""
        arrays = [_laid_out(array, spec, sizes) for array, spec in zip(arrays, self._inputs.values())]
        given = {keyword: sizes[dim] for dim, keyword in self._sizes.items()}
        given |= {**params, **options, "residuals": residuals}
        kernels = {}
        for backend, (function, binding) in self._launchers.items():
            if residuals and "residuals" not in binding:  # a launcher that writes none: another backend's runs
                function = None
            keywords = {k: given[v] for k, v in binding.items()}
            chooser = self._choosers.get(backend)
            choose = chooser and functools.partial(chooser, binding, sizes)
            kernels[backend] = None if function is None else functools.partial(_launched, function, keywords, choose)
        if "gpu_backend" in self.options:
            kernels["gpu_backend"], kernels["on_hopper"] = options["gpu_backend"], self._on_hopper
        results = on_platform(self.__name__, arrays, interpret=options["interpret"], **kernels)
        if residuals:
            specs = [*self._outputs.values(), *self._residuals.values()]
            return tuple(_own_shape(result, spec, sizes) for result, spec in zip(results, specs))
        if self._residuals:  # the launcher's None for each residual it did not write
            results = results[: len(self._outputs)]
            results = results[0] if len(self._outputs) == 1 else results
        if len(self._outputs) == 1:
            return _own_shape(results, next(iter(self._outputs.values())), sizes)
        return tuple(_own_shape(result, spec, sizes) for result, spec in zip(results, self._outputs.values()))

    def _saving(self, *arrays, forward, given):
        """The forward pass under jax.grad: the outputs, and the arrays `vjp` reads (`saves`):
        inputs, outputs and residuals, which the launchers then write too (or the kernel
        that saves them apart)."""
        if self._saving_kernel is not None:
            results = self._saving_kernel(*arrays, **self._saving_keywords(given))
            named = dict(zip(self._saving_kernel.output_names, results))
            results = results[: len(self._outputs)]
        elif self._residuals:
            results = forward(*arrays, residuals=True)
            named = dict(zip([*self._outputs, *self._residuals], results))
            results = results[: len(self._outputs)]
        else:
            results = forward(*arrays)
            results = results if len(self._outputs) > 1 else (results,)
            named = dict(zip(self._outputs, results))
        named.update(zip(self._inputs, arrays))
        outputs = results if len(self._outputs) > 1 else results[0]
        return outputs, tuple(named[name] for name in self._saves)


_BLOCKS = ("block_", "gpu_block_")  # the TPU's and Triton's block keywords, checked by `check_blocks`


def _launched(launcher, keywords, choose, *arrays, **more):
    """`launcher` run on `arrays` with `keywords`, its blocks (and GPU options) chosen by
    `choose` where the call left them None: when the platform's kernel is built, so a
    block another platform's kernel takes is never chosen or checked."""
    return launcher(*arrays, **(choose(keywords) if choose else keywords), **more)


def _with_tpu_blocks(table, binding, sizes, keywords):
    """A TPU launcher's keywords with its blocks chosen and checked by `tpu_blocks` from
    `table` (a `TpuBlocks`; its step takes `residuals` where their blocks take VMEM too).
    Its block keywords are named after their dimensions: it needs no `binding`."""
    chosen = [block_keyword(dim) for dim in table.tiling]
    writes = table.step is not None and "residuals" in inspect.signature(table.step).parameters
    step = {"residuals": keywords["residuals"]} if writes else {}
    values = tpu_blocks(table, tuple(sizes[dim] for dim in table.sizes), tuple(keywords[k] for k in chosen), **step)
    return keywords | dict(zip(chosen, values))


def _with_gpu_options(options, binding, sizes, keywords, *, prefix, triton):
    """A GPU launcher's keywords with the choices of `options` (a `GpuOptions`) where the
    call gave None: the keywords whose public names start with `prefix`; for `triton`,
    num_warps and num_stages too, its blocks clamped by `triton_options`."""
    chosen = [k for k, public in binding.items() if public.startswith(prefix)]
    chosen += ["num_warps", "num_stages"] if triton else []
    at, given = tuple(sizes[dim] for dim in options.dims), tuple(keywords[k] for k in chosen)
    values = (
        triton_options(options.table, at, given, options.least) if triton else gpu_options(options.table, at, given)
    )
    return keywords | dict(zip(chosen, values))


def _launcher_binding(backend, function, sizes, params):
    """A backend's launcher, and the public keyword (or size keyword, param, or the call's
    `residuals`) that gives each of its keywords but `interpret`."""
    if function is None:
        return None, {}
    own = {name for name in (*sizes.values(), *params, "interpret", "residuals")}
    binding = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "interpret":
            binding[name] = name if name in own else public_keyword(backend, name)
    return function, binding


def _laid_out(array, spec, sizes):
    """An input as the kernels hold it (`spec`'s layout, where it has one)."""
    if len(spec) < 3:
        return array
    return array.reshape(tuple(1 if dim == 1 else sizes[dim] for dim in spec[2]))


def _own_shape(result, spec, sizes):
    """An output that the kernels hold with size 1 along dimensions it lacks, in its own shape."""
    return result if len(spec) < 3 else result.reshape(tuple(sizes[dim] for dim in spec[1]))


def _check_keywords(kernel, params, options):
    """The keywords of a call (`options`), checked as `Kernel` says:
    `params` maps each param to its dtype. Block sizes are checked by `check_blocks`."""
    checked = dict(options)
    for name, value in options.items():
        if isinstance(value, (jax.core.Tracer, jax.Array)):
            what = "a traced value" if isinstance(value, jax.core.Tracer) else "a jax array"
            kind = "value" if name in ("interpret", "gpu_backend") else "number"
            raise TypeError(
                f"{kernel}: {name} is static and must be a Python {kind}, got {what} ({type(value).__name__});"
                " a static keyword is fixed when the call is traced"
            )
        if name in params:
            checked[name] = _checked_param(kernel, name, value, jnp.dtype(params[name]))
        elif name == "interpret":
            if not (value is None or value is True or value is False or isinstance(value, _INTERPRET_PARAMS)):
                raise ValueError(
                    f"{kernel}: interpret must be None, True, False or a pltpu.InterpretParams"
                    f" (plgpu.InterpretGPUParams on Mosaic GPU), got {value!r}"
                )
        elif name in _LAUNCH_OPTIONS:
            allowed = _LAUNCH_OPTIONS[name]
            if value is not None and (type(value) is not int or value not in allowed):
                raise ValueError(
                    f"{kernel}: {name} must be one of {', '.join(map(str, allowed))} or None, got {value!r}"
                )
        else:
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"{kernel}: {name} is static and must be a Python number, got {value!r}") from None
    return checked


def _checked_param(kernel, name, value, dtype):
    """A param's value as the kernel takes it: a real Python (or NumPy) number of its
    kind, in range; a float param's int as a float."""
    integer = jnp.issubdtype(dtype, jnp.integer)
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
        what = "an int" if integer else "a number"
        raise TypeError(f"{kernel}: {name} must be a Python {what.split()[-1]} ({dtype.name}), got {value!r}")
    if integer:
        bounds = jnp.iinfo(dtype)
        if not bounds.min <= value <= bounds.max:
            raise ValueError(f"{kernel}: {name}={value} does not fit in {dtype.name} ({bounds.min} to {bounds.max})")
        return value
    largest = float(jnp.finfo(dtype).max)
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if abs(number) > largest and not (isinstance(value, (float, np.floating)) and np.isinf(value)):
        raise ValueError(f"{kernel}: {name}={value} is too large for {dtype.name} (largest {largest:g})")
    return number if isinstance(value, (int, np.integer)) else value


def _refuse_non_arrays(kernel, arrays):
    """Names the first of the (name, value) `arrays` that jax cannot take as arrays."""
    for name, value in arrays:
        for leaf in jax.tree.leaves(value):
            try:
                jnp.asarray(leaf)
            except (TypeError, ValueError) as error:
                raise TypeError(f"{kernel}: {name} is not an array, nor converts to one ({error})") from None


def platform_dependent(arrays, traced=None, **kernels):
    """`jax.lax.platform_dependent(*arrays, tpu=..., cuda=..., default=...)`, except that
    each platform lowers only its own kernel.

    `jax.lax.platform_dependent` lowers every branch for every platform that a module is
    lowered for, and a Mosaic kernel does not lower for CUDA, nor a Triton kernel for
    TPU: `jax.export.export(NAME, platforms=("tpu", "cuda"))` would fail. Here each
    platform has its own lowering rule (see `_platform_dependent_primitive`), so the
    exported module holds the Mosaic kernel for TPU and the Triton kernel for CUDA.
    Tracing the default kernel (or `traced`, where given) gives the outputs' shapes and
    runs its call-time checks.
    """
    outputs, tree = jax.tree.flatten(jax.eval_shape(traced or kernels["default"], *arrays))
    results = _platform_dependent_primitive().bind(*arrays, outputs=tuple(outputs), **kernels)
    return jax.tree.unflatten(tree, results)


# jax 0.11+ warns at every Triton lowering that Pallas's Triton backend is deprecated. The
# GPU kernels use it knowingly until they move to Mosaic GPU: that one warning is silenced
# while a kernel lowers for CUDA, and nowhere else (importing a generated module sets no
# warning filter).
TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"


@contextlib.contextmanager
def _triton_deprecation_ignored():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TRITON_DEPRECATION, category=DeprecationWarning)
        yield


@functools.cache
def _platform_dependent_primitive():
    """The primitive behind `platform_dependent`, with one lowering rule per platform,
    created and registered with jax on first use (once per process).

    Its parameters: `tpu`, `cuda` and `default`, the kernel for each platform (a
    function of the arrays that returns a pytree of arrays), and `outputs`, the
    jax.ShapeDtypeStruct of each leaf of that pytree.
    """
    primitive = jax.extend.core.Primitive("platform_dependent_kernel")
    primitive.multiple_results = True

    def abstract_eval(*arrays, outputs, **kernels):
        return [jax.core.ShapedArray(output.shape, output.dtype) for output in outputs]

    def lowering(platform):
        def kernel_leaves(*arrays, outputs, **kernels):
            return jax.tree.leaves(kernels[platform](*arrays))

        rule = jax.interpreters.mlir.lower_fun(kernel_leaves, multiple_results=True)
        if platform != "cuda":
            return rule

        def quietly(*args, **params):
            with _triton_deprecation_ignored():
                return rule(*args, **params)

        return quietly

    def run_outside_jit(*arrays, outputs, **kernels):  # as under `jax.disable_jit()`
        with _triton_deprecation_ignored():
            return jax.tree.leaves(jax.lax.platform_dependent(*arrays, **kernels))

    def vmapped(arrays, axes, *, outputs, **kernels):
        kernels = {name: jax.vmap(kernel, in_axes=axes) for name, kernel in kernels.items()}
        results = jax.tree.leaves(platform_dependent(arrays, **kernels))
        return results, [0] * len(results)

    primitive.def_abstract_eval(abstract_eval)
    primitive.def_impl(run_outside_jit)
    jax.interpreters.mlir.register_lowering(primitive, lowering("tpu"), platform="tpu")
    jax.interpreters.mlir.register_lowering(primitive, lowering("cuda"), platform="cuda")
    jax.interpreters.mlir.register_lowering(primitive, lowering("default"))  # any other platform
    jax.interpreters.batching.primitive_batchers[primitive] = vmapped
    return primitive


def no_cotangents(count):
    """The backward pass of a kernel of `count` inputs none of whose float inputs reaches a
    float output: a zero cotangent (None; float0 for an integer input) for each. As
    `vjp=no_cotangents`, `Kernel` makes it for the kernel's inputs."""
    return lambda *saved_and_cotangents: (None,) * count


def differentiable(forward, backward, *arrays, saving=None):
    """`forward(*arrays)`, which `jax.grad` differentiates by `backward(saved, cotangents)`:
    from what the forward pass saves (the arrays; or, given `saving`, what it returns
    beside the outputs) and the cotangents of the outputs, it gives one cotangent per
    array, or None for none (float0 for an integer array)."""
    call = jax.custom_vjp(forward)
    call.defvjp(saving or (lambda *arrays: (forward(*arrays), arrays)), backward)
    return call(*arrays)


def operands(kernel, operands):
    """The operands as arrays, each checked for its dtype and rank, and the size of each
    named dimension. Lists, tuples and scalars convert as `jnp.asarray` converts them."""
    arrays, sizes = [], {}
    for name, (value, dtype, dims) in operands.items():
        try:
            array = jnp.asarray(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{kernel}: {name} is not an array, nor converts to one ({error})") from None
        if array.dtype != dtype:
            raise TypeError(f"{kernel}: {name} must be {jnp.dtype(dtype).name}, got {array.dtype}")
        if array.ndim != len(dims):
            raise ValueError(f"{kernel}: {name} must have dimensions [{', '.join(dims)}], got shape {array.shape}")
        for dim, size in zip(dims, array.shape):
            if sizes.setdefault(dim, size) != size:
                raise ValueError(f"{kernel}: {name} has {dim}={size} but another operand has {dim}={sizes[dim]}")
        arrays.append(array)
    return arrays, sizes


def check_blocks(kernel, may_be_none=False, **blocks):
    """Refuses a block keyword whose value is not a positive int. None, where a block
    `may_be_none`, leaves the choice of the block to the kernel."""
    for keyword, block in blocks.items():
        if block is None and may_be_none:
            continue
        if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
            expected = "a positive int or None" if may_be_none else "a positive int"
            raise ValueError(f"{kernel}: {keyword} must be {expected}, got {block!r}")


def without_elements(kernel, sizes, reference, outputs, /, *arrays, **params):
    """The result of a call where a dimension has size 0 (`sizes`: each dimension's), as
    jax.numpy gives it: empty arrays of the `outputs`' (shape, dtype), or, where an output
    still has elements (it reduces over the empty dimension), what the reference
    computes. A reduction that has no value over nothing (max, argmax...) is a ValueError
    naming the kernel and the empty dimensions, as the reference's own error would not."""
    if any(0 not in shape for shape, _ in outputs):
        try:
            return reference(*arrays, **params)
        except ValueError as error:
            empty = ", ".join(f"{dim}=0" for dim, size in sizes.items() if size == 0)
            raise ValueError(
                f"{kernel}: {empty} leaves a reduction with nothing to reduce and no value for that"
                f" (max, min, argmax or argmin of nothing), so outputs of other dimensions have none: {error}"
            ) from None
    empty = tuple(jnp.zeros(shape, dtype) for shape, dtype in outputs)
    return empty if len(empty) > 1 else empty[0]


def tpu_chip():
    """The TPU generation being compiled for, as tuning tables name it, or None.

    It is the default device's: a TPU's, or under `jax.default_device(...)` that of a
    compile-only TPU topology (ahead-of-time compiles on a host without a TPU).
    """
    device = jax.config.jax_default_device
    if not hasattr(device, "device_kind"):
        device = jax.devices(device)[0]
    return TPU_CHIPS.get(device.device_kind)


class TpuBlocks(NamedTuple):
    """A TPU launcher's table of blocks, which `tpu_blocks` chooses from and checks.

    `tiling` maps each blocked dimension, in the order of the blocks, to Mosaic's tiling
    rule for it: (multiple, how its arrays hold it[, smallest power of two]), in words by
    `constants.tiling_rule_words`; None where any block tiles. `chips` maps a TPU
    generation to its tuned blocks, by the sizes they were tuned at, and to its
    "default" blocks where they differ from `chips[None]["default"]`, the spec's.

    A kernel without a matrix product has a `step`: a grid step's elements and VMEM bytes
    at the call's sizes and given blocks; its blocks grow (see `grown`), each up to its
    dimension and its `bounds` (None: no more); in a kernel computed in `strips`, up to a
    power of two within its dimension, so that its strips tile the block (a ragged last
    block instead of an unaligned one).

    `kernel` names it in errors, and `sizes` the dimensions of a call's sizes, in order:
    the kernel's public function (`Kernel`) sets both.
    """

    tiling: dict
    chips: dict
    step: object = None
    bounds: tuple = None
    strips: bool = False
    kernel: str = ""
    sizes: tuple = ()


def tpu_blocks(table, sizes, given, **step_keywords):
    """The blocks of a TPU call, each at most its dimension (a small dimension is one
    whole block): those `given` (not None), the others from the `table` (a `TpuBlocks`)
    for the chip compiled for (see `tpu_chip`): the tuned entry whose sizes are nearest
    the call's (in powers of two), else the chip's default, else the spec's, which any
    other chip and CPU take. On a known chip without tuned entries, the blocks not given
    of a table with a `step` grow to large steps.

    A block that Mosaic cannot tile is a ValueError, before anything compiles, that says
    the rule and a larger block that keeps it. `step_keywords` go to the step (`residuals`:
    whether the launcher writes them, whose blocks take VMEM too).
    """

    def distance(tuned_sizes):
        return sum(abs(a.bit_length() - b.bit_length()) for a, b in zip(tuned_sizes, sizes))

    size_of = dict(zip(table.sizes, sizes))
    dims = list(table.tiling)
    blocks = list(given)
    if None in given:
        chip = tpu_chip()
        entries = table.chips.get(chip, {})
        tuned = [tuned_sizes for tuned_sizes in entries if tuned_sizes != "default"]
        if tuned:
            chosen = entries[min(tuned, key=distance)]
        else:
            chosen = entries.get("default", table.chips[None]["default"])
        blocks = [block if block is not None else choice for block, choice in zip(given, chosen)]
        if table.step is not None and chip is not None and not tuned:
            within = [size_of[dim] for dim in dims]
            if table.strips:
                within = [1 << (size.bit_length() - 1) for size in within]
            bounds = [min(size, bound) for size, bound in zip(within, table.bounds)] if table.bounds else within
            step = functools.partial(table.step, *sizes, **step_keywords)
            blocks = grown(blocks, [block is None for block in given], bounds, step)
    blocks = [min(block, size_of[dim]) for dim, block in zip(dims, blocks)]
    for dim, block in zip(dims, blocks):
        rule, size = table.tiling[dim], size_of[dim]
        if rule is not None and not tiles_on_tpu(block, rule[0], *rule[2:], size=size):
            multiple = rule[0]
            raise ValueError(
                f"{table.kernel}: {block_keyword(dim)}={block} breaks the TPU tiling rule:"
                f" {tiling_rule_words(dim, *rule)}; use {-(-block // multiple) * multiple} or a block of the whole"
                f" dimension ({size})"
            )
    return tuple(blocks)


def grown(blocks, free, bounds, step):
    """`blocks` with the `free` ones doubled in turn, the last first, while smaller than
    their dimension (`bounds`) and while a grid step (`step(*blocks)`: its elements and
    VMEM bytes) stays within STEP_ELEMENTS elements and STEP_VMEM_BYTES. A step costs a fixed ~600
    cycles, so a memory-bound kernel wants few, large steps; doubling keeps a block legal.
    """
    grew = True
    while grew:
        grew = False
        for i in reversed(range(len(blocks))):
            if not free[i] or blocks[i] >= bounds[i]:
                continue
            trial = [*blocks[:i], 2 * blocks[i], *blocks[i + 1 :]]
            elements, vmem = step(*trial)
            if elements <= STEP_ELEMENTS and vmem <= STEP_VMEM_BYTES:
                blocks, grew = trial, True
    return blocks


def strips(blocks, counts, height, chunk, seen, whole):
    """How a step computes its block of (rows, columns) `blocks`: in strips of `height`
    rows (one strip where `height` does not divide the block), each
    ((row, rows), (col, cols)): where its rows and columns start in the block and how many.

    Returns the strips of a block where `whole(row_start, col_start, rows, cols)` says a
    condition holds at every position, each with every column; and those of a block of
    the grid (`counts` blocks) where it holds only in part: each strip with the columns,
    in runs of `chunk`, where `seen` says it may hold in some such block, and no strip
    that sees none. Traced once per call, with Python ints.
    """
    (block_rows, block_cols), (row_blocks, col_blocks) = blocks, counts
    height = height if block_rows % height == 0 else block_rows
    chunk = chunk if block_cols % chunk == 0 else block_cols
    partial = [
        (i * block_rows, j * block_cols)
        for i in range(row_blocks)
        for j in range(col_blocks)
        if seen(i * block_rows, j * block_cols, block_rows, block_cols)
        and not whole(i * block_rows, j * block_cols, block_rows, block_cols)
    ]
    whole_strips, partial_strips = [], []
    for row in range(0, block_rows, height):
        whole_strips.append(((row, height), (0, block_cols)))
        cols = [
            col
            for col in range(0, block_cols, chunk)
            if any(seen(start + row, first + col, height, chunk) for start, first in partial)
        ]
        if cols:
            partial_strips.append(((row, height), (cols[0], cols[-1] + chunk - cols[0])))
    return tuple(whole_strips), tuple(partial_strips)


def add_in_strips(strip, views, blocks, starts, counts, height, chunk, seen, whole):
    """A step's block of (rows, columns) `blocks`, its first positions `starts`, computed in
    the strips `strips` chooses (which see): `strip(*views((row, rows), (col, cols)),
    row_start, col_start, rows, cols)` for each, on its refs' views of the strip
    (`strip_view`; `views(None, None)`: the refs themselves, for the whole block). A block
    where `whole(*starts, *blocks)` holds takes every column of each strip; one where only
    `seen` does, the partial strips; any other, none: it is skipped."""
    whole_strips, partial_strips = strips(blocks, counts, height, chunk, seen, whole)

    def add(chosen):
        for (row, rows), (col, cols) in chosen:
            if (rows, cols) == tuple(blocks):
                strip(*views(None, None), *starts, *blocks)
            else:
                strip(*views((row, rows), (col, cols)), starts[0] + row, starts[1] + col, rows, cols)

    pl.when(whole(*starts, *blocks))(lambda: add(whole_strips))
    pl.when(seen(*starts, *blocks) & jnp.logical_not(whole(*starts, *blocks)))(lambda: add(partial_strips))


def strip_view(ref, *index):
    """`ref`'s view of a strip: each of `index`, `(start, size)` along its axis, or None (all
    of it); the ref itself where every one is None (`add_in_strips`'s whole block)."""
    if all(part is None for part in index):
        return ref
    return ref.at[tuple(slice(None) if part is None else pl.ds(*part) for part in index)]


def tpu_params(semantics, vmem_limit_bytes):
    """A TPU launch's pltpu.CompilerParams: each grid axis's dimension semantics and the
    scoped VMEM limit (vmem_limit's)."""
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=vmem_limit_bytes)


def vmem_limit(needed):
    """The scoped VMEM limit for TPU blocks that need `needed` bytes.

    None (Mosaic's default, SCOPED_VMEM_BYTES, on a TPU v5e) while they fit in it. Larger
    blocks would fail to compile, so they ask for twice what they need, at most VMEM_LIMIT_BYTES of
    the 128 MiB a v5e or v6e core has. Not more: compiled for libtpu's cost estimate, blocks
    of 28 MiB that asked for 100 MiB ran out of VMEM (the ask counted beside the use).
    """
    return None if needed <= SCOPED_VMEM_BYTES else min(2 * needed, VMEM_LIMIT_BYTES)


def inside(start, block, size):
    """Which of `block` positions from `start` lie inside a dimension of `size`.

    None when blocks tile the dimension exactly: aligned sizes load and store unmasked.
    """
    if size % block == 0:
        return None
    return start + jnp.arange(block) < size


def mask(shape, *inside):
    """A block's mask from one `inside` per axis (None: that axis never overhangs)."""
    mask = None
    for axis, along in enumerate(inside):
        if along is not None:
            along = jax.lax.broadcast_in_dim(along, shape, (axis,))
            mask = along if mask is None else mask & along
    return mask


def load(ref, where, other=None):
    """A GPU block, masked where `where` says: a mask of the block, or a tuple of one
    `inside` per axis of it (see `mask`); None: the block fits, so a plain load."""
    where = mask(ref.shape, *where) if isinstance(where, tuple) else where
    if where is None:
        return ref[...]
    return pltriton.load(ref, mask=where, other=other)


def store(ref, value, where):
    """Stores a GPU block, masked where `where` says (as `load`'s; None: the block fits)."""
    where = mask(ref.shape, *where) if isinstance(where, tuple) else where
    if where is None:
        ref[...] = value
    else:
        pltriton.store(ref, value, mask=where)


def nbytes(*arrays):
    """Bytes of the given arrays, for the kernel's cost estimate."""
    return sum(array.size * array.dtype.itemsize for array in arrays)


def fill_past(value, start, size, axis, identity, ragged=True):
    """`value` with `identity` at the positions along `axis` (from `start`) past `size`:
    never what a ragged last block holds there (padding, or another block's values).
    `value` itself where `ragged` is false (blocks tile `size`). A 16- or 8-bit value is
    selected in 32 bits: Mosaic cannot select such blocks of fewer than 5 rows."""
    if not ragged:
        return value
    positions = start + jax.lax.broadcasted_iota(jnp.int32, value.shape, axis)
    if value.dtype.itemsize >= 4 or value.dtype == jnp.bool_:
        return jnp.where(positions < size, value, identity)
    wide = jnp.float32 if jnp.issubdtype(value.dtype, jnp.floating) else jnp.int32
    return jnp.where(positions < size, value.astype(wide), identity).astype(value.dtype)


def dot_t(lhs, rhs, preferred_element_type):
    """`lhs @ rhs.T`, both tiles contracted on their last axis, as Mosaic takes it: a
    one-row `rhs` (one key) is multiplied and summed, since Mosaic lowers that product as
    a vector product, which fails for all but f32, and an f32 result of one column fails
    to broadcast over what follows."""
    if rhs.shape[0] == 1:
        return jnp.sum(lhs.astype(preferred_element_type) * rhs.astype(preferred_element_type), axis=1, keepdims=True)
    return jax.lax.dot_general(lhs, rhs, (((1,), (1,)), ((), ())), preferred_element_type=preferred_element_type)


def rows_shape(block):
    """How a TPU kernel holds a one-dimensional block of `block` positions: as rows of 128
    lanes when they divide it (Mosaic handles one long row poorly), else as it is."""
    return (block // 128, 128) if block % 128 == 0 else (block,)


def as_rows(value):
    """A one-dimensional block as `rows_shape` holds it."""
    return value.reshape(rows_shape(value.shape[0]))


def fill_past_rows(value, start, size, identity, ragged=True):
    """`value`, a block held as `as_rows` holds it from position `start`, with
    `identity` at the positions past `size`; `value` itself where `ragged` is false."""
    if not ragged:
        return value
    positions = jax.lax.broadcasted_iota(jnp.int32, value.shape, value.ndim - 1)
    if value.ndim == 2:
        positions += value.shape[1] * jax.lax.broadcasted_iota(jnp.int32, value.shape, 0)
    return jnp.where(start + positions < size, value, identity)


def round_half_even(x):
    """`jnp.round` (half to even) for the GPU, whose Triton lowering has no round."""
    nearest = jnp.floor(x + 0.5)
    tie_to_odd = (nearest - x == 0.5) & (jnp.floor(nearest * 0.5) * 2 != nearest)
    nearest = jnp.where(tie_to_odd, nearest - 1, nearest)
    return jnp.where(jnp.abs(x) < 2.0**23, nearest, x)  # larger floats are whole already


def argbest(x, axis, largest):
    """The first index of the largest (or smallest) value along `axis`, kept as size 1."""
    best = jnp.max(x, axis=axis, keepdims=True) if largest else jnp.min(x, axis=axis, keepdims=True)
    positions = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    return jnp.min(jnp.where(x == best, positions, x.shape[axis]), axis=axis, keepdims=True)


def argbest_step(best, index, x, start, axis, largest):
    """The running (value, first index) after one more block `x` starting at `start`."""
    block_best = jnp.max(x, axis=axis, keepdims=True) if largest else jnp.min(x, axis=axis, keepdims=True)
    block_index = start + argbest(x, axis, largest)
    better = block_best > best if largest else block_best < best  # ties keep the earlier index
    return jnp.where(better, block_best, best), jnp.where(better, block_index, index)


def logsumexp(x, axis):
    """log(sum(exp(x))) along `axis`, kept as size 1, without overflow (see `logsumexp_finish`)."""
    top = jnp.max(x, axis=axis, keepdims=True)
    shift = jnp.where(top > -jnp.inf, top, 0.0)  # a row of -inf sums to 0, its log -inf
    return logsumexp_finish(top, jnp.sum(jnp.exp(x - shift), axis=axis, keepdims=True))


def logsumexp_finish(top, total):
    """log-sum-exp from its running (max, sum), as jax.nn.logsumexp gives it: a row whose
    max is +inf or -inf has that for its log-sum-exp (its sum is NaN, or 0), a row with a
    NaN NaN. Decided here, once per row, so that the running steps do no extra work."""
    return jnp.where((top > -jnp.inf) & (top < jnp.inf), top + jnp.log(total), top)


def softmax(x, axis):
    """exp(x - max) / sum(exp(x - max)) along `axis`; a row of -inf gives NaN, as jax.nn.softmax."""
    e = jnp.exp(x - jnp.max(x, axis=axis, keepdims=True))
    return e / jnp.sum(e, axis=axis, keepdims=True)
