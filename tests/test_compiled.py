"""The compiled tier: every bundled kernel through the real compilers, on CPU.

- Mosaic + XLA:TPU (libtpu, from `jax[tpu]`) for compile-only v5e and v6e chips.
- Triton (the `triton` package) for sm_90: Pallas's tt IR -> PTX -> cubin (ptxas).
- The out-of-bounds check: at sizes where blocks overhang their arrays, no tt.load or
  tt.store in the Triton IR may go without a mask.

Which compiles run (each 0.1 to 1.5 s; the tier takes about 75 s on 2 cores, 2.5
minutes on a busy machine; the README says so, keep it in step):

| class     | sizes                                                                    | v5e | v6e | Triton | masks |
|-----------|--------------------------------------------------------------------------|-----|-----|--------|-------|
| aligned   | 4096 (bf16 products 8192), vectors 4096*4096, batch 2, reduced 4096      |  x  |  x  |   x    |       |
| ragged    | rows 1000, columns 3000, K 1000, vectors 3000000, batch 2, reduced 3000  |  x  |  x  |   x    |       |
| small     | rows 8, columns 128, K 128, vectors 1000, batch 2, reduced 128           |  x  |     |   x    |       |
| one       | every dimension 1                                                        |  x  |     |   x    |       |
| odd       | rows 1001, columns 3001, K 1001, vectors 3000001, batch 2, reduced 3001  |     |     |        |   x   |
| odd-small | rows 5, columns 100, K 100, vectors 1000, batch 2, reduced 100           |     |     |        |   x   |
| int8      | every dimension 4096; default blocks, then block_m=32                    |  x  |     |        |       |

A reduced dimension is one of the inputs that no output has, outside a matrix product
(cross_entropy's V, column_sums's M, equal_count's N): it has sizes of its own, and
cross_entropy's V those of vocabularies, 128 * 1024 aligned and 50257 (GPT-2's) ragged,
64 and 25 steps of its default block of 2048. The int8 class covers the kernels with
i8/u8 arrays of two dimensions or more. v6e repeats v5e's Mosaic for the classes where
blocks are large enough for the chips to differ; Triton compiles each kernel once per
size class, and the mask check reads the same IR. Nothing here runs a kernel: numerics on hardware are not checked.

The generated functions are called with `interpret=False` and lowered for one
platform ("tpu" on a compile-only TPU device, "cuda" on an abstract H100); they pick
their kernel by the platform being lowered for, so each takes its own compiled path.
tests/test_compiled_specs.py does the same for specs the checker accepts that Mosaic
once rejected.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pytest

from kernel_cases import (
    NUMPY_DTYPES,
    block_defaults,
    bundled_kernels,
    is_derived,
    generated_module,
    has_matmul,
    spec_inputs,
    spec_kernel,
)
from pallasgen.devices import compile_only
from pallasgen.runtime.constants import MGPU_SMEM_PER_BLOCK

MISSING = compile_only.missing_compilers()
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason="the compiled tier needs libtpu (jax[tpu]) and triton, as `pip install -e '.[dev]'` installs them: "
    + "; ".join(MISSING),
)

# Fused kernels (specs/attention.pallas) compile at sizes of their own in test_attention.py:
# these size classes would give attention a head dimension of 8192.
KERNELS = [(module, kernel) for module, kernel in bundled_kernels() if kernel is not None and module != "attention"]

SIZES = {
    "aligned": {"batch": 2, "rows": 4096, "columns": 4096, "contracted": 4096, "vector": 4096 * 4096, "reduced": 4096},
    "ragged": {"batch": 2, "rows": 1000, "columns": 3000, "contracted": 1000, "vector": 3_000_000, "reduced": 3000},
    "small": {"batch": 2, "rows": 8, "columns": 128, "contracted": 128, "vector": 1000, "reduced": 128},
    "one": {"batch": 1, "rows": 1, "columns": 1, "contracted": 1, "vector": 1, "reduced": 1},
}
# Sizes at which every GPU block overhangs its array in every dimension (GPU blocks are
# powers of two, and a small dimension is one block of the next power of two), so that
# every load and store must be masked: odd sizes, large and smaller than one block.
OVERHANGING_SIZES = {
    "odd": {"batch": 2, "rows": 1001, "columns": 3001, "contracted": 1001, "vector": 3_000_001, "reduced": 3001},
    "odd-small": {"batch": 2, "rows": 5, "columns": 100, "contracted": 100, "vector": 1000, "reduced": 100},
}
# Reduced dimensions as long as real ones, by (module, kernel, dimension): a vocabulary.
LONG_REDUCTIONS = {("losses", "cross_entropy", "V"): {"aligned": 128 * 1024, "ragged": 50257}}
BF16_MATMUL_ALIGNED = 8192  # rows, columns and contracted size of bf16 products in "aligned"
INT8_ROWS = 4096  # int8 arrays' rows: a multiple of 32, so Mosaic tiles them (32, 128) in HBM

# The tensor of pointers of a one-element load or store: tensor<1x!tt.ptr<..>>, tensor<1x1x!tt.ptr<..>>.
ONE_ELEMENT = re.compile(r"tensor<(?:1x)+!tt\.ptr<")

TPU_CASES = [("v5e", size) for size in SIZES] + [("v6e", "aligned"), ("v6e", "ragged")]
MASKED_SIZES = list(OVERHANGING_SIZES)
# A kernel derived for jax.grad compiles at its ragged sizes only (odd ones for the mask
# check): the gradient tests run it end to end at ragged sizes.
DERIVED_SIZES = {"ragged", "odd"}


def cases(sizes) -> list:
    """(module, kernel, *size) for each kernel and size (a size: a value, or a tuple of
    values), the kernels derived for jax.grad at DERIVED_SIZES only."""
    found = []
    for module, kernel in KERNELS:
        for size in sizes:
            values = size if isinstance(size, tuple) else (size,)
            if is_derived(module, kernel) and not DERIVED_SIZES & set(values):
                continue
            found.append(pytest.param(module, kernel, *values, id=f"{module}.{kernel}-{'-'.join(values)}"))
    return found


# --------------------------------------------------------------------------- shapes


def roles(module: str, kernel: str) -> dict[str, str]:
    """Each dimension's role: batch, rows, columns, contracted (a matrix product's K),
    vector (the one dimension of a rank-1 kernel), or reduced (outside a matrix product,
    a dimension of the inputs that no output has: a reduction removes it).

    The kernel's tile is laid out over its first output's dimensions for a matrix
    product, and otherwise over its widest array's: a reduction's input, wider than its
    outputs (cross_entropy's logits[M, V] for loss[M]; equal_count's x[N] for n[])."""
    return roles_of(spec_kernel(module, kernel), has_matmul(module, kernel))


def roles_of(decl, matmul: bool) -> dict[str, str]:
    """`roles` of a kernel declaration (anything with inputs and outputs that have dims)."""
    if matmul:
        layout, removed = tuple(decl.outputs[0].dims), "contracted"
    else:
        layout, removed = max((tuple(a.dims) for a in (*decl.outputs, *decl.inputs)), key=len), "reduced"
    if len(layout) == 1 and not matmul:
        role = {layout[0]: "vector"}
    else:
        role = {d: "batch" for d in layout[:-2]}
        role |= {layout[-2]: "rows", layout[-1]: "columns"} if len(layout) >= 2 else {d: "columns" for d in layout}
    kept = {d for output in decl.outputs for d in output.dims}
    for operand in decl.inputs:
        for dim in operand.dims:
            if dim not in kept:
                role[dim] = removed
            role.setdefault(dim, "vector" if len(layout) == 1 else "columns")
    return role


def is_bf16_product(module: str, kernel: str) -> bool:
    return has_matmul(module, kernel) and any(op.dtype == "bf16" for op in spec_inputs(module, kernel))


def has_int8(module: str, kernel: str) -> bool:
    """Whether an i8/u8 array of two dimensions or more (rows that Mosaic tiles by 32) is
    in the kernel."""
    decl = spec_kernel(module, kernel)
    return any(a.dtype in ("i8", "u8") and len(a.dims) >= 2 for a in (*decl.inputs, *decl.outputs))


def sizes_of(module: str, kernel: str, size: str) -> dict[str, int]:
    table = dict({**SIZES, **OVERHANGING_SIZES}[size])
    if size == "aligned" and is_bf16_product(module, kernel):
        table |= {"rows": BF16_MATMUL_ALIGNED, "columns": BF16_MATMUL_ALIGNED, "contracted": BF16_MATMUL_ALIGNED}
    sizes = {dim: table[role] for dim, role in roles(module, kernel).items()}
    for dim in sizes:
        sizes[dim] = LONG_REDUCTIONS.get((module, kernel, dim), {}).get(size, sizes[dim])
    return sizes


def arguments(module: str, kernel: str, sizes: dict[str, int]) -> list[jax.ShapeDtypeStruct]:
    return [
        jax.ShapeDtypeStruct(tuple(sizes[d] for d in op.dims), NUMPY_DTYPES[op.dtype])
        for op in spec_inputs(module, kernel)
    ]


def compiled_path(module: str, kernel: str, **keywords):
    """The generated function with `interpret=False`: its TPU or GPU path, as lowered."""
    return functools.partial(getattr(generated_module(module), kernel), interpret=False, **keywords)


def describe(module: str, kernel: str, sizes: dict[str, int], **blocks) -> str:
    shapes = ", ".join(f"{op.name}{list(op.shape(sizes))}" for op in spec_inputs(module, kernel))
    extra = "".join(f", {name}={value}" for name, value in blocks.items())
    return f"{module}.{kernel}({shapes}{extra})"


# --------------------------------------------------------------------------- TPU


def compile_tpu(module: str, kernel: str, sizes: dict[str, int], chip: str, **blocks):
    args = arguments(module, kernel, sizes)
    try:
        compiled = compile_only.compile_for_tpu(compiled_path(module, kernel, **blocks), args, chip=chip)
    except compile_only.CompileError as error:
        pytest.fail(f"Mosaic ({chip}) rejects {describe(module, kernel, sizes, **blocks)}:\n{error.message}")
    hlo = compiled.as_text()
    assert "tpu_custom_call" in hlo, f"{describe(module, kernel, sizes, **blocks)} compiled with no Mosaic kernel"


@pytest.mark.parametrize(("module", "kernel", "chip", "size"), cases(TPU_CASES))
def test_mosaic_compiles(module, kernel, chip, size):
    compile_tpu(module, kernel, sizes_of(module, kernel, size), chip)


INT8_KERNELS = [(module, kernel) for module, kernel in KERNELS if has_int8(module, kernel)]


@pytest.mark.parametrize("block_m", [None, 32], ids=["default-blocks", "block_m-32"])
@pytest.mark.parametrize(("module", "kernel"), INT8_KERNELS, ids=[f"{m}.{k}" for m, k in INT8_KERNELS])
def test_mosaic_compiles_int8_with_32_row_blocks(module, kernel, block_m):
    """int8 arrays whose rows are a multiple of 32 are tiled (32, 128) in HBM: every
    block of rows must be a multiple of 32, the defaults and a call-time block_m=32."""
    assert "block_m" in block_defaults(getattr(generated_module(module), kernel))
    sizes = {dim: INT8_ROWS for dim in sizes_of(module, kernel, "aligned")}
    blocks = {} if block_m is None else {"block_m": block_m}
    compile_tpu(module, kernel, sizes, "v5e", **blocks)


@pytest.mark.parametrize("kernel", ["matmul_bias_gelu", "matmul_int8"])
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_a_narrow_operand_of_two_rows_masked_past_a_ragged_k_compiles(kernel, chip):
    """Mosaic cannot select a 16- or 8-bit block of fewer than 5 rows: `rt.fill_past`
    masks such an operand past K's end in 32 bits (K = 1100 in blocks of 512)."""
    compile_tpu("matmul", kernel, {"M": 2, "N": 130, "K": 1100}, chip, block_k=512)


