"""Fused kernels (specs/attention.pallas): several products, computed operands and a
one-pass softmax, checked against hand-written float64 NumPy at ragged sizes on both
paths (the TPU kernel interpreted, and the Triton kernel interpreted), compiled by
Mosaic for v5e and v6e and by Triton for sm_90, and what cannot be swept in one pass
refused at the line that needs it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from kernel_cases import (
    compiled,
    assert_mosaic_compiles,
    assert_triton_compiles_masked,
    BF16,
    generated_module,
    take_gpu_branch,
)
from pallasgen.devices import compile_only
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import generate


@pytest.fixture(scope="module")
def attention():
    return generated_module("attention")


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def attention_numpy(q, k, v, *, scale, mask=None):
    """softmax(q k^T * scale, masked) v and log-sum-exp, in float64 over the last two
    axes of any batch."""
    s = np.einsum("...sd,...td->...st", f64(q), f64(k)) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a row whose every score is -inf: NaN, as jax gives
        total = np.exp(s - top).sum(-1, keepdims=True)
        return np.einsum("...st,...td->...sd", np.exp(s - top) / total, f64(v)), (top + np.log(total))[..., 0]


def attention_backward_numpy(q, k, v, do, lse, *, scale, mask, o=None, delta=None):
    """dq, delta = sum(do * o, D), dk and dv of causal attention in float64, from the
    saved lse and output (or delta): p = exp(s - lse), ds = p * (do v^T - delta)."""
    s = np.where(mask, np.einsum("...sd,...td->...st", f64(q), f64(k)) * scale, -np.inf)
    p = np.exp(s - f64(lse)[..., None])
    delta = (f64(do) * f64(o)).sum(-1) if delta is None else f64(delta)
    ds = p * (np.einsum("...sd,...td->...st", f64(do), f64(v)) - delta[..., None])
    return (
        np.einsum("...st,...td->...sd", ds, f64(k)) * scale,
        delta,
        np.einsum("...st,...sd->...td", ds, f64(q)) * scale,
        np.einsum("...st,...sd->...td", p, f64(do)),
    )


def causal(s, t, bottom_right=False):
    rows, cols = np.arange(s)[:, None], np.arange(t)[None]
    return rows + (t - s if bottom_right else 0) >= cols


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def expected(name, arrays):
    """The float64 NumPy result of each kernel of specs/attention.pallas."""
    if name == "attention":
        q, k, v = arrays
        return attention_numpy(q, k, v, scale=0.125, mask=causal(q.shape[2], k.shape[2]))
    if name == "attention_dq":
        q, k, v, o, do, lse = arrays
        return attention_backward_numpy(q, k, v, do, lse, o=o, scale=0.125, mask=causal(q.shape[2], k.shape[2]))[:2]
    if name == "attention_dkdv":
        q, k, v, do, lse, delta = arrays
        mask = causal(q.shape[2], k.shape[2])
        return attention_backward_numpy(q, k, v, do, lse, delta=delta, scale=0.125, mask=mask)[2:]
    if name == "attention_full":
        return attention_numpy(*arrays, scale=0.125)[:1]
    if name == "attention_bottom_right":
        q, k, v = arrays
        return attention_numpy(q, k, v, scale=0.125, mask=causal(q.shape[2], k.shape[2], bottom_right=True))[:1]
    if name == "gqa":
        q, k, v = arrays
        return attention_numpy(q, k[:, :, None], v[:, :, None], scale=0.088388)[:1]
    if name == "matmul_softmax":
        x, w = arrays
        return (softmax(f64(x) @ f64(w)),)
    x, g, w = arrays
    h = f64(x)
    scaled = (h / np.sqrt((h * h).mean(1, keepdims=True) + 1e-6) * f64(g)).astype(BF16)
    return (f64(scaled) @ f64(w),)


def inputs(name, rng, s=200, t=300, d=64):
    """Ragged sizes: no block of S or T (128 on TPU, 16 to 64 on GPU) divides them."""
    if name == "gqa":
        return [bf16(rng, 1, 2, 3, s, d), bf16(rng, 1, 2, t, d), bf16(rng, 1, 2, t, d)]
    if name == "matmul_softmax":
        return [bf16(rng, s, 1000), (rng.standard_normal((1000, t)) / 30).astype(BF16)]
    if name == "rmsnorm_matmul":
        return [bf16(rng, t, s), rng.standard_normal(s).astype(np.float32), bf16(rng, s, 700)]
    q, k, v = bf16(rng, 2, 2, s, d), bf16(rng, 2, 2, t, d), bf16(rng, 2, 2, t, d)
    if name in ("attention_dq", "attention_dkdv"):  # with what the forward pass saves
        do = bf16(rng, 2, 2, s, d)
        o, lse = attention_numpy(q, k, v, scale=0.125, mask=causal(s, t))
        o, lse = o.astype(BF16), lse.astype(np.float32)
        if name == "attention_dq":
            return [q, k, v, o, do, lse]
        delta = (f64(do) * f64(o)).sum(-1).astype(np.float32)
        return [q, k, v, do, lse, delta]
    return [q, k, v]


KERNELS = [
    "attention",
    "attention_dq",
    "attention_dkdv",
    "attention_full",
    "attention_bottom_right",
    "gqa",
    "matmul_softmax",
    "rmsnorm_matmul",
]
# bf16 outputs: an ulp of the result and of p rounded; f32 softmax: a few ulps.
TOLERANCE = {"matmul_softmax": 1e-6}


def compare(name, got, want):
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        tolerance = TOLERANCE.get(name, 2**-7 if g.dtype == BF16 else 1e-5)
        scale = 1.0 if name != "rmsnorm_matmul" else np.abs(w).max()
        np.testing.assert_allclose(f64(g) / scale, w / scale, rtol=tolerance, atol=tolerance * 2)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("sizes", [dict(s=200, t=300, d=64), dict(s=37, t=20, d=16), dict(s=256, t=256, d=128)])
def test_tpu_kernel_matches_numpy(attention, name, sizes):
    arrays = inputs(name, np.random.default_rng(0), **sizes)
    compare(name, getattr(attention, name)(*arrays), expected(name, arrays))


@pytest.mark.parametrize("name", KERNELS)
def test_tpu_simulation_matches_numpy(attention, name):
    """Simulated TPU memories (uninitialized memory is NaN, out-of-bounds reads raise,
    parallel grid axes run in a random order), ragged S and T, the spec's blocks."""
    arrays = inputs(name, np.random.default_rng(7), s=200, t=300, d=64)
    try:
        # finished before the reset: a kernel still running when its state is cleared fails
        got = jax.block_until_ready(getattr(attention, name)(*arrays, interpret=pltpu.InterpretParams()))
    finally:
        pltpu.reset_tpu_interpret_mode_state()
    compare(name, got, expected(name, arrays))


