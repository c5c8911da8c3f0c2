"""The real TPU and GPU compilers, run on a machine that has neither accelerator.

- `compile_for_tpu`: Pallas -> Mosaic -> XLA:TPU (libtpu), for a compile-only TPU
  device of a chosen generation.
- `triton_ir` and `compile_triton`: the Triton (`tt`) IR that Pallas emits for CUDA,
  compiled by the `triton` package to PTX and, through the `ptxas` bundled with it, a
  cubin for sm_90.
- `unmasked_accesses`: the loads and stores in that IR that carry no mask.
- `shallow_dots`: the dots in that IR shallower than Triton's dot takes.

Nothing here runs a kernel: a clean compile proves that the compilers accept the
kernel, not that it computes the right numbers on hardware.

jax is imported only inside the functions (pallasgen's build never imports this
module). libtpu reads its environment when it loads, so `set_libtpu_environment()`
must run before jax starts.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass

from pallasgen.backends import backend_named

# What libtpu needs to start on a machine without a TPU (no metadata server, one
# host, one worker), and JAX_PLATFORMS=cpu so that jax does not look for a TPU.
LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "JAX_PLATFORMS": "cpu",
}

# The abstract GPU that Pallas lowers for when no GPU is attached (it then assumes sm_90).
GPU_DEVICE_KIND = "NVIDIA H100 80GB HBM3"
GPU_CORES = 132

TRITON_CALL_TARGET = "__gpu$xla.gpu.triton"  # jaxlib <= 0.10.2: the custom call that carries the tt IR


class CompileError(Exception):
    """A compiler rejected a kernel. `compiler` is "mosaic", "triton" or "ptxas";
    `message` is the first meaningful lines of what it said, `details` all of it."""

    def __init__(self, compiler: str, message: str, details: str = ""):
        self.compiler = compiler
        self.message = message
        self.details = details or message
        super().__init__(f"{compiler}: {message}")


def set_libtpu_environment() -> dict[str, str]:
    """Puts LIBTPU_ENV into os.environ, keeping any value already set; returns what
    was added. Call it before jax is imported."""
    added = {name: value for name, value in LIBTPU_ENV.items() if name not in os.environ}
    os.environ.update(added)
    return added


# What keeps libtpu quiet where there is no TPU: jax loads it to look for one, and
# without these it prints "Failed to find host bounds" and "unexpected worker hostname"
# (it cannot reach a TPU metadata server). They do not make jax pick a TPU.
QUIET_LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
}

GOOGLE_PCI_VENDOR = "0x1ae0"  # a TPU's PCI vendor, as jax's cloud_tpu_init checks it


def tpu_present(root: str = "/") -> bool:
    """Whether this machine has a TPU: a Google PCI device, or a TPU's device files."""
    import glob

    for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
        try:
            with open(vendor, encoding="ascii") as file:
                if file.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return bool(glob.glob(os.path.join(root, "dev/accel*")) or glob.glob(os.path.join(root, "dev/vfio/[0-9]*")))


def quiet_libtpu_without_tpu(root: str = "/") -> dict[str, str]:
    """Where there is no TPU and no TPU_* variable is set, puts QUIET_LIBTPU_ENV into
    os.environ; returns what was added. Call it before jax first looks for devices."""
    if any(name.startswith("TPU_") for name in os.environ) or tpu_present(root):
        return {}
    os.environ.update(QUIET_LIBTPU_ENV)
    return dict(QUIET_LIBTPU_ENV)


def missing_compilers() -> list[str]:
    """Why the compilers cannot run here: one line per missing piece (empty: all there)."""
    import importlib.util

    return [
        f"{package} is not installed"
        for package in ("jax", "libtpu", "triton")
        if importlib.util.find_spec(package) is None
    ]


# --------------------------------------------------------------------------- TPU