@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_blocks_beyond_the_scoped_default_compile_with_a_raised_limit(chip):
    """bias_gelu blocks of 1024x2048 need 16.1 MiB, more than Mosaic's 16 MiB default
    (E1001 CompileTimeScopedVmemOom without a limit): the launcher raises the limit."""
    launcher = generated_module("activations").rt.vmem_limit  # the runtime the module calls
    needed = 8 * 1024 * 2048 + 8 * 2048 + 8 * 1024
    assert launcher(needed) == 2 * needed
    assert launcher(16 * 2**20) is None
    assert launcher(90 * 2**20) == 100 * 2**20
    compile_tpu("activations", "bias_gelu", {"M": 2048, "N": 4096}, chip, block_m=1024, block_n=2048)


def test_mosaic_rejection_is_a_compile_error_with_its_message():
    """f16 vectors, which v5e does not have, as a CompileError carrying Mosaic's words."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def double(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
            grid=(x.shape[0] // 8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    with pytest.raises(compile_only.CompileError) as error:
        compile_only.compile_for_tpu(double, [jax.ShapeDtypeStruct((64, 128), np.float16)])
    assert error.value.compiler == "mosaic"
    assert "Invalid vector type for load" in error.value.message


# --------------------------------------------------------------------------- Triton


@functools.cache
def triton_kernels(module: str, kernel: str, size: str) -> tuple[compile_only.TritonKernel, ...]:
    sizes = sizes_of(module, kernel, size)
    kernels = compile_only.triton_ir(compiled_path(module, kernel), arguments(module, kernel, sizes))
    assert kernels, f"{describe(module, kernel, sizes)} lowered for CUDA with no Triton kernel"
    return tuple(kernels)


@pytest.mark.parametrize(("module", "kernel", "size"), cases(SIZES))
def test_triton_compiles_for_sm90(module, kernel, size):
    for ttir in triton_kernels(module, kernel, size):
        try:
            binary = compile_only.compile_triton(ttir, capability=90)
        except compile_only.CompileError as error:
            sizes = sizes_of(module, kernel, size)
            pytest.fail(f"{error.compiler} rejects {ttir.name} of {describe(module, kernel, sizes)}:\n{error.message}")
        assert ".target sm_90" in binary.ptx and binary.cubin
        assert binary.spill_stores == binary.spill_loads == 0, f"{ttir.name} spills registers:\n{binary.ptxas_log}"


@pytest.mark.parametrize(
    ("kernel", "shapes"),
    [
        ("softmax", [((4096, 32768), np.float32)]),
        (
            "softmax_backward",
            [
                ((4096, 32768), np.float32),
                *[((4096,), t) for t in (np.float32, np.int32, np.float32)],
                ((4096, 32768), np.float32),
            ],
        ),
    ],
)
def test_a_long_row_held_whole_gets_the_warps_that_keep_it_in_registers(kernel, shapes):
    """A program holds a whole row of 32768 f32 (softmax's N): the launcher takes 32 warps
    (rt.row_warps) where nothing sets them, and ptxas spills at most a few hundred bytes a
    thread; with the four warps a caller may still ask for, the backward spills 14 KiB."""
    function = getattr(generated_module("softmax"), kernel)
    arguments = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    (ttir,) = compile_only.triton_ir(functools.partial(function, interpret=False), arguments)
    binary = compile_only.compile_triton(ttir)
    assert ttir.num_warps == 32 and binary.spill_stores <= 256, binary.ptxas_log
    if kernel == "softmax_backward":
        (four,) = compile_only.triton_ir(functools.partial(function, interpret=False, gpu_warps=4), arguments)
        assert four.num_warps == 4 and compile_only.compile_triton(four).spill_stores > 8192


@pytest.mark.parametrize(
    "kernel, shapes",
    [
        ("rmsnorm_matmul", [(1000, 1000), (1000,), (1000, 3000)]),  # all of K (1024) held
        ("rmsnorm_matmul", [(2048, 1024), (1024,), (1024, 2048)]),
    ],
)
def test_a_dot_with_an_operand_held_whole_fits_a_hoppers_shared_memory(kernel, shapes):
    """Its launcher halves the other blocks (rt.fit_dot_blocks): with the default blocks
    an H200 refused rmsnorm_matmul's 384 KiB at these sizes (and matmul_softmax's 264 KiB
    at N=2048, whose fitted compile takes ptxas 13 s: the runtime's tests cover it)."""
    function = getattr(generated_module("attention"), kernel)
    arguments = [
        jax.ShapeDtypeStruct(shape, jax.numpy.float32 if len(shape) == 1 else jax.numpy.bfloat16) for shape in shapes
    ]
    (ttir,) = compile_only.triton_ir(functools.partial(function, interpret=False), arguments)
    assert compile_only.compile_triton(ttir).shared <= MGPU_SMEM_PER_BLOCK  # an H100's or H200's


def test_a_dot_with_an_operand_held_whole_keeps_its_product_in_its_warps_registers():
    """matmul_softmax holds all of N=384 (512 a row): a 64-row program on four warps held
    256 values of its product a thread, which ptxas spilled (860 stores, 38 s to compile);
    rt.fit_dot_blocks halves the rows to 32, 128 values a thread."""
    function = functools.partial(generated_module("attention").matmul_softmax, interpret=False, gpu_backend="triton")
    arguments = [
        jax.ShapeDtypeStruct((300, 1000), jax.numpy.bfloat16),
        jax.ShapeDtypeStruct((1000, 384), jax.numpy.bfloat16),
    ]
    (ttir,) = compile_only.triton_ir(function, arguments)
    binary = compile_only.compile_triton(ttir)
    assert ttir.num_warps == 4 and binary.spill_stores == 0, binary.ptxas_log


def test_a_dot_whose_product_row_passes_a_programs_registers_is_refused_naming_mosaic_gpu():
    """All of N=3000 (4096 values a row) in a program of 16 rows: 65536 values."""
    function = functools.partial(generated_module("attention").matmul_softmax, interpret=False, gpu_backend="triton")
    arguments = [
        jax.ShapeDtypeStruct((1000, 1000), jax.numpy.bfloat16),
        jax.ShapeDtypeStruct((1000, 3000), jax.numpy.bfloat16),
    ]
    with pytest.raises(compile_only.CompileError, match=r"holds 65536 values .* use gpu_backend=\"mosaic_gpu\""):
        compile_only.triton_ir(function, arguments)


@pytest.mark.parametrize("kernel, dtype", [("matmul", np.float32), ("matmul_int8", np.int8)])
def test_a_32_or_8_bit_product_reads_its_right_operand_k_major(kernel, dtype):
    """wgmma transposes 16-bit tiles only: y: [K, N] of f32 or i8 is swapped to [N, K] by the
    launcher, and the kernel copies it in 16-byte pieces (cp.async.cg), with no 4-byte
    copies (cp.async.ca) or byte-wise shared-memory stores (st.shared.b8) as the
    transposing loads Triton made of it."""
    function = getattr(generated_module("matmul"), kernel)
    arguments = [jax.ShapeDtypeStruct((4096, 4096), dtype)] * 2
    (ttir,) = compile_only.triton_ir(functools.partial(function, interpret=False), arguments)
    ptx = compile_only.compile_triton(ttir).ptx
    assert "wgmma.mma_async" in ptx and "cp.async.cg" in ptx
    assert "cp.async.ca" not in ptx and "st.shared.b8" not in ptx


@pytest.mark.parametrize(("module", "kernel", "size"), cases(MASKED_SIZES))
def test_triton_accesses_are_masked_where_blocks_overhang(module, kernel, size):
    """Every block here overhangs its array in every dimension (odd sizes, or arrays
    smaller than a GPU block); an unmasked load or store there touches memory outside
    the array, which Triton does not check. (Where blocks fit exactly, generated code
    loads and stores unmasked, which is why aligned sizes are not in this check.) A
    one-element access cannot overhang: a reduction's row of one (`mu` of a block of one
    row) or a scalar output is inside its array at every program."""
    sizes = sizes_of(module, kernel, size)
    findings = [
        f"{ttir.name}: {access}"
        for ttir in triton_kernels(module, kernel, size)
        for access in compile_only.unmasked_accesses(ttir)
        if not ONE_ELEMENT.search(access)
    ]
    assert not findings, f"unmasked accesses in {describe(module, kernel, sizes)}:\n" + "\n".join(findings)


# --------------------------------------------------------------------------- the checker itself


def _hand_written_copy(masked: bool):
    """A Pallas Triton copy in 16x16 blocks of a (20, 20) array: overhangs in both dims."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    def kernel(x_ref, o_ref):
        rows = pl.program_id(0) * 16 + jax.numpy.arange(16)
        cols = pl.program_id(1) * 16 + jax.numpy.arange(16)
        if masked:
            inside = (rows[:, None] < 20) & (cols[None, :] < 20)
            pltriton.store(o_ref, pltriton.load(x_ref, mask=inside, other=0.0) * 2, mask=inside)
        else:
            o_ref[...] = x_ref[...] * 2

    def copy(x):
        return pl.pallas_call(
            kernel,
            grid=(2, 2),
            in_specs=[pl.BlockSpec((16, 16), lambda i, j: (i, j))],
            out_specs=pl.BlockSpec((16, 16), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        )(x)

    (ttir,) = compile_only.triton_ir(copy, [jax.ShapeDtypeStruct((20, 20), np.float32)])
    return ttir


def test_the_mask_check_passes_a_kernel_that_masks_every_access():
    ttir = _hand_written_copy(masked=True)
    assert "tt.load" in ttir.ttir and "tt.store" in ttir.ttir
    assert compile_only.unmasked_accesses(ttir) == []
    compile_only.compile_triton(ttir)


def test_the_mask_check_finds_each_access_without_a_mask_operand():
    """jax 0.10 emits a plain `ref[...]` of an overhanging block as an unmasked load and
    store (0.12 masks it itself): the findings are exactly the accesses whose operands
    stop at the pointer (load) or the pointer and value (store)."""
    ttir = _hand_written_copy(masked=False)
    lines = ttir.ttir.splitlines()
    bare = [
        number
        for number, line in enumerate(lines, 1)
        if ("tt.load" in line and line.split("tt.load")[1].split(":")[0].count("%") == 1)
        or ("tt.store" in line and line.split("tt.store")[1].split(":")[0].count("%") == 2)
    ]
    findings = compile_only.unmasked_accesses(ttir)
    assert [int(f.split(":")[0].removeprefix("line ")) for f in findings] == bare
    assert len(findings) == sum(("tt.load" in line or "tt.store" in line) for line in lines) or not findings


def test_the_mask_check_reads_pretty_and_generic_forms():
    ir = "\n".join(
        [
            "%3 = tt.load %1 : tensor<16x!tt.ptr<f32>>",
            "%4 = tt.load %1, %2 : tensor<16x!tt.ptr<f32>>",
            "%5 = tt.load %1, %2, %0 cacheModifier = ca : tensor<16x!tt.ptr<f32>>",
            "tt.store %1, %3 : tensor<16x!tt.ptr<f32>>",
            "tt.store %1, %3, %2 : tensor<16x!tt.ptr<f32>>",
            '"tt.store"(%1, %3) : (tensor<16x!tt.ptr<f32>>, tensor<16xf32>) -> ()',
            '%6 = "tt.load"(%1, %2) <{operandSegmentSizes = array<i32: 1, 1, 0>}> : (tensor<16x!tt.ptr<f32>>) -> tensor<16xf32>',
        ]
    )
    assert [f.split(":")[0] for f in compile_only.unmasked_accesses(ir)] == ["line 1", "line 4", "line 6"]


def test_the_dot_check_finds_each_dot_shallower_than_its_operands_take():
    """Triton's least depth: 16 for 16-bit operands, 8 for 32-bit (TF32), 32 for 8-bit."""
    ir = "\n".join(
        [
            "%5 = tt.dot %1, %2, %3, inputPrecision = tf32 : tensor<16x4xbf16> * tensor<4x16xbf16> -> tensor<16x16xf32>",
            "%6 = tt.dot %1, %2, %3, inputPrecision = tf32 : tensor<16x16xbf16> * tensor<16x4xbf16> -> tensor<16x4xf32>",
            "%7 = tt.dot %1, %2, %3, inputPrecision = tf32 : tensor<16x8xf32> * tensor<8x16xf32> -> tensor<16x16xf32>",
            "%8 = tt.dot %1, %2, %3 : tensor<32x16xi8> * tensor<16x32xi8> -> tensor<32x32xi32>",
            "%9 = tt.dot %1, %2, %3 : tensor<32x32xi8> * tensor<32x32xi8> -> tensor<32x32xi32>",
        ]
    )
    assert [f.split(":")[0] for f in compile_only.shallow_dots(ir)] == ["line 1", "line 4"]


def test_a_triton_failure_is_a_compile_error_with_its_message():
    ttir = _hand_written_copy(masked=True).ttir.replace("tt.load", "tt.lode", 1)
    with pytest.raises(compile_only.CompileError) as error:
        compile_only.compile_triton(ttir)
    assert error.value.compiler == "triton" and "tt.lode" in error.value.message
