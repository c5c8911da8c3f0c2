"""The package's folders are its stages, in the order data flows through them: a
module imports only from its own stage or lower ones, and the build path (every
stage from the frontend up to the workspace) never imports jax. The runtime, which
generated modules import, is the lowest stage: it needs nothing else of pallasgen, and
the build path reads only its jax-free constants."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

PACKAGE = Path(__file__).resolve().parents[1] / "pallasgen"
BENCHMARKS = PACKAGE.parent / "benchmarks"

# Lowest first: the runtime generated modules run on (its constants shared with the
# generator) -> spec text -> IR -> checks and the iteration space -> backward kernels derived
# as IR kernels -> shared lowering ->
# each backend's plan -> rendering -> the workspace (build, check) -> show -> the playground (the build
# path in a browser) -> what runs kernels.
STAGES = (
    "runtime",
    "frontend",
    "analysis",
    "gradients",
    "lowering",
    "backends",
    "rendering",
    "workspace",
    "show",
    "playground",
    "devices",
    "cli",
)
BUILD_STAGES = STAGES[STAGES.index("frontend") : STAGES.index("workspace") + 1]
# What the build path may import of the runtime: the facts it shares with the generator.
JAX_FREE_RUNTIME = ("pallasgen.runtime", "pallasgen.runtime.constants")


def stage_of(module: str) -> str:
    """`pallasgen.analysis.checks` -> analysis; `pallasgen.cli` -> cli, and so is
    `pallasgen.__main__` (`python -m pallasgen`, the command)."""
    stage = module.split(".")[1]
    return "cli" if stage == "__main__" else stage


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return [(name, path) for name, path in found if name != "pallasgen"]


def imports(path: Path) -> list[str]:
    """Every module a file imports, at any depth (imports inside functions count)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; write pallasgen.<stage>..."
            names.append(node.module)
    return names


def test_every_module_lives_in_a_stage():
    assert {stage_of(name) for name, _ in modules()} <= set(STAGES)


@pytest.mark.parametrize("module, path", modules(), ids=[name for name, _ in modules()])
def test_a_module_imports_only_its_own_or_lower_stages(module, path):
    own = STAGES.index(stage_of(module))
    higher = [name for name in imports(path) if name.startswith("pallasgen.") and STAGES.index(stage_of(name)) > own]
    assert not higher, f"{module} ({stage_of(module)}) imports from a later stage: {higher}"


@pytest.mark.parametrize(
    "module, path",
    [(name, path) for name, path in modules() if stage_of(name) in BUILD_STAGES],
    ids=[name for name, _ in modules() if stage_of(name) in BUILD_STAGES],
)
def test_the_build_path_never_imports_jax(module, path):
    assert not [name for name in imports(path) if name.split(".")[0] in ("jax", "jaxlib")]


@pytest.mark.parametrize(
    "module, path",
    [(name, path) for name, path in modules() if stage_of(name) in BUILD_STAGES],
    ids=[name for name, _ in modules() if stage_of(name) in BUILD_STAGES],
)
def test_the_build_path_imports_only_the_jax_free_part_of_the_runtime(module, path):
    runtime = [name for name in imports(path) if name == "pallasgen.runtime" or name.startswith("pallasgen.runtime.")]
    assert set(runtime) <= set(JAX_FREE_RUNTIME)


@pytest.mark.parametrize("module", JAX_FREE_RUNTIME)
def test_the_runtimes_constants_import_no_jax_nor_the_rest_of_pallasgen(module):
    (path,) = [path for name, path in modules() if name == module]
    assert not [name for name in imports(path) if name.split(".")[0] in ("jax", "jaxlib")]
    assert {name for name in imports(path) if name.startswith("pallasgen")} <= set(JAX_FREE_RUNTIME)


def test_the_checker_flags_an_upward_import(tmp_path):
    """The rule catches what it is meant to: analysis importing a backend."""
    bad = tmp_path / "bad.py"
    bad.write_text("from pallasgen.backends.tpu.tiling import tiling_rule\n")
    (name,) = imports(bad)
    assert STAGES.index(stage_of(name)) > STAGES.index("analysis")


# What code outside pallasgen/backends/ may import of the backends: their dispatch and
# interface; a backend's own modules (pallasgen.backends.tpu.tiling) are its own business.
BACKEND_INTERFACE = ("pallasgen.backends", "pallasgen.backends.base")


