"""What a call (and `pallasgen tune --gpu --gpu-backend mosaic_gpu`) may choose of a
Mosaic GPU product: its blocks of M, N and K and its pipeline's depth (`emit_pipeline`'s
`max_concurrent_steps`: K blocks of both operands in flight in shared memory).

They are public keywords of their own, `mgpu_block_*` and `mgpu_stages`, not the `gpu_*`
ones: Triton's blocks are any power of two and its stages a compiler option, while Mosaic
GPU's blocks are wgmma tiles and its stages TMA buffers, so values chosen (or tuned
best) for one backend say nothing of the other, and a tuning file keeps each apart.
Elementwise kernels and reductions keep their fixed blocks: they have no choices here.
"""

from __future__ import annotations

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.names import block_keyword
from pallasgen.analysis.product import Product
from pallasgen.backends.mosaic_gpu.stages import stages
from pallasgen.backends.mosaic_gpu.support import PRODUCT_TILE, WGMMA_DTYPES, refusal
from pallasgen.runtime.constants import MGPU_ACCUMULATOR_MOST as ACCUMULATOR_MOST
from pallasgen.runtime.constants import MGPU_BLOCKS_M as BLOCKS_M
from pallasgen.runtime.constants import MGPU_BLOCKS_N as BLOCKS_N
from pallasgen.runtime.constants import MGPU_SMEM_PER_BLOCK as SMEM_PER_BLOCK
from pallasgen.runtime.constants import MGPU_STAGES as STAGE_CHOICES

PREFIX = "mgpu_"
STAGES = "stages"  # the option's name in a tuning file; its keyword is PREFIX + STAGES
DEFAULT_STAGES = 2


def tunable(checked: CheckedKernel) -> bool:
    """Whether the kernel runs on Mosaic GPU as one product (the only kernels with choices)."""
    return checked.product is not None and not stages(checked) and refusal(checked) is None


