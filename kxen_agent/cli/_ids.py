"""Ids as users type them: full ids or unique prefixes of ``ses_``, ``run_`` and ``op_`` ids.

The CLI resolves every id it is given here, once, before it calls the
library, which takes full ids only (a lease record, a ref name, a message
must name the real id). An ambiguous prefix is a usage error (exit 2) that
lists the candidates, as Git's "short object ID is ambiguous" does. This
module must never write anything.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kxen_agent.errors import KxenError

if TYPE_CHECKING:
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.sessions import SessionInfo, SessionStore

__all__ = ["NoSuchRun", "resolve_op", "resolve_run", "resolve_session"]

_FULL_OP = re.compile(r"op_[0-9a-f]{20}")


class NoSuchRun(KxenError):
    """A run or operation id (or prefix) names nothing in the session."""


def resolve_session(sessions: SessionStore, text: str, *, include_deleted: bool = False) -> str:
    """The full id of the session ``text`` names (an id or a unique prefix)."""
    return sessions.resolve_id(text, include_deleted=include_deleted)


def resolve_run(runner: Runner, info: SessionInfo, text: str | None) -> str:
    """The run ``text`` names in ``info`` (an id or a unique prefix); None: the latest run."""
    from kxen_agent.session.sessions import resolve_prefix

    if text is None:
        latest = runner.latest_run(info)
        if latest is None:
            raise NoSuchRun(f"session {info.id} has no runs yet; start one with "
                            f"`kxen-agent --resume {info.id} --task TEXT`")
        return latest[0]
    found = resolve_prefix("run", "run", text, lambda: list(info.runs), f"in session {info.id}")
    if found is None:
        raise NoSuchRun(f"run {text.strip()} is not in session {info.id}; "
                        f"`kxen-agent session show {info.id}` lists its runs")
    return found


def resolve_op(runner: Runner, info: SessionInfo, run: str | None, text: str) -> tuple[str, str]:
    """``(run, op)`` for the operation ``text`` names (an id or a unique prefix).

    With ``run`` the operation is looked up in that run's journal; without,
    in every run of the session, so ``run resolve SES OP`` finds the run.
    """
    from kxen_agent.session.sessions import resolve_prefix

    if run is not None and _FULL_OP.fullmatch(text.strip()):
        # A whole id goes as it is: the runner judges it under the session's
        # lease (a busy session is refused first, exit 75).
        return run, text.strip()
    runs = [run] if run is not None else sorted(info.runs)
    owner: dict[str, str] = {}
    for r in runs:
        _oid, st = runner.run_state(info, r)
        for op in runner.ops(st):
            owner[op] = r
    where = f"in run {run}" if run is not None else f"in the runs of session {info.id}"
    op = resolve_prefix("operation", "op", text, lambda: list(owner), where)
    if op is None:
        show = f"kxen-agent run show {info.id} {run}" if run is not None else f"kxen-agent run show {info.id}"
        raise NoSuchRun(f"operation {text.strip()} is not {where}; `{show}` lists its operations")
    return owner[op], op