# Smaller than a GPU block in every dimension. The dimension a program holds whole (D;
# rmsnorm_matmul's K, which `inputs` sizes by `s`) takes a block of at least 16, Triton's
# least dot depth for bf16, masked past its end.
SMALLER_THAN_A_BLOCK = [dict(s=8, t=5, d=3), dict(s=1, t=1, d=1)]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("sizes", [dict(s=70, t=90, d=40), *SMALLER_THAN_A_BLOCK])
def test_gpu_kernel_matches_numpy(attention, name, sizes, monkeypatch):
    take_gpu_branch(monkeypatch, attention)
    function = getattr(attention, name)
    function.clear_cache()
    blocks = {k: 16 for k in ("gpu_block_s", "gpu_block_t", "gpu_block_m", "gpu_block_n") if k in function.options}
    arrays = inputs(name, np.random.default_rng(1), **sizes)
    try:
        compare(name, function(*arrays, **blocks, interpret=True), expected(name, arrays))
    finally:
        function.clear_cache()


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("sizes", SMALLER_THAN_A_BLOCK)
def test_triton_dots_are_as_deep_as_tritons_dot_takes(attention, name, sizes):
    """Each dot of the Triton kernel contracts a block at least as deep as Triton's dot
    takes (16 for bf16). Interpret mode computes shallower dots right; Triton does not
    take them: at D=3 and D=1 the attention kernels, holding D in a block of 4 and 1,
    compiled with XLA's Triton and gave wrong values on an H200 (issue 33), and upstream
    Triton fails an assertion. Lowering for CUDA needs no GPU."""
    arrays = inputs(name, np.random.default_rng(3), **sizes)
    kernels = compile_only.triton_ir(functools.partial(getattr(attention, name), interpret=False), arrays)
    assert kernels
    assert not [dot for ttir in kernels for dot in compile_only.shallow_dots(ttir)]


