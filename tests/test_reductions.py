"""Reductions, positions and rounding in the bundled kernels (LANGUAGE.md, "Reductions,
positions and rounding"), run in Pallas interpret mode on CPU.

The kernels: softmax and log_softmax (generated/softmax.py), layer_norm and rms_norm
(norms.py), cross_entropy (losses.py), argmax_rows, argmax_blocked, argmin_rows,
column_sums, quantize_rows_int8 and equal_count (reductions.py), and argmax_* and equal_count_* for
f32, i32 and i8 (ops.py). Each is compared with its independent NumPy reference
(tests/kernel_cases.py) on both of its code paths:

- "tpu": the Mosaic kernel, interpreted (`interpret=None` on CPU). A reduced dimension
  is either whole in every block (softmax's N) or blocked: an `arbitrary` grid axis
  whose steps update running accumulators (cross_entropy's V, argmax_blocked's N,
  column_sums's M, equal_count's N).
- "gpu": the Triton kernel, interpreted (`take_gpu_branch`, `interpret=True`). Its
  blocks are powers of two, so even a whole row of 200 is a block of 256 whose last 56
  lanes are padding.

What interpret mode puts in the padding of an edge block (read in jax 0.10.2, the same
in 0.12):

- `interpret=True`: jax/_src/pallas/hlo_interpreter.py, `_pad_to_block_dimension`, pads
  with `uninitialized_value` of jax/_src/pallas/primitives.py: NaN for floats (bf16
  too), the dtype's lowest value (iinfo.min) for integers (but 0 for i16, the dtype of
  interpreted semaphores), False for bools. A masked
  `pltriton.load` without `other` returns that padding (primitives.py,
  `_load_discharge_rule` applies `other` only when given).
- `interpret=pltpu.InterpretParams(uninitialized_memory=...)`:
  jax/_src/pallas/mosaic/interpret/utils.py, `pad_to_block_dimension` with
  `get_uninitialized_value`: "nan" (the default) gives NaN for floats, the dtype's
  HIGHEST value (iinfo.max) for integers and True for bools; "zero" gives zeros.

So an unmasked float tail turns the ordinary ragged tests' results into NaN. Where that
padding would not change the answer (NaN == NaN is false, so an f32 equal_count would
not count it; iinfo.min never wins an argmax), the masking tests choose a padding that
would, per kernel, and prove each step: the interpreter really pads with it, one such
element read as data changes the NumPy answer, and the kernel still gives the true one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas import primitives as pallas_primitives
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from kernel_cases import (
    BF16,
    CASES,
    NUMPY_DTYPES,
    KernelCase,
    as_tuple,
    assert_outputs_close,
    block_defaults,
    exact,
    f64,
    generated_module,
    kernel_of as named_kernel,
    kernels_in,
    run_kernel,
    run_reference,
    sublane_rows,
    take_gpu_branch,
)

from pallasgen.backends.tpu.tiling import accumulates_elementwise, holds_rows
from pallasgen.devices.runner import load_module
from pallasgen.workspace.pipeline import check_source, generate

REDUCTIONS = [case for case in CASES.values() if case.reduced]
IDS = [case.id for case in REDUCTIONS]
MODULES = sorted({case.module for case in REDUCTIONS})

# Kernels whose reduced dimension is blocked: its blocks are steps of one reduction.
BLOCKED = ["losses.cross_entropy", "reductions.argmax_blocked", "reductions.column_sums", "reductions.equal_count"] + [
    f"ops.equal_count_{dtype}" for dtype in ("f32", "i32", "i8")
]


def test_the_reduction_cases_are_the_draft_kernels():
    assert set(IDS) == {
        "softmax.softmax",
        "softmax.log_softmax",
        "norms.layer_norm",
        "norms.rms_norm",
        "losses.cross_entropy",
        "reductions.argmax_rows",
        "reductions.argmax_blocked",
        "reductions.argmin_rows",
        "reductions.column_sums",
        "reductions.quantize_rows_int8",
        "reductions.equal_count",
        *(f"ops.{op}_{dtype}" for op in ("argmax", "equal_count") for dtype in ("f32", "i32", "i8")),
    }
    assert set(BLOCKED) <= set(IDS)


# --------------------------------------------------------------------------- paths


def clear_kernel_caches() -> None:
    """Forget every compiled generated kernel: jitted functions trace their dispatch and
    interpret mode's padding once per shape."""
    for stem in MODULES:
        module = generated_module(stem)
        for name in kernels_in(module):
            getattr(module, name).clear_cache()


@pytest.fixture(params=["tpu", "gpu"])
def path(request, monkeypatch):
    """The code path under test: "tpu" (the default dispatch, interpreted on CPU) or
    "gpu" (every reduction module's dispatch sent to its Triton kernel)."""
    if request.param == "gpu":
        for stem in MODULES:
            take_gpu_branch(monkeypatch, generated_module(stem))
        clear_kernel_caches()
    yield request.param
    if request.param == "gpu":
        clear_kernel_caches()


def kernel_of(case: KernelCase):
    return named_kernel(case.module, case.kernel)


