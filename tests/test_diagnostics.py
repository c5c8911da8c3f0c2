"""Spec errors: every message pallasgen gives, where it points, and how it prints.

Most cases are the corpus in tests/bad_specs/: one bad spec per file, named after
what is wrong with it. The file's first lines say what pallasgen must report, one
line per diagnostic, in source order:

    # expect: LINE:COLUMN: MESSAGE-SUBSTRING

Lines and columns are 1-based and count the expect lines themselves. A corpus file
must produce exactly its expected diagnostics: an extra, cascading error is a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pallasgen.frontend.errors import SpecError
from pallasgen.workspace.pipeline import decode, generate
from pallasgen.frontend.transform import MAX_EXPRESSION_DEPTH

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
BAD_SPECS = sorted((TESTS / "bad_specs").glob("*.pallas"))
EXPECT = re.compile(r"# expect: (\d+):(\d+): (.+)")

# Lark's names for the grammar's terminals and its internal markers: a message that
# shows one of these speaks the parser's language instead of the user's.
INTERNAL_NAMES = re.compile(
    r"__ANON|__IGNORE|\$END|\b(?:_NL|NAME|NUMBER|COMMENT|COMPARE_OP|MUL_OP|POW|PIPE|AMPERSAND|PLUS|MINUS|TILDE"
    r"|LBRACE|RBRACE|LPAR|RPAR|LSQB|RSQB|COLON|COMMA|EQUAL|DOT|KERNEL|PARAM|ACCUMULATE|BLOCK)\b"
)

ADD_VECTORS = """\
kernel add_vectors {
    in  x: f32[N]
    in  y: f32[N]
    out z: f32[N]
    z = x + y
    block N = 1024
}
"""


@dataclass(frozen=True)
class Expected:
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


def expectations(source: str) -> list[Expected]:
    found = []
    for text in source.splitlines():
        match = EXPECT.fullmatch(text)
        if not match:
            break
        found.append(Expected(int(match[1]), int(match[2]), match[3]))
    return found


def spec_error(source: str, path: str = "spec.pallas") -> SpecError:
    """The SpecError that building `source` raises; fails the test if it builds."""
    with pytest.raises(SpecError) as caught:
        generate(source, path, f"specs/{path}")
    return caught.value


def corpus_case(path: Path):
    return pytest.param(path, id=path.stem)


CORPUS = [corpus_case(p) for p in BAD_SPECS]


# --------------------------------------------------------------------------- the corpus


def test_every_corpus_file_states_what_it_expects():
    assert len(BAD_SPECS) > 50
    for path in BAD_SPECS:
        assert expectations(path.read_text(encoding="utf-8")), f"{path.name} has no '# expect:' line"


@pytest.mark.parametrize("path", CORPUS)
def test_bad_spec_reports_each_expected_error_at_its_line_and_column(path):
    source = path.read_text(encoding="utf-8")
    error = spec_error(source, path.name)
    got = [f"{d.position.line}:{d.position.column}: {d.message}" for d in error.diagnostics]
    want = expectations(source)
    assert len(got) == len(want), "\n".join(["expected:", *map(str, want), "got:", *got])
    for expected, diagnostic in zip(want, error.diagnostics):
        assert (diagnostic.position.line, diagnostic.position.column) == (expected.line, expected.column), got
        assert expected.message in diagnostic.message, got


@pytest.mark.parametrize("path", CORPUS)
def test_bad_spec_renders_path_line_column_source_line_and_caret(path):
    source = path.read_text(encoding="utf-8")
    error = spec_error(source, f"specs/{path.name}")
    rendered = error.render().splitlines()
    lines = source.splitlines()
    for diagnostic in error.diagnostics:
        pos = diagnostic.position
        head = f"specs/{path.name}:{pos.line}:{pos.column}: error: {diagnostic.message}"
        assert head in rendered
        if pos.line > len(lines):  # the end of the file, past the last line: nothing to underline
            continue
        at = rendered.index(head)
        shown, caret = rendered[at + 1], rendered[at + 2]
        # A tab shows as a space, any other unprintable character as its escape, never raw.
        chars = [" " if c == "\t" else c if c.isprintable() else repr(c)[1:-1] for c in lines[pos.line - 1]]
        assert shown == "    " + "".join(chars)
        assert caret.startswith("    " + " " * len("".join(chars[: pos.column - 1])) + "^")
        assert set(caret.strip()) == {"^"}
        if pos.end_line == pos.line and pos.end_column <= len(lines[pos.line - 1]):
            under = "".join(chars[pos.column - 1 : pos.end_column])
            assert len(caret.strip()) == len(under)  # under the whole offending text


@pytest.mark.parametrize("path", CORPUS)
def test_bad_spec_messages_use_no_parser_internal_names(path):
    error = spec_error(path.read_text(encoding="utf-8"), path.name)
    for diagnostic in error.diagnostics:
        assert not INTERNAL_NAMES.search(diagnostic.message), diagnostic.message


# --------------------------------------------------------------------------- syntax errors in words


def _sweep_variants():
    """add_vectors cut short at every token boundary, or with a stray token inserted there."""
    tokens = list(re.finditer(r"#.*|\w+|\S|\n", ADD_VECTORS))
    boundaries = sorted({t.start() for t in tokens} | {t.end() for t in tokens})
    for at in boundaries:
        yield ADD_VECTORS[:at]
        for stray in (")", "=", ",", "+", "<", "kernel", "1", "x", "[", "{"):
            yield f"{ADD_VECTORS[:at]} {stray} {ADD_VECTORS[at:]}"


def test_syntax_errors_anywhere_in_a_spec_name_what_was_expected_in_words():
    messages = set()
    for source in _sweep_variants():
        try:
            generate(source, "spec.pallas", "specs/spec.pallas")
        except SpecError as error:
            messages.update(d.message for d in error.diagnostics)
    assert any("expected" in m for m in messages)
    leaked = sorted(m for m in messages if INTERNAL_NAMES.search(m))
    assert not leaked, leaked
    for message in messages:
        if "expected" in message:
            assert re.search(r"expected (a |an |the |'|something)", message), message


def test_missing_operator_suggests_an_operator_in_words():
    error = spec_error(ADD_VECTORS.replace("z = x + y", "z = x y"))
    (diagnostic,) = error.diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (5, 11)
    assert diagnostic.message.startswith("unexpected 'y', expected")
    assert "an operator" in diagnostic.message


@pytest.mark.parametrize(
    "statement, keyword",
    [
        ("inn w: f32[N]", "in"),
        ("In w: f32[N]", "in"),
        ("outt w: f32[N]", "out"),
        ("ot w: f32[N]", "out"),
        ("lett w = x", "let"),
        ("parm p: f32 = 1.0", "param"),
        ("blok N = 128", "block"),
        ("acumulate f32", "accumulate"),
        ("gpuu block N = 128", "gpu"),
    ],
)
def test_misspelled_statement_keyword_is_named_with_the_keyword_meant(statement, keyword):
    (diagnostic,) = spec_error(ADD_VECTORS.replace("    z = x + y", f"    {statement}\n    z = x + y")).diagnostics
    word = statement.split()[0]
    assert diagnostic.message == f"unknown statement '{word}' (did you mean '{keyword}'?)"
    assert (diagnostic.position.line, diagnostic.position.column) == (5, 5)
    assert diagnostic.position.end_column == 4 + len(word)  # the caret underlines the word


def test_statement_opening_with_a_word_like_no_keyword_says_what_was_expected():
    (diagnostic,) = spec_error(ADD_VECTORS.replace("z = x + y", "zz w = x + y")).diagnostics
    assert diagnostic.message == "unexpected 'w', expected '='"


def test_syntax_errors_on_several_statement_lines_are_all_reported():
    error = spec_error(ADD_VECTORS.replace("x + y", "x $ y").replace("1024", "1024 $"))
    assert [(d.position.line, d.position.column) for d in error.diagnostics] == [(5, 11), (6, 20)]


def test_syntax_recovery_stops_at_a_broken_kernel_header():
    """Past a bad `kernel` line every statement would look wrong: only the first error shows."""
    error = spec_error(ADD_VECTORS.replace("kernel add_vectors {", "kernel add vectors {").replace("x + y", "x $ y"))
    assert [(d.position.line, d.position.column) for d in error.diagnostics] == [(1, 12)]


# --------------------------------------------------------------------------- expression depth


def test_expression_nested_deeper_than_the_limit_is_an_error_at_the_too_deep_part():
    depth = MAX_EXPRESSION_DEPTH + 50
    expression = "exp(" * depth + "x" + ")" * depth
    source = ADD_VECTORS.replace("x + y", expression)
    (diagnostic,) = spec_error(source).diagnostics
    assert diagnostic.message.startswith(f"expression nested more than {MAX_EXPRESSION_DEPTH} levels deep")
    assert diagnostic.message.endswith("split it with let")
    line = source.splitlines()[diagnostic.position.line - 1]
    assert diagnostic.position.line == 5
    start = line.index("exp(")
    # the caret sits on one of the nested calls, well inside the expression
    assert diagnostic.position.column > start + 1
    assert line[diagnostic.position.column - 1 :].startswith("exp(")


def test_deep_parentheses_alone_are_not_nesting():
    source = ADD_VECTORS.replace("x + y", "(" * 1000 + "x + y" + ")" * 1000)
    assert generate(source, "spec.pallas", "specs/spec.pallas")


# --------------------------------------------------------------------------- several errors


def test_errors_from_different_kernels_and_checks_come_back_in_source_order():
    source = (TESTS / "bad_specs" / "several_errors_reported_in_source_order.pallas").read_text(encoding="utf-8")
    positions = [(d.position.line, d.position.column) for d in spec_error(source).diagnostics]
    assert positions == sorted(positions)
    assert len(positions) == 4


def test_many_errors_are_capped_with_a_count_of_the_rest():
    body = "\n".join(f"    z{i} = x" for i in range(25))
    source = f"kernel many {{\n    in  x: f32[N]\n    out z: f32[N]\n    z = x\n{body}\n}}\n"
    error = spec_error(source)
    assert len(error.diagnostics) == 25
    rendered = error.render()
    assert rendered.count(": error: ") == 20
    assert rendered.rstrip().endswith("spec.pallas: 5 more errors not shown")


def test_one_error_past_the_cap_is_counted_in_the_singular():
    body = "\n".join(f"    z{i} = x" for i in range(21))
    source = f"kernel many {{\n    in  x: f32[N]\n    out z: f32[N]\n    z = x\n{body}\n}}\n"
    assert spec_error(source).render().rstrip().endswith("spec.pallas: 1 more error not shown")


# --------------------------------------------------------------------------- rendering


def test_rendered_error_is_path_line_column_then_the_line_then_a_caret_under_the_text():
    source = ADD_VECTORS.replace("in  y: f32[N]", "in  y: f23[N]")
    rendered = spec_error(source, "specs/add_vectors.pallas").render()
    assert rendered.splitlines() == [
        "specs/add_vectors.pallas:3:12: error: unknown dtype 'f23' (did you mean 'f32'?);"
        " dtypes are f32, bf16, f16, i32, i16, i8, u8, bool",
        "        in  y: f23[N]",
        "               ^^^",
    ]


def test_caret_stays_under_the_text_on_a_line_indented_with_tabs():
    source = ADD_VECTORS.replace("    z = x + y", "\tz = x + yy")
    (diagnostic,) = spec_error(source).diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (5, 10)
    shown, caret = spec_error(source).render().splitlines()[1:3]
    assert caret.index("^") == shown.index("yy")
    assert caret.strip() == "^^"


def test_caret_sits_under_a_non_ascii_character():
    source = ADD_VECTORS.replace("x + y", "x \u00d7 y")
    error = spec_error(source)
    (diagnostic,) = error.diagnostics
    assert diagnostic.message == "unexpected character '\u00d7'"
    assert (diagnostic.position.line, diagnostic.position.column) == (5, 11)
    shown, caret = error.render().splitlines()[1:3]
    assert caret.index("^") == shown.index("\u00d7")


def test_error_at_the_end_of_a_file_without_final_newline_points_past_the_last_character():
    source = ADD_VECTORS.rstrip("\n}")
    (diagnostic,) = spec_error(source).diagnostics
    last = source.splitlines()[-1]
    assert diagnostic.message.startswith("unexpected end of file, expected")
    assert (diagnostic.position.line, diagnostic.position.column) == (6, len(last) + 1)


def test_unknown_name_suggests_nothing_when_nothing_is_close():
    (diagnostic,) = spec_error(ADD_VECTORS.replace("x + y", "x + completely_different")).diagnostics
    assert diagnostic.message == "unknown name 'completely_different'"


# --------------------------------------------------------------------------- bytes to text


def test_bytes_that_are_not_utf8_are_an_error_at_the_bad_byte():
    data = ADD_VECTORS.replace("in  y", "in  \xff").encode("latin-1")
    with pytest.raises(SpecError) as caught:
        decode(data, "specs/add_vectors.pallas")
    (diagnostic,) = caught.value.diagnostics
    offset = data.index(b"\xff")
    assert diagnostic.message == f"not UTF-8: byte 0xff at byte offset {offset}; save the file as UTF-8"
    assert (diagnostic.position.line, diagnostic.position.column) == (3, 9)
    assert caught.value.render().splitlines() == [
        f"specs/add_vectors.pallas:3:9: error: not UTF-8: byte 0xff at byte offset {offset}; save the file as UTF-8",
        "        in  \\xff: f32[N]",
        "            ^^^^",
    ]


def test_column_of_a_bad_byte_counts_the_characters_before_it():
    """Two-byte 'é' before the bad byte is one column, as an editor shows it."""
    data = "kernel k { # café ".encode("utf-8") + b"\xfe\n}\n"
    with pytest.raises(SpecError) as caught:
        decode(data, "spec.pallas")
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (1, 19)
    shown, caret = caught.value.render().splitlines()[1:3]
    assert caret.index("^") == shown.index("\\xfe")


def test_a_binary_file_shows_as_escapes_never_as_raw_bytes():
    """Control bytes (a terminal escape, a bell, NUL) and bytes that are not UTF-8 print
    as Python escapes; the caret stays under the bad byte."""
    data = b"\x7fELF\x02\x01\x00\x1b[2J\x07\xff\xfe\x00\nmore"
    with pytest.raises(SpecError) as caught:
        decode(data, "blob.pallas")
    head, shown, caret = caught.value.render().splitlines()
    assert head == "blob.pallas:1:13: error: not UTF-8: byte 0xff at byte offset 12; save the file as UTF-8"
    assert shown == "    \\x7fELF\\x02\\x01\\x00\\x1b[2J\\x07\\xff\\xfe\\x00"
    assert caret == " " * shown.index("\\xff") + "^^^^"


def test_a_control_character_in_a_spec_line_is_shown_escaped_with_the_caret_under_it():
    source = ADD_VECTORS.replace("x + y", "x + y\x1b[31m")
    error = spec_error(source)
    line, shown, caret = error.render().splitlines()
    assert line.endswith("error: unexpected character '\\x1b'")
    assert shown == "        z = x + y\\x1b[31m"
    assert caret == " " * shown.index("\\x1b") + "^^^^"


def test_utf8_byte_order_mark_is_dropped():
    text = decode(b"\xef\xbb\xbf" + ADD_VECTORS.encode("utf-8"), "spec.pallas")
    assert text == ADD_VECTORS


def test_byte_order_mark_does_not_shift_error_columns():
    source = decode(b"\xef\xbb\xbf" + ADD_VECTORS.replace("kernel add_vectors", "kernel in").encode(), "s.pallas")
    (diagnostic,) = spec_error(source).diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (1, 8)


def test_crlf_line_endings_build_the_same_module_as_lf():
    crlf = ("# Adds two vectors.\n" + ADD_VECTORS).replace("\n", "\r\n").encode("utf-8")
    lf = ("# Adds two vectors.\n" + ADD_VECTORS).encode("utf-8")
    built_crlf = generate(decode(crlf, "a.pallas"), "a.pallas", "specs/a.pallas")
    assert built_crlf == generate(decode(lf, "a.pallas"), "a.pallas", "specs/a.pallas")
    assert "\r" not in built_crlf


def test_crlf_line_endings_keep_error_positions_and_carets():
    crlf = ADD_VECTORS.replace("x + y", "x + yy").replace("\n", "\r\n").encode("utf-8")
    error = spec_error(decode(crlf, "a.pallas"), "a.pallas")
    (diagnostic,) = error.diagnostics
    assert (diagnostic.position.line, diagnostic.position.column) == (5, 13)
    assert "\r" not in error.render()


def test_position_after_a_line_continuation_is_on_the_continued_line():
    source = ADD_VECTORS.replace("x + y", "x + \\\n        yy")
    (diagnostic,) = spec_error(source).diagnostics
    assert diagnostic.message.startswith("unknown name 'yy'")
    assert (diagnostic.position.line, diagnostic.position.column) == (6, 9)
