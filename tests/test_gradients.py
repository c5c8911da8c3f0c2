"""`jax.grad` through generated kernels: derivative rules, backward kernels, the custom_vjp.

Each derivative rule (pallasgen/analysis/derivatives.py) is checked against JAX's own
derivative of the same jax.numpy function on a grid of points with zeros, signed zeros
and ties, through the backward kernel derived for a one-statement kernel. The bundled
elementwise kernels are differentiated on both paths (TPU and GPU kernels in interpret
mode) and compared with `jax.vjp` of their references and with float64 NumPy
derivatives written by hand (kernel_cases.py).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from kernel_cases import (
    kernel_of,
    pallas_calls_and_primitives,
    CASES,
    add_backward_numpy,
    bias_gelu_backward_numpy,
    bias_gelu_backward_over_m_numpy,
    bias_gelu_backward_over_n_numpy,
    generated_module,
    giou_backward_numpy,
    leaky_backward_numpy,
    load_module,
    mul_backward_numpy,
    take_gpu_branch,
)
from pallasgen.analysis.derivatives import OPERATOR_DERIVATIVES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.gradients.derive import every_kernel
from pallasgen.frontend import ir
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import check_source, generate

# --------------------------------------------------------------------------- derivative rules

# Each rule's kernel: its inputs ("x, y: f32" ...) and the expression of its output z.
RULES = {
    "exp": ("x", "exp(x)"),
    "log": ("x", "log(x)"),
    "sqrt": ("x", "sqrt(x)"),
    "rsqrt": ("x", "rsqrt(x)"),
    "tanh": ("x", "tanh(x)"),
    "sigmoid": ("x", "sigmoid(x)"),
    "gelu": ("x", "gelu(x)"),
    "silu": ("x", "silu(x)"),
    "sin": ("x", "sin(x)"),
    "cos": ("x", "cos(x)"),
    "abs": ("x", "abs(x)"),
    "relu": ("x", "relu(x)"),
    "floor": ("x", "floor(x) * x"),
    "ceil": ("x", "ceil(x) * x"),
    "round": ("x", "round(x) * x"),
    "maximum": ("x, y", "maximum(x, y)"),
    "maximum of a literal": ("x", "maximum(x, 0.5)"),
    "minimum": ("x, y", "minimum(x, y)"),
    "clip": ("x, lo, hi", "clip(x, lo, hi)"),
    "clip by literals": ("x", "clip(x, -1.0, 0.5)"),
    "where": ("x, y", "where(x > y, x * x, y)"),
    "f32 of bf16": ("x: bf16", "f32(x) * 3.0"),
    "bf16 of f32": ("x", "f32(bf16(x) * bf16(x))"),
    "f32 of i32": ("x", "f32(i32(x)) * x"),
    "neg": ("x", "-x"),
    "+": ("x, y", "x + y"),
    "-": ("x, y", "x - y"),
    "*": ("x, y", "x * y"),
    "/": ("x, y", "x / y"),
    "//": ("x, y", "x // y + x"),
    "%": ("x, y", "x % y"),
    "** 2": ("x", "x ** 2"),
    "** 3": ("x", "x ** 3"),
    "** 0.5": ("x", "x ** 0.5"),
    "**": ("x, y", "x ** y"),
    "comparisons": ("x, y", "where((x < y) | (x <= 0.0) & (x >= -1.0), x, where((x == y) | (x != 1.0), y, 2.0))"),
    "~": ("x, y", "where(~(x > y), x, y)"),
    "bits": ("x, y", "x * f32((i32(y) << 2) ^ (i32(y) >> 1)) + where((x > 0) ^ (y > 0), y, 0.0)"),
}
# Points with zeros of both signs, ties between arguments and the kinks of relu, abs,
# floor and clip; each argument takes every one, against every other argument's.
GRID = (-2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 3.0)
NAMES = {name: f"rule_{i}" for i, name in enumerate(RULES)}


def rule_spec() -> str:
    kernels = []
    for name, (inputs, expression) in RULES.items():
        arrays, _, dtype = inputs.partition(": ")
        kernels.append(
            f"kernel {NAMES[name]} {{\n    in {arrays}: {dtype or 'f32'}[N]\n    out z: f32[N]\n"
            f"    z = {expression}\n    block N = 1024\n}}\n"
        )
    return "\n".join(kernels)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """The module generated from one kernel per rule, and each kernel's gradient."""
    source = rule_spec()
    path = tmp_path_factory.mktemp("rules") / "rules.py"
    path.write_text(generate(source, "rules.pallas", "rules.pallas"), encoding="utf-8")
    gradients = {k.kernel.name: k.gradient for k in check_source(source, "rules.pallas")}
    return load_module(path, "_pallasgen_rules"), gradients


