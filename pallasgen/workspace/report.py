"""What `build` and `check` find, as a tool reads it: one JSON object per line
(`--format json`), or GitHub Actions workflow commands (`--format github`), which
annotate the file and line in a pull request. The text a person reads is the CLI's."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pallasgen.frontend.errors import Position, SpecError
from pallasgen.workspace.sync import Change

FORMATS = ("text", "json", "github")

# An out-of-date generated file, by what a build would do to it.
DRIFT_KINDS = {"create": "missing", "update": "changed", "remove": "stale"}


@dataclass(frozen=True)
class Finding:
    """One thing to report: a spec diagnostic, a usage error, an out-of-date generated
    file, or a tuning file whose kernel has changed since it was tuned."""

    severity: str  # "error", "warning" or "note"
    message: str
    file: str | None = None
    position: Position | None = None
    kind: str | None = None  # an out-of-date file's DRIFT_KINDS value, or "stale-tuning"
    spec: str | None = None  # the spec of an out-of-date file or tuning


def spec_findings(error: SpecError) -> list[Finding]:
    """Every diagnostic of a spec that cannot be built (none left out, unlike its text)."""
    return [Finding("error", d.message, error.path, d.position) for d in error.diagnostics]


def drift_description(change: Change) -> str:
    """What is out of date about a generated file, after its path."""
    if change.kind == "create":
        return f"missing; {change.spec_label} generates it"
    if change.kind == "remove" and change.spec_label is None:
        return "a temporary file left by an interrupted build"
    if change.kind == "remove":
        return f"stale; its spec {change.spec_label} no longer exists"
    return f"differs from what {change.spec_label} generates"


def drift_finding(change: Change, shown_path: str) -> Finding:
    message = f"out of date: {drift_description(change)}; run `pallasgen build`"
    return Finding("error", message, shown_path, kind=DRIFT_KINDS[change.kind], spec=change.spec_label)


def formatted(finding: Finding, form: str) -> str:
    """One line: a JSON object for "json", a workflow command for "github"."""
    return _as_json(finding) if form == "json" else _as_github(finding)


def _as_json(finding: Finding) -> str:
    position = finding.position
    record = {
        "file": finding.file,
        "line": position and position.line,
        "column": position and position.column,
        "end_line": position and position.end_line,
        "end_column": position and position.end_column,
        "severity": finding.severity,
        "message": finding.message,
    }
    if finding.kind is not None:
        record.update(kind=finding.kind, spec=finding.spec)
    return json.dumps(record)


GITHUB_COMMANDS = {"note": "notice"}  # GitHub's workflow command for each severity it names otherwise


def _as_github(finding: Finding) -> str:
    """`::error file=F,line=L,col=C::message`, escaped as GitHub's runner unescapes it."""
    properties = {}
    if finding.file is not None:
        properties["file"] = finding.file
    position = finding.position
    if position is not None:
        properties.update(line=position.line, col=position.column)
        if (position.end_line, position.end_column) != (position.line, position.column):
            properties.update(endLine=position.end_line, endColumn=position.end_column)
    listed = ",".join(f"{name}={_escape_property(str(value))}" for name, value in properties.items())
    command = GITHUB_COMMANDS.get(finding.severity, finding.severity)
    return f"::{command}{' ' + listed if listed else ''}::{_escape_data(finding.message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
