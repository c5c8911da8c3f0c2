"""What a generated module holds, as plain data: names, grid, BlockSpecs, code lines.

Templates only loop and branch over these plans; every decision is made here.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from pallasgen.frontend import ir
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.names import Namer, block_keyword
from pallasgen.backends.gpu.options import GPU_FUNCTION_LOCALS, gpu_keywords
from pallasgen.backends.gpu.plan import GpuPlan, plan_gpu
from pallasgen.lowering.parts import (
    array_positions,
    broadcast,
    dot_code,
    grid_names,
    kernel_statements,
    layout_of,
    parameter_list,
    partial_call,
    ref_load,
    ref_store,
    tuple_code,
)
from pallasgen.analysis.product import Product
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.analysis.dtypes import tpu_dtype
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.backends.tpu.tiling import TilingRule, array_layouts, format_bytes, tiling_rule, vmem_bytes

MODULE_HELPERS = frozenset(
    {"_on_platform", "_sizes", "_check_tiling", "_inside", "_mask", "_load", "_store", "_nbytes"}
)


@dataclass(frozen=True)
class ArrayPlan:
    name: str  # Python name in the generated code
    spec_name: str
    dtype: str  # jnp.float32
    tpu_dtype: str  # as the TPU kernel holds it: f16 as jnp.float32
    dims: tuple[str, ...]
    ref: str
    block_spec: str
    comment: str
    expand: str | None  # wrapper statement that lays an input out over the output dims
    reference_expand: str | None
    shape: str  # (m, n), for outputs


@dataclass(frozen=True)
class BlockPlan:
    keyword: str  # block_m
    default: int
    size: str  # the size variable it is clamped to: m
    dim: str


COMMENT_WIDTH = 84


@dataclass(frozen=True)
class AccumulatorPlan:
    """A product summed over steps of its blocked contracted dimension."""

    ref: str
    scratch: str  # pltpu.VMEM(...)
    scratch_comment: str
    step: str  # the variable holding the contracted dimension's grid index
    axis: int
    body: tuple[str, ...]  # each step: load, mask a ragged edge, accumulate


@dataclass(frozen=True)
class KernelPlan:
    name: str
    kernel_function: str
    reference_function: str
    doc: tuple[str, ...]
    inputs: tuple[ArrayPlan, ...]
    outputs: tuple[ArrayPlan, ...]
    blocks: tuple[BlockPlan, ...]
    static_argnames: tuple[str, ...]
    sizes: tuple[tuple[str, str], ...]  # (Python variable, spec dim)
    kernel_parameters: str  # of the kernel function: refs, then static keywords
    kernel_callable: str  # the kernel, with its static keywords bound by functools.partial
    parameters: str  # of the public function
    tpu_function: str
    tpu_parameters: str
    tpu_binding: str  # the keywords the public function binds for the TPU launcher
    tiling_checks: tuple[str, ...]  # call-time blocks checked against Mosaic's tiling rule
    tpu_conversions: tuple[str, ...]  # f16 inputs converted to f32 for the TPU kernel
    tpu_return: str  # f16 outputs converted back from f32; empty when there are none
    reference_parameters: str
    arguments: str  # the input arrays, in order
    grid: str
    grid_comment: tuple[str, ...]  # comment lines
    dimension_semantics: tuple[str, ...]
    vmem_comment: tuple[str, ...]
    cost_estimate: str
    accumulator: AccumulatorPlan | None
    body: tuple[str, ...]  # the kernel body, or its last step when it accumulates
    reference_sizes: tuple[str, ...]
    reference_body: tuple[str, ...]
    gpu: GpuPlan


@dataclass(frozen=True)
class ModulePlan:
    spec_path: str
    kernels: tuple[KernelPlan, ...]


def plan_module(spec_path: str, kernels: tuple[CheckedKernel, ...]) -> ModulePlan:
    module_names = MODULE_HELPERS | {
        f"_{k.kernel.name}{suffix}" for k in kernels for suffix in ("_kernel", "_tpu", "_gpu_kernel", "_gpu")
    }
    return ModulePlan(spec_path, tuple(plan_kernel(k, module_names) for k in kernels))


def plan_kernel(checked: CheckedKernel, module_names: frozenset[str] = MODULE_HELPERS) -> KernelPlan:
    """The plan of one kernel; `module_names` are module-level names its code must not shadow."""
    kernel, dims, product = checked.kernel, checked.dims, checked.product
    out_dims = kernel.outputs[0].dims
    blocked = [d for d in dims if d in checked.blocks]
    # A product's batch dimensions take one element per step and vanish from the kernel's tiles.
    squeezed = {d for d in out_dims[:-2] if checked.blocks.get(d) == 1} if product else set()
    tunable = [d for d in blocked if d not in squeezed]

    public_keywords = {block_keyword(d) for d in dims} | gpu_keywords(dims)
    namer = Namer(module_names | {p.name for p in kernel.params} | public_keywords | set(GPU_FUNCTION_LOCALS))
    values = {name: namer.claim(name) for name in _value_names(kernel)}
    sizes = {dim: namer.claim(dim.lower()) for dim in dims}
    refs = {d.name: namer.claim(values[d.name] + "_ref") for d in kernel.inputs + kernel.outputs}
    index_names = grid_names(blocked, product)
    block_of = {d: block_keyword(d) if d in checked.blocks else sizes[d] for d in dims}
    operands = {o.name: o for o in product.operands} if product else {}

    def block_spec(decl: ir.ArrayDecl) -> str:
        shape, index = [], []
        for dim, out_dim in array_positions(decl, out_dims, product):
            if out_dim in squeezed:  # one batch element per step; an array without it has size 1 there
                shape.append("None")
                index.append(index_names[out_dim] if dim else "0")
            else:
                shape.append(block_of[dim] if dim else "1")
                index.append(index_names.get(dim, "0") if dim else "0")
        return f"pl.BlockSpec({tuple_code(shape)}, lambda {', '.join(index_names.values())}: {tuple_code(index)})"

    def array_plan(decl: ir.ArrayDecl) -> ArrayPlan:
        name = values[decl.name]
        layout = layout_of(decl, out_dims, product)
        broadcast = decl.name not in operands and decl.dims != out_dims
        return ArrayPlan(
            name=name,
            spec_name=decl.name,
            dtype=jnp_dtype(decl.dtype),
            tpu_dtype=jnp_dtype(tpu_dtype(decl.dtype)),
            dims=decl.dims,
            ref=refs[decl.name],
            block_spec=block_spec(decl),
            comment=comments[decl.name],
            expand=(
                f"{name} = {name}.reshape({', '.join(sizes[d] if d else '1' for d in layout)})" if broadcast else None
            ),
            reference_expand=(
                f"{name} = {name}[{', '.join(':' if d else 'None' for d in layout)}]" if broadcast else None
            ),
            shape=tuple_code([sizes[d] for d in decl.dims]),
        )

    accumulator_name = namer.claim("acc") if product else ""
    overrides = {product.node: accumulator_name} if product else {}
    names = {**values, **{p.name: p.name for p in kernel.params}}
    emitter = Emitter(names, checked.types, overrides)
    tpu_emitter = Emitter(names, checked.types, overrides, tpu=True)
    body = kernel_statements(kernel, tpu_emitter, values, refs, checked, ref_load(refs), ref_store(refs))
    reference_body, needs_sizes = _reference_statements(kernel, emitter, values, sizes, checked)
    comments = {d.name: _array_comment(d, out_dims, operands) for d in kernel.inputs + kernel.outputs}
    gpu = plan_gpu(checked, namer.fork(), values, refs, sizes, comments, emitter, accumulator_name)
    kernel_keywords = [p.name for p in kernel.params]
    accumulator = None
    scratch_refs = []
    if product is not None:
        k_blocked = product.k in checked.blocks
        step = namer.claim("step") if k_blocked else ""
        product_lines = _product_lines(product, values, refs, sizes, block_keyword(product.k), step, k_blocked)
        if k_blocked:
            acc_ref = namer.claim("acc_ref")
            accumulator = AccumulatorPlan(
                ref=acc_ref,
                scratch=f"pltpu.VMEM(({block_of[product.m]}, {block_of[product.n]}), {jnp_dtype(product.accumulator.name)})",
                scratch_comment=f"{acc_ref}: the {product.accumulator.name} sum over {product.k} of one output tile",
                step=step,
                axis=len(blocked) - 1,
                body=tuple(product_lines[:-1] + [f"{acc_ref}[...] += {product_lines[-1]}"]),
            )
            body = [f"{accumulator_name} = {acc_ref}[...]", *body]
            scratch_refs = [acc_ref]
            kernel_keywords = [sizes[product.k], block_keyword(product.k), *kernel_keywords]
        else:
            body = [*product_lines[:-1], f"{accumulator_name} = {product_lines[-1]}", *body]
        reference_body = [f"{accumulator_name} = {_einsum(product, values)}", *reference_body]

    inputs = tuple(array_plan(d) for d in kernel.inputs)
    outputs = tuple(array_plan(d) for d in kernel.outputs)
    layouts = array_layouts(kernel, dims, product)
    return KernelPlan(
        name=kernel.name,
        kernel_function=f"_{kernel.name}_kernel",
        reference_function=f"{kernel.name}_reference",
        doc=_docstring(kernel, tunable, checked.blocks, values),
        inputs=inputs,
        outputs=outputs,
        blocks=tuple(BlockPlan(block_keyword(d), checked.blocks[d], sizes[d], d) for d in tunable),
        static_argnames=(
            *(block_keyword(d) for d in tunable),
            *(b.keyword for b in gpu.blocks),
            *(keyword for keyword, _, _ in gpu.options),
            *(p.name for p in kernel.params),
            "interpret",
        ),
        sizes=tuple((sizes[d], d) for d in dims),
        kernel_parameters=parameter_list(
            [refs[d.name] for d in kernel.inputs + kernel.outputs] + scratch_refs, kernel_keywords
        ),
        kernel_callable=partial_call(f"_{kernel.name}_kernel", kernel_keywords),
        parameters=parameter_list(
            [values[d.name] for d in kernel.inputs],
            [f"{block_keyword(d)}={checked.blocks[d]}" for d in tunable]
            + [f"{b.keyword}={b.default}" for b in gpu.blocks]
            + [f"{keyword}={default}" for keyword, _, default in gpu.options]
            + [f"{p.name}={p.value!r}" for p in kernel.params]
            + ["interpret=None"],
        ),
        tpu_function=f"_{kernel.name}_tpu",
        tpu_parameters=parameter_list(
            [values[d.name] for d in kernel.inputs],
            [sizes[d] for d in dims]
            + [block_keyword(d) for d in tunable]
            + [p.name for p in kernel.params]
            + ["interpret"],
        ),
        tpu_binding=", ".join(
            [f"{sizes[d]}={sizes[d]}" for d in dims]
            + [f"{block_keyword(d)}={block_keyword(d)}" for d in tunable]
            + [f"{p.name}={p.name}" for p in kernel.params]
        ),
        tiling_checks=_tiling_check(
            kernel.name, [rule for d in tunable if (rule := tiling_rule(d, layouts))], sizes
        ),
        tpu_conversions=tuple(
            f"{a.name} = {a.name}.astype(jnp.float32)  # f16 has no TPU vectors: computed as f32 (one more pass over {a.name})"
            for a in inputs
            if a.dtype != a.tpu_dtype
        ),
        tpu_return=_tpu_return(outputs),
        reference_parameters=parameter_list(
            [values[d.name] for d in kernel.inputs], [f"{p.name}={p.value!r}" for p in kernel.params]
        ),
        arguments=", ".join(values[d.name] for d in kernel.inputs),
        grid=tuple_code([sizes[d] if d in squeezed else f"pl.cdiv({sizes[d]}, {block_keyword(d)})" for d in blocked]),
        grid_comment=_wrap(_grid_comment(blocked, dims, product, squeezed)),
        dimension_semantics=tuple("arbitrary" if product and d == product.k else "parallel" for d in blocked),
        vmem_comment=_wrap(_vmem_comment(kernel, checked.blocks, dims, product)),
        cost_estimate=_cost_estimate(checked, values, sizes),
        accumulator=accumulator,
        body=tuple(body),
        reference_sizes=tuple(
            f"{sizes[d]} = {values[checked.size_sources[d][0]]}.shape[{checked.size_sources[d][1]}]"
            for d in out_dims
            if needs_sizes
        ),
        reference_body=tuple(reference_body),
        gpu=gpu,
    )


def _tiling_check(kernel: str, rules: list[TilingRule], sizes) -> tuple[str, ...]:
    """The generated call-time check of the blocks against their tiling rules."""
    if not rules:
        return ()
    items = []
    for rule in rules:
        fields = [block_keyword(rule.dim), sizes[rule.dim], str(rule.multiple), repr(rule.describe())]
        fields += [str(rule.smallest_power_of_two)] if rule.smallest_power_of_two else []
        items.append(f"{block_keyword(rule.dim)}=({', '.join(fields)})")
    return (f"_check_tiling({repr(kernel)}, {', '.join(items)})",)


def _tpu_return(outputs: tuple[ArrayPlan, ...]) -> str:
    """What the TPU launcher returns when f16 outputs come back as f32; empty if none do."""
    if all(o.dtype == o.tpu_dtype for o in outputs):
        return ""
    return ", ".join(o.name if o.dtype == o.tpu_dtype else f"{o.name}.astype({o.dtype})" for o in outputs)


def _docstring(kernel: ir.Kernel, tunable: list[str], blocks: dict[str, int], values) -> tuple[str, ...]:
    """The spec's comment lines, then the arguments and results."""
    summary = list(kernel.doc) or [f"The `{kernel.name}` Pallas kernel."]
    args = [f"  {values[d.name]}: {d.dtype}[{', '.join(d.dims)}]." for d in kernel.inputs]
    if tunable:
        keywords = ", ".join(block_keyword(d) for d in tunable)
        defaults = ", ".join(str(blocks[d]) for d in tunable)
        args.append(f"  {keywords}: block sizes (default {defaults}); a block never exceeds its dimension.")
    args.append("  gpu_block_*, gpu_warps, gpu_stages: the same on NVIDIA GPUs (Triton; powers of two).")
    args += [f"  {p.name}: a static {p.dtype} (default {p.value!r})." for p in kernel.params]
    args.append("  interpret: None compiles on TPU and GPU and interprets elsewhere; False always compiles;")
    args.append("    True or a pltpu.InterpretParams interprets the TPU kernel on any platform.")
    results = "; ".join(f"{d.name}: {d.dtype}[{', '.join(d.dims)}]" for d in kernel.outputs)
    return (*summary, "", "Args:", *args, "", "Returns:", f"  {results}.")


