"""The Mosaic GPU backend without a GPU: every bundled kernel it takes lowers for CUDA
with `gpu_backend="mosaic_gpu"` to a Mosaic GPU custom call and no Triton one, at
aligned, ragged, small and 1x1 sizes (`jax.export(..., platforms=["cuda"])` lowers
on a CPU-only machine; nothing runs). Kernels it does not take say why, and run on
Triton. From sm_90 on it is the default for kernels with a matrix product."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_cases import (
    ROOT,
    bundled_kernels,
    generated_module,
    is_derived,
    load_module,
    random_array,
    spec_kernel,
    take_gpu_branch,
)
from jax._src.mesh import AbstractDevice

from pallasgen.analysis.fused import is_framed
from pallasgen.analysis.product import find_products
from pallasgen.devices.compile_only import GPU_CORES, GPU_DEVICE_KIND
from pallasgen.backends import backend_named
from pallasgen.runtime import support
from pallasgen.workspace.pipeline import check_source, generate

plgpu = pytest.importorskip("jax.experimental.pallas.mosaic_gpu", reason="jax 0.10.2 imports it only with absl-py")

MOSAIC_CALL = re.compile(r"custom_call @mosaic_gpu")  # @mosaic_gpu_v2 on jax 0.10.2 and 0.12
TRITON_CALL = "__gpu$xla.gpu.triton"  # the target export's safety check knows it by
TRITON = re.compile(r"custom_call @\S*triton")  # the call's target on jax 0.10.2 and 0.12
_H100 = jax.sharding.AbstractMesh(
    (1,),
    ("x",),
    abstract_device=AbstractDevice(device_kind=GPU_DEVICE_KIND, num_cores=GPU_CORES, platform="gpu"),
)
KERNELS = [(module, kernel) for module, kernel in bundled_kernels() if kernel is not None]
# A kernel's Mosaic GPU launcher may be another's, written once: its public function names it (None: refused).
TAKEN = [(m, k) for m, k in KERNELS if getattr(generated_module(m), k)._launchers["mosaic_gpu"][0] is not None]
REFUSED = [(m, k) for m, k in KERNELS if (m, k) not in TAKEN]  # none (a test says so)
# The kernels that write residuals too under jax.grad (`with_residuals`).
SAVING = [(m, k) for m, k in TAKEN if getattr(generated_module(m), k)._residuals]

SIZES = {
    "aligned": {"batch": 2, "rows": 256, "columns": 512, "contracted": 256, "vector": 4096, "head": 128},
    "ragged": {"batch": 3, "rows": 100, "columns": 300, "contracted": 70, "vector": 3001, "head": 72},
    "small": {"batch": 1, "rows": 8, "columns": 16, "contracted": 8, "vector": 5, "head": 16},
    "one": {"batch": 1, "rows": 1, "columns": 1, "contracted": 1, "vector": 1, "head": 1},
}


def _dims(module: str, kernel: str, size: str) -> dict[str, int]:
    """Each dimension's size: the layout's last two are rows and columns, those before
    them batch; a product's contracted dimension; a rank-1 kernel's one dimension. A
    fused kernel's (attention's) columns are a head's: Mosaic GPU holds them whole."""
    decl = spec_kernel(module, kernel)
    layout = max((tuple(a.dims) for a in (*decl.outputs, *decl.inputs)), key=len)
    table = SIZES[size]
    if len(layout) == 1:
        return {layout[0]: table["vector"]}
    columns = table["head"] if is_framed(decl) else table["columns"]
    sizes = {d: table["batch"] for d in layout[:-2]} | {layout[-2]: table["rows"], layout[-1]: columns}
    for product in find_products(decl):
        for dim in {d for a in decl.inputs for d in a.dims} - set(sizes):
            sizes[dim] = table["contracted"]
    return sizes


DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32, "i8": jnp.int8}


def _shapes(module: str, kernel: str, size: str) -> list[tuple[tuple[int, ...], str]]:
    """Each input's (shape, spec dtype) at a size class."""
    sizes = _dims(module, kernel, size)
    return [(tuple(sizes[d] for d in a.dims), a.dtype) for a in spec_kernel(module, kernel).inputs]


def _exported_text(module: str, kernel: str, size: str, **keywords) -> str:
    args = [jax.ShapeDtypeStruct(shape, DTYPES[dtype]) for shape, dtype in _shapes(module, kernel, size)]
    return _cuda_text(getattr(generated_module(module), kernel), args, **keywords)


def _cuda_text(function, args, **keywords) -> str:
    """The StableHLO of `function` exported for CUDA (Triton's calls allowed)."""
    disabled = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
    call = jax.jit(lambda *arrays: function(*arrays, interpret=False, **keywords))
    with jax.sharding.use_abstract_mesh(_H100):  # jax 0.12 lowers Triton only for a known GPU
        return jax.export.export(call, platforms=["cuda"], disabled_checks=disabled)(*args).mlir_module()


def taken_at(sizes) -> list:
    """(module, kernel, size) for each taken kernel and size; a kernel derived for jax.grad
    at its ragged sizes only (the gradient tests run it end to end)."""
    return [
        pytest.param(m, k, size, id=f"{m}.{k}-{size}")
        for m, k in TAKEN
        for size in sizes
        if size == "ragged" or not is_derived(m, k)
    ]


@pytest.mark.parametrize("module, kernel, size", taken_at(SIZES))
def test_kernel_lowers_to_mosaic_gpu_and_no_triton(module, kernel, size):
    text = _exported_text(module, kernel, size, gpu_backend="mosaic_gpu")
    assert MOSAIC_CALL.search(text), "no Mosaic GPU custom call"
    assert not TRITON.search(text)


@pytest.mark.parametrize("kernel", ["attention", "attention_backward_dkdv"])
def test_compiled_a_computed_product_operand_stays_in_registers_and_accumulates_in_place(kernel, monkeypatch):
    """Compiled (not interpreted), p @ v reads p from registers, not from a tile of shared
    memory it was first written to, and adds into the running accumulator (ACC.init);
    Mosaic GPU's interpreter runs neither, so it keeps the tile and the addition."""
    operands, initialised = [], []
    wgmma, init = plgpu.wgmma, plgpu.ACC.init
    monkeypatch.setattr(plgpu, "wgmma", lambda acc, a, b, **k: (operands.append(a), wgmma(acc, a, b, **k))[1])
    monkeypatch.setattr(plgpu.ACC, "init", lambda value: (initialised.append(value), init(value))[1])
    _exported_text("attention", kernel, "ragged", gpu_backend="mosaic_gpu")
    from_registers = [a for a in operands if isinstance(a, jax.Array)]  # a traced value, where a Ref is a tile
    assert len(from_registers) == {"attention": 1, "attention_backward_dkdv": 2}[kernel]
    assert len(initialised) == len(from_registers)


# A Mosaic GPU kernel stores a block that is contiguous in its array (a vector's block)
# with one cp.async.bulk, whose byte count it clamps at the array's end; PTX takes only
# multiples of 16 bytes. Vectors of 5, 1 and 3,000,001 f32 stored so lost their last
# element on an H200 (issue 33). Every other array's strides Mosaic GPU checks itself.
# The kernels checked: those with a vector output, or a scalar one (whose programs store
# partial results as a vector).
VECTOR_OUTPUTS = [(m, k) for m, k in TAKEN if any(len(a.dims) <= 1 for a in spec_kernel(m, k).outputs)]
RESULT_TENSOR = re.compile(r"tensor<((?:\d+x)*)[a-z]+(\d+)>")