def run(case: KernelCase, path: str, arrays, **keywords) -> tuple[np.ndarray, ...]:
    """The kernel's outputs on a path. GPU blocks (`gpu_block_*`) are passed only where
    the kernel has them (a Triton kernel may take a reduced dimension whole); on the GPU
    path `interpret` defaults to True, which runs the Triton kernel interpreted."""
    accepted = kernel_of(case).options
    keywords = {k: v for k, v in keywords.items() if not k.startswith("gpu_block_") or k in accepted}
    if path == "gpu":
        keywords.setdefault("interpret", True)
    return run_kernel(case.module, case.kernel, arrays, **keywords)


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    sizes: dict[str, int]
    blocks: dict[str, int]  # TPU block keywords
    gpu_blocks: dict[str, int]  # GPU block keywords, passed where the kernel has them

    @property
    def keywords(self) -> dict[str, int]:
        return self.blocks | self.gpu_blocks


SHAPE_CLASSES = ("aligned", "ragged", "one", "many-steps")  # many-steps: blocked reductions only

# Blocked reductions, by hand. "ragged" uses the default blocks, plus 37.
BLOCKED_SHAPES = {
    "losses.cross_entropy": {
        "aligned": Shape({"M": 32, "V": 512}, {"block_m": 16, "block_v": 128}, {"gpu_block_v": 128}),
        "many-steps": Shape({"M": 19, "V": 1000}, {"block_m": 16, "block_v": 128}, {"gpu_block_v": 128}),
    },
    "reductions.argmax_blocked": {
        "aligned": Shape({"M": 16, "N": 512}, {"block_m": 8, "block_n": 128}, {"gpu_block_n": 128}),
        "many-steps": Shape({"M": 19, "N": 1000}, {"block_m": 8, "block_n": 128}, {"gpu_block_n": 128}),
    },
    "reductions.column_sums": {
        "aligned": Shape({"M": 32, "N": 256}, {"block_m": 8, "block_n": 128}, {"gpu_block_m": 8}),
        "many-steps": Shape({"M": 1001, "N": 130}, {"block_m": 8, "block_n": 128}, {"gpu_block_m": 8}),
    },
}
for _dtype, _block in (("i32", 128), ("f32", 128), ("i8", 512)):  # i8 vectors: blocks of 512 at least
    BLOCKED_SHAPES[f"ops.equal_count_{_dtype}"] = {
        "aligned": Shape({"N": 4 * _block}, {"block_n": _block}, {"gpu_block_n": 128}),
        "many-steps": Shape({"N": 3001}, {"block_n": _block}, {"gpu_block_n": 128}),
    }
BLOCKED_SHAPES["reductions.equal_count"] = BLOCKED_SHAPES["ops.equal_count_i32"]


def shape_of(case: KernelCase, shape_class: str) -> Shape:
    """Sizes and blocks of a shape class:

    - aligned: whole blocks only, several of them (a multiple of 128 on GPUs too);
    - ragged: the default blocks, each blocked dimension 37 past a multiple of its
      block, and a whole reduced dimension of 200 (one TPU block; 256 with 56 padded on
      GPUs). For a row kernel (N whole, M blocked by 8 to 32) that is also its many-step
      shape: 45 to 69 rows, 2 to 6 blocks, the last partial;
    - one: every dimension 1;
    - many-steps (blocked reductions): small blocks, many of them, the last partial:
      the reduction accumulates over 6 to 126 steps.
    """
    if shape_class == "one":
        return Shape({d: 1 for d in case.dims}, {}, {})
    if shape_class == "ragged":
        defaults = block_defaults(kernel_of(case))
        sizes = {d: defaults[f"block_{d.lower()}"] + 37 if f"block_{d.lower()}" in defaults else 200 for d in case.dims}
        return Shape(sizes, {}, {})
    if case.id in BLOCKED_SHAPES:
        return BLOCKED_SHAPES[case.id][shape_class]
    # Row kernels: M blocked (by the least block its dtypes allow), N whole.
    assert shape_class == "aligned", f"{case.id} has no {shape_class} shape"
    rows = sublane_rows((*case.inputs, *case.outputs), "M")
    return Shape({"M": 2 * rows, "N": 256}, {"block_m": rows}, {"gpu_block_m": 8})


# ops.argmax_f32 and ops.equal_count_i32 have the very specs of reductions.argmax_rows
# and reductions.equal_count but for their default blocks: they take the ragged shape,
# which uses those defaults. The other ops.* kernels, the same in other dtypes, leave out
# the aligned shape (where no block is masked), which is the same code in every dtype.
SAME_AS = {"ops.argmax_f32": "reductions.argmax_rows", "ops.equal_count_i32": "reductions.equal_count"}


def shape_classes(case: KernelCase) -> list[str]:
    if case.id in SAME_AS:
        return ["ragged"]
    return [
        shape_class
        for shape_class in SHAPE_CLASSES
        if (shape_class != "many-steps" or case.id in BLOCKED) and (shape_class != "aligned" or case.module != "ops")
    ]


MATCH_CASES = [(case, shape_class) for case in REDUCTIONS for shape_class in shape_classes(case)]


def inputs_for(case: KernelCase, shape: Shape, seed: int = 0) -> list[np.ndarray]:
    arrays = case.make_inputs(np.random.default_rng(seed), shape.sizes)
    for operand, array in zip(case.inputs, arrays, strict=True):
        assert array.dtype == NUMPY_DTYPES[operand.dtype] and array.shape == operand.shape(shape.sizes), operand
    return arrays