def _product_lines(product: Product, values, refs, sizes, block_k: str, step: str, k_blocked: bool) -> list[str]:
    """Load both operands, mask a ragged contracted edge, and the product expression (last)."""
    lhs, rhs = (values[o.name] for o in product.operands)
    lines = [f"{lhs}, {rhs} = {refs[product.lhs.name]}[...], {refs[product.rhs.name]}[...]"]
    if k_blocked:
        k = sizes[product.k]
        lhs_axis = 0 if product.lhs.transposed else 1
        rhs_axis = 1 if product.rhs.transposed else 0
        lines += [
            f"if {k} % {block_k}:  # a ragged {product.k}: zero both operands past its end, so padding never reaches the sum",
            f"    {lhs} = jnp.where({step} * {block_k} + jax.lax.broadcasted_iota(jnp.int32, {lhs}.shape, {lhs_axis}) < {k}, {lhs}, 0)",
            f"    {rhs} = jnp.where({step} * {block_k} + jax.lax.broadcasted_iota(jnp.int32, {rhs}.shape, {rhs_axis}) < {k}, {rhs}, 0)",
        ]
    return [*lines, dot_code(product, lhs, rhs)]


def _einsum(product: Product, values) -> str:
    letters = _einsum_letters([*product.lhs.dims, *product.rhs.dims])
    lhs = "".join(letters[d] for d in product.lhs.dims)
    rhs = "".join(letters[d] for d in product.rhs.dims)
    batch = [d for d in product.lhs.dims[:-2]] + [d for d in product.rhs.dims[:-2] if d not in product.lhs.dims]
    out = "".join(letters[d] for d in (*batch, product.m, product.n))
    accumulate = jnp_dtype(product.accumulator.name)
    a, b = (values[o.name] for o in product.operands)
    return f'jnp.einsum("{lhs},{rhs}->{out}", {a}, {b}, preferred_element_type={accumulate})'


