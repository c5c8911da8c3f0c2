"""Generated modules read as a person would write them: names chosen for their role, not
marked to dodge collisions, and each function written once.

The generator's own names yield to the spec's: where a size, a Ref or a running value
would take a name the spec uses, it takes another that says its role (`size_s` beside the
spec's `s`) or a number (`acc_s_2`), never a trailing `_`; the spec's names keep their
spelling (a trailing `_` only where one truly collides: `pl`, a keyword). Private
functions are named `_KERNEL_ROLE` with one leading underscore. Functions of two kernels
that are the same code are written once (rendering/shared.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pallasgen.analysis.names import Namer
from pallasgen.rendering.shared import share_identical_functions
from pallasgen.workspace.pipeline import generate

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "generated").glob("*.py"))


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code defines, reads, passes as a keyword or takes as a parameter."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


def _marked(name: str) -> bool:
    """A name that looks made to avoid a collision: `__x` (not a dunder) or `x_`."""
    dunder = name.startswith("__") and name.endswith("__")
    return name != "_" and not dunder and (name.startswith("__") or name.endswith("_"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_no_generated_name_is_marked_to_dodge_a_collision(path):
    spec_names = set(re.findall(r"\w+", (ROOT / "specs" / f"{path.stem}.pallas").read_text(encoding="utf-8")))
    marked = sorted(n for n in _bound_names(ast.parse(path.read_text(encoding="utf-8"))) if _marked(n))
    assert [n for n in marked if n not in spec_names] == []


def _function_code(node: ast.FunctionDef) -> str:
    return (
        ast.dump(node.args)
        + ast.dump(ast.Module(node.body, type_ignores=[]))
        + str([ast.dump(d) for d in node.decorator_list])
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_no_two_top_level_functions_are_the_same_code(path):
    seen: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            first = seen.setdefault(_function_code(node), node.name)
            assert first == node.name, f"{node.name} is {first} again"


def test_kernels_of_the_same_code_share_one_function():
    """ops.pallas: add_f32 and add_i32 differ only in dtypes, which their kernels' code
    does not name: add_i32's launcher calls add_f32's kernel, noted above it."""
    tree = ast.parse((ROOT / "generated" / "ops.py").read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "_add_i32_kernel" not in functions and "_add_f32_kernel" in functions
    assert "_add_f32_kernel" in {n.id for n in ast.walk(functions["_add_i32_tpu"]) if isinstance(n, ast.Name)}
    assert "# Also `add_i32`'s: the same code, written once." in (ROOT / "generated" / "ops.py").read_text()


def test_a_size_yields_to_the_spec_name_it_would_take():
    """attention.pallas has a dimension S and a value `s`: the size is `size_s`."""
    source = (ROOT / "generated" / "attention.py").read_text(encoding="utf-8")
    assert "let s = where(" in (ROOT / "specs" / "attention.pallas").read_text()
    assert 'sizes={"B": "b", "H": "h", "S": "size_s", "D": "d", "T": "t"}' in source  # its launchers' keywords
    assert re.search(r"^def _attention_tpu\(q, k, v, \*, b, h, size_s, d, t,", source, re.M)


def test_mosaic_gpu_stages_are_named_after_their_kernel():
    source = (ROOT / "generated" / "attention.py").read_text(encoding="utf-8")
    assert "def _matmul_softmax_stage_1_mosaic_gpu_kernel(" in source
    assert "def _matmul_softmax_stage_2_mosaic_gpu(" in source


def test_the_namer_gives_generated_names_a_role_or_a_number_and_spec_names_a_mark():
    namer = Namer(["s", "acc_s"])
    assert namer.claim("s", "size_s") == "size_s"
    assert namer.claim("acc_s") == "acc_s_2"
    assert namer.claim("acc_s") == "acc_s_3"
    assert namer.claim("t", "size_t") == "t"
    assert namer.claim_spec("pl") == "pl_"  # a spec's name that truly collides
    assert namer.claim_spec("x") == "x"


def test_a_hostile_spec_keeps_its_public_names_and_marks_only_true_collisions():
    spec = """