def rule_arguments(inputs: str) -> list[jax.Array]:
    """Every combination of GRID values, one argument per input."""
    names, _, dtype = inputs.partition(": ")
    count = len(names.split(","))
    points = np.array(list(itertools.product(GRID, repeat=count)), np.float64).T
    return [jnp.asarray(p, jnp.bfloat16 if dtype == "bf16" else jnp.float32) for p in points]


def backward_by_references(module, gradient, inputs: str, arrays, dz) -> list:
    """The inputs' cotangents from the backward kernels' references (plain jax.numpy of
    the derived kernels) and None where an input gets none."""
    names = [name.strip() for name in inputs.partition(":")[0].split(",")]
    inputs = dict(zip(names, arrays, strict=True))
    found = {}
    for backward in gradient.kernels:
        args = [dz if a.source == "cotangent" else inputs[a.name] for a in backward.arguments]
        outs = getattr(module, backward.checked.kernel.name).reference(*args)
        found.update(zip(backward.results, outs if isinstance(outs, tuple) else (outs,)))
    found.update({name: dz for name, _ in gradient.passed})  # passed on as it is: no kernel
    return [found.get(name) for name in inputs]


@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_gives_jaxs_derivative_at_every_point_of_the_grid(rules, name):
    """The derived backward kernel (its reference) gives what `jax.vjp` of the same
    jax.numpy expression gives, at every point: zeros, ties and kinks included (relu and
    abs at 0, maximum's and clip's ties split in halves, NaN and inf where JAX has them)."""
    module, gradients = rules
    kernel = NAMES[name]
    arrays = rule_arguments(RULES[name][0])
    dz = jnp.asarray(np.linspace(-2.0, 3.0, arrays[0].size), jnp.float32)
    _, vjp = jax.vjp(getattr(module, kernel).reference, *arrays)
    want = vjp(dz)
    got = backward_by_references(module, gradients[kernel], RULES[name][0], arrays, dz)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None:  # no cotangent: JAX's is zero
            np.testing.assert_array_equal(np.asarray(w, np.float64), 0.0, err_msg=f"{name}: argument {index}")
            continue
        assert g.dtype == w.dtype, (name, index)
        np.testing.assert_allclose(
            np.asarray(g, np.float64),
            np.asarray(w, np.float64),
            rtol=2e-6,
            atol=1e-6,
            err_msg=f"{name}: argument {index}",
        )


def test_the_rule_table_covers_every_function_and_operator():
    """Every elementwise function with a derivative rule (casts: float to float, float to
    integer) and every operator with one is exercised above (reductions' rules: in
    test_gradients_reductions.py)."""
    nodes = [n for k in check_source(rule_spec(), "rules.pallas") for s in k.kernel.body for n in ir.walk(s.value)]
    calls = {n.func for n in nodes if isinstance(n, ir.Call)}
    operators = {("neg" if n.op == "-" else n.op) for n in nodes if isinstance(n, ir.Unary)}
    operators |= {n.op for n in nodes if isinstance(n, ir.Binary)}
    with_rules = {
        name
        for name, f in FUNCTIONS.items()
        if f.derivative and f.reducer is None and f.typing not in ("index", "size", "cast")
    }
    assert with_rules <= calls and {"f32", "bf16", "i32"} <= calls
    assert {op for op, rule in OPERATOR_DERIVATIVES.items() if rule is not None} <= operators


# --------------------------------------------------------------------------- bundled kernels

# Each differentiable bundled kernel's inputs' cotangents in float64 NumPy, from its
# inputs and its outputs' cotangents (kernel_cases.py).
DERIVATIVES = {
    "activations.leaky": leaky_backward_numpy,
    "activations.bias_gelu": lambda x, bias, scale, dy: (
        *bias_gelu_backward_numpy(x, bias, scale, dy),
        *bias_gelu_backward_over_m_numpy(x, bias, scale, dy),
        *bias_gelu_backward_over_n_numpy(x, bias, scale, dy),
    ),
    "add_vectors.add_vectors": lambda x, y, dz: add_backward_numpy(dz),
    "ops.add_f32": lambda x, y, dz: add_backward_numpy(dz),
    "ops.mul_f32": mul_backward_numpy,
    "giou.giou": giou_backward_numpy,
}
# Bundled kernels whose inputs or outputs are all integers: no backward kernel.
NOT_FLOAT = ["activations.quantize_rows", "ops.add_i32", "ops.mul_i8"]
RAGGED = {"M": 37, "N": 300, "B": 19}


