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
