"""Option parsers the command modules share (``--workspace``, ``--since``), below all of them.

A parser takes the option's raw values and returns what the command needs,
or raises :class:`~kxen_agent.errors.UsageError` with a one-line message.
It calls nothing that writes. Living here, a parser two command modules
share needs neither of them to import the other.
"""

from __future__ import annotations

from kxen_agent.errors import UsageError

from ._render import term_text as t

__all__ = ["since_ns", "workspaces"]


def workspaces(values: list[str]) -> tuple[str, dict[str, str]]:
    """``--workspace`` values: one DIR (the default binding), and SES=DIR for sessions bound elsewhere."""
    from kxen_agent.session.sessions import is_id_or_prefix

    default: list[str] = []
    per_session: dict[str, str] = {}
    for v in values:
        ses, eq, d = v.partition("=")
        if eq and is_id_or_prefix("ses", ses):  # an id or a unique prefix of one of the bundle's sessions
            if not d:
                raise UsageError(f"--workspace {t(ses, quote=False)}= names no directory; give SES=DIR")
            if ses in per_session:
                raise UsageError(f"--workspace {t(ses, quote=False)}=DIR is given twice; give each session once")
            per_session[ses] = d
        else:
            default.append(v)
    if len(default) != 1:
        raise UsageError(f"give exactly one --workspace DIR (the default binding), got {len(default)}; "
                         "bind single sessions elsewhere with --workspace SES=DIR")
    return default[0], per_session


def since_ns(text: str) -> int:
    """``--since`` (``session list``, ``session grep``): a duration back from now (2d, 1w, 12h...) or a date
    (2025-01-31, 2025-01-31T10:00), as nanoseconds since the epoch."""
    import time
    from datetime import datetime

    from kxen_agent.store.gc import BadDuration, parse_duration

    try:
        return int(datetime.fromisoformat(text.strip()).timestamp() * 1e9)
    except ValueError:
        pass
    try:
        secs = parse_duration(text)
    except BadDuration:
        raise UsageError(f"--since {text!r} is neither a duration (2d, 1w, 12h) nor a date (2025-01-31)") from None
    if secs is None:
        raise UsageError("--since never leaves nothing to match; give a duration (2d, 1w) or a date (2025-01-31)")
    return time.time_ns() - int(secs * 1e9)
