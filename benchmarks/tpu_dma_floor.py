"""How far a bundled kernel's TPU estimate is from its own DMA floor: the same launcher,
grid and BlockSpecs with a body that only writes its output blocks (a constant), so
that what is left is the cost model's price for moving the blocks.

Run by hand on any machine (no TPU needed); prints one line per kernel:

    python benchmarks/tpu_dma_floor.py --chip v6e ops:add_f32 M=8192,N=8192
    python benchmarks/tpu_dma_floor.py --chip v6e norms:rms_norm M=8192,N=8192 block_m=128

A kernel near its floor is bound by the blocks it moves, as the model prices them: no
body can bring it lower. Cycles are libtpu's static cost model: estimates, not times.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from pallasgen.backends import backend_named
from pallasgen.devices.estimate import Estimator, ratio
from pallasgen.devices.runner import load_module
from pallasgen.workspace.pipeline import check_source
from tpu_estimates import ROOT, pairs  # benchmarks/, on the path when run as a script


def only_stores(inputs: int, outputs: int):
    """A kernel body that reads nothing and writes zeros to each output block."""
    import jax.numpy as jnp

    def body(*refs, **_):
        for ref in refs[inputs : inputs + outputs]:
            ref[...] = jnp.zeros(ref.shape, ref.dtype)

    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, required=True)
    parser.add_argument("target", help="SPEC:KERNEL, e.g. ops:add_f32")
    parser.add_argument("sizes", help="DIM=N,... e.g. M=8192,N=8192")
    parser.add_argument("blocks", nargs="?", default="", help="block_m=128,... (default: what a call takes)")
    args = parser.parse_args()
    estimator = Estimator(args.chip, Path(tempfile.mkdtemp(prefix="llo_profile_")))
    import jax

    spec, name = args.target.split(":")
    source = (ROOT / "specs" / f"{spec}.pallas").read_text()
    checked = next(c for c in check_source(source, spec) if c.kernel.name == name)
    path = ROOT / "generated" / f"{spec}.py"
    module = load_module(path.read_text(encoding="utf-8"), path)
    sizes, options = pairs(args.sizes), pairs(args.blocks)
    kernel = estimator.estimate(module, checked, sizes, options)
    setattr(
        module,
        backend_named("tpu").function_names(name)[0],
        only_stores(len(checked.kernel.inputs), len(checked.kernel.outputs)),
    )
    jax.clear_caches()  # the launcher is jitted: retrace it with the new body
    floor = estimator.estimate(module, checked, sizes, options)
    print(
        f"{args.chip} {name} {args.sizes}: kernel {kernel.kernel_cycles:,} cycles, DMA floor"
        f" {floor.kernel_cycles:,} ({kernel.kernel_cycles / floor.kernel_cycles:.2f}x of it),"
        f" XLA {kernel.xla_cycles:,}; kernel/XLA {ratio(kernel.kernel_cycles, kernel.xla_cycles):.2f}x,"
        f" floor/XLA {ratio(floor.kernel_cycles, kernel.xla_cycles):.2f}x (estimates, not times)"
    )


if __name__ == "__main__":
    main()
