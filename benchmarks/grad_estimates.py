"""One side of `pallasgen bench --grad --chip`, by compiler estimate on a compile-only
TPU: the generated kernel's forward plus backward, or XLA's of its reference, each
compiled in a process of its own (for references whose compile needs most of the host's
memory: causal attention's at S = T = 4096 on v5e took 16 GB and 30 minutes).

    python benchmarks/grad_estimates.py --chip v5e --side xla attention:attention B=1,H=1,S=4096,T=4096,D=128
    python benchmarks/grad_estimates.py --chip v5e --side pallasgen attention:attention B=1,H=1,S=4096,T=4096,D=128
    python benchmarks/grad_estimates.py --chip v5e --side pallasgen --memory \
        benchmarks/specs/linear_cross_entropy.pallas:linear_cross_entropy M=512,K=1024,V=32768

SPEC is a bundled spec's stem (its generated module is read) or a spec file's path (its
module is generated in memory). --memory adds the compiled program's memory analysis:
the bytes of its arguments, outputs and temporaries.

Compiling the two passes as separate programs is no stand-in: at S = T = 1024 on v5e the
forward (writing what `jax.vjp` saves) and the backward came to 133,907 cycles, the one
program to 29,881. Cycles come from libtpu's static cost model: estimates, not times.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path

from pallasgen.backends import backend_named
from pallasgen.devices.bench import float_outputs, with_backward
from pallasgen.devices.estimate import Estimator, arguments, struct
from pallasgen.devices.runner import load_module
from pallasgen.workspace.pipeline import check_source, generate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", choices=backend_named("tpu").chip_names, required=True)
    parser.add_argument("--side", choices=("pallasgen", "xla"), required=True)
    parser.add_argument("target", help="SPEC:KERNEL, e.g. attention:attention or benchmarks/specs/alibi.pallas:alibi")
    parser.add_argument("sizes", help="DIM=SIZE,..., e.g. B=1,H=1,S=4096,T=4096,D=128")
    parser.add_argument("--ops", action="store_true", help="also each compiled op's cycles")
    parser.add_argument("--memory", action="store_true", help="also the compiled program's memory analysis")
    args = parser.parse_args()
    spec, name = args.target.split(":")
    sizes = {k: int(v) for k, v in (item.split("=") for item in args.sizes.split(","))}
    if spec.endswith(".pallas"):
        source = Path(spec).read_text(encoding="utf-8")
        path = Path(tempfile.mkdtemp(prefix="generated_")) / f"{Path(spec).stem}.py"
        path.write_text(generate(source, spec, spec), encoding="utf-8")
    else:
        source = (ROOT / "specs" / f"{spec}.pallas").read_text(encoding="utf-8")
        path = ROOT / "generated" / f"{spec}.py"
    checked = next(c for c in check_source(source, spec) if c.kernel.name == name)
    module = load_module(path.read_text(encoding="utf-8"), path)
    kernel = functools.partial(getattr(module, name), interpret=False)
    function = getattr(module, name).reference if args.side == "xla" else kernel
    estimator = Estimator(args.chip, Path(tempfile.mkdtemp(prefix="llo_profile_")))
    inputs = arguments(checked, sizes, estimator.sharding)
    cotangents = [struct(decl, sizes, estimator.sharding) for decl in float_outputs(checked)]
    ops, _ = estimator.op_cycles(with_backward(function, checked), [inputs, cotangents])
    summary = {"chip": args.chip, "kernel": name, "sizes": sizes, "side": args.side, "cycles": sum(ops.values())}
    if args.memory:
        summary["memory"] = memory(with_backward(function, checked), [inputs, cotangents], estimator)
    print(json.dumps(summary | ({"ops": ops} if args.ops else {})))


def memory(function, args, estimator: Estimator) -> dict[str, int]:
    """The compiled program's bytes of arguments, outputs and temporaries (the compile
    op_cycles made, from jax's cache)."""
    import jax

    with jax.default_device(estimator.device):
        analysis = jax.jit(function).lower(*args).compile().memory_analysis()
    found = {
        "arguments": analysis.argument_size_in_bytes,
        "outputs": analysis.output_size_in_bytes,
        "temporaries": analysis.temp_size_in_bytes,
    }
    return found | {"total": sum(found.values())}


if __name__ == "__main__":
    main()