def check_declared(case: KernelCase, got, sizes: dict[str, int]) -> None:
    """Outputs have the spec's dtypes and shapes: a reduced dimension is gone, a scalar
    output is a 0-d array."""
    assert len(got) == len(case.outputs)
    for operand, out in zip(case.outputs, got):
        assert out.dtype == NUMPY_DTYPES[operand.dtype], f"{case.id}: {operand.name} is {out.dtype}"
        assert out.shape == operand.shape(sizes), f"{case.id}: {operand.name} has shape {out.shape}"


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize(("case", "shape_class"), MATCH_CASES, ids=[f"{c.id}-{s}" for c, s in MATCH_CASES])
def test_kernel_matches_numpy(case, shape_class, path):
    """On both paths, at aligned, ragged, 1x1 and many-step shapes, the outputs have the
    declared dtypes and shapes and equal the float64 NumPy reference: integers (argmax,
    counts, int8 codes) exactly, floats within f32 rounding that grows as sqrt of the
    reduced size, bf16 within one bf16 ulp."""
    shape = shape_of(case, shape_class)
    arrays = inputs_for(case, shape)
    got = run(case, path, arrays, **shape.keywords)
    check_declared(case, got, shape.sizes)
    assert_outputs_close(got, case.expected(*arrays), case.tolerances_for(arrays), f"{case.id} ({path}) vs NumPy")


@pytest.mark.parametrize("case", REDUCTIONS, ids=IDS)
def test_reference_function_matches_numpy(case):
    """`NAME.reference`, the plain jax.numpy version, computes what the NumPy reference
    does, with the declared dtypes and shapes (and the non-default params too)."""
    shape = shape_of(case, "ragged")
    arrays = inputs_for(case, shape, seed=1)
    for params in ({}, case.params) if case.params else ({},):
        got = run_reference(case.module, case.kernel, arrays, **params)
        check_declared(case, got, shape.sizes)
        expected = case.expected(*arrays, **params)
        assert_outputs_close(got, expected, case.tolerances_for(arrays), f"{case.id}.reference{params} vs NumPy")


PARAM_CASES = [case for case in REDUCTIONS if case.params]