def _einsum_letters(dims: list[str]) -> dict[str, str]:
    letters: dict[str, str] = {}
    for dim in dims:
        wanted = dim[0].lower()
        if dim not in letters and wanted.isascii() and wanted.isalpha() and wanted not in letters.values():
            letters[dim] = wanted
    free = (c for c in "abcdefghijklmnopqrstuvwxyz" if c not in letters.values())
    for dim in dims:
        if dim not in letters:
            letters[dim] = next(free)
    return letters


def _reference_statements(kernel, emitter: Emitter, values, sizes, checked) -> tuple[list[str], bool]:
    """The reference body in plain jax.numpy, and whether it needs the dimension sizes."""
    reference = []
    needs_sizes = False
    outputs = {o.name: o for o in kernel.outputs}
    for statement in kernel.body:
        if isinstance(statement, ir.Let):
            reference.append(f"{values[statement.name]} = {emitter.emit(statement.value)}")
            continue
        out = outputs[statement.target]
        value_type = checked.types[statement.value]
        if value_type.dims == out.dims:
            value = emitter.cast(statement.value, out.dtype)
        else:
            needs_sizes = True
            value = broadcast(emitter, statement.value, value_type, out.dtype, tuple_code([sizes[d] for d in out.dims]))
        reference.append(f"{values[out.name]} = {value}")
    return reference, needs_sizes


