"""What every backend's plan of a kernel shares: Python names for what the spec names,
the arrays, the public signature, and the reference in plain jax.numpy."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.fused import array_axes
from pallasgen.analysis.names import Namer
from pallasgen.frontend import ir
from pallasgen.lowering.gradient import GradientPlan
from pallasgen.lowering.parts import (
    array_comment,
    body_statements,
    contracted_inputs,
    load_statements,
    parameter_list,
    tuple_code,
    used_names,
)
from pallasgen.lowering.pyexpr import Emitter, jnp_dtype
from pallasgen.lowering.reductions import ReferenceSpelling
from pallasgen.lowering.signature import KeywordGroup, Signature, param_default, signature
from pallasgen.runtime.constants import default_sizes


@dataclass(frozen=True)
class ArrayPlan:
    name: str  # Python name in the generated code
    spec_name: str
    spec_dtype: str  # f32
    dtype: str  # jnp.float32
    dims: tuple[str, ...]
    ref: str
    comment: str
    expand: str | None  # the public function's statement that lays an input out as the tiles hold it
    reference_expand: str | None  # the reference's, over its whole layout (None: held as declared)
    shape: str  # (m, n), for outputs
    layout_shape: str  # its shape laid out over the kernel's layout: (m, 1) for an [M] of [M, N]
    restore: str | None  # reshapes an output of lower rank than the layout to its own shape
    layout: tuple[str | None, ...]  # how kernels hold it: its dimensions, None where it has size 1
    reference_restore: str | None = None  # the same in the reference (when its layout differs)
    residual: bool = False  # an output saved for jax.grad only: its launcher writes it when asked (`residuals`)

    @property
    def declared(self) -> str:
        """What the public function's `rt.kernel` says of it (`rt.declared_arrays`): its
        declaration in the spec ("x: bf16[M, K]"), then the layout where the kernels hold it
        otherwise (`expand`, `restore`): " as [1, N]"."""
        declared = f"{self.spec_name}: {self.spec_dtype}[{', '.join(self.dims)}]"
        if self.expand or self.restore:
            declared += f" as [{', '.join('1' if d is None else d for d in self.layout)}]"
        return declared


@dataclass(frozen=True)
class LoweredKernel:
    """A checked kernel with its names chosen: the input of every backend's planner."""

    checked: CheckedKernel
    namer: Namer  # backends fork it for names of their own
    values: dict[str, str]  # spec name -> Python name, for arrays and lets
    sizes: dict[str, str]  # dimension -> the Python variable holding its size
    refs: dict[str, str]  # array -> its Ref's name in kernels
    names: dict[str, str]  # values and params, as expressions name them
    inputs: tuple[ArrayPlan, ...]
    outputs: tuple[ArrayPlan, ...]
    plain: ir.Kernel | None = None  # with `residuals`: the kernel a call that writes none computes
    public: bool = True  # whether the module defines it as a kernel, with a `reference` (not a backend's part of one)

    @property
    def kernel(self) -> ir.Kernel:
        return self.checked.kernel

    @property
    def residuals(self) -> tuple[ArrayPlan, ...]:
        """The outputs saved for jax.grad only, which a launcher writes when its `residuals`
        keyword asks (a None Ref in the kernel otherwise)."""
        return tuple(o for o in self.outputs if o.residual)

    @property
    def residual_names(self) -> frozenset[str]:
        """The spec names of `residuals`."""
        return frozenset(o.spec_name for o in self.residuals)

    def emitter(self, tpu: bool = False, spelling=None, overrides=None, **backend) -> Emitter:
        """An emitter of this kernel's expressions; `overrides` name nodes computed
        elsewhere (the emitter's own when None: filling it later reaches it); `backend`:
        the Emitter's options of a backend's spelling (narrow_ints_in_i32, codes)."""
        lets = {s.name: s.value for s in self.kernel.body if isinstance(s, ir.Let)}
        overrides = {} if overrides is None else overrides
        return Emitter(self.names, self.checked.types, overrides, tpu=tpu, spelling=spelling, lets=lets, **backend)


