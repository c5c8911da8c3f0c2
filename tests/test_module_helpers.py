"""A generated module defines the shared helpers (templates/helpers.py.j2) that its
kernels' code calls, directly or through another helper, on every backend, and no
other: each feature below needs its own helpers, and a module with only that feature
runs on the CPU (the TPU kernel interpreted) and on the GPU path (the Triton kernel
interpreted)."""

from __future__ import annotations

import ast

import jax.numpy as jnp
import numpy as np
import pytest

from kernel_cases import GENERATED, load_module, take_gpu_branch
from pallasgen.backends import MODULE_HELPERS
from pallasgen.workspace.pipeline import generate

PLATFORM = {
    "_on_platform",
    "_platform_dependent",
    "_platform_dependent_p",
    "_platform_dependent_primitive",
    "_gpu_kernel",
}

# A kernel `k` with one feature: its spec body, the helpers that feature needs, and the
# sizes of a call (a ragged last block wherever there are blocks).
FEATURES = {
    "whole-arrays": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = x * 2.0",
        PLATFORM
        | {"_operands", "_without_elements", "_vmem_limit", "_nbytes", "_inside", "_mask", "_load", "_store"}
        | {"_mgpu_pad", "_mgpu_swizzled", "_mgpu_load", "_gpu_options", "_gpu_device_kind"},
        {"M": 5, "N": 7},
    ),
    "call-time-blocks": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = x * 2.0\nblock M = 8, N = 128",
        {"_check_blocks", "_tpu_blocks", "_tpu_chip", "_grown", "_check_tiling"},
        {"M": 20, "N": 300},
    ),
    "round": ("in x: f32[N]\nout y: f32[N]\ny = round(x)", {"_round_half_even"}, {"N": 300}),
    "floor-and-ceil": (
        "in x: f32[N]\nout y: f32[N]\ny = floor(x) - ceil(x)",
        {"_mgpu_floor", "_mgpu_ceil"},
        {"N": 300},
    ),
    "sqrt": ("in x: f32[N]\nout y: f32[N]\ny = sqrt(x)", {"_mgpu_sqrt"}, {"N": 300}),
    "gradient": ("in x: f32[N]\nout y: f32[N]\ny = x * x", {"_differentiable"}, {"N": 300}),
    "argmax": (
        "in x: f32[M, N]\nout i: i32[M]\ni = argmax(x, N)\nblock M = 8",
        {"_argbest", "_fill_past"} | {"_mgpu_argbest_step", "_mgpu_spread", "_mgpu_positions", "_mgpu_full"},
        {"M": 10, "N": 37},
    ),
    "argmax-over-steps": (
        "in x: f32[M, N]\nout i: i32[M]\ni = argmax(x, N)\nblock M = 8, N = 128",
        {"_argbest_step"},
        {"M": 10, "N": 300},
    ),
    "logsumexp": (
        "in x: f32[M, N]\nout y: f32[M]\ny = logsumexp(x, N)\nblock M = 8",
        {"_logsumexp", "_mgpu_logsumexp_step"},
        {"M": 10, "N": 37},
    ),
    "logsumexp-over-steps": (
        "in x: f32[M, N]\nout y: f32[M]\ny = logsumexp(x, N)\nblock M = 8, N = 128",
        {"_logsumexp_step", "_logsumexp_finish"},
        {"M": 10, "N": 300},
    ),
    "softmax": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = softmax(x, N)\nblock M = 8",
        {"_softmax"},
        {"M": 10, "N": 37},
    ),
    "vector-sum-over-steps": (
        "in x: f32[N]\nout s: f32[]\ns = sum(x, N)\nblock N = 1024",
        {"_rows_shape", "_as_rows", "_fill_past_rows"},
        {"N": 3000},
    ),
    "blocks-in-strips": (
        "in q: f32[S, D]\nin k: f32[T, D]\nout y: f32[S]\n"
        "y = logsumexp(where(index(S) >= index(T), q @ k.T, -inf), T)\nblock S = 16, T = 128",
        {"_strips"},
        {"S": 40, "T": 300, "D": 8},
    ),
    "row-input-beside-a-reduction": (
        "in x: f32[M, N]\nin s: f32[M]\nout y: f32[M]\ny = sum(x, N) * s",
        {"_mgpu_load_vector"},
        {"M": 10, "N": 37},
    ),
    # Attention on Mosaic GPU: computed operands of products, an f32 one split, a causal
    # mask of positions, a ragged T, a softmax over a dimension held whole.
    "fused-attention": (
        "in q: bf16[S, D]\nin k: bf16[T, D]\nin v: bf16[T, E]\nout y: f32[S, E]\n"
        "let s = where(index(S) >= index(T), q @ k.T, -inf)\n"
        "y = softmax(softmax(s, T) @ v, E)\nblock S = 64, T = 64",
        {"_mgpu_dot", "_mgpu_fill_past", "_mgpu_vector_positions", "_mgpu_softmax"},
        {"S": 70, "T": 100, "D": 8, "E": 24},
    ),
    "mosaic-gpu-product": (
        "in x: f32[M, K]\nin y: f32[K, N]\nout z: f32[M, N]\nz = x @ y",
        {"_mgpu_check_choices"},
        {"M": 20, "N": 30, "K": 40},
    ),
}
# The inputs' dimensions of a feature whose kernel takes other than one x[M, N] (or x[N]).
INPUTS = {
    "blocks-in-strips": (("S", "D"), ("T", "D")),
    "row-input-beside-a-reduction": (("M", "N"), ("M",)),
    "fused-attention": (("S", "D"), ("T", "D"), ("T", "E")),
    "mosaic-gpu-product": (("M", "K"), ("K", "N")),
}
BF16_INPUTS = {"fused-attention"}  # features whose inputs are bf16 (the others': f32)