def _mosaic_gpu_results(text: str) -> list[tuple[tuple[int, ...], int]]:
    """(shape, bits of an element) of each result of each Mosaic GPU call in `text`."""
    results = []
    for line in text.splitlines():
        if MOSAIC_CALL.search(line):
            for dims, bits in RESULT_TENSOR.findall(line.rsplit(") -> ", 1)[1]):
                results.append((tuple(int(d) for d in dims.split("x") if d), int(bits)))
    return results


@pytest.mark.parametrize(
    "module, kernel, size",
    [p for p in taken_at(["ragged", "small", "one"]) if tuple(p.values[:2]) in VECTOR_OUTPUTS],
)
def test_each_vector_a_mosaic_gpu_kernel_stores_is_whole_16_byte_chunks(module, kernel, size):
    results = _mosaic_gpu_results(_exported_text(module, kernel, size, gpu_backend="mosaic_gpu"))
    assert results, "no Mosaic GPU call"
    assert not [
        (shape, bits) for shape, bits in results if len(shape) == 1 and shape[0] * bits % 128
    ], "a vector's last block is stored as a bulk copy of a part of 16 bytes"


@pytest.mark.parametrize(
    "module, kernel", [("matmul", "matmul_bias_gelu"), ("norms", "layer_norm"), ("attention", "attention")]
)
def test_grad_with_mosaic_gpu_runs_its_backward_kernels_on_mosaic_gpu_too(module, kernel):
    """`gpu_backend` reaches the kernels that jax.grad runs: the saving forward kernel and
    every backward kernel lower to Mosaic GPU, none to Triton."""
    generated = generated_module(module)
    forward = getattr(generated, kernel)
    args = [jax.ShapeDtypeStruct(shape, DTYPES[dtype]) for shape, dtype in _shapes(module, kernel, "ragged")]

    def loss(*arrays, **keywords):
        return sum(jnp.sum(jnp.asarray(out, jnp.float32)) for out in jax.tree.leaves(forward(*arrays, **keywords)))

    floats = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
    text = _cuda_text(jax.grad(loss, argnums=floats), args, gpu_backend="mosaic_gpu")
    assert len(MOSAIC_CALL.findall(text)) > 1, "the backward kernels are not on Mosaic GPU"
    assert not TRITON.search(text)


# Mosaic GPU's interpreter (plgpu.InterpretGPUParams, exported from jax 0.12) runs the
# kernels on CPU with TMA's bounds and the shared memory simulated: numerics without a GPU.
INTERPRETER = getattr(plgpu, "InterpretGPUParams", None)


def interpreted(test):
    """A test in the interpreter: on the jax lines that have it, whole under `--share`."""
    skipped = pytest.mark.skipif(INTERPRETER is None, reason="Mosaic GPU's interpreter is public from jax 0.12")
    return pytest.mark.jax_line(skipped(test))


# A test that lowers for CUDA on every jax line and runs the interpreter where there is one:
# whole on each line under `--share`, so that no case loses its interpreted half.
lowered_then_interpreted = pytest.mark.jax_line


@interpreted
@pytest.mark.parametrize("module, kernel, size", taken_at(["ragged", "one"]))
def test_kernel_interpreted_on_mosaic_gpu_agrees_with_its_reference(module, kernel, size, monkeypatch):
    generated = generated_module(module)
    take_gpu_branch(monkeypatch, generated)
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(random_array(rng, dtype, shape)) for shape, dtype in _shapes(module, kernel, size)]
    got = jax.tree.leaves(getattr(generated, kernel)(*arrays, gpu_backend="mosaic_gpu", interpret=INTERPRETER()))
    want = jax.tree.leaves(getattr(generated, kernel).reference(*arrays))
    depth = max((shape[-1] for shape, _ in _shapes(module, kernel, size)), default=1)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
            continue
        # One rounding of a 16-bit output, or sums of `depth` products in f32.
        rtol = 2.0**-7 if w.dtype.itemsize == 2 else 2.0**-20 * depth
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, np.abs(w).max(initial=0)))


@pytest.mark.parametrize("module, kernel", SAVING, ids=[f"{m}.{k}" for m, k in SAVING])
def test_a_kernel_writing_its_residuals_lowers_to_mosaic_gpu(module, kernel):
    """`with_residuals` (the forward pass under jax.grad): every output's and residual's
    tile copied out, on Mosaic GPU alone."""
    args = [jax.ShapeDtypeStruct(shape, DTYPES[dtype]) for shape, dtype in _shapes(module, kernel, "ragged")]
    text = _cuda_text(getattr(generated_module(module), kernel).with_residuals, args, gpu_backend="mosaic_gpu")
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)


def _epilogue_tiles(module, function, args, monkeypatch) -> list:
    """The tiles a product's kernel allocates for its epilogue (`pl.run_scoped(epilogue,
    ...)`) as `function` lowers for CUDA: each an SMEM type, or None where not allocated."""
    scoped = []
    run_scoped = module.pl.run_scoped

    def recorded(body, *types, **keywords):
        if getattr(body, "__name__", None) == "epilogue":  # not the pipeline's own
            scoped.append(types)
        return run_scoped(body, *types, **keywords)

    monkeypatch.setattr(module.pl, "run_scoped", recorded)
    _cuda_text(function, args, gpu_backend="mosaic_gpu")
    assert scoped and all(types == scoped[0] for types in scoped)  # each tracing alike
    return list(scoped[0])


# The single products among them (attention's two hold only a row of running values).
PRODUCTS_SAVING = [(m, k) for m, k in SAVING if len(find_products(spec_kernel(m, k))) == 1]


@pytest.mark.parametrize("module, kernel", PRODUCTS_SAVING, ids=[f"{m}.{k}" for m, k in PRODUCTS_SAVING])
def test_a_products_output_tiles_take_its_pipelines_shared_memory_and_a_residuals_only_under_jax_grad(
    module, kernel, monkeypatch
):
    """A product's output tiles are allocated once its pipeline is done, in the shared
    memory its K blocks held, and a residual's only where the launcher writes residuals
    (an f32 tile held beside the K blocks halved matmul_bias_gelu's speed on an H200:
    one program a multiprocessor instead of two)."""
    generated, function = generated_module(module), getattr(generated_module(module), kernel)
    args = [jax.ShapeDtypeStruct(shape, DTYPES[dtype]) for shape, dtype in _shapes(module, kernel, "ragged")]
    plain = _epilogue_tiles(generated, function, args, monkeypatch)
    saving = _epilogue_tiles(generated, function.with_residuals, args, monkeypatch)
    outputs = len(function.output_names)
    assert len(plain) == len(saving) > outputs  # one tile an output and residual
    assert all(t is not None for t in plain[:outputs]) and all(t is None for t in plain[outputs:])
    assert all(t is not None for t in saving)


