"""``session grep``'s work, and its lean start: the command line read and the search run without typer.

``kxen-agent session grep`` is measured as a whole process against ``rg``
(issue #30, ``bench/grep.py``), and importing typer, the root command and
the ``session`` group costs more than a search through the index does.
So the console script (:mod:`.start`) hands a ``session grep`` command
line to :func:`main` before anything else is imported: :func:`parse`
reads the command lines that click would read into values (options before
or after PATTERN, ``--opt=value`` and ``--opt value``, a cluster of short
flags such as ``-il``, ``-sSES``) and :func:`grep` runs the search. Any
other command line (``--help``, ``--``, an unknown option, a missing or
an extra PATTERN, an option's value that begins with ``-``,
``KXEN_AGENT_IO_FAULT`` set) gets None from :func:`parse` and goes
through typer like every other command, so that its messages are click's
own. The typer command (:mod:`.grep_cmds`) calls the same :func:`grep`:
one search, one output, one set of errors, whichever way in
(``tests/session/test_grep_lean.py`` holds the two ways equal).

The search itself starts lean too: while the search index's stamp says
no session's ref file or step log changed since a search read them
(:mod:`kxen_agent.session.grep_stamp`, ``objects_spec.md`` §11a.2), the
index files are searched without importing the store or reading a ref;
anything else (and ``--session`` given a prefix or a name) goes the long
way, which opens the store, brings the index up to date and writes the
stamp again.
"""

from __future__ import annotations

import os
import sys
import time
TYPE_CHECKING = False  # typing's own value at run time: not imported on the lean start (session/grep_format.py)
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

from kxen_agent.errors import KxenError, UsageError

# ._render (json, its regular expressions) is imported where it is needed: not for printable lines.

__all__ = ["grep", "main", "matcher", "parse"]

#: The options of ``session grep`` (grep_cmds.grep_cmd declares them for typer): flag -> parameter.
_FLAGS = {"--regex": "regex", "-E": "regex", "--ignore-case": "ignore_case", "-i": "ignore_case",
          "-l": "sessions_only", "--sessions-with-matches": "sessions_only", "--json": "json_out"}
#: Options that take a value -> parameter (``--role`` and ``--session`` repeatable, ``--since`` the last given).
_VALUES = {"--role": "role", "--session": "session", "-s": "session", "--since": "since"}


