"""``kxen-agent session which COMMIT``: the session, run, message and tool call that made a Git commit.

Registered on the ``session`` group by :func:`register` (session_cmds.py
calls it); the reading is :mod:`kxen_agent.session.commit_links`.
"""

from __future__ import annotations

import os
from typing import Optional

import typer

from ._render import emit_json, out, term_text as t

__all__ = ["register"]


def register(session_app: typer.Typer) -> None:
    session_app.command("which")(which_cmd)


def which_cmd(
    commit: str = typer.Argument(..., metavar="COMMIT", help="A commit of the workspace repository (any revision)."),
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR", help="The repository to look in (default: this directory)."),
    json_out: bool = typer.Option(False, "--json", help="Print {commit, madeBy: [{sessions, run, message, op, tool, "
                                                        "headBefore, headAfter}]}."),
) -> None:
    """Name the tool call that made COMMIT: its sessions, run, message and operation.

    Read from the workspace checkpoints taken around every tool call that
    may change files: the commits a call made are those its HEAD gained
    (old..new, amends and rebases included). A commit no tool call made
    (your own) is found by none: exit 1.

    \b
    Example:
      kxen-agent session which HEAD~2
    """
    from kxen_agent.session.commit_links import which
    from kxen_agent.session.sessions import NS, SessionStore
    from kxen_agent.store import Store

    store = Store.open(namespaces=(NS,))
    where = workspace or os.getcwd()
    if not store.exists:
        full, links = commit, []
    else:
        full, links = which(SessionStore(store), commit, where)
    if json_out:
        emit_json({"commit": full, "madeBy": [link.to_json() for link in links]})
    elif not links:
        out(f"commit {t(full)} was made by no tool call of a session here (a commit of your own, or of a session "
            "this state dir does not hold)")
    for link in links if not json_out else ():
        out(f"commit {link.commit[:12]}: session {','.join(link.sessions)} run {link.run} "
            f"msg_{link.message.hex()[:16]} {link.op} ({t(link.tool)})")
    if not links:
        raise typer.Exit(1)
