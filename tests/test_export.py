"""One export of a generated function for TPU and CUDA at once.

`jax.export.export(NAME, platforms=("tpu", "cuda"))` must hold the Mosaic kernel for
TPU and the Triton kernel for CUDA, each lowered for its own platform only
(`jax.lax.platform_dependent` lowers every kernel for every platform, and a Mosaic
kernel does not lower for CUDA). The exported module is read the way XLA reads it:
main's first argument is the index of the platform it runs on in `platforms`, and a
`stablehlo.case` on that index runs one branch.

Which lowering context: Pallas's Mosaic lowering reads the TPU chip from the default
device or abstract mesh where it needs it (one-dimensional blocks), and from jax 0.11
its Triton lowering wants an abstract GPU there. On jax 0.10 a compile-only v5e as the
default device serves both; on 0.11+ an abstract H100 does, except for kernels with
one-dimensional blocks, which no single context can lower for both on a CPU host.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from kernel_cases import NUMPY_DTYPES, bundled_kernels, generated_module, spec_inputs, spec_outputs
from pallasgen.devices import compile_only

pytestmark = pytest.mark.skipif(
    bool(compile_only.missing_compilers()), reason="needs libtpu (jax[tpu]) and triton: pip install -e '.[dev]'"
)

KERNELS = [(module, kernel) for module, kernel in bundled_kernels() if kernel is not None]
TRITON = compile_only.TRITON_CALL_TARGET
MOSAIC = "tpu_custom_call"
TRITON_NEEDS_A_GPU = jax.__version_info__ >= (0, 11)
SIZES = {"B": 2, "H": 2, "G": 2, "R": 2, "M": 300, "N": 200, "K": 260, "S": 130, "T": 140, "D": 64, "V": 3000}  # ragged


def arguments(module: str, kernel: str) -> list[jax.ShapeDtypeStruct]:
    return [
        jax.ShapeDtypeStruct(tuple(SIZES[d] for d in op.dims), NUMPY_DTYPES[op.dtype])
        for op in spec_inputs(module, kernel)
    ]


def one_dimensional(module: str, kernel: str) -> bool:
    """Whether the kernel's layout is one-dimensional: 1-D blocks."""
    arrays = (*spec_inputs(module, kernel), *spec_outputs(module, kernel))
    return max(len(op.dims) for op in arrays) == 1


def lowering_context(module: str, kernel: str):
    """Where Mosaic and Triton both find the device they read (see the module docstring)."""
    if not TRITON_NEEDS_A_GPU:
        return jax.default_device(compile_only.tpu_device("v5e"))
    if one_dimensional(module, kernel):
        pytest.skip("jax 0.11+: Mosaic's 1-D blocks need a TPU and Triton a GPU in the same lowering context")
    from jax._src.mesh import AbstractDevice

    h100 = AbstractDevice(device_kind=compile_only.GPU_DEVICE_KIND, num_cores=compile_only.GPU_CORES, platform="gpu")
    return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h100))


@functools.cache
def export_for_tpu_and_cuda(module: str, kernel: str) -> jax.export.Exported:
    with lowering_context(module, kernel):
        return jax.export.export(
            getattr(generated_module(module), kernel),
            platforms=("tpu", "cuda"),
            # Triton kernels are not among the custom calls jax.export vouches for.
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)],
        )(*arguments(module, kernel))