kernel attn {
    in  q: f32[S, D]
    in  k: f32[T, D]
    in  pl, size_s: f32[S, T]
    out o: f32[S, T]
    let s = q @ k.T
    o = s + pl + size_s
    block S = 8
}
"""
    tree = ast.parse(generate(spec, "attn.pallas", "attn.pallas"))
    public = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attn")
    assert [a.arg for a in public.args.args] == ["q", "k", "pl_", "size_s"]
    marked = {n for n in _bound_names(tree) if _marked(n)}
    assert marked == {"pl_"}


SHARED = [
    ("a", "def _a_kernel(x_ref):\n    x_ref[...] = 1\n\n\ndef _a_tpu(x):\n    return call(_a_kernel, '_a_kernel')\n"),
    ("b", "def _b_kernel(x_ref):\n    x_ref[...] = 1\n\n\ndef _b_tpu(x):\n    return call(_b_kernel, '_b_kernel')\n"),
    ("c", "def c(x):\n    return _b_tpu(x)\n"),
]


def test_identical_functions_are_written_once_and_their_callers_call_the_first():
    a, b, c = share_identical_functions(SHARED)
    assert "# Also `b`'s: the same code, written once.\ndef _a_kernel" in a
    assert "_b_kernel(" not in b
    # Sharing the kernel made the launchers the same code, but for the string: kept apart.
    assert "return call(_a_kernel, '_b_kernel')" in b
    assert c == "def c(x):\n    return _b_tpu(x)\n"


def test_sharing_goes_on_while_callers_become_the_same():
    pieces = [
        ("a", SHARED[0][1].replace("'_a_kernel'", "'k'")),
        ("b", SHARED[1][1].replace("'_b_kernel'", "'k'")),
        SHARED[2],
    ]
    shared = share_identical_functions(pieces)
    assert len(shared) == 2  # b's piece is left empty: both its functions are a's
    assert shared[1] == "def c(x):\n    return _a_tpu(x)\n"
    assert "# Also `b`'s: the same code, written once.\ndef _a_tpu" in shared[0]


def test_public_functions_are_never_shared():
    pieces = [("a", "def a(x):\n    return x\n"), ("b", "def b(x):\n    return x\n")]
    assert share_identical_functions(pieces) == [source for _, source in pieces]


def test_functions_alike_but_for_their_own_names_are_shared_and_keywords_are_not_renamed():
    kernel = "def _{0}_kernel({1}_ref, z_ref, *, n):\n    {1} = {1}_ref[...]\n    z_ref[...] = {1} * n\n"
    pieces = [(name, kernel.format(name, array)) for name, array in (("a", "x"), ("b", "dz"))]
    other = ("c", "def _c_kernel(x_ref, z_ref, *, k):\n    x = x_ref[...]\n    z_ref[...] = x * k\n")
    a, c = share_identical_functions([*pieces, other])  # b's piece is left empty: its kernel is a's
    assert a.startswith("# Also `b`'s: the same code but for its names, written once.\ndef _a_kernel(x_ref, z_ref, *, n):")
    assert c == other[1]  # its keyword is another name, which its callers bind: kept apart


def test_the_bundled_backward_products_of_two_kernels_share_their_kernels():
    """attention.pallas: rmsnorm_matmul's dlhs = dy @ w.T is matmul_softmax's dx = dacc @ w.T."""
    source = (ROOT / "generated" / "attention.py").read_text(encoding="utf-8")
    assert "_rmsnorm_matmul_backward_lhs_kernel" not in source
    assert "functools.partial(_matmul_softmax_backward_x_kernel" in source.split("def _rmsnorm_matmul_backward_lhs_tpu")[1]
