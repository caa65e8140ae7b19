"""``session grep``'s printed lines (cli/grep_lean.py): escaped exactly as term_text escapes them, without
importing it for a line that is printable or printable once its tabs are escaped."""

from __future__ import annotations

import sys

from kxen_agent.cli._render import _UNSAFE_RE, term_text
from kxen_agent.cli.grep_lean import _safe


def test_every_character_term_text_escapes_is_one_isprintable_refuses() -> None:
    printable = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isprintable())
    assert _UNSAFE_RE.search(printable) is None


def test_a_line_is_escaped_as_term_text_escapes_it() -> None:
    lines = ["plain line", "   4\tfrom types import TracebackType", "\ttab\tand\x1b[31mESC", "a\\tb literal",
             "caf\u00e9 \u2014 ok", "bidi \u202e reversed", "C1 \x9b csi", "lone \udc80 byte", "\r\n inside", "",
             "nbsp\u00a0here", "\t"]
    for line in lines:
        assert _safe(line) == term_text(line, quote=False), line


def test_a_literal_prefix_finds_what_the_regex_engine_alone_finds(monkeypatch) -> None:
    import re

    import kxen_agent.cli.grep_lean as lean

    text = b"\n" + b"".join(b"def test_%d(x)\n  def testy\n\tdef test_ zz\nabcabd def test_q(\n" % i for i in range(300))
    patterns = [r"def test_\w+\(", r"abc|abd", r"def\s+test_[a-z]\(", r"test_\d{2}\(x\)$", r"de[f]"]
    for misses in (2000, 3):
        monkeypatch.setattr(lean, "_MAX_MISSES", misses)
        for pattern in patterns:
            first = lean.matcher(pattern, regex=True, ignore_case=False)
            rx = re.compile(pattern.encode(), re.MULTILINE)
            got, want, pos = [], [], 1
            while (p := first(text, pos, len(text))) >= 0:
                got.append(p)
                pos = text.index(b"\n", p) + 1
            pos = 1
            while (m := rx.search(text, pos, len(text))) is not None:
                want.append(m.start())
                pos = text.index(b"\n", m.start()) + 1
            assert got == want and want, (pattern, misses)


def test_the_literal_prefix_is_one_every_match_begins_with() -> None:
    """The prefix is read from the pattern's text (not ``re``'s private parser): each match starts with it."""
    import re

    from kxen_agent.cli.grep_lean import _literal_prefix

    cases = {rb"def test_\w+\(": b"def test_", rb"abc|abd": b"", rb"(?i)abc": b"", rb"ab*c": b"a", rb"ab+c": b"ab",
             rb"a\(b\)": b"a(b)", rb"a.c": b"a", rb"ab{2}": b"a", rb"x\dy": b"x", rb"\\n": b"\\n", rb"^abc": b"",
             rb"a?b": b"", rb"ab\+": b"ab+", rb"k=v;": b"k=v;"}
    text = b"\n".join([b"def test_x(", b"abd abc", b"ABC", b"ac abbbc abc", b"a(b)", b"abb", b"x1y", b"\\n",
                       b"b", b"ab+", b"k=v;", b"aXc"]) * 3
    for pattern, want in cases.items():
        assert _literal_prefix(pattern, re.MULTILINE) == want, pattern
        for m in re.finditer(pattern, text, re.MULTILINE):
            assert m.group().startswith(want), (pattern, m.group())
    assert _literal_prefix(rb"abc", re.MULTILINE | re.IGNORECASE) == b""
