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