@functools.cache
def tpu_device(chip: str = "v5e"):
    """A compile-only TPU device of the given generation ("v5e" or "v6e"); loads libtpu
    on first use."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name=backend_named("tpu").chip(chip).topology, chips_per_host_bounds=(1, 1, 1)
    )
    return topology.devices[0]


def compile_for_tpu(function, args, chip: str = "v5e"):
    """Compiles `function(*args)` for one TPU chip: Pallas -> Mosaic -> XLA:TPU.

    `args` are jax.ShapeDtypeStructs (any sharding is replaced). Tracing runs under
    `jax.default_device(the TPU)`, where Pallas reads the chip from. Returns the
    `jax.stages.Compiled`; a lowering or compile failure raises CompileError. Errors
    that tracing raises (the generated code's own checks) pass through unchanged.
    """
    import jax
    import numpy as np

    device = tpu_device(chip)
    mesh = jax.sharding.Mesh(np.array([device]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
    with jax.default_device(device):
        traced = jax.jit(function).trace(*args)
        try:
            return traced.lower().compile()
        except Exception as error:  # Pallas's Mosaic lowering, Mosaic itself, XLA:TPU
            raise CompileError("mosaic", first_lines(str(error)), str(error)) from error


def first_lines(text: str, limit: int = 4) -> str:
    """The first lines that say something: no status prefix, no blank lines, no IR dump."""
    text = re.sub(r"^[A-Z_]+: ", "", text.strip())
    lines = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith(("The MLIR operation involved", "%", "module", "func.func", "Traceback")):
            break
        lines.append(line)
        if len(lines) == limit:
            break
    return "\n".join(lines)


# --------------------------------------------------------------------------- Triton


@dataclass(frozen=True)
class TritonKernel:
    """One pallas_call as Pallas's Triton lowering emits it for CUDA."""

    name: str
    ttir: str  # the tt module, as text
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]

    def __str__(self) -> str:
        return self.ttir


@dataclass(frozen=True)
class TritonBinary:
    """What Triton and ptxas made of one kernel."""

    name: str
    ptx: str
    cubin: bytes
    shared: int  # bytes of shared memory
    registers: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    ptxas_log: str
    seconds: float