@dataclass(frozen=True)
class KernelPlan:
    name: str
    doc: tuple[str, ...]
    inputs: tuple[ArrayPlan, ...]
    outputs: tuple[ArrayPlan, ...]
    signature: Signature
    sizes: tuple[tuple[str, str], ...]  # (Python variable, spec dim)
    sizes_named: bool  # the decorator names them: they are not `default_sizes`
    reference_parameters: str  # the public function's: its arrays, then its params
    arguments: str  # the input arrays, in order
    reference_sizes: tuple[str, ...]
    reference_body: tuple[str, ...]
    backends: dict[str, object]  # each backend's plan, by backend name
    params: str = ""  # each param and its dtype, as a dict's items: "scale": jnp.float32
    gradient: GradientPlan | None = None  # how jax.grad differentiates it (None: as JAX can)


def lower_kernel(
    checked: CheckedKernel,
    taken: frozenset[str],
    residuals: int = 0,
    plain: ir.Kernel | None = None,
    public: bool = True,
) -> LoweredKernel:
    """Names for a kernel's values, sizes and refs, avoiding `taken` (module-level names,
    the public keywords and the backends' own); its last `residuals` outputs are saved for
    jax.grad only (the kernel's forward pass under jax.grad, gradients.derive), `plain`
    what it computes without them; `public`: see LoweredKernel."""
    kernel, dims = checked.kernel, checked.dims
    namer = Namer(taken | {p.name for p in kernel.params})
    values = {name: namer.claim_spec(name) for name in _value_names(kernel)}
    # The generator's names yield to the spec's: a size beside a spec's `s` is `size_s`.
    sizes = {dim: namer.claim(dim.lower(), f"size_{dim.lower()}") for dim in dims}
    refs = {d.name: namer.claim(values[d.name] + "_ref") for d in kernel.inputs + kernel.outputs}
    contracted = contracted_inputs(checked)

    def array_plan(decl: ir.ArrayDecl) -> ArrayPlan:
        return _array_plan(decl, checked, values[decl.name], refs[decl.name], sizes, contracted)

    return LoweredKernel(
        checked=checked,
        namer=namer,
        values=values,
        sizes=sizes,
        refs=refs,
        names={**values, **{p.name: p.name for p in kernel.params}},
        inputs=tuple(array_plan(d) for d in kernel.inputs),
        outputs=tuple(
            replace(array_plan(d), residual=True) if i >= len(kernel.outputs) - residuals else array_plan(d)
            for i, d in enumerate(kernel.outputs)
        ),
        plain=plain,
        public=public,
    )


def _array_plan(decl: ir.ArrayDecl, checked: CheckedKernel, name: str, ref: str, sizes, contracted) -> ArrayPlan:
    """An array as kernels lay it out (its tiles' axes, `analysis.fused.array_axes`), and
    as the reference holds it: an input the products contract as declared, any other over
    every dimension of the reference's layout, in its order."""
    layout = array_axes(decl, checked.frame)
    own = tuple_code([sizes[d] for d in decl.dims]) if decl.dims else "()"
    layout_shape = tuple_code([sizes[d] if d else "1" for d in layout])
    laid_out = tuple(layout) != decl.dims
    everywhere = checked.space.layout
    held = decl.dims if decl.name in contracted else tuple(everywhere)
    reference_expand = None
    if held != decl.dims:
        order = sorted(range(len(decl.dims)), key=lambda axis: everywhere.index(decl.dims[axis]))
        ordered = f"jnp.transpose({name}, {tuple_code(map(str, order))})" if order != sorted(order) else name
        reference_expand = f"{name} = {ordered}[{', '.join(':' if d in decl.dims else 'None' for d in everywhere)}]"
    return ArrayPlan(
        name=name,
        spec_name=decl.name,
        spec_dtype=decl.dtype,
        dtype=jnp_dtype(decl.dtype),
        dims=decl.dims,
        ref=ref,
        comment=array_comment(decl, contracted),
        expand=f"{name} = {name}.reshape({layout_shape})" if laid_out else None,
        reference_expand=reference_expand,
        shape=own,
        layout_shape=layout_shape,
        restore=f"{name} = {name}.reshape({own})" if laid_out else None,
        layout=tuple(layout),
        reference_restore=f"{name} = {name}.reshape({own})" if held != decl.dims else None,
    )


