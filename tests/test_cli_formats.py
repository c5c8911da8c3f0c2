"""`pallasgen build` and `check` with `--format json` (one JSON object per line) and
`--format github` (GitHub Actions workflow commands): what a tool reads on stdout,
with the exit codes of text (2 a spec or usage error, 1 drift, 0 clean)."""

from __future__ import annotations

import json

import pytest

from pallasgen.analysis.tuning import TunedBlocks
from pallasgen.frontend.errors import Position
from pallasgen.workspace.pipeline import check_source
from pallasgen.workspace.report import Finding, formatted
from pallasgen.workspace.tuning import Entry, format_tuning, with_entry
from test_cli import ADD_VECTORS, BAD, SCALE, pallasgen, project, write  # noqa: F401

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)


def records(stdout: str) -> list[dict]:
    """Every stdout line as JSON: a line that is not fails the test."""
    return [json.loads(line) for line in stdout.splitlines()]


# --------------------------------------------------------------------------- spec errors


def test_json_gives_each_spec_diagnostic_as_one_object_per_line(project):
    write(project / "specs" / "broken.pallas", BAD)
    write(project / "specs" / "worse.pallas", BAD.replace("yy", "qq").replace("x: f32", "x: f23"))
    result = pallasgen("build", "--format", "json")
    assert result.exit_code == 2
    found = records(result.stdout)
    assert [(r["file"], r["line"], r["column"], r["severity"]) for r in found] == [
        ("specs/broken.pallas", 5, 13, "error"),
        ("specs/worse.pallas", 2, 12, "error"),
        ("specs/worse.pallas", 5, 13, "error"),
    ]
    assert found[0] == {
        "file": "specs/broken.pallas",
        "line": 5,
        "column": 13,
        "end_line": 5,
        "end_column": 14,
        "severity": "error",
        "message": "unknown name 'yy'",
    }
    assert result.stderr == ""
    assert not (project / "generated").exists()


def test_json_reports_every_diagnostic_where_text_shows_the_first_twenty(project):
    body = "\n".join(f"    z{i} = x" for i in range(25))
    write(
        project / "specs" / "many.pallas",
        f"kernel many {{\n    in  x: f32[N]\n    out z: f32[N]\n    z = x\n{body}\n}}\n",
    )
    assert len(records(pallasgen("build", "--format", "json").stdout)) == 25
    assert pallasgen("build").stderr.count(": error: ") == 20


def test_github_gives_each_spec_diagnostic_as_an_error_command_at_its_position(project):
    write(project / "specs" / "broken.pallas", BAD)
    result = pallasgen("check", "--format", "github")
    assert result.exit_code == 2
    assert result.stdout == "::error file=specs/broken.pallas,line=5,col=13,endLine=5,endColumn=14::unknown name 'yy'\n"


# --------------------------------------------------------------------------- drift


@pytest.fixture
def drifted(project):
    """A project whose generated/ has one file changed, one missing and one stale."""
    write(project / "specs" / "scale.pallas", SCALE)
    write(project / "specs" / "gone.pallas", SCALE.replace("scale", "gone"))
    assert pallasgen("build").exit_code == 0
    module = project / "generated" / "add_vectors.py"
    module.write_text(module.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    (project / "generated" / "scale.py").unlink()
    (project / "specs" / "gone.pallas").unlink()
    return project


def test_check_json_gives_each_out_of_date_file_its_kind_and_spec(drifted):
    result = pallasgen("check", "--format", "json")
    assert result.exit_code == 1
    found = records(result.stdout)
    assert [(r["file"], r["kind"], r["spec"], r["severity"]) for r in found] == [
        ("generated/add_vectors.py", "changed", "specs/add_vectors.pallas", "error"),
        ("generated/scale.py", "missing", "specs/scale.pallas", "error"),
        ("generated/gone.py", "stale", "specs/gone.pallas", "error"),
    ]
    assert all(r["message"].endswith("run `pallasgen build`") for r in found)
    assert "--- generated/add_vectors.py (on disk)" in result.stderr  # the diff and summary, for a person
    assert "pallasgen check: 3 files out of date" in result.stderr


def test_check_github_annotates_each_out_of_date_file(drifted):
    result = pallasgen("check", "--format", "github", "--quiet")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "::error file=generated/add_vectors.py::out of date: differs from what specs/add_vectors.pallas generates;"
        " run `pallasgen build`",
        "::error file=generated/scale.py::out of date: missing; specs/scale.pallas generates it; run `pallasgen build`",
        "::error file=generated/gone.py::out of date: stale; its spec specs/gone.pallas no longer exists;"
        " run `pallasgen build`",
    ]


