"""pallasgen's runtime (pallasgen/runtime/support.py), the code generated modules share:
each feature below calls its own runtime functions (as `rt.NAME`), a module with only
that feature runs on the CPU (the TPU kernel interpreted) and on the GPU path (the
Triton kernel interpreted), every runtime function is called by some module, and the
functions behave as their docstrings say. Importing a module changes no process-wide
state: no warning filter, no primitive registered before a kernel runs."""

from __future__ import annotations

import ast
import functools
import inspect
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice

from kernel_cases import GENERATED, load_module, take_gpu_branch
from pallasgen.runtime import support
from pallasgen.workspace.pipeline import generate

PLATFORM = {"kernel", "on_platform", "gpu_kernel"}

# A kernel `k` with one feature: its spec body, the helpers that feature needs, and the
# sizes of a call (a ragged last block wherever there are blocks).
FEATURES = {
    "whole-arrays": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = x * 2.0",
        PLATFORM
        | {"operands", "without_elements", "vmem_limit", "nbytes", "inside", "mask", "load", "store"}
        | {
            "mgpu_pad",
            "mgpu_spec",
            "mgpu_load",
            "mgpu_kernel",
            "tpu_params",
            "triton_options",
            "gpu_options",
            "gpu_device_kind",
        },
        {"M": 5, "N": 7},
    ),
    "call-time-blocks": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = x * 2.0\nblock M = 8, N = 128",
        {"check_blocks", "tpu_blocks", "tpu_chip", "grown"},
        {"M": 20, "N": 300},
    ),
    "round": ("in x: f32[N]\nout y: f32[N]\ny = round(x)", {"round_half_even"}, {"N": 300}),
    "floor-and-ceil": (
        "in x: f32[N]\nout y: f32[N]\ny = floor(x) - ceil(x)",
        {"mgpu_floor", "mgpu_ceil"},
        {"N": 300},
    ),
    "sqrt": ("in x: f32[N]\nout y: f32[N]\ny = sqrt(x)", {"mgpu_sqrt"}, {"N": 300}),
    "gradient": ("in x: f32[N]\nout y: f32[N]\ny = x * x", {"differentiable"}, {"N": 300}),
    "argmax": (
        "in x: f32[M, N]\nout i: i32[M]\ni = argmax(x, N)\nblock M = 8",
        {"argbest", "fill_past"} | {"mgpu_argbest_step", "mgpu_spread", "mgpu_positions", "mgpu_full"},
        {"M": 10, "N": 37},
    ),
    "argmax-over-steps": (
        "in x: f32[M, N]\nout i: i32[M]\ni = argmax(x, N)\nblock M = 8, N = 128",
        {"argbest_step"},
        {"M": 10, "N": 300},
    ),
    "logsumexp": (
        "in x: f32[M, N]\nout y: f32[M]\ny = logsumexp(x, N)\nblock M = 8",
        {"logsumexp", "logsumexp_finish", "mgpu_exp"},
        {"M": 10, "N": 37},
    ),
    "logsumexp-over-steps": (
        "in x: f32[M, N]\nout y: f32[M]\ny = logsumexp(x, N)\nblock M = 8, N = 128",
        {"logsumexp_finish"},
        {"M": 10, "N": 300},
    ),
    "softmax": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = softmax(x, N)\nblock M = 8",
        {"softmax", "row_warps"},
        {"M": 10, "N": 37},
    ),
    "vector-sum-over-steps": (
        "in x: f32[N]\nout s: f32[]\ns = sum(x, N)\nblock N = 1024",
        {"rows_shape", "as_rows", "fill_past_rows"},
        {"N": 3000},
    ),
    "blocks-in-strips": (
        "in q: f32[S, D]\nin k: f32[T, D]\nout y: f32[S]\n"
        "y = logsumexp(where(index(S) >= index(T), q @ k.T, -inf), T)\nblock S = 16, T = 128",
        {"add_in_strips", "strip_view"},
        {"S": 40, "T": 300, "D": 8},
    ),
    # One key: a one-row right operand of q @ k.T, which Mosaic multiplies and sums.
    "one-key": (
        "in q: bf16[S, D]\nin k: bf16[T, D]\nout s: f32[S, T]\ns = q @ k.T\nblock S = 16, T = 128",
        {"dot_t"},
        {"S": 20, "T": 1, "D": 40},
    ),
    "row-input-beside-a-reduction": (
        "in x: f32[M, N]\nin s: f32[M]\nout y: f32[M]\ny = sum(x, N) * s",
        {"mgpu_load_vector", "mgpu_copy_in"},
        {"M": 10, "N": 37},
    ),
    # Attention on Mosaic GPU: computed operands of products, an f32 one split, a causal
    # mask of positions, a ragged T, a softmax over a dimension held whole.
    "fused-attention": (
        "in q: bf16[S, D]\nin k: bf16[T, D]\nin v: bf16[T, E]\nout y: f32[S, E]\n"
        "let s = where(index(S) >= index(T), q @ k.T, -inf)\n"
        "y = softmax(softmax(s, T) @ v, E)\nblock S = 64, T = 64",
        {
            "mgpu_dot",
            "mgpu_fill_past",
            "mgpu_vector_positions",
            "mgpu_softmax",
            "mgpu_grid_indices",
            "mgpu_check_whole",
            "mgpu_swept_block",
            "mgpu_warp_specialized",
        },
        {"S": 70, "T": 100, "D": 8, "E": 24},
    ),
    "mosaic-gpu-product": (
        "in x: f32[M, K]\nin y: f32[K, N]\nout z: f32[M, N]\nz = x @ y",
        {"mgpu_check_choices", "mgpu_smem", "mgpu_copy_out"},
        {"M": 20, "N": 30, "K": 40},
    ),
    # One dot whose right operand a Triton program holds whole along N (the softmax's).
    "dot-held-whole": (
        "in x: f32[M, K]\nin w: f32[K, N]\nout y: f32[M, N]\ny = softmax(x @ w, N)\nblock M = 8, K = 128",
        {"fit_dot_blocks"},
        {"M": 20, "N": 30, "K": 300},
    ),
}
# The inputs' dimensions of a feature whose kernel takes other than one x[M, N] (or x[N]).
INPUTS = {
    "blocks-in-strips": (("S", "D"), ("T", "D")),
    "one-key": (("S", "D"), ("T", "D")),
    "row-input-beside-a-reduction": (("M", "N"), ("M",)),
    "fused-attention": (("S", "D"), ("T", "D"), ("T", "E")),
    "mosaic-gpu-product": (("M", "K"), ("K", "N")),
    "dot-held-whole": (("M", "K"), ("K", "N")),
}
BF16_INPUTS = {"fused-attention", "one-key"}  # features whose inputs are bf16 (the others': f32)