def triton_ir(function, args) -> list[TritonKernel]:
    """The tt IR of each pallas_call in `function(*args)` (in order), lowered for CUDA on
    an abstract H100 (PALLAS_NOTES section 4). `args` are jax.ShapeDtypeStructs.

    jaxlib 0.10.2 serializes the module into the backend config of a custom call
    named TRITON_CALL_TARGET; it is read back here with the tt dialect registered.
    """
    import jax
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect
    from jax._src.mesh import AbstractDevice

    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    device = AbstractDevice(device_kind=GPU_DEVICE_KIND, num_cores=GPU_CORES, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        traced = jax.jit(function).trace(*args)
        try:
            lowered = traced.lower(lowering_platforms=("cuda",))
        except Exception as error:  # Pallas's Triton lowering
            raise CompileError("triton", first_lines(str(error)), str(error)) from error

    kernels = []
    for op in _operations(lowered.compiler_ir("stablehlo").operation):
        if op.name != "stablehlo.custom_call":
            continue
        target = ir.StringAttr(op.attributes["call_target_name"]).value
        if target != TRITON_CALL_TARGET:
            if "triton" in target:
                raise NotImplementedError(f"custom call {target}: this jaxlib stores Triton kernels differently")
            continue
        config = ir.DictAttr(op.attributes["mhlo.backend_config"])
        context = mlir.make_ir_context()
        tt_dialect.register_dialect(context)
        with context:
            module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
            text = module.operation.get_asm(enable_debug_info=False)
        kernels.append(
            TritonKernel(
                name=ir.StringAttr(config["name"]).value,
                ttir=text,
                num_warps=ir.IntegerAttr(config["num_warps"]).value,
                num_stages=ir.IntegerAttr(config["num_stages"]).value,
                grid=tuple(ir.IntegerAttr(config[f"grid_{axis}"]).value for axis in "xyz"),
            )
        )
    return kernels


def _operations(operation):
    """Every operation nested in `operation`, depth first."""
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation
                yield from _operations(op.operation)


def compile_triton(
    ttir: str | TritonKernel, capability: int = 90, *, num_warps: int | None = None, num_stages: int | None = None
) -> TritonBinary:
    """Compiles tt IR with the installed `triton` for GPUTarget("cuda", capability, 32):
    TTIR -> TTGIR -> LLVM IR -> PTX -> cubin (ptxas -v). Warps and stages default to
    the kernel's own (a TritonKernel) or 4 and 3.

    Uses a fresh Triton cache, so the compilers always run. A failure raises
    CompileError with the compiler's message.
    """
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    if isinstance(ttir, TritonKernel):
        num_warps = ttir.num_warps if num_warps is None else num_warps
        num_stages = ttir.num_stages if num_stages is None else num_stages
        ttir = ttir.ttir
    options = {"num_warps": num_warps or 4, "num_stages": num_stages or 3, "enable_fp_fusion": True}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pallasgen-triton-") as scratch:
        source = os.path.join(scratch, "kernel.ttir")
        with open(source, "w", encoding="utf-8") as file:
            file.write(ttir)
        stdout, stderr = io.StringIO(), os.path.join(scratch, "stderr")
        try:
            with knobs.cache.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(stdout), _stderr_to(stderr):
                knobs.cache.dir = os.path.join(scratch, "cache")
                knobs.nvidia.dump_ptxas_log = True  # printed on stdout
                compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
        except Exception as error:
            said = _read(stderr) + stdout.getvalue()
            compiler = "ptxas" if type(error).__name__ == "PTXASError" else "triton"
            details = f"{error}\n{said}".strip()
            raise CompileError(compiler, first_lines(_diagnostics(said) or str(error)), details) from error
        log = stdout.getvalue()
    seconds = time.perf_counter() - start
    usage = _ptxas_usage(log)
    return TritonBinary(
        name=compiled.metadata.name,
        ptx=compiled.asm["ptx"],
        cubin=compiled.asm["cubin"],
        shared=compiled.metadata.shared,
        ptxas_log=log,
        seconds=seconds,
        **usage,
    )


@contextlib.contextmanager
def _stderr_to(path: str):
    """Sends file descriptor 2 to `path` meanwhile: MLIR and LLVM write their
    diagnostics there from C++, out of reach of sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "wb") as file:
            os.dup2(file.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except FileNotFoundError:
        return ""


def _diagnostics(text: str) -> str:
    """MLIR's `...: error: ...` lines, if any."""
    return "\n".join(line for line in text.splitlines() if "error:" in line)


def _ptxas_usage(log: str) -> dict[str, int]:
    """Registers and spills from `ptxas -v` output."""
    registers = re.search(r"Used (\d+) registers", log)
    stores = re.search(r"(\d+) bytes spill stores", log)
    loads = re.search(r"(\d+) bytes spill loads", log)
    if not (registers and stores and loads):
        raise CompileError("ptxas", "no resource usage in the ptxas -v log", log)
    return {
        "registers": int(registers.group(1)),
        "spill_stores": int(stores.group(1)),
        "spill_loads": int(loads.group(1)),
    }


# --------------------------------------------------------------------------- bounds

_ACCESS = re.compile(r"""(?:^|[\s=])"?(tt\.load|tt\.store)"?[\s(]""")


def unmasked_accesses(ttir: str | TritonKernel) -> list[str]:
    """Every tt.load and tt.store in the IR that has no mask operand, as
    "line N: tt.store %29, %10 : tensor<64x64x!tt.ptr<f32>>".

    A BlockSpec on Triton is plain pointer arithmetic: where a block can overhang its
    array (a ragged size, or a block larger than the array), an unmasked access reads
    or writes memory outside it. A mask that does not cover every overhanging
    dimension is not detected.
    """
    found = []
    for number, line in enumerate(str(ttir).splitlines(), 1):
        match = _ACCESS.search(line)
        if match is None:
            continue
        op = match.group(1)
        operands = _operand_count(line[match.end() - 1 :])
        if operands < (2 if op == "tt.load" else 3):
            found.append(f"line {number}: {line.strip()}")
    return found


def _operand_count(rest: str) -> int:
    """SSA operands of a tt.load/tt.store, pretty (`%a, %b : ...`) or generic (`("%a, %b")`)."""
    rest = rest.lstrip()
    if rest.startswith('"'):
        rest = rest[1:]
    if rest.startswith("("):  # generic form
        return len(re.findall(r"%[\w.#]+", rest[: rest.index(")")]))
    return len(re.findall(r"%[\w.#]+", rest.split(":", 1)[0]))


# --------------------------------------------------------------------------- dots

# `%7 = tt.dot %1, %2, %3, ... : tensor<16x4xbf16> * tensor<4x16xbf16> -> tensor<16x16xf32>`
_DOT = re.compile(r"tt\.dot\b.*:\s*tensor<(?:\d+x)*(\d+)x(\w+)>\s*\*")

# The least depth (contracted size) of Triton's dot on CUDA by the operands' bits, as
# tl.dot checks it (`min_dot_size` in triton/backends/nvidia/compiler.py).
SMALLEST_DOT_DEPTH = {8: 32, 16: 16, 32: 8, 64: 4}


def shallow_dots(ttir: str | TritonKernel) -> list[str]:
    """Every tt.dot in the IR whose depth is less than Triton's dot takes for its
    operands, as "line N: %7 = tt.dot ... : tensor<16x4xbf16> * ...".

    Pallas emits tt.dot without the check that tl.dot makes. XLA's Triton compiled
    attention kernels whose dots had depth 4 and 1 (D=3, D=1), and they gave wrong values
    on an H200 (issue 33); upstream Triton fails an assertion in TritonGPUAccelerateMatmul.
    """
    found = []
    for number, line in enumerate(str(ttir).splitlines(), 1):
        match = _DOT.search(line)
        if match is None:
            continue
        depth, element = int(match.group(1)), match.group(2)
        bits = int(re.match(r"[a-z]+(\d+)", element).group(1))  # bf16, f32, i8, f8E4M3FN
        if depth < SMALLEST_DOT_DEPTH[bits]:
            found.append(f"line {number}: {line.strip()}")
    return found