def tolerance(dtype) -> dict:
    """bf16 cotangents: a bf16 ulp, and gelu's derivative where it cancels (see
    GELU_DERIVATIVE_TOL); f32: a few ulps, and the sums' rounding over a ragged row."""
    return dict(rtol=2.0**-7, atol=1e-4) if dtype == jnp.bfloat16 else dict(rtol=1e-4, atol=1e-5)


def inputs_and_cotangents(case_id: str, seed: int = 0):
    case = CASES[case_id]
    rng = np.random.default_rng(seed)
    sizes = {d: RAGGED[d] for d in case.dims}
    arrays = [jnp.asarray(a) for a in case.make_inputs(rng, sizes)]
    cotangents = tuple(
        jnp.asarray(rng.standard_normal(o.shape(sizes)) * 2.0, {"f32": jnp.float32, "bf16": jnp.bfloat16}[o.dtype])
        for o in case.outputs
        if o.dtype in ("f32", "bf16")
    )
    return case, arrays, cotangents


def kernel_vjp(case, arrays, cotangents, **keywords):
    """The inputs' cotangents by jax.vjp of the generated kernel, in interpret mode."""
    kernel = kernel_of(case.module, case.kernel)
    return vjp_of(functools.partial(kernel, interpret=True, **keywords), arrays, cotangents)


def reference_vjp(case, arrays, cotangents):
    return vjp_of(kernel_of(case.module, case.kernel).reference, arrays, cotangents)


def vjp_of(function, arrays, cotangents):
    """jax.vjp of `function` at `arrays`, given the float outputs' `cotangents` (integer
    outputs get float0 ones)."""
    outputs, vjp = jax.vjp(function, *arrays)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    given = iter(cotangents)
    full = tuple(
        next(given) if jnp.issubdtype(o.dtype, jnp.floating) else np.zeros(o.shape, jax.dtypes.float0) for o in outputs
    )
    return vjp(full if len(full) > 1 else full[0])


def clear_caches():
    """Drops the jitted traces of the kernels here and their backward kernels, which
    hold the path they were traced on."""
    for case_id in [*DERIVATIVES, *NOT_FLOAT]:
        module, kernel = generated_module(CASES[case_id].module), CASES[case_id].kernel
        for name in ("", "_backward", "_backward_over_m", "_backward_over_n"):
            if hasattr(module, kernel + name):
                getattr(module, kernel + name).clear_cache()


@pytest.fixture(params=["tpu", "gpu"])
def path(request, monkeypatch):
    """Which kernels run: the TPU kernels in interpret mode (the CPU default), or the
    Triton kernels in interpret mode (the modules' dispatch pointed at them)."""
    clear_caches()
    if request.param == "gpu":
        for module in {CASES[c].module for c in [*DERIVATIVES, *NOT_FLOAT]}:
            take_gpu_branch(monkeypatch, generated_module(module))
    yield request.param
    clear_caches()


@pytest.mark.parametrize("case_id", [*DERIVATIVES, *NOT_FLOAT])
def test_vjp_of_the_kernel_is_the_vjp_of_its_reference_at_ragged_sizes(case_id, path):
    case, arrays, cotangents = inputs_and_cotangents(case_id)
    got = kernel_vjp(case, arrays, cotangents)
    want = reference_vjp(case, arrays, cotangents)
    assert len(got) == len(want) == len(arrays)
    for g, w, a in zip(got, want, arrays):
        assert g.dtype == w.dtype and g.shape == w.shape == a.shape, case_id
        if g.dtype != jax.dtypes.float0:
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), **tolerance(g.dtype))


@pytest.mark.parametrize("case_id", list(DERIVATIVES))
def test_vjp_of_the_kernel_is_the_float64_numpy_derivative(case_id, path):
    case, arrays, cotangents = inputs_and_cotangents(case_id, seed=1)
    params = case.params
    got = kernel_vjp(case, arrays, cotangents, **params)
    want = DERIVATIVES[case_id](*arrays, *cotangents, **params)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, **tolerance(g.dtype))


