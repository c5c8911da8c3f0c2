"""The TPU (Mosaic) plan of a kernel, as plain data: grid, BlockSpecs, dimension
semantics, the running values in scratch memory, and the kernel body; and what the
planner (`carried`) writes it with.

Templates only loop and branch over these plans; every decision is made here.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES, tpu_dtype
from pallasgen.analysis.names import block_keyword
from pallasgen.backends.base import Tiling
from pallasgen.backends.tpu.chips import CHIPS
from pallasgen.backends.tpu.tiling import TilingRule, format_bytes, Vmem, tiling_rule
from pallasgen.frontend import ir
from pallasgen.lowering.kernel import LoweredKernel
from pallasgen.lowering.parts import LINE_LENGTH, WrittenSpecs, if_residuals, tuple_code
from pallasgen.lowering.signature import Keyword, KeywordGroup


@dataclass(frozen=True)
class BlockPlan:
    keyword: str  # block_m
    default: int
    dim: str


@dataclass(frozen=True)
class AccumulatorPlan:
    """Scratch accumulators over the steps of a blocked reduced dimension: a product's
    contracted one, or one that reductions remove."""

    scratch: tuple[tuple[str, str], ...]  # (comment, pltpu.VMEM(...))
    step: str  # the variable holding the reduced dimension's grid index
    axis: int
    init_function: str
    init: tuple[str, ...]  # at the first step: the accumulators set to their identities
    body: tuple[str, ...]  # each step: load, mask a ragged edge, accumulate
    finish_function: str  # at the last step: the kernel body, on the accumulated values
    skip: str | None = None  # a block where this is false adds nothing: its step is skipped
    strips: StripsPlan | None = None  # a step computed in strips of its rows

    def code(self) -> tuple[str, ...]:
        """The lines of code the kernel function writes for it, near enough to find the
        names they read."""
        strips = self.strips
        extra = (strips.call,) if strips else ()
        return (*self.init, *self.body, self.skip or "", *extra)


@dataclass(frozen=True)
class StripsPlan:
    """A step of a kernel that skips blocks, computed in strips of its block's rows (see
    the `rt.add_in_strips` helper): one function of a strip, called on views of the refs."""

    function: str  # the strip's function: the step's body, its refs and positions a strip's
    parameters: str
    call: str  # the kernel's `rt.add_in_strips(...)`, which calls it for each strip


@dataclass(frozen=True)
class BlockTable:
    """The blocks a call that passes none takes, by chip, and the tiling rule each keeps:
    the public function's `tpu_blocks`, an `rt.TpuBlocks`, which `rt.tpu_blocks` reads
    to choose, clamp and check the blocks before it calls the launcher."""

    table: str  # its `rt.TpuBlocks(...)`


@dataclass(frozen=True)
class TpuPlan(WrittenSpecs):
    function: str  # the launcher
    kernel_function: str
    blocks: tuple[BlockPlan, ...]
    block_table: BlockTable | None  # None when no dimension has a block keyword
    kernel_parameters: str  # of the kernel function: refs, then static keywords
    kernel_callable: str  # the kernel, with its static keywords bound by functools.partial
    parameters: str  # of the launcher
    binding: str  # the keywords the public function binds for the launcher
    conversions: tuple[str, ...]  # f16 inputs converted to f32 for the TPU kernel
    returns: str  # f16 outputs converted back from f32; empty when there are none
    grid: str
    grid_comment: tuple[str, ...]  # comment lines
    in_specs: tuple[tuple[str, str], ...]  # (comment, BlockSpec)
    out_specs: tuple[tuple[str, str], ...]
    out_shapes: tuple[tuple[str, str], ...]  # (jax.ShapeDtypeStruct, output name)
    dimension_semantics: tuple[str, ...]
    vmem_comment: tuple[str, ...]  # the VMEM at the default blocks, and the limit asked for
    vmem_needed: str  # the blocks' VMEM in bytes, as code over the call-time blocks and sizes
    vmem_limit: str  # the scoped VMEM limit asked for, as code
    cost_estimate: str
    accumulator: AccumulatorPlan | None
    body: tuple[str, ...]  # the kernel body, or its last step when it accumulates
    tiling: Tiling  # what grid, in_specs, out_specs and dimension_semantics are written from
    vmem: Vmem  # what vmem_comment and vmem_needed count
    prologue: tuple[
        str, ...
    ] = ()  # first, outside any pl.when: its scratch refs unpacked, where this step's blocks start
    helper: tuple[str, ...] = ()  # the launcher's lines that define a function its index maps call


def tunable_dims(checked: CheckedKernel) -> list[str]:
    """The blocked dimensions whose blocks are keywords, of any kernel: all but its batch
    dimensions, which take one element per step and vanish from its tiles."""
    return [d for d in checked.dims if d in checked.blocks and d not in checked.batch]


def keyword_group(checked: CheckedKernel) -> KeywordGroup:
    """The public `block_*` keywords, and their lines of the docstring."""
    return block_keywords(tunable_dims(checked))


def block_keywords(tunable) -> KeywordGroup:
    """The public keywords `block_*` of the `tunable` dimensions. The runtime documents them
    from the public function's `tpu_blocks` (rt.keyword_lines)."""
    return KeywordGroup(tuple(Keyword(block_keyword(d), "None") for d in tunable), ())