@functools.cache
def feature_source(feature: str) -> str:
    """The module of the kernel `k` with one feature (generated once per process)."""
    body = FEATURES[feature][0].replace("\n", "\n    ")
    return generate(f"kernel k {{\n    {body}\n}}\n", "feature.pallas", "feature.pallas")


def runtime_calls(source: str) -> set[str]:
    """The runtime functions a module's code calls: each `rt.NAME` it reads."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "rt"
    }


def runtime_functions() -> set[str]:
    """The runtime's public functions."""
    return {
        name
        for name, value in vars(support).items()
        if inspect.isfunction(value) and value.__module__ == support.__name__ and not name.startswith("_")
    }


def reached_from(names: set[str]) -> set[str]:
    """`names`, and the runtime functions (and classes) their code calls in turn."""
    tree = ast.parse(inspect.getsource(support))
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    reached, pending = set(), set(names)
    while pending:
        name = pending.pop()
        if name in functions and name not in reached:
            reached.add(name)
            pending |= {n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name)}
    return reached


def modules() -> list:
    """Each bundled module (its path), and each feature (its name), named as the tests'
    ids: the features' modules are generated by the tests that use them, not at
    collection, which every pytest-xdist worker repeats."""
    bundled = [pytest.param(path, id=path.stem) for path in sorted(GENERATED.glob("*.py"))]
    return bundled + [pytest.param(feature, id=feature) for feature in FEATURES]


def module_source(module) -> str:
    """A bundled module's text (`module` its path), or a feature's module (its name)."""
    return feature_source(module) if isinstance(module, str) else module.read_text()


def test_the_features_call_every_runtime_function_between_them():
    called = set().union(*(needed for _, needed, _ in FEATURES.values()))
    assert reached_from(called) & runtime_functions() == runtime_functions()