def block_choices(checked: CheckedKernel) -> dict[str, tuple[int, ...]]:
    """Each product dimension's blocks, in order: K's are rows of 32, 64 and 128 bytes
    (the swizzles wgmma reads), or 128 alone where the right operand comes N-minor (not
    `rhs_n_major`): wgmma takes its swizzle (of N, 128 bytes) only if the left's matches."""
    product = checked.product
    depth = WGMMA_DTYPES[product.lhs.dtype.name]  # elements of 128 bytes
    depths = (depth // 4, depth // 2, depth) if rhs_n_major(product) else (depth,)
    return {product.m: BLOCKS_M, product.n: BLOCKS_N, product.k: depths}


def rhs_n_major(product: Product) -> bool:
    """Whether the right operand's tiles come [N, K] (K-minor): wgmma reads a transposed
    tile of 16-bit operands only, so the launcher swaps the others to this."""
    return product.rhs.transposed or product.lhs.dtype.bits != 16


def defaults(checked: CheckedKernel) -> dict[str, int]:
    """The built-in blocks, by dimension."""
    product = checked.product
    return {product.m: PRODUCT_TILE, product.n: PRODUCT_TILE, product.k: WGMMA_DTYPES[product.lhs.dtype.name]}


def mgpu_block_keyword(dim: str) -> str:
    """The public keyword of a Mosaic GPU block: mgpu_block_<dim>."""
    return PREFIX + block_keyword(dim)


def keywords(checked: CheckedKernel) -> dict[str, str]:
    """The public keywords, each with what it chooses (a dimension, or STAGES)."""
    found = {mgpu_block_keyword(d): d for d in block_choices(checked)}
    return found | {PREFIX + STAGES: STAGES} if found else {}


def allowed(checked: CheckedKernel) -> dict[str, tuple[int, ...]]:
    """Each public keyword's values."""
    blocks = block_choices(checked)
    return {k: STAGE_CHOICES if what == STAGES else blocks[what] for k, what in keywords(checked).items()}


def smem_terms(checked: CheckedKernel) -> tuple[int, int, list[tuple[int, tuple[str, ...]]]]:
    """What a program holds in shared memory: the bytes of an operand's element (the
    pipeline holds both operands' K blocks, one each a stage), of an element of the
    outputs' tiles together (allocated once the pipeline is done, in its memory; a
    residual's counted whether or not the call writes residuals), and
    (bytes an element, dimensions of its block) of each epilogue input, held throughout."""
    product, kernel = checked.product, checked.kernel
    operands = (product.lhs.name, product.rhs.name)
    outputs = sum(DTYPES[o.dtype].bits // 8 for o in kernel.outputs)
    held = [
        (DTYPES[d.dtype].bits // 8, tuple(x for x in d.dims if x in (product.m, product.n)))
        for d in kernel.inputs
        if d.name not in operands
    ]
    return DTYPES[product.lhs.dtype.name].bits // 8, outputs, held


def smem_bytes(checked: CheckedKernel, blocks: dict[str, int], stage_count: int) -> int:
    """The shared memory of a program with these blocks and stages."""
    product = checked.product
    operand, outputs, held = smem_terms(checked)
    m, n, k = (blocks[d] for d in (product.m, product.n, product.k))
    total = max(stage_count * operand * (m + n) * k, outputs * m * n)
    for size, dims in held:
        for dim in dims:
            size *= blocks[dim]
        total += size
    return total


def smem_code(checked: CheckedKernel, block_names: dict[str, str], stages_name: str) -> str:
    """`smem_bytes` as Python source, of the launcher's names for the blocks and stages:
    the larger of the pipeline's K blocks and the outputs' tiles (which reuse its memory),
    then the blocks held throughout, those of the same shape summed."""
    product = checked.product
    operand, outputs, terms = smem_terms(checked)
    m, n, k = (block_names[d] for d in (product.m, product.n, product.k))
    held: dict[tuple[str, ...], int] = {}
    for b, dims in terms:
        held[dims] = held.get(dims, 0) + b
    return " + ".join(
        [
            f"max({stages_name} * {operand} * ({m} + {n}) * {k}, {outputs} * {m} * {n})",
            *(" * ".join([str(b), *(block_names[d] for d in dims)]) for dims, b in held.items()),
        ]
    )


def problem(checked: CheckedKernel, blocks: dict[str, int], stage_count: int) -> str | None:
    """Why Mosaic GPU cannot run these blocks and stages, beyond each value's choices, or None."""
    product = checked.product
    if blocks[product.m] * blocks[product.n] > ACCUMULATOR_MOST:
        return f"a {blocks[product.m]}x{blocks[product.n]} accumulator is more than one warpgroup's registers hold"
    used = smem_bytes(checked, blocks, stage_count)
    if used > SMEM_PER_BLOCK:
        return f"{used // 1024} KiB of shared memory, more than the {SMEM_PER_BLOCK // 1024} KiB of a block"
    return None


def tuned_problem(checked: CheckedKernel, tuned) -> str | None:
    """Why a Mosaic GPU entry of a tuning file (a `TunedBlocks`) does not fit this kernel, or None."""
    if not tunable(checked):
        return "Mosaic GPU blocks, but the kernel has none to choose (only a product on Mosaic GPU has)"
    blocks, options = dict(tuned.blocks), dict(tuned.options)
    if sorted(blocks) != sorted(block_choices(checked)) or sorted(options) != [STAGES]:
        return f"Mosaic GPU blocks for {', '.join(blocks) or 'no dimension'} and options {', '.join(options) or 'none'}, but the kernel's are blocks of {', '.join(block_choices(checked))} and {STAGES}"
    if sorted(dict(tuned.sizes)) != sorted(checked.dims):
        return f"sizes of {', '.join(sorted(dict(tuned.sizes)))}, but the kernel's dimensions are {', '.join(checked.dims)}"
    for dim, values in block_choices(checked).items():
        if blocks[dim] not in values:
            return f"Mosaic GPU block {dim}={blocks[dim]} is not one of {', '.join(map(str, values))}"
    if options[STAGES] not in STAGE_CHOICES:
        return f"Mosaic GPU {STAGES}={options[STAGES]} is not one of {', '.join(map(str, STAGE_CHOICES))}"
    return problem(checked, blocks, options[STAGES])