def matcher(pattern: str, *, regex: bool, ignore_case: bool) -> Any:
    """``first(buf, pos, end)``: where the first match in ``buf[pos:end]`` begins, -1 if none. A plain
    pattern is found as bytes (``bytes.find``); a search resumes after the line of the last match."""
    raw = pattern.encode("utf-8")
    if "\n" in pattern:
        raise UsageError("a pattern matches within one line; give it without a newline")
    if not regex and not ignore_case:
        def find(buf: Any, pos: int, end: int) -> int:
            return buf.find(raw, pos, end)
        find.literal = raw  # type: ignore[attr-defined]  # the scan calls buf.find itself: no call per line
        return find
    import re  # here: a plain pattern needs no regular expression (the lean start's cost)

    try:
        rx = re.compile(raw if regex else re.escape(raw), re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
    except re.error as e:
        raise UsageError(f"--regex {pattern!r} is not a regular expression: {e}") from None
    search = rx.search
    prefix = _literal_prefix(raw, re.MULTILINE) if regex and not ignore_case else b""
    if len(prefix) < 3:
        def first(buf: Any, pos: int, end: int) -> int:
            m = search(buf, pos, end)  # pos is a line's start (or the text's, after its LF): ^ matches there
            return -1 if m is None else m.start()
        return first
    # Every match begins with ``prefix``: the leftmost match is at the first of its places (bytes.find, faster
    # than the regex engine's own scan) where the pattern matches. Should the prefix be common and rarely
    # begin a match, the regex engine scans alone again after a bounded number of misses.
    at = rx.match
    misses = 0

    def first_of(buf: Any, pos: int, end: int) -> int:
        nonlocal misses
        while misses < _MAX_MISSES:
            p = buf.find(prefix, pos, end)
            if p < 0 or at(buf, p, end) is not None:
                return p
            misses += 1
            pos = p + 1
        m = search(buf, pos, end)
        return -1 if m is None else m.start()
    return first_of


#: Places of a regular expression's literal prefix where it did not match, after which its engine scans alone.
_MAX_MISSES = 2000


#: Bytes that stand for themselves in a pattern outside a class (VERBOSE off): ASCII letters, digits and
#: punctuation with no meaning to ``re``. Anything else ends a literal prefix.
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ -:;,'\"=<>/@%&!~`#")
#: Punctuation whose backslash escape is the character itself.
_ESCAPED = frozenset(b".^$*+?{}[]()|\\/-")


def _literal_prefix(raw: bytes, flags: int) -> bytes:
    """The literal bytes every match of the pattern ``raw`` begins with (b"" when none is known).

    A conservative reading of the pattern's text, not of ``re``'s private
    parser (which another Python may change): plain characters and escaped
    punctuation up to the first thing that is neither, a character made
    optional by ``*``, ``?`` or ``{`` is left out, one followed by ``+`` ends
    the prefix after it. A pattern with ``|`` anywhere, an ignored case or
    VERBOSE has none.
    """
    import re

    if flags & (re.IGNORECASE | re.VERBOSE) or b"|" in raw:
        return b""
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c in _PLAIN:
            lit, j = c, i + 1
        elif c == 0x5C and i + 1 < n and raw[i + 1] in _ESCAPED:  # backslash
            lit, j = raw[i + 1], i + 2
        else:
            break
        if j < n and raw[j] in b"*?{":
            break
        out.append(lit)
        if j < n and raw[j] == 0x2B:  # '+': at least one, then who knows
            break
        i = j
    return bytes(out)


def grep(pattern: str, *, regex: bool = False, ignore_case: bool = False, role: Sequence[str] = (),
         session: Sequence[str] = (), since: Optional[str] = None, sessions_only: bool = False,
         json_out: bool = False) -> int:
    """Search and print (see ``grep_cmds.grep_cmd``); 0 when something matched, 1 when nothing did."""
    from kxen_agent.session.grep_format import ROLES

    bad = [r for r in role if r not in ROLES]
    if bad:
        raise UsageError(f"--role {bad[0]!r}: expected one of {', '.join(ROLES)}")
    match = matcher(pattern, regex=regex, ignore_case=ignore_case)
    if since is not None:
        from ._args import since_ns

        cutoff: int | None = since_ns(since)
    else:
        cutoff = None
    hits = None
    if not os.environ.get("KXEN_AGENT_IO_FAULT"):
        # Nothing changed since a search read the refs (the index's stamp says so): no store, no ref read. (A
        # fault spec's file operations are the store's seam's to count: the long way, whichever way in.)
        from kxen_agent.session.grep_stamp import lean_search, state_dir

        hits = lean_search(state_dir(), match, roles=set(role) or None, since_ns=cutoff, sessions_only=sessions_only,
                           sessions=tuple(session))
    if hits is None:
        hits = _search(match, role=role, session=session, cutoff=cutoff, sessions_only=sessions_only)
    matched = sorted({s for h in hits for s in h.sessions})
    if json_out:
        from ._render import emit_json

        emit_json({"pattern": pattern, "sessions": matched, "matches": [] if sessions_only else [
            {"message": "msg_" + h.message.hex(), "sessions": list(h.sessions), "role": h.role,
             "dateNs": h.date_ns or None, "seq": h.seq, "lineNumber": h.line_no, "line": h.line} for h in hits]})
    elif sessions_only:
        sys.stdout.write("".join(s + "\n" for s in matched))  # ids: ses_ and letters and digits, nothing to escape
    else:
        sys.stdout.write(_text(hits))  # one write, not an echo per line: a common word matches thousands
    sys.stdout.flush()
    return 0 if hits else 1  # as grep and rg: 1 when nothing is found


def _text(hits: list) -> str:
    """The printed lines of ``hits``: ``SESSIONS MESSAGE ROLE DATE: LINE``, each message's prefix made once."""
    dates: dict[int, str] = {0: "-"}
    lines: list[str] = []
    add = lines.append
    message = sessions = names = prefix = None
    for h in hits:
        if h.message is not message or h.sessions is not sessions:  # the lines of one message share it
            if h.sessions is not sessions:
                names = ",".join(h.sessions)
            message, sessions = h.message, h.sessions
            when = dates.get(h.date_ns)
            if when is None:
                when = dates[h.date_ns] = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.date_ns / 1e9))
            prefix = f"{names} msg_{h.message.hex()[:16]} {h.role} {when}: "
        add(prefix + _safe(h.line) + "\n")  # type: ignore[operator]
    return "".join(lines)