def test_a_products_output_tile_reuses_the_shared_memory_of_its_pipeline_in_mosaic_gpus_lowering():
    """batched_matmul at six stages: 192 KiB of K blocks and a 64 KiB f32 output tile,
    more than a block's 227 KiB together, lower (Mosaic GPU counted 262,200 bytes when the
    tile was a scratch of the whole kernel)."""
    args = [jax.ShapeDtypeStruct((2, 256, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((2, 1024, 256), jnp.bfloat16)]
    text = _cuda_text(generated_module("matmul").batched_matmul, args, gpu_backend="mosaic_gpu", mgpu_stages=6)
    assert MOSAIC_CALL.search(text)


def test_a_batched_bf16_product_with_an_f32_output_leaves_room_for_two_programs_a_multiprocessor():
    """batched_matmul at its default blocks and stages: its 64 KiB f32 output tile takes the
    memory of its 64 KiB of K blocks (the sum, 128 KiB, let one program run on an H200)."""
    checked = next(
        k for k in check_source((ROOT / "specs" / "matmul.pallas").read_text(), "") if k.kernel.name == "batched_matmul"
    )
    mosaic_gpu = backend_named("mosaic_gpu")
    used = mosaic_gpu.memory_bytes(checked, {})
    assert used == 64 * 1024 and 2 * used <= mosaic_gpu.memory_budget


@interpreted
@pytest.mark.parametrize("module, kernel", SAVING, ids=[f"{m}.{k}" for m, k in SAVING])
def test_residuals_interpreted_on_mosaic_gpu_equal_the_tpu_kernels(module, kernel, monkeypatch):
    """The outputs and residuals `with_residuals` gives on Mosaic GPU (interpreted) against
    the TPU kernel's (interpreted): the residuals have no reference of their own."""
    function = getattr(generated_module(module), kernel)
    rng = np.random.default_rng(0)
    shapes = _shapes(module, kernel, "ragged")
    arrays = [jnp.asarray(random_array(rng, dtype, shape)) for shape, dtype in shapes]
    want = function.with_residuals(*arrays, interpret=True)
    take_gpu_branch(monkeypatch, generated_module(module))
    got = function.with_residuals(*arrays, gpu_backend="mosaic_gpu", interpret=INTERPRETER())
    assert len(got) == len(want) > len(function.output_names)
    depth = max(shape[-1] for shape, _ in shapes)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        rtol = 2.0**-7 if w.dtype.itemsize == 2 else 2.0**-20 * depth
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, np.abs(w).max(initial=0)))


@interpreted
@pytest.mark.parametrize("n", [5, 1, 3001])
def test_add_vectors_on_mosaic_gpu_is_exact_to_the_last_element(n, monkeypatch):
    """The launcher pads the vectors to whole blocks and slices the results back, exact to
    the last element. (The interpreter stores a partial last block exactly, padded or not;
    test_each_vector_a_mosaic_gpu_kernel_stores_is_whole_16_byte_chunks checks what the
    GPU's bulk copy of it needs.)"""
    generated = generated_module("add_vectors")
    take_gpu_branch(monkeypatch, generated)
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
    z = generated.add_vectors(x, y, gpu_backend="mosaic_gpu", interpret=INTERPRETER())
    np.testing.assert_array_equal(np.asarray(z), np.asarray(x) + np.asarray(y))


def test_mosaic_gpu_takes_the_elementwise_kernels_and_plain_products():
    taken = {k for _, k in TAKEN}
    assert {"add_vectors", "bias_gelu", "leaky", "giou", "add_i32", "mul_f32"} <= taken
    assert {"matmul", "matmul_bias_gelu", "linear", "batched_matmul", "scores", "matmul_int8"} <= taken


def test_mosaic_gpu_takes_relu_floor_and_8_bit_arithmetic():
    """relu is spelled as the maximum it wraps, floor from round, 8-bit arithmetic in i32."""
    assert {"matmul_relu", "quantize_rows", "add_i8", "mul_i8"} <= {k for _, k in TAKEN}


def test_mosaic_gpu_takes_the_kernels_that_reduce_rows_or_columns():
    taken = {k for _, k in TAKEN}
    assert {"softmax", "log_softmax", "layer_norm", "rms_norm", "cross_entropy"} <= taken
    assert {"argmax_rows", "argmax_blocked", "argmin_rows", "quantize_rows_int8", "argmax_f32", "argmax_i32"} <= taken
    assert {"column_sums", "argmax_i8"} <= taken


def test_mosaic_gpu_takes_backward_kernels_with_index_size_or_a_broadcast_vector():
    taken = {k for _, k in TAKEN}
    assert {"cross_entropy_backward", "quantize_rows_int8_backward", "column_sums_backward"} <= taken
    assert {"layer_norm_backward", "rms_norm_backward"} <= taken
    assert {("matmul", "matmul_relu"), ("matmul", "matmul_bias_gelu"), ("norms", "layer_norm")} <= set(SAVING)
    assert {"scores_backward_epilogue", "gqa_backward_over_r"} <= taken


def test_mosaic_gpu_takes_a_fused_product_as_kernels_in_turn():
    """A computed operand first, a reduced product's result written out first (stages)."""
    assert {"matmul_softmax", "rmsnorm_matmul"} <= {k for _, k in TAKEN}


def test_mosaic_gpu_takes_reductions_to_a_scalar():
    """Partial results per program, combined by the launcher."""
    assert {"equal_count", "equal_count_f32", "equal_count_i32", "equal_count_i8"} <= {k for _, k in TAKEN}


def test_mosaic_gpu_takes_every_bundled_kernel_and_those_derived_for_jax_grad():
    """Issue 22's bar: no bundled kernel keeps Triton under gpu_backend="mosaic_gpu" (a
    kernel refused would say why in its docstring: test_a_kernel_mosaic_gpu_cannot_lower_...)."""
    why = {f"{m}.{k}": getattr(generated_module(m), k).__doc__.split("either way: ")[-1][:120] for m, k in REFUSED}
    assert not why


def test_a_refused_kernel_with_mosaic_gpu_runs_on_triton(tmp_path):
    module = _module_of("in x: f32[M, N]\nout y: f32[M, N]\ny = x % 3.0", tmp_path, "refused")
    text = _cuda_text(module.k, [jax.ShapeDtypeStruct((30, 300), jnp.float32)], gpu_backend="mosaic_gpu")
    assert TRITON.search(text) and not MOSAIC_CALL.search(text)


@pytest.mark.parametrize("capability", [None, (8, 0), (9, 0), (10, 0)])
def test_a_product_runs_on_mosaic_gpu_from_sm_90_on_unless_the_call_names_triton(capability, monkeypatch):
    """The default (gpu_backend None) for a kernel with a matrix product: Mosaic GPU from
    Hopper on (faster there on an H200), Triton before it and where no GPU says (an export)."""
    monkeypatch.setattr(support, "gpu_capability", lambda: capability)
    on_mosaic_gpu = capability is not None and capability >= (9, 0)
    for module, kernel in [("matmul", "matmul_bias_gelu"), ("matmul", "batched_matmul"), ("attention", "attention")]:
        getattr(generated_module(module), kernel).clear_cache()  # a trace read the last GPU's
        text = _exported_text(module, kernel, "small")
        assert bool(MOSAIC_CALL.search(text)) == on_mosaic_gpu != bool(TRITON.search(text))
        text = _exported_text(module, kernel, "small", gpu_backend="triton")
        assert TRITON.search(text) and not MOSAIC_CALL.search(text)


