"""Text that generated code may quote: nothing in it can end a string or a comment."""

from __future__ import annotations


def escape_text(text: str) -> str:
    """Backslashes and double quotes escaped; any unprintable character as a Python escape."""
    out = []
    for char in text:
        if char in '\\"':
            out.append("\\" + char)
        elif char.isprintable() or char == " ":
            out.append(char)
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)