def plan_kernel(
    lowered: LoweredKernel, groups: list[KeywordGroup], backends: dict[str, object], public: LoweredKernel | None = None
) -> KernelPlan:
    """The kernel's shared plan, with `groups` of keywords and `backends`' plans of
    `lowered`; `public`: the kernel the public function and its reference compute, where
    `lowered` has its residuals as outputs too (`LoweredKernel.residuals`)."""
    public = public or lowered
    kernel, checked = public.kernel, public.checked
    values, sizes = public.values, lowered.sizes
    reference_body, needs_sizes = _reference_statements(public)
    declared = kernel.outputs + kernel.inputs  # as the decorator declares them
    public_signature = signature([values[d.name] for d in kernel.inputs], groups, kernel.params)
    return KernelPlan(
        name=kernel.name,
        doc=_docstring(kernel, public_signature),
        inputs=lowered.inputs,
        outputs=lowered.outputs,
        signature=public_signature,
        sizes=tuple((sizes[d], d) for d in checked.dims),
        sizes_named={d: sizes[d] for d in checked.dims} != default_sizes(d for a in declared for d in a.dims),
        reference_parameters=parameter_list(
            [values[d.name] for d in kernel.inputs], [f"{p.name}={param_default(p)}" for p in kernel.params]
        ),
        arguments=", ".join(values[d.name] for d in kernel.inputs),
        reference_sizes=_reference_sizes(public) if needs_sizes else (),
        reference_body=tuple(reference_body),
        backends=backends,
        params=", ".join(f"{p.name!r}: {jnp_dtype(p.dtype)}" for p in kernel.params),
    )


def _reference_sizes(lowered: LoweredKernel) -> tuple[str, ...]:
    """The lines that read the reference's dimension sizes, one per input they are read
    from: `b, h, size_s, d = q.shape`, `m, k = x.shape[0], x.shape[2]`, or `n = x.shape[0]`."""
    checked, values = lowered.checked, lowered.values
    read: dict[str, dict[int, str]] = {}
    for dim in checked.space.layout:
        array, axis = checked.size_sources[dim]
        read.setdefault(array, {})[axis] = lowered.sizes[dim]
    ranks = {d.name: len(d.dims) for d in lowered.kernel.inputs}
    lines = []
    for array, names in read.items():
        axes = sorted(names)
        if len(axes) > 1 and axes == list(range(ranks[array])):
            shape = f"{values[array]}.shape"
        else:
            shape = ", ".join(f"{values[array]}.shape[{axis}]" for axis in axes)
        lines.append(f"{', '.join(names[axis] for axis in axes)} = {shape}")
    return tuple(lines)


def _docstring(kernel: ir.Kernel, public: Signature) -> tuple[str, ...]:
    """The spec's comment lines, then the keywords particular to the kernel. Its arrays are
    declared once, in `@rt.kernel`, which adds them to the docstring as Args and Returns."""
    summary = tuple(kernel.doc) or (f"The `{kernel.name}` Pallas kernel.",)
    keywords = public.keywords_doc
    return (*summary, "", "Keywords:", *keywords) if keywords else summary


def _reference_statements(lowered: LoweredKernel) -> tuple[list[str], bool]:
    """The reference body in plain jax.numpy, and whether it needs the dimension sizes."""
    kernel, checked, values, sizes = lowered.kernel, lowered.checked, lowered.values, lowered.sizes
    layout = checked.space.layout
    emitter = lowered.emitter(spelling=ReferenceSpelling(layout, sizes))
    body = kernel.body
    outputs = {o.name: o for o in kernel.outputs}
    broadcasts = [s for s in body if isinstance(s, ir.Assign) and checked.types[s.value].dims != outputs[s.target].dims]
    indexes = any(isinstance(n, ir.Call) and n.func in ("index", "size") for n in ir.walk(*(s.value for s in body)))
    needs_sizes = indexes or bool(broadcasts)

    def shape_of(out: ir.ArrayDecl) -> str:
        return tuple_code([sizes[d] if d in out.dims else "1" for d in layout])

    _reference_products(lowered, emitter)
    reference = body_statements(kernel, body, emitter, values, lowered.refs, checked, None, shape_of)
    restores = [o.reference_restore for o in lowered.outputs if o.reference_restore]
    needs_sizes = needs_sizes or bool(restores)
    reference += restores  # outputs are used in the layout's rank until here
    return reference, needs_sizes