@pytest.mark.parametrize("name", ["attention", "attention_full", "attention_bottom_right", "gqa", "rmsnorm_matmul"])
@pytest.mark.parametrize("sizes", SMALLER_THAN_A_BLOCK)
def test_triton_dots_of_the_gradient_are_as_deep_as_tritons_dot_takes(attention, name, sizes):
    """The same for the kernels jax.grad runs: the forward kernel that saves residuals and
    the backward kernels derived from the spec."""
    function = functools.partial(getattr(attention, name), interpret=False)
    arrays = inputs(name, np.random.default_rng(3), **sizes)

    def loss(*arrays):
        return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(function(*arrays)))

    kernels = compile_only.triton_ir(jax.grad(loss, argnums=tuple(range(len(arrays)))), arrays)
    assert any("backward" in ttir.name for ttir in kernels)
    assert not [dot for ttir in kernels for dot in compile_only.shallow_dots(ttir)]


INT8_PRODUCTS = """
kernel swept_int8 {
    in  x: i8[M, K]
    in  w: i8[K, N]
    out y: f32[M, N]
    y = softmax(f32(x @ w), N)
    block M = 128, K = 512
}

kernel whole_int8 {
    in  x: i8[M, K]
    in  w: i8[K, N]
    out y: i32[M, N]
    y = (x @ w) + i32(sum(x, K))
    block M = 128, N = 128
}
"""


@pytest.mark.parametrize("name", ["swept_int8", "whole_int8"])
def test_triton_dots_of_8_bit_operands_are_32_deep(tmp_path, name):
    """An int8 dot's depth is at least 32 (Triton's int8 tensor-core instruction), where
    the kernel sweeps K in blocks and where it holds K whole, even with K=5."""
    from kernel_cases import load_module

    path = tmp_path / "int8_products.py"
    path.write_text(generate(INT8_PRODUCTS, "k.pallas", "k.pallas"), encoding="utf-8")
    function = getattr(load_module(path, f"_int8_products_{name}"), name)
    args = [jax.ShapeDtypeStruct((8, 5), jnp.int8), jax.ShapeDtypeStruct((5, 3), jnp.int8)]
    kernels = compile_only.triton_ir(functools.partial(function, interpret=False), args)
    assert kernels
    assert not [dot for ttir in kernels for dot in compile_only.shallow_dots(ttir)]


def test_the_reference_matches_numpy(attention):
    for name in KERNELS:
        arrays = inputs(name, np.random.default_rng(2), s=40, t=50, d=16)
        compare(name, getattr(attention, name).reference(*arrays), expected(name, arrays))