@pytest.mark.parametrize("case", PARAM_CASES, ids=[case.id for case in PARAM_CASES])
def test_eps_reaches_the_kernel(case, path):
    """A non-default eps changes rstd and y, on both paths, as NumPy says."""
    shape = shape_of(case, "ragged")
    arrays = inputs_for(case, shape, seed=3)
    got = run(case, path, arrays, **shape.keywords, **case.params)
    assert_outputs_close(got, case.expected(*arrays, **case.params), case.tolerances_for(arrays), case.id)
    default = case.expected(*arrays)
    assert not np.allclose(f64(got[0]), default[0], rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- shapes of outputs


DECLARED = {
    # case: (input shapes, expected (dtype, shape) per output), M=21, N=200, V=300
    "softmax.softmax": ([(21, 200)], [("f32", (21, 200))]),
    "norms.layer_norm": ([(21, 200), (200,), (200,)], [("bf16", (21, 200)), ("f32", (21,)), ("f32", (21,))]),
    "norms.rms_norm": ([(21, 200), (200,)], [("bf16", (21, 200))]),
    "losses.cross_entropy": ([(21, 300), (21,)], [("f32", (21,))]),
    "reductions.argmax_rows": ([(21, 200)], [("i32", (21,))]),
    "reductions.column_sums": ([(21, 200)], [("f32", (200,))]),
    "reductions.quantize_rows_int8": ([(21, 200)], [("i8", (21, 200)), ("f32", (21,))]),
    "reductions.equal_count": ([(300,), (300,)], [("i32", ())]),
    "ops.equal_count_i8": ([(300,), (300,)], [("i32", ())]),
}


@pytest.mark.parametrize("case_id", DECLARED)
def test_lower_rank_and_scalar_outputs_have_their_declared_shapes(case_id, path):
    """mu and rstd are f32[M], loss f32[M], column sums f32[N], argmax i32[M], the
    quantizer's scale f32[M], and a count is a 0-d i32 array; the kernel and its
    reference agree on it (read without running, by jax.eval_shape)."""
    case = CASES[case_id]
    input_shapes, outputs = DECLARED[case_id]
    args = [jax.ShapeDtypeStruct(s, NUMPY_DTYPES[op.dtype]) for s, op in zip(input_shapes, case.inputs, strict=True)]
    keywords = {"interpret": True} if path == "gpu" else {}
    module = generated_module(case.module)
    for function in (
        functools.partial(getattr(module, case.kernel), **keywords),
        getattr(module, case.kernel).reference,
    ):
        shapes = as_tuple(jax.eval_shape(function, *args))
        assert [(np.dtype(s.dtype), s.shape) for s in shapes] == [(NUMPY_DTYPES[d], shape) for d, shape in outputs]
    # A single output comes back as one array, several as a tuple.
    result = jax.eval_shape(functools.partial(getattr(module, case.kernel), **keywords), *args)
    assert isinstance(result, tuple) == (len(outputs) > 1)


# --------------------------------------------------------------------------- scalar outputs


@pytest.mark.parametrize(
    ("case_id", "size", "block_n"),
    [
        ("reductions.equal_count", 1, 1024),  # one step of one element
        ("reductions.equal_count", 1000, 1024),  # one step: N smaller than the block
        ("reductions.equal_count", 3001, 128),  # 24 steps, the last 57 wide
    ],
    ids=["one-element", "one-step", "24-steps"],
)
def test_a_scalar_output_counts_over_one_step_and_many(case_id, size, block_n, path):
    """equal_count returns a 0-d i32 array: the number of equal positions, whether the
    count takes one grid step or accumulates over many. Here positions 1, 4, 7, ...
    differ and the others are equal: N - (N + 1) // 3 of them."""
    case = CASES[case_id]
    dtype = NUMPY_DTYPES[case.inputs[0].dtype]
    x = (np.arange(size) % 100).astype(dtype)
    y = x.copy()
    y[1::3] += 1
    (n,) = run(case, path, [x, y], block_n=block_n, gpu_block_n=128)
    assert n.shape == () and n.dtype == np.int32
    assert int(n) == size - (size + 1) // 3


def test_a_reduction_to_a_scalar_keeps_a_running_value_per_position_of_its_block():
    """Reducing a block across lanes and sublanes every step doubled the TPU compiler's
    estimate against XLA's (benchmarks/RESULTS_TPU_ESTIMATES.md): a kernel whose only
    dimension is reduced keeps a block-shaped running sum, reduced once at the last step
    (the 24-step count above checks its answer), and holds its one-dimensional blocks as
    rows of 128 lanes (one long row of int8 was estimated 4.8x slower on v5e). A column
    sum keeps one row per block; a kernel that asks for positions keeps one long row."""
    equal_count = checked_kernel("reductions", "equal_count")
    column_sums = checked_kernel("reductions", "column_sums")
    argmax = checked_kernel("ops", "argmax_f32")
    (positions,) = check_source(INDEXED_SUM, "indexed_sum.pallas")
    assert accumulates_elementwise(equal_count.kernel, "N") and holds_rows(equal_count.kernel, "N")
    assert accumulates_elementwise(positions.kernel, "N") and not holds_rows(positions.kernel, "N")
    assert not accumulates_elementwise(column_sums.kernel, "M")  # N stays: a row of sums per block
    assert not accumulates_elementwise(argmax.kernel, "N")  # a row reduction
    generated = (Path(__file__).resolve().parents[1] / "generated" / "reductions.py").read_text()
    assert "x, y = rt.as_rows(x_ref[...]), rt.as_rows(y_ref[...])" in generated  # equal_count
    assert "scratch_shapes=[pltpu.VMEM(rt.rows_shape(block_n), jnp.int32)]" in generated  # equal_count
    assert "scratch_shapes=[pltpu.VMEM((1, block_n), jnp.float32)]" in generated  # column_sums


INDEXED_SUM = """
kernel indexed_sum {
    in  x: f32[N]
    out s: f32[]
    s = sum(where(index(N) < 5, x, 0.0), N)
    block N = 1024
}
"""


VECTOR_REDUCTIONS = """
kernel vector_reductions {
    in  x: f32[N]
    in  c: i32[N]
    out total, average, top: f32[]
    out bottom: i32[]
    out some, every: bool[]
    total = sum(x, N)
    average = mean(x, N)
    top = max(x, N)
    bottom = min(c, N)
    some = any(c > 40, N)
    every = all(c > -60, N)
    block N = 128
}
"""


@pytest.mark.parametrize(("size", "block_n"), [(1, 128), (128, 128), (1000, 128), (1000, 512), (1500, 1024)])
def test_every_elementwise_reducer_to_a_scalar_matches_numpy_over_ragged_steps(size, block_n, tmp_path):
    """sum, mean, max, min, any and all of a vector, each with a running value per
    position of a block held as rows of 128: 8 steps of one row at 1000, the last 104
    wide; 2 steps of 4 rows, the last 488 wide (3 rows and 104 of the fourth); 2 of 8
    rows, the last 476 wide. Padding (NaN, iinfo.min) would change every answer if it
    were read."""
    path = tmp_path / "vector_reductions.py"
    path.write_text(generate(VECTOR_REDUCTIONS, "vector_reductions.pallas", "specs/vector_reductions.pallas"))
    assert "pltpu.VMEM(rt.rows_shape(block_n), jnp.float32)" in path.read_text()
    module = load_generated(path)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(size).astype(np.float32)
    c = rng.integers(-50, 50, size).astype(np.int32)
    got = [np.asarray(a) for a in module.vector_reductions(x, c, block_n=block_n)]
    want = [x.sum(dtype=np.float64), x.mean(dtype=np.float64), x.max(), c.min(), (c > 40).any(), (c > -60).all()]
    for g, w in zip(got, want):
        assert g.shape == ()
        np.testing.assert_allclose(g.astype(np.float64), np.float64(w), rtol=1e-5, atol=1e-5)


POSITIONS_BY_RANK = """
kernel weighted_total {
    in  x: f32[N]
    out s: f32[]
    s = sum(x * f32(index(N)), N)
}

kernel positions_3d {
    in  x: f32[A, M, N]
    out y: f32[A, M, N]
    y = x + f32(100 * index(A) + 10 * index(M) + index(N))
}
"""


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "triton"])
def test_index_in_a_kernel_of_rank_1_or_3_is_each_positions_own_axis(gpu, tmp_path, monkeypatch):
    """index(N) of a vector held whole is a vector (it was an [N, 1] column, so x * index
    broadcast to [N, N] and the scalar's store failed), and in a rank-3 kernel each
    dimension's positions lie on its own axis."""
    path = tmp_path / "positions.py"
    path.write_text(generate(POSITIONS_BY_RANK, "positions.pallas", "specs/positions.pallas"))
    module = load_generated(path)
    if gpu:
        take_gpu_branch(monkeypatch, module)
    x = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    got = np.asarray(module.weighted_total(x, **({"interpret": True} if gpu else {})))
    np.testing.assert_allclose(got, (x.astype(np.float64) * np.arange(300)).sum(), rtol=1e-5)
    x3 = np.zeros((2, 3, 5), np.float32)
    a, m, n = np.meshgrid(np.arange(2), np.arange(3), np.arange(5), indexing="ij")
    got3 = np.asarray(module.positions_3d(x3, **({"interpret": True} if gpu else {})))
    np.testing.assert_array_equal(got3, (100 * a + 10 * m + n).astype(np.float32))


