"""What a generated module holds, as plain data: names, grid, BlockSpecs, code lines.

Templates only loop and branch over these plans; every decision is made here.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .checks import CheckedKernel
from .dtypes import DTYPES
from .names import Namer, block_keyword
from .pyexpr import Emitter, jnp_dtype
from .tiling import format_bytes, pipeline_vmem_bytes

GRID_INDEX_NAMES = "ijklpqrstuvw"


@dataclass(frozen=True)
class InputPlan:
    name: str  # Python name in the generated code
    spec_name: str
    dtype: str  # jnp.float32
    dims: tuple[str, ...]
    ref: str
    block_spec: str
    comment: str
    expand: str | None  # wrapper statement that lays the array out over the kernel's dims
    reference_expand: str | None
    loaded: bool  # read inside the kernel body


@dataclass(frozen=True)
class OutputPlan:
    name: str
    spec_name: str
    dtype: str
    ref: str
    block_spec: str
    comment: str
    shape: str  # (m, n)


@dataclass(frozen=True)
class ParamPlan:
    name: str
    default: str  # repr of the default value


@dataclass(frozen=True)
class BlockPlan:
    keyword: str  # block_m
    default: int
    size: str  # the size variable it is clamped to: m
    dim: str


@dataclass(frozen=True)
class KernelPlan:
    name: str
    kernel_function: str
    reference_function: str
    doc: tuple[str, ...]
    inputs: tuple[InputPlan, ...]
    outputs: tuple[OutputPlan, ...]
    params: tuple[ParamPlan, ...]
    blocks: tuple[BlockPlan, ...]
    static_argnames: tuple[str, ...]
    size_names: tuple[tuple[str, str], ...]  # (python variable, spec dim) for each dim
    grid: str
    grid_comment: str
    dimension_semantics: tuple[str, ...]
    vmem_comment: str
    body: tuple[str, ...]  # kernel body statements
    reference_body: tuple[str, ...]
    reference_sizes: tuple[str, ...]  # statements binding sizes the reference needs


@dataclass(frozen=True)
class ModulePlan:
    spec_path: str
    kernels: tuple[KernelPlan, ...]


def plan_module(spec_path: str, kernels: tuple[CheckedKernel, ...]) -> ModulePlan:
    return ModulePlan(spec_path, tuple(plan_kernel(k) for k in kernels))


def plan_kernel(checked: CheckedKernel) -> KernelPlan:
    kernel, dims = checked.kernel, checked.dims
    blocked = [d for d in dims if d in checked.blocks]
    namer = Namer({p.name for p in kernel.params} | {block_keyword(d) for d in dims})
    sizes = {dim: namer.claim(dim.lower()) for dim in dims}
    values = {name: namer.claim(name) for name in _value_names(kernel)}
    refs = {decl.name: namer.claim(values[decl.name] + "_ref") for decl in kernel.inputs + kernel.outputs}
    grid_index = dict(zip(blocked, GRID_INDEX_NAMES))
    block_of = {d: (block_keyword(d) if d in checked.blocks else sizes[d]) for d in dims}

    def block_spec(decl_dims: tuple[str, ...]) -> str:
        shape = [block_of[d] if d in decl_dims else "1" for d in dims]
        index = [grid_index.get(d, "0") if d in decl_dims else "0" for d in dims]
        lanes = ", ".join(grid_index[d] for d in blocked)
        return f"pl.BlockSpec({_tuple(shape)}, lambda {lanes}: {_tuple(index)})"

    used = _used_names(kernel)
    inputs = tuple(
        InputPlan(
            name=values[d.name],
            spec_name=d.name,
            dtype=jnp_dtype(d.dtype),
            dims=d.dims,
            ref=refs[d.name],
            block_spec=block_spec(d.dims),
            comment=_block_comment(d, dims, checked.blocks),
            expand=_expand(values[d.name], d.dims, dims, sizes),
            reference_expand=_reference_expand(values[d.name], d.dims, dims),
            loaded=d.name in used,
        )
        for d in kernel.inputs
    )
    outputs = tuple(
        OutputPlan(
            name=values[d.name],
            spec_name=d.name,
            dtype=jnp_dtype(d.dtype),
            ref=refs[d.name],
            block_spec=block_spec(d.dims),
            comment=_block_comment(d, dims, checked.blocks),
            shape=_tuple([sizes[x] for x in d.dims]),
        )
        for d in kernel.outputs
    )
    emitter = Emitter({**values, **{p.name: p.name for p in kernel.params}}, checked.types)
    body, reference_body, needs_sizes = _statements(kernel, emitter, refs, values, sizes, checked)
    grid = _tuple([f"pl.cdiv({sizes[d]}, {block_keyword(d)})" for d in blocked])
    return KernelPlan(
        name=kernel.name,
        kernel_function=f"_{kernel.name}_kernel",
        reference_function=f"{kernel.name}_reference",
        doc=kernel.doc,
        inputs=inputs,
        outputs=outputs,
        params=tuple(ParamPlan(p.name, repr(p.value)) for p in kernel.params),
        blocks=tuple(BlockPlan(block_keyword(d), checked.blocks[d], sizes[d], d) for d in blocked),
        static_argnames=tuple(block_keyword(d) for d in blocked) + tuple(p.name for p in kernel.params) + ("interpret",),
        size_names=tuple((sizes[d], d) for d in dims),
        grid=grid,
        grid_comment=_grid_comment(blocked, dims),
        dimension_semantics=("parallel",) * len(blocked),
        vmem_comment=_vmem_comment(kernel, checked.blocks, dims),
        body=tuple(body),
        reference_body=tuple(reference_body),
        reference_sizes=tuple(
            f"{sizes[d]} = {values[checked.size_sources[d][0]]}.shape[{checked.size_sources[d][1]}]"
            for d in dims
            if needs_sizes
        ),
    )


def _statements(kernel, emitter, refs, values, sizes, checked):
    """Kernel body and reference body: loads, lets, and each output's store."""
    body = [f"{values[d.name]} = {refs[d.name]}[...]" for d in kernel.inputs if d.name in _used_names(kernel)]
    reference = []
    needs_sizes = False
    outputs = {o.name: o for o in kernel.outputs}
    for statement in kernel.body:
        if isinstance(statement, ir.Let):
            line = f"{values[statement.name]} = {emitter.emit(statement.value)}"
            body.append(line)
            reference.append(line)
            continue
        out = outputs[statement.target]
        name = values[out.name]
        value_type = checked.types[statement.value]
        value = emitter.cast(statement.value, out.dtype)
        if not value_type.dims:
            value = f"jnp.full({{shape}}, {emitter.emit(statement.value)}, {jnp_dtype(out.dtype)})"
        elif value_type.dims != out.dims:
            value = f"jnp.broadcast_to({value}, {{shape}})"
        if "{shape}" in value:
            needs_sizes = True
        body.append(f"{name} = {value.format(shape=refs[out.name] + '.shape')}")
        body.append(f"{refs[out.name]}[...] = {name}")
        reference.append(f"{name} = {value.format(shape=_tuple([sizes[d] for d in out.dims]))}")
    return body, reference, needs_sizes


