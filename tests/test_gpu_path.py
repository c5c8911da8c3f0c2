"""The GPU (Triton) path of every bundled kernel, checked on CPU.

Generated functions pick the Triton kernel when lowered for CUDA. Here the module's
dispatch is pointed at the GPU branch, so the rest runs as on a GPU: in interpret mode the Triton
kernel (in-kernel K loop, masked ragged loads, power-of-two blocks) must match the
reference, and lowering for CUDA on an abstract H100 must produce a Triton call
(PALLAS_NOTES.md section 4).
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import pytest
from jax._src.mesh import AbstractDevice

from kernel_cases import (
    GENERATED,
    NUMPY_DTYPES,
    bundled_kernels,
    is_derived,
    has_matmul,
    generated_module,
    load_module,
    random_array,
    small_gpu_blocks,
    spec_inputs,
    spec_kernel,
    take_gpu_branch,
)
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import generate

# Kernels derived for jax.grad run on the GPU path in the gradient tests, at sizes of
# their own (gqa's at 37 in each of B, G, R took many minutes here).
KERNELS = [
    (module, kernel) for module, kernel in bundled_kernels() if kernel is not None and not is_derived(module, kernel)
]
IDS = [f"{module}.{kernel}" for module, kernel in KERNELS]


@pytest.fixture
def on_gpu(monkeypatch):
    """Make generated functions take their GPU branch, with fresh jit caches."""
    for module in {module for module, _ in KERNELS}:
        take_gpu_branch(monkeypatch, generated_module(module))
    yield
    for module, kernel in KERNELS:
        getattr(generated_module(module), kernel).clear_cache()


def ragged_sizes(module: str, kernel: str) -> dict[str, int]:
    """Sizes that leave a partial GPU block in every dimension with 16-wide GPU blocks."""
    decl = spec_kernel(module, kernel)
    dims = {d for a in decl.inputs for d in a.dims}
    out_dims = decl.outputs[0].dims
    batch = set(out_dims[:-2]) if has_matmul(module, kernel) else set()
    return {d: 2 if d in batch else 37 for d in dims}


@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=IDS)
def test_gpu_kernel_in_interpret_mode_matches_the_reference(on_gpu, module, kernel):
    generated = generated_module(module)
    function, reference = getattr(generated, kernel), getattr(generated, kernel).reference
    sizes = ragged_sizes(module, kernel)
    rng = np.random.default_rng(7)
    inputs = [random_array(rng, op.dtype, tuple(sizes[d] for d in op.dims)) for op in spec_inputs(module, kernel)]
    got = function(*inputs, **small_gpu_blocks(function), gpu_warps=4, gpu_stages=1, interpret=True)
    want = reference(*inputs)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    # An f32 output of 16-bit inputs may sum terms that the kernel and the reference round
    # to bf16 apart (gqa_backward_dkdv's bf16(ds) @ q): one bf16 rounding of a term apart.
    sixteen_bit = any(op.dtype in ("bf16", "f16") for op in spec_inputs(module, kernel))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        tolerance = (1e-3 if sixteen_bit else 1e-5) if g.dtype == np.float32 else 2e-2
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=IDS)
def test_lowers_for_an_nvidia_gpu_through_triton(module, kernel):
    sizes = {d: 300 if n > 2 else n for d, n in ragged_sizes(module, kernel).items()}
    args = [
        jax.ShapeDtypeStruct(tuple(sizes[d] for d in op.dims), NUMPY_DTYPES[op.dtype])
        for op in spec_inputs(module, kernel)
    ]
    lowered = lower_for_an_nvidia_gpu(getattr(generated_module(module), kernel), *args)
    assert "triton" in lowered.as_text().lower()


def lower_for_an_nvidia_gpu(function, *args):
    device = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
        return jax.jit(functools.partial(function, interpret=False)).trace(*args).lower(lowering_platforms=("cuda",))


def test_lowering_for_a_gpu_raises_no_deprecation_warning_where_those_are_errors():
    """jax 0.11+ warns at each Triton lowering that the backend is deprecated; the runtime
    silences that one message (and no other) while its dispatch lowers for CUDA, even
    under `-W error`. The real dispatch runs here: it follows the lowering platform."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        module = load_module(GENERATED / "activations.py", "_activations_under_w_error")
        lowered = lower_for_an_nvidia_gpu(module.leaky, jax.ShapeDtypeStruct((300, 300), np.float32))
        assert "triton" in lowered.as_text().lower()
        with pytest.raises(DeprecationWarning, match="Pallas Triton"):
            warnings.warn("Pallas Triton: any other deprecation is still an error", DeprecationWarning)


SPEC = """
kernel tuned {
    in  x: bf16[M, K]
    in  y: bf16[K, N]
    out z: f32[M, N]
    z = x @ y
    block M = 256, N = 256, K = 512
    %s
}
"""


def test_gpu_statements_set_the_gpu_defaults_of_the_generated_function():
    """The spec's blocks and options are what a call passing none takes on a GPU not tuned for."""
    source = generate(SPEC % "gpu block M = 64, N = 32, K = 16\n    gpu warps = 2, stages = 4", "t.pallas", "t.pallas")
    assert "triton_options=rt.GpuOptions({None: (64, 32, 16, 2, 4)}" in source


@pytest.mark.parametrize(
    ("statement", "column", "message"),
    [
        ("gpu block M = 96", 19, "a GPU block size is a power of two"),
        ("gpu block Q = 64", 15, "Q is not a dimension of this kernel"),
        ("gpu wraps = 8", 9, "unknown GPU option 'wraps' (did you mean 'warps'?)"),
        ("gpu warps = 3", 17, "gpu warps is one of 1, 2, 4, 8, 16, 32"),
        ("gpu stages = 0", 18, "gpu stages is one of"),
    ],
)
def test_bad_gpu_statements_are_spec_errors(statement, column, message):
    with pytest.raises(SpecError) as error:
        generate(SPEC % statement, "t.pallas", "t.pallas")
    (diagnostic,) = error.value.diagnostics
    assert message in diagnostic.message
    assert (diagnostic.position.line, diagnostic.position.column) == (8, column)