def test_a_row_with_every_score_masked_is_nan_as_in_the_reference(attention):
    """Bottom-right alignment with more queries than keys: the first rows see no key."""
    arrays = inputs("attention_bottom_right", np.random.default_rng(3), s=300, t=130, d=32)
    got = f64(attention.attention_bottom_right(*arrays))
    assert np.isnan(got[:, :, :170]).all() and not np.isnan(got[:, :, 170:]).any()
    reference = f64(attention.attention_bottom_right.reference(*arrays))
    assert np.isnan(reference[:, :, :170]).all()


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_causal_blocks_past_the_diagonal_are_skipped_not_masked(attention, path, monkeypatch):
    """Keys past every query's reach are NaN: a block computed and masked would carry
    0 * NaN into p @ v; a skipped one never reads them."""
    rng = np.random.default_rng(4)
    q, k, v = bf16(rng, 1, 1, 128, 64), bf16(rng, 1, 1, 512, 64), bf16(rng, 1, 1, 512, 64)
    k[..., 128:, :] = np.nan
    v[..., 128:, :] = np.nan
    if path == "gpu":
        take_gpu_branch(monkeypatch, attention)
        attention.attention.clear_cache()
    try:
        blocks = {"gpu_block_s": 64, "gpu_block_t": 64} if path == "gpu" else {"block_s": 128, "block_t": 128}
        o, lse = attention.attention(q, k, v, **blocks, interpret=True)
    finally:
        attention.attention.clear_cache()
    want_o, want_lse = attention_numpy(q, k[..., :128, :], v[..., :128, :], scale=0.125, mask=causal(128, 128))
    compare("attention", (o, lse), (want_o, want_lse))


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_the_backward_kernels_skip_blocks_past_the_diagonal(attention, path, monkeypatch):
    """dq: keys and values past every query's reach are NaN and never read (a masked
    block would carry 0 * NaN); dk, dv: keys no query sees get exactly 0, from no step."""
    rng = np.random.default_rng(6)
    q, k, v, o, do, lse = inputs("attention_dq", rng, s=128, t=512, d=64)
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[..., 128:, :] = np.nan
    v_nan[..., 128:, :] = np.nan
    if path == "gpu":
        take_gpu_branch(monkeypatch, attention)
    blocks = {"gpu_block_s": 64, "gpu_block_t": 64} if path == "gpu" else {"block_s": 128, "block_t": 128}
    try:
        dq, delta = attention.attention_dq(q, k_nan, v_nan, o, do, lse, **blocks, interpret=True)
        dk, dv = attention.attention_dkdv(q, k, v, do, lse, delta, **blocks, interpret=True)
    finally:
        attention.attention_dq.clear_cache()
        attention.attention_dkdv.clear_cache()
    want = attention_backward_numpy(q, k, v, do, lse, o=o, scale=0.125, mask=causal(128, 512))
    compare("attention_dq", (dq, delta, dk, dv), want)
    assert not f64(dk)[..., 128:, :].any() and not f64(dv)[..., 128:, :].any()


def test_a_partly_seen_block_is_computed_in_strips_that_skip_the_keys_they_cannot_see(attention):
    """One block of 512 queries by 512 keys, seen in part: its strips of 256 queries take
    only the keys some query of theirs may see. Keys from 256 on are NaN: the first strip
    never reads them (a block computed whole and masked would carry 0 * NaN into its p @ v)."""
    rng = np.random.default_rng(5)
    q, k, v = bf16(rng, 1, 1, 512, 64), bf16(rng, 1, 1, 512, 64), bf16(rng, 1, 1, 512, 64)
    k[..., 256:, :] = np.nan
    v[..., 256:, :] = np.nan
    o, lse = attention.attention(q, k, v, block_s=512, block_t=512, interpret=True)
    want_o, want_lse = attention_numpy(
        q[..., :256, :], k[..., :256, :], v[..., :256, :], scale=0.125, mask=causal(256, 256)
    )
    compare("attention", (o[..., :256, :], lse[..., :256]), (want_o, want_lse))


def test_a_block_seen_whole_does_not_widen_the_keys_of_the_strips_of_partly_seen_ones(attention):
    """Blocks of 512 over 1024 queries and keys: block (1, 0) is seen whole, (0, 0) and
    (1, 1) in part, so each strip of a partly seen block takes only its own keys: the
    first strip of (1, 1), queries 512 to 767, never reads the NaN keys from 768 on."""
    rng = np.random.default_rng(7)
    q, k, v = bf16(rng, 1, 1, 1024, 64), bf16(rng, 1, 1, 1024, 64), bf16(rng, 1, 1, 1024, 64)
    k[..., 768:, :] = np.nan
    v[..., 768:, :] = np.nan
    o, lse = attention.attention(q, k, v, block_s=512, block_t=512, interpret=True)
    want_o, want_lse = attention_numpy(
        q[..., :768, :], k[..., :768, :], v[..., :768, :], scale=0.125, mask=causal(768, 768)
    )
    compare("attention", (o[..., :768, :], lse[..., :768]), (want_o, want_lse))


@pytest.mark.parametrize("name", ["attention", "attention_bottom_right"])
@pytest.mark.parametrize("sizes", [dict(s=1100, t=700), dict(s=600, t=1300)])
def test_blocks_in_strips_match_numpy_at_ragged_sizes(attention, name, sizes):
    """Blocks of 512 (strips of 256 queries, key runs of 128) over ragged sizes: blocks seen
    whole, in part and not at all, a ragged last block of either dimension."""
    arrays = inputs(name, np.random.default_rng(6), d=32, **sizes)
    got = getattr(attention, name)(*arrays, block_s=512, block_t=512, interpret=True)
    compare(name, got, expected(name, arrays))