EXP_SUM_LET = """
kernel exp_sum {
    in  x: f32[M, N]
    out s: f32[M]
    let e = exp(x - max(x, N))
    s = sum(e, N)
    block M = 8, N = 128
}
"""


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "triton"])
def test_a_let_of_exp_terms_read_only_by_their_sum_over_a_swept_dimension(gpu, tmp_path, monkeypatch):
    """`let e = exp(x - max(x, N))` read only by `sum(e, N)` with N blocked: the sum is
    carried online (rescaled as the running max grows) and its terms are computed in the
    step. They were named after the let, which no step computed (a NameError at trace)."""
    path = tmp_path / "exp_sum.py"
    path.write_text(generate(EXP_SUM_LET, "exp_sum.pallas", "specs/exp_sum.pallas"))
    module = load_generated(path)
    if gpu:
        take_gpu_branch(monkeypatch, module)
    x = np.random.default_rng(6).standard_normal((13, 300)).astype(np.float32) * 4
    got = np.asarray(module.exp_sum(x, **({"interpret": True} if gpu else {})))
    wide = x.astype(np.float64)
    np.testing.assert_allclose(got, np.exp(wide - wide.max(axis=1, keepdims=True)).sum(axis=1), rtol=1e-5)


def load_generated(path: Path):
    return load_module(path.read_text(), path)


def checked_kernel(spec: str, name: str):
    path = Path(__file__).resolve().parents[1] / "specs" / f"{spec}.pallas"
    return next(c for c in check_source(path.read_text(), str(path)) if c.kernel.name == name)


# --------------------------------------------------------------------------- ties


ARGMAX_IDS = ["reductions.argmax_rows", "reductions.argmin_rows"] + [f"ops.argmax_{d}" for d in ("f32", "i32", "i8")]


def tie_rows(case: KernelCase, n: int):
    """Rows with ties, and where the first index of the maximum (argmax) or minimum
    (argmin) lies; lowest/highest are the dtype's extremes (-inf and inf for floats)."""
    dtype = NUMPY_DTYPES[case.inputs[0].dtype]
    is_float = dtype.kind == "f"
    lowest = -np.inf if is_float else np.iinfo(dtype).min
    highest = np.inf if is_float else np.iinfo(dtype).max
    sign = -1 if case.kernel.startswith("argmin") else 1  # the winner: +5 for argmax, -5 for argmin
    rows, want = [], []

    def row(at, value=sign * 5, fill=0):
        r = np.full(n, fill, np.float64)
        r[list(at)] = value
        rows.append(r)

    row([]), want.append(0)  # all equal: the first position
    row([3, 7]), want.append(3)  # two equal extremes
    row([0, n - 1]), want.append(0)  # the first and the last
    row([n - 2, n - 1]), want.append(n - 2)  # the last two, in the last (padded) GPU block
    row([n - 1]), want.append(n - 1)  # one extreme, at the very end
    # Every element equals the masking identity (lowest for argmax, highest for argmin):
    # a padded lane holding the identity ties with all of them and must not win.
    row([], fill=lowest if sign > 0 else highest), want.append(0)
    row([], fill=highest if sign > 0 else lowest), want.append(0)  # the other extreme
    row(range(1, n, 2)), want.append(1)  # every odd position
    return np.stack(rows).astype(dtype), np.array(want)


@pytest.mark.parametrize("case_id", ARGMAX_IDS)
def test_argmax_and_argmin_return_the_first_index_of_ties(case_id, path):
    """Like jnp.argmax and jnp.argmin: where several positions hold the extreme, the first
    wins; in a row of the dtype's lowest (argmax) or highest (argmin) value, that is
    position 0, not a padded lane. N = 200: one TPU block, a 256-wide GPU block."""
    case = CASES[case_id]
    x, want = tie_rows(case, 200)
    (got,) = run(case, path, [x])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(case.expected(x)[0], want)  # the NumPy reference agrees
    np.testing.assert_array_equal(run_reference(case.module, case.kernel, [x])[0], want)