@pytest.mark.parametrize("feature", FEATURES)
def test_a_module_with_one_feature_runs_on_the_cpu_and_on_the_gpu_path(feature, tmp_path, monkeypatch):
    source = feature_source(feature)
    _, needed, sizes = FEATURES[feature]
    assert needed <= reached_from(runtime_calls(source))
    path = tmp_path / f"{feature.replace('-', '_')}.py"
    path.write_text(source)
    module = load_module(path, f"_feature_{path.stem}")
    rng = np.random.default_rng(0)
    inputs = INPUTS.get(feature, [tuple(d for d in ("M", "N") if d in sizes)])
    xs = [rng.standard_normal(tuple(sizes[d] for d in dims)).astype(np.float32) * 4 for dims in inputs]
    if feature in BF16_INPUTS:
        xs = [jnp.asarray(x, jnp.bfloat16) for x in xs]
    want = np.asarray(module.k.reference(*xs))
    np.testing.assert_allclose(np.asarray(module.k(*xs)), want, rtol=1e-5, atol=1e-5)
    take_gpu_branch(monkeypatch, module)
    np.testing.assert_allclose(np.asarray(module.k(*xs, interpret=True)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("module", modules())
def test_every_runtime_function_a_module_calls_exists(module):
    """Also the GPU kernels' calls, which no CPU run of the module reaches; beside them a
    module reads `rt.plgpu` and builds its tables of blocks as `rt.TpuBlocks` and `rt.GpuOptions`."""
    source = module_source(module)
    assert runtime_calls(source) <= runtime_functions() | {"plgpu", "TpuBlocks", "GpuOptions"}


@pytest.mark.parametrize("module", modules())
def test_a_module_defines_no_copy_of_the_runtime(module):
    source = module_source(module)
    tree = ast.parse(source)
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert not defined & {f"_{name}" for name in runtime_functions()}  # as modules once defined them
    assert "filterwarnings" not in source


IMPORT_CHECK = """
import sys, warnings
import jax.extend.core, jax.numpy  # what jax and numpy themselves set, before the count
from jax.experimental.pallas import tpu, triton
try:
    from jax.experimental.pallas import mosaic_gpu
except ImportError:
    pass
before = list(warnings.filters)
sys.path.insert(0, sys.argv[1])
import add_vectors, softmax
from pallasgen.runtime import support
assert warnings.filters == before, "importing a generated module changed the warning filters"
assert support._platform_dependent_primitive.cache_info().currsize == 0, "a primitive registered at import"
import jax.numpy as jnp
x = jnp.ones(4, jnp.float32)
add_vectors.add_vectors(x, x)
softmax.softmax(jnp.ones((8, 128), jnp.float32))
assert support._platform_dependent_primitive.cache_info().currsize == 1, "one primitive for every module"
assert warnings.filters == before
"""


def test_importing_a_module_changes_no_process_wide_state():
    """No warning filter is set, and the dispatch's primitive is registered with jax on
    the first call (once, for every module), not at import; a fresh interpreter shows it."""
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, str(GENERATED)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_cuda_lowering_silences_the_triton_deprecation_and_nothing_else():
    """A kernel whose CUDA lowering warns as jax 0.11+'s Triton backend does exports for
    CUDA with warnings as errors; the warning still shows outside the lowering."""

    def warns_like_triton(x):
        warnings.warn(f"{support.TRITON_DEPRECATION} and will be removed", DeprecationWarning)
        return x + 1

    def call(x):
        return support.platform_dependent((x,), tpu=lambda x: x + 1, cuda=warns_like_triton, default=lambda x: x + 1)

    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = jax.export.export(jax.jit(call), platforms=["cuda"])(x).mlir_module()
    assert "func" in text
    with pytest.warns(DeprecationWarning, match=support.TRITON_DEPRECATION):
        warns_like_triton(1)


def test_a_bundled_kernels_triton_lowering_warns_of_nothing():
    module = load_module(GENERATED / "add_vectors.py", "_runtime_add_vectors")
    x = jax.ShapeDtypeStruct((300,), jnp.float32)
    device = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
    with (
        warnings.catch_warnings(),
        jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)),
    ):
        warnings.simplefilter("error")
        lowered = jax.jit(module.add_vectors).trace(x, x).lower(lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text().lower()


def test_a_kernels_docstring_gets_its_arrays_as_declared_once_in_its_decorator():
    def scaled(x_, bias, *, scale=2.0):
        """Scales rows.

        Keywords:
          scale: a static f32 (default 2.0).

        Gradients: none.
        """

    doc = support.with_arrays(
        scaled, ("x: bf16[M, N]", "bias: f32[N] as [1, N]"), ("y: f32[M, N]", "s: f32[M] as [M, 1]")
    )
    assert doc.splitlines() == [
        "Scales rows.",
        "",
        "Args:",
        "  x_: bf16[M, N].",
        "  bias: f32[N].",
        "",
        "Returns:",
        "  y: f32[M, N]; s: f32[M].",
        "",
        "Keywords:",
        "  scale: a static f32 (default 2.0).",
        "",
        "Gradients: none.",
    ]


def test_a_kernels_keywords_are_said_from_its_tables_and_params():
    def scaled(x, *, scale=0.5, eps=1e-05):
        """Scales rows.

        Gradients: none.
        """

    blocks = support.TpuBlocks(tiling={"M": (8, "f32 rows"), "N": None}, chips={None: {"default": (256, 512)}})
    keywords = support.keyword_lines(scaled, {"scale": jnp.bfloat16, "eps": jnp.float32}, blocks, None)
    assert keywords == [
        "  block_m, block_n: TPU blocks (None: as its tpu_blocks choose; the spec's: 256, 512).",
        "  interpret: None interprets where no kernel compiles (as on CPU); True or False forces it.",
        "  scale: a static bf16 (default 0.5).",
        "  eps: a static f32 (default 1e-05).",
    ]
    options = support.GpuOptions({None: (128, 128, 32, 2)}, ("M", "N", "K"))
    assert support.keyword_lines(scaled, {}, None, options)[0].startswith("  mgpu_block_*, mgpu_stages: Mosaic GPU's")
    # The GPU keywords every kernel of a module with GPU targets takes are said where it has them.
    both = support.keyword_lines(scaled, {}, None, None, options, {"triton": None, "mosaic_gpu": None})
    assert [line.split(":")[0] for line in both if not line.startswith("    ")] == [
        "  gpu_block_*, gpu_warps, gpu_stages",
        "  gpu_backend",
        "  interpret",
    ]
    assert not any(
        "gpu_backend" in line for line in support.keyword_lines(scaled, {}, None, None, options, {"triton": None})
    )
    doc = support.with_arrays(scaled, ("x: f32[M, N]",), ("y: f32[M, N]",), keywords).splitlines()
    assert doc[doc.index("Keywords:") + 1 : doc.index("Gradients: none.")] == [*keywords, ""]


def test_a_docstring_without_sections_ends_with_the_arrays():
    def plain(x):
        """Copies x."""

    assert support.with_arrays(plain, ("x: f32[N]",), ("y: f32[N]",)).splitlines() == [
        "Copies x.",
        "",
        "Args:",
        "  x: f32[N].",
        "",
        "Returns:",
        "  y: f32[N].",
    ]


def test_a_generated_kernels_help_names_its_arrays_and_keywords():
    module = load_module(GENERATED / "norms.py", "_docs_norms")
    doc = module.layer_norm.__doc__
    assert "Args:\n  x: bf16[M, N].\n  w: f32[N].\n  b: f32[N].\n" in doc
    assert "Returns:\n  y: bf16[M, N]; mu: f32[M]; rstd: f32[M].\n" in doc
    assert "Keywords:\n  block_m: TPU blocks (None: as its tpu_blocks choose; the spec's: 16).\n" in doc
    assert "  eps: a static f32 (default 1e-05).\n" in doc
    assert inspect.getdoc(module.layer_norm) == doc


def test_operands_converts_checks_and_names_each_size():
    arrays, sizes = support.operands(
        "k", {"x": ([[1.0, 2.0]], jnp.float32, ("M", "N")), "b": (np.zeros(2, np.float32), jnp.float32, ("N",))}
    )
    assert [a.shape for a in arrays] == [(1, 2), (2,)] and sizes == {"M": 1, "N": 2}
    with pytest.raises(TypeError, match="k: x must be float32, got int32"):
        support.operands("k", {"x": (np.zeros(2, np.int32), jnp.float32, ("N",))})
    with pytest.raises(ValueError, match=r"k: x must have dimensions \[M, N\], got shape \(2,\)"):
        support.operands("k", {"x": (np.zeros(2, np.float32), jnp.float32, ("M", "N"))})
    with pytest.raises(ValueError, match="k: b has N=3 but another operand has N=2"):
        support.operands(
            "k",
            {"x": (np.zeros(2, np.float32), jnp.float32, ("N",)), "b": (np.zeros(3, np.float32), jnp.float32, ("N",))},
        )
    with pytest.raises(TypeError, match="k: x is not an array"):
        support.operands("k", {"x": (object(), jnp.float32, ("N",))})


def test_check_blocks_takes_positive_ints_and_none_where_allowed():
    support.check_blocks("k", block_m=8, block_n=None, may_be_none=True)
    for bad in (0, -1, True, 2.0, "8"):
        with pytest.raises(ValueError, match="k: block_m must be a positive int or None"):
            support.check_blocks("k", block_m=bad, may_be_none=True)
    with pytest.raises(ValueError, match="k: block_m must be a positive int, got None"):
        support.check_blocks("k", block_m=None)


def test_without_elements_gives_empty_outputs_or_what_the_reference_reduces_to():
    empty = support.without_elements("k", {"M": 0, "N": 3}, None, (((0, 3), jnp.float32),), None)
    assert empty.shape == (0, 3) and empty.dtype == jnp.float32
    total = support.without_elements(
        "k", {"M": 0, "N": 3}, lambda x: x.sum(axis=0), (((3,), jnp.float32),), jnp.zeros((0, 3))
    )
    np.testing.assert_array_equal(total, np.zeros(3))


def test_the_tpu_limits_come_from_the_constants_the_generator_reads():
    from pallasgen.runtime.constants import SCOPED_VMEM_BYTES, VMEM_LIMIT_BYTES

    assert support.vmem_limit(SCOPED_VMEM_BYTES) is None
    assert support.vmem_limit(SCOPED_VMEM_BYTES + 1) == 2 * SCOPED_VMEM_BYTES + 2
    assert support.vmem_limit(90 * 2**20) == VMEM_LIMIT_BYTES


def test_tpu_blocks_refuse_a_block_that_breaks_its_tiling_rule_naming_the_rule_and_a_legal_block():
    table = support.TpuBlocks(
        {"M": (8, "f32 rows"), "N": (128, "lanes"), "X": (1024, "1-D bf16", 256)},
        {None: {"default": (8, 128, 1024)}},
        kernel="k",
        sizes=("M", "N", "X"),
    )
    assert support.tpu_blocks(table, (100, 100, 5000), (16, 100, 256)) == (16, 100, 256)
    assert support.tpu_blocks(table, (100, 100, 900), (1000, 1000, 1000)) == (100, 100, 900)  # clamped, then checked
    with pytest.raises(
        ValueError,
        match=r"k: block_m=12 breaks the TPU tiling rule: M is the second-to-last dimension of a block of f32 values,"
        r" so it is a multiple of 8; use 16 or a block of the whole dimension \(100\)",
    ):
        support.tpu_blocks(table, (100, 100, 5000), (12, None, None))
    with pytest.raises(
        ValueError, match=r"k: block_n=64 .* N is the last dimension of a block, so it is a multiple of 128"
    ):
        support.tpu_blocks(table, (100, 1000, 5000), (8, 64, 1024))
    with pytest.raises(
        ValueError,
        match=r"k: block_x=200 .* X is the dimension of a one-dimensional bf16 array, so it is a multiple of 1024 or"
        r" a power of two of at least 256; use 1024",
    ):
        support.tpu_blocks(table, (100, 100, 5000), (8, 128, 200))


def test_tpu_blocks_take_the_nearest_tuned_entry_of_the_chip_else_its_default_else_the_specs(monkeypatch):
    table = support.TpuBlocks(
        {"M": (8, "f32 rows"), "N": (128, "lanes")},
        {None: {"default": (8, 128)}, "v6e": {"default": (16, 256), (1024, 1024): (64, 512)}},
        step=lambda m, n, block_m, block_n: (block_m * block_n, 4 * block_m * block_n),
        kernel="k",
        sizes=("M", "N"),
    )
    monkeypatch.setattr(support, "tpu_chip", lambda: "v6e")
    assert support.tpu_blocks(table, (2048, 1024), (None, None)) == (64, 512)  # tuned: not grown
    assert support.tpu_blocks(table, (2048, 1024), (8, None)) == (8, 512)  # a given block wins
    assert support.tpu_blocks(table, (40, 1024), (None, None)) == (40, 512)  # a small M is one whole block
    monkeypatch.setattr(support, "tpu_chip", lambda: "v5e")  # no entry of its own: the spec's, grown
    assert support.tpu_blocks(table, (4096, 4096), (None, None)) == (256, 4096)  # 2**20 elements, N first
    assert support.tpu_blocks(table, (4096, 4096), (None, 128)) == (4096, 128)  # those not given, to M
    bounded = table._replace(bounds=(4096, 1024))
    assert support.tpu_blocks(bounded, (4096, 4096), (None, None)) == (1024, 1024)
    # in strips, each to a power of two within its dimension: 3000 -> 2048, not 3000
    assert support.tpu_blocks(bounded._replace(strips=True), (3000, 3000), (None, None)) == (1024, 1024)
    assert support.tpu_blocks(bounded._replace(strips=True, bounds=(4096, 128)), (3000, 3000), (None, None)) == (
        2048,
        128,
    )
    assert support.tpu_blocks(table._replace(step=None), (4096, 4096), (None, None)) == (8, 128)  # never grown
    monkeypatch.setattr(support, "tpu_chip", lambda: None)
    assert support.tpu_blocks(table, (4096, 4096), (None, None)) == (8, 128)  # CPU: the spec's, not grown


def test_gpu_options_take_the_nearest_tuned_entry_of_the_device_kind(monkeypatch):
    table = {None: (64, 4, 3), "H100": {(1024,): (128, 8, 4), (64,): (16, 2, 1)}}
    monkeypatch.setattr(support, "gpu_device_kind", lambda: "H100")
    assert support.gpu_options(table, (2000,), (None, None, None)) == (128, 8, 4)
    assert support.gpu_options(table, (50,), (None, 4, None)) == (16, 4, 1)
    monkeypatch.setattr(support, "gpu_device_kind", lambda: None)
    assert support.gpu_options(table, (2000,), (None, None, None)) == (64, 4, 3)


def test_triton_options_clamp_each_block_between_its_least_and_its_dimensions_next_power_of_two():
    table = {None: (64, 64, 32, 4, 3)}
    assert support.triton_options(table, (1000, 5, 3), (None,) * 5, 16) == (64, 16, 16, 4, 3)
    assert support.triton_options(table, (1000, 5, 3), (None,) * 5, (1, 1, 32)) == (64, 8, 32, 4, 3)
    assert support.triton_options(table, (1000, 50, 3), (128, None, 2, 8, 1)) == (128, 64, 2, 8, 1)  # given
    assert support.triton_options({None: (4, 1)}, (7,), (None, None)) == (4, 1)  # no blocks


def test_gpu_kernel_names_the_backends_it_takes():
    assert support.gpu_kernel("k", "triton", "triton kernel", None) == "triton kernel"
    assert support.gpu_kernel("k", "mosaic_gpu", "triton kernel", None) == "triton kernel"  # none of its own
    with pytest.raises(ValueError, match='k: gpu_backend must be "triton" or "mosaic_gpu" or None, got \'cuda\''):
        support.gpu_kernel("k", "cuda", None, None)


def test_a_call_that_names_no_gpu_backend_runs_the_kernels_choice_from_sm_90_on(monkeypatch):
    def triton():
        return "triton"

    def mosaic_gpu():
        return "mosaic_gpu"

    monkeypatch.setattr(support, "plgpu", object())  # importable, as on jax 0.10.2 with absl-py
    for capability, ran in [(None, "triton"), ((8, 9), "triton"), ((9, 0), "mosaic_gpu"), ((12, 0), "mosaic_gpu")]:
        monkeypatch.setattr(support, "gpu_capability", lambda: capability)
        assert support.gpu_kernel("k", None, triton, mosaic_gpu, on_hopper="mosaic_gpu")() == ran
        assert support.gpu_kernel("k", None, triton, mosaic_gpu)() == "triton"  # a kernel with no choice


def test_the_exact_rounding_functions_agree_with_jax_numpy():
    x = jnp.asarray([-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 3.7, -3.7, 2.0**24 + 2, jnp.inf], jnp.float32)
    np.testing.assert_array_equal(support.round_half_even(x), jnp.round(x))
    np.testing.assert_array_equal(support.mgpu_floor(x), jnp.floor(x))
    np.testing.assert_array_equal(support.mgpu_ceil(x), jnp.ceil(x))
    assert np.signbit(support.mgpu_ceil(jnp.float32(-0.5)))
    y = jnp.asarray([0.0, -0.0, 2.0, 1e-30, 3e38, jnp.inf], jnp.float32)
    np.testing.assert_allclose(support.mgpu_sqrt(y), jnp.sqrt(y), rtol=2e-7)
    assert np.isnan(support.mgpu_sqrt(jnp.float32(-1.0)))


def test_running_reductions_agree_with_the_whole_ones():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 10)), jnp.float32)
    best, index = jnp.full((3, 1), -jnp.inf), jnp.zeros((3, 1), jnp.int32)
    for start in range(0, 10, 4):
        best, index = support.argbest_step(best, index, x[:, start : start + 4], start, 1, True)
    np.testing.assert_allclose(support.logsumexp(x, 1)[:, 0], jax.nn.logsumexp(x, axis=1), rtol=1e-6)
    np.testing.assert_array_equal(index[:, 0], jnp.argmax(x, axis=1))
    np.testing.assert_allclose(support.softmax(x, 1), jax.nn.softmax(x, axis=1), rtol=1e-6)