def test_the_kernels_param_reaches_the_backward_kernel():
    """A non-default `slope` changes the gradient as it changes the forward pass."""
    case, arrays, cotangents = inputs_and_cotangents("activations.leaky")
    (default,) = kernel_vjp(case, arrays, cotangents)
    (steeper,) = kernel_vjp(case, arrays, cotangents, slope=0.5)
    np.testing.assert_allclose(steeper, leaky_backward_numpy(*arrays, *cotangents, slope=0.5)[0], rtol=1e-6)
    assert not np.allclose(default, steeper)


@pytest.mark.parametrize("case_id", ["activations.leaky", "ops.mul_f32", "add_vectors.add_vectors"])
def test_check_grads_on_small_f32_inputs(case_id):
    case = CASES[case_id]
    rng = np.random.default_rng(4)
    sizes = {d: {"M": 5, "N": 7}[d] for d in case.dims}
    arrays = [jnp.asarray(a) for a in case.make_inputs(rng, sizes)]
    if case_id == "activations.leaky":  # finite differences across the kink at 0 disagree
        arrays = [a + jnp.where(a >= 0, 0.5, -0.5) for a in arrays]
    check_grads(kernel_of(case.module, case.kernel), arrays, order=1, modes=["rev"])


def test_check_grads_on_small_boxes():
    """giou at boxes without ties, where finite differences apply."""
    rng = np.random.default_rng(5)
    x1, y1 = rng.uniform(0, 10, (2, 2, 5)), rng.uniform(0, 10, (2, 2, 5))
    w, h = rng.uniform(2, 8, (2, 2, 5)), rng.uniform(2, 8, (2, 2, 5))
    a = [x1[0], y1[0], x1[0] + w[0], y1[0] + h[0]]
    b = [x1[1], y1[1], x1[1] + w[1], y1[1] + h[1]]
    boxes = [jnp.asarray(c, jnp.float32) for c in (*a, *b)]
    check_grads(generated_module("giou").giou, boxes, order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------- what grad runs


def test_grad_runs_the_generated_backward_kernels_not_xlas_differentiation():
    """The jaxpr of jax.grad holds the forward pallas_call and the three backward ones (dx,
    and the sums over M and N for the broadcast bias and scale), and no tanh outside
    them: gelu's derivative is computed in the backward kernels."""
    module = generated_module("activations")
    x = jax.ShapeDtypeStruct((40, 300), jnp.bfloat16)
    bias, scale = jax.ShapeDtypeStruct((300,), jnp.float32), jax.ShapeDtypeStruct((40,), jnp.float32)

    def loss(x, bias, scale):
        return module.bias_gelu(x, bias, scale, interpret=True).astype(jnp.float32).sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, bias, scale)
    calls, primitives = pallas_calls_and_primitives(jaxpr)
    assert sorted(calls) == sorted(
        ["bias_gelu", "bias_gelu_backward", "bias_gelu_backward_over_m", "bias_gelu_backward_over_n"]
    )
    assert "tanh" not in primitives


def test_a_broadcast_inputs_cotangent_is_summed_over_its_dimension():
    """bias [N] of [M, N]: its cotangent is the column sum of x's cotangent times nothing
    but gelu's slope; the sum over M is a generated kernel (bias_gelu_backward_over_m)."""
    module = generated_module("activations")
    case, arrays, (dy,) = inputs_and_cotangents("activations.bias_gelu")
    _, dbias, _ = kernel_vjp(case, arrays, (dy,))
    assert dbias.shape == (RAGGED["N"],)
    direct = module.bias_gelu_backward_over_m(*arrays, dy, interpret=True)
    np.testing.assert_allclose(dbias, direct, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dbias, bias_gelu_backward_over_m_numpy(*arrays, dy)[0], rtol=1e-4, atol=1e-4)


def test_integer_inputs_get_float0_cotangents(tmp_path):
    source = (
        "kernel shift {\n    in  x: f32[N]\n    in  k: i32[N]\n    out y: f32[N]\n"
        "    y = x * f32(k) + 1.0\n    block N = 1024\n}\n"
    )
    module = load(tmp_path, "shift", source)
    x, k, dy = jnp.arange(5.0), jnp.arange(5, dtype=jnp.int32), jnp.full(5, 2.0)
    _, vjp = jax.vjp(module.shift, x, k)
    dx, dk = vjp(dy)
    assert dk.dtype == jax.dtypes.float0 and dk.shape == (5,)
    np.testing.assert_array_equal(dx, 2.0 * np.arange(5.0))


