"""``session diff`` and the checkpoint lines of ``session show`` and ``run show`` (``objects_spec.md`` §14.14).

What the agent changed in the workspace, read from the checkpoints the
journal names: by the whole session, a run, up to a message or one
operation. Git makes the diff (``--no-ext-diff --no-textconv``, through the
hardened runner: never a program the repository's configuration names); on
a terminal it is colored and shown through the user's pager. This module
only reads: no checkpoint, ref or file is written.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from kxen_agent.errors import UsageError

if TYPE_CHECKING:  # at run time each function imports it: `session list` registers `diff` without it (~18 ms)
    from kxen_agent.session import checkpoints as ckpt

from ._render import emit_json, err, out, term_text as t

__all__ = ["diff_cmd", "register", "session_checkpoint_summary", "unknown_op_evidence"]


def register(session_app: typer.Typer) -> None:
    session_app.command("diff")(diff_cmd)


class CheckpointMissing(UsageError):
    """A checkpoint the journal names is not in the workspace repository (§14.14: a reader's rule)."""

    exit_code = 1


def _open(sessions: Any, info: Any) -> ckpt.Repo:
    from kxen_agent.session import checkpoints as ckpt

    return ckpt.open_repo(info.workspace, sessions.agent(info).get("policy", {}))


def _need(repo: ckpt.Repo, commit: str, what: str) -> str:
    if not repo.exists(commit):
        raise CheckpointMissing(f"checkpoint {commit} ({what}) is not in the repository {repo.root}: the session was "
                                "imported or pulled without its checkpoints, or they were deleted; nothing to compare")
    return commit


def _after_of(ops: list[ckpt.OpCheckpoints], i: int, repo: ckpt.Repo, ses: str) -> tuple[str | None, str | None]:
    """(the checkpoint after ops[i], a note when it is not the op's own): the next op's before, else the ref's."""
    o = ops[i]
    if o.after is not None:
        return o.after, None
    for later in ops[i + 1:]:
        if later.before is not None:
            return later.before, f"{o.op} has no after checkpoint; compared up to the before checkpoint of {later.op}"
    tip = repo.tip(ses)
    return tip, (f"{o.op} has no after checkpoint; compared up to the session's last checkpoint" if tip else None)


def _range(sessions: Any, info: Any, repo: ckpt.Repo, *, run: str | None, at: str | None,
           op: str | None) -> tuple[str, str, str, list[str]]:
    """(from, to, what, notes) for the options given."""
    from kxen_agent.session import checkpoints as ckpt

    from kxen_agent.session.sessions import msg_id

    ops = ckpt.session_checkpoints(sessions, info)
    none = f"session {info.id} has no checkpoints yet (no tool that changes files has run in it)"
    if op is not None:
        idx = [i for i, o in enumerate(ops) if o.op == op or (len(op) >= 6 and o.op.startswith(op))]
        if len(idx) != 1:
            raise UsageError(f"operation {op} names {'no' if not idx else 'more than one'} operation with a checkpoint "
                             f"in session {info.id}; `kxen-agent run show {info.id}` lists its operations")
        o = ops[idx[0]]
        if o.before is None:
            raise UsageError(f"operation {o.op} has no before checkpoint (it was recorded without checkpoints)")
        after, note = _after_of(ops, idx[0], repo, info.id)
        if after is None:
            raise UsageError(f"operation {o.op} has no after checkpoint yet")
        return (_need(repo, o.before, f"{o.op}, before"), _need(repo, after, f"{o.op}, after"),
                f"operation {o.op} ({o.tool})", [note] if note else [])
    if run is not None:
        idx = [i for i, o in enumerate(ops) if o.run == run]
        if not idx:
            raise UsageError(f"run {run} of session {info.id} names no checkpoint (no tool that changes files ran, "
                             "or it ran without checkpoints)")
        first, last = ops[idx[0]], idx[-1]
        after, note = _after_of(ops, last, repo, info.id)
        if first.before is None or after is None:
            raise UsageError(f"run {run} has no complete checkpoint range yet")
        return (_need(repo, first.before, f"{first.op}, before"), _need(repo, after, f"{ops[last].op}, after"),
                f"run {run}", [note] if note else [])
    if not ops:
        raise UsageError(none)
    start = next((o for o in ops if o.before is not None), None)
    if start is None:
        raise UsageError(none)
    if at is not None:
        oid = sessions.resolve_message(info, at)
        at_cp = ckpt.checkpoint_at(sessions, info, oid)
        if at_cp is None:
            raise UsageError(f"no checkpoint up to {msg_id(oid)} in session {info.id}: no tool changed files before it")
        return (_need(repo, start.before, f"{start.op}, before"), _need(repo, at_cp, f"at {msg_id(oid)}"),
                f"up to {msg_id(oid)}", [])
    tip = repo.tip(info.id)
    if tip is None:
        raise UsageError(none)
    return _need(repo, start.before, f"{start.op}, before"), tip, f"session {info.id}", []


def diff_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    run: Optional[str] = typer.Option(None, "--run", metavar="RUN", help="What this run changed."),
    at: Optional[str] = typer.Option(None, "--at", metavar="MSG", help="What the session changed up to this message."),
    op: Optional[str] = typer.Option(None, "--op", metavar="ID",
                                     help="What this one operation changed: an op_ id or a unique prefix of one."),
    stat: bool = typer.Option(False, "--stat", help="Only the files and their counts of lines (git diff --stat)."),
    json_out: bool = typer.Option(False, "--json", help="The checkpoints compared and the files that differ, as JSON."),
) -> None:
    """What the agent changed in the workspace, from the checkpoints (a Git diff).

    Without an option: the whole session, from the checkpoint before its first
    tool that may change files to its last checkpoint.

    \b
    Examples:
      kxen-agent session diff ses_6508 --stat
      kxen-agent session diff ses_6508 --op op_3f2a
      kxen-agent session diff ses_6508 --run run_91c2 --json
    """
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.sessions import NS, SessionStore
    from kxen_agent.store import Store

    if sum(x is not None for x in (run, at, op)) > 1:
        raise UsageError("give at most one of --run, --at and --op")
    sessions = SessionStore(Store.open(namespaces=(NS,)))
    info = sessions.get(sessions.resolve_id(ses))
    if run is not None:
        from kxen_agent.session.sessions import resolve_prefix

        run = resolve_prefix("run", "run", run, lambda: list(info.runs), f"in session {info.id}") or run
    repo = _open(sessions, info)
    a, b, what, notes = _range(sessions, info, repo, run=run, at=at, op=op)
    for n in notes:
        err(f"note: {n}")
    if json_out:
        emit_json({"session": info.id, "what": what, "from": a, "to": b, "repository": repo.top,
                   "files": ckpt.numstat(repo, a, b), "notes": notes})
        return
    tty = sys.stdout.isatty()
    text = ckpt.diff(repo, a, b, stat=stat, color=tty and "NO_COLOR" not in os.environ)
    if not text:
        out(f"no changes ({what}: {a[:12]}..{b[:12]})")
        return
    if tty:
        _page(text)
    else:
        sys.stdout.write(text)