def block_table(
    checked: CheckedKernel,
    tunable: list[str],
    sizes,
    layouts,
    chip_default,
    step: str = "",
    bounds: tuple[int, ...] = (),
    strips: bool = False,
) -> BlockTable | None:
    """The launcher's `rt.TpuBlocks`: the spec's blocks
    (None's default); each chip's default where `chip_default(chip)` differs from them,
    and the blocks tuned for it; each block's tiling rule; and where the blocks grow, a
    grid `step`'s elements and VMEM (code over the call's sizes and given blocks) and the
    most each block grows to (`bounds`; none: its dimension), in a kernel computed in
    `strips` a power of two within its dimension."""
    if not tunable:
        return None
    spec = tuple_code([str(checked.blocks[d]) for d in tunable])
    chips = {"None": {'"default"': spec}}
    for chip in CHIPS:
        entries = {}
        default = tuple_code([str(block) for block in chip_default(chip)])
        if default != spec:
            entries['"default"'] = default
        for tuned in sorted((t for t in checked.tuned_for("tpu") if t.chip == chip.name), key=lambda t: t.sizes):
            tuned_sizes, tuned_blocks = dict(tuned.sizes), dict(tuned.blocks)
            tuned_at = tuple_code([str(tuned_sizes[d]) for d in checked.dims])
            entries[tuned_at] = tuple_code([str(tuned_blocks[d]) for d in tunable])
        if entries:
            chips[f'"{chip.name}"'] = entries
    chips_code = ", ".join(
        f"{chip}: {{{', '.join(f'{key}: {blocks}' for key, blocks in entries.items())}}}"
        for chip, entries in chips.items()
    )
    rules = ", ".join(f'"{d}": {_rule_code(tiling_rule(d, layouts))}' for d in tunable)
    size_names = [sizes[d] for d in checked.dims]
    keywords = [block_keyword(d) for d in tunable]
    fields = [f"tiling={{{rules}}}", f"chips={{{chips_code}}}"]
    saving = ["residuals"] if re.search(r"\bresiduals\b", step) else []  # its step's VMEM writing them
    fields += [f"step=lambda {', '.join(size_names + keywords + saving)}: {step}"] if step else []
    fields += [f"bounds={tuple_code([str(b) for b in bounds])}"] if bounds else []
    fields += ["strips=True"] if strips else []
    return BlockTable(f"rt.TpuBlocks({', '.join(fields)})")


def _rule_code(rule: TilingRule | None) -> str:
    """A block's tiling rule as `rt.TpuBlocks` holds it: (multiple, held[, smallest power of two])."""
    if rule is None:
        return "None"
    smallest = f", {rule.smallest_power_of_two}" if rule.smallest_power_of_two else ""
    return f'({rule.multiple}, "{rule.held}"{smallest})'


def kernel_function_name(kernel: str) -> str:
    return f"_{kernel}_kernel"


def launcher_name(kernel: str) -> str:
    return f"_{kernel}_tpu"


def read_keywords(keywords: list[str], code) -> list[str]:
    """The `keywords` (sizes, blocks and params) that the kernel's `code`, its lines,
    reads: the kernel function's static keywords, bound by functools.partial."""
    text = "\n".join(code)
    return [k for k in keywords if re.search(rf"\b{re.escape(k)}\b", text)]