@pytest.mark.parametrize("module, kernel", [("softmax", "softmax"), ("norms", "layer_norm")])
def test_a_row_wise_kernel_runs_on_triton_unless_the_call_names_mosaic_gpu(module, kernel, monkeypatch):
    """Triton ran softmax, the norms and cross-entropy faster than Mosaic GPU on an H200."""
    monkeypatch.setattr(support, "gpu_capability", lambda: (9, 0))
    getattr(generated_module(module), kernel).clear_cache()  # a trace read the last GPU's
    text = _exported_text(module, kernel, "small")
    assert TRITON.search(text) and not MOSAIC_CALL.search(text)
    text = _exported_text(module, kernel, "small", gpu_backend="mosaic_gpu")
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)


@pytest.mark.parametrize("value", ["mosaic", "Triton", "", 1])
def test_an_unknown_gpu_backend_is_a_clear_error(value):
    module = generated_module("add_vectors")
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match=r'add_vectors: gpu_backend must be "triton" or "mosaic_gpu" or None, got'):
        module.add_vectors(x, x, gpu_backend=value)


def test_without_mosaic_gpu_importable_only_a_cuda_lowering_asks_for_absl(monkeypatch):
    """jax 0.10.2 imports Mosaic GPU only with absl-py: the module still imports and runs
    elsewhere, and lowering for CUDA says what to install."""
    module = generated_module("add_vectors")
    monkeypatch.setattr(module.rt, "plgpu", None)  # the runtime checks it
    x = jnp.arange(4, dtype=jnp.float32)
    np.testing.assert_array_equal(module.add_vectors(x, x, gpu_backend="mosaic_gpu"), 2 * x)
    with pytest.raises(ImportError, match=r'add_vectors: gpu_backend="mosaic_gpu" needs absl-py'):
        _exported_text("add_vectors", "add_vectors", "one", gpu_backend="mosaic_gpu")


def test_spec_names_do_not_clash_with_the_mosaic_gpu_launchers_own(tmp_path):
    """The launcher names each padded size; an input may already have that name."""
    spec = "kernel k {\n    in  padded_m, padded_n: f32[M, N]\n    out z: f32[M, N]\n    z = padded_m + padded_n\n}\n"
    path = tmp_path / "clash.py"
    path.write_text(generate(spec, "clash.pallas", "clash.pallas"))
    module = load_module(path, "_mosaic_gpu_clash")
    args = [jax.ShapeDtypeStruct((100, 300), jnp.float32)] * 2
    call = jax.jit(lambda a, b: module.k(a, b, gpu_backend="mosaic_gpu", interpret=False))
    assert MOSAIC_CALL.search(jax.export.export(call, platforms=["cuda"])(*args).mlir_module())


def _module_of(spec_body: str, tmp_path, name: str):
    """A module generated from one kernel `k` with this body."""
    body = spec_body.replace("\n", "\n    ")
    path = tmp_path / f"{name}.py"
    path.write_text(generate(f"kernel k {{\n    {body}\n}}\n", f"{name}.pallas", f"{name}.pallas"))
    return load_module(path, f"_mosaic_gpu_{name}")