def _value_names(kernel: ir.Kernel) -> list[str]:
    names = [d.name for d in kernel.inputs + kernel.outputs]
    return names + [s.name for s in kernel.body if isinstance(s, ir.Let)]


def _cost_estimate(checked: CheckedKernel, values, sizes) -> str:
    """Flops, transcendentals and bytes, so that XLA schedules around the kernel sensibly."""
    kernel, product = checked.kernel, checked.product
    elements = " * ".join(sizes[d] for d in kernel.outputs[0].dims)
    nodes = list(ir.walk(*(s.value for s in kernel.body)))
    transcendental = sum(isinstance(n, ir.Call) and FUNCTIONS[n.func].transcendental for n in nodes)
    elementwise = sum(isinstance(n, (ir.Binary, ir.Unary, ir.Call)) for n in nodes) - transcendental
    if product is not None:
        flops = " + ".join([f"2 * {elements} * {sizes[product.k]}", *_times(elementwise - 1, elements)])
    else:
        flops = " + ".join(_times(elementwise, elements)) or "0"
    inputs = ", ".join(values[d.name] for d in kernel.inputs)
    outputs = " + ".join(f"{elements} * {DTYPES[d.dtype].bytes}" for d in kernel.outputs)
    return (
        f"pl.CostEstimate(flops={flops}, transcendentals={''.join(_times(transcendental, elements)) or '0'},"
        f" bytes_accessed=_nbytes({inputs}) + {outputs})"
    )


