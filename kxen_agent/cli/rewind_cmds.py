"""``kxen-agent session rewind``: the workspace back to a checkpoint, the conversation back as a fork, or both.

The code side is :mod:`kxen_agent.session.checkpoint_restore` (durable,
crash-safe, undoable); the conversation side is an ordinary fork at the
message (the old branch stays). The command holds the session's lease while
it writes files, so no run of the session changes them meanwhile.
"""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext
from typing import Optional

import typer

from kxen_agent.errors import UsageError

from ._render import emit_json, out, term_text as t

__all__ = ["register", "rewind_cmd"]

#: Crash tests: ``KXEN_AGENT_REWIND_FAULT=N`` kills the process (SIGKILL) after the N-th file a rewind wrote.
FAULT_ENV = "KXEN_AGENT_REWIND_FAULT"


def register(session_app: typer.Typer) -> None:
    session_app.command("rewind")(rewind_cmd)


def _after_file() -> object:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    if not spec.isdigit() or int(spec) < 1:
        raise UsageError(f"{FAULT_ENV}={spec!r}: expected a positive number of files")
    n_kill = int(spec)

    def after(n: int) -> None:
        if n == n_kill:
            os.kill(os.getpid(), signal.SIGKILL)

    return after


def rewind_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    at: Optional[str] = typer.Option(None, "--at", metavar="MSG", help="The message to go back to (msg_ id or prefix)."),
    code: bool = typer.Option(False, "--code", help="Only restore the workspace files to the checkpoint at MSG."),
    conversation: bool = typer.Option(False, "--conversation",
                                      help="Only move the conversation back: a new fork at MSG (the old branch stays)."),
    both: bool = typer.Option(False, "--both", help="Both (the default)."),
    undo: bool = typer.Option(False, "--undo", help="Put the workspace back as it was before the last rewind (SES: "
                              "the session rewound, or the fork a --both rewind made)."),
    force: bool = typer.Option(False, "--force",
                               help="Rewind even if the workspace has changes no checkpoint holds (they are "
                                    "checkpointed first, so --undo restores them)."),
    json_out: bool = typer.Option(False, "--json", help="Print what was restored and forked as JSON."),
) -> None:
    """Go back to a message: the workspace files, the conversation, or both.

    The code: the files under the bound directory become the checkpoint at
    MSG; the workspace is checkpointed first, so `--undo` puts it back.
    Ignored files, files over the checkpoint bounds, submodules and anything
    outside the bound directory are left alone (listed). The conversation:
    a new session forked at MSG; the old one stays as it is.

    \b
    Examples:
      kxen-agent session rewind ses_6508 --at msg_3f2a9c01
      kxen-agent session rewind ses_6508 --at msg_3f2a9c01 --code
      kxen-agent session rewind ses_6508 --undo
    """
    from kxen_agent.runtime.lease import Lease, lease_ttl_s
    from kxen_agent.session import checkpoint_restore as cr
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.sessions import NS, SessionStore, msg_id
    from kxen_agent.store import Store

    if sum((code, conversation, both)) > 1:
        raise UsageError("give one of --code, --conversation and --both (default --both)")
    if undo and (at is not None or conversation or both):
        raise UsageError("--undo puts the workspace back as it was before the last rewind; give it without --at, "
                         "--conversation or --both")
    if not undo and at is None:
        raise UsageError("give --at MSG (the message to go back to), or --undo")
    do_code = undo or not conversation
    do_conv = not undo and not code
    after_file = _after_file()
    lease_ttl_s()
    sessions = SessionStore(Store.open(namespaces=(NS,)))
    info = sessions.get(sessions.resolve_id(ses))
    policy = sessions.agent(info).get("policy", {})
    point = sessions.resolve_message(info, at) if at is not None else None
    if do_conv and point is not None:
        sessions._check_fork_point(info, point, explicit=True)  # refused before any file is touched
    result = None
    note = None
    on = info  # the session whose checkpoint chain the rewind is made on (--undo of a fork: its parent's)
    if do_code:
        repo = ckpt.open_repo(info.workspace, policy)
        with Lease.acquire(sessions.store, info.id, purpose="rewind"):
            if undo:
                on, target, _was = cr.undo_session(sessions, info, repo)
            else:
                assert point is not None
                target, note = cr.checkpoint_at(sessions, info, repo, point)
            with Lease.acquire(sessions.store, on.id, purpose="rewind") if on is not info else nullcontext():
                result = cr.rewind_code(sessions, on, sessions.agent(on).get("policy", {}), target, force=force,
                                        after_file=after_file)  # type: ignore[arg-type]
    fork = sessions.fork(info.id, at=at) if do_conv else None
    if json_out:
        emit_json({
            "session": info.id,
            "code": None if result is None else {
                "session": on.id, "target": result.target, "undo": result.undo, "restored": result.restored, "noop": result.noop,
                "written": result.written, "removed": result.removed, "completedInterrupted": result.completed,
                "leftAlone": [{"path": p, "why": w} for p, w in result.left_alone], "note": note},
            "conversation": None if fork is None else {"session": fork.id, "forkPoint": fork.meta.get("forkPoint")},
        })
        return
    if result is not None:
        if note:
            out(f"note: {t(note, quote=False)}")
        if result.completed:
            out(f"completed an interrupted rewind to {result.completed[:12]} first")
        what = "put the workspace back to" if undo else "restored the workspace to"
        if on is not info:
            out(f"undoing the rewind of session {on.id}, the parent of fork {info.id} (they share the workspace)")
        if result.noop:
            out(f"the workspace is already as checkpoint {result.target[:12]} has it; nothing was written")
        else:
            out(f"{what} checkpoint {result.target[:12]}: {len(result.written)} file(s) written, "
                f"{len(result.removed)} removed")
        for path, why in result.left_alone:
            out(f"left alone: {t(path)} ({t(why, quote=False)})")
        if not result.noop:
            out(f"undo with `kxen-agent session rewind {on.id} --undo` (back to {result.undo[:12]})"
                + (f" or `kxen-agent session rewind {fork.id} --undo`" if fork is not None else ""))
    if fork is not None:
        out(f"conversation: new session {fork.id} forked at {t(fork.meta.get('forkPoint') or msg_id(point))}"
            f"; the old branch stays as {info.id}")
        out(f"continue it with `kxen-agent --resume {fork.id} --task TEXT`")