REFUSALS = {
    "float-modulo": ("in x: f32[M, N]\nout y: f32[M, N]\ny = x % 3.0", "a float % has no Mosaic GPU lowering"),
    "bool-array": ("in x: bool[M, N]\nout y: f32[M, N]\ny = f32(x)", "bool arrays"),
    "scalar-input": ("in s: f32[]\nin x: f32[N]\nout y: f32[N]\ny = x * s", "0-d input"),
    "two-reduced-dimensions": (
        "in x: f32[M, N]\nout y: f32[M]\nout z: f32[N]\ny = sum(x, N)\nz = max(x, M)",
        "reductions over M and N in one kernel",
    ),
    "vector-output-beside-a-scalar-reduction": (
        "in x: f32[N]\nout y: f32[N]\ny = x - max(x, N)",
        "an output with a dimension beside",
    ),
    "product-output-tiles-past-shared-memory": (
        "in x: f32[M, K]\nin w: f32[K, N]\nout a, b, c: f32[M, N]\na = x @ w\nb = a * 2.0\nc = a + 1.0",
        "a product's output tiles take 192 KiB",
    ),
    "outer-reduction-of-an-input-without-it": (
        "in x: f32[R, M, N]\nin w: f32[M, N]\nout y: f32[M, N]\ny = sum(x * w, R)",
        "a reduction over R of an input without R",
    ),
    "reduction-of-a-value-without-the-kept-dimension": (
        "in z: f32[M, N]\nin x: f32[N]\nout y: f32[M, N]\ny = z * sum(x, N)",
        "sum() over N of a value without M",
    ),
    "softmax-call": ("in x: f32[M, N]\nout y: f32[M, N]\ny = softmax(x, N)", "softmax() is not on Mosaic GPU yet"),
    "output-broadcast-over-its-reduced-dimension": (  # its output pass had no input of M: an assertion failed
        "in x: f32[M, N]\nout y: f32[M, N]\ny = sum(x, M)",
        "y is broadcast over M, which its value lacks",
    ),
    # Two products (attention's form): the fused form, not kernels in turn.
    "fused-f32-products": (
        "in q: f32[S, D]\nin k, v: f32[T, D]\nout o: f32[S, D]\nlet s = q @ k.T\nlet p = exp(s - max(s, T))\n"
        "o = (p @ v) / sum(p, T)\nblock S = 64, T = 64\ngrad none",
        "a fused product of f32",
    ),
    "fused-argmax-over-the-swept-dimension": (
        "in q: bf16[S, D]\nin k, v: bf16[T, D]\nout o: f32[S, D]\nout i: i32[S]\nlet s = q @ k.T\n"
        "let p = exp(s - max(s, T))\no = (p @ v) / sum(p, T)\ni = argmax(s, T)\nblock S = 64, T = 64\ngrad none",
        "argmax() over the swept",
    ),
    "index-in-a-product-epilogue": (
        "in x: bf16[M, K]\nin y: bf16[K, N]\nout z: f32[M, N]\nz = where(index(M) >= index(N), x @ y, 0.0)",
        "index() in a product's epilogue",
    ),
    "kept-index-in-reduction": (
        "in x: f32[M, N]\nout y: f32[M]\ny = sum(x, N) + f32(index(M))",
        "index(M) in a kernel that reduces N",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_kernel_mosaic_gpu_cannot_lower_keeps_triton_and_says_why(case, tmp_path):
    body, reason = REFUSALS[case]
    module = _module_of(body, tmp_path, case.replace("-", "_"))
    assert not hasattr(module, "_k_mosaic_gpu")
    assert reason in re.search(r"This kernel runs on Triton either way: (.+)", module.k.__doc__).group(1)


TAKEN_SPECS = {
    "f16-transposed-lhs-residual": (
        "in x: f16[K, M]\nin w: f16[K, N]\nin r: f32[M, N]\nout y: f16[M, N]\ny = (x.T @ w) * 0.5 + r",
        {"M": 100, "N": 200, "K": 40},
    ),
    "row-vector-and-param": (
        "in x: f32[M, N]\nin s: f32[M]\nout y: f32[M, N]\nparam t: f32 = 2.0\ny = tanh(x * s) * t",
        {"M": 70, "N": 50},
    ),
    "vector-i32": ("in x, y: i32[N]\nout z: i32[N]\nz = maximum(x, y) * 3", {"N": 1000}),
    # Three passes over a ragged N (the mean, the variance, the centred maximum), a row
    # let computed between them, a column vector, a param and index() of the columns.
    "three-passes-ragged": (
        "in x: f32[M, N]\nin w: f32[N]\nout y: f32[M, N]\nout top: f32[M]\nparam t: f32 = 0.5\n"
        "let mu = mean(x, N)\nlet v = mean((x - mu) * (x - mu), N) + t\n"
        "top = max((x - mu) * rsqrt(v) + f32(index(N)) * 0.001, N)\ny = (x - mu) * w - top",
        {"M": 70, "N": 300},
    ),
    # A row's minimum at a position past the first block; its first index, and the
    # number of positions holding it: ties across blocks keep the earlier one.
    "argmin-and-count-ties": (
        "in x: i32[M, N]\nout i: i32[M]\nout c: i32[M]\ni = argmin(x, N)\nc = sum(i32(x == min(x, N)), N)",
        {"M": 65, "N": 333},
    ),
    "logsumexp-bf16": ("in x: bf16[M, N]\nout y: f32[M]\ny = logsumexp(f32(x), N)", {"M": 3, "N": 1000}),
    # 8-bit values reduced (in i32, as every integer reduction): a maximum narrowed back to
    # i8 and a sum; arithmetic on them would be refused.
    "int8-reductions": (
        "in x: i8[M, N]\nout m: i8[M]\nout s: i32[M]\nm = max(x, N)\ns = sum(x, N)",
        {"M": 70, "N": 300},
    ),
    # The columns reduced over a ragged M (several blocks of rows): a column vector kept,
    # a row vector swept, the first index of each column's maximum, and an [M, N] output.
    "columns-over-ragged-rows": (
        "in x: f32[M, N]\nin r: f32[M]\nin c: f32[N]\nout i: i32[N]\nout s: f32[N]\nout y: f32[M, N]\n"
        "i = argmax(x * r, M)\nlet mu = mean(x, M) + c\ns = logsumexp(x - mu, M)\ny = (x - mu) * r + f32(index(M))",
        {"M": 300, "N": 70},
    ),
    # Reductions to scalars over a ragged N of several programs' blocks: a sum of a
    # computed value with index() and a param, a mean (exp(0) past N if not masked), a bf16
    # maximum, a minimum scaled.
    "scalar-reductions": (
        "in x: f32[N]\nin y: bf16[N]\nout s, e, a: f32[]\nout m: bf16[]\nparam t: f32 = 2.0\n"
        "s = sum(x * f32(index(N)) * t, N)\ne = mean(exp(x), N) - 1.0\nm = max(y, N)\na = min(x, N) * t",
        {"N": 20000},
    ),
    # A product with two outputs (as one that writes its accumulator for jax.grad too):
    # each output's tile copied out.
    "product-with-two-outputs": (
        "in x: bf16[M, K]\nin w: bf16[K, N]\nin b: f32[N]\nout z: bf16[M, N]\nout a: f32[M, N]\n"
        "a = x @ w\nz = relu(a + b)",
        {"M": 100, "N": 200, "K": 70},
    ),
    # Rank 4: a program per element of the batch dimensions, and inputs that lack some of
    # them or of the last two (broadcast), a size() of a batch dimension.
    "rank-4-broadcasts": (
        "in x: f32[A, B, M, N]\nin s: f32[B, N]\nin r: f32[A, M]\nout y: bf16[A, B, M, N]\nparam t: f32 = 2.0\n"
        "y = bf16(x * s + r * t + f32(size(B)))",
        {"A": 2, "B": 3, "M": 70, "N": 50},
    ),
    # Reductions over a dimension before the last two (whole tiles carried) with a batch
    # dimension, a mean of a computed value, a maximum narrowed to bf16, and an input
    # without the reduced dimension read after it.
    "reductions-before-the-last-two": (
        "in x: f32[B, R, M, N]\nin w: f32[B, M, N]\nout y: f32[B, M, N]\nout z: bf16[B, M, N]\nparam t: f32 = 2.0\n"
        "y = mean(x * t, R) + w\nz = bf16(max(x, R) - min(x, R) * f32(size(R)))",
        {"B": 2, "R": 5, "M": 70, "N": 300},
    ),
    # index() and size() in an elementwise kernel's ragged blocks; a vector assigned to an
    # output, broadcast.
    "index-size-and-broadcast": (
        "in x: f32[M, N]\nin c: f32[N]\nout y, z: f32[M, N]\n"
        "y = x + f32(index(M) * size(N) + index(N)) / f32(size(M))\nz = c",
        {"M": 70, "N": 300},
    ),
    # size() of the swept and of the kept dimension in a kernel that reduces rows.
    "sizes-in-a-sweep": (
        "in x: f32[M, N]\nout y: f32[M, N]\ny = x - sum(x, N) / f32(size(N)) + f32(size(M))",
        {"M": 70, "N": 300},
    ),
    # A fused product in three kernels: its computed, transposed operand (with a let and
    # a param), the product, then a softmax of it and a row statistic.
    # An output read by name in a pass (a let of that name in its kernel) and written after.
    "output-read-by-a-reduction": (
        "in x: f32[M, N]\nout y: f32[M, N]\nout s: f32[M]\ny = x * 2.0\ns = sum(y, N)",
        {"M": 70, "N": 300},
    ),
    "computed-operand-then-softmax": (
        "in x: f32[M, K]\nin w: f32[N, K]\nout y: f32[M, N]\nout s: f32[M]\nparam t: f32 = 0.5\n"
        "let h = x * t\nlet p = (h - 1.0) @ w.T\ny = softmax(p, N)\ns = max(p, N) * t",
        {"M": 70, "N": 300, "K": 40},
    ),
    # argmax, argmin and logsumexp to scalars over several programs' blocks and a ragged
    # N: each best value twice (ties in different programs keep the first position).
    "scalar-argbest-ties-and-logsumexp": (
        "in x: f32[N]\nin y: i32[N]\nout i, j: i32[]\nout l: f32[]\ni = argmax(x, N)\nj = argmin(y, N)\n"
        "l = logsumexp(x * 2.0, N)",
        {"N": 20001},
    ),
    # Reductions to scalars of other reductions' results: kernels in turn, the inner
    # results passed on as 0-d inputs, as is a 0-d input of the spec.
    "nested-scalar-reductions": (
        "in x: f32[N]\nin s: f32[]\nout v, w: f32[]\n"
        "v = sum((x - mean(x, N)) * (x - mean(x, N)), N) * s\nw = max(x - min(x, N) * s, N)",
        {"N": 20001},
    ),
    # A fused kernel (causal attention over a ragged T) whose output is a softmax over a
    # dimension held whole, E, padded from 24 to 64: its padding takes no share.
    "attention-then-softmax-over-a-whole-dimension": (
        "in q: bf16[S, D]\nin k: bf16[T, D]\nin v: bf16[T, E]\nout y: f32[S, E]\n"
        "let s = where(index(S) >= index(T), q @ k.T, -inf)\ny = softmax(softmax(s, T) @ v, E)\n"
        "block S = 64, T = 64",
        {"S": 70, "T": 100, "D": 8, "E": 24},
    ),
    # One product reduced over blocks of T (f32 as TF32; bf16): kernels in turn, the
    # scores written out between them.
    "one-product-logsumexp-over-a-swept-dimension": (
        "in q: f32[S, D]\nin k: f32[T, D]\nout y: f32[S]\ny = logsumexp(q @ k.T, T)\nblock S = 64, T = 64",
        {"S": 70, "T": 100, "D": 24},
    ),
    "one-product-argmax-over-a-swept-dimension": (
        "in q: bf16[S, D]\nin k: bf16[T, D]\nout i: i32[S]\ni = argmax(q @ k.T, T)\nblock S = 64, T = 64",
        {"S": 70, "T": 100, "D": 24},
    ),
    # Attention with its queries held whole: no parallel dimension to share out, so one
    # warpgroup computes the program's tiles beside the one that copies the key blocks in.
    "attention-queries-held-whole": (
        "in q: bf16[B, S, D]\nin k, v: bf16[B, T, D]\nout o: bf16[B, S, D]\n"
        "o = softmax(q @ k.T, T) @ v\nblock B = 1, T = 64",
        {"B": 2, "S": 40, "T": 100, "D": 64},
    ),
    # 8-bit values to scalars: products wrap in i8 before the i32 sum; a maximum in i8.
    "int8-scalar-reductions": (
        "in x: i8[N]\nout s: i32[]\nout m: i8[]\ns = sum(x * x, N)\nm = max(x + 1, N)",
        {"N": 9000},
    ),
}


@lowered_then_interpreted
@pytest.mark.parametrize("case", list(TAKEN_SPECS))
def test_more_kernels_lower_to_mosaic_gpu_and_agree_in_its_interpreter(case, tmp_path, monkeypatch):
    body, sizes = TAKEN_SPECS[case]
    module = _module_of(body, tmp_path, case.replace("-", "_"))
    decl_inputs = [line.split(":") for line in body.splitlines() if line.startswith("in ")]
    shapes = []
    for names, kind in decl_inputs:
        dtype, dims = kind.strip().rstrip("]").split("[")
        dims = [d.strip() for d in dims.split(",") if d.strip()]
        shapes += [(tuple(sizes[d] for d in dims), dtype)] * len(names.split(","))
    args = [jax.ShapeDtypeStruct(shape, DTYPES[dtype]) for shape, dtype in shapes]
    call = jax.jit(lambda *arrays: module.k(*arrays, gpu_backend="mosaic_gpu", interpret=False))
    text = jax.export.export(call, platforms=["cuda"])(*args).mlir_module()
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)
    if INTERPRETER is None:
        return
    take_gpu_branch(monkeypatch, module)
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(random_array(rng, dtype, shape)) for shape, dtype in shapes]
    if "ties" in case and arrays[0].ndim == 1:  # each best value twice, in different programs' blocks
        arrays[0] = arrays[0].at[9000].set(1000).at[15000].set(1000)
        arrays[1] = arrays[1].at[12000].set(-(2**30)).at[19000].set(-(2**30))
    elif "ties" in case:  # each row's minimum twice, past the first block
        arrays[0] = arrays[0].at[:, 200].set(-1000).at[:, 300].set(-1000)
    got = jax.tree.leaves(module.k(*arrays, gpu_backend="mosaic_gpu", interpret=INTERPRETER()))
    want = jax.tree.leaves(module.k.reference(*arrays))
    for g, w in zip(got, want):
        rtol = 2.0**-10 if w.dtype.itemsize == 2 else 1e-5
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=rtol * 10)


