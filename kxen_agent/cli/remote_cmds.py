"""``kxen-agent session push|pull|ls-remote``: sessions through the repository's Git remote.

Registered on the ``session`` group by :func:`register` (main.py calls it;
this module must not import main.py). Each command calls
:mod:`kxen_agent.session.remote` (push),
:mod:`kxen_agent.session.remote_pull` (pull) or
:mod:`kxen_agent.session.remote_listing` (ls-remote) and renders text or
``--json``; its errors are :class:`~kxen_agent.errors.KxenError`
subclasses that main.py prints as one line and maps to an exit code (1:
refused or unreachable, 75: another machine holds the session's remote
lease). The ``run`` and
``--resume`` side (``--remote-lease``) is :mod:`kxen_agent.runtime.remote_lease`.
"""

from __future__ import annotations

import os
import time
from typing import Optional

import typer

from kxen_agent.session.sessions import NS
from kxen_agent.store import Store

from ._args import workspaces
from ._render import emit_json, err, out, term_text as t

__all__ = ["register"]

_REMOTE_HELP = "A remote of the workspace's repository, or a URL (default: origin)."


def register(session_app: typer.Typer) -> None:
    session_app.command("push")(push_cmd)
    session_app.command("pull")(pull_cmd)
    session_app.command("ls-remote")(ls_remote_cmd)


def push_cmd(
    sessions: list[str] = typer.Argument(
        ..., metavar="SES...", help="Sessions to push, ids or unique prefixes (each to its workspace's remote)."),
    remote: Optional[str] = typer.Option(None, "--remote", metavar="NAME_OR_URL", help=_REMOTE_HELP),
    with_branch: bool = typer.Option(False, "--with-branch", help="Also push a worktree fork's kxen/NAME branch."),
    allow_secrets: bool = typer.Option(
        False, "--allow-secrets", help="Push even if the scan finds text that looks like a credential (warned of)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {pushes: [{remote, sessions, commits, newObjects, branches}]} as JSON."),
    with_checkpoints: bool = typer.Option(
        False, "--with-checkpoints", help="Also push refs/kxen/checkpoints/SES (scanned for credentials first)."),
) -> None:
    """Push sessions to refs/kxen/sessions/SES of their remote: atomic, fast-forward only, incremental.

    Every object of the sessions is first scanned for text that looks like
    a credential (as `session export --scan`): if any is found, nothing is
    pushed unless --allow-secrets is given.

    \b
    Examples:
      kxen-agent session push ses_6508
      kxen-agent session push ses_6508 --remote backup --with-branch
    """
    from kxen_agent.errors import KxenError
    from kxen_agent.session.remote import push_sessions
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.transfer import session_objects

    from .secret_scan import SecretScan

    store = Store.open(namespaces=(NS,))
    full = [SessionStore(store).resolve_id(s) for s in sessions]
    # A remote is shared and keeps what it is given: look before anything leaves.
    found = SecretScan()
    for obj in session_objects(store, full):
        found(obj)
    found.warn(f"push of {', '.join(t(s) for s in full)}")
    if found.hits and not allow_secrets:
        raise KxenError(f"refusing to push: the sessions hold {len(found.hits)} text(s) that look like credentials "
                        "(listed above); nothing was pushed — remove them (fork the session before them), or give "
                        "--allow-secrets to push anyway")
    from .checkpoint_travel_cmds import note_stays_behind, push_with_checkpoints

    if with_checkpoints:  # first: the remote never names checkpoints asked for that it lacks
        push_with_checkpoints(store, full, remote, allow_secrets=allow_secrets)
    reports = push_sessions(store, full, remote=remote, with_branch=with_branch)
    if not with_checkpoints:  # once pushed: a refused push stays one line
        note_stays_behind(store, full)
    if json_out:
        emit_json({"pushes": [r.to_json() for r in reports]})
        return
    for r in reports:
        for ses, status in r.sessions.items():
            if status == "up-to-date":
                out(f"{t(ses)}: up to date on {t(r.remote.display)}")
            else:
                out(f"{t(ses)}: {status} on {t(r.remote.display)} ({r.new_objects.get(ses, 0)} new objects, "
                    f"commit {r.commits[ses][:12]})")
        for ref, oid in r.branches.items():
            out(f"branch {t(ref[len('refs/heads/'):])}: {oid[:12]} on {t(r.remote.display)}")


def _workspaces(values: list[str]) -> tuple[str, dict[str, str]]:
    """``--workspace`` values as ``session import`` reads them, the current directory being the default DIR."""
    from kxen_agent.session.sessions import is_id_or_prefix

    if all(v.partition("=")[1] and is_id_or_prefix("ses", v.partition("=")[0]) for v in values):
        values = [*values, os.getcwd()]
    return workspaces(values)


