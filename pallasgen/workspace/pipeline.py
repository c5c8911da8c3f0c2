"""One spec through every stage: text, tree, IR, checks, plan, source."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from pallasgen.frontend import parser

from pallasgen.frontend import transform
from pallasgen.analysis.checks import CheckedKernel, Diagnostics, check_spec
from pallasgen.gradients.derive import with_gradients
from pallasgen.frontend.errors import Diagnostic, Position, SpecError
from pallasgen.backends import plan_module, targeted
from pallasgen.runtime.constants import TARGETS
from pallasgen.workspace.tuning import apply_tuning, read_tuning
from pallasgen.rendering.render import render_module


def generate(
    source: str, path: str, spec_path: str, tuning: Tuning | None = None, targets: tuple[str, ...] = TARGETS
) -> str:
    """The generated module for a spec's text and its tuning file's (if it has one), for
    `targets` (`[tool.pallasgen] targets`); raises `SpecError` naming `path`, or the
    tuning file's path."""
    with too_deep_is_a_spec_error(source, path):
        return render_module(plan_module(spec_path, tuned_kernels(source, path, tuning, targets)[0], targets))


@contextmanager
def too_deep_is_a_spec_error(source: str, path: str):
    """A spec nested deeper than the passes' recursion goes is a spec error (transform
    refuses the deep specs it can see; this is the net under it)."""
    try:
        yield
    except RecursionError:
        message = (
            "this spec is nested too deep for pallasgen to build; split its longest expressions with let,"
            " or its kernels in two"
        )
        raise SpecError(path, source, [Diagnostic(Position.point(1, 1), message)]) from None


@dataclass(frozen=True)
class Tuning:
    """A spec's tuning file, as read."""

    text: str
    path: str  # as messages name it


def tuned_kernels(
    source: str, path: str, tuning: Tuning | None, targets: tuple[str, ...] = TARGETS
) -> tuple[tuple[CheckedKernel, ...], list[str]]:
    """The checked kernels with their tuned blocks, and why the tuning file is stale, if it is."""
    kernels = check_source(source, path, targets)
    if tuning is None:
        return kernels, []
    return apply_tuning(kernels, read_tuning(tuning.text, tuning.path), tuning.text, tuning.path)


def check_source(source: str, path: str, targets: tuple[str, ...] = TARGETS) -> tuple[CheckedKernel, ...]:
    """Parses and checks a spec for `targets` (the checks of the backends it targets), and
    derives each kernel's backward kernels (checked as any kernel is); raises `SpecError`
    with every problem found."""
    try:
        with too_deep_is_a_spec_error(source, path):
            tree = parser.parse(source)
            spec = transform.to_ir(tree, source)
            backends = targeted(targets)
            return with_gradients(check_spec(spec, backends), backends)
    except parser.SyntaxDiagnostics as error:
        raise SpecError(path, source, error.diagnostics) from None
    except transform.TransformDiagnostic as error:
        raise SpecError(path, source, [error.diagnostic]) from None
    except Diagnostics as error:
        raise SpecError(path, source, error.diagnostics) from None


def decode(data: bytes, path: str) -> str:
    """Spec bytes as text: UTF-8, an optional byte-order mark dropped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        before = data[: error.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1 :].decode("utf-8")) + 1
        # Bytes that are not UTF-8 show as escapes (\xe9), never raw.
        shown = data.decode("utf-8", errors="backslashreplace")
        message = f"not UTF-8: byte 0x{data[error.start]:02x} at byte offset {error.start}; save the file as UTF-8"
        position = Position(line, column, line, column + len("\\xff") - 1)
        raise SpecError(path, shown, [Diagnostic(position, message)]) from None
    # One line ending, so that Lark's line numbers and the lines errors show agree.
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