def test_causal_attention_is_one_pallas_call_with_no_scores_outside_it(attention):
    q = jax.ShapeDtypeStruct((1, 2, 1000, 64), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 2, 900, 64), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(functools.partial(attention.attention, interpret=True))(q, k, k)
    calls = []

    def walk(jaxpr):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "pallas_call":
                calls.append(equation)
                continue
            for var in equation.outvars:
                assert getattr(var.aval, "shape", ())[-2:] != (1000, 900), equation
            for value in equation.params.values():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(item, "jaxpr", item)  # a ClosedJaxpr's, or a Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    assert len(calls) == 1


COMPILE_SHAPES = {
    "attention": [(1, 2, 300, 128), (1, 2, 500, 128), (1, 2, 500, 128)],
    "attention_dq": [
        (1, 2, 300, 128),
        (1, 2, 500, 128),
        (1, 2, 500, 128),
        (1, 2, 300, 128),
        (1, 2, 300, 128),
        (1, 2, 300),
    ],
    "attention_dkdv": [
        (1, 2, 300, 128),
        (1, 2, 500, 128),
        (1, 2, 500, 128),
        (1, 2, 300, 128),
        (1, 2, 300),
        (1, 2, 300),
    ],
    "attention_full": [(1, 2, 300, 128), (1, 2, 500, 128), (1, 2, 500, 128)],
    "attention_bottom_right": [(1, 2, 300, 128), (1, 2, 500, 128), (1, 2, 500, 128)],
    "gqa": [(1, 2, 2, 300, 128), (1, 2, 500, 128), (1, 2, 500, 128)],
    "matmul_softmax": [(300, 1000), (1000, 384)],
    "rmsnorm_matmul": [(300, 200), (200,), (200, 700)],
}

# The f32 inputs (by position); the others are bf16.
F32_INPUTS = {"rmsnorm_matmul": {1}, "attention_dq": {5}, "attention_dkdv": {4, 5}}


def abstract(name):
    return [
        jax.ShapeDtypeStruct(shape, jnp.float32 if n in F32_INPUTS.get(name, ()) else jnp.bfloat16)
        for n, shape in enumerate(COMPILE_SHAPES[name])
    ]


@compiled
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_mosaic_compiles_the_kernel(attention, name, chip):
    assert_mosaic_compiles(functools.partial(getattr(attention, name), interpret=False), abstract(name), chip)


@compiled
@pytest.mark.parametrize("name", [n for n in KERNELS if n not in ("matmul_softmax", "rmsnorm_matmul")])
@pytest.mark.parametrize("sizes", [dict(s=40, t=1, d=64), dict(s=1, t=40, d=64)], ids=["one_key", "one_query"])
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_mosaic_compiles_the_kernel_with_one_key_or_one_query(attention, name, sizes, chip):
    """A block of one row (decoding's first step: one key) as the right operand of q @ k.T
    (or do @ v.T) is multiplied and summed: Mosaic's dot of a one-row bf16 operand does
    not compile."""
    arrays = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs(name, np.random.default_rng(5), **sizes)]
    assert_mosaic_compiles(functools.partial(getattr(attention, name), interpret=False), arrays, chip)


@compiled
@pytest.mark.parametrize("name", KERNELS)
def test_triton_compiles_the_kernel_with_every_access_masked(attention, name):
    assert_triton_compiles_masked(functools.partial(getattr(attention, name), interpret=False), abstract(name))


@compiled
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("sizes", SMALLER_THAN_A_BLOCK)
def test_triton_compiles_the_kernel_smaller_than_a_block_with_every_access_masked(attention, name, sizes):
    """Upstream Triton fails an assertion on a dot shallower than it takes (see
    test_triton_dots_are_as_deep_as_tritons_dot_takes)."""
    arrays = inputs(name, np.random.default_rng(3), **sizes)
    assert_triton_compiles_masked(functools.partial(getattr(attention, name), interpret=False), arrays)


