"""Rendering formats each top-level piece on its own: the result must be exactly what
black gives the whole module, so that speed never changes a byte of output."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasgen.gradients.derive import every_kernel, launched
from pallasgen.workspace.pipeline import check_source
from pallasgen.backends import plan_module
from pallasgen.rendering.render import docstring, format_code, render_module, render_pieces

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def plans():
    for spec in sorted((ROOT / "specs").glob("*.pallas")):
        yield spec.name, plan_module(f"specs/{spec.name}", check_source(spec.read_text(), spec.name))


@pytest.mark.parametrize("name", [spec.name for spec in sorted((ROOT / "specs").glob("*.pallas"))])
def test_piecewise_formatting_equals_formatting_the_whole_module(name):
    """(Each spec planned by its test, not at collection, which every pytest-xdist worker repeats.)"""
    spec = ROOT / "specs" / name
    plan = plan_module(f"specs/{name}", check_source(spec.read_text(), name))
    whole = "\n".join(render_pieces(plan))
    assert render_module(plan) == format_code(whole)


def test_the_launchers_vmem_at_the_default_blocks_is_the_spec_checks_count():
    """`vmem_limit_bytes=rt.vmem_limit(...)` reads the call-time blocks; at the defaults (with
    dimensions taken whole counted as 1, as `vmem_bytes` does) it is the same count."""
    from pallasgen.backends.tpu.tiling import vmem_bytes

    for spec in sorted((ROOT / "specs").glob("*.pallas")):
        checked_kernels = check_source(spec.read_text(), spec.name)
        plan = plan_module(f"specs/{spec.name}", checked_kernels)
        for kernel, kernel_plan in zip(every_kernel(checked_kernels), plan.kernels, strict=True):
            checked, _ = launched(kernel)  # with the residuals its launcher writes when asked
            tpu = kernel_plan.backends["tpu"]
            names = {b.keyword: b.default for b in tpu.blocks}
            whole = {name: 1 for name in compile(tpu.vmem_needed, "<vmem>", "eval").co_names if name not in names}
            if checked.has_products:  # its carries and working tiles too: the plan's parts
                expected = tpu.vmem.total(checked.blocks)
            else:
                expected = vmem_bytes(checked.kernel, checked.blocks)
            assert eval(tpu.vmem_needed, {}, {**names, **whole}) == expected, (spec.name, checked.kernel.name)


def test_every_name_a_module_imports_is_kept_off_spec_names():
    """A spec's names never shadow what the module imports (`rt`, the runtime, among them):
    the reserved list in pallasgen.analysis.names follows templates/header.py.j2."""
    import ast

    from pallasgen.analysis.names import MODULE_NAMES

    name, plan = next(plans())
    header = ast.parse(format_code(render_pieces(plan)[0]))
    imported = {
        alias.asname or alias.name.split(".")[0]
        for node in header.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported and imported <= MODULE_NAMES


def test_a_docstrings_long_lines_are_wrapped_and_the_others_kept_as_they_are():
    sentence = "The backward pass of `k`: " + "the cotangent of an input, " * 6 + "from dy."
    short = ("Adds rows.", "  - an indented line, kept")
    assert docstring(short) == '"""Adds rows.\n      - an indented line, kept\n    """'
    lines = docstring((sentence,)).splitlines()
    assert len(lines) == 3 and all(len(line) <= 120 for line in lines) and lines[-1] == '    """'
    assert " ".join(line.strip().strip('"') for line in lines).strip() == sentence


def test_a_tpu_cost_estimate_counts_each_operation_once_per_element_of_its_value():
    """rsqrt runs once per row (M of them), not once per element; mean counts the elements
    it reduces; `+ 1e-6` on each row's mean is a term over fewer dimensions than the
    others, left out: 3 * m * n flops (x * x, the mean, the product)."""
    source = "kernel rms {\n in x: f32[M, N]\n out y: f32[M, N]\n y = x * rsqrt(mean(x * x, N) + 1e-6)\n grad none\n}\n"
    module = render_module(plan_module("rms.pallas", check_source(source, "rms.pallas")))
    assert "pl.CostEstimate(flops=3 * m * n, transcendentals=m, bytes_accessed=rt.nbytes(x) + 4 * m * n)" in module