def _reference_products(lowered: LoweredKernel, emitter: Emitter) -> None:
    """Each product in the reference, as the emitter's override: an einsum of its
    operands (an input it contracts as declared; any other value as the reference holds
    it, over its whole layout: jnp.einsum broadcasts their size-1 axes), the result laid
    out again where it lacks some of the layout's dimensions."""
    checked = lowered.checked
    layout = checked.space.layout
    contracted = contracted_inputs(checked)
    declared = {d.name: d.dims for d in checked.kernel.inputs}
    letters = _einsum_letters([*layout, *(d for name in contracted for d in declared[name])])
    every = "".join(letters[d] for d in layout)
    products = [n for n in ir.walk(*(s.value for s in checked.kernel.body)) if isinstance(n, ir.Binary) and n.op == "@"]
    for node in reversed(products):  # inner products first
        product = checked.frame.products[node]
        operands = (product.lhs, product.rhs)
        specs = [
            "".join(letters[d] for d in declared[v.id]) if isinstance(v, ir.Name) and v.id in contracted else every
            for v in operands
        ]
        parts = [emitter.emit(value) for value in operands]
        dims = checked.types[node].dims
        out = "".join(letters[d] for d in layout if d in dims)
        absent = tuple_code([str(a) for a, d in enumerate(layout) if d not in dims])
        accumulate = jnp_dtype(checked.types[node].dtype.name)
        einsum = (
            f'jnp.einsum("{specs[0]},{specs[1]}->{out}", {parts[0]}, {parts[1]}, preferred_element_type={accumulate})'
        )
        emitter.overrides[node] = f"jnp.expand_dims({einsum}, {absent})" if absent != "()" else einsum


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


def _value_names(kernel: ir.Kernel) -> list[str]:
    names = [d.name for d in kernel.inputs + kernel.outputs]
    return names + [s.name for s in kernel.body if isinstance(s, ir.Let)]


def elementwise_body(lowered: LoweredKernel, emitter: Emitter, load, store, shape_of=None) -> list[str]:
    """An elementwise kernel's body as a backend spells it (`emitter`, `load(decl)`,
    `store(decl, value)`, and `shape_of(decl)`, an output's block as body_statements
    takes it): the loads of its inputs, then its statements; or, where those
    are its reference's code to the letter and hold lets of their own beyond one per output
    (giou's), a call of the reference on the blocks loaded, its values stored: the code
    said once, in the reference."""
    kernel, checked, values = lowered.kernel, lowered.checked, lowered.values
    loads = load_statements(kernel, values, checked, load)
    call = reference_call(lowered, emitter)
    if call is None:
        return [*loads, *body_statements(kernel, kernel.body, emitter, values, lowered.refs, checked, store, shape_of)]
    outputs, said = kernel.outputs, "# The reference's code, on these blocks."
    if len(outputs) == 1:
        return [*loads, said, store(outputs[0], call)]
    unpack = f"{', '.join(values[o.name] for o in outputs)} = {call}"
    return [*loads, said, unpack, *(store(o, values[o.name]) for o in outputs)]


def reference_call(lowered: LoweredKernel, emitter: Emitter) -> str | None:
    """`NAME.reference(...)` on the kernel's loaded blocks, where that computes what its
    statements would (see elementwise_body); None elsewhere."""
    kernel, checked, values = lowered.kernel, lowered.checked, lowered.values
    layout = tuple(checked.space.layout)
    lets = [s for s in kernel.body if isinstance(s, ir.Let)]
    # the names a kernel function binds beside its refs, which would hide the public function
    unpacked = kernel.outputs if len(kernel.outputs) > 1 else ()
    bound = {values[d.name] for d in (*kernel.inputs, *unpacked)} | {lowered.names[p.name] for p in kernel.params}
    if (
        not lowered.public
        or checked.has_products
        or checked.sweep
        or lowered.residuals
        or len(lets) <= len(kernel.outputs)
        or any(d.dims != layout for d in (*kernel.inputs, *kernel.outputs))
        or {d.name for d in kernel.inputs} - used_names(kernel)
        or kernel.name in bound
    ):
        return None
    reference, needs_sizes = _reference_statements(lowered)
    mine = body_statements(kernel, kernel.body, emitter, values, lowered.refs, checked, None)
    if needs_sizes or mine != reference:
        return None
    arguments = [values[d.name] for d in kernel.inputs] + [f"{p.name}={lowered.names[p.name]}" for p in kernel.params]
    return f"{kernel.name}.reference({', '.join(arguments)})"
