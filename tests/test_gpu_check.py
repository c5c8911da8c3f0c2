"""benchmarks/gpu_check.py, the check of every bundled kernel on an NVIDIA GPU, run
without one: its 16-wide blocks, read from each kernel's options and its Triton
launcher's table, and its check of a kernel on the Triton path, interpreted on CPU."""

from __future__ import annotations

import pytest

from kernel_cases import ROOT, bundled_kernels, generated_module, is_derived, load_module, take_gpu_branch

# gpu_check checks the kernels derived for jax.grad too; here the others stand for them.
KERNELS = [(m, k) for m, k in bundled_kernels() if k is not None and not is_derived(m, k)]


@pytest.fixture(scope="module")
def gpu_check():
    return load_module(ROOT / "benchmarks" / "gpu_check.py", "_pallasgen_gpu_check")


@pytest.mark.parametrize(
    "module, kernel, blocks",
    [
        ("matmul", "matmul", {"gpu_block_k": 16, "gpu_block_m": 16, "gpu_block_n": 16}),
        ("attention", "attention", {"gpu_block_s": 16, "gpu_block_t": 16}),
        ("add_vectors", "add_vectors", {"gpu_block_n": 16}),
        ("softmax", "softmax", {"gpu_block_m": 1}),  # the spec's one row per program
        ("activations", "bias_gelu", {"gpu_block_m": 8, "gpu_block_n": 16}),  # 8 rows by 128
    ],
)
def test_16_wide_blocks_are_each_gpu_block_at_16_or_the_specs_smaller_one(gpu_check, module, kernel, blocks):
    """The GPU blocks are among a kernel's options (None by default, not in its
    signature); the spec's are the first entries of its Triton launcher's table."""
    function = getattr(generated_module(module), kernel)
    assert set(blocks) <= set(function.options)
    assert gpu_check.small_gpu_blocks(function) == blocks


@pytest.mark.parametrize(("module", "kernel"), KERNELS, ids=[f"{m}.{k}" for m, k in KERNELS])
def test_gpu_check_passes_each_kernel_on_the_triton_path_interpreted(gpu_check, module, kernel, monkeypatch):
    """One kernel as `gpu_check.py small` checks it with 16-wide blocks, interpreted (a
    GPU's compiled Triton kernel, and what it does at a block's edge, is the GPU's to show)."""
    function = getattr(generated_module(module), kernel)
    take_gpu_branch(monkeypatch, generated_module(module))
    function.clear_cache()
    try:
        blocks = {**gpu_check.small_gpu_blocks(function), "gpu_backend": "triton", "interpret": True}
        assert gpu_check.check(module, kernel, "small", blocks) in ("NumPy float64", "XLA CPU reference")
    finally:
        function.clear_cache()


def test_every_dimension_of_a_bundled_kernel_has_a_size_in_every_class(gpu_check):
    """No dimension falls back to another's size (attention's H at N's 3000 made one check
    take minutes): each size class names them all."""
    for module, kernel in KERNELS:
        for size_class, table in gpu_check.SIZE_CLASSES.items():
            sizes = gpu_check.sizes_for(module, kernel, size_class)
            assert all(sizes[d] == table[d] or (module, d) == ("add_vectors", "N") for d in sizes)


def test_a_dimension_without_a_size_is_an_error_that_names_it(gpu_check, monkeypatch):
    monkeypatch.setitem(gpu_check.SIZE_CLASSES, "small", {"M": 8})
    with pytest.raises(KeyError, match="no small size for dimension N"):
        gpu_check.sizes_for("softmax", "softmax", "small")