def custom_calls_by_platform(exported: jax.export.Exported) -> dict[str, list[str]]:
    """The custom calls that each platform of a multi-platform export runs, in order.

    Follows main for each platform, into the functions it calls: a `stablehlo.case`
    whose index is known on that platform (the platform index argument, or a constant
    that an earlier case returned) runs only the branch that index selects.
    """
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    def follow(operations, known) -> list[str]:
        calls = []
        for op in operations:
            op = op.operation
            if op.name == "stablehlo.custom_call":
                calls.append(ir.StringAttr(op.attributes["call_target_name"]).value)
            elif op.name == "stablehlo.constant" and isinstance(op.attributes["value"], ir.DenseIntElementsAttr):
                known[op.results[0]] = ir.IntegerAttr(op.attributes["value"].get_splat_value()).value
            elif op.name == "stablehlo.case":
                body = list(op.regions[known[op.operands[0]]].blocks[0].operations)
                calls += follow(body, known)
                returned = body[-1].operation.operands
                known |= {result: known[value] for result, value in zip(op.results, returned) if value in known}
            elif op.name == "func.call":
                callee = functions[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
                calls += run(callee, [known.get(value) for value in op.operands])
            else:
                calls += [
                    call for region in op.regions for block in region.blocks for call in follow(block.operations, known)
                ]
        return calls

    def run(function, arguments) -> list[str]:
        block = function.regions[0].blocks[0]
        known = {argument: value for argument, value in zip(block.arguments, arguments) if value is not None}
        return follow(block.operations, known)

    with mlir.make_ir_context():
        module = ir.Module.parse(exported.mlir_module())
        functions = {ir.StringAttr(op.attributes["sym_name"]).value: op.operation for op in module.body.operations}
        # main's first argument is the platform's index in `platforms`.
        return {platform: run(functions["main"], [number]) for number, platform in enumerate(exported.platforms)}


# A kernel with 1-D blocks exports on jax 0.10 only: whole on that line under `--share`.
@pytest.mark.parametrize(
    ("module", "kernel"),
    [
        pytest.param(m, k, id=f"{m}.{k}", marks=[pytest.mark.jax_line] if one_dimensional(m, k) else [])
        for m, k in KERNELS
    ],
)
def test_one_export_holds_mosaic_for_tpu_and_triton_for_cuda(module, kernel):
    exported = export_for_tpu_and_cuda(module, kernel)
    assert exported.platforms == ("tpu", "cuda")
    calls = custom_calls_by_platform(exported)
    assert calls == {"tpu": [MOSAIC], "cuda": [TRITON]}, calls


def test_the_two_platform_export_compiles_for_a_tpu_with_the_mosaic_kernel_only():
    """Compiling the exported module for a (compile-only) TPU resolves the platform index:
    what XLA:TPU compiles holds the Mosaic kernel and no Triton call."""
    exported = export_for_tpu_and_cuda("matmul", "matmul_bias_gelu")
    compiled = compile_only.compile_for_tpu(exported.call, arguments("matmul", "matmul_bias_gelu"))
    hlo = compiled.as_text()
    assert MOSAIC in hlo and TRITON not in hlo


def test_a_cpu_tpu_cuda_export_interprets_the_tpu_kernel_on_cpu():
    """CPU runs the TPU kernel in interpret mode: plain HLO, no custom call."""
    arrays = arguments("activations", "leaky")
    with lowering_context("activations", "leaky"):
        exported = jax.export.export(
            generated_module("activations").leaky,
            platforms=("cpu", "tpu", "cuda"),
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)],
        )(*arrays)
    assert custom_calls_by_platform(exported) == {"cpu": [], "tpu": [MOSAIC], "cuda": [TRITON]}


def test_vmap_of_a_default_call_adds_a_batch_to_each_platforms_kernel():
    """vmap goes through the per-platform dispatch: on CPU the interpreted TPU kernel."""
    mm = generated_module("matmul")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 40, 130)).astype(np.float32), rng.standard_normal((130, 150)).astype(np.float32)
    got = jax.vmap(functools.partial(mm.matmul, block_m=8, block_n=128, block_k=128), in_axes=(0, None))(x, y)
    np.testing.assert_allclose(np.asarray(got), x @ y, rtol=1e-5, atol=1e-4)
    with lowering_context("matmul", "matmul"):
        exported = jax.export.export(
            jax.jit(jax.vmap(mm.matmul, in_axes=(0, None))),
            platforms=("tpu", "cuda"),
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON)],
        )(*(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, y)))
    assert custom_calls_by_platform(exported) == {"tpu": [MOSAIC], "cuda": [TRITON]}


def test_a_default_call_outside_jit_runs_the_default_devices_kernel():
    mm = generated_module("matmul")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40, 130)).astype(np.float32), rng.standard_normal((130, 150)).astype(np.float32)
    with jax.disable_jit():
        got = mm.matmul(x, y, block_m=8, block_n=128, block_k=128)
    np.testing.assert_allclose(np.asarray(got), x @ y, rtol=1e-5, atol=1e-4)