def test_gpu_check_takes_the_gpu_backend_to_check(monkeypatch):
    """The hardware run that would make Mosaic GPU the default is one command."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    assert gpu_check.parse(["--gpu-backend", "mosaic_gpu", "small"]) == (["small"], "mosaic_gpu", (0, 1), False)
    assert gpu_check.parse(["ragged"]) == (["ragged"], "triton", (0, 1), False)
    with pytest.raises(SystemExit, match="--gpu-backend takes triton or mosaic_gpu"):
        gpu_check.parse(["--gpu-backend", "mosaic"])


def test_gpu_check_shares_the_kernels_among_slices(monkeypatch):
    """`--slice I/N` gives each of N processes every N-th kernel: together, every kernel once."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    assert gpu_check.parse(["--slice", "2/8", "--gpu-backend", "mosaic_gpu", "--default-blocks"]) == (
        list(gpu_check.SIZE_CLASSES),
        "mosaic_gpu",
        (2, 8),
        True,
    )
    for wrong in (["--slice", "8/8"], ["--slice", "1"], ["--slice"], ["--slice", "a/2"]):
        with pytest.raises(SystemExit, match="--slice takes I/N"):
            gpu_check.parse(wrong)
    with pytest.raises(SystemExit, match="unknown size class 'tiny'"):
        gpu_check.parse(["tiny"])


# Values where floor, ceil and relu are easily wrong: signed zeros, halves (round goes to
# even), whole numbers past 2**23, infinities and NaN; 8-bit values that wrap.
EDGE_FLOATS = [-0.0, 0.0, -0.3, 0.3, -0.5, 0.5, -0.7, 0.7, -1.5, 1.5, 2.5, -2.5, 1e-40, -1e-40]
EDGE_FLOATS += [8388609.0, -8388609.0, 1e30, -1e30, float("inf"), -float("inf"), float("nan"), 3.99999]
EDGE_SPECS = {
    "floor-ceil-relu-f32": (
        "in x: f32[M, N]\nout a, b, c: f32[M, N]\na = floor(x)\nb = ceil(x)\nc = relu(x)",
        np.array([EDGE_FLOATS, [-v for v in EDGE_FLOATS], [v * 0.25 for v in EDGE_FLOATS]], np.float32),
    ),
    "floor-ceil-relu-bf16": (
        "in x: bf16[M, N]\nout a, b, c: bf16[M, N]\na = floor(x)\nb = ceil(x - 0.5)\nc = relu(x) * 2.0",
        np.array([EDGE_FLOATS, [v * 3.0 for v in EDGE_FLOATS]], jnp.bfloat16),
    ),
    "int8-arithmetic-wraps": (
        "in x: i8[M, N]\nout a, b, c, d: i8[M, N]\na = x * x + x\nb = relu(x - 100) // 3\nc = -x + floor(x)\n"
        "d = where(x > 3, x, x % 5)",
        np.arange(-128, 128, dtype=np.int8).reshape(16, 16),
    ),
    "uint8-arithmetic-wraps": (
        "in x: u8[M, N]\nout a, b: u8[M, N]\na = where(x > 100, x * 3, x // 7) - 9\nb = maximum(x, 200) + x",
        np.arange(0, 256, dtype=np.uint8).reshape(8, 32),
    ),
}


@lowered_then_interpreted
@pytest.mark.parametrize("case", list(EDGE_SPECS))
def test_relu_floor_and_8_bit_arithmetic_are_exact_on_mosaic_gpu(case, tmp_path, monkeypatch):
    body, x = EDGE_SPECS[case]
    module = _module_of(body, tmp_path, case.replace("-", "_"))
    call = jax.jit(lambda a: module.k(a, gpu_backend="mosaic_gpu", interpret=False))
    text = jax.export.export(call, platforms=["cuda"])(jax.ShapeDtypeStruct(x.shape, x.dtype)).mlir_module()
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)
    if INTERPRETER is None:
        return
    take_gpu_branch(monkeypatch, module)
    got = module.k(jnp.asarray(x), gpu_backend="mosaic_gpu", interpret=INTERPRETER())
    for g, w in zip(got, module.k.reference(jnp.asarray(x))):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