ONE_PASS_ERRORS = {
    "a scaled value used beyond a linear carry": (
        """
kernel k {
    in  q: f32[S, D]
    in  v: f32[T, D]
    out o: f32[S, D]
    let p = exp(q @ v.T - max(q @ v.T, T))
    o = exp(p) @ v
    block S = 8, T = 128
}
""",
        (7, 9),
        "uses a value rescaled in the pass in a way no rescaling makes exact, so T cannot be swept in one pass:"
        " leave T unblocked",
    ),
    "a reduction's result used at each position": (
        """
kernel k {
    in  q: f32[S, D]
    in  v: f32[T, D]
    out o: f32[S, D]
    let s = q @ v.T
    o = (s - sum(s, T)) @ v
    block S = 8, T = 128
}
""",
        (7, 10),
        "this needs sum() over its dimension at each position of T, known only after the pass over the blocks of T:"
        " leave T unblocked",
    ),
    "a batch dimension blocked by more than 1": (
        """
kernel k {
    in  q: f32[B, S, D]
    in  v: f32[B, T, D]
    out o: f32[B, S, D]
    o = softmax(q @ v.T, T) @ v
    block B = 2, S = 8
}
""",
        (7, 11),
        "B is a batch dimension of a product: it takes one element per step; write block B = 1",
    ),
}


@pytest.mark.parametrize("case", list(ONE_PASS_ERRORS))
def test_what_cannot_be_swept_in_one_pass_is_a_spec_error_at_its_line(case):
    source, (line, column), message = ONE_PASS_ERRORS[case]
    with pytest.raises(SpecError) as raised:
        generate(source, "k.pallas", "k.pallas")
    (diagnostic,) = raised.value.diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (line, column)
    assert message in diagnostic.message


def test_a_block_is_not_skipped_where_another_running_value_reads_it(tmp_path):
    """`n` sums the unmasked scores: a block past the diagonal still adds to it, so no
    step is skipped, and `n` counts every key."""
    source = """
kernel masked_and_total {
    in  q: f32[S, D]
    in  k, v: f32[T, D]
    out o: f32[S, D]
    out n: f32[S]
    let s = q @ k.T
    o = softmax(where(index(S) >= index(T), s, -inf), T) @ v
    n = sum(s, T)
    block S = 8, T = 128
}
"""
    path = tmp_path / "masked_and_total.py"
    path.write_text(generate(source, "k.pallas", "k.pallas"), encoding="utf-8")
    assert "skipped" not in path.read_text(encoding="utf-8")
    from kernel_cases import load_module

    module = load_module(path, "_masked_and_total")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((20, 16), (300, 16), (300, 16)))
    o, n = module.masked_and_total(q, k, v)
    s = f64(q) @ f64(k).T
    want_o, _ = attention_numpy(q, k, v, scale=1.0, mask=causal(20, 300))
    np.testing.assert_allclose(f64(o), want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f64(n), s.sum(1), rtol=1e-4, atol=1e-3)


ROUNDED = """
kernel rounded_scores {
    in  x: f32[M, K]
    in  w: f32[K, N]
    out y: f32[M, N]
    out r: f32[M]
    y = round(x @ w)
    r = sum(x, K)
    block M = 8
}
"""


def rounded_module(tmp_path, name):
    from kernel_cases import load_module

    path = tmp_path / "rounded_scores.py"
    path.write_text(generate(ROUNDED, "k.pallas", "k.pallas"), encoding="utf-8")
    return load_module(path, name)


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_round_in_a_fused_kernel_runs_on_both_paths(tmp_path, monkeypatch, path):
    module = rounded_module(tmp_path, f"_rounded_scores_{path}")
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)
    x = np.array([[0.5, 1.0], [2.5, 0.0], [-0.5, 1.0]], np.float32)
    w = np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0]], np.float32)
    y, r = module.rounded_scores(x, w, interpret=True)
    np.testing.assert_array_equal(np.asarray(y), np.round(f64(x) @ f64(w)))
    np.testing.assert_allclose(f64(r), f64(x).sum(1))


@compiled
def test_round_in_a_fused_kernel_lowers_for_triton(tmp_path):
    """Triton has no round: the GPU kernel rounds half to even with the module's helper."""
    module = rounded_module(tmp_path, "_rounded_scores_triton")
    args = [jax.ShapeDtypeStruct((37, 20), jnp.float32), jax.ShapeDtypeStruct((20, 50), jnp.float32)]
    for ttir in compile_only.triton_ir(functools.partial(module.rounded_scores, interpret=False), args):
        compile_only.compile_triton(ttir, capability=90)