def test_a_blocked_argmax_keeps_the_first_index_of_a_tie_across_blocks(path):
    """argmax_blocked reduces N in blocks of 128 (steps on a TPU, a loop in each Triton
    program): a maximum in block 0 and again in block 2 (or in block 1 and the ragged
    last block) is found at its first position, as np.argmax finds it; a later block
    holding a tie never takes over the running index."""
    case, n = CASES["reductions.argmax_blocked"], 3 * 128 + 37
    x = np.zeros((4, n), np.float32)
    x[0, [5, 2 * 128 + 7]] = 2.0  # block 0 and block 2
    x[1, [128 + 1, 3 * 128 + 3]] = 2.0  # block 1 and the ragged last block
    x[2, [2 * 128, 2 * 128 + 1, 3 * 128]] = -1.0  # ties of the row's maximum, 0, from position 0 on
    x[3, [3 * 128 + 36]] = 2.0  # a single maximum at the very end
    want = np.argmax(x, axis=1)
    assert list(want) == [5, 128 + 1, 0, 3 * 128 + 36]
    (got,) = run(case, path, [x], block_n=128, gpu_block_n=128)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- rounding, means, labels


def test_quantize_rounds_half_to_even(path):
    """q = round(x / scale), half to even as jnp.round: where a row's largest magnitude is
    127 the scale is exactly 1 and x / scale is exact, so the ties are real ties; at 254
    the scale is exactly 2. A row of zeros has the scale's floor, 1e-30 / 127, and q 0."""
    case = CASES["reductions.quantize_rows_int8"]
    x = np.array(
        [
            [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 126.5, 127.0],
            [1.0, 3.0, 5.0, 7.0, -1.0, -3.0, -5.0, 2.0, -254.0],
            [0.0] * 9,
        ],
        np.float32,
    )
    q, scale = run(case, path, [x])
    np.testing.assert_array_equal(q, [[0, 2, 2, 4, 0, -2, -2, 126, 127], [0, 2, 2, 4, 0, -2, -2, 1, -127], [0] * 9])
    np.testing.assert_array_equal(scale[:2], [1.0, 2.0])
    np.testing.assert_allclose(scale[2], 1e-30 / 127, rtol=2.0**-22)