def test_a_kernel_declares_its_arrays_as_the_spec_does():
    """`rt.kernel`'s arrays are the spec's declarations, in the spec's dtype names."""
    assert support.declared_arrays(("x: bf16[M, K]", "bias: f32[N] as [1, N]", "s: i32[]")) == {
        "x": (jnp.bfloat16, ("M", "K")),
        "bias": (jnp.float32, ("N",), (1, "N")),
        "s": (jnp.int32, ()),
    }
    from pallasgen.analysis.dtypes import DTYPES

    assert {name: jnp.dtype(dtype) for name, dtype in support.SPEC_DTYPES.items()} == {
        name: jnp.dtype(dtype.jnp) for name, dtype in DTYPES.items()
    }


def test_a_kernel_takes_params_of_their_kind_and_refuses_the_rest():
    def k_tpu(x, *, n, s, block_n, interpret):
        return x * n + s

    @support.kernel(
        inputs=("x: f32[N]",),
        outputs=("y: f32[N]",),
        sizes={"N": "size_n"},
        params={"n": jnp.int8, "s": jnp.float32},
        tpu=k_tpu,
    )
    def k(x, *, n=1, s=0.5):
        return x * n + s

    x = jnp.ones(3, jnp.float32)
    np.testing.assert_array_equal(k(x, n=np.int32(2), s=1), np.full(3, 3.0))
    for keywords, error, message in [
        ({"n": 1.0}, TypeError, "k: n must be a Python int (int8), got 1.0"),
        ({"n": 200}, ValueError, "k: n=200 does not fit in int8 (-128 to 127)"),
        ({"s": 10**400}, ValueError, "k: s=1" + "0" * 400 + " is too large for float32"),
        ({"s": 1e39}, ValueError, "k: s=1e+39 is too large for float32"),
        ({"block_n": [8]}, TypeError, "k: block_n is static and must be a Python number, got [8]"),
        ({"block_n": 0}, ValueError, "k: block_n must be a positive int or None, got 0"),
        ({"block_m": 8}, TypeError, "k got an unexpected keyword 'block_m'; it takes n, s, block_n, interpret"),
    ]:
        with pytest.raises(error, match=f"^{re.escape(message)}"):
            k(x, **keywords)
    with pytest.raises(TypeError, match=re.escape("k takes 1 arrays (x), got 2")):
        k(x, x)
    assert np.isinf(k(x, s=float("inf"))).all()
    assert k.options == ("block_n", "interpret") and k.reference(x, n=2).shape == (3,)
    assert k.__name__ == "k" and k.clear_cache() is None