def tpu_return(lowered: LoweredKernel) -> str:
    """What the TPU launcher returns when f16 outputs come back as f32; empty if none do."""
    outputs = lowered.outputs
    if all(o.spec_dtype == tpu_dtype(o.spec_dtype) for o in outputs):
        return ""
    return ", ".join(
        o.name if o.spec_dtype == tpu_dtype(o.spec_dtype) else if_residuals(f"{o.name}.astype({o.dtype})", o)
        for o in outputs
    )


def output_bytes(kernel: ir.Kernel, residuals, elements) -> str:
    """The bytes a kernel's outputs take, as code (`elements(decl)`: the factors of one's
    size); the residuals' only where the launcher writes them."""
    outputs = sum_code([(DTYPES[d.dtype].bytes, elements(d)) for d in kernel.outputs if d.name not in residuals])
    saved = sum_code([(DTYPES[d.dtype].bytes, elements(d)) for d in kernel.outputs if d.name in residuals])
    return f"{outputs} + ({saved} if residuals else 0)" if residuals else outputs


def sum_code(terms) -> str:
    """A sum of `(count, factors)` terms as code, like terms (the same factors, in any
    order) added up: `12 * block_s * d + 16 * block_s`; "0" for nothing."""
    merged: dict[tuple[str, ...], list] = {}
    for count, factors in terms:
        merged.setdefault(tuple(sorted(factors)), [0, list(factors)])[0] += count
    return (
        " + ".join(
            " * ".join([str(count)] * (count != 1 or not factors) + factors)
            for count, factors in merged.values()
            if count > 0
        )
        or "0"
    )


def grid_comment(blocked, dims, squeezed: set[str], semantics: tuple[str, ...]) -> str:
    """What the grid's axes are, and how they run: as `semantics`, each axis's dimension semantics."""
    if not blocked:
        return "A single step: every dimension is taken whole."
    steps = ", ".join(f"element of {d}" if d in squeezed else f"block of {d}" for d in blocked)
    whole = [d for d in dims if d not in blocked]
    taken = f" ({', '.join(whole)} taken whole)" if whole else ""
    ordered = [d for d, kind in zip(blocked, semantics) if kind == "arbitrary"]
    if not ordered:
        return f"One step per {steps}{taken}; steps are independent, so every axis is parallel."
    independent = [d for d, kind in zip(blocked, semantics) if kind == "parallel"]
    clauses = [f"steps along {', '.join(independent)} are independent (parallel)"] if independent else []
    clauses.append(f"steps along {', '.join(ordered)} accumulate in order (arbitrary)")
    sentence = "; ".join(clauses)
    return f"One step per {steps}{taken}. {sentence[0].upper()}{sentence[1:]}."


def vmem_comment(needed: Vmem, blocks: dict[str, int], dims, limit: str = "", residuals=frozenset()) -> str:
    """The VMEM at the default blocks, and every part of it (`residuals`' blocks only where
    the launcher writes them); then the `limit` the launcher asks for where it is not the
    call's blocks' (`rt.vmem_limit`, which the code says)."""
    whole = [d for d in dims if d not in blocks]
    per = f" ({', '.join(whole)} counted as 1)" if whole else ""
    said = f"VMEM at the default blocks{per}: {format_bytes(needed.total(blocks))} = {needed.formula(blocks)}."
    if residuals:
        said += f" {', '.join(sorted(residuals))}: only when the residuals are written."
    return f"{said} {limit}" if limit else said


def residual_vmem_code(terms, plain_terms, block_of, squeezed) -> str:
    """VMEM (bytes, dims) `terms` as code over the call-time blocks; given `plain_terms`,
    those of the kernel without its residuals: theirs, and what the residuals need
    besides only where the launcher writes them (`residuals`)."""

    def code(terms):
        return sum_code([(count, [block_of[d] for d in dims if d not in squeezed]) for count, dims in terms])

    if plain_terms is None:
        return code(terms)
    extra: dict[tuple[str, ...], int] = {}
    for sign, some in ((1, terms), (-1, plain_terms)):
        for count, dims in some:
            extra[dims] = extra.get(dims, 0) + sign * count
    if any(count < 0 for count in extra.values()):  # not a sum of more: the larger, either way
        return code(terms)
    saved = code([(count, dims) for dims, count in extra.items() if count])
    return f"{code(plain_terms)} + ({saved} if residuals else 0)" if saved != "0" else code(plain_terms)


def wrap(text: str, indent: int) -> tuple[str, ...]:
    """A comment's lines, at `indent` columns: each within the line length with its "# "."""
    return tuple(textwrap.wrap(text, LINE_LENGTH - indent - 2))