def test_a_cotangent_that_is_an_inputs_as_it_is_is_passed_on_without_a_kernel():
    """add_vectors: dx = dz and dy = dz. No backward kernel copies them: jax.grad's jaxpr
    holds the forward kernel only, and its cotangents are dz itself."""
    module = generated_module("add_vectors")
    assert not hasattr(module, "add_vectors_backward")
    x = jnp.arange(300.0)

    def loss(x, y):
        return (module.add_vectors(x, y, interpret=True) * jnp.arange(300.0)).sum()

    calls, _ = pallas_calls_and_primitives(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, x))
    assert calls == ["add_vectors"]
    dx, dy = jax.grad(loss, argnums=(0, 1))(x, 2 * x)
    np.testing.assert_array_equal(dx, np.arange(300.0))
    np.testing.assert_array_equal(dy, np.arange(300.0))
    assert "passes z's cotangent on as x's and y's, with no backward kernel" in module.add_vectors.__doc__


def test_a_bias_adds_gradient_passes_the_cotangent_on_and_sums_it_in_a_kernel(tmp_path):
    source = (
        "kernel badd {\n    in  x: f32[M, N]\n    in  b: f32[N]\n    out y: f32[M, N]\n    y = x + b\n"
        "    block M = 8, N = 128\n}\n"
    )
    module = load(tmp_path, "badd", source)
    assert not hasattr(module, "badd_backward") and hasattr(module, "badd_backward_over_m")
    weights = jnp.arange(35.0).reshape(5, 7)
    dx, db = jax.grad(lambda x, b: (module.badd(x, b, interpret=True) * weights).sum(), argnums=(0, 1))(
        jnp.ones((5, 7)), jnp.ones(7)
    )
    np.testing.assert_array_equal(dx, weights)
    np.testing.assert_allclose(db, np.asarray(weights).sum(0), rtol=1e-6)


def test_a_cast_or_a_sum_of_a_cotangent_still_takes_a_kernel(tmp_path):
    source = "kernel up {\n    in  x: bf16[N]\n    out y: f32[N]\n    y = f32(x)\n    block N = 1024\n}\n"
    module = load(tmp_path, "up", source)
    assert hasattr(module, "up_backward")  # dx = bf16(dy): a cast
    dx = jax.grad(lambda x: module.up(x, interpret=True).sum())(jnp.ones(5, jnp.bfloat16))
    assert dx.dtype == jnp.bfloat16 and np.asarray(dx, np.float32).tolist() == [1.0] * 5


def test_a_kernel_with_integer_outputs_only_has_zero_cotangents_and_no_backward_kernel():
    module = generated_module("activations")
    assert not hasattr(module, "quantize_rows_backward")
    assert not hasattr(module, "_quantize_rows_vjp")  # the runtime's rt.no_cotangents is its backward pass
    case, arrays, _ = inputs_and_cotangents("activations.quantize_rows")
    dx, dscale = kernel_vjp(case, arrays, ())
    assert dx.dtype == jnp.float32 and not np.asarray(dx).any() and not np.asarray(dscale).any()