@pytest.mark.parametrize("form", ["json", "github"])
def test_a_clean_check_or_build_prints_no_records_and_exits_0(project, form):
    built = pallasgen("build", "--format", form)
    assert built.exit_code == 0
    assert built.stdout == ""
    assert "wrote generated/add_vectors.py" in built.stderr
    checked = pallasgen("check", "--format", form)
    assert checked.exit_code == 0
    assert checked.stdout == ""
    assert checked.stderr == "pallasgen check: 1 generated file matches its spec\n"


# --------------------------------------------------------------------------- usage errors


def test_a_usage_error_is_a_record_without_a_file(project):
    json_result = pallasgen("build", "--format", "json", "specs/nope.pallas")
    assert json_result.exit_code == 2
    assert records(json_result.stdout) == [
        {
            "file": None,
            "line": None,
            "column": None,
            "end_line": None,
            "end_column": None,
            "severity": "error",
            "message": "specs/nope.pallas: no such file or folder",
        }
    ]
    github_result = pallasgen("check", "--format", "github", "specs/nope.pallas")
    assert github_result.exit_code == 2
    assert github_result.stdout == "::error::specs/nope.pallas: no such file or folder\n"


def test_an_unknown_format_is_refused():
    result = pallasgen("build", "--format", "xml")
    assert result.exit_code == 2
    assert "'xml' is not one of 'text', 'json', 'github'" in result.stderr


# --------------------------------------------------------------------------- escaping


def test_github_escapes_percent_and_line_breaks_in_a_message_and_commas_and_colons_in_a_file():
    finding = Finding("error", "100% sure\r\nsecond line", "C:/odd,name.pallas", Position.point(3, 4))
    assert (
        formatted(finding, "github") == "::error file=C%3A/odd%2Cname.pallas,line=3,col=4::100%25 sure%0D%0Asecond line"
    )


def test_json_keeps_a_message_to_one_line_and_to_ascii():
    line = formatted(Finding("warning", "caf\u00e9\nnext", "s.pallas"), "json")
    assert "\n" not in line and line.isascii()
    assert json.loads(line)["message"] == "caf\u00e9\nnext"


# --------------------------------------------------------------------------- stale tunings


def test_a_kernel_changed_since_it_was_tuned_is_a_warning_in_build_and_an_error_in_check(project):
    kernel = check_source(ADD_VECTORS, "spec.pallas")[0]
    entry = Entry(TunedBlocks("v5e", (("N", 4096),), (("N", 2048),)), {"kernel_cycles": 1}, {})
    write(project / "specs" / "add_vectors.tuning.json", format_tuning(with_entry({}, kernel, entry)))
    write(project / "specs" / "add_vectors.pallas", ADD_VECTORS.replace("x + y", "x * y"))
    built = pallasgen("build", "--format", "github")
    assert built.exit_code == 0
    assert built.stdout == (
        "::warning file=specs/add_vectors.tuning.json::'add_vectors' changed since it was tuned:"
        " its tuned blocks are left out; run `pallasgen tune` again\n"
    )
    checked = pallasgen("check", "--format", "json")
    assert checked.exit_code == 1
    (found,) = records(checked.stdout)
    assert (found["file"], found["kind"], found["spec"], found["severity"]) == (
        "specs/add_vectors.tuning.json",
        "stale-tuning",
        "specs/add_vectors.pallas",
        "error",
    )