def _safe(line: str) -> str:
    """``term_text(line, quote=False)``, without importing it for the lines that need no escape or only their
    tabs escaped (a file shown with line numbers: most matching lines of tool output). Every character term_text
    escapes is one str.isprintable refuses (tests/session/test_grep_output.py holds it so), so a printable line
    is its own escape, and a line printable once its tabs are ``\\t`` is term_text's too."""
    if line.isprintable():
        return line
    tabbed = line.replace("\t", "\\t")
    return tabbed if tabbed.isprintable() else _term(line)


def _search(match: Any, *, role: Sequence[str], session: Sequence[str], cutoff: int | None,
            sessions_only: bool) -> list:
    """The hits the long way: the store opened, the refs read, the index brought up to date (and stamped)."""
    from kxen_agent.session.grep_index import NS, search
    from kxen_agent.store import Store

    store = Store.open(namespaces=(NS,))
    if not store.exists:
        return []
    only = None
    if session:
        from kxen_agent.session.sessions import SessionStore  # a warm search without --session reads no object

        sessions = SessionStore(store)
        only = {sessions.resolve_id(s) for s in session}

    def damaged(group: str, e: Exception) -> None:
        from ._render import err, term_text as t

        err(f"kxen-agent: warning: not searched: {t(group, quote=False)}: {t(str(e), quote=False)}; "
            "`kxen-agent fsck` checks the state dir")

    hits, _figures = search(store, match, only=only, roles=set(role) or None, since_ns=cutoff,
                            sessions_only=sessions_only, on_damaged=damaged)
    return hits


def _term(line: str) -> str:
    from ._render import term_text

    return term_text(line, quote=False)


def parse(args: list[str]) -> dict[str, Any] | None:
    """:func:`grep`'s keyword arguments from ``session grep``'s arguments, as click reads them; None for a
    command line that only typer and click can answer (help, a usage error)."""
    got: dict[str, Any] = {"regex": False, "ignore_case": False, "sessions_only": False, "json_out": False,
                           "role": [], "session": [], "since": None}
    patterns: list[str] = []
    rest = list(args)
    rest.reverse()  # popped from the end: the next argument

    def value(name: str, v: str) -> bool:
        if v.startswith("-"):
            return False  # click would take it as the value; what was meant is click's to say
        if name == "since":
            got["since"] = v
        else:
            got[name].append(v)
        return True

    while rest:
        a = rest.pop()
        if a.startswith("--"):
            name, eq, v = a.partition("=")
            if name in _FLAGS and not eq:
                got[_FLAGS[name]] = True
            elif name in _VALUES and (eq or rest):
                if not value(_VALUES[name], v if eq else rest.pop()):
                    return None
            else:
                return None  # "--" itself, --help, an unknown option, a flag given a value, a value missing
        elif a.startswith("-") and len(a) > 1:
            for i in range(1, len(a)):
                opt = "-" + a[i]
                if opt in _FLAGS:
                    got[_FLAGS[opt]] = True
                    continue
                if opt in _VALUES and (i + 1 < len(a) or rest):
                    if not value(_VALUES[opt], a[i + 1:] if i + 1 < len(a) else rest.pop()):
                        return None
                    break
                return None  # -h, an unknown letter, a value missing
        elif a == "-":
            return None
        else:
            patterns.append(a)
    if len(patterns) != 1:
        return None  # PATTERN missing, or an extra argument: click's usage error
    got["pattern"] = patterns[0]
    return got


def main(args: list[str]) -> int | None:
    """The exit code of ``kxen-agent ARGS`` when ARGS is a ``session grep`` command line :func:`parse`
    reads, errors printed as ``main.main`` prints them; None for any other (typer's to run)."""
    if args[:2] != ["session", "grep"] or os.environ.get("KXEN_AGENT_IO_FAULT"):
        return None  # a fault spec is checked (and a bad one refused) by main.main
    opts = parse(args[2:])
    if opts is None:
        return None
    try:
        return grep(**opts)
    except KxenError as e:
        from ._render import err

        err(f"kxen-agent: error: {_term(str(e))}")
        return e.exit_code
    except KeyboardInterrupt:
        return 130  # as typer returns it from inside a command: no line
    except BrokenPipeError:
        # The reader (`| head`) went away: exit as git does, and leave nothing for the exit's flush to fail on.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except OSError as e:
        from ._errors import os_error_line
        from ._render import err

        err(f"kxen-agent: error: {_term(os_error_line(e))}")
        return 1
