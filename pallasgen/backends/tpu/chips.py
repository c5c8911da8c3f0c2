"""The TPU generations a generated kernel knows at call time, and the blocks it takes on
each when the call passes none: tuned ones (`pallasgen tune`), else the chip's
default, which the generator derives from the chip's MXU and VMEM."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.backends.tpu.tiling import VMEM_CAPACITY_BYTES, kernel_vmem, tiling_problem
from pallasgen.frontend.text import format_bytes
from pallasgen.runtime.constants import (  # noqa: F401
    MIB,
    STEP_ELEMENTS,
    STEP_VMEM_BYTES,
    TPU_DEVICE_KINDS,
    VMEM_LIMIT_BYTES,
)


@dataclass(frozen=True)
class TpuChip:
    name: str  # as `--chip`, tuning files and generated tables name it
    device_kinds: tuple[str, ...]  # jax's `Device.device_kind` for it
    topology: str  # the compile-only topology of one chip (jax.experimental.topologies)
    mxu: int  # the MXU is mxu x mxu: product blocks are multiples of it
    product_block: int  # the smallest product block (M, N and K) that keeps the MXU fed
    product_vmem_bytes: int  # the most VMEM a default product block set may take
    clock_hz: float  # TensorCore clock: cycles per second
    bf16_flops: float  # peak dense bf16 FLOP/s (f32 products are counted against it)
    int8_ops: float  # peak int8 OP/s
    hbm_bytes: float  # peak HBM bytes/s


# Google Cloud's TPU pages (MXU shapes, peaks; clock = peak bf16 / MXU FLOPs per cycle)
# and the compiler estimates in benchmarks/RESULTS_TPU_ESTIMATES.md (product blocks of
# 512 and 1024 on v5e; 1024 on v6e, whose MXUs are twice as wide and four times as fast).
CHIPS = (
    TpuChip(
        "v5e",
        TPU_DEVICE_KINDS["v5e"],
        "v5e:1x1",
        mxu=128,
        product_block=512,
        product_vmem_bytes=32 * MIB,
        clock_hz=1.5e9,
        bf16_flops=197e12,
        int8_ops=394e12,
        hbm_bytes=819e9,
    ),
    TpuChip(
        "v6e",
        TPU_DEVICE_KINDS["v6e"],
        "v6e:1x1",
        mxu=256,
        product_block=1024,
        product_vmem_bytes=48 * MIB,
        clock_hz=1.75e9,
        bf16_flops=918e12,
        int8_ops=1836e12,
        hbm_bytes=1640e9,
    ),
)
CHIP_NAMES = tuple(chip.name for chip in CHIPS)


def chip_named(name: str) -> TpuChip:
    """The chip `--chip NAME` names; ValueError for one pallasgen does not know."""
    for chip in CHIPS:
        if chip.name == name:
            return chip
    raise ValueError(f"unknown TPU chip {name!r}; one of {', '.join(CHIP_NAMES)}")


def chip_blocks(checked: CheckedKernel, tunable: list[str], chip: TpuChip) -> dict[str, int]:
    """A chip's default blocks for a kernel: the spec's, except that the M, N and K of a
    kernel's one product (of inputs or of computed operands: a product's backward kernel)
    grow to the chip's `product_block` (a multiple of its MXU) while the blocks fit in
    its `product_vmem_bytes`, K first given up. Other kernels keep the spec's blocks:
    their best blocks depend on the per-step overhead, not the chip (measured)."""
    blocks = {d: checked.blocks[d] for d in tunable}
    dims = one_product_dims(checked)
    if dims is None:
        return blocks
    m, n, k = dims
    grown = dict(blocks)
    for dim in (m, n, k):
        if dim in grown:
            grown[dim] = max(grown[dim], _round_up(chip.product_block, chip.mxu))
    for dim in (k, n, m):
        while dim in grown and grown[dim] > blocks[dim] and _vmem(checked, grown) > chip.product_vmem_bytes:
            grown[dim] = max(grown[dim] // 2, blocks[dim])
    return grown if _vmem(checked, grown) <= chip.product_vmem_bytes else blocks


# The tiles' rows and the swept dimension of a kernel with products that takes no chip's
# product blocks (`one_product_dims`: attention) grow at call time up to this block
# (the runtime's `grown`, bounded by a step's elements and VMEM): each step costs a fixed ~600 cycles
# and small score tiles leave the MXU idle. Causal attention at 4096^2 was estimated at
# 2.2M cycles on v5e with blocks of 256, 0.93M with 512, 0.58M with 1024
# (benchmarks/RESULTS_TPU_ESTIMATES.md).
FUSED_BLOCK = 1024
# A fused kernel that skips blocks computes each step in strips of STRIP_ROWS rows, a strip
# of a block seen only in part taking the columns, in runs of STRIP_COLS (a lane tile),
# that some row of it may see (the runtime's `strips`); its blocks grow up to STRIPED_BLOCK.
# Causal attention at S = T = 4096, estimated on v5e: 538,585 cycles in blocks of 1024,
# 423,325 in one block of 4096 in strips (benchmarks/RESULTS_TPU_ESTIMATES.md, session 7).
STRIP_ROWS = 256
STRIP_COLS = 128
STRIPED_BLOCK = 4096
# The scoped VMEM limit such a kernel asks for, whatever its blocks: their count leaves out a
# strip's working values and the lanes a (rows, 1) value pads to (causal attention in blocks
# of 4096 takes 36 MiB where 10 are counted). At the usual 100 MiB, XLA's compile of it ran
# out of VMEM on v5e (it set aside the limit and 16 MiB more besides the kernel's 36 MiB);
# at 64 MiB it compiles.
STRIPED_VMEM_LIMIT_BYTES = 64 * 2**20


def tuned_blocks_problem(checked: CheckedKernel, tunable: list[str], tuned: TunedBlocks, layouts, fits) -> str | None:
    """Why tuned blocks do not fit this kernel (a tuning file edited by hand, or tuned for
    an older version of it), or None. `layouts`: the kernel's blocks as Mosaic tiles them;
    `fits(blocks)`: why blocks overflow VMEM, or None."""
    if tuned.chip not in CHIP_NAMES:
        return f"unknown chip {tuned.chip!r} (known: {', '.join(CHIP_NAMES)})"
    blocks, sizes = dict(tuned.blocks), dict(tuned.sizes)
    if sorted(blocks) != sorted(tunable):
        return f"blocks for {', '.join(sorted(blocks)) or 'no dimension'}, but the kernel blocks {', '.join(tunable)}"
    if sorted(sizes) != sorted(checked.dims):
        return f"sizes of {', '.join(sorted(sizes))}, but the kernel's dimensions are {', '.join(checked.dims)}"
    for dim, block in blocks.items():
        if block < 1 or sizes[dim] < 1:
            return f"{dim}: blocks and sizes are positive"
        if block != sizes[dim] and (problem := tiling_problem(dim, block, layouts)):
            return problem
    return fits(blocks)


def one_product_dims(checked: CheckedKernel) -> tuple[str | None, str | None, str] | None:
    """The M and N of a kernel's one product, as its tile holds them (None: an axis of
    size 1), and its K; None for a kernel of no product or several, or one that holds a
    dimension other than K whole (a softmax's row: its size, unknown until the call,
    decides what fits in VMEM, and its blocks grow at call time instead)."""
    frame = checked.frame
    if len(frame.products) != 1:
        return None
    (product,) = frame.products.values()
    if any(d not in checked.blocks and d not in frame.batch and d != product.k for d in checked.dims):
        return None
    m, n = frame.frame[product.node]
    return m, n, product.k


def _vmem(checked: CheckedKernel, blocks: dict[str, int]) -> int:
    blocks = {**checked.blocks, **blocks}
    return kernel_vmem(checked, blocks).total(blocks)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# The size a dimension taken whole (not blocked) is assumed to have when `build` warns of
# default blocks that cannot fit VMEM: the VMEM count takes it as 1 otherwise, and a
# spec's blocks then pass its checks yet run out of VMEM at realistic sizes.
REALISTIC_WHOLE_SIZE = 512


def default_blocks_vmem_warning(checked: CheckedKernel, tunable: list[str], vmem_of) -> str | None:
    """Why the blocks a call with none takes on a v5e or v6e (the chip's default) cannot
    fit a core's VMEM once each dimension taken whole has REALISTIC_WHOLE_SIZE elements,
    or None; `vmem_of(checked, blocks)` counts the bytes."""
    whole = {d: REALISTIC_WHOLE_SIZE for d in checked.dims if d not in checked.blocks}
    needed, chip = max((vmem_of(checked, {**whole, **chip_blocks(checked, tunable, c)}), c.name) for c in CHIPS)
    if needed <= VMEM_LIMIT_BYTES:
        return None
    at = f" with {', '.join(whole)} taken whole at {REALISTIC_WHOLE_SIZE}" if whole else ""
    return (
        f"{checked.kernel.name}: its default blocks need {format_bytes(needed)} of VMEM{at} ({chip}), more than the"
        f" {format_bytes(VMEM_LIMIT_BYTES)} a kernel may ask of a TPU v5e's or v6e's"
        f" {format_bytes(VMEM_CAPACITY_BYTES)}: Mosaic will run out of VMEM; use smaller blocks"
        + (" or block those dimensions" if whole else "")
    )
