"""Option parsers the command modules share (``--workspace``), below all of them.

A parser takes the option's raw values and returns what the command needs,
or raises :class:`~kxen_agent.errors.UsageError` with a one-line message.
It calls nothing that writes. Living here, a parser two command modules
share needs neither of them to import the other.
"""

from __future__ import annotations

from kxen_agent.errors import UsageError

from ._render import term_text as t

__all__ = ["workspaces"]


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
