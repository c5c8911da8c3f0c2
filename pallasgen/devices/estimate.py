"""`pallasgen bench --chip`: the TPU compiler's cycle estimates, on a machine without a TPU.

libtpu compiles for a compile-only chip (a topology description, no hardware) and, with
`--xla_jf_dump_static_llo_profile_to=DIR`, writes one `hlo_op_estimate` per compiled op:
its static cost model for the whole op (every grid step of a Pallas kernel). These are
estimates in cycles, never times: compare a kernel with XLA on the same chip model.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pallasgen.devices.bench import float_outputs, with_backward, work
from pallasgen.devices import compile_only
from pallasgen.analysis.checks import CheckedKernel
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.backends import backend_named

LABEL = "compiler estimate (no TPU): cycles, not time"
PROFILE_FLAG = "--xla_jf_dump_static_llo_profile_to"
_OP = re.compile(r'hlo_op_name:\s*"([^"]*)"\s*estimated_cycles:\s*(\d+)')
_MOSAIC_CALL = re.compile(r'%([\w.\-]+) = [^\n]*custom_call_target="tpu_custom_call"')


@dataclass(frozen=True)
class Estimate:
    kernel: str
    sizes: dict[str, int]
    chip: str
    kernel_cycles: int  # every op of the compiled kernel call: the Mosaic call and XLA ops around it
    mosaic_cycles: int  # the Mosaic custom call alone
    xla_cycles: int  # every op (fusions, copies) of XLA's compile of the reference
    flops: int
    bytes_moved: int
    int8: bool  # the product's operands are int8, so its peak is the int8 one
    grad: bool = False  # of the forward plus backward pass (then no work is counted: flops, bytes 0)

    @property
    def ratio(self) -> float | None:
        """Kernel cycles over XLA's: below 1 the kernel is estimated faster. None when
        XLA's compile wrote no cycles (seen for some int8 products and batched scores)."""
        return ratio(self.kernel_cycles, self.xla_cycles)

    @property
    def speedup(self) -> float | None:
        """XLA's cycles over the kernel's, as every command prints it: above 1 the kernel
        is estimated faster. None when either has no cycles."""
        return speedup(self.kernel_cycles, self.xla_cycles)


def ratio(kernel_cycles: int, xla_cycles: int) -> float | None:
    """Kernel cycles over XLA's (as tuning files record it); None without XLA cycles."""
    return kernel_cycles / xla_cycles if xla_cycles else None


def speedup(kernel_cycles: int, xla_cycles: int) -> float | None:
    return xla_cycles / kernel_cycles if kernel_cycles and xla_cycles else None


def describe_speedup(kernel_cycles: int, xla_cycles: int) -> str:
    """`speedup over XLA 1.25x` (XLA cycles / kernel cycles: above 1 the kernel is estimated faster)."""
    if not xla_cycles:
        return "no XLA estimate to compare with"
    if not kernel_cycles:
        return "no kernel estimate to compare (0 cycles)"
    return f"speedup over XLA {speedup(kernel_cycles, xla_cycles):.2f}x"


def percent_of_peak(estimate: Estimate) -> tuple[float, str] | None:
    """The kernel's work per estimated cycle as a percentage of the chip's peak, and which
    peak; None for a forward plus backward pass, whose work is not counted."""
    if estimate.grad:
        return None
    if not estimate.kernel_cycles:
        return None  # libtpu estimated nothing: no rate to compare with a peak
    chip = backend_named("tpu").chip(estimate.chip)
    seconds = estimate.kernel_cycles / chip.clock_hz
    if estimate.flops:
        peak, name = (chip.int8_ops, "int8") if estimate.int8 else (chip.bf16_flops, "bf16")
        return 100 * estimate.flops / seconds / peak, f"{name} peak"
    return 100 * estimate.bytes_moved / seconds / chip.hbm_bytes, "HBM peak"


def parse_profile(text: str) -> list[tuple[str, int]]:
    """(op name, estimated cycles) of each `hlo_op_estimate` in one profile file."""
    return [(name, int(cycles)) for name, cycles in _OP.findall(text)]