def feature_source(feature: str) -> str:
    body = FEATURES[feature][0].replace("\n", "\n    ")
    return generate(f"kernel k {{\n    {body}\n}}\n", "feature.pallas", "feature.pallas")


def definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The module's top-level functions and assignments, by the name each defines."""
    named = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            named[node.name] = node
        elif isinstance(node, ast.Assign):
            named.update((target.id, node) for target in node.targets)
    return named


def read_names(*nodes: ast.AST) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def unreachable_helpers(source: str) -> set[str]:
    """Private top-level definitions that no public function or top-level statement reaches."""
    tree = ast.parse(source)
    named = definitions(tree)
    private = {name: node for name, node in named.items() if name.startswith("_")}
    roots = [node for node in tree.body if node not in private.values()]
    reached, pending = set(), read_names(*roots)
    while pending:
        name = pending.pop()
        if name in private and name not in reached:
            reached.add(name)
            pending |= read_names(private[name])
    return set(private) - reached


def module_sources() -> list:
    """Each bundled module, and each feature's."""
    bundled = [pytest.param(path.read_text(), id=path.stem) for path in sorted(GENERATED.glob("*.py"))]
    return bundled + [pytest.param(feature_source(feature), id=feature) for feature in FEATURES]


def test_the_features_need_every_helper_between_them():
    assert set().union(*(needed for _, needed, _ in FEATURES.values())) == MODULE_HELPERS


@pytest.mark.parametrize("feature", FEATURES)
def test_a_module_with_one_feature_runs_on_the_cpu_and_on_the_gpu_path(feature, tmp_path, monkeypatch):
    source = feature_source(feature)
    _, needed, sizes = FEATURES[feature]
    assert needed <= set(definitions(ast.parse(source)))
    path = tmp_path / f"{feature.replace('-', '_')}.py"
    path.write_text(source)
    module = load_module(path, f"_feature_{path.stem}")
    rng = np.random.default_rng(0)
    inputs = INPUTS.get(feature, [tuple(d for d in ("M", "N") if d in sizes)])
    xs = [rng.standard_normal(tuple(sizes[d] for d in dims)).astype(np.float32) * 4 for dims in inputs]
    if feature in BF16_INPUTS:
        xs = [jnp.asarray(x, jnp.bfloat16) for x in xs]
    want = np.asarray(module.k_reference(*xs))
    np.testing.assert_allclose(np.asarray(module.k(*xs)), want, rtol=1e-5, atol=1e-5)
    take_gpu_branch(monkeypatch, module)
    np.testing.assert_allclose(np.asarray(module.k(*xs, interpret=True)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source", module_sources())
def test_a_module_defines_no_helper_that_its_code_does_not_call(source):
    assert unreachable_helpers(source) == set()


@pytest.mark.parametrize("source", module_sources())
def test_a_module_defines_every_helper_its_code_calls_on_any_backend(source):
    """Also the GPU kernels' helpers, which no CPU run of the module reaches."""
    tree = ast.parse(source)
    assert read_names(tree) & MODULE_HELPERS <= set(definitions(tree))