def load(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(generate(source, f"specs/{name}.pallas", f"specs/{name}.pallas"), encoding="utf-8")
    return load_module(path, f"_pallasgen_{name}_{tmp_path.name}")


GRAD_NONE = (
    "kernel double {\n    in  x: f32[N]\n    out y: f32[N]\n    y = 2 * x\n    grad none\n    block N = 1024\n}\n"
)


def test_grad_none_turns_the_gradient_off_with_an_error_naming_the_kernel_and_line(tmp_path):
    module = load(tmp_path, "double", GRAD_NONE)
    assert not hasattr(module, "double_backward")
    np.testing.assert_array_equal(module.double(jnp.arange(3.0)), [0.0, 2.0, 4.0])
    with pytest.raises(TypeError, match=r"double is not differentiable: .*`grad none` at specs/double.pallas:5"):
        jax.grad(lambda x: module.double(x).sum())(jnp.arange(3.0))


def test_grad_none_gives_the_same_error_for_a_kernel_with_a_product(tmp_path):
    """A kernel whose gradient is not generated yet may say `grad none` too: jax.grad then
    raises the same error rather than whatever JAX makes of a Pallas kernel."""
    source = (
        "kernel mm {\n    in  x: f32[M, K]\n    in  y: f32[K, N]\n    out z: f32[M, N]\n    z = x @ y\n"
        "    grad none\n    block M = 128, N = 128, K = 128\n}\n"
    )
    module = load(tmp_path, "mm", source)
    x, y = jnp.ones((8, 16)), jnp.ones((16, 8))
    np.testing.assert_array_equal(module.mm(x, y), np.full((8, 8), 16.0))
    with pytest.raises(TypeError, match=r"mm is not differentiable: .*`grad none` at specs/mm.pallas:6"):
        jax.grad(lambda x: module.mm(x, y).sum())(x)


SEVERAL_PRODUCTS = (
    "kernel two {\n    in  x: bf16[M, K]\n    in  w, u: bf16[K, N]\n    out o: f32[M, N]\n"
    "    o = softmax(x @ w + x @ u, N)\n    block M = 128\n}\n"
)


def test_a_kernel_whose_backward_kernels_are_not_generated_yet_says_so(tmp_path):
    """jax.grad of a kernel that no derivation takes (a softmax of two products) raises a
    NotImplementedError that names it and what it has, rather than JAX's error about a
    Pallas primitive."""
    module = load(tmp_path, "two", SEVERAL_PRODUCTS)
    what = "several products whose values are reduced, other than attention's"
    assert f"not generated yet for {what}" in " ".join(module.two.__doc__.split())
    with pytest.raises(NotImplementedError) as raised:
        module._two_vjp((), ())
    assert str(raised.value) == (
        f"two (specs/two.pallas) is not differentiable: its spec has {what}, for which pallasgen generates"
        " no backward kernels yet"
    )  # and nothing of a `grad none` the spec does not have


BESIDE_AN_OPERAND = (
    "kernel two {\n    in  x: bf16[M, K]\n    in  y: bf16[K, N]\n    out z: f32[M, N]\n    out r: f32[M]\n"
    "    z = x @ y\n    r = sum(f32(x), K)\n    block M = 128, N = 128, K = 128\n}\n"
)


def test_an_output_read_from_a_products_operand_is_named_as_the_spec_writes_it(tmp_path):
    """Not "an epilogue that fails a check (unknown name 'x')": what the spec has."""
    module = load(tmp_path, "two", BESIDE_AN_OPERAND)
    with pytest.raises(NotImplementedError) as raised:
        module._two_vjp((), ())
    assert str(raised.value) == (
        "two (specs/two.pallas) is not differentiable: its spec has an output that reads the product's operand x"
        " beside the product, for which pallasgen generates no backward kernels yet"
    )


def test_without_grad_none_the_same_kernel_is_differentiable(tmp_path):
    module = load(tmp_path, "double", GRAD_NONE.replace("    grad none\n", ""))
    np.testing.assert_array_equal(jax.grad(lambda x: module.double(x).sum())(jnp.arange(3.0)), [2.0, 2.0, 2.0])


def test_spec_names_that_the_backward_pass_uses_still_differentiate(tmp_path):
    """Inputs named like the backward pass's parameters and the backward kernel it calls,
    and an output named like a cotangent, are renamed in the generated code."""
    source = (
        "kernel clash {\n    in  saved, cotangents, clash_backward, jnp: f32[N]\n    out dsaved: f32[N]\n"
        "    dsaved = saved * cotangents + clash_backward * jnp\n    block N = 1024\n}\n"
    )
    module = load(tmp_path, "clash", source)
    saved, cotangents, backward, numpy = (jnp.arange(4.0) + k for k in range(4))
    got = jax.grad(lambda *arrays: module.clash(*arrays).sum(), argnums=(0, 1, 2, 3))(
        saved, cotangents, backward, numpy
    )
    for g, w in zip(got, (cotangents, saved, numpy, backward), strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_kernel_named_like_another_kernels_backward_kernel_is_a_spec_error():
    source = GRAD_NONE.replace("    grad none\n", "") + GRAD_NONE.replace("double", "double_backward")
    with pytest.raises(SpecError) as error:
        check_source(source, "spec.pallas")
    (diagnostic,) = error.value.diagnostics
    assert diagnostic.position.line == 7  # the second kernel's name
    assert "'double_backward' is the name of a kernel derived from 'double' for jax.grad" in diagnostic.message


def test_backward_kernels_point_at_the_forward_statements_they_come_from():
    """Every statement and node of giou's backward kernel has the position of a forward
    statement's text: a check it failed would be reported there."""
    (giou,) = check_source(open_spec("giou"), "giou.pallas")
    (backward,) = giou.gradient.kernels
    statement_lines = {s.position.line for s in giou.kernel.body}
    declaration_lines = {d.position.line for d in giou.kernel.inputs + giou.kernel.outputs}
    for statement in backward.checked.kernel.body:
        nodes = [n for n in ir.walk(statement.value) if hasattr(n, "position")]
        lines = {n.position.line for n in nodes} | {statement.position.line}
        assert lines <= statement_lines | declaration_lines, statement


def open_spec(name: str) -> str:
    from kernel_cases import ROOT

    return (ROOT / "specs" / f"{name}.pallas").read_text(encoding="utf-8")


def test_the_module_says_what_the_forward_pass_saves_and_the_backward_recomputes():
    doc = generated_module("activations")._leaky_vjp.__doc__
    doc = " ".join(doc.split())
    assert "the forward pass saves its input x; the backward kernels recompute pos." in doc


def test_every_bundled_backward_kernel_is_a_module_function_with_its_reference():
    """Backward kernels are kernels like any other: each has its public function and its
    reference in the module, so the generic suites (and the compiled tier) take them."""
    for stem in ("activations", "add_vectors", "giou", "ops"):
        module = generated_module(stem)
        for checked in every_kernel(check_source(open_spec(stem), stem)):
            assert callable(getattr(module, checked.kernel.name)), checked.kernel.name
            assert callable(getattr(module, checked.kernel.name).reference), checked.kernel.name


def test_a_backward_kernels_recomputed_values_count_in_its_vmem():
    """bias_gelu's backward kernel holds its recomputed values and cotangents as blocks:
    the TPU launcher counts them (so that at 1024 x 1024 blocks it raises Mosaic's 16 MiB
    scoped limit, which the blocks alone would not pass and the kernel does)."""
    from pallasgen.backends.tpu.tiling import vmem

    _, bias_gelu, _ = check_source(open_spec("activations"), "activations.pallas")
    backward = bias_gelu.gradient.kernels[0].checked
    needed = vmem(backward.kernel, backward.blocks)
    lets = [p.what for p in needed.parts if p.what.startswith("let ")]
    assert len(lets) == sum(isinstance(s, ir.Let) for s in backward.kernel.body) >= 3
    assert needed.total(backward.blocks) > 16 * 2**20


def test_jacrev_runs_the_backward_kernel_once_per_output_element():
    """jax.jacrev maps the backward pass over the rows of an identity (vmap of the
    backward kernel): mul's Jacobians are diagonal, y's and x's values on the diagonal."""
    module = generated_module("ops")
    x, y = jnp.arange(6.0).reshape(2, 3), jnp.full((2, 3), 3.0)
    dx, dy = jax.jacrev(module.mul_f32, argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(dx.reshape(6, 6), np.diag(np.asarray(y).ravel()))
    np.testing.assert_array_equal(dy.reshape(6, 6), np.diag(np.asarray(x).ravel()))


def test_the_docstring_of_a_differentiable_kernel_names_its_backward_kernels():
    module = generated_module("activations")
    doc = " ".join(module.bias_gelu.__doc__.split())
    assert "Gradients: jax.grad runs the generated backward kernels bias_gelu_backward," in doc
    assert "no backward kernel" in " ".join(module.quantize_rows.__doc__.split())


def test_a_check_that_a_backward_kernel_fails_is_reported_at_the_forward_statement(monkeypatch):
    """Backward kernels go through the same checks as any kernel: what one of them fails
    is a spec error at the forward statement its derived node comes from."""
    from pallasgen.gradients import derive as gradients
    from pallasgen.frontend.errors import Diagnostic

    def failing(kernel, backends):
        (statement,) = [s for s in kernel.body if isinstance(s, ir.Assign)]
        return None, [Diagnostic(statement.value.position, "a check fails")]

    monkeypatch.setattr(gradients, "check_kernel", failing)
    with pytest.raises(SpecError) as error:
        check_source(GRAD_NONE.replace("    grad none\n", ""), "spec.pallas")
    (diagnostic,) = error.value.diagnostics
    assert diagnostic.message == (
        "in the kernel 'double_backward' derived for jax.grad (`grad none` turns it off): a check fails"
    )
    assert diagnostic.position.line == 4  # y = 2 * x


# --------------------------------------------------------------------------- random specs

UNARY = ["exp(tanh({}))", "tanh({})", "sigmoid({})", "gelu({})", "silu({})", "sin({})", "relu({})", "abs({})"]
UNARY += ["clip({}, -1.0, 1.0)", "f32(bf16({}))", "-{}", "sqrt(1.5 + {0} * {0})", "({} * 3.0)"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "maximum({}, {})"]
BINARY += ["minimum({}, {})", "where({0} > {1}, {0}, {1} * 2.0)", "({} / (2.0 + abs({})))"]


@st.composite
def differentiable_expressions(draw, names: list[str], depth: int = 3) -> str:
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(names))
    if draw(st.booleans()):
        return draw(st.sampled_from(UNARY)).format(draw(differentiable_expressions(names, depth - 1)))
    left, right = (draw(differentiable_expressions(names, depth - 1)) for _ in range(2))
    return draw(st.sampled_from(BINARY)).format(left, right)


@st.composite
def differentiable_specs(draw) -> tuple[str, list[tuple[str, str, tuple[str, ...]]], list[str]]:
    """An elementwise kernel `k` of f32 and bf16 inputs (some broadcast over M or N), with
    lets read more than once and one or two float outputs."""
    inputs = [("a0", "f32", ("M", "N"))]
    for index in range(1, draw(st.integers(1, 3))):
        dims = draw(st.sampled_from([("M", "N"), ("M",), ("N",)]))
        inputs.append((f"a{index}", draw(st.sampled_from(["f32", "bf16"])) if dims != ("M",) else "f32", dims))
    names = [f"f32({name})" if dtype == "bf16" else name for name, dtype, _ in inputs]
    lines = [f"in {name}: {dtype}[{', '.join(dims)}]" for name, dtype, dims in inputs]
    for index in range(draw(st.integers(0, 2))):
        lines.append(f"let t{index} = {draw(differentiable_expressions(names))}")
        names.append(f"t{index}")
    outputs = ["r"] + (["s"] if draw(st.booleans()) else [])
    for output in outputs:
        dtype = draw(st.sampled_from(["f32", "bf16"]))
        lines += [f"out {output}: {dtype}[M, N]", f"{output} = {dtype}({draw(differentiable_expressions(names))})"]
    return (
        "kernel k {\n" + "".join(f"    {line}\n" for line in lines) + "    block M = 16, N = 128\n}\n",
        inputs,
        outputs,
    )


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(differentiable_specs())
def test_derived_backward_kernels_of_random_specs_give_jaxs_derivatives(tmp_path_factory, case):
    """Reverse mode over lets read several times, casts, broadcast inputs (summed by a
    second kernel) and several outputs: the derived backward kernels' references give
    what jax.vjp of the forward reference gives."""
    spec, inputs, outputs = case
    (checked,) = check_source(spec, "random.pallas")
    path = tmp_path_factory.mktemp("random") / "random.py"
    path.write_text(generate(spec, "random.pallas", "random.pallas"), encoding="utf-8")
    module = load_module(path, f"_pallasgen_random_{path.parent.name}")
    rng = np.random.default_rng(7)
    sizes = {"M": 5, "N": 6}
    arrays = {
        name: jnp.asarray(
            rng.standard_normal([sizes[d] for d in dims]), {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype]
        )
        for name, dtype, dims in inputs
    }
    outs = module.k.reference(*arrays.values())
    outs = outs if isinstance(outs, tuple) else (outs,)
    cotangents = {o: jnp.asarray(rng.standard_normal((5, 6)), out.dtype) for o, out in zip(outputs, outs)}
    want = vjp_of(module.k.reference, list(arrays.values()), tuple(cotangents.values()))
    got = {}
    for backward in checked.gradient.kernels:
        args = [cotangents[a.name] if a.source == "cotangent" else arrays[a.name] for a in backward.arguments]
        results = getattr(module, backward.checked.kernel.name).reference(*args)
        got.update(zip(backward.results, results if isinstance(results, tuple) else (results,)))
    got.update({name: cotangents[output] for name, output in checked.gradient.passed})  # as it is: no kernel
    bf16 = "bf16" in spec
    for name, w in zip(arrays, want, strict=True):
        g = got.get(name, np.zeros(w.shape))
        np.testing.assert_allclose(
            np.asarray(g, np.float64),
            np.asarray(w, np.float64),
            rtol=3e-2 if bf16 else 1e-4,
            atol=3e-2 if bf16 else 1e-5,
            err_msg=f"{name} of\n{spec}",
        )