class Estimator:
    """Compiles for one compile-only chip and reads the cost model's cycles per op.

    libtpu reads its flags once, when it loads: construct this before anything else in
    the process touches a TPU topology.
    """

    def __init__(self, chip: str, profile_dir: Path):
        compile_only.set_libtpu_environment()
        os.environ["LIBTPU_INIT_ARGS"] = (
            f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {PROFILE_FLAG}={profile_dir}".strip()
        )
        import jax

        self.chip, self.profile_dir = chip, profile_dir
        self.device = compile_only.tpu_device(chip)
        self.sharding = jax.sharding.NamedSharding(
            jax.sharding.Mesh([self.device], ("x",)), jax.sharding.PartitionSpec()
        )
        self._xla_cycles: dict[tuple, int] = {}  # XLA's compile of a reference, per kernel and sizes

    def op_cycles(self, function, args) -> tuple[dict[str, int], set[str]]:
        """Cycles of each op of `function` compiled for the chip, and the Mosaic calls' names."""
        import jax

        for stale in self.profile_dir.iterdir():
            stale.unlink()
        with jax.default_device(self.device):
            try:
                compiled = jax.jit(function).lower(*args).compile()
            except Exception as error:  # Pallas's Mosaic lowering, Mosaic itself, XLA:TPU
                raise compile_only.CompileError("mosaic", compile_only.first_lines(str(error)), str(error)) from error
        cycles = {}
        for path in self.profile_dir.iterdir():
            cycles.update(parse_profile(path.read_text(encoding="utf-8")))
        if not cycles:
            raise RuntimeError(f"libtpu wrote no {PROFILE_FLAG} profile: was a TPU backend started before?")
        return cycles, set(_MOSAIC_CALL.findall(compiled.as_text()))

    def remember_xla(self, module, checked: CheckedKernel, sizes: dict[str, int], grad: bool, cycles: int) -> None:
        """XLA's cycles for the kernel's reference at `sizes`, as an earlier compile found them."""
        self._xla_cycles[(module.__name__, checked.kernel.name, tuple(sizes.items()), grad)] = cycles

    def estimate(
        self, module, checked: CheckedKernel, sizes: dict[str, int], options: dict, vmem_limit=None, grad=False
    ) -> Estimate:
        """The kernel (compiled by Mosaic, with `options` as keywords) against its reference;
        with `grad`, each one's forward plus backward pass (`bench.with_backward`)."""
        name = checked.kernel.name
        args = arguments(checked, sizes, self.sharding)
        kernel = functools.partial(getattr(module, name), interpret=False, **options)
        reference = getattr(module, name).reference
        if grad:
            cotangents = [struct(decl, sizes, self.sharding) for decl in float_outputs(checked)]
            args = [args, cotangents]
            kernel, reference = with_backward(kernel, checked), with_backward(reference, checked)
        with _scoped_vmem_limit(module, vmem_limit):
            kernel_ops, mosaic_calls = self.op_cycles(kernel, args)
        key = (module.__name__, name, tuple(sizes.items()), grad)
        if key not in self._xla_cycles:
            self._xla_cycles[key] = sum(self.op_cycles(reference, args)[0].values())
        if not mosaic_calls & kernel_ops.keys():
            raise RuntimeError(f"{name}: no Mosaic call among the compiled ops {sorted(kernel_ops)}")
        flops, moved = (0, 0) if grad else work(checked, sizes)
        int8 = checked.has_products and DTYPES[checked.kernel.inputs[0].dtype].bytes == 1
        return Estimate(
            name,
            sizes,
            self.chip,
            kernel_cycles=sum(kernel_ops.values()),
            mosaic_cycles=sum(kernel_ops[op] for op in mosaic_calls & kernel_ops.keys()),
            xla_cycles=self._xla_cycles[key],
            flops=flops,
            bytes_moved=moved,
            int8=int8,
            grad=grad,
        )


def arguments(checked: CheckedKernel, sizes: dict[str, int], sharding=None) -> list:
    """Abstract inputs of the kernel at `sizes`, for tracing or compiling it."""
    return [struct(decl, sizes, sharding) for decl in checked.kernel.inputs]


def struct(decl, sizes: dict[str, int], sharding=None):
    """An abstract array of `decl`'s dtype and shape at `sizes`."""
    import jax

    return jax.ShapeDtypeStruct(tuple(sizes[d] for d in decl.dims), DTYPES[decl.dtype].jnp, sharding=sharding)


@contextlib.contextmanager
def _scoped_vmem_limit(module, limit_bytes):
    """Compiles `module`'s kernels with `vmem_limit_bytes`, in place of the limit the
    generated launcher chooses (`rt.vmem_limit`)."""
    if limit_bytes is None:
        yield
        return
    import jax

    original = module.rt
    module.rt = _WithVmemLimit(original, limit_bytes)
    jax.clear_caches()  # generated functions are jitted: retrace them with the limit
    try:
        yield
    finally:
        module.rt = original
        jax.clear_caches()


class _WithVmemLimit:
    """The runtime `rt`, except that `tpu_params` sets the VMEM limit, whatever it is given."""

    def __init__(self, runtime, limit_bytes):
        self._runtime = runtime
        self._limit_bytes = limit_bytes

    def tpu_params(self, semantics, _):
        return self._runtime.tpu_params(semantics, self._limit_bytes)

    def __getattr__(self, name):
        return getattr(self._runtime, name)


def describe(estimate: Estimate) -> str:
    """One line: cycles of the kernel and of XLA, the speedup over XLA and the percent of
    peak; a percent past 100 is flagged: the cost model then undercounts, so it bounds nothing."""
    shape = ", ".join(f"{d}={n}" for d, n in estimate.sizes.items())
    what = f"{estimate.kernel} forward+backward" if estimate.grad else estimate.kernel
    peak = percent_of_peak(estimate)
    clock = f" at {backend_named('tpu').chip(estimate.chip).clock_hz / 1e9:g} GHz"
    of_peak = ""
    if peak:
        of_peak = f", {peak[0]:.0f}% of {peak[1]}{clock}"
        if peak[0] > 100:
            of_peak += " (past the physical limit: the estimate undercounts, so it is not a bound)"
    return (
        f"{what} [{shape}]: kernel {estimate.kernel_cycles:,} cycles"
        f" (Mosaic calls {estimate.mosaic_cycles:,}), XLA {estimate.xla_cycles:,} cycles,"
        f" {describe_speedup(estimate.kernel_cycles, estimate.xla_cycles)}" + of_peak
    )