def pull_cmd(
    sessions: list[str] = typer.Argument(..., metavar="SES...", help="Sessions to pull."),
    remote: Optional[str] = typer.Option(None, "--remote", metavar="NAME_OR_URL", help=_REMOTE_HELP),
    workspace: list[str] = typer.Option(
        [], "--workspace", "-w", metavar="DIR|SES=DIR",
        help="The workspace a new session is bound to (default: the current directory; its repository names "
             "the remote); SES=DIR binds one session elsewhere (a worktree fork: a worktree of its branch)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {remote, sessions, newObjects, workspaces} as JSON."),
    with_checkpoints: bool = typer.Option(
        False, "--with-checkpoints", help="Also fetch the sessions' checkpoints into the workspace repository."),
    restore_workspace: bool = typer.Option(
        False, "--restore-workspace", help="Fetch the checkpoints and write the last one into the workspace."),
) -> None:
    """Fetch sessions, verify every object, then fast-forward them here (or create them, bound to DIR).

    \b
    Example:
      kxen-agent session pull ses_6508d1c2e0f4a9b7c3d5 --workspace /workspace/repo
    """
    from kxen_agent.runtime.lease import Lease, lease_ttl_s
    from kxen_agent.session.remote_pull import pull_sessions

    lease_ttl_s()  # a bad KXEN_AGENT_LEASE_TTL_S is refused before anything is fetched
    default, per_session = _workspaces(workspace)
    store = Store.open(namespaces=(NS,))
    rep = pull_sessions(store, sessions, default, workspaces=per_session, remote=remote,
                        acquire_lease=lambda ses: Lease.acquire(store, ses, purpose="import"))
    if with_checkpoints or restore_workspace:
        from .checkpoint_travel_cmds import pull_checkpoints, restore

        pull_checkpoints(store, list(rep.sessions), remote, quiet=json_out)
        if restore_workspace:
            restore(store, list(rep.sessions), quiet=json_out)
    if json_out:
        emit_json(rep.to_json())
        return
    for ses, status in rep.sessions.items():
        note = {"ahead": "this state dir is ahead of the remote (push it)"}.get(status, status)
        out(f"{t(ses)}: {note}, bound to {t(rep.bindings[ses])}")
    for gone in rep.dropped_names:
        err(f"note: {t(gone.line(), quote=False)}")
    out(f"pulled from {t(rep.remote.display)}: {rep.new_objects} new objects; "
        f"resume with `kxen-agent --resume SES --workspace DIR`")


def ls_remote_cmd(
    remote: Optional[str] = typer.Option(None, "--remote", metavar="NAME_OR_URL", help=_REMOTE_HELP),
    workspace: Optional[str] = typer.Option(None, "--workspace", "-w", metavar="DIR",
                                            help="The repository whose remote to list (default: the current directory)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {remote, sessions: [{id, commit, head, run, runStatus, lease, local...}]} as JSON."),
) -> None:
    """The sessions on the remote: heads, forks, last run and lease, and how each stands to this state dir's.

    `local` says `absent`, `same`, `ahead` (push it), `behind` (pull it) or
    `diverged` (neither fast-forwards); for a session that differs, its new
    objects are fetched and verified to tell which (nothing is written).

    \b
    Example:
      kxen-agent session ls-remote --remote origin
    """
    from kxen_agent.session.remote_listing import ls_remote

    store = Store.open(namespaces=(NS,))
    listing = ls_remote(store, workspace or os.getcwd(), remote=remote)
    differ = [s["id"] for s in listing.sessions if s.get("local") == "differs"]
    if differ:  # the tips alone tell "same" and "ahead"; behind or diverged takes the objects
        from kxen_agent.session.remote_pull import compare_with_remote

        how = compare_with_remote(store, differ, workspace or os.getcwd(), remote=remote)
        for s in listing.sessions:
            if s["id"] in how:
                s["local"] = how[s["id"]]
    if json_out:
        emit_json(listing.to_json())
        return
    if not listing.sessions:
        out(f"no sessions on {t(listing.remote.display)}")
        return
    now = time.time_ns()
    for s in listing.sessions:
        if "error" in s:
            out(f"{t(s['id'])}  (unreadable: {t(s['error'])})")
            continue
        run = f"{t(s['runStatus'])} ({t(s['run'])})" if s["run"] else "no runs"
        fork = f"  fork of {t(s['parentId'])} ({t(s['forkKind'] or '-')})" if s["parentId"] else ""
        lease = s.get("lease")
        held = ""
        if lease and "error" not in lease:
            left = (lease["expiresNs"] - now) / 1e9
            held = (f"  leased by {t(lease['host'])} ({t(lease['run'] or '-')}, "
                    + (f"expires in {left:.0f}s)" if left > 0 else "expired)"))
        out(f"{t(s['id'])}  {run:<40} {s['messages'] if s['messages'] is not None else '?':>6} msgs  "
            f"local: {s['local']}{fork}{held}")
