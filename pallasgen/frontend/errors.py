"""Spec diagnostics: a position in a spec file, a message, and how they print."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable

from pallasgen.frontend.text import counted

MAX_REPORTED = 20
MAX_SHOWN = 160  # characters of a source line a diagnostic shows, at most
SHOWN_BEFORE = 60  # of which, before the caret
MAX_CANDIDATES = 200  # names a "did you mean" compares, at most
MAX_WORD = 80  # characters of a word of a message (a name, say), at most


@dataclass(frozen=True)
class Position:
    """A span of spec text: 1-based line and column of its first and last character."""

    line: int
    column: int
    end_line: int
    end_column: int

    @classmethod
    def point(cls, line: int, column: int) -> Position:
        return cls(line, column, line, column)


@dataclass(frozen=True)
class Diagnostic:
    """One user error in a spec, at a position."""

    position: Position
    message: str


class SpecError(Exception):
    """A spec that cannot be built; carries every diagnostic found, in source order."""

    def __init__(self, path: str, source: str, diagnostics: Iterable[Diagnostic]):
        self.path = path
        self.source = source
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.position.line, d.position.column))
        super().__init__(self.render())

    def __reduce__(self):
        return SpecError, (self.path, self.source, self.diagnostics)

    def render(self) -> str:
        """All diagnostics as `path:line:col: error: ...`, each with its line and caret."""
        lines = self.source.split("\n")
        shown = self.diagnostics[:MAX_REPORTED]
        blocks = [_render_one(self.path, lines, d) for d in shown]
        hidden = len(self.diagnostics) - len(shown)
        if hidden:
            blocks.append(f"{self.path}: {counted(hidden, 'more error')} not shown")
        return "\n".join(blocks)


def _render_one(path: str, lines: list[str], diagnostic: Diagnostic) -> str:
    pos = diagnostic.position
    head = f"{path}:{pos.line}:{pos.column}: error: {_clip_words(diagnostic.message)}"
    if not 1 <= pos.line <= len(lines):
        return head
    line = lines[pos.line - 1]
    first = pos.column - 1
    last = pos.end_column if pos.end_line == pos.line else len(line)
    # A long line shows a window around the caret, its cut ends marked `...`.
    begin = max(0, min(first, len(line)) - SHOWN_BEFORE) if len(line) > MAX_SHOWN else 0
    end = min(len(line), begin + MAX_SHOWN)
    shown = [_shown(char) for char in line[begin:end]]
    before, after = ("..." if begin else ""), ("..." if end < len(line) else "")
    indent = len(before) + sum(map(len, shown[: first - begin])) + max(0, first - len(line))
    width = max(1, sum(map(len, shown[first - begin : last - begin])))
    return f"{head}\n    {before}{''.join(shown)}{after}\n    {' ' * indent}{'^' * width}"


def _clip_words(message: str) -> str:
    """A message with any very long word in it (a name of a million letters) cut short."""
    return re.sub(r"\S{%d,}" % MAX_WORD, lambda m: m[0][: MAX_WORD // 2] + "..." + m[0][-8:], message)


def _shown(char: str) -> str:
    """A source character as an error shows it: a tab as a space, any other unprintable
    character (a terminal control, say) as its Python escape, never raw."""
    if char == "\t":
        return " "
    return char if char.isprintable() else repr(char)[1:-1]


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A ` (did you mean 'x'?)` suffix naming the closest candidate, or ''. Among many
    candidates, only those of about the name's length that share its first or last
    letter are compared, and none for a very long name, so that it stays quick."""
    if len(name) > MAX_WORD:
        return ""
    names = sorted(set(candidates))
    if len(names) > MAX_CANDIDATES:
        names = [c for c in names if abs(len(c) - len(name)) <= 2 and (c[:1] == name[:1] or c[-1:] == name[-1:])]
        names = names[:MAX_CANDIDATES]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
