"""`pallasgen show`: an SVG picture of a kernel's blocks, grid and edge blocks.

A picture draws each array as `<g class="array" data-name=NAME>`: one `rect.block`
per block it is read or written in (`ragged` on edge blocks, which also get a hatched
`rect.overhang` past the array's end), one `rect.highlight` on the block the chosen
grid step takes, and texts whose `data-bytes` give the VMEM figures they print.
"""

from __future__ import annotations

import ast
import copy
import re
import xml.etree.ElementTree as ET
from math import prod
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from pallasgen.cli import main
from pallasgen.workspace.pipeline import check_source
from pallasgen.analysis.fused import array_axes
from pallasgen.show.tilemap import ShowError, kernel_tiles, sizes_for
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.backends.tpu.tiling import format_bytes, vmem_bytes
from pallasgen.show.tilesvg import render_svg

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
EXAMPLE = ROOT / "docs" / "show_matmul_bias_gelu.svg"
# The README's command for the committed example, without its --out.
EXAMPLE_COMMAND = ["show", "specs/matmul.pallas:matmul_bias_gelu"]

SPEC_OF = {
    checked.kernel.name: (spec.stem, checked)
    for spec in sorted((ROOT / "specs").glob("*.pallas"))
    for checked in check_source(spec.read_text(encoding="utf-8"), str(spec))
}
KERNELS = {name: checked for name, (_, checked) in SPEC_OF.items()}
PRODUCTS = [name for name, checked in KERNELS.items() if checked.product is not None]
# Kernels that reduce a blocked dimension other than a product's: step by step on a TPU.
STEPPED = [
    name
    for name, checked in KERNELS.items()
    if any(d.reduced and d.reductions and d.name in checked.blocks for d in checked.space.dims)
    and checked.product is None
    or checked.framed
    and checked.sweep is not None
]


def kernel(name: str):
    return KERNELS[name]


def picture(checked, sizes: dict[str, int] | None = None, gpu: bool = False) -> ET.Element:
    tiles = kernel_tiles(checked, sizes_for(checked, sizes or {}, gpu), gpu)
    return ET.fromstring(render_svg(tiles))


def arrays(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-name"): g for g in root.iter(f"{SVG}g") if g.get("class") == "array"}


def rects(group: ET.Element, kind: str) -> list[ET.Element]:
    return [r for r in group.iter(f"{SVG}rect") if kind in r.get("class", "").split()]


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def blocks_of(checked, gpu: bool) -> dict[str, int]:
    return checked.settings["gpu"].blocks if gpu else checked.blocks


def drawn_axes(checked, decl, sizes, gpu) -> list[tuple[int, int]]:
    """(size, block) of the rows and columns an array is drawn in: the last two
    dimensions of its layout, a broadcast one as (1, 1)."""
    layout = array_axes(decl, checked.frame)
    blocks = blocks_of(checked, gpu)
    return [(1, 1) if d is None else (sizes[d], min(blocks.get(d, sizes[d]), sizes[d])) for d in layout[-2:]]


def expected_blocks(checked, decl, sizes, gpu=False) -> int:
    return prod(-(-size // block) for size, block in drawn_axes(checked, decl, sizes, gpu))


def expected_ragged(checked, decl, sizes, gpu=False) -> int:
    """Edge blocks: all blocks but those that end inside the array in every direction."""
    whole = prod(size // block for size, block in drawn_axes(checked, decl, sizes, gpu))
    return expected_blocks(checked, decl, sizes, gpu) - whole


def multiple_sizes(checked, gpu=False) -> dict[str, int]:
    """Two blocks of every blocked dimension: no edge block anywhere."""
    return {d: 2 * b for d, b in blocks_of(checked, gpu).items()}


def decls(checked):
    return checked.kernel.inputs + checked.kernel.outputs


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "gpu"])
@pytest.mark.parametrize("name", KERNELS)
def test_every_bundled_kernel_draws_each_array_in_its_blocks(name, gpu):
    checked = kernel(name)
    sizes = sizes_for(checked, {}, gpu)
    tiles = kernel_tiles(checked, sizes, gpu)
    root = ET.fromstring(render_svg(tiles))
    assert root.tag == f"{SVG}svg"
    groups = arrays(root)
    assert sorted(groups) == sorted(d.name for d in decls(checked))
    for decl in decls(checked):
        group = groups[decl.name]
        assert len(rects(group, "block")) == expected_blocks(checked, decl, sizes, gpu), decl.name
        # A skipped step (causal attention past the diagonal) reads no block of k and v.
        skips = next(a.skips for a in tiles.arrays if a.name == decl.name)
        assert len(rects(group, "highlight")) == (0 if tiles.step_skipped and skips else 1), decl.name
        assert len(rects(group, "ragged")) == expected_ragged(checked, decl, sizes, gpu), decl.name


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "gpu"])
@pytest.mark.parametrize("name", KERNELS)
def test_no_edge_block_is_marked_when_every_size_is_a_multiple_of_its_block(name, gpu):
    root = picture(kernel(name), multiple_sizes(kernel(name), gpu), gpu)
    for group in arrays(root).values():
        assert rects(group, "block")
        assert not rects(group, "ragged") and not rects(group, "overhang")
    assert not any("past the array's end" in t for t in texts(root))


