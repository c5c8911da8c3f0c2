"""A fingerprint of each generated kernel's lowering, to show that a refactor leaves the
kernels as they were.

For every kernel of every spec (derived backward kernels included; KERNEL_with_residuals:
the kernel writing its residuals, as jax.grad runs it), at the sizes
`pallasgen run` uses, it lowers the public function for TPU (the Mosaic kernels' own MLIR,
read back from their custom calls), for CUDA with Triton (the tt IR) and for CUDA with
Mosaic GPU, with debug locations left out, and prints a hash of each as JSON; and under
KEY:around, a hash of the XLA module around the kernels (what the public function does
before and after them: reshapes, transposes, padding; and the names jax gives it). No
device is needed. Equal kernel hashes before and after a change mean the same kernels,
so the same TPU estimates of them; compare two runs with --compare.

    python benchmarks/lowering_fingerprints.py > before.json
    (change, rebuild)
    python benchmarks/lowering_fingerprints.py --compare before.json
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import warnings
from pathlib import Path

from pallasgen.devices.compile_only import _operations, set_libtpu_environment, tpu_device, triton_ir
from pallasgen.devices.runner import load_module, random_inputs, sizes_for
from pallasgen.gradients.derive import every_kernel
from pallasgen.workspace.pipeline import check_source

ROOT = Path(__file__).resolve().parents[1]
MOSAIC_GPU_LARGEST_D = 256  # Mosaic GPU holds an attention's D whole, up to this


def tpu_text(function, args) -> list[str]:
    import jax
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu as tpu_dialect
    from jax._src.lib.mlir import ir

    with jax.default_device(tpu_device("v5e")):
        module = jax.jit(function).trace(*args).lower(lowering_platforms=("tpu",)).compiler_ir("stablehlo")
    texts = []
    for op in _operations(module.operation):
        if op.name != "stablehlo.custom_call" or "backend_config" not in op.attributes:
            continue
        config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)["custom_call_config"]
        context = mlir.make_ir_context()
        tpu_dialect.register_dialect(context)
        context.allow_unregistered_dialects = True  # the serialized, versioned Mosaic dialects
        with context:
            body = ir.Module.parse(base64.b64decode(config.pop("body")))
            texts.append(body.operation.get_asm(enable_debug_info=False))
        texts.append(json.dumps(config, sort_keys=True))
        del op.attributes["backend_config"]
    return [module.operation.get_asm(enable_debug_info=False), *texts]


def triton_text(function, args) -> list[str]:
    return ["", *(f"{k.name} {k.num_warps} {k.num_stages} {k.grid}\n{k.ttir}" for k in triton_ir(function, args))]


def mosaic_gpu_text(function, args) -> list[str]:
    import jax
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    exported = jax.export.export(jax.jit(lambda *a: function(*a, gpu_backend="mosaic_gpu")), platforms=["cuda"])(*args)
    context = mlir.make_ir_context()
    context.allow_unregistered_dialects = True
    texts = []
    with context:
        module = ir.Module.parse(exported.mlir_module())
        for op in _operations(module.operation):
            target = (
                ir.StringAttr(op.attributes["call_target_name"]).value if op.name == "stablehlo.custom_call" else ""
            )
            if "mosaic_gpu" in target:
                config = ir.DictAttr(op.attributes["mhlo.backend_config"])
                body = ir.Module.parse(ir.StringAttr(config["module"]).value_bytes)
                texts.append(body.operation.get_asm(enable_debug_info=False))
                del op.attributes["mhlo.backend_config"]  # it holds the module with its locations
    return [module.operation.get_asm(enable_debug_info=False), *texts]


LOWERINGS = {"tpu": tpu_text, "triton": triton_text, "mosaic_gpu": mosaic_gpu_text}


def fingerprints(root: Path, stems: list[str]) -> dict[str, str]:
    import jax

    found = {}
    for spec in sorted((root / "specs").glob("*.pallas")):
        if stems and spec.stem not in stems:
            continue
        path = root / "generated" / f"{spec.stem}.py"
        module = load_module(path.read_text(encoding="utf-8"), path)
        for checked in every_kernel(check_source(spec.read_text(encoding="utf-8"), str(spec))):
            sizes = sizes_for(checked, {})
            if sizes.get("D", 0) > MOSAIC_GPU_LARGEST_D:
                sizes = sizes_for(checked, {"D": 128})
            arrays = random_inputs(checked, sizes, seed=0)
            shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
            function = getattr(module, checked.kernel.name)
            calls = {checked.kernel.name: function}
            if checked.gradient is not None and checked.gradient.saving is not None:  # as jax.grad runs it
                calls[f"{checked.kernel.name}_with_residuals"] = function.with_residuals
            for called, call in calls.items():
                for name, lowering in LOWERINGS.items():
                    key = f"{spec.stem}:{called}:{name}"
                    try:
                        around, *kernels = lowering(call, arrays if name == "mosaic_gpu" else shapes)
                    except Exception as error:  # a refusal is part of the fingerprint too
                        found[key] = f"error: {type(error).__name__}: {error}"[:200]
                        continue
                    found[key] = _hash("\n".join(kernels))
                    if around:
                        found[f"{key}:around"] = _hash(around)
    return found


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", help="spec stems (default: every spec in specs/)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project (its specs/ and generated/)")
    parser.add_argument("--compare", type=Path, help="an earlier run's JSON: print what differs, exit 1 if any")
    arguments = parser.parse_args()
    set_libtpu_environment()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    found = fingerprints(arguments.root, arguments.specs)
    if arguments.compare is None:
        json.dump(found, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    before = json.loads(arguments.compare.read_text(encoding="utf-8"))
    keys = found.keys() if arguments.specs else found.keys() | before.keys()  # some specs: only theirs
    changed = sorted(key for key in keys if before.get(key) != found.get(key))
    for key in changed:
        print(f"{key}: {before.get(key)} -> {found.get(key)}")
    print(f"{len(found.keys() - set(changed))} of {len(found)} lowerings unchanged")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