def imported_modules(path: Path) -> list[str]:
    """`imports`, and each name that a `from M import name` takes that is itself a module
    (`from pallasgen.backends import tpu`)."""
    names = imports(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names += [
                f"{node.module}.{alias.name}" for alias in node.names if _is_module(f"{node.module}.{alias.name}")
            ]
    return names


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def backend_internals(names: list[str]) -> list[str]:
    """The modules among `names` that are a backend's own, not its interface."""
    return [name for name in names if name.startswith("pallasgen.backends.") and name not in BACKEND_INTERFACE]


def outside_backends() -> list[tuple[str, Path]]:
    """Every module of pallasgen/ outside pallasgen/backends/, and every benchmark script."""
    inside = [(name, path) for name, path in modules() if stage_of(name) != "backends"]
    return inside + [(f"benchmarks.{path.stem}", path) for path in sorted(BENCHMARKS.glob("*.py"))]


@pytest.mark.parametrize("module, path", outside_backends(), ids=[name for name, _ in outside_backends()])
def test_code_outside_the_backends_reaches_them_only_through_their_interface(module, path):
    """A backend is one folder behind one interface (`backends.base.Backend`): callers
    go through `pallasgen.backends` (`BACKENDS`, `backend_named`), never a backend's modules."""
    internals = backend_internals(imported_modules(path))
    assert not internals, f"{module} imports a backend's own modules: {internals}; use pallasgen.backends"


def test_the_checker_flags_an_import_of_a_backends_internals(tmp_path):
    """The rule catches what it is meant to: a caller importing a backend's module, by
    either form of import, while the interface passes."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from pallasgen.backends.mosaic_gpu import choices\n"
        "import pallasgen.backends.tpu.tiling\n"
        "from pallasgen.backends import gpu\n"
        "from pallasgen.backends import backend_named, base\n"
        "from pallasgen.backends.base import Backend\n"
    )
    assert sorted(backend_internals(imported_modules(bad))) == [
        "pallasgen.backends.gpu",
        "pallasgen.backends.mosaic_gpu",
        "pallasgen.backends.mosaic_gpu.choices",
        "pallasgen.backends.tpu.tiling",
    ]


def test_every_package_folder_is_in_the_distribution():
    """pyproject.toml lists the packages a wheel holds (the templates too, a data
    package): a folder of code left out works from a checkout only
    (pallasgen.backends.mosaic_gpu once was)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(("pallasgen", *init.parent.relative_to(PACKAGE).parts)).rstrip(".")
        for init in PACKAGE.rglob("__init__.py")
    }
    assert not folders - listed


# --------------------------------------------------------------------------- the suite's jax-free files

TESTS = PACKAGE.parent / "tests"
JAX_FREE_MARK = "pytestmark = pytest.mark.jax_free"
# What imports jax: jax itself, NumPy's bfloat16 (ml_dtypes), the helpers that run
# generated kernels, and the stages that run kernels or import generated modules.
RUNS_JAX = ("jax", "jaxlib", "ml_dtypes", "kernel_cases", "pallasgen.devices", "pallasgen.runtime.support")


def jax_free_test_files() -> list[Path]:
    return [path for path in sorted(TESTS.glob("test_*.py")) if JAX_FREE_MARK in path.read_text(encoding="utf-8")]


def test_the_build_path_tests_are_marked_jax_free():
    """`-m jax_free` runs the build path's tests alone, without jax (tests/conftest.py)."""
    assert {path.stem for path in jax_free_test_files()} >= {"test_cli", "test_diagnostics", "test_golden", "test_render"}


@pytest.mark.parametrize("path", jax_free_test_files(), ids=lambda path: path.stem)
def test_a_jax_free_test_file_imports_nothing_that_runs_jax(path):
    """Imports inside functions count, and so does a test file it imports from (which
    must be marked too)."""
    marked = {p.stem for p in jax_free_test_files()}
    for name in imports(path):
        assert not any(name == bad or name.startswith(bad + ".") for bad in RUNS_JAX), f"{path.name} imports {name}"
        assert not name.startswith("test_") or name in marked, f"{path.name} imports the unmarked {name}"