def test_logsumexp_of_rows_holding_inf_or_nan_is_jax_numpys(tmp_path):
    """+inf in a row makes its log-sum-exp +inf, a row of -inf -inf, a NaN NaN: whole, and
    from a kernel's running max and sum over blocks of N (the finish decides, once per row)."""
    x = np.random.default_rng(1).standard_normal((5, 300)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, :] = -np.inf
    x[2, 140] = np.nan
    x[3, 1], x[3, 290] = np.inf, -np.inf
    x = jnp.asarray(x)
    want = jax.nn.logsumexp(x, axis=1, keepdims=True)
    np.testing.assert_array_equal(support.logsumexp(x, 1), want)
    path = tmp_path / "logsumexp_over_steps.py"
    path.write_text(feature_source("logsumexp-over-steps"))
    module = load_module(path, "_logsumexp_over_steps")
    np.testing.assert_allclose(np.asarray(module.k(x)), np.asarray(want)[:, 0], rtol=1e-6)


def test_masks_cover_the_positions_inside_and_none_where_blocks_fit():
    assert support.inside(0, 8, 16) is None
    np.testing.assert_array_equal(support.inside(8, 8, 12), [True] * 4 + [False] * 4)
    mask = support.mask((2, 8), None, support.inside(8, 8, 12))
    assert mask.shape == (2, 8) and int(mask.sum()) == 8
    filled = support.fill_past(jnp.ones((2, 8)), 8, 12, 1, 0.0)
    np.testing.assert_array_equal(filled.sum(axis=1), [4, 4])
    rows = support.fill_past_rows(jnp.ones((2, 128)), 256, 300, 0.0)
    assert int(rows.sum()) == 44
    block = jnp.ones((2, 8))  # where blocks tile the size, a block is left as it is: no select
    assert support.fill_past(block, 8, 16, 1, 0.0, ragged=16 % 8) is block
    assert support.fill_past_rows(block, 8, 16, 0.0, ragged=False) is block


