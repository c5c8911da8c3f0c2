"""Text helpers: what generated code may quote (nothing in it can end a string or a
comment), and counts and sizes in words."""

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


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """`1 spec`, `2 specs`: the count and the words that agree with it (`plural`
    defaults to `singular` + s)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def format_bytes(count: int) -> str:
    """A size in bytes as every backend and picture words it: `1.5 MiB`, `2.0 KiB`, `512 B`."""
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.1f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count} B"