# sqrt from rsqrt (no sqrt lowering on jax 0.10.2): zeros of either sign, infinities,
# NaN, negatives, the smallest normal and the largest floats; whole squares. (Subnormals
# are flushed to zero by XLA on CPU and GPU alike.)
SQRT_VALUES = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0, -1e-30, 1.2e-38, 1e-30, 5e-20]
SQRT_VALUES += [0.25, 2.0, 3.0, 4.0, 10.0, 144.0, 1e10, 1.7e38, 3.4e38, 3.4028235e38, 1.0000001, 0.9999999]


@lowered_then_interpreted
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_sqrt_on_mosaic_gpu_is_within_an_ulp_and_exact_at_the_edges(dtype, tmp_path, monkeypatch):
    module = _module_of(f"in x: {dtype}[M, N]\nout y: {dtype}[M, N]\ny = sqrt(x)", tmp_path, f"sqrt_{dtype}")
    x = np.array([SQRT_VALUES, [v * 7.0 for v in SQRT_VALUES]], DTYPES[dtype])
    call = jax.jit(lambda a: module.k(a, gpu_backend="mosaic_gpu", interpret=False))
    text = jax.export.export(call, platforms=["cuda"])(jax.ShapeDtypeStruct(x.shape, x.dtype)).mlir_module()
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)
    if INTERPRETER is None:
        return
    take_gpu_branch(monkeypatch, module)
    got = np.asarray(module.k(jnp.asarray(x), gpu_backend="mosaic_gpu", interpret=INTERPRETER()), np.float32)
    with np.errstate(invalid="ignore"):  # NaN for the negatives, as sqrt gives
        want = np.sqrt(np.asarray(x, np.float64)).astype(x.dtype).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    exact = ~np.isfinite(want) | (want == 0)
    np.testing.assert_array_equal(got[exact], want[exact])
    # Within an ulp of the output's dtype: of f32, or of bf16 (its spacing near each value).
    spacing = np.abs(np.spacing(want[~exact])) * (2.0**16 if dtype == "bf16" else 1.0)
    assert np.all(np.abs(got[~exact] - want[~exact]) <= spacing)


@lowered_then_interpreted
def test_exp_on_mosaic_gpu_is_spelled_as_exp2_and_within_a_few_ulps(tmp_path, monkeypatch):
    """Mosaic GPU lowers jnp.exp to an accurate expf; its kernels take exp as 2 ** (x * log2 e)."""
    module = _module_of("in x: f32[M, N]\nout y: f32[M, N]\ny = exp(x)", tmp_path, "exp")
    assert "rt.mgpu_exp(x)" in (tmp_path / "exp.py").read_text()
    x = np.linspace(-80.0, 80.0, 2 * 512, dtype=np.float32).reshape(2, 512)
    call = jax.jit(lambda a: module.k(a, gpu_backend="mosaic_gpu", interpret=False))
    text = jax.export.export(call, platforms=["cuda"])(jax.ShapeDtypeStruct(x.shape, x.dtype)).mlir_module()
    assert MOSAIC_CALL.search(text) and not TRITON.search(text)
    if INTERPRETER is None:
        return
    take_gpu_branch(monkeypatch, module)
    got = np.asarray(module.k(jnp.asarray(x), gpu_backend="mosaic_gpu", interpret=INTERPRETER()), np.float64)
    want = np.exp(x.astype(np.float64))
    # the rounding of x * log2(e) (|x| * 2^-24 relative) and a few ulps of exp2
    assert np.all(np.abs(got - want) <= want * (np.abs(x) * 2.0**-24 * 1.5 + 2.0**-21))


ATTENTION = {"attention", "attention_full", "attention_bottom_right", "gqa", "attention_dq", "attention_dkdv"}


def test_mosaic_gpu_takes_the_attention_family_and_its_gradients():
    """Fused kernels: a sweep over the key blocks with the online softmax's running values."""
    taken = {k for _, k in TAKEN}
    assert ATTENTION <= taken
    derived = {f"{k}_{part}" for k in ("attention", "gqa") for part in ("backward_dq", "backward_dkdv")}
    assert derived <= taken
    assert {("attention", "attention_full"), ("attention", "gqa")} <= set(SAVING)


def _interpreted_attention(kernel, monkeypatch, *arrays, **keywords):
    generated = generated_module("attention")
    take_gpu_branch(monkeypatch, generated)
    function = getattr(generated, kernel)
    return function(*arrays, gpu_backend="mosaic_gpu", interpret=INTERPRETER(), **keywords)


def _qkv(s: int, t: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(random_array(rng, "bf16", shape)) for shape in [(1, 2, s, d), (1, 2, t, d), (1, 2, t, d)]]


@interpreted
def test_causal_attention_on_mosaic_gpu_never_computes_a_block_past_the_diagonal(monkeypatch):
    """Queries 0-127 see no key past 127: the second block of keys (of 128, as T = 256
    takes) is skipped, so NaN values there (which a computed block would multiply by its
    zero weights) leave them exact."""
    q, k, v = _qkv(256, 256, 64)
    poisoned = v.at[:, :, 128:].set(jnp.nan)
    o, lse = _interpreted_attention("attention", monkeypatch, q, k, poisoned)
    want_o, want_lse = generated_module("attention").attention.reference(q, k, v.at[:, :, 128:].set(0))
    np.testing.assert_allclose(
        np.asarray(o[:, :, :128], np.float32), np.asarray(want_o[:, :, :128], np.float32), atol=2e-2
    )
    np.testing.assert_allclose(np.asarray(lse[:, :, :128]), np.asarray(want_lse[:, :, :128]), rtol=1e-5)
    assert np.isnan(np.asarray(o[:, :, 128:], np.float32)).all()  # the diagonal's block reads them


@interpreted
@pytest.mark.parametrize("kernel", ["attention", "attention_full"])
def test_attention_on_mosaic_gpu_is_exact_past_a_ragged_key_end(kernel, monkeypatch):
    """T = 65: its second block holds one key and 63 positions of padding, which must take
    no weight (the scores past T are -inf, not the 0 that zero padding gives) in o nor lse."""
    q, k, v = _qkv(70, 65, 40, seed=1)
    q, k = jnp.abs(q) + 1, -jnp.abs(k) - 1  # every score below 0: a padded key's score 0 would win
    got = jax.tree.leaves(_interpreted_attention(kernel, monkeypatch, q, k, v))
    want = jax.tree.leaves(getattr(generated_module("attention"), kernel).reference(q, k, v))
    for g, w in zip(got, want):
        rtol = 2.0**-7 if w.dtype.itemsize == 2 else 1e-5
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=rtol, atol=rtol * 4)


