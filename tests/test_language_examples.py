"""Every example of docs/language.md, the language reference, builds and computes correctly.

The reference holds the examples of the language contract verbatim. Each spec in a
plain fenced block is built with the CLI and run against its reference; the
contract's examples are also checked against float64 (int64 for int8) NumPy
references. Each `bad` block is a spec whose errors the `text` block after it shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from kernel_cases import F32_TOL, EXACT, add_vectors_numpy, assert_outputs_close, leaky_numpy, load_module
from pallasgen.analysis.dtypes import DTYPES
from pallasgen.analysis.functions import FUNCTIONS
from pallasgen.cli import main
from pallasgen.frontend.parser import KEYWORDS

LANGUAGE_MD = Path(__file__).resolve().parents[1] / "docs" / "language.md"
FENCED = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
BLOCKS = FENCED.findall(LANGUAGE_MD.read_text(encoding="utf-8"))
# Spec examples by the name of their first kernel.
EXAMPLES = {re.search(r"^kernel (\w+)", text, re.MULTILINE).group(1): text for info, text in BLOCKS if not info}
ERROR_EXAMPLES = [(text, BLOCKS[i + 1][1]) for i, (info, text) in enumerate(BLOCKS) if info == "bad"]
# The examples of the language contract (LANGUAGE.md).
NAMES = ["add_vectors", "leaky", "matmul_int8", "matmul_relu", "scores", "attention", "gqa", "matmul_softmax"]


def project(folder: Path, name: str, text: str) -> Path:
    """A project in `folder` whose specs/NAME.pallas is `text`."""
    (folder / "specs").mkdir(parents=True)
    (folder / "pyproject.toml").write_text("[tool.pallasgen]\n", encoding="utf-8")
    (folder / "specs" / f"{name}.pallas").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Builds one example with the CLI (once per module); returns (CLI result, out dir)."""
    built = {}

    def build_example(name):
        if name not in built:
            spec = tmp_path_factory.mktemp(f"spec_{name}") / f"{name}.pallas"
            spec.write_text(EXAMPLES[name], encoding="utf-8")
            out = tmp_path_factory.mktemp(f"example_{name}")
            result = CliRunner().invoke(main, ["build", str(spec), "--out", str(out)])
            built[name] = (result, out)
        return built[name]

    return build_example


@pytest.fixture(scope="module")
def example(build):
    """The module built from an example, imported from its output folder."""
    modules = {}

    def load(name):
        if name not in modules:
            result, out = build(name)
            assert result.exit_code == 0, result.output
            modules[name] = load_module(out / f"{name}.py", f"_language_example_{name}")
        return modules[name]

    return load


def test_the_reference_holds_every_example_of_the_contract():
    assert set(NAMES) <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_builds_and_agrees_with_its_reference(name, tmp_path, monkeypatch):
    """`pallasgen build` then `pallasgen run` in a project holding just the example."""
    monkeypatch.chdir(project(tmp_path, name, EXAMPLES[name]))
    monkeypatch.setenv("PALLASGEN_CACHE_DIR", str(tmp_path / "cache"))
    built = CliRunner().invoke(main, ["build"])
    assert built.exit_code == 0, built.output
    ran = CliRunner().invoke(main, ["run"])
    assert ran.exit_code == 0, ran.output
    assert ": OK" in ran.stdout and "generated in memory" not in ran.stderr


@pytest.mark.parametrize("spec, shown", ERROR_EXAMPLES, ids=[f"error-{i}" for i in range(len(ERROR_EXAMPLES))])
def test_error_example_prints_what_the_reference_shows(spec, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path, "example", spec))
    result = CliRunner().invoke(main, ["build", "specs/example.pallas"])
    assert result.exit_code == 2
    assert result.stderr == shown
    assert not (tmp_path / "generated").exists()


@pytest.mark.parametrize("name", NAMES)
def test_example_builds_with_the_cli(name, build):
    """`pallasgen build FILE --out DIR` exits 0, reports the file and writes only NAME.py."""
    result, out = build(name)
    assert result.exit_code == 0, result.output
    assert f"{name}.py" in result.output
    assert sorted(p.name for p in out.iterdir()) == [f"{name}.py"]


def test_comment_above_a_kernel_becomes_its_docstring(example):
    """The comment line right above `kernel add_vectors` is the function's docstring."""
    assert "Adds two vectors." in example("add_vectors").add_vectors.__doc__


@pytest.mark.parametrize(
    ("n", "blocks"), [(1061, {}), (300, {"block_n": 128}), (5, {})], ids=["ragged", "small-blocks", "tiny"]
)
def test_add_vectors_example_adds(example, n, blocks):
    """add_vectors(x, y) is x + y for ragged, multi-block and tiny sizes."""
    module = example("add_vectors")
    rng = np.random.default_rng(10)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    got = np.asarray(module.add_vectors(jnp.asarray(x), jnp.asarray(y), **blocks))
    assert got.dtype == np.float32
    assert_outputs_close((got,), add_vectors_numpy(x, y), (F32_TOL,), "add_vectors example")
    assert_outputs_close((got,), (np.asarray(module.add_vectors.reference(x, y)),), (F32_TOL,), "vs .reference")


