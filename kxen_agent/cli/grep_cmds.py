"""``kxen-agent session grep PATTERN``: full-text search over every session's messages and tool results.

Registered on the ``session`` group by :func:`register` (session_cmds.py
calls it); the work, and the command line read without typer that the
console script tries first, are :mod:`.grep_lean`'s. The search reads the search index (:mod:`kxen_agent.session.grep_index`,
``objects_spec.md`` §11a.2), brought up to date from the objects first, so
the answer is the objects' whatever state the cache was in. A message
that several sessions share (forks) is reported once, with every session
whose history holds it.
"""

from __future__ import annotations

from typing import Optional

import typer

from .grep_lean import grep

__all__ = ["register"]


def register(session_app: typer.Typer) -> None:
    session_app.command("grep")(grep_cmd)


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
    # The work is grep_lean's, which the console script also runs without typer (a command line it reads).
    code = grep(pattern, regex=regex, ignore_case=ignore_case, role=role, session=session, since=since,
                sessions_only=sessions_only, json_out=json_out)
    if code:
        raise typer.Exit(code)  # as grep and rg: nothing found