def test_attention_on_mosaic_gpu_says_which_head_size_it_holds(monkeypatch):
    """A head (D) is held whole in one wgmma accumulator: up to 256."""
    q, k, v = (jax.ShapeDtypeStruct((1, 1, 64, 320), jnp.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=r'attention: gpu_backend="mosaic_gpu" holds D whole, up to 256; got D=320'):
        _cuda_text(generated_module("attention").attention, [q, k, v], gpu_backend="mosaic_gpu")


def _blocks_chosen(kernel: str, head: int, monkeypatch) -> list[tuple[int, int]]:
    """The swept dimension's block and how many warpgroups compute, for each program of
    `kernel` lowered for CUDA with a head of `head` (aligned sizes otherwise): the choice
    of rt.mgpu_swept_block, or of rt.mgpu_warpgroups with blocks of 64, watched."""
    chosen, by_block, by_count = [], support.mgpu_swept_block, support.mgpu_warpgroups

    def swept(*args, **keywords):
        monkeypatch.setattr(support, "mgpu_warpgroups", by_count)  # what it calls: not counted again
        chosen.append(by_block(*args, **keywords))
        monkeypatch.setattr(support, "mgpu_warpgroups", counted)
        return chosen[-1]

    def counted(*args, **keywords):
        chosen.append((64, by_count(*args, **keywords)))
        return chosen[-1][1]

    monkeypatch.setattr(support, "mgpu_swept_block", swept)  # the generated modules' `rt`
    monkeypatch.setattr(support, "mgpu_warpgroups", counted)
    shapes = [
        tuple(head if n == SIZES["aligned"]["head"] else n for n in shape)
        for shape, _ in _shapes("attention", kernel, "aligned")
    ]
    dtypes = [DTYPES[dtype] for _, dtype in _shapes("attention", kernel, "aligned")]
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    text = _cuda_text(getattr(generated_module("attention"), kernel), args, gpu_backend="mosaic_gpu")
    assert MOSAIC_CALL.search(text)  # and Mosaic GPU's own count of its shared memory let it lower
    return chosen


@pytest.mark.parametrize(
    "kernel, block",
    [("attention", 128), ("attention_full", 128), ("attention_backward_dq", 64), ("attention_backward_dkdv", 64)]
    + [("gqa", 64)],
)
def test_attention_on_mosaic_gpu_shares_each_block_of_keys_between_two_warpgroups_of_queries(
    kernel, block, monkeypatch
):
    """At D = 128 a program's two computing warpgroups (each a block of the parallel
    dimension) and the key or query blocks in flight, which a third copies in, fit a
    block's shared memory; outputs take the tiles of inputs read only in the pass. A
    forward pass takes blocks of 128 keys where they fit (gqa's exact p @ v, two tiles of
    operands a warpgroup, leaves room for 64); a backward pass, with twice the tiles of
    scores in registers, 64."""
    assert _blocks_chosen(kernel, 128, monkeypatch) == [(block, 2)]


def test_attention_on_mosaic_gpu_takes_one_warpgroup_where_two_would_not_fit(monkeypatch):
    """At D = 192 two warpgroups' tiles of dk and dv and the query blocks in flight exceed 227 KiB."""
    assert _blocks_chosen("attention_backward_dkdv", 192, monkeypatch) == [(64, 1)]


def test_attention_on_mosaic_gpu_refuses_a_head_whose_blocks_exceed_shared_memory(monkeypatch):
    with pytest.raises(
        ValueError, match=r'attention_backward_dq: gpu_backend="mosaic_gpu" needs \d+ KiB of shared memory'
    ):
        _blocks_chosen("attention_backward_dq", 256, monkeypatch)


def test_mosaic_gpu_warpgroups_fit_their_tiles_beside_the_blocks_in_flight():
    kib = 1024
    assert support.mgpu_warpgroups("k", [100 * kib], [20 * kib]) == 2
    assert support.mgpu_warpgroups("k", [100 * kib], [30 * kib]) == 1  # 2 * 100 + 30 + the pipeline's 3 > 227
    assert support.mgpu_warpgroups("k", [100 * kib], [20 * kib], most=1) == 1
    assert support.mgpu_warpgroups("k", [1] * 224, [0]) == 2  # each buffer takes a whole KiB: 224 + 3
    with pytest.raises(ValueError, match="needs 228 KiB"):
        support.mgpu_warpgroups("k", [1] * 225, [0])
    with pytest.raises(ValueError, match=r'k: gpu_backend="mosaic_gpu" needs 231 KiB of shared memory'):
        support.mgpu_warpgroups("k", [200 * kib], [28 * kib])


def test_mosaic_gpu_takes_the_larger_swept_block_where_its_tiles_fit_and_the_size_needs_it():
    kib = 1024

    def sizes(block):  # tiles a warpgroup, and the blocks in flight
        return [block * kib // 2], [block * kib // 2]

    assert support.mgpu_swept_block("k", 1000, sizes) == (128, 2)  # 2 * 64 + 64 + 3 KiB
    assert support.mgpu_swept_block("k", 65, sizes) == (128, 2)
    assert support.mgpu_swept_block("k", 64, sizes) == (64, 2)  # one block of 64 holds it all
    assert support.mgpu_swept_block("k", 1000, sizes, most=1) == (128, 1)
    assert support.mgpu_swept_block("k", 1000, lambda block: ([block * kib], [block * kib // 2])) == (64, 2)
    assert support.mgpu_swept_block("k", 1000, lambda block: ([block * 1.6 * kib], [block * kib])) == (64, 1)


def test_compact_launcher_lines_compute_the_same_values_in_the_same_order():
    from pallasgen.backends.mosaic_gpu.support import compact

    assert compact(["block_m = 64", "block_n = 128"]) == ["block_m, block_n = 64, 128"]
    # a value passed on once is written where it is passed; a line never reads a name it assigns
    assert compact(["w = w.reshape((n,))", "w = rt.mgpu_pad(w, (padded_n,))"]) == [
        "w = rt.mgpu_pad(w.reshape((n,)), (padded_n,))"
    ]
    assert compact(["padded_m = m + -m % 8", "x = rt.mgpu_pad(x, (padded_m,))"]) == [
        "padded_m = m + -m % 8",
        "x = rt.mgpu_pad(x, (padded_m,))",
    ]
    # a commented line stays whole and alone; a line too long is not joined
    commented = "y = jnp.swapaxes(y, -1, -2)  # wgmma reads [N, K] tiles"
    assert compact([commented, "y = rt.mgpu_pad(y, (n, k))"]) == [commented, "y = rt.mgpu_pad(y, (n, k))"]
    assert compact(["a = " + "b" * 70, "c = " + "d" * 50]) == ["a = " + "b" * 70, "c = " + "d" * 50]


@lowered_then_interpreted
def test_a_fused_pass_streams_blocks_of_a_dimension_each_program_holds_a_block_of(tmp_path, monkeypatch):
    """An FFN's second product, `relu(x @ w1.T) @ w2` swept over N with D blocked: each
    step copies in a [block N, block D] tile of w2 (of the program's block of D), which
    Mosaic GPU's fused form lowers and its interpreter runs against float64 NumPy."""
    spec = "in x: bf16[M, K]\nin w1: bf16[N, K]\nin w2: bf16[N, D]\nout y: bf16[M, D]\ny = bf16(relu(x @ w1.T)) @ w2"
    module = _module_of(spec + "\nblock M = 64, N = 64, D = 128", tmp_path, "ffn")
    rng = np.random.default_rng(0)
    x, w1, w2 = (jnp.asarray(random_array(rng, "bf16", shape)) for shape in ((100, 64), (200, 64), (200, 300)))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w1, w2)]
    assert MOSAIC_CALL.search(_cuda_text(module.k, args, gpu_backend="mosaic_gpu"))
    if INTERPRETER is None:
        return
    take_gpu_branch(monkeypatch, module)
    got = np.asarray(module.k(x, w1, w2, gpu_backend="mosaic_gpu", interpret=INTERPRETER()), np.float64)
    h = np.maximum(np.asarray(x, np.float64) @ np.asarray(w1, np.float64).T, 0)
    want = np.asarray(jnp.asarray(h, jnp.bfloat16), np.float64) @ np.asarray(w2, np.float64)
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=2.0**-7 * np.abs(want).max())
