"""``kxen-agent session rename SES NAME``: give a session a name, taken wherever an id or prefix is.

Registered on the ``session`` group by :func:`register` (session_cmds.py
calls it). The name's rules and where it lives are
:mod:`kxen_agent.session.names` (``objects_spec.md`` §14.16).
"""

from __future__ import annotations

from typing import Optional

import typer

from kxen_agent.errors import UsageError

from ._render import emit_json, out, term_text as t

__all__ = ["register"]


def register(session_app: typer.Typer) -> None:
    session_app.command("rename")(rename_cmd)


def rename_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id, a unique prefix of one, or its name."),
    name: Optional[str] = typer.Argument(None, metavar="NAME", help="The new name (unique in this state dir)."),
    clear: bool = typer.Option(False, "--clear", help="Take the session's name away instead."),
    json_out: bool = typer.Option(False, "--json", help="Print the session as `session show --json` does."),
) -> None:
    """Name a session: NAME then works wherever a session id does (--resume, show, fork, export, push...).

    A name is up to 100 letters, digits, '.', '_', '-', in parts joined by
    '/'; it must not look like an id (ses_..., hex digits only) and must be
    free in this state dir. A fork is named <parent's name>/<n> unless
    given --name.

    \b
    Examples:
      kxen-agent session rename ses_6508 fix-login
      kxen-agent --resume fix-login --task "and the logout too"
    """
    from kxen_agent.session.names import check_name, name_of, rename
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store

    if (name is None) == (not clear):
        raise UsageError("give either NAME or --clear: kxen-agent session rename SES NAME")
    if name is not None:
        check_name(name)  # refused before the state dir is opened
    sessions = SessionStore(Store.open(namespaces=("sessions",)))
    ses = sessions.resolve_id(ses)
    before = name_of(sessions.get(ses).meta)
    info = rename(sessions, ses, name)
    if json_out:
        emit_json(info.to_json())
        return
    if before == name:
        out(f"{ses} is named {t(str(name))} already" if name else f"{ses} has no name")
    elif name is None:
        out(f"{ses}: name {t(str(before))} removed")
    else:
        out(f"{ses} is now named {t(name)}" + (f" (was {t(before)})" if before else ""))