def test_default_sizes_are_two_and_a_half_blocks_so_that_edges_are_ragged():
    assert sizes_for(kernel("matmul_bias_gelu"), {}, gpu=False) == {"M": 1280, "N": 2560, "K": 2560}
    assert sizes_for(kernel("matmul_bias_gelu"), {}, gpu=True) == {"M": 320, "N": 320, "K": 160}
    # A batch blocked by 1 shows three slices; D, taken whole, a small size.
    assert sizes_for(kernel("scores"), {"S": 100}, gpu=False) == {"B": 3, "S": 100, "T": 320, "D": 64}


def test_matmul_bias_gelu_blocks_at_known_sizes():
    root = picture(kernel("matmul_bias_gelu"), {"M": 1280, "N": 2560, "K": 2560})
    groups = arrays(root)
    counts = {name: len(rects(g, "block")) for name, g in groups.items()}
    assert counts == {"x": 9, "y": 9, "bias": 3, "z": 9}
    # Blocks 512 x 1024 over 1280 x 2560: the last row and column are edge blocks.
    assert {name: len(rects(g, "ragged")) for name, g in groups.items()} == {"x": 5, "y": 5, "bias": 1, "z": 5}


def test_a_block_larger_than_its_dimension_is_clamped_to_one_block_as_the_generated_code_does():
    root = picture(kernel("matmul"), {"M": 100, "N": 512, "K": 512})
    x = arrays(root)["x"]
    assert len(rects(x, "block")) == 1 and not rects(x, "ragged")
    assert "blocks M = 100, N = 512, K = 512" in texts(root)


def test_gpu_blocks_are_clamped_to_a_power_of_two_no_smaller_than_a_dot_tile():
    root = picture(kernel("matmul_bias_gelu"), {"M": 20, "N": 128, "K": 64}, gpu=True)
    assert "blocks M = 32, N = 128, K = 64" in texts(root)
    x = arrays(root)["x"]
    assert len(rects(x, "block")) == 1 and len(rects(x, "ragged")) == 1


def test_the_highlight_sits_on_the_block_the_index_map_gives_for_the_chosen_step():
    root = picture(kernel("matmul_bias_gelu"), {"M": 1280, "N": 2560, "K": 2560})
    lines = texts(root)
    assert "the blocks that step (i, j, k) = (1, 0, 1) reads and writes" in lines
    # Blocks are drawn row by row: block (r, c) of a 3-column array is the (3r + c)th.
    for name, (row, column), index_map in [
        ("x", (1, 1), "(i, k)"),
        ("y", (1, 0), "(k, j)"),
        ("bias", (0, 0), "(0, j)"),
        ("z", (1, 0), "(i, j)"),
    ]:
        group = arrays(root)[name]
        block = rects(group, "block")[3 * row + column] if name != "bias" else rects(group, "block")[column]
        (highlight,) = rects(group, "highlight")
        assert (highlight.get("x"), highlight.get("y")) == (block.get("x"), block.get("y")), name
        group_lines = texts(group)
        assert any(f"index map (i, j, k) -> {index_map}" in line for line in group_lines), name
        verb = "writes" if name == "z" else "reads"
        assert f"step (i, j, k) = (1, 0, 1) {verb} block ({row}, {column})" in group_lines, name


