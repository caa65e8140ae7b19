"""``kxen-agent session grep PATTERN``: full-text search over every session's messages and tool results.

Registered on the ``session`` group by :func:`register` (session_cmds.py
calls it). The search reads the search index (:mod:`kxen_agent.session.grep_index`,
``objects_spec.md`` §11a.2), brought up to date from the objects first, so
the answer is the objects' whatever state the cache was in. A message
that several sessions share (forks) is reported once, with every session
whose history holds it.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Iterator, Optional

import typer

from kxen_agent.errors import UsageError

from ._args import since_ns
from ._render import emit_json, err, out, term_text as t

__all__ = ["register"]

_ROLES = ("user", "assistant", "tool", "compaction")


def register(session_app: typer.Typer) -> None:
    session_app.command("grep")(grep_cmd)


def matcher(pattern: str, *, regex: bool, ignore_case: bool) -> Any:
    """``match(buf, start, end)``: where each match begins. A plain pattern is found as bytes (memchr speed)."""
    raw = pattern.encode("utf-8")
    if "\n" in pattern:
        raise UsageError("a pattern matches within one line; give it without a newline")
    if not regex and not ignore_case:
        def find(buf: Any, start: int, end: int) -> Iterator[int]:
            pos = buf.find(raw, start, end)
            while pos >= 0:
                yield pos
                nl = buf.find(b"\n", pos, end)  # the rest of this line is reported once anyway
                if nl < 0:
                    return
                pos = buf.find(raw, nl + 1, end)
        return find
    try:
        rx = re.compile(raw if regex else re.escape(raw), re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
    except re.error as e:
        raise UsageError(f"--regex {pattern!r} is not a regular expression: {e}") from None

    def search(buf: Any, start: int, end: int) -> Iterator[int]:
        for m in rx.finditer(buf, start, end):
            yield m.start()
    return search


def grep_cmd(
    pattern: str = typer.Argument(..., metavar="PATTERN", help="The text to find (a regular expression with --regex)."),
    regex: bool = typer.Option(False, "--regex", "-E", help="PATTERN is a regular expression (Python's re syntax)."),
    ignore_case: bool = typer.Option(False, "--ignore-case", "-i", help="Match upper and lower case alike."),
    role: list[str] = typer.Option(
        [], "--role", metavar="ROLE", help="Only messages of this role: user, assistant, tool (repeatable)."),
    session: list[str] = typer.Option(
        [], "--session", "-s", metavar="SES", help="Only this session (an id, a prefix or a name; repeatable)."),
    since: Optional[str] = typer.Option(
        None, "--since", metavar="WHEN", help="Only messages of runs started since WHEN: a duration (2d) or a date."),
    sessions_only: bool = typer.Option(False, "-l", "--sessions-with-matches", help="Print only the sessions that match."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {pattern, matches: [{message, sessions, role, dateNs, seq, lineNumber, line}], "
                              "sessions}."),
) -> None:
    """Search every session's messages and tool results; print session, message, role, date and line.

    A message shared by forks is printed once, with every session whose
    history holds it (comma-separated). Each matching line is printed once.
    Reads the search index (a cache: kept up to date from the sessions, never
    needed; `kxen-agent fsck` checks it).

    \b
    Examples:
      kxen-agent session grep "AssertionError"
      kxen-agent session grep -E "def test_\\w+" --role assistant --since 1w
      kxen-agent session grep -l "migration" --session fix-login
    """
    from kxen_agent.session.grep_index import search
    from kxen_agent.session.sessions import NS, SessionStore
    from kxen_agent.store import Store

    bad = [r for r in role if r not in _ROLES]
    if bad:
        raise UsageError(f"--role {bad[0]!r}: expected one of {', '.join(_ROLES)}")
    match = matcher(pattern, regex=regex, ignore_case=ignore_case)
    cutoff = since_ns(since) if since is not None else None
    store = Store.open(namespaces=(NS,))
    if not store.exists:
        hits, only = [], None
    else:
        sessions = SessionStore(store)
        only = {sessions.resolve_id(s) for s in session} if session else None

        def damaged(group: str, e: Exception) -> None:
            err(f"kxen-agent: warning: not searched: {t(group, quote=False)}: {t(str(e), quote=False)}; "
                "`kxen-agent fsck` checks the state dir")

        hits, _figures = search(sessions, match, only=only, roles=set(role) or None, since_ns=cutoff,
                                sessions_only=sessions_only, on_damaged=damaged)
    matched = sorted({s for h in hits for s in h.sessions})
    if json_out:
        emit_json({"pattern": pattern, "sessions": matched, "matches": [] if sessions_only else [
            {"message": "msg_" + h.message.hex(), "sessions": list(h.sessions), "role": h.role,
             "dateNs": h.date_ns or None, "seq": h.seq, "lineNumber": h.line_no, "line": h.line} for h in hits]})
    elif sessions_only:
        for s in matched:
            out(s)
    else:
        # One write, not an echo per line: a common word can match tens of thousands of lines.
        dates: dict[int, str] = {0: "-"}
        lines = []
        for h in hits:
            when = dates.get(h.date_ns)
            if when is None:
                when = dates[h.date_ns] = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.date_ns / 1e9))
            lines.append(f"{','.join(h.sessions)} msg_{h.message.hex()[:16]} {h.role} {when}: {t(h.line, quote=False)}\n")
        sys.stdout.write("".join(lines))
        sys.stdout.flush()
    if not hits:
        raise typer.Exit(1)  # as grep and rg: nothing found
