"""Test support for generated kernels: loading modules, discovery, inputs and references.

The independent references here are written in NumPy and computed in float64 from
the inputs exactly as the kernel sees them (bf16 inputs already rounded), so they
share no code with pallasgen or with the generated references (`NAME.reference`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallasgen.runtime.constants import public_keyword

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "generated"

BF16 = np.dtype(ml_dtypes.bfloat16)
NUMPY_DTYPES = {
    "f32": np.dtype(np.float32),
    "bf16": BF16,
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "i16": np.dtype(np.int16),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


# --------------------------------------------------------------------------- modules


# A one-kernel spec for tests of the build path, the cache and project settings.
ADD_VECTORS_SPEC = """kernel add_vectors {
    in  x: f32[N]
    in  y: f32[N]
    out z: f32[N]
    z = x + y
    block N = 1024
}
"""


def load_module(path: Path, name: str) -> ModuleType:
    """Imports the Python file at `path` as a fresh module called `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def generated_module(stem: str) -> ModuleType:
    """The bundled module `generated/STEM.py`, imported by file path (once per session)."""
    return load_module(GENERATED / f"{stem}.py", f"_pallasgen_generated_{stem}")


def kernel_of(stem: str, name: str):
    """A bundled module's kernel by name; `NAME_with_residuals`, where no kernel saves them
    apart: NAME's `with_residuals` (its outputs, then the residuals its forward pass saves
    under jax.grad)."""
    module = generated_module(stem)
    if name.endswith(WITH_RESIDUALS) and not hasattr(module, name):
        return WithResiduals(getattr(module, name.removesuffix(WITH_RESIDUALS)))
    return getattr(module, name)


WITH_RESIDUALS = "_with_residuals"


class WithResiduals:
    """A kernel called for its outputs and residuals (`with_residuals`), with the
    kernel's name, module (`__wrapped__`), keywords (`options`), tables of blocks and
    cache; no `reference`: the residuals have none (the NumPy references check them)."""

    def __init__(self, kernel):
        self.kernel, self.options, self.__name__ = kernel, kernel.options, kernel.__name__
        self.__wrapped__ = kernel.__wrapped__
        self.tpu_blocks, self.triton_options = kernel.tpu_blocks, kernel.triton_options

    def __call__(self, *arrays, **keywords):
        return self.kernel.with_residuals(*arrays, **keywords)

    def clear_cache(self):
        self.kernel.clear_cache()


def take_gpu_branch(monkeypatch, module: ModuleType) -> None:
    """Make a generated module's dispatch run the Triton kernel, passing `interpret` on,
    so that the GPU path runs in interpret mode on CPU. (The real dispatch follows the
    lowering platform: see test_dispatch.py.)"""

    def on_gpu(kernel, arrays, *, tpu, triton, mosaic_gpu, gpu_backend, on_hopper, interpret):
        return module.rt.gpu_kernel(kernel, gpu_backend, triton, mosaic_gpu, on_hopper)(*arrays, interpret=interpret)

    monkeypatch.setattr(module.rt, "on_platform", on_gpu)


def module_from_spec(tmp_path_factory, source: str, stem: str) -> ModuleType:
    """The module generated from `source` as specs/STEM.pallas, imported."""
    from pallasgen.workspace.pipeline import generate

    path = tmp_path_factory.mktemp(stem) / f"{stem}.py"
    path.write_text(generate(source, f"specs/{stem}.pallas", f"specs/{stem}.pallas"), encoding="utf-8")
    return load_module(path, f"_pallasgen_{stem}")


@contextlib.contextmanager
def on_path(module: ModuleType, path: str, monkeypatch):
    """The module's kernels run on `path`: "tpu" (the TPU kernels interpreted, the CPU
    default) or "gpu" (the Triton kernels interpreted); their traces, which hold the path
    they were traced on, are dropped before and after."""
    for name in kernels_in(module):
        getattr(module, name).clear_cache()
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)
    yield path
    for name in kernels_in(module):
        getattr(module, name).clear_cache()


def abstract_arrays(signature, sizes: dict[str, int]) -> list[jax.ShapeDtypeStruct]:
    """Abstract arrays of a kernel's inputs, given as (dtype, dimensions) pairs."""
    return [jax.ShapeDtypeStruct([sizes[d] for d in dims], NUMPY_DTYPES[dtype]) for dtype, dims in signature]


def float_inputs(signature) -> tuple[int, ...]:
    """The positions of the float inputs among a kernel's (dtype, dimensions) pairs: what
    jax.grad differentiates by."""
    from pallasgen.analysis.dtypes import DTYPES

    return tuple(i for i, (dtype, _) in enumerate(signature) if DTYPES[dtype].is_float)


def compiled_gradient(kernel_fn, argnums: tuple[int, ...], **keywords):
    """jax.grad, by the inputs `argnums`, of the sum of a kernel's outputs with
    interpret=False: the forward kernel that saves its residuals and every backward
    kernel, as the real compilers take them."""
    forward = functools.partial(kernel_fn, interpret=False, **keywords)

    def loss(*arrays):
        return sum(jnp.sum(out.astype(jnp.float32)) for out in jax.tree.leaves(forward(*arrays)))

    return jax.grad(loss, argnums=argnums)


def lowered_for_mosaic_gpu(function, args) -> str:
    """The module of jax.jit(function) exported for CUDA on an abstract H100 as text: each
    Mosaic GPU kernel a `custom_call @mosaic_gpu`, Triton's let through. Skips the test
    where this jax line does not import Mosaic GPU (0.10.2 without absl-py)."""
    import pytest
    from jax._src.mesh import AbstractDevice

    from pallasgen.devices import compile_only

    pytest.importorskip("jax.experimental.pallas.mosaic_gpu", reason="jax 0.10.2 imports it only with absl-py")
    disabled = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    device = AbstractDevice(device_kind=compile_only.GPU_DEVICE_KIND, num_cores=compile_only.GPU_CORES, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
        exported = jax.export.export(jax.jit(function), platforms=["cuda"], disabled_checks=disabled)
        return exported(*args).mlir_module()


def _missing_compilers() -> list[str]:
    from pallasgen.devices import compile_only

    return compile_only.missing_compilers()


# The compiled tier: tests that need libtpu and triton, which `pip install -e '.[dev]'` gives.
compiled = pytest.mark.skipif(
    bool(_missing_compilers()), reason="needs libtpu (jax[tpu]) and triton: pip install -e '.[dev]'"
)


def kernels_in(module: ModuleType) -> list[str]:
    """Names of the kernels in a generated module: its public functions (`rt.kernel`)."""
    return sorted(name for name, value in vars(module).items() if isinstance(value, module.rt.Kernel))


def bundled_kernels() -> list[tuple[str, str | None]]:
    """(module stem, kernel name) for every kernel in generated/*.py.

    A module that fails to import yields (stem, None), so that the tests using it
    fail with the import error instead of the whole collection breaking.
    """
    found: list[tuple[str, str | None]] = []
    for path in sorted(GENERATED.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            module = generated_module(path.stem)
        except Exception:  # reported by the tests that use it
            found.append((path.stem, None))
            continue
        found += [(path.stem, kernel) for kernel in kernels_in(module)]
    return found


def block_defaults(kernel_fn) -> dict[str, int]:
    """The kernel's `block_<dim>` keywords and the blocks a call that passes none takes on
    CPU: its TPU launcher's keywords, the spec's blocks from its table (`tpu_blocks`)."""
    module = kernel_fn.__wrapped__.__globals__
    launcher = inspect.signature(module[f"_{kernel_fn.__name__}_tpu"]).parameters
    keywords = [name for name in launcher if name.startswith("block_")]
    if not keywords:
        return {}
    return dict(zip(keywords, kernel_fn.tpu_blocks.chips[None]["default"]))


def gpu_block_defaults(kernel_fn) -> dict[str, int]:
    """The kernel's `gpu_block_<dim>` keywords (among `kernel_fn.options`) and the spec's
    block for each: the built-in entry of its Triton launcher's table holds the blocks
    first, in the order of the launcher's `block_<dim>` keywords."""
    launcher = kernel_fn.__wrapped__.__globals__[f"_{kernel_fn.__name__}_gpu"]
    blocks = [name for name in inspect.signature(launcher).parameters if name.startswith("block_")]
    table = kernel_fn.triton_options.table
    defaults = {public_keyword("triton", name): block for name, block in zip(blocks, table[None])}
    return {name: defaults[name] for name in kernel_fn.options if name.startswith("gpu_block_")}


def small_gpu_blocks(kernel_fn) -> dict[str, int]:
    """Each `gpu_block_<dim>` keyword of the kernel at 16, or at the spec's block where
    that is smaller (one row per program stays one row)."""
    return {name: min(16, block) for name, block in gpu_block_defaults(kernel_fn).items()}


# --------------------------------------------------------------------------- operands


@dataclass(frozen=True)
class Operand:
    """One input or output array of a kernel: its name, spec dtype and named dimensions."""

    name: str
    dtype: str
    dims: tuple[str, ...]

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] for d in self.dims)


def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Seeded values of a spec dtype: normal floats, small integers, random bools."""
    np_dtype = NUMPY_DTYPES[dtype]
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        low, high = max(info.min, -100), min(info.max, 100)
        return rng.integers(low, high, size=shape, endpoint=True).astype(np_dtype)
    return (rng.standard_normal(shape) * 2.0).astype(np_dtype)


# --------------------------------------------------------------------------- references


def f64(a) -> np.ndarray:
    """An input as float64, exactly as stored (bf16 values are already rounded)."""
    return np.asarray(a).astype(np.float64)


def leaky_numpy(x, *, slope=0.01):
    """Leaky ReLU and its positive mask: y = x if x > 0 else slope * x."""
    x = f64(x)
    positive = x > 0
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.where(positive, x, slope * x)
    return y, positive.astype(np.int32)


def gelu_tanh_numpy(z):
    """GELU, tanh approximation: 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""
    with np.errstate(invalid="ignore", over="ignore"):
        return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def bias_gelu_numpy(x, bias, scale):
    """gelu(x * scale[m] + bias[n]) for x of shape (M, N)."""
    with np.errstate(invalid="ignore", over="ignore"):
        z = f64(x) * f64(scale)[:, None] + f64(bias)[None, :]
    return (gelu_tanh_numpy(z),)


def quantize_rows_numpy(x, scale):
    """round-half-up(x / scale[m]) clipped to [-128, 127]; NaN gives 0. In float32, as the
    kernel divides, so that values on a rounding boundary round the same way."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        scaled = np.asarray(x, np.float32) / np.asarray(scale, np.float32)[:, None]
        rounded = np.clip(np.floor(scaled + np.float32(0.5)), -128, 127)
        return (np.where(np.isnan(scaled), 0, rounded).astype(np.int8),)


def add_vectors_numpy(x, y):
    """Elementwise x + y."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (f64(x) + f64(y),)


def giou_numpy(ax1, ay1, ax2, ay2, bx1, by1, bx2, by2, *, eps=1e-7):
    """Generalized IoU (Rezatofighi et al. 2019): IoU - |C minus (A u B)| / |C|.

    C is the smallest axis-aligned box enclosing A and B; `eps` is added to both
    denominators.
    """
    ax1, ay1, ax2, ay2, bx1, by1, bx2, by2 = map(f64, (ax1, ay1, ax2, ay2, bx1, by1, bx2, by2))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        overlap_w = np.clip(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0.0, None)
        overlap_h = np.clip(np.minimum(ay2, by2) - np.maximum(ay1, by1), 0.0, None)
        intersection = overlap_w * overlap_h
        union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - intersection
        enclosing = (np.maximum(ax2, bx2) - np.minimum(ax1, bx1)) * (np.maximum(ay2, by2) - np.minimum(ay1, by1))
        return (intersection / (union + eps) - (enclosing - union) / (enclosing + eps),)


# --------------------------------------------------------------------------- reductions
#
# Reductions remove a named dimension: here always an axis of a NumPy array (the last,
# N or V, or the first for column sums). Floats are computed in float64 from the inputs
# as stored; integer results in int64, exact.


def exact(a) -> np.ndarray:
    """An input widened without rounding: float64 for floats (bf16 included), int64 for
    integers and bools."""
    a = np.asarray(a)
    return a.astype(np.int64) if a.dtype.kind in "iub" else a.astype(np.float64)


def wrap(values, like) -> np.ndarray:
    """Integer results wrapped to the inputs' width, as fixed-width integers wrap in jax
    (i8: 100 + 100 == -56); floats unchanged."""
    like = np.asarray(like)
    return values.astype(like.dtype).astype(np.int64) if like.dtype.kind in "iu" else values


def first_index(hits) -> np.ndarray:
    """The first position along the last axis where `hits` holds, per row (0 for a row
    with none)."""
    hits = np.asarray(hits, bool)
    size = hits.shape[-1]
    first = np.where(hits, np.arange(size), size).min(axis=-1, initial=size)
    return np.where(first == size, 0, first)


def logsumexp_numpy(z):
    """log(sum(exp(z))) along the last axis, with the row's maximum taken out first so
    that no term overflows."""
    top = z.max(axis=-1)
    return top + np.log(np.exp(z - top[..., None]).sum(axis=-1))


def softmax_numpy(x):
    """exp(x - max) / sum(exp(x - max)) along N."""
    x = f64(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True),)


def log_softmax_numpy(x):
    """x - logsumexp(x) along N."""
    x = f64(x)
    return (x - logsumexp_numpy(x)[:, None],)


def layer_norm_numpy(x, w, b, *, eps=1e-5):
    """(y, mu, rstd): each row's mean mu and 1 / sqrt(variance + eps) (the biased variance,
    dividing by N), and y = (x - mu) * rstd * w + b."""
    h = f64(x)
    mu = h.mean(axis=-1)
    d = h - mu[:, None]
    rstd = 1.0 / np.sqrt((d * d).mean(axis=-1) + eps)
    return d * rstd[:, None] * f64(w) + f64(b), mu, rstd


def rms_norm_numpy(x, w, *, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * w along N."""
    h = f64(x)
    return (h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps) * f64(w),)


def cross_entropy_numpy(logits, label):
    """logsumexp of each row's logits minus the logit at the row's label. A label
    outside [0, V) matches no position, so nothing is subtracted (the spec's
    `sum(where(index(V) == label, z, 0), V)` is then 0)."""
    z = f64(logits)
    label = exact(label)
    vocabulary = z.shape[1]
    inside = (label >= 0) & (label < vocabulary)
    picked = np.where(inside, z[np.arange(z.shape[0]), np.clip(label, 0, max(vocabulary - 1, 0))], 0.0)
    return (logsumexp_numpy(z) - picked,)


def argmax_numpy(x):
    """The first position of each row's maximum (as jnp.argmax, NaN aside)."""
    x = exact(x)
    return (first_index(x == x.max(axis=-1, keepdims=True)),)


def argmin_numpy(x):
    """The first position of each row's minimum (as jnp.argmin, NaN aside)."""
    x = exact(x)
    return (first_index(x == x.min(axis=-1, keepdims=True)),)


def column_sums_numpy(x):
    """The sum of each column: x summed over M."""
    return (f64(x).sum(axis=0),)


def quantize_rows_int8_numpy(x):
    """(q, scale): scale = max(max |x| of the row, 1e-30) / 127, q = x / scale rounded
    half to even (np.rint), so the row's largest magnitude maps to +-127."""
    x = f64(x)
    scale = np.maximum(np.abs(x).max(axis=-1), 1e-30) / 127.0
    return np.rint(x / scale[:, None]).astype(np.int64), scale


def equal_count_numpy(x, y):
    """How many positions hold equal values (IEEE equality: -0.0 == 0.0), as a 0-d int."""
    return (np.asarray(np.count_nonzero(exact(x) == exact(y)), np.int64),)


# The reductions' backward kernels (gradients/reverse.py), by hand in float64: each
# kernel's inputs' cotangents from its inputs and its outputs' cotangents. The forward
# pass saves the reductions the backward kernels read (residuals: NAME_with_residuals).
def softmax_residuals_numpy(x):
    """softmax's saved reductions of each row: sum(exp(x - max)), argmax (first) and max."""
    x = f64(x)
    top = x.max(axis=-1)
    return np.exp(x - top[:, None]).sum(axis=-1), first_index(x == top[:, None]), top


def softmax_with_residuals_numpy(x):
    return (*softmax_numpy(x), *softmax_residuals_numpy(x))


def softmax_backward_numpy(x, dy):
    """y * (dy - sum(dy * y)) along N, y = softmax(x)."""
    (y,) = softmax_numpy(x)
    return (y * (f64(dy) - (f64(dy) * y).sum(axis=-1, keepdims=True)),)


def log_softmax_with_residuals_numpy(x):
    return (*log_softmax_numpy(x), logsumexp_numpy(f64(x)))


def log_softmax_backward_numpy(x, dy):
    """dy - softmax(x) * sum(dy) along N."""
    (y,) = softmax_numpy(x)
    return (f64(dy) - y * f64(dy).sum(axis=-1, keepdims=True),)


def layer_norm_with_residuals_numpy(x, w, b, *, eps=1e-5):
    """(y, mu, rstd) and each row's variance, which the backward kernel reads."""
    y, mu, rstd = layer_norm_numpy(x, w, b, eps=eps)
    return y, mu, rstd, ((f64(x) - mu[:, None]) ** 2).mean(axis=-1)


def layer_norm_full_backward_numpy(x, w, b, dy, dmu, drstd, *, eps=1e-5):
    """dx, dw, db of (y, mu, rstd) = layer_norm(x, w, b). With d = x - mu, xhat = d rstd
    and g = dy w: y gives rstd (g - mean(g) - xhat mean(g xhat)); mu gives dmu / N; rstd =
    (var + eps)^-1/2 gives -drstd rstd^3 d / N. dw = sum(dy xhat), db = sum(dy) over M."""
    _, mu, rstd = (a[:, None] for a in layer_norm_numpy(x, np.ones(np.shape(x)[1]), 0.0, eps=eps))
    d = f64(x) - mu
    n = d.shape[-1]
    xhat, g = d * rstd, f64(dy) * f64(w)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dx += f64(dmu)[:, None] / n - f64(drstd)[:, None] * rstd**3 * d / n
    return dx, (f64(dy) * xhat).sum(axis=0), f64(dy).sum(axis=0)


def rms_norm_with_residuals_numpy(x, w, *, eps=1e-6):
    """y and each row's mean square, which the backward kernels read."""
    return (*rms_norm_numpy(x, w, eps=eps), (f64(x) ** 2).mean(axis=-1))


def rms_norm_full_backward_numpy(x, w, dy, *, eps=1e-6):
    """dx, dw of y = h r w, r = (mean(h^2) + eps)^-1/2: dx = r dy w - h r^3 mean(dy w h),
    dw = sum(dy h r) over M."""
    h = f64(x)
    r = 1.0 / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps)
    g = f64(dy) * f64(w)
    return r * g - h * r**3 * (g * h).mean(axis=-1, keepdims=True), (f64(dy) * h * r).sum(axis=0)


def rmsnorm_matmul_lhs_numpy(x, g):
    """rmsnorm_matmul's operand, h r g with r = (mean(h^2, K) + 1e-6)^-1/2, and each row's
    mean square: rms_norm over K."""
    return rms_norm_with_residuals_numpy(x, g)


def rmsnorm_matmul_inputs(rng, sizes):
    """x bf16 [M, K] and g f32 [K]: rms_norm_inputs over K."""
    return rms_norm_inputs(rng, {"M": sizes["M"], "N": sizes["K"]})


def matmul_softmax_backward_numpy(y, dy):
    """The cotangent of softmax's argument from its output y: y (dy - sum(dy y, N))."""
    y, dy = f64(y), f64(dy)
    return (y * (dy - (dy * y).sum(axis=-1, keepdims=True)),)


def cross_entropy_with_residuals_numpy(logits, label):
    """(loss, lse): cross_entropy and each row's log-sum-exp, which its backward reads."""
    return (*cross_entropy_numpy(logits, label), logsumexp_numpy(f64(logits)))


def cross_entropy_backward_numpy(logits, label, lse, dloss):
    """dloss (softmax(logits) - one_hot(label)): lse is the row's log-sum-exp."""
    z = f64(logits)
    picked = np.arange(z.shape[1]) == exact(label)[:, None]
    return (f64(dloss)[:, None] * (np.exp(z - f64(lse)[:, None]) - picked),)


def column_sums_backward_numpy(x, ds):
    """ds, the same for every row."""
    return (np.broadcast_to(f64(ds), np.shape(x)),)


def quantize_rows_int8_with_residuals_numpy(x):
    """(q, scale) and each row's largest magnitude and its first position."""
    a = np.abs(f64(x))
    return (*quantize_rows_int8_numpy(x), a.max(axis=-1), first_index(a == a.max(axis=-1, keepdims=True)))


def quantize_rows_int8_backward_numpy(x, dscale):
    """scale = max(max |x|, 1e-30) / 127: dscale / 127 times the sign of x (+ at 0, as
    JAX's abs) at the FIRST position of each row's largest magnitude, 0 elsewhere and in a
    row whose largest magnitude is below 1e-30."""
    a = np.abs(f64(x))
    first = np.arange(a.shape[1]) == first_index(a == a.max(axis=1, keepdims=True))[:, None]
    g = np.where(a.max(axis=1) > 1e-30, f64(dscale) / 127.0, 0.0)[:, None]
    return (np.where(first, g * np.where(f64(x) >= 0, 1.0, -1.0), 0.0),)


def saved_inputs(make_inputs, forward_numpy, saved: tuple[Operand, ...], *cotangents: Operand, inputs=None):
    """A backward kernel's inputs: those `make_inputs` makes for its kernel (the positions
    `inputs` of them, all if None), the forward outputs and residuals `saved`, taken by
    name from NAME_with_residuals's outputs by `forward_numpy` (SAVED_NAMES), then a
    random cotangent for each output given."""

    def make(rng, sizes):
        arrays = make_inputs(rng, sizes)
        outputs = dict(zip(SAVED_NAMES[forward_numpy], forward_numpy(*arrays)))
        kept = arrays if inputs is None else [arrays[i] for i in inputs]
        values = [np.asarray(outputs[o.name]).astype(NUMPY_DTYPES[o.dtype]) for o in saved]
        return kept + values + [random_array(rng, c.dtype, c.shape(sizes)) for c in cotangents]

    return make


SAVED_NAMES = {
    softmax_with_residuals_numpy: ("y", "sum_n", "argmax_n", "max_n"),
    log_softmax_with_residuals_numpy: ("y", "logsumexp_n"),
    layer_norm_with_residuals_numpy: ("y", "mu", "rstd", "mean_n"),
    rms_norm_with_residuals_numpy: ("y", "mean_n"),
    rmsnorm_matmul_lhs_numpy: ("lhs", "mean_k"),
    cross_entropy_with_residuals_numpy: ("loss", "logsumexp_v"),
    quantize_rows_int8_with_residuals_numpy: ("q", "scale", "max_n", "argmax_n"),
}


def add_numpy(x, y):
    """x + y, wrapping in the inputs' integer width."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (wrap(exact(x) + exact(y), x),)


def mul_numpy(x, y):
    """x * y, wrapping in the inputs' integer width."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (wrap(exact(x) * exact(y), x),)


# --------------------------------------------------------------------------- derivatives
#
# The cotangents that a kernel's backward kernels return, from its inputs and the
# cotangents of its outputs (dy for y), derived by hand from the references above and
# computed in float64: they share nothing with pallasgen's derivative rules.


def leaky_backward_numpy(x, dy, *, slope=0.01):
    """dx = dy where x > 0, slope * dy elsewhere (at 0 too: relu's derivative at 0 is 0)."""
    return (np.where(f64(x) > 0, f64(dy), slope * f64(dy)),)


def gelu_tanh_derivative_numpy(z):
    """d/dz gelu(z) = c + 0.5 z (1 - t^2) k (1 + 3 * 0.044715 z^2), with k = sqrt(2/pi),
    t = tanh(k (z + 0.044715 z^3)) and c = 0.5 (1 + t)."""
    k = np.sqrt(2.0 / np.pi)
    t = np.tanh(k * (z + 0.044715 * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * z * z)


def bias_gelu_dz(x, bias, scale, dy):
    """The cotangent of z = x * scale + bias, per element."""
    z = f64(x) * f64(scale)[:, None] + f64(bias)[None, :]
    return f64(dy) * gelu_tanh_derivative_numpy(z)


def bias_gelu_backward_numpy(x, bias, scale, dy):
    """dx = dz * scale."""
    return (bias_gelu_dz(x, bias, scale, dy) * f64(scale)[:, None],)


def bias_gelu_backward_over_m_numpy(x, bias, scale, dy):
    """dbias: dz summed over the rows (M), over which bias is broadcast."""
    return (bias_gelu_dz(x, bias, scale, dy).sum(axis=0),)


def bias_gelu_backward_over_n_numpy(x, bias, scale, dy):
    """dscale: dz * x summed over the columns (N), over which scale is broadcast."""
    return ((bias_gelu_dz(x, bias, scale, dy) * f64(x)).sum(axis=1),)


def gqa_backward_over_r_numpy(dk_r, dv_r):
    """gqa's dk and dv: each query head's share summed over the R heads of its group."""
    return f64(dk_r).sum(axis=2), f64(dv_r).sum(axis=2)


def scores_backward_epilogue_numpy(ds, *, scale=0.125):
    """The cotangent of q @ k.T in s = (q @ k.T) * scale."""
    return (f64(ds) * scale,)


def linear_backward_over_m_numpy(dy):
    """dbias of y = x @ w.T + bias: dy summed over the rows."""
    return (f64(dy).sum(axis=0),)


def add_backward_numpy(dz):
    """dx = dy = dz."""
    return f64(dz), f64(dz)


def mul_backward_numpy(x, y, dz):
    """dx = dz * y, dy = dz * x."""
    return f64(dz) * f64(y), f64(dz) * f64(x)


def giou_backward_numpy(ax1, ay1, ax2, ay2, bx1, by1, bx2, by2, dgiou, *, eps=1e-7):
    """The cotangent of each box coordinate: dgiou times the slope of giou_numpy along it,
    in float64, as the mean of its one-sided slopes (each a second-order difference with
    step 1e-5 on coordinates of 0 to 150). Where two coordinates tie (a box and itself,
    where GIoU has a kink), that mean is what splitting a maximum's or minimum's
    cotangent in halves at a tie gives; elsewhere it is the slope."""
    boxes = [f64(c) for c in (ax1, ay1, ax2, ay2, bx1, by1, bx2, by2)]

    def giou_at(i, shift):
        return giou_numpy(*(c + shift if j == i else c for j, c in enumerate(boxes)), eps=eps)[0]

    step = 1e-5
    found = []
    for i in range(8):
        right = (-3 * giou_at(i, 0) + 4 * giou_at(i, step) - giou_at(i, 2 * step)) / (2 * step)
        left = (3 * giou_at(i, 0) - 4 * giou_at(i, -step) + giou_at(i, -2 * step)) / (2 * step)
        found.append(f64(dgiou) * (left + right) / 2)
    return tuple(found)


# --------------------------------------------------------------------------- inputs


def quantize_rows_inputs(rng, sizes):
    """Values spread over the int8 range and past it, with positive per-row scales."""
    x = (rng.standard_normal((sizes["M"], sizes["N"])) * 100.0).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, sizes["M"]).astype(np.float32)
    # XLA may divide by a broadcast scale as a multiply by its reciprocal, and a GPU's
    # division may be an ulp or two off: a quotient within a few ulps of a rounding tie
    # (k + 0.5) could then round either way, so such values are moved off the tie.
    quotient = (x / scale[:, None]).astype(np.float64)
    near_tie = np.abs(quotient - np.floor(quotient) - 0.5) <= 8 * np.abs(quotient) * 2.0**-23
    x[near_tie] *= np.float32(1 + 2.0**-16)
    return [x, scale]


def leaky_inputs(rng, sizes):
    """Normal values with some exact zeros (+0.0 and -0.0), where `x > 0` is False."""
    x = (rng.standard_normal((sizes["M"], sizes["N"])) * 3.0).astype(np.float32)
    x.flat[::7] = 0.0
    x.flat[3::11] = -0.0
    return [x]


def bias_gelu_inputs(rng, sizes):
    """bf16 activations, f32 bias per column and f32 scale per row."""
    m, n = sizes["M"], sizes["N"]
    x = (rng.standard_normal((m, n)) * 2.0).astype(BF16)
    bias = rng.standard_normal(n).astype(np.float32)
    scale = rng.uniform(-2.0, 2.0, m).astype(np.float32)
    return [x, bias, scale]


def add_vectors_inputs(rng, sizes):
    n = sizes["N"]
    return [rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)]


def giou_inputs(rng, sizes):
    """Pairs of valid boxes (x1 < x2, y1 < y2): overlapping, nested and disjoint."""
    shape = (sizes["B"], sizes["N"])

    def boxes():
        x1, y1 = rng.uniform(0.0, 100.0, shape), rng.uniform(0.0, 100.0, shape)
        w, h = rng.uniform(0.5, 50.0, shape), rng.uniform(0.5, 50.0, shape)
        return [x1, y1, x1 + w, y1 + h]

    a, b = boxes(), boxes()
    # Every fifth pair is two identical boxes (GIoU 1); every seventh b lies inside a.
    same = np.zeros(shape, bool)
    same.flat[::5] = True
    inside = np.zeros(shape, bool)
    inside.flat[1::7] = True
    ax1, ay1, ax2, ay2 = a
    nested = [ax1 + 0.25 * (ax2 - ax1), ay1 + 0.25 * (ay2 - ay1), ax2 - 0.25 * (ax2 - ax1), ay2 - 0.25 * (ay2 - ay1)]
    b = [np.where(same, ai, np.where(inside, ni, bi)) for ai, ni, bi in zip(a, nested, b)]
    return [c.astype(np.float32) for c in (*a, *b)]


def with_cotangents(make_inputs, *cotangents: Operand):
    """A backward kernel's inputs: those that `make_inputs` makes for its kernel (none if
    None), then a random cotangent for each of the kernel's outputs given."""

    def make(rng, sizes):
        arrays = make_inputs(rng, sizes) if make_inputs else []
        return arrays + [random_array(rng, c.dtype, c.shape(sizes)) for c in cotangents]

    return make


def row_offsets(m: int) -> np.ndarray:
    """Per-row shifts 0, +100, -100, 0, ...: exp(100) overflows f32 and exp(-100) underflows,
    so a log-sum-exp that does not take the row's maximum out first goes to inf or -inf."""
    return np.array([0.0, 100.0, -100.0])[np.arange(m) % 3]


def shifted_rows_inputs(rng, sizes):
    """f32 rows of normal values, each row shifted (row_offsets)."""
    m, n = sizes["M"], sizes["N"]
    return [(rng.standard_normal((m, n)) * 2.0 + row_offsets(m)[:, None]).astype(np.float32)]


def cross_entropy_inputs(rng, sizes):
    """bf16 logits in shifted rows, each row's maximum placed 2 above the rest at the last
    position (row 0, 3, ...: in the ragged last block), the first (rows 1, 4, ...) or the
    middle one, so that a running maximum must be rescaled when a later block raises it;
    labels in [0, V), row 0's the last position and row 1's the first."""
    m, v = sizes["M"], sizes["V"]
    z = rng.standard_normal((m, v)) * 2.0
    top = z.max(axis=1) + 2.0
    z[np.arange(m), np.array([v - 1, 0, v // 2])[np.arange(m) % 3]] = top
    logits = (z + row_offsets(m)[:, None]).astype(BF16)
    label = rng.integers(0, v, m).astype(np.int32)
    label[: min(m, 2)] = [v - 1, 0][: min(m, 2)]
    return [logits, label]


def argmax_inputs(dtype: str):
    """Rows drawn from 7 values (-3..3, halved for floats), so most rows hold their maximum
    and minimum at several positions (ties: the first wins). Every fifth row from the
    second holds a unique extreme at its last position; the third and fourth of each five
    are constant at the dtype's lowest and highest value (-inf and inf for floats), where
    the masking identity of argmax or argmin ties with every element."""

    def make(rng, sizes):
        m, n = sizes["M"], sizes["N"]
        values = rng.integers(-3, 4, (m, n)).astype(np.float64)
        np_dtype = NUMPY_DTYPES[dtype]
        if np_dtype.kind == "f" or np_dtype == BF16:
            values, lowest, highest = values * 0.5, -np.inf, np.inf
        else:
            lowest, highest = np.iinfo(np_dtype).min, np.iinfo(np_dtype).max
        rows = np.arange(m) % 5
        values[rows == 1, -1] = 4.0
        values[rows == 2] = lowest
        values[rows == 3] = highest
        return [values.astype(np_dtype)]

    return make


def layer_norm_inputs(rng, sizes):
    """bf16 rows of normal values with means about 0, 3 and -3; the third row all zeros, so
    its variance is 0, rstd is 1 / sqrt(eps) and y is b. f32 weight and bias per column.
    (A constant row of another value would have its f32 mean an ulp off, and rstd
    multiplies that ulp by 316.)"""
    m, n = sizes["M"], sizes["N"]
    x = rng.standard_normal((m, n)) * 2.0 + np.array([0.0, 3.0, -3.0])[np.arange(m) % 3][:, None]
    if m > 2:
        x[2] = 0.0
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return [x.astype(BF16), w, b]


def rms_norm_inputs(rng, sizes):
    """bf16 rows of normal values, the third row all zeros (y is 0); f32 weight per column."""
    m, n = sizes["M"], sizes["N"]
    x = rng.standard_normal((m, n)) * 2.0
    if m > 2:
        x[2] = 0.0
    return [x.astype(BF16), rng.standard_normal(n).astype(np.float32)]


def column_sums_inputs(rng, sizes):
    """f32 normal values; the last row (in the ragged last block of M) 50 higher, so a sum
    that drops it misses by 50."""
    x = rng.standard_normal((sizes["M"], sizes["N"])) * 2.0
    x[-1] += 50.0
    return [x.astype(np.float32)]


# Quotients within this many f32 ulps of a rounding tie (k + 0.5) are moved off it: a
# kernel may divide by the scale as a multiply by its reciprocal, an ulp or two off.
TIE_ULPS = 16


def quantize_rows_int8_inputs(rng, sizes):
    """f32 rows of normal values moved off rounding ties (TIE_ULPS), except row 1: there
    the largest magnitude is 127, so the scale is exactly 1 and the quotients are exact,
    and it holds exact ties 0.5, 1.5, 2.5, ... that must round half to even. Row 2 is all
    zeros: the scale is 1e-30 / 127 and q is 0."""
    m, n = sizes["M"], sizes["N"]
    x = (rng.standard_normal((m, n)) * 3.0).astype(np.float32)
    if m > 2:
        x[2] = 0.0
    for _ in range(4):
        scale = np.maximum(np.abs(x).max(axis=1), np.float32(1e-30)) / np.float32(127)
        quotient = x.astype(np.float64) / scale.astype(np.float64)[:, None]
        near_tie = np.abs(quotient - np.floor(quotient) - 0.5) <= TIE_ULPS * np.abs(quotient) * 2.0**-23
        if not near_tie.any():
            break
        x[near_tie] *= np.float32(1 + 2.0**-12)
    else:
        raise AssertionError("quantize_rows_int8_inputs: values stay near rounding ties")
    if m > 1:
        ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -125.5, 3.0, -7.25])
        x[1] = ties[np.arange(n) % len(ties)]
        x[1, -1] = 127.0
    return [x]


def equal_count_inputs(dtype: str):
    """x random and y a copy of it with about 30% of positions changed (by +1, so they
    differ); the last position (in the ragged last block) is always equal. In floats,
    every fifth equal pair is 0.0 against -0.0, which compare equal."""

    def make(rng, sizes):
        n = sizes["N"]
        x = random_array(rng, dtype, (n,))
        differ = rng.random(n) < 0.3
        differ[-1] = False
        y = x.copy()
        y[differ] = x[differ] + 1
        if x.dtype.kind == "f":
            signed_zeros = (np.arange(n) % 5 == 0) & ~differ
            x[signed_zeros], y[signed_zeros] = 0.0, -0.0
        return [x, y]

    return make


def pair_inputs(dtype: str):
    """Two random arrays of the dtype (small integers for ints: sums and products of i8
    wrap around)."""

    def make(rng, sizes):
        shape = (sizes["M"], sizes["N"])
        return [random_array(rng, dtype, shape), random_array(rng, dtype, shape)]

    return make


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Tolerance:
    """rtol and atol for one output. With `sqrt_of`, they are those of a reduction over up
    to 64 elements of that dimension and grow with the square root of its size beyond
    (the rounding error of an f32 sum of n terms grows about as sqrt(n) in whatever order
    the kernel adds them: blocks of a row, running accumulators across steps)."""

    rtol: float
    atol: float
    sqrt_of: str | None = None

    def at(self, sizes: dict[str, int]) -> Tolerance:
        """This tolerance for arrays of the given sizes."""
        if self.sqrt_of is None:
            return self
        factor = (max(sizes[self.sqrt_of], 64) / 64) ** 0.5  # as given up to 64 terms; x8 at 4096
        return Tolerance(self.rtol * factor, self.atol * factor)


EXACT = Tolerance(0.0, 0.0)
F32_TOL = Tolerance(1e-5, 1e-6)
BF16_TOL = Tolerance(2.0**-7, 1e-5)  # one bf16 ulp of the result
# Softmax: exp's few ulps and the row sum's rounding, relative to each output.
SOFTMAX_TOL = Tolerance(4e-6, 1e-9, sqrt_of="N")


# gelu's derivative in f32 where it is tiny (z below -3): 1 + tanh and 1 - tanh^2 lose
# their digits as tanh nears -1, in the kernel as in jax's own derivative, so its error
# is absolute: a few f32 ulps of 1 times dy * scale.
GELU_DERIVATIVE_TOL = Tolerance(2.0**-7, 1e-4)


def logsumexp_tolerance(dim: str) -> Tolerance:
    """x - logsumexp(x) and cross-entropy: an absolute error of a few ulps of the logits
    (which reach 100 in shifted rows) plus the sum's rounding over `dim`."""
    return Tolerance(1e-5, 2e-5, sqrt_of=dim)


@dataclass(frozen=True)
class KernelCase:
    """What a bundled kernel must compute, stated independently of pallasgen."""

    module: str
    kernel: str
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    make_inputs: Callable[[np.random.Generator, dict[str, int]], list[np.ndarray]]
    expected: Callable[..., tuple[np.ndarray, ...]]
    tolerances: tuple[Tolerance, ...]  # one per output; read them through tolerances_for
    params: dict = field(default_factory=dict)  # non-default param values worth checking
    reduced: tuple[str, ...] = ()  # the dimensions its reductions remove
    specials: bool = True  # whether NaN and inf inputs have specified results (not for reductions)

    @property
    def id(self) -> str:
        return f"{self.module}.{self.kernel}"

    @property
    def dims(self) -> tuple[str, ...]:
        seen: list[str] = []
        for operand in self.inputs:
            seen += [d for d in operand.dims if d not in seen]
        return tuple(seen)

    def sizes_of(self, arrays) -> dict[str, int]:
        """The size of each named dimension, read from input arrays."""
        return {d: n for operand, array in zip(self.inputs, arrays) for d, n in zip(operand.dims, np.shape(array))}

    def tolerances_for(self, arrays) -> tuple[Tolerance, ...]:
        """Each output's tolerance at the sizes of these inputs."""
        sizes = self.sizes_of(arrays)
        return tuple(tolerance.at(sizes) for tolerance in self.tolerances)


BIAS_GELU_INPUTS = (Operand("x", "bf16", ("M", "N")), Operand("bias", "f32", ("N",)), Operand("scale", "f32", ("M",)))
GIOU_INPUTS = "ax1 ay1 ax2 ay2 bx1 by1 bx2 by2".split()
SOFTMAX_SAVED = (
    Operand("x", "f32", ("M", "N")),
    Operand("sum_n", "f32", ("M",)),
    Operand("argmax_n", "i32", ("M",)),
    Operand("max_n", "f32", ("M",)),
)
LAYER_NORM_OUTPUTS = (Operand("y", "bf16", ("M", "N")), Operand("mu", "f32", ("M",)), Operand("rstd", "f32", ("M",)))
LAYER_NORM_SAVED = (*LAYER_NORM_OUTPUTS[1:], Operand("mean_n", "f32", ("M",)))

CASES = {
    case.id: case
    for case in (
        KernelCase(
            "activations",
            "leaky",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("y", "f32", ("M", "N")), Operand("mask", "i32", ("M", "N"))),
            leaky_inputs,
            leaky_numpy,
            (F32_TOL, EXACT),
            params={"slope": 0.2},
        ),
        KernelCase(
            "activations",
            "bias_gelu",
            (Operand("x", "bf16", ("M", "N")), Operand("bias", "f32", ("N",)), Operand("scale", "f32", ("M",))),
            (Operand("y", "bf16", ("M", "N")),),
            bias_gelu_inputs,
            bias_gelu_numpy,
            (BF16_TOL,),
        ),
        KernelCase(
            "activations",
            "quantize_rows",
            (Operand("x", "f32", ("M", "N")), Operand("scale", "f32", ("M",))),
            (Operand("q", "i8", ("M", "N")),),
            quantize_rows_inputs,
            quantize_rows_numpy,
            (EXACT,),
        ),
        KernelCase(
            "add_vectors",
            "add_vectors",
            (Operand("x", "f32", ("N",)), Operand("y", "f32", ("N",))),
            (Operand("z", "f32", ("N",)),),
            add_vectors_inputs,
            add_vectors_numpy,
            (F32_TOL,),
        ),
        KernelCase(
            "giou",
            "giou",
            tuple(Operand(name, "f32", ("B", "N")) for name in "ax1 ay1 ax2 ay2 bx1 by1 bx2 by2".split()),
            (Operand("giou", "f32", ("B", "N")),),
            giou_inputs,
            giou_numpy,
            (Tolerance(1e-5, 1e-5),),
            params={"eps": 1e-3},
        ),
        # ------------------------------------------------------------------ backward kernels
        KernelCase(
            "activations",
            "leaky_backward",
            (Operand("x", "f32", ("M", "N")), Operand("dy", "f32", ("M", "N"))),
            (Operand("dx", "f32", ("M", "N")),),
            with_cotangents(leaky_inputs, Operand("dy", "f32", ("M", "N"))),
            leaky_backward_numpy,
            (F32_TOL,),
            params={"slope": 0.2},
            specials=False,
        ),
        *(
            KernelCase(
                "activations",
                name,
                (*BIAS_GELU_INPUTS, Operand("dy", "bf16", ("M", "N"))),
                (output,),
                with_cotangents(bias_gelu_inputs, Operand("dy", "bf16", ("M", "N"))),
                expected,
                (tolerance,),
                specials=False,
            )
            for name, output, expected, tolerance in (
                (
                    "bias_gelu_backward",
                    Operand("dx", "bf16", ("M", "N")),
                    bias_gelu_backward_numpy,
                    GELU_DERIVATIVE_TOL,
                ),
                (
                    "bias_gelu_backward_over_m",
                    Operand("dbias", "f32", ("N",)),
                    bias_gelu_backward_over_m_numpy,
                    Tolerance(2e-5, 1e-4, sqrt_of="M"),
                ),
                (
                    "bias_gelu_backward_over_n",
                    Operand("dscale", "f32", ("M",)),
                    bias_gelu_backward_over_n_numpy,
                    Tolerance(2e-5, 1e-4, sqrt_of="N"),
                ),
            )
        ),
        # The elementwise backward kernels of the products that stay separate
        # (product_gradients.py: scores' dk would need its computed tile transposed).
        KernelCase(
            "matmul",
            "scores_backward_epilogue",
            (Operand("ds", "f32", ("B", "S", "T")),),
            (Operand("dacc", "bf16", ("B", "S", "T")),),
            with_cotangents(None, Operand("ds", "f32", ("B", "S", "T"))),
            scores_backward_epilogue_numpy,
            (BF16_TOL,),
            params={"scale": 0.5},
            specials=False,
        ),
        KernelCase(
            "matmul",
            "linear_backward_over_m",
            (Operand("dy", "bf16", ("M", "N")),),
            (Operand("dbias", "f32", ("N",)),),
            with_cotangents(None, Operand("dy", "bf16", ("M", "N"))),
            linear_backward_over_m_numpy,
            (Tolerance(1e-5, 1e-4, sqrt_of="M"),),
            specials=False,
        ),
        KernelCase(
            "ops",
            "mul_f32_backward",
            (Operand("x", "f32", ("M", "N")), Operand("y", "f32", ("M", "N")), Operand("dz", "f32", ("M", "N"))),
            (Operand("dx", "f32", ("M", "N")), Operand("dy", "f32", ("M", "N"))),
            with_cotangents(pair_inputs("f32"), Operand("dz", "f32", ("M", "N"))),
            mul_backward_numpy,
            (F32_TOL, F32_TOL),
            specials=False,
        ),
        KernelCase(
            "giou",
            "giou_backward",
            (*(Operand(name, "f32", ("B", "N")) for name in GIOU_INPUTS), Operand("dgiou", "f32", ("B", "N"))),
            tuple(Operand(f"d{name}", "f32", ("B", "N")) for name in GIOU_INPUTS),
            with_cotangents(giou_inputs, Operand("dgiou", "f32", ("B", "N"))),
            giou_backward_numpy,
            (Tolerance(1e-4, 1e-6),) * 8,
            params={"eps": 1e-3},
            specials=False,
        ),
        # ------------------------------------------------------------------ reductions
        KernelCase(
            "softmax",
            "softmax",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("y", "f32", ("M", "N")),),
            shifted_rows_inputs,
            softmax_numpy,
            (SOFTMAX_TOL,),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "softmax",
            "log_softmax",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("y", "f32", ("M", "N")),),
            shifted_rows_inputs,
            log_softmax_numpy,
            (logsumexp_tolerance("N"),),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "norms",
            "layer_norm",
            (Operand("x", "bf16", ("M", "N")), Operand("w", "f32", ("N",)), Operand("b", "f32", ("N",))),
            (Operand("y", "bf16", ("M", "N")), Operand("mu", "f32", ("M",)), Operand("rstd", "f32", ("M",))),
            layer_norm_inputs,
            layer_norm_numpy,
            (BF16_TOL, Tolerance(2e-6, 1e-6, sqrt_of="N"), Tolerance(2e-6, 0.0, sqrt_of="N")),
            params={"eps": 0.5},
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "norms",
            "rms_norm",
            (Operand("x", "bf16", ("M", "N")), Operand("w", "f32", ("N",))),
            (Operand("y", "bf16", ("M", "N")),),
            rms_norm_inputs,
            rms_norm_numpy,
            (BF16_TOL,),
            params={"eps": 0.5},
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "losses",
            "cross_entropy",
            (Operand("logits", "bf16", ("M", "V")), Operand("label", "i32", ("M",))),
            (Operand("loss", "f32", ("M",)),),
            cross_entropy_inputs,
            cross_entropy_numpy,
            (logsumexp_tolerance("V"),),
            reduced=("V",),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "argmax_rows",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("i", "i32", ("M",)),),
            argmax_inputs("f32"),
            argmax_numpy,
            (EXACT,),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "argmax_blocked",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("i", "i32", ("M",)),),
            argmax_inputs("f32"),
            argmax_numpy,
            (EXACT,),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "argmin_rows",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("i", "i32", ("M",)),),
            argmax_inputs("f32"),
            argmin_numpy,
            (EXACT,),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "attention",
            "gqa_backward_over_r",
            (Operand("dk_r", "f32", ("B", "G", "R", "T", "D")), Operand("dv_r", "f32", ("B", "G", "R", "T", "D"))),
            (Operand("dk", "bf16", ("B", "G", "T", "D")), Operand("dv", "bf16", ("B", "G", "T", "D"))),
            with_cotangents(
                None,
                Operand("dk_r", "f32", ("B", "G", "R", "T", "D")),
                Operand("dv_r", "f32", ("B", "G", "R", "T", "D")),
            ),
            gqa_backward_over_r_numpy,
            (BF16_TOL, BF16_TOL),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "column_sums",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("s", "f32", ("N",)),),
            column_sums_inputs,
            column_sums_numpy,
            (Tolerance(1e-5, 1e-4, sqrt_of="M"),),
            reduced=("M",),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "quantize_rows_int8",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("q", "i8", ("M", "N")), Operand("scale", "f32", ("M",))),
            quantize_rows_int8_inputs,
            quantize_rows_int8_numpy,
            (EXACT, Tolerance(2.0**-22, 0.0)),
            reduced=("N",),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "equal_count",
            (Operand("x", "i32", ("N",)), Operand("y", "i32", ("N",))),
            (Operand("n", "i32", ()),),
            equal_count_inputs("i32"),
            equal_count_numpy,
            (EXACT,),
            reduced=("N",),
            specials=False,
        ),
        # ------------------------------------------------------------------ reductions' backward kernels
        # Each kernel's NAME_with_residuals (its outputs, then the reductions its backward
        # kernels read), then its backward kernels.
        KernelCase(
            "softmax",
            "softmax_with_residuals",
            (Operand("x", "f32", ("M", "N")),),
            (
                Operand("y", "f32", ("M", "N")),
                Operand("sum_n", "f32", ("M",)),
                Operand("argmax_n", "i32", ("M",)),
                Operand("max_n", "f32", ("M",)),
            ),
            shifted_rows_inputs,
            softmax_with_residuals_numpy,
            (SOFTMAX_TOL, Tolerance(1e-5, 0.0, sqrt_of="N"), EXACT, EXACT),
            specials=False,
        ),
        KernelCase(
            "softmax",
            "softmax_backward",
            (*SOFTMAX_SAVED, Operand("dy", "f32", ("M", "N"))),
            (Operand("dx", "f32", ("M", "N")),),
            saved_inputs(
                shifted_rows_inputs, softmax_with_residuals_numpy, SOFTMAX_SAVED[1:], Operand("dy", "f32", ("M", "N"))
            ),
            lambda x, sum_n, argmax_n, max_n, dy: softmax_backward_numpy(x, dy),
            (Tolerance(1e-5, 1e-6, sqrt_of="N"),),
            specials=False,
        ),
        KernelCase(
            "softmax",
            "log_softmax_with_residuals",
            (Operand("x", "f32", ("M", "N")),),
            (Operand("y", "f32", ("M", "N")), Operand("logsumexp_n", "f32", ("M",))),
            shifted_rows_inputs,
            log_softmax_with_residuals_numpy,
            (logsumexp_tolerance("N"), logsumexp_tolerance("N")),
            specials=False,
        ),
        KernelCase(
            "softmax",
            "log_softmax_backward",
            (Operand("x", "f32", ("M", "N")), Operand("logsumexp_n", "f32", ("M",)), Operand("dy", "f32", ("M", "N"))),
            (Operand("dx", "f32", ("M", "N")),),
            saved_inputs(
                shifted_rows_inputs,
                log_softmax_with_residuals_numpy,
                (Operand("logsumexp_n", "f32", ("M",)),),
                Operand("dy", "f32", ("M", "N")),
            ),
            lambda x, lse, dy: log_softmax_backward_numpy(x, dy),
            (Tolerance(1e-5, 5e-5, sqrt_of="N"),),  # exp(x - lse) to ulps of x (up to 100) times sum(dy)
            specials=False,
        ),
        KernelCase(
            "norms",
            "layer_norm_with_residuals",
            (Operand("x", "bf16", ("M", "N")), Operand("w", "f32", ("N",)), Operand("b", "f32", ("N",))),
            (*LAYER_NORM_OUTPUTS, Operand("mean_n", "f32", ("M",))),
            layer_norm_inputs,
            layer_norm_with_residuals_numpy,
            (BF16_TOL, Tolerance(2e-6, 1e-6, sqrt_of="N"), Tolerance(2e-6, 0.0, sqrt_of="N"), Tolerance(2e-5, 1e-5)),
            params={"eps": 0.5},
            specials=False,
        ),
        KernelCase(
            "norms",
            "layer_norm_backward",
            (
                Operand("x", "bf16", ("M", "N")),
                Operand("w", "f32", ("N",)),
                *LAYER_NORM_SAVED,
                Operand("dy", "bf16", ("M", "N")),
                Operand("dmu", "f32", ("M",)),
                Operand("drstd", "f32", ("M",)),
            ),
            (Operand("dx", "bf16", ("M", "N")),),
            saved_inputs(
                layer_norm_inputs,
                layer_norm_with_residuals_numpy,
                LAYER_NORM_SAVED,
                Operand("dy", "bf16", ("M", "N")),
                Operand("dmu", "f32", ("M",)),
                Operand("drstd", "f32", ("M",)),
                inputs=(0, 1),
            ),
            lambda x, w, mu, rstd, var, dy, dmu, drstd: layer_norm_full_backward_numpy(x, w, 0.0, dy, dmu, drstd)[:1],
            (Tolerance(2.0**-7, 2e-3, sqrt_of="N"),),
            specials=False,
        ),
        KernelCase(
            "norms",
            "layer_norm_backward_over_m",
            (Operand("x", "bf16", ("M", "N")), *LAYER_NORM_SAVED[:2], Operand("dy", "bf16", ("M", "N"))),
            (Operand("dw", "f32", ("N",)), Operand("db", "f32", ("N",))),
            saved_inputs(
                layer_norm_inputs,
                layer_norm_with_residuals_numpy,
                LAYER_NORM_SAVED[:2],
                Operand("dy", "bf16", ("M", "N")),
                inputs=(0,),
            ),
            lambda x, mu, rstd, dy: layer_norm_full_backward_numpy(x, 1.0, 0.0, dy, 0.0 * mu, 0.0 * mu)[1:],
            (Tolerance(1e-4, 1e-4, sqrt_of="M"), Tolerance(1e-5, 1e-4, sqrt_of="M")),
            specials=False,
        ),
        KernelCase(
            "norms",
            "rms_norm_with_residuals",
            (Operand("x", "bf16", ("M", "N")), Operand("w", "f32", ("N",))),
            (Operand("y", "bf16", ("M", "N")), Operand("mean_n", "f32", ("M",))),
            rms_norm_inputs,
            rms_norm_with_residuals_numpy,
            (BF16_TOL, Tolerance(2e-6, 1e-6, sqrt_of="N")),
            params={"eps": 0.5},
            specials=False,
        ),
        KernelCase(
            "norms",
            "rms_norm_backward",
            (
                Operand("x", "bf16", ("M", "N")),
                Operand("w", "f32", ("N",)),
                Operand("mean_n", "f32", ("M",)),
                Operand("dy", "bf16", ("M", "N")),
            ),
            (Operand("dx", "bf16", ("M", "N")),),
            saved_inputs(
                rms_norm_inputs,
                rms_norm_with_residuals_numpy,
                (Operand("mean_n", "f32", ("M",)),),
                Operand("dy", "bf16", ("M", "N")),
            ),
            lambda x, w, mean_square, dy: rms_norm_full_backward_numpy(x, w, dy)[:1],
            (Tolerance(2.0**-7, 1e-3, sqrt_of="N"),),
            specials=False,
        ),
        KernelCase(
            "norms",
            "rms_norm_backward_over_m",
            (Operand("x", "bf16", ("M", "N")), Operand("mean_n", "f32", ("M",)), Operand("dy", "bf16", ("M", "N"))),
            (Operand("dw", "f32", ("N",)),),
            saved_inputs(
                rms_norm_inputs,
                rms_norm_with_residuals_numpy,
                (Operand("mean_n", "f32", ("M",)),),
                Operand("dy", "bf16", ("M", "N")),
                inputs=(0,),
            ),
            lambda x, mean_square, dy: rms_norm_full_backward_numpy(x, 1.0, dy)[1:],
            (Tolerance(1e-4, 1e-4, sqrt_of="M"),),
            specials=False,
        ),
        # Derived for jax.grad of rmsnorm_matmul and matmul_softmax (specs/attention.pallas).
        KernelCase(
            "attention",
            "rmsnorm_matmul_lhs",
            (Operand("x", "bf16", ("M", "K")), Operand("g", "f32", ("K",))),
            (Operand("lhs", "bf16", ("M", "K")), Operand("mean_k", "f32", ("M",))),
            rmsnorm_matmul_inputs,
            rmsnorm_matmul_lhs_numpy,
            (BF16_TOL, Tolerance(2e-6, 1e-6, sqrt_of="K")),
            specials=False,
        ),
        KernelCase(
            "attention",
            "rmsnorm_matmul_lhs_backward",
            (
                Operand("x", "bf16", ("M", "K")),
                Operand("g", "f32", ("K",)),
                Operand("mean_k", "f32", ("M",)),
                Operand("dlhs", "bf16", ("M", "K")),
            ),
            (Operand("dx", "bf16", ("M", "K")),),
            saved_inputs(
                rmsnorm_matmul_inputs,
                rmsnorm_matmul_lhs_numpy,
                (Operand("mean_k", "f32", ("M",)),),
                Operand("dlhs", "bf16", ("M", "K")),
            ),
            lambda x, g, mean_square, dlhs: rms_norm_full_backward_numpy(x, g, dlhs)[:1],
            (Tolerance(2.0**-7, 1e-3, sqrt_of="K"),),
            specials=False,
        ),
        KernelCase(
            "attention",
            "rmsnorm_matmul_lhs_backward_over_m",
            (Operand("x", "bf16", ("M", "K")), Operand("mean_k", "f32", ("M",)), Operand("dlhs", "bf16", ("M", "K"))),
            (Operand("dg", "f32", ("K",)),),
            saved_inputs(
                rmsnorm_matmul_inputs,
                rmsnorm_matmul_lhs_numpy,
                (Operand("mean_k", "f32", ("M",)),),
                Operand("dlhs", "bf16", ("M", "K")),
                inputs=(0,),
            ),
            lambda x, mean_square, dlhs: rms_norm_full_backward_numpy(x, 1.0, dlhs)[1:],
            (Tolerance(1e-4, 1e-4, sqrt_of="M"),),
            specials=False,
        ),
        KernelCase(
            "attention",
            "matmul_softmax_backward",
            (Operand("y", "f32", ("M", "N")), Operand("dy", "f32", ("M", "N"))),
            (Operand("dacc", "bf16", ("M", "N")),),
            saved_inputs(
                shifted_rows_inputs,
                softmax_with_residuals_numpy,
                (Operand("y", "f32", ("M", "N")),),
                Operand("dy", "f32", ("M", "N")),
                inputs=(),
            ),
            matmul_softmax_backward_numpy,
            (Tolerance(2.0**-7, 1e-3, sqrt_of="N"),),
            specials=False,
        ),
        KernelCase(
            "losses",
            "cross_entropy_with_residuals",
            (Operand("logits", "bf16", ("M", "V")), Operand("label", "i32", ("M",))),
            (Operand("loss", "f32", ("M",)), Operand("logsumexp_v", "f32", ("M",))),
            cross_entropy_inputs,
            cross_entropy_with_residuals_numpy,
            (logsumexp_tolerance("V"), logsumexp_tolerance("V")),
            specials=False,
        ),
        KernelCase(
            "losses",
            "cross_entropy_backward",
            (
                Operand("logits", "bf16", ("M", "V")),
                Operand("label", "i32", ("M",)),
                Operand("logsumexp_v", "f32", ("M",)),
                Operand("dloss", "f32", ("M",)),
            ),
            (Operand("dlogits", "bf16", ("M", "V")),),
            saved_inputs(
                cross_entropy_inputs,
                cross_entropy_with_residuals_numpy,
                (Operand("logsumexp_v", "f32", ("M",)),),
                Operand("dloss", "f32", ("M",)),
            ),
            cross_entropy_backward_numpy,
            (Tolerance(2.0**-7, 1e-5),),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "column_sums_backward",
            (Operand("x", "f32", ("M", "N")), Operand("ds", "f32", ("N",))),
            (Operand("dx", "f32", ("M", "N")),),
            with_cotangents(column_sums_inputs, Operand("ds", "f32", ("N",))),
            column_sums_backward_numpy,
            (EXACT,),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "quantize_rows_int8_with_residuals",
            (Operand("x", "f32", ("M", "N")),),
            (
                Operand("q", "i8", ("M", "N")),
                Operand("scale", "f32", ("M",)),
                Operand("max_n", "f32", ("M",)),
                Operand("argmax_n", "i32", ("M",)),
            ),
            quantize_rows_int8_inputs,
            quantize_rows_int8_with_residuals_numpy,
            (EXACT, Tolerance(2.0**-22, 0.0), EXACT, EXACT),
            specials=False,
        ),
        KernelCase(
            "reductions",
            "quantize_rows_int8_backward",
            (
                Operand("x", "f32", ("M", "N")),
                Operand("max_n", "f32", ("M",)),
                Operand("argmax_n", "i32", ("M",)),
                Operand("dscale", "f32", ("M",)),
            ),
            (Operand("dx", "f32", ("M", "N")),),
            saved_inputs(
                quantize_rows_int8_inputs,
                quantize_rows_int8_with_residuals_numpy,
                (Operand("max_n", "f32", ("M",)), Operand("argmax_n", "i32", ("M",))),
                Operand("dscale", "f32", ("M",)),
            ),
            lambda x, top, first, dscale: quantize_rows_int8_backward_numpy(x, dscale),
            (F32_TOL,),
            specials=False,
        ),
        # ------------------------------------------------------------------ the op matrix
        *(
            case
            for dtype in ("f32", "i32", "i8")
            for case in (
                KernelCase(
                    "ops",
                    f"add_{dtype}",
                    (Operand("x", dtype, ("M", "N")), Operand("y", dtype, ("M", "N"))),
                    (Operand("z", dtype, ("M", "N")),),
                    pair_inputs(dtype),
                    add_numpy,
                    (F32_TOL if dtype == "f32" else EXACT,),
                ),
                KernelCase(
                    "ops",
                    f"mul_{dtype}",
                    (Operand("x", dtype, ("M", "N")), Operand("y", dtype, ("M", "N"))),
                    (Operand("z", dtype, ("M", "N")),),
                    pair_inputs(dtype),
                    mul_numpy,
                    (F32_TOL if dtype == "f32" else EXACT,),
                ),
                KernelCase(
                    "ops",
                    f"argmax_{dtype}",
                    (Operand("x", dtype, ("M", "N")),),
                    (Operand("i", "i32", ("M",)),),
                    argmax_inputs(dtype),
                    argmax_numpy,
                    (EXACT,),
                    reduced=("N",),
                    specials=False,
                ),
                KernelCase(
                    "ops",
                    f"equal_count_{dtype}",
                    (Operand("x", dtype, ("N",)), Operand("y", dtype, ("N",))),
                    (Operand("n", "i32", ()),),
                    equal_count_inputs(dtype),
                    equal_count_numpy,
                    (EXACT,),
                    reduced=("N",),
                    specials=False,
                ),
            )
        ),
    )
}


# --------------------------------------------------------------------------- any kernel


@cache
def spec_kernel(module_stem: str, kernel: str):
    """A generated kernel's declaration (pallasgen IR), from the spec its header names:
    one of its kernels, or a backward kernel derived from one."""
    (decl,) = [k for k in spec_kernels(module_stem) if k.name == kernel]
    return decl


@cache
def spec_kernels(module_stem: str):
    """The kernels of the spec a generated module's header names, each followed by its
    backward kernels."""
    from pallasgen.gradients.derive import every_kernel
    from pallasgen.workspace.pipeline import check_source

    header = (GENERATED / f"{module_stem}.py").read_text(encoding="utf-8").splitlines()[0]
    match = re.match(r"# Code generated by pallasgen from (.+?\.pallas)", header)
    assert match, f"generated/{module_stem}.py has no pallasgen header: {header!r}"
    source = (ROOT / match.group(1)).read_text(encoding="utf-8")
    return tuple(checked.kernel for checked in every_kernel(check_source(source, match.group(1))))


def is_derived(module_stem: str, kernel: str) -> bool:
    """Whether a bundled kernel is one derived for jax.grad (the generic suites test those
    at fewer sizes: the gradient and race tests run each end to end)."""
    return kernel in derived_kernels(module_stem)


@cache
def derived_kernels(module_stem: str) -> list[str]:
    """The kernels a generated module has besides its spec's: those derived for jax.grad."""
    own = set(re.findall(r"^kernel (\w+)", (ROOT / "specs" / f"{module_stem}.pallas").read_text(), re.M))
    return [name for name in kernels_in(generated_module(module_stem)) if name not in own]


def spec_inputs(module_stem: str, kernel: str) -> tuple[Operand, ...]:
    """A generated kernel's inputs as its spec declares them."""
    return tuple(Operand(a.name, a.dtype, tuple(a.dims)) for a in spec_kernel(module_stem, kernel).inputs)


def spec_outputs(module_stem: str, kernel: str) -> tuple[Operand, ...]:
    """A generated kernel's outputs as its spec declares them."""
    return tuple(Operand(a.name, a.dtype, tuple(a.dims)) for a in spec_kernel(module_stem, kernel).outputs)


def has_matmul(module_stem: str, kernel: str) -> bool:
    """Whether the kernel's spec uses `@` anywhere: otherwise it is elementwise."""
    from pallasgen.analysis.product import find_products

    return bool(find_products(spec_kernel(module_stem, kernel)))


def signature_of(module_stem: str, kernel: str) -> tuple[tuple[Operand, ...], tuple[Operand, ...]]:
    """(inputs, outputs) of any bundled kernel: from its case, or else from its spec."""
    case = CASES.get(f"{module_stem}.{kernel}")
    if case is not None:
        return case.inputs, case.outputs
    return spec_inputs(module_stem, kernel), spec_outputs(module_stem, kernel)


def make_inputs(module_stem: str, kernel: str, rng, sizes) -> list[np.ndarray]:
    """Inputs for any bundled kernel: the case's own distribution, or generic random values."""
    case = CASES.get(f"{module_stem}.{kernel}")
    if case is not None:
        return case.make_inputs(rng, sizes)
    return [random_array(rng, op.dtype, op.shape(sizes)) for op in spec_inputs(module_stem, kernel)]


def lane_dims(arrays) -> set[str]:
    """Dimensions that TPU lays out along lanes: the last of a matrix, or of a vector
    whose dimension is never the leading one of a matrix (vectors broadcast into a
    matrix are reshaped to match it)."""
    lanes = {a.dims[-1] for a in arrays if len(a.dims) >= 2}
    leading = {d for a in arrays if len(a.dims) >= 2 for d in a.dims[:-1]}
    return lanes | {a.dims[0] for a in arrays if len(a.dims) == 1 and a.dims[0] not in leading}


# Rows of the smallest TPU block of an array of each dtype (Mosaic tiles 8-bit arrays
# (32, 128) and 16-bit ones (16, 128)); others take 8.
SUBLANE_ROWS = {"i8": 32, "u8": 32, "bf16": 16, "i16": 16}


def sublane_rows(arrays, dim: str) -> int:
    """The smallest legal block of a dimension that is second-to-last in some array."""
    return max([8] + [SUBLANE_ROWS.get(a.dtype, 8) for a in arrays if len(a.dims) >= 2 and dim in a.dims[:-1]])


def lane_block(arrays, dim: str) -> int:
    """The smallest legal block of a lane dimension: 128; but a dimension that only
    one-dimensional arrays hold is blocked as a vector, whose smallest block is 128 per
    32 bits of its narrowest dtype (512 for i8, 256 for bf16)."""
    if any(len(a.dims) >= 2 and dim in a.dims for a in arrays):
        return 128
    return 128 * max((VECTOR_PACKING.get(a.dtype, 1) for a in arrays if a.dims == (dim,)), default=1)


# Elements packed per 32 bits by TPU vectors (others, f16 computed as f32 and bool held
# as 32 bits included, take one).
VECTOR_PACKING = {"i8": 4, "u8": 4, "bf16": 2, "i16": 2}


SHAPE_CLASSES = (
    "one-default-block",  # each blocked dimension exactly its default block
    "aligned-small-blocks",  # three whole small blocks per blocked dimension
    "ragged-default-blocks",  # default block + 37: a second, partial block
    "ragged-small-blocks",  # two small blocks and a partial third
    "smaller-than-one-block",  # about a quarter of the default block: one whole-array block
    "single-element",  # every dimension 1
)


def sizes_for(inputs, outputs, defaults: dict[str, int], shape_class: str) -> tuple[dict[str, int], dict[str, int]]:
    """(sizes per dimension, block keywords to pass) for a shape class.

    Besides SHAPE_CLASSES there is "two-ragged-small-blocks" (one small block and a
    partial second), the cheapest ragged grid. Small blocks are the least TPU allows:
    8, 16 or 32 rows on sublane dimensions by dtype and 128 on lane dimensions, so multi-block and
    ragged grids stay cheap. A dimension whose default block is under 8 (a batch
    taken one at a time) gets size 2 in the multi-block classes; an unblocked
    dimension is 24 (1 in "single-element").
    """
    lanes = lane_dims((*inputs, *outputs))
    dims = []
    for op in inputs:
        dims += [d for d in op.dims if d not in dims]
    sizes: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for dim in dims:
        keyword = f"block_{dim.lower()}"
        default = defaults.get(keyword)
        if default is None:
            sizes[dim] = 1 if shape_class == "single-element" else 24
            continue
        small = min(
            lane_block((*inputs, *outputs), dim) if dim in lanes else sublane_rows((*inputs, *outputs), dim), default
        )
        tiny = default < 8
        if shape_class == "one-default-block":
            sizes[dim] = default
        elif shape_class == "aligned-small-blocks":
            sizes[dim], blocks[keyword] = 3 * small, small
        elif shape_class == "ragged-default-blocks":
            sizes[dim] = 2 if tiny else default + 37
        elif shape_class == "ragged-small-blocks":
            sizes[dim], blocks[keyword] = (2 if tiny else 2 * small + 5), small
        elif shape_class == "two-ragged-small-blocks":
            sizes[dim], blocks[keyword] = (2 if tiny else small + 5), small
        elif shape_class == "smaller-than-one-block":
            sizes[dim] = 1 if tiny else default // 4 + 3
        elif shape_class == "single-element":
            sizes[dim] = 1
        else:
            raise ValueError(shape_class)
    return sizes, blocks


# --------------------------------------------------------------------------- compiled


def unmasked_block_accesses(ttir) -> list[str]:
    """compile_only.unmasked_accesses, less one-element accesses (a tensor of 1 x ... x 1
    pointers: a scalar input read whole, a row of one, a scalar output), which cannot
    overhang."""
    from pallasgen.devices import compile_only

    return [access for access in compile_only.unmasked_accesses(ttir) if not ONE_ELEMENT.search(access)]


ONE_ELEMENT = re.compile(r"tensor<(?:1x)+!tt\.ptr<")


def assert_mosaic_compiles(function, args, chip: str) -> None:
    """`function` (a kernel with interpret=False) compiles for a compile-only TPU `chip`
    to a Mosaic kernel."""
    from pallasgen.devices import compile_only

    assert "tpu_custom_call" in compile_only.compile_for_tpu(function, args, chip=chip).as_text()


def assert_triton_compiles_masked(function, args) -> None:
    """Each Triton kernel of `function` masks every block access and compiles for sm_90."""
    from pallasgen.devices import compile_only

    for ttir in compile_only.triton_ir(function, args):
        assert not unmasked_block_accesses(ttir)
        compile_only.compile_triton(ttir, capability=90)


# --------------------------------------------------------------------------- running


@cache
def jitted_reference(module_stem: str, kernel: str):
    """`NAME.reference`, jitted with its params static (one compile instead of one per op)."""
    reference = getattr(generated_module(module_stem), kernel).reference
    params = [
        name for name, p in inspect.signature(reference).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return jax.jit(reference, static_argnames=params)


def run_kernel(module_stem: str, kernel: str, arrays, **keywords) -> tuple[np.ndarray, ...]:
    """A generated kernel's outputs as NumPy arrays."""
    fn = kernel_of(module_stem, kernel)
    return tuple(np.asarray(out) for out in as_tuple(fn(*map(jnp.asarray, arrays), **keywords)))


def run_reference(module_stem: str, kernel: str, arrays, **params) -> tuple[np.ndarray, ...]:
    """The generated `NAME.reference`'s outputs as NumPy arrays."""
    outs = jitted_reference(module_stem, kernel)(*map(jnp.asarray, arrays), **params)
    return tuple(np.asarray(out) for out in as_tuple(outs))


def generic_tolerances(outputs: tuple[Operand, ...], expected) -> tuple[Tolerance, ...]:
    """Tolerances against the generated reference for a kernel with no case of its own:
    exact for integers; for floats a few units in the last place of the output dtype,
    scaled by the largest expected magnitude (block-wise sums round differently)."""
    tolerances = []
    for operand, values in zip(outputs, expected):
        if operand.dtype not in ("f32", "bf16", "f16"):
            tolerances.append(EXACT)
            continue
        finite = f64(values)[np.isfinite(f64(values))]
        scale = max(1.0, float(np.abs(finite).max(initial=0.0)))
        ulp = {"f32": 2.0**-23, "bf16": 2.0**-7, "f16": 2.0**-10}[operand.dtype]
        tolerances.append(Tolerance(2 * ulp, 64 * 2.0**-23 * scale))
    return tuple(tolerances)


# --------------------------------------------------------------------------- comparing


def as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def assert_outputs_close(actual, expected, tolerances, what: str) -> None:
    """Each output matches: same shape, NaN and +-inf at the same places, finite values close."""
    actual, expected = as_tuple(actual), as_tuple(expected)
    assert len(actual) == len(expected), f"{what}: {len(actual)} outputs, expected {len(expected)}"
    for index, (a, e, tol) in enumerate(zip(actual, expected, tolerances)):
        a, e = np.asarray(a), np.asarray(e)
        label = f"{what}, output {index}"
        assert a.shape == e.shape, f"{label}: shape {a.shape}, expected {e.shape}"
        if a.dtype.kind in "iub" or e.dtype.kind in "iub":
            np.testing.assert_array_equal(a, e, err_msg=label)
            continue
        a64, e64 = f64(a), f64(e)
        np.testing.assert_array_equal(np.isnan(a64), np.isnan(e64), err_msg=f"{label}: NaN positions differ")
        np.testing.assert_array_equal(np.isposinf(a64), np.isposinf(e64), err_msg=f"{label}: +inf positions differ")
        np.testing.assert_array_equal(np.isneginf(a64), np.isneginf(e64), err_msg=f"{label}: -inf positions differ")
        finite = np.isfinite(e64)
        np.testing.assert_allclose(a64[finite], e64[finite], rtol=tol.rtol, atol=tol.atol, err_msg=label)


def assert_product_cotangent_close(got, want, dtype):
    """A product kernel's cotangent against float64 NumPy's. f32: the products' rounding
    over a ragged contracted dimension; bf16: a bf16 ulp of each element, and of the
    cotangents' typical size where the sums cancel (the product's cotangent goes to the
    MXU in bf16, as the operands do)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if dtype == jnp.bfloat16:
        np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=2.0**-6 * np.sqrt(np.mean(want**2)))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def pallas_calls_and_primitives(jaxpr) -> tuple[list[str], set[str]]:
    """The names of the pallas_calls in a jaxpr, and the primitives outside them."""
    calls, primitives = [], set()

    def walk(jaxpr):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "pallas_call":
                calls.append(str(equation.params["name"]))
                continue
            primitives.add(equation.primitive.name)
            for value in equation.params.values():
                for item in value if isinstance(value, (tuple, list)) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return calls, primitives