def test_a_broadcast_array_is_drawn_in_its_own_shape_with_a_note():
    root = picture(kernel("bias_gelu"), {"M": 2560, "N": 2560})
    bias, scale = arrays(root)["bias"], arrays(root)["scale"]
    assert len(rects(bias, "block")) == 3 and len({r.get("y") for r in rects(bias, "block")}) == 1
    assert len(rects(scale, "block")) == 3 and len({r.get("x") for r in rects(scale, "block")}) == 1
    assert "broadcast over M: the same block for every i" in texts(bias)
    assert "broadcast over N: the same block for every j" in texts(scale)


def test_a_batched_array_draws_its_last_two_dimensions_per_batch_element():
    root = picture(kernel("batched_matmul"), {"B": 4, "M": 1024, "N": 1024, "K": 2048})
    x = arrays(root)["x"]
    assert len(rects(x, "block")) == 2 * 2
    assert len(rects(x, "slice")) == 2
    assert "per B: one of 4 slices drawn; this step takes b = 0" in texts(x)


@pytest.mark.parametrize("name", PRODUCTS)
def test_a_product_names_its_contracted_dimension_and_numbers_its_blocks_in_order(name):
    checked = kernel(name)
    k = checked.product.k
    lines = texts(picture(checked))
    if k in checked.blocks:
        assert f"k: 3 blocks of {k} = {sizes_for(checked, {}, False)[k]}, arbitrary" in " ".join(lines)
        root = picture(checked)
        for operand in checked.product.operands:
            group = arrays(root)[operand.name]
            assert f"accumulates over {k} (arbitrary axis)" in texts(group)
            numbers = [t for t in group.iter(f"{SVG}text") if t.get("class") == "badge-number"]
            assert [t.text for t in numbers] == ["0", "1", "2"]
    else:
        assert f"{k} is contracted whole inside each step: no grid axis, no accumulator" in lines
    gpu_lines = texts(picture(checked, gpu=True))
    assert (
        f"{k} is no grid axis: each program loops over it in slices of {checked.settings['gpu'].blocks[k]}" in gpu_lines
    )


@pytest.mark.parametrize("name", [n for n in KERNELS if n not in PRODUCTS and n not in STEPPED])
def test_a_kernel_that_accumulates_over_no_steps_has_only_parallel_axes(name):
    lines = texts(picture(kernel(name)))
    assert not any("arbitrary" in line or "contracted" in line for line in lines)
    assert any(line.endswith("parallel") for line in lines)


@pytest.mark.parametrize("name", KERNELS)
def test_vmem_figures_are_those_of_pallasgen_tiling(name):
    checked = kernel(name)
    sizes = sizes_for(checked, {}, False)
    exact = {d: min(checked.blocks.get(d, sizes[d]), sizes[d]) for d in checked.dims}
    root = picture(checked)
    for decl in decls(checked):
        (shown,) = [t for t in arrays(root)[decl.name].iter(f"{SVG}text") if t.get("data-bytes")]
        expected = DTYPES[decl.dtype].bytes * prod(exact[d] for d in decl.dims)
        assert int(shown.get("data-bytes")) == expected
        assert shown.text == f"{format_bytes(expected)} a block, {format_bytes(2 * expected)} double-buffered"
    (line,) = [t for t in root.iter(f"{SVG}text") if "vmem" in t.get("class", "").split()]
    if checked.has_products:  # its carries and working tiles: see the test that parts add up
        arrays_bytes = sum(DTYPES[d.dtype].bytes * prod(exact[x] for x in d.dims) for d in decls(checked))
        assert int(line.get("data-bytes")) >= 2 * arrays_bytes
        return
    total = vmem_bytes(checked.kernel, exact)
    assert int(line.get("data-bytes")) == total
    assert line.text.startswith(f"VMEM {format_bytes(total)} of the 100.0 MiB a launcher may ask of a TPU v5e or v6e")


def test_matmul_bias_gelu_vmem_line_lists_each_block_the_accumulator_and_the_epilogues_tile():
    lines = texts(picture(kernel("matmul_bias_gelu"), {"M": 1280, "N": 2560, "K": 2560}))
    assert "VMEM 12.0 MiB of the 100.0 MiB a launcher may ask of a TPU v5e or v6e:" in lines
    assert (
        "2 buffers x (x 1.0 MiB + y 2.0 MiB + bias 4.0 KiB + z 1.0 MiB) + f32 accumulator 2.0 MiB"
        " + working tile 2.0 MiB"
    ) in lines


UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 * 1024}