def _times(count: int, elements: str) -> list[str]:
    """`count * elements` as code, or nothing when count is 0."""
    return [] if count <= 0 else [elements] if count == 1 else [f"{count} * {elements}"]


def _array_comment(decl: ir.ArrayDecl, out_dims, operands) -> str:
    text = f"{decl.name}: {decl.dtype}[{', '.join(decl.dims)}]"
    if decl.name in operands:
        return text + (", read transposed" if operands[decl.name].transposed else "")
    broadcast = [d for d in out_dims if d not in decl.dims]
    return text + (f", broadcast over {', '.join(broadcast)}" if broadcast else "")


def _grid_comment(blocked, dims, product: Product | None, squeezed: set[str]) -> str:
    if not blocked:
        return "A single step: every dimension is taken whole."
    steps = ", ".join(f"element of {d}" if d in squeezed else f"block of {d}" for d in blocked)
    whole = [d for d in dims if d not in blocked]
    taken = f" ({', '.join(whole)} taken whole)" if whole else ""
    if product is not None and product.k in blocked:
        return (
            f"One step per {steps}{taken}. Output tiles are independent (parallel);"
            f" the steps along {product.k} accumulate in order (arbitrary)."
        )
    return f"One step per {steps}{taken}; steps are independent, so every axis is parallel."


def _vmem_comment(kernel: ir.Kernel, blocks: dict[str, int], dims, product) -> str:
    needed = format_bytes(vmem_bytes(kernel, blocks, product))
    whole = [d for d in dims if d not in blocks]
    per = f" per unit of {' x '.join(whole)}" if whole else ""
    scratch = ", plus the accumulator" if product and product.k in blocks else ""
    return f"VMEM at the default blocks: {needed}{per} (inputs and outputs double-buffered{scratch})."


def _wrap(text: str) -> tuple[str, ...]:
    return tuple(textwrap.wrap(text, COMMENT_WIDTH))
