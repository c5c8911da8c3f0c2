"""The GPU's own spec checks: `gpu block` sizes Triton takes and known `gpu` options,
with the defaults filled in."""

from __future__ import annotations

from dataclasses import dataclass

from pallasgen.analysis.checks import MAX_BLOCK, block_items, reserved_param_problems
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.product import Product
from pallasgen.analysis.space import IterationSpace
from pallasgen.backends.gpu.options import (
    GPU_FUNCTION_LOCALS,
    OPTIONS,
    default_blocks,
    default_options,
    gpu_keywords,
    is_power_of_two,
)
from pallasgen.frontend import ir
from pallasgen.frontend.errors import Diagnostic, did_you_mean


@dataclass(frozen=True)
class GpuSettings:
    blocks: dict[str, int]  # every dimension the GPU path blocks -> default block size
    options: dict[str, int]  # warps, stages


def check_gpu(
    kernel: ir.Kernel,
    space: IterationSpace,
    product: Product | None,
    tpu_blocks: dict[str, int],
    earlier: list[Diagnostic],
    batch: tuple[str, ...] = (),
) -> tuple[GpuSettings, list[Diagnostic]]:
    """`gpu block` sizes are powers of two (Triton's rule), of 1 for a product's `batch`
    dimensions, and `gpu` options are known; defaults complete them once the kernel has
    no `earlier` errors."""

    def gpu_size_problem(item: ir.BlockSize) -> str | None:
        if isinstance(item.size, float) or not is_power_of_two(item.size) or item.size > MAX_BLOCK:
            return f"a GPU block size is a power of two (Triton's rule), not {item.size}"
        if item.dim in batch and item.size != 1:
            return f"batch dimension {item.dim} of a matrix product is blocked by 1"
        return None

    declared = {d for decl in kernel.inputs + kernel.outputs for d in decl.dims}
    found = reserved_param_problems(kernel, gpu_keywords(declared) | set(GPU_FUNCTION_LOCALS))
    blocks, problems = block_items(kernel.gpu_blocks, space.names, "GPU block", gpu_size_problem)
    found.extend(problems)
    options: dict[str, int] = {}
    for option in kernel.gpu_options:
        if option.name not in OPTIONS:
            found.append(
                Diagnostic(
                    option.position,
                    f"unknown GPU option '{option.name}'{did_you_mean(option.name, OPTIONS)};"
                    f" options are {', '.join(OPTIONS)}",
                )
            )
        elif option.name in options:
            found.append(Diagnostic(option.position, f"GPU option {option.name} is given twice"))
        elif option.value not in OPTIONS[option.name][1] or isinstance(option.value, float):
            allowed = ", ".join(map(str, OPTIONS[option.name][1]))
            found.append(Diagnostic(option.value_position, f"gpu {option.name} is one of {allowed}"))
        else:
            options[option.name] = option.value
    if earlier or found or not kernel.outputs or not all(d.dtype in DTYPES for d in kernel.inputs + kernel.outputs):
        return GpuSettings(blocks, options), found
    return (
        GpuSettings(
            {**default_blocks(kernel, space, product, tpu_blocks), **blocks}, {**default_options(product), **options}
        ),
        found,
    )