MEAN_OF_COUNTS = """
kernel scores_and_mean_count {
    in  q: f32[S, D]
    in  k: f32[T, D]
    in  c: i32[S, T]
    out top: f32[S]
    out m: f32[S]
    top = max(q @ k.T, T)
    m = mean(c, T)
    block S = 8, T = 128
}
"""


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_a_mean_of_integers_beside_a_product_sums_in_f32_as_the_reference(tmp_path, monkeypatch, path):
    """mean() computes in f32 whatever it reduces: counts near 2^30 summed in i32 would wrap."""
    from kernel_cases import load_module

    source_path = tmp_path / "mean_count.py"
    source_path.write_text(generate(MEAN_OF_COUNTS, "k.pallas", "k.pallas"), encoding="utf-8")
    module = load_module(source_path, f"_mean_count_{path}")
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((10, 16)).astype(np.float32), rng.standard_normal((300, 16)).astype(np.float32)
    c = rng.integers(2**29, 2**30, (10, 300)).astype(np.int32)
    top, m = module.scores_and_mean_count(q, k, c, interpret=True)
    np.testing.assert_allclose(f64(top), (f64(q) @ f64(k).T).max(1), rtol=1e-5)
    np.testing.assert_allclose(f64(m), c.astype(np.int64).mean(1), rtol=1e-6)


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_inf_in_a_query_gives_the_references_lse(attention, path, monkeypatch):
    """A query whose scores hold +inf: its lse is +inf (jax.nn.logsumexp's), not NaN; its
    row of o is NaN in both."""
    if path == "gpu":
        take_gpu_branch(monkeypatch, attention)
        attention.attention.clear_cache()
    q, k, v = inputs("attention", np.random.default_rng(5), s=200, t=300, d=64)
    q = np.asarray(q).copy()
    q[0, 0, 150, 0] = np.inf
    k = np.abs(np.asarray(k))  # every score of that query +inf, none NaN
    got_o, got_lse = attention.attention(q, k, v, interpret=True if path == "gpu" else None)
    want_o, want_lse = attention.attention.reference(q, k, v)
    assert np.isinf(np.asarray(want_lse)[0, 0, 150])
    np.testing.assert_allclose(np.asarray(got_lse), np.asarray(want_lse), rtol=2e-2, atol=2e-2)
    assert np.array_equal(np.isnan(f64(got_o)), np.isnan(f64(want_o)))
    if path == "gpu":
        attention.attention.clear_cache()


@pytest.mark.parametrize("name", ["attention", "attention_full"])
@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_p_is_rounded_to_bf16_for_p_at_v_as_the_spec_says(attention, name, path, monkeypatch):
    """`o = (bf16(p) @ v) / sum(p, T)`: the weights are rounded for the product, the sum
    is not. With the last query's weights 1 (key 0) and exp(-1/8) (every other key, which
    bf16 holds 3e-4 too high) and values that cancel, o is 1.0e-3 with p rounded and
    6.8e-4 without: the kernel gives the first."""
    if path == "gpu":
        take_gpu_branch(monkeypatch, attention)
    function = getattr(attention, name)
    function.clear_cache()
    s, t, d = 128, 128, 16  # the last query sees every key, causal or not
    q = np.zeros((1, 1, s, d), np.float32)
    q[..., 0] = 1.0
    k = np.zeros((1, 1, t, d), np.float32)
    k[..., 1:, 0] = -1.0  # scores 0 for key 0, -1/8 for the others (scale 1/8)
    v = np.ones((1, 1, t, d), np.float32)
    v[..., 0, :] = -112.0
    q, k, v = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    p = np.exp(np.where(np.arange(t) == 0, 0.0, -0.125))
    rounded = f64(jnp.asarray(p, jnp.bfloat16))
    want = (rounded @ f64(v[0, 0])) / p.sum()
    unrounded = (p @ f64(v[0, 0])) / p.sum()
    assert abs(want[0] - unrounded[0]) > 0.3 * abs(want[0])  # the two differ by a third
    try:
        o = jax.tree.leaves(function(q, k, v, interpret=True if path == "gpu" else None))[0]
    finally:
        function.clear_cache()
    np.testing.assert_allclose(f64(o)[0, 0, -1], want, rtol=2**-7)