def _page(text: str) -> None:
    """Show ``text`` through the user's pager (``PAGER``, else ``less``), or plainly when there is none.

    The user's own pager, never the repository's ``core.pager``: the diff comes from a workspace that may be
    someone else's.
    """
    import shlex
    import subprocess

    argv = shlex.split(os.environ.get("PAGER") or "less")
    if not argv or argv[0] == "cat":
        sys.stdout.write(text)
        return
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")  # colors pass through, short output does not wait
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env)
    except OSError:
        sys.stdout.write(text)  # no such pager: the text all the same
        return
    assert proc.stdin is not None
    try:
        proc.stdin.write(text.encode("utf-8", "surrogateescape"))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the user left the pager before the end
    proc.wait()


def unknown_op_evidence(sessions: Any, info: Any, entry: dict, *, full: bool) -> list[str]:
    """Lines for ``run show`` of an UNKNOWN op: its before checkpoint against the workspace now (--stat, or the
    whole diff). Never raises for a missing checkpoint: it says so instead."""
    from kxen_agent.session import checkpoints as ckpt

    before = entry.get(ckpt.BEFORE_KEY)
    if before is None:
        return ["no before checkpoint: the workspace's changes since it started cannot be shown"]
    try:
        repo = _open(sessions, info)
        if not repo.exists(before):
            return [f"checkpoint {before} (before) is not in the repository {repo.root}: nothing to compare"]
        index = sessions.store.caches.path(ckpt.INDEX_CACHE, info.group)
        with ckpt.snapshot(repo, index, ckpt.Bounds.of(sessions.agent(info).get("policy", {}))) as (now, env):
            text = ckpt.diff(repo, before, now, stat=not full, env=env)
    except (ckpt.CheckpointError, ckpt.NoCheckpoints, OSError) as ex:
        return [f"the workspace's changes cannot be shown: {ex}"]
    head = f"changes in the workspace since checkpoint {before[:12]} (before it started):"
    return [head] + (text.rstrip("\n").splitlines() or ["(none)"])


def session_checkpoint_summary(sessions: Any, info: Any) -> dict:
    """``session show``'s checkpoint fields: count and bytes of its own checkpoints, or why there are none."""
    from kxen_agent.session import checkpoints as ckpt

    try:
        repo = _open(sessions, info)
        count, size = ckpt.chain_size(repo, info.id)
    except (ckpt.NoCheckpoints, ckpt.CheckpointError) as ex:
        return {"count": 0, "bytes": 0, "ref": None, "none": str(ex)}
    return {"count": count, "bytes": size, "ref": ckpt.checkpoint_ref(info.id) if count else None, "none": None}


def checkpoint_line(summary: dict) -> str:
    if summary["none"]:
        return f"  checkpoints:  none ({t(summary['none'], quote=False)})"
    return f"  checkpoints:  {summary['count']} ({summary['bytes']} bytes in the repository)" + (
        f", ref {summary['ref']}" if summary["ref"] else "")