def sizes_in(text: str) -> list[tuple[float, int]]:
    """Each `1.5 KiB` in a text, or `3 x 1.5 KiB` (`3 lets x 1.5 KiB`): (bytes, the most
    its one-decimal rounding may hide)."""
    found = re.findall(r"(?:(\d+) (?:lets )?x )?(\d+(?:\.\d+)?) (B|KiB|MiB)\b", text)
    return [
        (int(count or 1) * float(number) * UNITS[unit], int(count or 1) * (0 if unit == "B" else UNITS[unit] // 20))
        for count, number, unit in found
    ]


def parts_add_up(total: int, total_slack: int, formula: str) -> bool:
    """Whether the parts of `2 buffers x (a 1 KiB + b 2 KiB) + c 3 KiB` sum to `total`,
    each shown size within its rounding."""
    doubled, rest = re.fullmatch(r"2 buffers x \((.*?)\)(.*)", formula).groups()
    parts = [(2 * size, 2 * slack) for size, slack in sizes_in(doubled)] + sizes_in(rest)
    return abs(sum(size for size, _ in parts) - total) <= total_slack + sum(slack for _, slack in parts)


@pytest.mark.parametrize("name", KERNELS)
def test_the_vmem_parts_show_lists_add_up_to_its_total(name):
    """Every buffer the VMEM total counts is listed: the double-buffered blocks, a
    product's accumulator, each reduction's 32-bit working copy, each let's block."""
    root = picture(kernel(name))
    lines = [t for t in root.iter(f"{SVG}text") if "line" in t.get("class", "").split()]
    (total,) = [t for t in lines if "vmem" in t.get("class").split()]
    formula = "".join(lines[lines.index(total) + 1].itertext())
    assert parts_add_up(int(total.get("data-bytes")), 0, formula), formula


def test_cross_entropy_vmem_lists_the_working_copies_of_its_reductions_and_its_let():
    lines = texts(picture(kernel("cross_entropy"), {"M": 40, "V": 5120}))
    assert "VMEM 512.2 KiB of the 100.0 MiB a launcher may ask of a TPU v5e or v6e:" in lines
    assert (
        "2 buffers x (logits 64.0 KiB + label 64 B + loss 64 B) + logsumexp's 32-bit copy of a block 128.0 KiB"
        " + sum's 32-bit copy of a block 128.0 KiB + let z 128.0 KiB" in lines
    )


def test_a_gpu_program_holds_a_reduced_dimension_whole_in_one_block_of_its_next_power_of_two():
    root = picture(kernel("softmax"), {"M": 3, "N": 200}, gpu=True)
    assert "N is no grid axis: each program holds all of it in one block of 256" in texts(root)
    x = arrays(root)["x"]
    assert "block (1, 256), index map (i) -> (i, 0)" in texts(x)
    assert len(rects(x, "block")) == 3 and len(rects(x, "ragged")) == 3  # 56 lanes past N's end


# What show states against the generated module's own code.


def generated_launcher(name: str, backend: str) -> tuple[ast.FunctionDef, str]:
    """The TPU or GPU launcher of a bundled kernel in generated/, and its source text."""
    stem, _ = SPEC_OF[name]
    source = (ROOT / "generated" / f"{stem}.py").read_text(encoding="utf-8")
    launcher = f"_{name}_{backend}"
    (function,) = [f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and f.name == launcher]
    return function, source


def inlined(expression: ast.expr, function: ast.FunctionDef) -> ast.expr:
    """`expression` with each call of a function the launcher defines (in an index map, the
    swept dimension's block, block 0 for a skipped step) replaced by what it returns."""
    defined = {f.name: f for f in function.body if isinstance(f, ast.FunctionDef)}

    class Inline(ast.NodeTransformer):
        def visit_Call(self, node):
            helper = defined.get(node.func.id) if isinstance(node.func, ast.Name) else None
            if helper is None:
                return self.generic_visit(node)
            values = dict(zip([a.arg for a in helper.args.args], node.args, strict=True))
            (returned,) = helper.body
            return Substitute(values).visit(copy.deepcopy(returned.value))

    class Substitute(ast.NodeTransformer):
        def __init__(self, values):
            self.values = values

        def visit_Name(self, node):
            return self.values.get(node.id, node)

    return Inline().visit(expression)


def pallas_call_keywords(function: ast.FunctionDef) -> dict[str, ast.expr]:
    (call,) = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pallas_call"
    ]
    return {k.arg: k.value for k in call.keywords}


def launcher_variables(checked, function: ast.FunctionDef) -> dict[str, str]:
    """The dimension each size variable (`m`, or `size_s` where a spec name takes `s`) and block
    variable (`block_m`) of a launcher holds: its first keywords are the sizes, in order."""
    sizes = [a.arg for a in function.args.kwonlyargs[: len(checked.dims)]]
    return dict(zip(sizes, checked.dims)) | {f"block_{d.lower()}": d for d in checked.dims}


def shown(root: ET.Element) -> dict:
    """What a picture states: sizes, blocks, grid axes (index, dimension, semantics) and
    each array's block and index map."""
    lines = texts(root)
    title = next(line for line in lines if " tiling at " in line)
    header = dict(re.findall(r"(\w+) = (\d+)", title.split(" tiling at ")[1]))
    blocks_line = next(line for line in lines if line.startswith("blocks ") or line.endswith("taken whole"))
    blocks = dict(re.findall(r"(\w+) = (\d+)", blocks_line.split(";")[0]))
    grid = [m.groups() for line in lines if (m := re.fullmatch(r"(\w+): \d+ blocks of (\w+) = \d+, (\w+).*", line))]
    specs = {}
    for name, group in arrays(root).items():
        (line,) = [t for t in texts(group) if ", index map (" in t]
        shape, indices, index = re.fullmatch(r"block \((.*)\), index map \((.*)\) -> \((.*)\)", line).groups()
        specs[name] = (shape.split(", "), f"({indices}) -> ({index})")
    return {"sizes": header, "blocks": blocks, "grid": grid, "specs": specs}


def generated_block(variables: dict[str, str], element: ast.expr, facts: dict, gpu: bool) -> str:
    """A BlockSpec's block entry as show words it: a number, or the dimension a GPU
    program loops over."""
    if isinstance(element, ast.Constant):
        return "1"  # None (one element, squeezed out) or 1
    dim = variables[element.id]
    if element.id.startswith("block_"):
        return facts["blocks"][dim]
    return dim if gpu else facts["sizes"][dim]


@pytest.mark.parametrize("gpu", [False, True], ids=["tpu", "gpu"])
@pytest.mark.parametrize("name", KERNELS)
def test_show_states_the_grid_index_maps_and_semantics_of_the_generated_module(name, gpu):
    """The picture is drawn from the plan the code is rendered from: its grid axes, in
    order, walk the dimensions the generated `grid=` does, with the generated
    `dimension_semantics`, and each array's block and index map are its BlockSpec's."""
    checked = kernel(name)
    facts = shown(picture(checked, gpu=gpu))
    function, _ = generated_launcher(name, "gpu" if gpu else "tpu")
    keywords = pallas_call_keywords(function)
    variables = launcher_variables(checked, function)
    grid = keywords["grid"].elts
    grid_dims = [variables[(g.args[0] if isinstance(g, ast.Call) else g).id] for g in grid]
    assert [dim for _, dim, _ in facts["grid"]] == grid_dims
    if gpu:
        semantics = ["parallel"] * len(grid)
    else:  # rt.tpu_params(dimension semantics, VMEM limit)
        semantics = ast.literal_eval(keywords["compiler_params"].args[0])
    assert [role for _, _, role in facts["grid"]] == list(semantics)
    specs = written_specs(keywords["in_specs"]) + written_specs(keywords["out_specs"])
    drawn = len(decls(checked))  # then the residuals', written under jax.grad only: `spec if residuals else None`
    assert all(isinstance(spec, ast.IfExp) for spec in specs[drawn:])
    for decl, spec in zip(decls(checked), specs[:drawn], strict=True):
        shape, index_map = spec.args
        body = inlined(index_map.body, function)
        mapping = f"({', '.join(a.arg for a in index_map.args.args)}) -> {ast.unparse(body)}"
        if len(body.elts) == 1:
            mapping = mapping.removesuffix(",)") + ")"
        assert facts["specs"][decl.name][1] == mapping, decl.name
        assert [index for index, _, _ in facts["grid"]] == [a.arg for a in index_map.args.args]
        expected_shape = [generated_block(variables, e, facts, gpu) for e in shape.elts]
        assert facts["specs"][decl.name][0] == expected_shape, decl.name


def written_specs(node: ast.expr) -> list[ast.expr]:
    """The BlockSpecs of in_specs or out_specs as written: one, a list or tuple of them, a
    run of one alike `*[spec] * n` in it, or all alike `[spec] * n`, `(spec,) * n`."""
    if isinstance(node, ast.BinOp):
        return written_specs(node.left) * node.right.value
    if isinstance(node, ast.Starred):
        return written_specs(node.value)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [spec for element in node.elts for spec in written_specs(element)]
    return [node]


def generated_vmem_comment(name: str) -> str:
    """The comment above the TPU launcher's pallas_call that gives its VMEM."""
    function, source = generated_launcher(name, "tpu")
    lines = source.splitlines()[function.lineno - 1 : function.end_lineno]
    start = next(n for n, line in enumerate(lines) if line.strip().startswith("# VMEM at the default blocks"))
    comment = []
    for line in lines[start:]:
        if not line.strip().startswith("#"):
            break
        comment.append(line.strip().removeprefix("# "))
    return " ".join(comment)


@pytest.mark.parametrize("name", KERNELS)
def test_the_generated_vmem_comment_lists_parts_that_add_up_to_its_total(name):
    comment = generated_vmem_comment(name)
    # Its first sentence (then what limit the launcher asks for).
    total, formula = re.match(r"VMEM at the default blocks[^:]*: (.*?) = (.*?)\.(?: |$)", comment).groups()
    ((total_bytes, total_slack),) = sizes_in(total)
    assert parts_add_up(total_bytes, total_slack, formula), comment


def test_cross_entropy_steps_along_v_in_order_and_writes_loss_at_the_last_step():
    lines = texts(picture(kernel("cross_entropy"), {"M": 40, "V": 5120}))
    assert "j: 3 blocks of V = 5120, arbitrary: each output tile accumulates over it in order" in lines
    assert "scratch sum_v_ref: the running sum over V" in lines
    loss = texts(arrays(picture(kernel("cross_entropy"), {"M": 40, "V": 5120}))["loss"])
    assert "reduced over V: the same block for every j" in loss
    assert "accumulated in VMEM scratch over j, written at j = 2" in loss
    gpu = texts(picture(kernel("cross_entropy"), {"M": 20, "V": 5120}, gpu=True))
    assert "grid (i) = (20): 20 programs, run concurrently" in gpu
    assert "V is no grid axis: each program loops over it in slices of 1024" in gpu


def test_column_sums_walks_n_in_parallel_and_m_in_order_with_the_generated_index_map():
    root = picture(kernel("column_sums"), {"M": 1280, "N": 1280})
    lines = texts(root)
    assert "i: 3 blocks of N = 1280, parallel" in lines
    assert "j: 3 blocks of M = 1280, arbitrary: each output tile accumulates over it in order" in lines
    assert "block (512, 512), index map (i, j) -> (j, i)" in texts(arrays(root)["x"])


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 5000), n=st.integers(1, 9000), k=st.integers(1, 9000))
def test_any_size_draws_its_blocks_and_edges(m, n, k):
    checked = kernel("matmul_bias_gelu")
    sizes = {"M": m, "N": n, "K": k}
    groups = arrays(picture(checked, sizes))
    for decl in decls(checked):
        assert len(rects(groups[decl.name], "block")) == expected_blocks(checked, decl, sizes)
        assert len(rects(groups[decl.name], "ragged")) == expected_ragged(checked, decl, sizes)


