"""A product kernel's forward plus backward pass, by compiler estimate: each kernel that
`jax.grad` runs (NAME, writing its residuals where it saves some, then its backward
kernels), compiled alone at the blocks a call takes on the chip (the spec's
tuning file), and their sum. Run by hand on any machine (no TPU needed):

    python benchmarks/product_backward_estimates.py --chip v5e --kernel matmul_bias_gelu

XLA's side is `pallasgen bench --grad --chip CHIP specs/matmul.pallas:NAME`; this one
compiles the kernels alone because XLA's compiles of the backward kernels' references
passed 8 GB of host memory. Cycles come from libtpu's static cost model: estimates, not
times.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

from attention_estimates import parse_sizes

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator, arguments
from pallasgen.devices.runner import load_module
from pallasgen.workspace.pipeline import check_source

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, default="v5e")
    parser.add_argument("--kernel", default="matmul_bias_gelu")
    parser.add_argument("--sizes", default="M=4096,N=4096,K=4096")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    spec = ROOT / "specs" / "matmul.pallas"
    (checked,) = [k for k in check_source(spec.read_text(encoding="utf-8"), str(spec)) if k.kernel.name == args.kernel]
    gradient = checked.gradient
    kernels = [checked, *(b.checked for b in gradient.kernels)]
    path = ROOT / "generated" / "matmul.py"
    module = load_module(path.read_text(encoding="utf-8"), path)
    with tempfile.TemporaryDirectory() as profile_dir:
        estimator = Estimator(args.chip, Path(profile_dir))
        total = 0
        for kernel in kernels:
            function = getattr(module, kernel.kernel.name)
            if kernel is checked and gradient.saving is not None:
                function = function.with_residuals
            function = functools.partial(function, interpret=False)
            cycles, _ = estimator.op_cycles(function, arguments(kernel, sizes, estimator.sharding))
            total += sum(cycles.values())
            print(f"{kernel.kernel.name}: {sum(cycles.values()):,} cycles", flush=True)
    print(f"{args.kernel} forward plus backward on {args.chip}: {total:,} cycles")


if __name__ == "__main__":
    main()
