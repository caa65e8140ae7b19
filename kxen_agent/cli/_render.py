"""Rendering helpers shared by the commands: JSON, one-line errors, progress.

Stored text (a workspace root, a task, a message, an id read from an
imported bundle) reaches a terminal only through :func:`term_text` (or
:func:`term_block` for a message printed as a block), and JSON only
through :func:`dumps_json`: what a bundle's author wrote cannot move the
cursor, recolour or retitle the terminal, reorder the line, or fake a line
of output.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Iterator

# What a terminal acts on instead of showing: C0 controls, DEL and C1
# controls (ESC starts escape sequences; U+009B is an 8-bit CSI), the line
# and paragraph separators, and the bidirectional marks, embeddings,
# overrides and isolates (they reorder what follows, "Trojan Source").
# Lone surrogates (undecodable argv bytes, via surrogateescape) cannot be
# encoded for the terminal at all.
# (regex class ranges, escaped for re; the tab is separate so a block can keep it)
_UNSAFE = r"\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(rf"[\t{_UNSAFE}]")
_UNSAFE_OR_QUOTE_RE = re.compile(rf'[\t{_UNSAFE}"\\]')
_UNSAFE_BUT_TAB_RE = re.compile(rf"[{_UNSAFE}]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape: the byte as it was given
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def term_text(text: Any, *, quote: bool = True) -> str:
    """``text`` made safe for one terminal line; unchanged when it already is.

    Like Git's quoting of paths: a text holding a control character (see
    ``_UNSAFE``) is printed in double quotes with C-style escapes (``\\n``,
    ``\\t``, ``\\r``, ``\\x1b``, ``\\u202e``; ``"`` and ``\\`` escaped too,
    so the quoted form reads back unambiguously); any other text, including
    non-ASCII letters, is printed as is. ``quote=False`` only escapes the
    control characters, without quotes: for a whole error line, where the
    text is one part among others. A non-string is shown as ``str(text)``.
    """
    if not isinstance(text, str):
        text = str(text)
    if not _UNSAFE_RE.search(text):
        return text
    if not quote:
        return _UNSAFE_RE.sub(_escape, text)
    return '"' + _UNSAFE_OR_QUOTE_RE.sub(_escape, text) + '"'


def term_block(text: str) -> Iterator[str]:
    """The lines of a multi-line stored text (a message), each safe for the terminal.

    A block keeps its newlines (as line breaks) and tabs; every other
    control character is escaped as by :func:`term_text` without quotes,
    a carriage return included (it would overwrite the line's indent).
    """
    for line in text.rstrip("\n").split("\n"):
        yield _UNSAFE_BUT_TAB_RE.sub(_escape, line)


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


# What json.dumps(ensure_ascii=False) leaves raw although a terminal acts on
# it. Outside strings json.dumps writes only ASCII, so each of these is
# inside a string, where its \\u escape (e.g. \\u001b) is the same
# character to any JSON reader.
_JSON_UNSAFE_RE = re.compile(r"[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def dumps_json(value: Any, indent: int | None = None) -> str:
    """``json.dumps`` of ``value`` (UTF-8 text kept readable) with nothing a terminal acts on.

    The value read back is exactly ``value``: only the escaping differs.
    """
    text = json.dumps(value, indent=indent, sort_keys=False, ensure_ascii=False)
    return _JSON_UNSAFE_RE.sub(_json_escape, text)


def emit_json(value: Any) -> None:
    sys.stdout.write(dumps_json(value, indent=2) + "\n")


def out(line: str = "") -> None:
    import typer  # here, not at the top: `session grep`'s lean start (grep_lean.py) renders without typer

    typer.echo(line)


def err(line: str) -> None:
    import typer

    Progress.clear()  # an error line never lands after a counter on the same line
    typer.echo(line, err=True)


def out_text(label: str, text: str) -> None:
    """``label: text`` for a one-line stored text; ``label:`` then the text as an indented block otherwise."""
    one = text.rstrip("\n")
    if "\n" not in one:
        out(f"{label}: {term_text(one)}")
        return
    out(f"{label}:")
    for line in term_block(text):
        out(f"    {line}")


def to_jsonable(v: Any) -> Any:
    """CBOR-model values as JSON: links (bytes) become hex strings."""
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: to_jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_jsonable(x) for x in v]
    return v


class Progress:
    """A one-line progress counter on an interactive stderr, erased when done (or when an error line
    comes); silent otherwise: nothing of it is ever printed off a terminal."""

    #: Whether a counter is on the terminal's current line now (what :meth:`clear` erases).
    _showing = False

    def __init__(self, label: str, total: int | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.n = 0
        self.enabled = enabled and sys.stderr.isatty()
        self._last = -1

    def __call__(self, k: int = 1) -> None:
        self.n += k
        if not self.enabled:
            return
        pct = None if not self.total else int(100 * self.n / self.total)
        key = pct if pct is not None else self.n // 1000
        if key == self._last:
            return
        self._last = key
        msg = f"\r{self.label}: {self.n}" + (f"/{self.total} ({pct}%)" if pct is not None else "")
        sys.stderr.write(msg + "\x1b[K")
        sys.stderr.flush()
        Progress._showing = True

    def done(self) -> None:
        """The work is over: the counter is erased (the command's own lines say what was done)."""
        Progress.clear()

    @staticmethod
    def clear() -> None:
        """Erase the counter on the terminal's current line, if one is there."""
        if Progress._showing:
            Progress._showing = False
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def usage_line(usage: dict | None) -> str:
    """``1234 input tokens (1000 cached), 56 output tokens`` for a §14.5 usage map; says when none was reported."""
    if usage is None:
        return "not reported by the provider"
    cached = f" ({usage['cachedTokens']} cached)" if "cachedTokens" in usage else ""
    turns = f" over {usage['turns']} turn{'' if usage['turns'] == 1 else 's'}" if "turns" in usage else ""
    return f"{usage['inputTokens']} input tokens{cached}, {usage['outputTokens']} output tokens{turns}"