def _value_names(kernel: ir.Kernel) -> list[str]:
    names = [d.name for d in kernel.inputs + kernel.outputs]
    return names + [s.name for s in kernel.body if isinstance(s, ir.Let)]


def _used_names(kernel: ir.Kernel) -> set[str]:
    used: set[str] = set()
    stack: list[ir.Expr] = [s.value for s in kernel.body]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.Name):
            used.add(node.id)
        for attr in ("operand", "left", "right", "value"):
            if hasattr(node, attr):
                stack.append(getattr(node, attr))
        stack.extend(getattr(node, "args", ()))
    return used


def _expand(name: str, array_dims, dims, sizes) -> str | None:
    if array_dims == dims:
        return None
    shape = [sizes[d] if d in array_dims else "1" for d in dims]
    return f"{name} = {name}.reshape({', '.join(shape)})"


def _reference_expand(name: str, array_dims, dims) -> str | None:
    if array_dims == dims:
        return None
    index = [":" if d in array_dims else "None" for d in dims]
    return f"{name} = {name}[{', '.join(index)}]"


def _block_comment(decl: ir.ArrayDecl, dims, blocks) -> str:
    shown = [f"{d} by {blocks[d]}" if d in blocks else f"{d} whole" for d in decl.dims]
    broadcast = [d for d in dims if d not in decl.dims]
    text = f"{decl.name}: {', '.join(shown) or 'a scalar'}"
    if broadcast:
        text += f", broadcast over {', '.join(broadcast)}"
    return text


def _grid_comment(blocked, dims) -> str:
    if not blocked:
        return "A single step: every dimension is taken whole."
    whole = [d for d in dims if d not in blocked]
    text = f"One step per block of {', '.join(blocked)}"
    if whole:
        text += f" ({', '.join(whole)} taken whole)"
    return text + "; steps are independent, so every axis is parallel."


def _vmem_comment(kernel: ir.Kernel, blocks: dict[str, int], dims) -> str:
    needed = format_bytes(pipeline_vmem_bytes(kernel, blocks))
    whole = [d for d in dims if d not in blocks]
    per = f" per unit of {' x '.join(whole)}" if whole else ""
    return f"VMEM at the default blocks: {needed}{per} (inputs and outputs, double-buffered)."


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