def test_too_many_blocks_to_draw_is_refused_in_plain_words():
    with pytest.raises(ShowError, match="makes 40 blocks of 512; show draws at most 24"):
        sizes = sizes_for(kernel("matmul_bias_gelu"), {"M": 512 * 40}, False)
        kernel_tiles(kernel("matmul_bias_gelu"), sizes, False)


def test_show_reaches_the_backends_only_through_their_interface():
    """Pictures come from the plans `pallasgen.backends` makes, never from one backend's
    own modules: no rule of a backend is restated here."""
    for path in sorted((ROOT / "pallasgen" / "show").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        backends = {name for name in imported if name.startswith("pallasgen.backends")}
        assert backends <= {"pallasgen.backends", "pallasgen.backends.base"}, (path.name, backends)


# The command line.


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_show_writes_kernel_svg_in_the_working_directory_and_prints_its_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("show", str(ROOT / "specs" / "add_vectors.pallas"), "--size", "N=3000000")
    assert result.exit_code == 0, result.output
    assert result.stdout == "add_vectors.svg\n"
    root = ET.parse(tmp_path / "add_vectors.svg").getroot()
    assert [len(rects(g, "block")) for g in arrays(root).values()] == [3, 3, 3]


def test_show_gpu_writes_to_out(tmp_path):
    out = tmp_path / "pictures" / "mm.svg"
    out.parent.mkdir()
    result = invoke("show", str(ROOT / "specs" / "matmul.pallas") + ":matmul", "--gpu", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "matmul: GPU (Triton) tiling at M = 160, N = 160, K = 80" in texts(ET.parse(out).getroot())


def test_the_committed_example_is_what_show_draws_now(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "example.svg"
    result = invoke(*EXAMPLE_COMMAND, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == EXAMPLE.read_bytes(), "run the README's `pallasgen show` command to update it"
    assert f"pallasgen {' '.join(EXAMPLE_COMMAND)} --out docs/{EXAMPLE.name}" in (ROOT / "README.md").read_text()


SPEC = str(ROOT / "specs" / "matmul.pallas")


@pytest.mark.parametrize(
    "args, message",
    [
        ([SPEC + ":nope"], "has no kernel named 'nope'; its kernels: matmul, matmul_relu,"),
        ([SPEC], "has 7 kernels; name one as"),
        ([SPEC + ":matmul", "--size", "M=x"], "--size M=x: expected DIM=N, a dimension name and a positive integer"),
        ([SPEC + ":matmul", "--size", "M=0"], "--size M=0: expected DIM=N, a dimension name and a positive integer"),
        ([SPEC + ":matmul", "--size", "Q=8"], "--size Q: matmul has no dimension Q; its dimensions are M, N, K"),
        ([SPEC + ":matmul", "--size", "KK=8"], "no dimension KK (did you mean 'K'?)"),
        ([SPEC + ":matmul", "--size", "K=100000"], "--size K=100000 makes 98 blocks of 1024"),
        (["missing.pallas"], "missing.pallas: No such file or directory"),
        ([SPEC + ":matmul", "--out", "no/such/folder/x.svg"], "cannot write no/such/folder/x.svg"),
    ],
)
def test_usage_errors_exit_2_in_plain_words(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("show", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("pallasgen: error: ") and message in result.stderr
    assert "Traceback" not in result.output


def test_a_spec_error_exits_2_with_its_position(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("broken.pallas").write_text("kernel broken {\n    in  x: f32[N]\n    out z: f32[N]\n    z = x + yy\n}\n")
    result = invoke("show", "broken.pallas")
    assert result.exit_code == 2
    assert result.stderr.startswith("broken.pallas:4:13: error: unknown name 'yy'")
    assert not Path("broken.svg").exists()


def test_a_causal_step_past_the_diagonal_is_marked_skipped_and_draws_no_reads():
    """attention's k and v index maps send a skipped step to block 0, which it never
    fetches anew: the picture neither highlights a block of them nor says it reads one."""
    root = picture(kernel("attention"), {"B": 1, "H": 1, "S": 384, "T": 384, "D": 64})
    lines = texts(root)
    step = "step (b, h, i, j) = (0, 0, 0, 1)"
    assert any(line.startswith(f"{step} is skipped") for line in lines), lines
    for name in ("k", "v"):
        group = arrays(root)[name]
        assert rects(group, "highlight") == [], name
        group_lines = texts(group)
        assert f"{step} is skipped: it reads no block of {name}" in group_lines, name
        assert not any(line.startswith(f"{step} reads") for line in group_lines), name
        # Along T in row i = 0, steps j = 1 and 2 are past the diagonal: marked skipped.
        badges = [c for c in group.iter(f"{SVG}circle") if "badge" in c.get("class", "").split()]
        assert [("skipped" in c.get("class").split()) for c in badges] == [False, True, True], name
    assert rects(arrays(root)["q"], "highlight")  # q's block stays resident, as drawn


def test_a_live_causal_step_still_draws_its_reads():
    root = picture(kernel("attention"), {"B": 1, "H": 1, "S": 384, "T": 128, "D": 64})  # step j = 0
    lines = texts(root)
    assert not any("is skipped" in line for line in lines)
    assert rects(arrays(root)["k"], "highlight")
