"""Every bundled kernel on a real NVIDIA GPU, at ragged, small, single-element and
aligned sizes, against references computed on the CPU.

Interpret mode pads edge blocks, so only a GPU shows what an unmasked edge does.
Run by hand on a GPU host (results go to benchmarks/RESULTS.md):

    python benchmarks/gpu_check.py [--gpu-backend mosaic_gpu] [--slice I/N] [--default-blocks] [SIZE_CLASS ...]
                                                                  # exit 1 if any kernel disagrees

`--gpu-backend mosaic_gpu` passes `gpu_backend="mosaic_gpu"` to every kernel (Hopper
and later; kernels Mosaic GPU does not take run on Triton, as their docstrings say).
`--slice I/N` checks every N-th kernel from the I-th (0 <= I < N), so that N processes
share the work (benchmarks/gpu_check_all.sh runs them side by side). `--default-blocks`
leaves out the 16-wide blocks.

Each kernel runs through its public function (the platform picks the Triton
kernel) with default GPU blocks, and with 16-wide blocks (each `gpu_block_*` option at
16, or at the spec's block where that is smaller) so that small sizes span several
programs. It is compared with its independent NumPy float64 reference
where tests/kernel_cases.py has one, and with `NAME.reference` run by XLA on the
CPU otherwise (products: float64 einsum of the operands for plain products).
Under `compute-sanitizer --tool memcheck` this also proves no access leaves its
array. tests/test_gpu_check.py runs the check on CPU, the Triton kernels interpreted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # pallasgen and generated/ from this checkout

from kernel_cases import (  # noqa: E402
    CASES,
    as_tuple,
    assert_outputs_close,
    bundled_kernels,
    generated_module,
    generic_tolerances,
    has_matmul,
    make_inputs,
    small_gpu_blocks,
    spec_inputs,
    spec_outputs,
)

SIZE_CLASSES = {
    # every dimension ragged against every block (and K against the K loop)
    "ragged": dict(M=1000, N=3000, K=1000, V=3000, B=3, H=3, G=3, R=2, S=200, T=300, D=72),
    "small": dict(M=8, N=5, K=3, V=5, B=2, H=2, G=2, R=2, S=8, T=5, D=3),
    "single": dict(M=1, N=1, K=1, V=1, B=1, H=1, G=1, R=1, S=1, T=1, D=1),
    "aligned": dict(M=2048, N=2048, K=1024, V=2048, B=2, H=4, G=2, R=2, S=256, T=256, D=128),
}


def sizes_for(module: str, kernel: str, size_class: str) -> dict[str, int]:
    """Each of the kernel's dimensions at its size in the class: every dimension a
    bundled spec names has its own (a head or group count at a vector's length would
    make a check of hours)."""
    table = SIZE_CLASSES[size_class]
    sizes = {}
    for dim in {d for op in spec_inputs(module, kernel) for d in op.dims}:
        if dim not in table:
            raise KeyError(f"gpu_check.py: no {size_class} size for dimension {dim}; add one to SIZE_CLASSES")
        sizes[dim] = table[dim]
    if module == "add_vectors" and size_class == "ragged":
        sizes["N"] = 3_000_001
    return sizes


def cpu_reference(module: str, kernel: str, arrays):
    reference = getattr(generated_module(module), kernel).reference
    cpu = jax.devices("cpu")[0]
    return tuple(np.asarray(o) for o in as_tuple(jax.jit(reference)(*(jax.device_put(a, cpu) for a in arrays))))


def check(module: str, kernel: str, size_class: str, blocks: dict[str, int]) -> str:
    function = getattr(generated_module(module), kernel)
    sizes = sizes_for(module, kernel, size_class)
    arrays = make_inputs(module, kernel, np.random.default_rng(0), sizes)
    got = tuple(np.asarray(o) for o in as_tuple(function(*arrays, **blocks)))
    case = CASES.get(f"{module}.{kernel}")
    if case is not None:
        assert_outputs_close(got, case.expected(*arrays), case.tolerances, "vs NumPy float64")
        return "NumPy float64"
    want = cpu_reference(module, kernel, arrays)
    tolerances = generic_tolerances(spec_outputs(module, kernel), want)
    if has_matmul(module, kernel):
        # f32 products run on TF32 tensor cores (10-bit mantissa), as XLA's default
        # precision does on NVIDIA GPUs; sums of K products round block-wise.
        k = sizes.get("K", sizes.get("D", 1))
        scale = max(1.0, max(float(np.abs(w.astype(np.float64)).max(initial=0)) for w in want))
        tolerances = tuple(
            t if t.rtol == 0 else type(t)(2.0**-9, 2.0**-9 * max(1, k) ** 0.5 * scale) for t in tolerances
        )
    assert_outputs_close(got, want, tolerances, "vs XLA on CPU")
    return "XLA CPU reference"


def main(
    size_classes: list[str], gpu_backend: str = "triton", part: tuple[int, int] = (0, 1), only_default: bool = False
) -> int:
    index, count = part
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, gpu_backend={gpu_backend}, slice {index}/{count}")
    failures = 0
    for module, kernel in bundled_kernels()[index::count]:
        function = getattr(generated_module(module), kernel)
        for size_class in size_classes:
            block_sets = (("default blocks", {}), ("16-wide blocks", small_gpu_blocks(function)))
            for label, blocks in block_sets[:1] if only_default else block_sets:
                try:
                    against = check(module, kernel, size_class, {**blocks, "gpu_backend": gpu_backend})
                    print(f"OK    {module}.{kernel:18} {size_class:8} {label:15} vs {against}")
                except Exception as error:  # report every failure, then exit 1
                    if isinstance(error, ValueError) and str(error).startswith(f"{kernel}: "):
                        # the kernel's own refusal: a limit of the path, which its docstring states
                        print(f"REFUSED {module}.{kernel:18} {size_class:8} {label:15} {str(error)[:160]}")
                        continue
                    failures += 1
                    first = str(error).strip().splitlines()
                    print(f"FAIL  {module}.{kernel:18} {size_class:8} {label:15} {first[:3]}")
    print(f"{failures} failed")
    return 1 if failures else 0


def parse(argv: list[str]) -> tuple[list[str], str, tuple[int, int], bool]:
    """The size classes, the GPU backend, the slice and whether only default blocks are checked."""
    gpu_backend, part = "triton", (0, 1)
    only_default = "--default-blocks" in argv
    argv = [a for a in argv if a != "--default-blocks"]
    if "--gpu-backend" in argv:
        at = argv.index("--gpu-backend")
        if at + 1 >= len(argv) or argv[at + 1] not in ("triton", "mosaic_gpu"):
            sys.exit("gpu_check.py: --gpu-backend takes triton or mosaic_gpu")
        gpu_backend, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    if "--slice" in argv:
        at = argv.index("--slice")
        words = argv[at + 1].split("/") if at + 1 < len(argv) else []
        if len(words) != 2 or not all(w.isdigit() for w in words) or not int(words[0]) < int(words[1]):
            sys.exit("gpu_check.py: --slice takes I/N, 0 <= I < N")
        part, argv = (int(words[0]), int(words[1])), argv[:at] + argv[at + 2 :]
    unknown = [a for a in argv if a not in SIZE_CLASSES]
    if unknown:
        sys.exit(f"gpu_check.py: unknown size class {unknown[0]!r} (choose from {', '.join(SIZE_CLASSES)})")
    return argv or list(SIZE_CLASSES), gpu_backend, part, only_default


if __name__ == "__main__":
    sys.exit(main(*parse(sys.argv[1:])))
