"""The GPU (Triton) half of a kernel's plan, as plain data, and what the planner
(`carried`) writes it with.

Triton has no scratch memory and runs grid programs concurrently, so a kernel that
carries values over a blocked dimension loops over its blocks inside one program; every
block is a power of two. Pallas's Triton backend does not mask a block that overhangs
its array (a BlockSpec is pointer arithmetic), so every load and store that can
overhang is masked: `rt.inside` per dimension, None where the blocks tile it exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import Tiling
from pallasgen.backends.gpu.options import OPTIONS, gpu_block_keyword, is_power_of_two
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import WrittenSpecs, if_residuals, LINE_LENGTH, parameter_list, tuple_code

# gpu_block_*, gpu_warps, gpu_stages are documented by the runtime, from the public function's
# triton_options (rt.keyword_lines)
GPU_DOC: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuBlockPlan:
    keyword: str  # gpu_block_m, a keyword of the public function
    local: str  # block_m, inside the GPU function
    default: int
    size: str
    dim: str
    smallest: int  # the least tile Triton's dot takes along this dimension


# Triton's tl.dot takes tiles of at least 16 rows and columns, and a depth of at least
# 16, or 32 for 8-bit operands (the int8 tensor-core instruction's depth). Pallas emits
# Triton's dot without tl.dot's check of the depth: attention kernels whose dots had
# depth 4 and 1 compiled with XLA's Triton and gave wrong values on an H200 (issue 33).
SMALLEST_DOT_TILE = 16
SMALLEST_INT8_DOT_DEPTH = 32


@dataclass(frozen=True)
class GpuPlan(WrittenSpecs):
    function: str
    kernel_function: str
    blocks: tuple[GpuBlockPlan, ...]  # the tunable ones (squeezed batch dims are not)
    whole_blocks: tuple[tuple[str, str, str, int], ...]  # (local, size, dim, least block) of dimensions held whole
    options: tuple[tuple[str, str, int | None], ...]  # (public keyword, GPU function keyword, default)
    row_warps: str | None  # the values a program holds of whole rows, where they choose its warps
    prologue: tuple[str, ...]  # the launcher's lines before its pallas_call (operands swapped K-major, blocks fitted)
    tuned: tuple[tuple[str, dict], ...]  # (device kind, {sizes: blocks and options}) from tune --gpu
    dims: tuple[str, ...]  # the dimensions of the tuned entries' sizes, in their order
    grid: str
    grid_comment: tuple[str, ...]
    in_specs: tuple[tuple[str, str], ...]  # (comment, BlockSpec)
    out_specs: tuple[tuple[str, str], ...]
    out_shapes: tuple[tuple[str, str], ...]  # (jax.ShapeDtypeStruct, output name)
    kernel_parameters: str
    kernel_callable: str
    parameters: str  # of the GPU launcher
    dispatch_arguments: str  # the keywords the public function binds for the launcher
    masks: tuple[str, ...]  # the blocks read from the output's shape; which positions of them lie inside the arrays
    loop: tuple[str, ...]  # the loop over the swept dimension's blocks, ending with its running values' assignment
    body: tuple[str, ...]
    tiling: Tiling  # what grid, in_specs and out_specs are written from

    @property
    def options_table(self) -> str:
        """The `rt.GpuOptions` the public function chooses the launcher's blocks and
        options from: the spec's, and those tuned by GPU kind."""
        built_in = tuple_code([*(str(b.default) for b in self.blocks), *(str(o[2]) for o in self.options)])
        rows = [f"None: {built_in}", *(f"{kind!r}: {entries!r}" for kind, entries in self.tuned)]
        least = sorted({b.smallest for b in self.blocks})
        if len(least) > 1:
            least_code = f", least={tuple_code([str(b.smallest) for b in self.blocks])}"
        else:
            least_code = f", least={least[0]}" if least and least[0] > 1 else ""
        return f"rt.GpuOptions({{{', '.join(rows)}}}, {self.dims!r}{least_code})"


def out_shapes(lowered: LoweredKernel) -> tuple[tuple[str, str], ...]:
    """Each output's (jax.ShapeDtypeStruct, name), None for a residual not asked for."""
    return tuple(
        (if_residuals(f"jax.ShapeDtypeStruct({o.layout_shape}, {o.dtype})", o), o.spec_name) for o in lowered.outputs
    )