def test_a_program_of_whole_rows_takes_a_warp_per_1024_values_from_4_to_32():
    from pallasgen.runtime import support as rt

    assert [rt.row_warps(v) for v in (1, 2048, 4096, 8192, 32768, 1 << 20)] == [4, 4, 4, 8, 32, 32]


def test_a_dots_blocks_are_halved_till_its_operands_fit_shared_memory_and_its_product_registers(monkeypatch):
    monkeypatch.setattr(support, "gpu_capability", lambda: (9, 0))  # 227 KiB a block

    def operands(block_m, block_k):  # x[M, K] and w[K, N] of bf16, with all of N's 1024 held
        return 2 * (block_m * block_k + block_k * 1024)

    def product(block_m, block_k):
        return block_m * 1024

    def few(block_m, block_k):
        return 1

    # 136 KiB of operands, 204 KiB with Triton's half again, fit; 65536 values do not (at
    # most 32768, and 128 a thread): M is halved, on 4 warps twice.
    assert support.fit_dot_blocks("k", (64, 64), (16, 16), operands, product, 16) == (32, 64)
    assert support.fit_dot_blocks("k", (64, 64), (16, 16), operands, product, 8) == (32, 64)
    assert support.fit_dot_blocks("k", (64, 64), (16, 16), operands, product, 4) == (16, 64)
    # Without the product to hold, K is halved (which frees the most shared memory) instead.
    assert support.fit_dot_blocks("k", (64, 128), (16, 16), operands, few, 4) == (64, 64)
    # At the least blocks a product that spills is kept, up to PRODUCT_VALUES_MOST.
    assert support.fit_dot_blocks("k", (32, 16), (32, 16), operands, product, 4) == (32, 16)
    monkeypatch.setattr(support, "gpu_capability", lambda: (8, 6))  # 99 KiB
    assert support.fit_dot_blocks("k", (64, 64), (16, 16), operands, few, 4) == (64, 16)
    with pytest.raises(ValueError, match=r"k: at its least blocks a Triton program holds 65536 values .* 99 KiB"):
        support.fit_dot_blocks("k", (64, 64), (64, 16), operands, product, 4)


def test_shared_memory_per_block_follows_the_compute_capability(monkeypatch):
    for capability, kib in [((9, 0), 227), ((8, 0), 163), ((8, 9), 99), ((7, 5), 64), (None, 227)]:
        monkeypatch.setattr(support, "gpu_capability", lambda: capability)
        assert support.shared_memory_per_block() == kib * 1024