@pytest.mark.parametrize(
    ("shape", "keywords"),
    [((300, 700), {}), ((37, 300), {"block_m": 8, "block_n": 128, "slope": 0.3})],
    ids=["ragged-default-blocks", "small-blocks-and-slope"],
)
def test_leaky_example_is_leaky_relu_with_mask(example, shape, keywords):
    """leaky(x) gives (x if x > 0 else slope * x, 1 where x > 0 else 0)."""
    module = example("leaky")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[::13] = 0.0
    x.flat[1] = np.nan
    x.flat[2] = -np.inf
    y, mask = (np.asarray(out) for out in module.leaky(jnp.asarray(x), **keywords))
    assert (y.dtype, mask.dtype) == (np.float32, np.int32)
    slope = {"slope": keywords["slope"]} if "slope" in keywords else {}
    assert_outputs_close((y, mask), leaky_numpy(x, **slope), (F32_TOL, EXACT), "leaky example")


def test_matmul_relu_example_fuses_bias_and_relu_on_the_f32_accumulator(example):
    module = example("matmul_relu")
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.standard_normal((40, 300)), jnp.bfloat16)
    y = jnp.asarray(rng.standard_normal((300, 200)), jnp.bfloat16)
    bias = rng.standard_normal(200).astype(np.float32)
    got = module.matmul_relu(x, y, bias, block_m=16, block_n=128, block_k=128)
    assert got.dtype == jnp.bfloat16
    want = np.maximum(np.asarray(x, np.float64) @ np.asarray(y, np.float64) + bias, 0.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2, atol=1e-2)


def test_matmul_int8_example_is_exact(example):
    module = example("matmul_int8")
    rng = np.random.default_rng(13)
    x = rng.integers(-128, 128, (40, 300), dtype=np.int8)
    y = rng.integers(-128, 128, (300, 200), dtype=np.int8)
    got = np.asarray(module.matmul_int8(x, y, block_m=32, block_n=128, block_k=128))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, x.astype(np.int64) @ y.astype(np.int64))


def test_scores_example_scales_q_against_transposed_k(example):
    module = example("scores")
    rng = np.random.default_rng(14)
    q = jnp.asarray(rng.standard_normal((2, 40, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((2, 200, 64)), jnp.bfloat16)
    got = module.scores(q, k, block_s=16, block_t=128)
    want = 0.125 * np.einsum("bsd,btd->bst", np.asarray(q, np.float64), np.asarray(k, np.float64))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)


# --------------------------------------------------------------------------- the reference's lists are the code's

REFERENCE = LANGUAGE_MD.read_text(encoding="utf-8")


def test_the_words_the_reference_reserves_are_the_parsers():
    words = re.search(r"These words cannot name\s+anything: `([^`]*)`", REFERENCE).group(1).split()
    assert sorted(words) == sorted(KEYWORDS)


def test_the_reference_names_every_function_a_spec_may_call():
    calls = {name for name, function in FUNCTIONS.items() if function.typing != "cast"}
    missing = sorted(name for name in calls if not re.search(rf"`[^`\n]*\b{name}\b[^`\n]*`", REFERENCE))
    assert not missing


def test_the_reference_lists_every_dtype():
    table = REFERENCE.split("## Dtypes", 1)[1].strip().split("\n\n", 1)[0]
    listed = re.findall(r"^\| ((?:`\w+` ?)+) \|", table, re.MULTILINE)
    listed = [dtype for cell in listed for dtype in re.findall(r"`(\w+)`", cell)]
    assert sorted(listed) == sorted(DTYPES)


def test_the_dispatch_the_reference_names_is_the_one_generated_modules_define():
    """Not `jax.lax.platform_dependent`, which would lower every platform's kernel: the
    runtime's own, which generated modules reach through `rt.kernel` (its `on_platform`)."""
    section = REFERENCE.split("## What a generated module holds", 1)[1].split("\n## ", 1)[0]
    named = re.search(r"one lowering rule per platform\s+\(`(\w+)` in `pallasgen/runtime/support.py`\)", section).group(
        1
    )
    runtime = (LANGUAGE_MD.parents[1] / "pallasgen" / "runtime" / "support.py").read_text(encoding="utf-8")
    assert re.search(rf"^def on_platform\((.|\n)*?^    return {named}\(", runtime, re.M)
    generated = (LANGUAGE_MD.parents[1] / "generated" / "add_vectors.py").read_text(encoding="utf-8")
    assert "@rt.kernel(" in generated and "results = on_platform(" in runtime