def test_mean_divides_by_the_true_size(path):
    """layer_norm over rows of 3 (a GPU block of 4, one padded lane): mu is the mean of
    the 3 values, rstd = 1 / sqrt(variance + eps) with the variance over 3 as well."""
    case = CASES["norms.layer_norm"]
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], BF16)
    w, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    y, mu, rstd = run(case, path, [x, w, b])
    np.testing.assert_allclose(mu, [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(np.array([2 / 3, 8.0]) + 1e-5), rtol=1e-6)
    # (2 - mu) * rstd is 0 up to the rounding of mu (a division on the GPU path)
    np.testing.assert_allclose(f64(y), [[-1.2247, 0.0, 1.2247], [-0.7071, -0.7071, 1.4142]], rtol=2.0**-7, atol=1e-6)


def test_cross_entropy_counts_positions_from_the_start_of_v(path):
    """index(V) is the position in the whole row, not in the block: with V = 1000 in
    blocks of 128, labels in the first, a middle and the ragged last block each pick
    their own logit. Each row's logits are 0 but at the label, 1, so the loss is
    log(V - 1 + e) - 1. A label outside [0, V) matches no position and the loss is the
    log-sum-exp alone, log(V): -1, and V itself, which would match a padded lane."""
    case = CASES["losses.cross_entropy"]
    v = 1000
    label = np.array([0, 2, 130, 640, 999, 127, 128, -1, v, 5, 6, 7, 8, 9, 10, 11], np.int32)
    logits = np.zeros((16, v), np.float32)
    inside = (label >= 0) & (label < v)
    logits[np.arange(16)[inside], label[inside]] = 1.0
    (loss,) = run(case, path, [logits.astype(BF16), label], block_m=16, block_v=128, gpu_block_v=128)
    want = np.where(inside, np.log(v - 1 + np.e) - 1, np.log(v))
    np.testing.assert_allclose(loss, want, rtol=1e-5)


# --------------------------------------------------------------------------- masked tails
#
# Three steps prove that a kernel masks a tail: the interpreter pads edge blocks with a
# known value (test_interpret_mode_pads_edge_blocks_with); one such value read as data
# would change the NumPy answer; and the kernel, run where its edge blocks hold that
# padding, still gives the true answer. With interpret=True's own padding (NaN, iinfo.min)
# the last step is test_kernel_matches_numpy at ragged and many-step shapes, for every
# kernel but three; those three, and the TPU path under InterpretParams, have tests here.

# Paddings, named as InterpretParams names them, plus "interpret" for interpret=True's own.
PADDINGS = ("interpret", "nan", "zero")


def padding_value(dtype: np.dtype, padding: str):
    """What interpret mode pads an edge block of `dtype` with (see the module docstring;
    interpret=True pads i16 with 0, the dtype it keeps semaphores in)."""
    dtype = np.dtype(dtype)
    if padding == "zero" or (padding == "interpret" and dtype == np.int16):
        return 0
    if dtype.kind == "b":
        return padding == "nan"  # interpret=True pads with False, InterpretParams("nan") with True
    if dtype.kind in "iu":
        return np.iinfo(dtype).max if padding == "nan" else np.iinfo(dtype).min
    return np.nan


def interpret_for(padding: str):
    """The TPU path's `interpret` argument that pads with `padding`."""
    return True if padding == "interpret" else pltpu.InterpretParams(uninitialized_memory=padding)


def padding_seen(dtype, interpret) -> np.ndarray:
    """The values a hand-written kernel reads in the padded part of an edge block: a
    (32, 100) array in one (32, 128) block, copied out whole; widened by `exact`."""

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    out = pl.pallas_call(
        copy,
        grid=(1,),
        in_specs=[pl.BlockSpec((32, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((32, 128), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((32, 128), dtype),
        interpret=interpret,
    )(jnp.zeros((32, 100), dtype))
    return exact(np.asarray(out)[:, 100:])


def assert_padding(dtype, interpret, padding: str) -> None:
    seen = padding_seen(dtype, interpret)
    want = np.full_like(seen, padding_value(dtype, padding))
    np.testing.assert_array_equal(seen, want, err_msg=f"{np.dtype(dtype)} padded with {padding}")


@pytest.fixture
def tpu_interpret_state():
    """TPU interpret mode keeps global state: reset it after each test, failed or not."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i32", "i16", "i8"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_interpret_mode_pads_edge_blocks_with(padding, dtype, tpu_interpret_state):
    """interpret=True: NaN for floats, iinfo.min for ints (False for bools).
    InterpretParams(uninitialized_memory="nan"): NaN, iinfo.max (True); "zero": zeros."""
    assert_padding(NUMPY_DTYPES[dtype], interpret_for(padding), padding)


def with_padded_tail(case: KernelCase, arrays, padding: str) -> list[np.ndarray]:
    """The inputs with one padding element appended along every reduced dimension."""
    padded = []
    for operand, array in zip(case.inputs, arrays):
        for axis, dim in enumerate(operand.dims):
            if dim in case.reduced:
                edge = np.full_like(np.take(array, [0], axis=axis), padding_value(array.dtype, padding))
                array = np.concatenate([array, edge], axis=axis)
        padded.append(array)
    return padded


def unmasked_answer(case: KernelCase, arrays, padding: str):
    """The NumPy answer with one padded element read as data, cut back to the true shape."""
    with np.errstate(invalid="ignore", over="ignore"):
        outputs = case.expected(*with_padded_tail(case, arrays, padding))
    sizes = case.sizes_of(arrays)
    return tuple(np.asarray(out)[tuple(slice(0, sizes[d]) for d in op.dims)] for out, op in zip(outputs, case.outputs))


def tail_would_change_the_answer(case: KernelCase, arrays, padding: str) -> bool:
    unmasked, expected = unmasked_answer(case, arrays, padding), case.expected(*arrays)
    return any(not np.array_equal(exact(a), exact(e), equal_nan=True) for a, e in zip(unmasked, expected))


# Where interpret=True's padding, read as data, would not change the answer: NaN == NaN
# is false, so equal_count_f32 would not count NaN pads; iinfo.min never wins an argmax
# (it ties only with rows of iinfo.min, and the first index wins the tie).
BLIND_TO_INTERPRET_PADDING = {"ops.equal_count_f32": "zero", "ops.argmax_i32": "nan", "ops.argmax_i8": "nan"}


def masking_shape(case: KernelCase) -> Shape:
    return shape_of(case, "many-steps" if case.id in BLOCKED else "ragged")


@pytest.mark.parametrize("case", REDUCTIONS, ids=IDS)
def test_interpret_padding_read_as_data_would_change_the_answer(case):
    """The premise of the ragged tests: at the shapes test_kernel_matches_numpy runs,
    one element of interpret=True's padding read as data changes each kernel's answer,
    except for the kernels in BLIND_TO_INTERPRET_PADDING, where their own padding does."""
    arrays = inputs_for(case, masking_shape(case), seed=0)
    blind = case.id in BLIND_TO_INTERPRET_PADDING
    assert tail_would_change_the_answer(case, arrays, "interpret") != blind
    if blind:
        assert tail_would_change_the_answer(case, arrays, BLIND_TO_INTERPRET_PADDING[case.id])


# The TPU path of blocked reductions under InterpretParams, which also simulates TPU
# memory (an out-of-bounds read raises); "tail" shapes: 3 steps, the last partial.
TAIL_SHAPES = {
    "losses.cross_entropy": Shape({"M": 19, "V": 300}, {"block_m": 16, "block_v": 128}, {}),
    "reductions.column_sums": Shape({"M": 21, "N": 130}, {"block_m": 8, "block_n": 128}, {}),
    "reductions.equal_count": Shape({"N": 300}, {"block_n": 128}, {}),
    "ops.equal_count_f32": Shape({"N": 300}, {"block_n": 128}, {}),
}
TAIL_PADDING = {case_id: BLIND_TO_INTERPRET_PADDING.get(case_id, "nan") for case_id in TAIL_SHAPES}


@pytest.mark.parametrize("case_id", TAIL_SHAPES)
def test_tpu_masks_the_ragged_tail_of_a_blocked_reduction(case_id, tpu_interpret_state):
    """Under InterpretParams(uninitialized_memory="nan") ("zero" for f32 equal_count), the
    partial last block of the reduced dimension holds NaN (floats) or iinfo.max (ints,
    equal in x and y): read as data it would poison the sum or log-sum-exp or count as
    equal. The kernel masks it with the reduction's identity and gives the true answer."""
    case, shape, padding = CASES[case_id], TAIL_SHAPES[case_id], TAIL_PADDING[case_id]
    interpret = interpret_for(padding)
    for dtype in {NUMPY_DTYPES[op.dtype] for op in case.inputs}:
        assert_padding(dtype, interpret, padding)
    arrays = inputs_for(case, shape, seed=11)
    assert tail_would_change_the_answer(case, arrays, padding)
    got = run(case, "tpu", arrays, **shape.keywords, interpret=interpret)
    assert_outputs_close(got, case.expected(*arrays), case.tolerances_for(arrays), f"{case_id} padded with {padding}")


@pytest.fixture
def padded_with(monkeypatch):
    """Make interpret=True pad as InterpretParams(uninitialized_memory=padding) does, for
    the GPU path (its Triton kernels cannot run under InterpretParams): replaces
    `uninitialized_value` of jax/_src/pallas/primitives.py, which hlo_interpreter.py
    calls when it traces a kernel, so compiled kernels are forgotten around it."""

    def pad(padding):
        def uninitialized_value(shape, dtype):
            return jnp.full(shape, padding_value(dtype, padding), dtype)

        monkeypatch.setattr(pallas_primitives, "uninitialized_value", uninitialized_value)
        jax.clear_caches()
        clear_kernel_caches()

    yield pad
    monkeypatch.undo()
    jax.clear_caches()
    clear_kernel_caches()


@pytest.mark.parametrize("case_id", BLIND_TO_INTERPRET_PADDING)
def test_gpu_masks_the_padded_lanes_that_interpret_padding_cannot_show(case_id, monkeypatch, padded_with):
    """The GPU path's power-of-two blocks leave padded lanes (rows of 200 in blocks of
    256; N = 3001). With them holding 0.0 (f32 equal_count: 0.0 == 0.0 would count) or
    iinfo.max (an argmax would pick it), the Triton kernel still masks them: it loads
    with the reduction's identity as `other`."""
    case, padding = CASES[case_id], BLIND_TO_INTERPRET_PADDING[case_id]
    padded_with(padding)
    for stem in MODULES:
        take_gpu_branch(monkeypatch, generated_module(stem))
    for dtype in {NUMPY_DTYPES[op.dtype] for op in case.inputs}:
        assert_padding(dtype, True, padding)
    shape = masking_shape(case)
    arrays = inputs_for(case, shape, seed=11)
    assert tail_would_change_the_answer(case, arrays, padding)
    got = run(case, "gpu", arrays, **shape.keywords)
    assert_outputs_close(got, case.expected(*arrays), case.tolerances_for(arrays), f"{case_id} padded with {padding}")


# --------------------------------------------------------------------------- reductions inside expressions

INSIDE_EXPRESSIONS = """
kernel flags {
    in  c: bool[M, N]
    in  x: i8[M, N]
    out seen: f32[M]
    out last: i32[M]
    out spread: i8[M]
    seen = f32(any(c, N)) + f32(all(c, N))
    last = i32(argmax(x, N)) * 2 + 1
    spread = max(x, N) - min(x, N)
    block M = 32
}
"""


@pytest.fixture(scope="module")
def inside_expressions(tmp_path_factory):
    path = tmp_path_factory.mktemp("inside") / "flags.py"
    return load_module(generate(INSIDE_EXPRESSIONS, "flags.pallas", "flags.pallas"), path)


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "gpu"])
def test_a_reduction_is_an_operand_like_any_value(inside_expressions, gpu, monkeypatch):
    """Reductions written as comparisons (any, all) or narrowed back (max of i8) take
    their place in larger expressions: casts, arithmetic, wrapping i8 subtraction."""
    if gpu:
        take_gpu_branch(monkeypatch, inside_expressions)
    rng = np.random.default_rng(7)
    c = rng.random((37, 5)) < 0.5
    c[0], c[1] = True, False
    x = rng.integers(-128, 128, (37, 5)).astype(np.int8)
    seen, last, spread = inside_expressions.flags(c, x, interpret=True if gpu else None)
    np.testing.assert_array_equal(seen, c.any(1).astype(np.float32) + c.all(1).astype(np.float32))
    np.testing.assert_array_equal(last, np.argmax(x, 1) * 2 + 1)
    np.testing.assert_array_equal(spread, (x.max(1).astype(np.int64) - x.min(1)).astype(np.int8))


@pytest.mark.parametrize("residuals", [False, True])
def test_log_softmax_of_a_row_holding_inf_agrees_with_its_reference(residuals, path):
    """A row's +inf makes its logsumexp +inf (as jax.nn.logsumexp): x - inf is -inf, and
    the +inf's own place inf - inf is NaN; a row of -inf, and a row with NaN, as well;
    the residual logsumexp_n too, against jax.nn.logsumexp."""
    log_softmax = generated_module("softmax").log_softmax
    x = np.random.default_rng(0).standard_normal((12, 300)).astype(np.float32)
    x[0, 2] = np.inf
    x[1, :] = -np.inf
    x[2, 5] = np.nan
    x[3, 7], x[3, 9] = np.inf, np.inf
    call = log_softmax.with_residuals if residuals else log_softmax
    got = jax.tree.leaves(call(x, interpret=True if path == "gpu" else None))
    want = [log_softmax.reference(x), *([jax.nn.logsumexp(x, axis=1)] if residuals else [])]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