def tuned_fields(checked: CheckedKernel, tunable: list[str]) -> dict:
    """The GpuPlan fields of the call-time choice of blocks and options: the entries
    `pallasgen tune --gpu` recorded, by device kind, and the order of their sizes: the
    blocks' dimensions, then the others (`rt.triton_options` clamps each block by its
    dimension's size)."""
    dims = [*tunable, *(d for d in checked.dims if d not in tunable)]
    tuned: dict[str, dict] = {}
    for entry in sorted(checked.tuned_for("gpu"), key=lambda t: (t.chip, t.sizes)):
        at, blocks, options = dict(entry.sizes), dict(entry.blocks), dict(entry.options)
        key = tuple(at[d] for d in dims)
        tuned.setdefault(entry.chip, {})[key] = (*(blocks[d] for d in tunable), *(options[o] for o in OPTIONS))
    return {"tuned": tuple(tuned.items()), "dims": tuple(dims)}


def tuned_problem(checked: CheckedKernel, tunable: list[str], tuned) -> str | None:
    """Why a GPU entry of a tuning file does not fit this kernel, or None."""
    blocks, options = dict(tuned.blocks), dict(tuned.options)
    if sorted(blocks) != sorted(tunable):
        return f"GPU blocks for {', '.join(sorted(blocks)) or 'no dimension'}, but the kernel's GPU blocks are {', '.join(tunable) or 'none'}"
    if sorted(dict(tuned.sizes)) != sorted(checked.dims):
        return f"sizes of {', '.join(sorted(dict(tuned.sizes)))}, but the kernel's dimensions are {', '.join(checked.dims)}"
    for dim, block in blocks.items():
        if not is_power_of_two(block):
            return f"GPU block {dim}={block} is not a power of two"
    for name, (_, allowed) in OPTIONS.items():
        if options.get(name) not in allowed:
            return f"GPU option {name} is {options.get(name)!r}, not one of {', '.join(map(str, allowed))}"
    return None


def shape_reads(tiling: Tiling, array: str, ref: str) -> tuple[list[str], list[str]]:
    """The blocks a kernel reads from the shape of an array's block (`ref`), and the
    line that reads them (none: its block has no blocked axis)."""
    axes = next(a for a in tiling.arrays if a.name == array).axes
    names = [block_keyword(a.dim) if a.extent == "block" else "_" for a in axes if a.extent != "squeezed"]
    read = [name for name in names if name != "_"]
    return read, [f"{', '.join(names)}{',' if len(names) == 1 else ''} = {ref}.shape"] if read else []


def comments_above(lines, indent: int = 4) -> tuple[str, ...]:
    """A function body's lines (at `indent`), each comment after code that would not fit
    a line with it moved to a line of its own above the code (black would split the code)."""
    out = []
    for line in lines:
        code, _, comment = line.partition("  # ")
        if comment and indent + len(line) > LINE_LENGTH and "#" not in code and code.count('"') % 2 == 0:
            out += [f"{code[: len(code) - len(code.lstrip())]}# {comment}", code]
        else:
            out.append(line)
    return tuple(out)


def mentioned(names, lines) -> list[str]:
    """The `names` that `lines` (a kernel's code) read: the statics it takes."""
    words = set(re.findall(r"\w+", "\n".join(lines)))
    return [name for name in names if name in words]


def kernel_function_name(kernel: str) -> str:
    return f"_{kernel}_gpu_kernel"


def launcher_name(kernel: str) -> str:
    return f"_{kernel}_gpu"


def launcher_parameters(lowered: LoweredKernel, tunable) -> str:
    """The GPU launcher's parameters: the input arrays, then sizes, blocks, launch options,
    params, `residuals` where it has some, and `interpret` as keywords."""
    checked, kernel = lowered.checked, lowered.kernel
    return parameter_list(
        [lowered.values[d.name] for d in kernel.inputs],
        [lowered.sizes[d] for d in checked.dims]
        + [block_keyword(d) for d in tunable]
        + [f"num_{name}" for name in OPTIONS]
        + [p.name for p in kernel.params]
        + (["residuals"] if lowered.residuals else [])
        + ["interpret"],
    )


def dispatch_arguments(checked: CheckedKernel, sizes, tunable) -> str:
    """The keywords the public function binds for the GPU launcher."""
    return ", ".join(
        [f"{sizes[d]}={sizes[d]}" for d in checked.dims]
        + [f"{block_keyword(d)}={gpu_block_keyword(d)}" for d in tunable]
        + [f"num_{name}={keyword}" for name, (keyword, _) in OPTIONS.items()]
        + [f"{p.name}={p.name}" for p in checked.kernel.params]
    )
