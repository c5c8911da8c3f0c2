"""cuDNN's attention as a baseline for `pallasgen bench`: `jax.nn.dot_product_attention`
on an attention kernel's own q, k and v, beside XLA's compile of its reference.

Only kernels with the attention form (gradients.attention) have one. Its scale is the
factor the spec multiplies `q @ k.T` by, its mask causal (top-left) where the scores
are a `where`; `agrees` then proves on the timed inputs that cuDNN computes the
kernel's output, so no other mask or score is ever compared with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.frontend import ir
from pallasgen.gradients.attention import Attention, attention_form

# The dtypes cuDNN's fused attention takes.
DTYPES = ("bf16", "f16")


@dataclass(frozen=True)
class Baseline:
    """`function(*arrays)` is cuDNN's attention on `arrays`, the kernel's q, k, v laid out
    as cuDNN reads them ([batch, sequence, heads, head dim]); `output` is which of the
    kernel's outputs it computes, and `layout` turns cuDNN's result into that output's."""

    function: object
    arrays: tuple
    output: int
    layout: object


def cudnn_attention(checked: CheckedKernel, inputs, params: dict | None = None, implementation: str = "cudnn"):
    """The Baseline of an attention kernel called on `inputs` with `params`, or a string
    that says why it has none. `implementation="xla"` runs the same on any device."""
    import jax
    import jax.numpy as jnp

    form = attention_form(checked)
    if form is None:
        return "not an attention kernel"
    if form.q.dtype not in DTYPES or form.k.dtype != form.q.dtype or form.v.dtype != form.q.dtype:
        return f"cuDNN takes {' or '.join(DTYPES)} q, k and v"
    scale = _scale(form, checked.kernel, params or {})
    if scale is None:
        return "its scores are not (q @ k.T) times a param or number"
    kv_batch = form.k.dims[:-2]
    if form.v.dims[:-2] != kv_batch or form.q.dims[: len(kv_batch)] != kv_batch:
        return "q's leading dimensions do not begin with k's and v's"
    names = [d.name for d in checked.kernel.inputs]
    q, k, v = (inputs[names.index(d.name)] for d in (form.q, form.k, form.v))

    def heads_second(array, kept):
        # [leading..., L, D] -> [batch, L, heads, D]: the first leading dimension is the
        # batch, the rest (k's, then q's own, as grouped-query attention's R) the heads.
        batch = array.shape[0] if kept else 1
        grouped = array.reshape(batch, -1, *array.shape[-2:])
        return jnp.swapaxes(grouped, 1, 2)

    arrays = tuple(heads_second(a, len(kv_batch)) for a in (q, k, v))
    causal = any(isinstance(n, ir.Call) and n.func == "where" for n in _score_nodes(form))

    def function(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal, implementation=implementation)

    output = [d.name for d in checked.kernel.outputs].index(form.output.name)
    shape = q.shape

    def layout(result):
        return jnp.swapaxes(result, 1, 2).reshape(shape)

    return Baseline(jax.jit(function), arrays, output, layout)


def agrees(baseline: Baseline, kernel_outputs) -> bool:
    """Whether cuDNN's result is the kernel's output to bf16's rounding (relative to its
    largest value): a different mask or scale is far off."""
    import numpy as np

    got = np.asarray(baseline.layout(baseline.function(*baseline.arrays)), np.float32)
    want = np.asarray(kernel_outputs[baseline.output], np.float32)
    if got.shape != want.shape:
        return False
    return float(np.max(np.abs(got - want), initial=0.0)) <= 2e-2 * max(1.0, float(np.max(np.abs(want), initial=0)))


def _scale(form: Attention, kernel: ir.Kernel, params: dict) -> float | None:
    """The factor the scores multiply `q @ k.T` by (1 where they take it as it is)."""
    values = {p.name: params.get(p.name, p.value) for p in kernel.params}
    lets = {s.name: s.value for s in form.score_lets}

    def through(node):
        while isinstance(node, ir.Name) and node.id in lets:
            node = lets[node.id]
        return node

    if through(form.score) is form.product:
        return 1.0
    for node in _score_nodes(form):
        if isinstance(node, ir.Binary) and node.op == "*":
            for product, factor in ((node.left, node.right), (node.right, node.left)):
                if through(product) is form.product:
                    if isinstance(factor, ir.Number):
                        return float(factor.value)
                    if isinstance(factor, ir.Name) and factor.id in values:
                        value = float(values[factor.id])
                        return value if math.isfinite(value) else None
    return None


def _score_nodes(form: Attention):
    """Every node of the scores' expression and of the lets it reads."""
    yield from ir.walk(form.score)
    for let in form.score_lets:
        yield from ir.walk(let.value)


def checked_baseline(checked: CheckedKernel, inputs, kernel):
    """cuDNN's attention on the kernel's inputs where it computes the kernel's output;
    else why not (a string), or None for a kernel that is no attention."""
    found = cudnn_attention(checked, inputs)
    if isinstance(found, str):
        return None if found == "not an attention kernel" else f"no cuDNN: {found}"
    try:
        outputs = kernel(*inputs)
        same = agrees(found, outputs if isinstance(outputs, tuple) else (outputs,))
    except Exception as error:  # cuDNN refuses the shape or the device: say so, time the rest
        return f"no cuDNN: {str(error).strip().splitlines()[0][:160]}"
    return found if same else "no cuDNN: its result differs from the kernel's (another mask or score)"


def with_backward(baseline):
    """cuDNN's forward plus backward pass (jax.vjp), and a random cotangent of its output."""
    import jax

    def forward_and_backward(arrays, cotangent):
        output, pullback = jax.vjp(baseline.function, *arrays)
        return output, pullback(cotangent)

    shape = jax.eval_shape(baseline.function, *baseline.arrays)
    cotangent = jax.random.normal(jax.random.key(1), shape.shape, shape.dtype)
    return jax.jit(forward_and_backward), cotangent
