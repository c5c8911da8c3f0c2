"""Names and comments that collide with generated code still give correct kernels.

Spec names may be `pl`, `jnp`, `jax`, Python keywords, builtins the wrappers call,
or the names of generated refs, helpers and keywords: the generated code renames
its own uses consistently, and comment text cannot escape the docstring.
"""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

from kernel_cases import load_module, take_gpu_branch
from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import generate

DOC = 'Quotes " and """ and \\ backslashes \\""" and a tab\there.'
SPEC = f"""# {DOC}
kernel collide {{
    in pl, jnp, lambda, x_ref, acc, _operands, functools, np: f32[M, N]
    in min, step, interpret_, block_m_, _collide_gpu, True: f32[M, N]
    out interpret: f32[M, N]
    out sizes: f32[M, N]
    param acc_ref: f32 = 1.5
    let jax = pl + jnp + lambda + x_ref + acc + _operands + functools + np
    interpret = jax + min + step + interpret_ + block_m_ + _collide_gpu + True + acc_ref
    sizes = interpret * 2
    block M = 8, N = 128
}}

kernel matmul_collide {{
    in pl: f32[M, K]
    in jnp: f32[K, N]
    in acc, max: f32[N]
    out step: f32[M, N]
    param k: f32 = 2.0
    step = (pl @ jnp + acc + max) * k
    block M = 8, N = 128, K = 128
}}
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "hostile.py"
    path.write_text(generate(SPEC, "hostile.pallas", "hostile.pallas"))
    return load_module(path, "_hostile_names")


def test_colliding_names_compute_the_right_values(module):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((20, 200)).astype(np.float32) for _ in range(14)]
    interpret, sizes = module.collide(*arrays)
    want = sum(a.astype(np.float64) for a in arrays) + 1.5
    np.testing.assert_allclose(np.asarray(interpret), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sizes), 2 * want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_colliding_names_in_a_matmul(module, monkeypatch, backend):
    """Both paths: the Triton launcher calls the builtin `max`, which a tensor may name."""
    if backend == "gpu":
        take_gpu_branch(monkeypatch, module)
    module.matmul_collide.clear_cache()
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((20, 300)).astype(np.float32), rng.standard_normal((300, 200)).astype(np.float32)
    bias, top = (rng.standard_normal(200).astype(np.float32) for _ in range(2))
    got = module.matmul_collide(x, y, bias, top, k=3.0, interpret=True)
    want = (x.astype(np.float64) @ y + bias + top) * 3.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


def test_a_param_keeps_its_name_as_a_keyword(module):
    assert module.collide.__wrapped__.__kwdefaults__["acc_ref"] == 1.5


def test_comment_text_is_the_docstring_and_nothing_else(module):
    doc = DOC.expandtabs()  # tabs become spaces: see the next test
    assert module.collide.__doc__.splitlines()[0] == doc
    tree = ast.parse(generate(SPEC, "hostile.pallas", "hostile.pallas"))
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and doc in n.value]
    assert len(strings) == 1


def test_tabs_in_comments_are_expanded_as_python_expands_docstrings(tmp_path):
    """Python 3.13 expands tabs in docstrings when it compiles them (3.11 and 3.12 keep
    them, and `help()` expands them), so the generator writes no tabs, at the same tab
    stops: the docstring reads the same on every Python."""
    spec = "# a\tb\n# cc\tdd\nkernel tabs {\n in x: f32[N]\n out z: f32[N]\n z = x\n}\n"
    path = tmp_path / "tabs.py"
    path.write_text(generate(spec, "tabs.pallas", "tabs.pallas"))
    module = load_module(path, "_tabs_in_comments")
    assert "\t" not in module.tabs.__doc__
    assert inspect.getdoc(module.tabs).splitlines()[:2] == ["a       b", "cc  dd"]


@pytest.mark.parametrize(
    "name", ["interpret", "block_m", "gpu_block_n", "gpu_warps", "num_warps", "min", "pl", "class"]
)
def test_a_param_that_would_shadow_a_generated_keyword_or_name_is_an_error(name):
    spec = SPEC.split("\n\n")[1].replace("param k: f32", f"param {name}: f32").replace("* k", f"* {name}")
    with pytest.raises(SpecError) as error:
        generate(spec, "p.pallas", "p.pallas")
    assert any(f"'{name}' cannot name a param" in d.message or "reserved" in d.message for d in error.value.diagnostics)


def test_a_spec_path_cannot_inject_code_through_the_header(tmp_path):
    """Folder names reach the header comment and the module docstring, escaped."""
    folder = tmp_path / "specs" / 'a"""b\nimport os #'
    folder.mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[tool.pallasgen]\n")
    (folder / "add.pallas").write_text(SPEC.split("\n\n")[1])
    from click.testing import CliRunner

    from pallasgen.cli import main

    result = CliRunner().invoke(main, ["build", str(folder), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out" / "add.py").read_text()
    tree = ast.parse(text)
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import) and node.names[0].name == "os"]
    assert text.splitlines()[0].startswith(
        '# Code generated by pallasgen from specs/a\\"\\"\\"b\\nimport os #/add.pallas.'
    )


def test_an_input_named_plgpu_does_not_hide_the_mosaic_gpu_module():
    """Mosaic GPU's launchers use the `plgpu` module: an input named `plgpu` is renamed
    wherever those launchers would see it (it once replaced the module there)."""
    spec = "kernel double {\n in plgpu: f32[N]\n out z: f32[N]\n z = plgpu * 2.0\n}\n"
    tree = ast.parse(generate(spec, "p.pallas", "p.pallas"))
    for function in (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)):
        parameters = {a.arg for a in function.args.args + function.args.kwonlyargs}
        uses_module = any(
            isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "plgpu"
            for n in ast.walk(function)
        )
        assert not (uses_module and "plgpu" in parameters), function.name
