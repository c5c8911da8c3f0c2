"""Spec text to a Lark tree; syntax errors become diagnostics that speak in words."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from importlib.resources import files

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from pallasgen.frontend.errors import MAX_REPORTED, Diagnostic, Position, did_you_mean

KEYWORDS = ("kernel", "in", "out", "let", "param", "block", "accumulate", "gpu", "grad", "true", "false")
STATEMENT_KEYWORDS = ("in", "out", "let", "param", "block", "accumulate", "gpu", "grad")

_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_NL": "a new line",
    "$END": "the end of the file",
}
_OPERATORS = {"COMPARE_OP", "PIPE", "CARET", "AMPERSAND", "SHIFT_OP", "PLUS", "MINUS", "MUL_OP", "POW", "DOT"}


@cache
def _lark() -> Lark:
    grammar = files("pallasgen.frontend").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="basic",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"NAME": _normalize_name},
    )


def _normalize_name(token: Token) -> Token:
    """Names as Python reads them (NFKC), so two spellings of one name are one name."""
    return Token.new_borrow_pos(token.type, unicodedata.normalize("NFKC", token), token)


def parse(text: str) -> Tree:
    """Parses spec text; raises `SyntaxDiagnostics` with every syntax error it can find."""
    try:
        return _lark().parse(text)
    except UnexpectedInput as error:
        first = _diagnose(error, text)
    raise SyntaxDiagnostics([first, *_later_errors(text, first)])


class SyntaxDiagnostics(Exception):
    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__(diagnostics[0].message)
        self.diagnostics = diagnostics


def _later_errors(text: str, first: Diagnostic) -> list[Diagnostic]:
    """Errors after the first, found by blanking each bad statement line and parsing again.

    Statements end at line ends, so a bad line rarely hides the next one; recovery
    stops at a line that opens or closes a kernel, where guessing would mislead.
    """
    lines = text.split("\n")
    found: list[Diagnostic] = []
    error = first
    while len(found) < MAX_REPORTED and _is_statement_line(lines, error.position.line):
        lines[error.position.line - 1] = ""
        try:
            _lark().parse("\n".join(lines))
            return found
        except UnexpectedInput as next_error:
            error = _diagnose(next_error, "\n".join(lines))
        if error.position.line <= len(lines) and _is_statement_line(lines, error.position.line):
            found.append(error)
        else:
            break
    return found


def _is_statement_line(lines: list[str], number: int) -> bool:
    if not 1 <= number <= len(lines):
        return False
    line = lines[number - 1]
    return bool(line.strip()) and not any(mark in line for mark in ("{", "}", "kernel"))


def _diagnose(error: UnexpectedInput, text: str) -> Diagnostic:
    if isinstance(error, UnexpectedCharacters):
        char = text[error.pos_in_stream]
        shown = repr(char) if not char.isprintable() else f"'{char}'"
        return Diagnostic(Position.point(error.line, error.column), f"unexpected character {shown}")
    expected = _describe_expected(error.expected if hasattr(error, "expected") else set())
    if isinstance(error, UnexpectedEOF) or error.token.type == "$END":
        line = text.count("\n") + 1
        column = len(text.rsplit("\n", 1)[-1]) + 1
        return Diagnostic(Position.point(line, column), f"unexpected end of file, expected {expected}")
    token: Token = error.token
    misspelled = _misspelled_keyword(error, text)
    if misspelled:
        return misspelled
    position = Position(token.line, token.column, token.end_line, token.end_column - 1)
    if token.type == "_NL":
        return Diagnostic(Position.point(token.line, token.column), f"unexpected end of line, expected {expected}")
    if token.value in KEYWORDS and "NAME" in error.expected:
        return Diagnostic(position, f"'{token.value}' is a reserved word and cannot be used as a name")
    if token.type == "COMPARE_OP" and "COMPARE_OP" not in error.expected and "PIPE" in error.expected:
        return Diagnostic(position, "comparisons cannot be chained; combine them with & and parentheses")
    if token.value == "[" and "PLUS" in error.expected:  # after a value: `x[...]`, `x[i]`
        return Diagnostic(
            position,
            "unexpected '[': a spec reads arrays whole, without indexing; write the name alone (x, not x[...]),"
            " and choose blocks with a block statement",
        )
    if token.value == "=" and (keyword := _keyword_argument(text, token)):
        return Diagnostic(position, f"unexpected '=': functions take no keyword arguments; write {keyword}")
    return Diagnostic(position, f"unexpected '{token.value}', expected {expected}")


def _keyword_argument(text: str, token: Token) -> str | None:
    """The call `mean(x, axis=N)` at `token` (its `=`) rewritten without the keyword: `mean(x, N)`."""
    line = text.split("\n")[token.line - 1]
    call = re.search(r"(\w+)\s*\(([^()]*?)\w+\s*$", line[: token.column - 1])
    value = re.match(r"\s*([^,()=]*?)\s*[,)]", line[token.column :])
    if not call or not value or not value[1]:
        return None
    return f"{call[1]}({call[2]}{value[1]})"


def _misspelled_keyword(error: UnexpectedInput, text: str) -> Diagnostic | None:
    """A statement that opens with a misspelled keyword: `inn x: f32[N]` reads as an
    assignment to `inn` without its `=`, so the error comes at the second word."""
    if "EQUAL" not in error.expected:
        return None
    token: Token = error.token
    before = text.split("\n")[token.line - 1][: token.column - 1]
    first = re.fullmatch(r"(\s*)(\w+)\s*", before)
    if not first or first[2] in KEYWORDS:
        return None
    hint = did_you_mean(first[2].lower(), STATEMENT_KEYWORDS)
    if not hint:
        return None
    column = len(first[1]) + 1
    position = Position(token.line, column, token.line, column + len(first[2]) - 1)
    return Diagnostic(position, f"unknown statement '{first[2]}'{hint}")


def _describe_expected(terminals: set[str]) -> str:
    binary_expected = bool(terminals & {"PLUS", "MUL_OP", "COMPARE_OP"})
    words = set()
    for name in terminals:
        if name in _OPERATORS and binary_expected:
            words.add("an operator")
        elif name in _WORDS:
            words.add(_WORDS[name])
        else:
            pattern = _lark().get_terminal(name).pattern.value
            words.add(f"'{pattern}'")
    ordered = sorted(words)
    if len(ordered) <= 1:
        return "".join(ordered) or "something else"
    return ", ".join(ordered[:-1]) + " or " + ordered[-1]
