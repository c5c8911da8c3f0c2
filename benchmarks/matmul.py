"""Generated matmuls against `jnp.matmul` (XLA), timed in the same run.

Run by hand on the machine you want to measure:

    python benchmarks/matmul.py --size 4096 --size 8192

For each size it times the generated `matmul` (f32), `matmul_bias_gelu` (bf16 with
f32 accumulation, fused bias and GELU) and `matmul_int8`, each next to the XLA
computation of the same thing, and prints medians, TFLOP/s and the ratio to XLA.
On CPU the kernels run in Pallas interpret mode and the times say nothing about
TPU or GPU speed. Record results in benchmarks/RESULTS.md with the device and jax
version printed here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pallasgen.devices.bench import peak_for, time_pair  # noqa: E402
from pallasgen.devices.runner import load_module  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, action="append", help="M = N = K (repeatable); default 1024")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    matmul = load_module(ROOT / "generated" / "matmul.py")
    device = jax.devices()[0].device_kind
    peak = peak_for(device)
    print(f"device: {device}, backend: {jax.default_backend()}, jax {jax.__version__}")
    rng = np.random.default_rng(0)
    for size in args.size or [1024]:
        shape = (size, size)
        f32 = [jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(2)]
        bf16 = [a.astype(jnp.bfloat16) for a in f32]
        bias = jnp.asarray(rng.standard_normal(size), jnp.float32)
        int8 = [jnp.asarray(rng.integers(-128, 128, shape), jnp.int8) for _ in range(2)]

        def xla_bias_gelu(x, y, b):
            product = jnp.matmul(x, y, preferred_element_type=jnp.float32)
            return jax.nn.gelu(product + b, approximate=True).astype(jnp.bfloat16)

        cases = [
            ("matmul f32", matmul.matmul, jax.jit(jnp.matmul), f32),
            ("matmul_bias_gelu bf16", matmul.matmul_bias_gelu, jax.jit(xla_bias_gelu), [*bf16, bias]),
            (
                "matmul_int8",
                matmul.matmul_int8,
                jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.int32)),
                int8,
            ),
        ]
        for name, kernel, xla, inputs in cases:
            kernel_s, xla_s = time_pair(lambda: kernel(*inputs), lambda: xla(*inputs), args.repeats)
            tflops = 2 * size**3 / kernel_s / 1e12
            of_peak = f" ({100 * tflops / peak[0]:.0f}% of bf16 peak)" if peak else ""
            print(
                f"{name:24s} {size}^3: kernel {kernel_s * 1e3:9.3f} ms, XLA {xla_s * 1e3:9.3f} ms,"
                f" {tflops:7.2f} TFLOP/s{of_peak}, {xla_s / kernel_s:.2f}x XLA"
            )
    if jax.default_backend() == "cpu":
        print("CPU: Pallas interpret mode; these times say nothing about TPU or GPU speed.")


if __name__ == "__main__":
    main()
