"""``kxen-agent session ...``: list, show, log, compact, tree, fork, delete, undelete, export, import.

Loaded by main.py when ``session`` is run (:data:`~.main.COMMANDS`); the
library is imported inside each command, so ``session --help`` and the
top-level help import none of it. Every SES argument is an id or a unique
prefix of one (:mod:`._ids`), resolved before the library is called.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Optional

import typer

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.session.status import OpState

from ._args import since_ns, workspaces
from ._render import dumps_json, emit_json, err, out, term_block, term_text as t, usage_line

if TYPE_CHECKING:
    from kxen_agent.session.sessions import SessionInfo, SessionStore
    from kxen_agent.store import Store

# Without a command: one usage-error line listing the commands (main.click_error_line), not the help.
session_app = typer.Typer(
    help="List, inspect, fork, delete, export and import sessions.\n\n"
         "Every SES is a session id, a unique prefix of one, or a session's name.\n\n"
         "\b\nExamples:\n  kxen-agent session list\n  kxen-agent session show ses_6508\n"
         "  kxen-agent session fork ses_6508 --worktree alternative_fix",
    no_args_is_help=False, rich_markup_mode=None, add_completion=False)

_SES_HELP = "A session id, a unique prefix of one (ses_6508), or the session's name."


def _store() -> Store:
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    return Store.open(namespaces=(NS,))


def _sessions() -> SessionStore:
    from kxen_agent.session.sessions import SessionStore

    return SessionStore(_store())


def _runs_json(sessions: SessionStore, info: SessionInfo) -> list[dict]:
    """The session's runs, oldest first, each state checked to be that run's (as the runner reads them)."""
    # Not through a Runner: building one imports the loop, its providers and tools (start-up time).
    from kxen_agent.runtime.lease import lease_backend
    from kxen_agent.runtime.run_status import read_run, shown_status

    store = sessions.store
    leases = lease_backend(store)
    runs = []
    for run, oid in info.runs.items():
        st = read_run(store, info, run, oid)
        # "interrupted": unsettled, and no live process holds the session's lease
        runs.append({"id": run, "index": st["index"], "status": shown_status(store, info.id, st, backend=leases),
                     "settled": st.get("settled", False), "turn": st["turn"], "model": st["model"],
                     "task": st["task"], "usage": st.get("usage"),
                     "startedNs": st.get("startedNs"), "updatedNs": st.get("updatedNs")})
    runs.sort(key=lambda r: r["index"])
    return runs


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _short_when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ns / 1e9))


def _one_line(text: str, width: int = 60) -> str:
    """A stored text (a task) as one line: its first line, whitespace collapsed, cut at ``width``."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    line = " ".join(first.split())
    more = line != " ".join(text.split())
    if len(line) > width:
        line, more = line[: width - 1].rstrip(), True
    return line + ("…" if more else "")


@session_app.command("list")
def list_cmd(
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR",
        help="Only sessions bound to DIR (its path, or the same repository and subdirectory elsewhere)."),
    since: Optional[str] = typer.Option(
        None, "--since", metavar="WHEN", help="Only sessions active since WHEN: a duration (2d, 1w) or a date."),
    branch: Optional[str] = typer.Option(
        None, "--branch", "-b", metavar="NAME", help="Only sessions bound to the Git branch NAME."),
    json_out: bool = typer.Option(
        False, "--json",
        help="Print {stateDir, sessions: [...]}: each session as `session show --json` gives it, plus "
             "status, lastActivityNs, lastTask and messages."),
) -> None:
    """Every session in the state dir, least recently active first.

    Each line: id, status (a run whose process is gone shows as
    interrupted: `--resume` finishes it), creation and last-activity
    dates, messages, the workspace, the last task.

    \b
    Examples:
      kxen-agent session list
      kxen-agent session list --workspace . --since 2d
    """
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.workspace import inspect_workspace

    cutoff = since_ns(since) if since is not None else None
    where = None
    if workspace is not None:
        where = inspect_workspace(workspace)
    store = _store()
    sessions = SessionStore(store)
    rows = []

    def damaged(group: str, e: Exception) -> None:
        # As `git for-each-ref` does with a broken ref: say so, list the rest.
        err(f"kxen-agent: warning: ignoring {t(group, quote=False)}, which does not read as a session: "
            f"{t(str(e), quote=False)}; `kxen-agent fsck` checks the state dir")

    for info in sessions.list(on_damaged=damaged):
        ws = info.meta["workspace"]
        if where is not None and ws.get("root") != where.root and ws.get("identity") != where.identity:
            continue
        if branch is not None and ws.get("branch") != branch.removeprefix("refs/heads/"):
            continue
        try:  # its head and runs are read here: one damaged session is named, the others listed
            runs = _runs_json(sessions, info)
            d = info.to_json()
            d["messages"] = sessions.message_count(info)
        except KxenError as e:
            damaged(info.group, e)
            continue
        activity = max([info.meta["createdNs"], info.meta.get("revisedNs", 0)]
                       + [r["updatedNs"] or 0 for r in runs])
        if cutoff is not None and activity < cutoff:
            continue
        d["runs"] = runs
        last = runs[-1] if runs else None
        d["status"] = None if last is None else last["status"]
        d["lastActivityNs"] = activity
        d["lastTask"] = last["task"] if last else None
        rows.append(d)
    rows.sort(key=lambda d: (d["lastActivityNs"], d["id"]))
    if json_out:
        emit_json({"stateDir": store.root, "sessions": rows})
        return
    if not rows:
        what = "no sessions" + (f" bound to {t(where.root)}" if where is not None else "") + \
            (f" active since {t(since)}" if since is not None else "") + \
            (f" on branch {t(branch)}" if branch is not None else "")
        out(f"{what} in {t(store.root)}")
        return
    for d in rows:
        fork = f"  fork of {t(d['parentId'])} ({t(d['forkKind'] or '-')})" if d["parentId"] else ""
        task = f"  task: {t(_one_line(d['lastTask']))}" if d["lastTask"] else ""
        named = f"  ({t(d['name'])})" if d.get("name") else ""
        out(f"{t(d['id'])}{named}  {t(d['status'] or 'no runs'):<14} created {_short_when(d['createdNs'])}  "
            f"active {_short_when(d['lastActivityNs'])}  {d['messages']:>4} msgs  "
            f"{t(d['workspace']['root'])}{fork}{task}")


@session_app.command("show")
def show_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object: ids, fork fields, workspace, agent, runs (docs/commands.md: JSON output)."),
) -> None:
    """Ids, fork fields, workspace binding, agent lock, runs and their statuses.

    \b
    Example:
      kxen-agent session show ses_6508
    """
    sessions = _sessions()
    info = sessions.get(sessions.resolve_id(ses))
    agent = sessions.agent(info)
    d = info.to_json()
    d["messages"] = sessions.message_count(info)
    d["agent"] = {"lock": info.agent_oid.hex(), "name": agent.get("name"), "provider": agent.get("provider"),
                  "model": agent.get("model"), "tools": agent.get("tools"), "policy": agent.get("policy"),
                  "apiKeyEnv": agent.get("api_key_env"), "baseUrl": agent.get("base_url")}
    from kxen_agent.runtime.results import sum_usage

    runs = _runs_json(sessions, info)
    d["runs"] = [{k: r[k] for k in ("id", "index", "status", "settled", "turn", "model", "task", "usage")}
                 for r in runs]
    d["usage"] = sum_usage(r["usage"] for r in runs)
    from .checkpoint_cmds import checkpoint_line, session_checkpoint_summary

    d["checkpoints"] = session_checkpoint_summary(sessions, info)
    if json_out:
        emit_json(d)
        return
    # Every stored text goes through t(): an imported session's values are someone else's bytes.
    out(f"session {t(d['id'])}")
    if d.get("name"):
        out(f"  name:         {t(d['name'])}")
    out(f"  parentId:     {t(d['parentId'] or '-')}")
    out(f"  branchRootId: {t(d['branchRootId'])}")
    out(f"  forkPoint:    {t(d['forkPoint'] or '-')}")
    out(f"  forkKind:     {t(d['forkKind'] or '-')}")
    out(f"  created:      {_when(d['createdNs'])}")
    ws = d["workspace"]
    out(f"  workspace:    {t(ws['root'])}")
    out(f"    identity:   {t(ws['identity'])}")
    if ws.get("repoRoot"):
        out(f"    repository: {t(ws['repoRoot'])}  branch {t(ws.get('branch') or '(detached)')}  "
            f"HEAD {t(ws.get('head') or '(none)')}")
        if ws.get("remoteHash"):
            out(f"    remote:     {t(ws['remoteHash'])} (hash of the credential-free origin URL)")
    a = d["agent"]
    out(f"  agent lock:   {a['lock']} ({t(str(a['name']))}, {t(str(a['provider']))}/{t(str(a['model']))})")
    if a["provider"] != "script":  # where a run sends the history, and which variable's value goes with it
        from kxen_agent.session.trust import lock_pair

        url, var = lock_pair(agent)
        out(f"    endpoint:   {t(str(url or '-'))}  key variable: {t(str(var or '-'))}")
    out(f"  messages:     {d['messages']} (head {t(d['head'] or '-')})")
    out(f"  usage:        {usage_line(d['usage'])}")
    out(checkpoint_line(d["checkpoints"]))
    out("  runs:")
    for r in d["runs"]:
        out(f"    {t(r['id'])}  #{r['index']} {t(r['status'])}{'' if r['settled'] else ' (not settled)'}  "
            f"turns {r['turn']}  task: {t(_one_line(r['task']))}")


@session_app.command("log")
def log_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    json_out: bool = typer.Option(
        False, "--json", help="Stream JSON Lines, one message each: {id, seq, role, run, content, toolCalls, toolCallId[, through]}."),
) -> None:
    """The session's messages, oldest first (streamed).

    \b
    Examples:
      kxen-agent session log ses_6508 | less
      kxen-agent session log ses_6508 --json | jq -r .content
    """
    sessions = _sessions()
    info = sessions.get(sessions.resolve_id(ses))
    if json_out:
        # JSON Lines: one message per line, so a long history streams.
        for m in sessions.iter_forward(info.head):
            sys.stdout.write(dumps_json(m.to_json()) + "\n")
        return
    for m in sessions.iter_forward(info.head):
        head = f"{t(m.id[:16])}  #{m.seq} {t(m.role)}" + (f" ({t(m.run)})" if m.run else "")
        out(head)
        if m.content:
            # A message is a block: its newlines and tabs stay, every other control is escaped.
            for line in term_block(m.content):
                out(f"    {line}")
        for c in m.tool_calls:
            out(f"    -> {t(c['name'])} {t(str(c['arguments']))}  [{t(c['id'])}]")
        if m.through is not None:
            out(f"    (summarizes the history through {t(m.to_json()['through'][:16])}; the model is shown this "
                "summary in place of those messages)")


@session_app.command("compact")
def compact_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    at: Optional[str] = typer.Option(
        None, "--at", metavar="MSG", help="Summarize the history through this message (default: all of it)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, message, through, summarized, usage} as JSON."),
) -> None:
    """Ask the session's model to summarize its history, and show the model that summary from now on.

    The summary is a `compaction` message on the session's head; the full
    history stays (`session log`, `fork --at`, export see everything).

    \b
    Examples:
      kxen-agent session compact ses_6508
      kxen-agent session compact ses_6508 --at msg_191a788f
    """
    from kxen_agent.runtime.cancel import cancel_on_signals
    from kxen_agent.runtime.compaction import compact_session
    from kxen_agent.runtime.runner import Runner

    runner = Runner(_store(), on_event=lambda line: err(f"kxen-agent: {t(line, quote=False)}"))
    ses = runner.sessions.resolve_id(ses)
    with cancel_on_signals() as cancel:
        runner.cancel = cancel
        res = compact_session(runner, ses, at)
    if json_out:
        emit_json(res)
        return
    out(f"session {res['session']}: {res['summarized']} message(s) through {res['through']} summarized in "
        f"{res['message']} (usage: {usage_line(res['usage'])})")


@session_app.command("tree")
def tree_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    json_out: bool = typer.Option(
        False, "--json",
        help="Print the tree as nested JSON: {id, forkKind, forkPoint, deleted, name, status, lastTask, "
             "lastActivityNs, children}."),
) -> None:
    """The fork tree around SES, drawn as `git log --graph` draws branches.

    Each fork sits above the session it was forked from: its id, name,
    the status of its latest run (running, input_required, completed,
    failed, canceled, interrupted; "no runs"), when it was last active,
    and its last task.

    \b
    Example:
      kxen-agent session tree ses_6508
    """
    from .tree_view import age, graph

    sessions = _sessions()
    ses = sessions.resolve_id(ses)
    root, children, family = sessions.tree(ses)
    facts: dict[str, dict] = {}

    def fact(sid: str) -> dict:
        if sid not in facts:
            info = family.get(sid)
            d: dict = {"name": None, "status": None, "lastTask": None, "lastActivityNs": None}
            if info is not None:
                d["name"] = info.meta.get("name")
                try:  # one damaged session is drawn without its runs, the family still is
                    runs = _runs_json(sessions, info)
                except KxenError:
                    runs = []
                last = runs[-1] if runs else None
                d["status"] = last["status"] if last else None
                d["lastTask"] = last["task"] if last else None
                d["lastActivityNs"] = max([info.meta["createdNs"], info.meta.get("revisedNs", 0)]
                                          + [r["updatedNs"] or 0 for r in runs])
            facts[sid] = d
        return facts[sid]

    def label(sid: str) -> str:
        info = family.get(sid)
        if info is None:
            return f"{t(sid)} (deleted or not here)"
        m, d = info.meta, fact(sid)
        name = f"  ({t(d['name'])})" if d["name"] else ""
        kind = f"  [{t(m['forkKind'])}]" if m.get("forkKind") else ""
        at = f" at {t(m['forkPoint'][:16])}" if m.get("forkPoint") else ""
        gone = " (deleted)" if info.deleted_ns is not None else ""
        task = f"  task: {t(_one_line(d['lastTask']))}" if d["lastTask"] else ""
        mark = "  <- this session" if sid == ses else ""
        return (f"{t(sid)}{name}  {t(d['status'] or 'no runs')}  {age(d['lastActivityNs'])}{kind}{at}{gone}"
                f"{task}{mark}")

    if json_out:
        def node(sid: str) -> dict:
            return {"id": sid, "forkKind": family[sid].meta.get("forkKind") if sid in family else None,
                    "forkPoint": family[sid].meta.get("forkPoint") if sid in family else None,
                    "deleted": family[sid].deleted_ns is not None if sid in family else True,
                    **fact(sid),
                    "children": [node(c) for c in children.get(sid, [])]}
        emit_json(node(root))
        return
    for line in graph(root, children, label):
        out(line)


@session_app.command("fork")
def fork_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    at: Optional[str] = typer.Option(
        None, "--at", metavar="MSG", help="Fork point: a msg_ id or unique prefix (default: the newest message)."),
    worktree: Optional[str] = typer.Option(
        None, "--worktree", metavar="NAME", help="Also create a Git worktree on a new branch kxen/NAME and bind the fork to it."),
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR",
        help="Bind the fork to DIR: a checkout of the same repository on any branch (after `git switch -c feature-x`)."),
    with_code: bool = typer.Option(
        False, "--with-code", help="With --worktree: start the worktree at the workspace checkpoint of the fork point."),
    json_out: bool = typer.Option(False, "--json", help="Print the new session as `session show --json` does."),
    name: Optional[str] = typer.Option(
        None, "--name", "-n", metavar="NAME", help="The fork's name (default: <SES's name>/<n> when SES has one)."),
) -> None:
    """A new complete Session sharing SES's history up to the fork point.

    The fork keeps SES's workspace binding unless --worktree makes a new
    worktree or --workspace binds it to another branch or checkout of the
    same repository (the identity is checked; the binding's reason is
    recorded as fork-workspace).

    \b
    Examples:
      kxen-agent session fork ses_6508 --at msg_3f2a9c01
      kxen-agent session fork ses_6508 --worktree alternative_fix
      git switch -c feature-x && kxen-agent session fork ses_6508 --workspace .
    """
    sessions = _sessions()
    ses = sessions.resolve_id(ses)
    start = None
    if with_code:
        if worktree is None:
            raise UsageError("--with-code goes with --worktree NAME (the worktree starts at the checkpoint)")
        from kxen_agent.session.worktrees import checkpoint_for_fork

        start, note = checkpoint_for_fork(sessions, sessions.get(ses), at)
        if note and not json_out:
            err(f"note: {t(note, quote=False)}")
    info = sessions.fork(ses, at=at, worktree=worktree, workspace=workspace, worktree_at=start, name=name)
    if json_out:
        emit_json(info.to_json())
        return
    out(f"{info.id}" + (f"  ({t(info.meta['name'])})" if info.meta.get("name") else ""))
    ws = info.workspace
    if worktree:
        extra = f", worktree {t(ws.root)} on branch {t(str(ws.branch))}" + (
            f" at checkpoint {start[:12]}" if start else "")
    elif workspace is not None:
        extra = f", bound to {t(ws.root)} on {t('branch ' + ws.branch if ws.branch else 'a detached HEAD')}"
    else:
        extra = ""
    out(f"forked from {t(ses)} at {t(info.meta.get('forkPoint') or '(empty history)')} ({t(info.meta['forkKind'])}{extra})")
    out(f"continue it with `kxen-agent --resume {info.id} --task TEXT`")


@session_app.command("delete")
def delete_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    worktree: bool = typer.Option(
        False, "--worktree",
        help="Also remove the session's Git worktree and its kxen/NAME branch (refused if it has uncommitted changes)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, deleted, worktree, branch, commit} as JSON."),
    force: bool = typer.Option(
        False, "--force", help="A session that does not read: move its files to lost-found/ (nothing is deleted)."),
) -> None:
    """Mark SES deleted; gc removes it after the grace period, until then `session undelete` restores it.

    \b
    Examples:
      kxen-agent session delete ses_6508
      kxen-agent session delete ses_6508 --worktree
    """
    from kxen_agent.store.gc import DEFAULT_PRUNE

    sessions = _sessions()
    ses = sessions.resolve_id(ses)
    # Under the session's lease: a live run must not lose its session (nor its worktree) under it; a busy
    # session is LeaseBusy (exit 75), nothing changed.
    from kxen_agent.runtime.lease import Lease, lease_ttl_s

    lease_ttl_s()
    try:
        with Lease.acquire(sessions.store, ses, purpose="delete"):
            info, wt = sessions.delete(ses, worktree=worktree)
    except KxenError as e:
        # --force: a session that does not read (its lease's fence neither) goes to lost-found/ whole.
        if not force or isinstance(e, UsageError) or type(e).__name__ == "LeaseBusy":
            raise
        _delete_forced(sessions.store, ses, e, json_out)
        return
    if json_out:
        emit_json({"session": info.id, "deleted": True, "worktree": wt.path if wt else None,
                   "branch": wt.branch if wt else None, "commit": wt.commit if wt else None})
        return
    if wt is not None:
        out(f"removed worktree {t(wt.path)} and branch {t(wt.branch)} (it was at {t(wt.commit or '?')})")
    out(f"session {info.id} deleted; `kxen-agent session undelete {info.id}` restores it"
        f"{' and its worktree' if wt else ''} until `kxen-agent gc` removes it (after {DEFAULT_PRUNE} by default)")


def _delete_forced(store: object, ses: str, why: KxenError, json_out: bool) -> None:
    """``delete --force`` of a session that does not read: its group's files go to lost-found/ (§18)."""
    from kxen_agent.store.repair import quarantine_group

    group = f"sessions/{ses}"
    with store.refs.lock(group):  # type: ignore[attr-defined]
        where = quarantine_group(store, group, why=f"session delete --force: {why}")  # type: ignore[arg-type]
    if json_out:
        emit_json({"session": ses, "deleted": True, "lostFound": where, "worktree": None})
        return
    out(f"session {ses} did not read; its files are in {t(where)} (nothing was deleted)")


@session_app.command("undelete")
def undelete_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A deleted session's id or a unique prefix of one."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, deleted, worktree, problem} as JSON."),
) -> None:
    """Restore a deleted session before gc removes it (and the worktree `delete --worktree` removed).

    \b
    Example:
      kxen-agent session undelete ses_6508
    """
    sessions = _sessions()
    ses = sessions.resolve_id(ses, include_deleted=True)
    info, wt, problem = sessions.undelete(ses)
    if json_out:
        emit_json({"session": info.id, "deleted": False, "worktree": wt.path if wt else None, "problem": problem})
        return
    out(f"session {info.id} restored, bound to {t(info.workspace.root)}")
    if wt is not None and problem is None:
        out(f"re-created worktree {t(wt.path)} on branch {t(wt.branch)} at {t(wt.commit or '?')}")
    if problem is not None:
        err(f"kxen-agent: warning: its worktree was not re-created: {t(problem, quote=False)}")


@session_app.command("export")
def export_cmd(
    sessions: list[str] = typer.Argument(
        ..., metavar="SES...", help="Sessions to export, ids or unique prefixes (forks share history in the bundle)."),
    output: str = typer.Option(..., "--output", "-o", metavar="FILE", help="Bundle file; a .json name writes the JSON form."),
    fmt: Optional[str] = typer.Option(None, "--format", metavar="FORMAT", help="pack or json (default: by the file name)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print what was written as JSON: format, refs, objects, bytes, digest."),
    scan: bool = typer.Option(False, "--scan", help="Look for text that looks like a credential first; "
                              "refuse to write if there is any."),
    allow_secrets: bool = typer.Option(False, "--allow-secrets",
                                       help="With --scan or --with-checkpoints: warn, then write anyway."),
    salvage: bool = typer.Option(False, "--salvage", help="A damaged session up to its damage: its last "
                                 "message whose history reads, and the runs that read."),
    with_checkpoints: bool = typer.Option(
        False, "--with-checkpoints", help="Also carry the workspace checkpoints (scanned for credentials first)."),
    encrypt_to: Optional[list[str]] = typer.Option(
        None, "--encrypt-to", metavar="RECIPIENT", help="Encrypt (age) to this age recipient or SSH public key "
        "(a key, or a file such as ~/.ssh/id_ed25519.pub); only its holder can import. Repeatable."),
    sign: Optional[str] = typer.Option(None, "--sign", metavar="KEY",
                                       help="Sign with this SSH private key (ssh-keygen -Y sign), before encrypting."),
) -> None:
    """Write a self-contained, credential-free bundle of the sessions.

    \b
    Examples:
      kxen-agent session export ses_6508 --output session.bundle
      kxen-agent session export ses_6508 -o s.kxb --sign ~/.ssh/id_ed25519 --encrypt-to ./bob.pub
    """
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.transfer import export_sessions, session_objects

    from ._render import Progress
    from .secret_scan import SecretScan

    if allow_secrets and not (scan or with_checkpoints):
        raise UsageError("--allow-secrets goes with --scan (it writes a bundle the scan found credentials in)")
    if salvage and with_checkpoints:
        raise UsageError("give --salvage or --with-checkpoints, not both (a salvaged export carries no checkpoints)")
    store = _store()
    full = [SessionStore(store).resolve_id(s) for s in sessions]
    if scan:
        found = SecretScan()
        for obj in session_objects(store, full):
            found(obj)
        found.warn(f"export to {t(output)}")
        if found.hits and not allow_secrets:
            raise KxenError(f"refusing to write {t(output)}: the sessions hold {len(found.hits)} text(s) that look "
                            "like credentials (listed above); nothing was written — remove them, or give "
                            "--allow-secrets to write the bundle anyway")
    prog = Progress("export", enabled=not json_out)
    from .checkpoint_travel_cmds import export_with_checkpoints, note_stays_behind

    from kxen_agent.session.share import sealing

    with sealing(output, encrypt_to=encrypt_to, sign_key=sign) as sealed:  # §12.14: signed, then encrypted
        if with_checkpoints:
            info = export_with_checkpoints(store, full, sealed.path, fmt, allow_secrets=allow_secrets, progress=prog)
        elif salvage:
            info = _export_salvaged(store, full, sealed.path, fmt, prog)
        else:
            info = export_sessions(store, full, sealed.path, fmt=fmt, progress=prog)
        prog.done()
    if not with_checkpoints:
        note_stays_behind(store, full)
    if json_out:
        emit_json(dict(info.to_json(), envelope=sealed.envelope_json()) if sealed.sealed else info.to_json())
        return
    if sealed.sealed:
        out(f"wrote {t(output)}: {len(info.refs)} session(s), {info.objects} objects, {sealed.size} bytes "
            f"({info.format}, {sealed.describe()})")
        return
    out(f"wrote {t(output)}: {len(info.refs)} session(s), {info.objects} objects, {info.file_bytes} bytes ({info.format})")


def _export_salvaged(store: object, full: list[str], output: str, fmt: Optional[str], prog: object) -> object:
    """``export --salvage``: each session's refs up to its damage (session/damage.py), one warning per cut."""
    from kxen_agent.session.damage import salvage_refs
    from kxen_agent.store.bundle import format_for_path
    from kxen_agent.store.bundle.export import export_bundle

    refs = {}
    for ses in full:
        refs[f"sessions/{ses}"], left = salvage_refs(store, ses)
        for what in left:
            err(f"kxen-agent: warning: {ses}: {t(what, quote=False)}")
    return export_bundle(store, list(refs), output, fmt=format_for_path(output, fmt), progress=prog, refs=refs)


@session_app.command("import")
def import_cmd(
    bundle: str = typer.Argument(..., metavar="FILE", help="A bundle written by `session export`."),
    workspace: list[str] = typer.Option(
        ..., "--workspace", "-w", metavar="DIR|SES=DIR",
        help="The workspace to bind the imported sessions to; SES=DIR binds one session elsewhere "
             "(a worktree fork: a worktree of its branch). Repeatable."),
    json_out: bool = typer.Option(
        False, "--json", help="Print what was imported as JSON: sessions and their fate, bindings, new objects."),
    restore_workspace: bool = typer.Option(
        False, "--restore-workspace", help="Write the session's last checkpoint (carried in the bundle) into the workspace."),
    identity: Optional[list[str]] = typer.Option(
        None, "--identity", "-i", metavar="FILE", help="An age identity file or SSH private key that opens an "
        "encrypted bundle. Repeatable."),
    allowed_signers: Optional[str] = typer.Option(
        None, "--allowed-signers", metavar="FILE", help="Import only a bundle signed by a key this file "
        "(ssh-keygen's allowed signers format, as Git's) allows."),
    trust: bool = typer.Option(
        False, "--trust", help="With --allowed-signers: also accept what the sessions ask of this machine, as "
        "`session trust SES --yes` does."),
) -> None:
    """Verify a bundle, import its sessions and bind them to DIR.

    \b
    Example:
      kxen-agent session import session.bundle --workspace /workspace/repo
    """
    from kxen_agent.runtime.lease import Lease, lease_ttl_s
    from kxen_agent.session.share import open_bundle
    from kxen_agent.session.transfer import import_sessions

    from ._render import Progress
    from .share_cmds import check_trust_flags, trust_imported

    check_trust_flags(trust, allowed_signers)
    lease_ttl_s()  # a bad KXEN_AGENT_LEASE_TTL_S is refused before any object is imported
    default, per_session = workspaces(workspace)
    store = _store()
    prog = Progress("import", enabled=not json_out)
    with open_bundle(bundle, identities=identity, allowed_signers=allowed_signers) as opened:  # §12.14
        if opened.signature is not None and not json_out:
            err(f"note: bundle {t(bundle)}: {t(opened.signature.line(), quote=False)}")
        res = import_sessions(store, opened.path, default, workspaces=per_session, progress=prog,
                              acquire_lease=lambda ses: Lease.acquire(store, ses, purpose="import"))
        prog.done()
        from .checkpoint_travel_cmds import adopt_from_bundle, restore

        adopted = adopt_from_bundle(store, opened.path, res, quiet=json_out)
    if restore_workspace:
        restore(store, sorted(adopted) or sorted(res.sessions), quiet=json_out)
    trusted = trust_imported(store, sorted(res.sessions), opened.signature.principal, quiet=json_out) if trust else []
    if json_out:
        emit_json(dict(res.to_json(), envelope=opened.envelope_json(), trusted=trusted) if opened.path != bundle
                  else res.to_json())
        return
    for ses, status in sorted(res.sessions.items()):
        out(f"{t(ses)}: {status}, bound to {t(res.bindings[ses].root)}")
    for gone in res.dropped_names:
        err(f"note: {t(gone.line(), quote=False)}")
    out(f"imported {t(bundle)}: {res.result.new_objects} new objects")
    for ses in sorted(res.sessions):
        out(f"resume with `kxen-agent --resume {t(ses)} --workspace {t(res.bindings[ses].root)}`")


# push, pull, ls-remote: sessions through the workspace repository's Git remote.
from .remote_cmds import register as _register_remote_cmds  # noqa: E402

_register_remote_cmds(session_app)
from .checkpoint_cmds import register as _register_checkpoint_cmds  # noqa: E402

_register_checkpoint_cmds(session_app)
from .rewind_cmds import register as _register_rewind_cmds  # noqa: E402

_register_rewind_cmds(session_app)
from .names_cmds import register as _register_names_cmds  # noqa: E402

_register_names_cmds(session_app)
from .grep_cmds import register as _register_grep_cmds  # noqa: E402

_register_grep_cmds(session_app)
from .which_cmds import register as _register_which_cmds  # noqa: E402

_register_which_cmds(session_app)


@session_app.command("trust")
def trust_cmd(
    ses: str = typer.Argument(..., metavar="SES", help=_SES_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Accept without asking."),
    refuse_calls: bool = typer.Option(
        False, "--refuse-calls",
        help="Refuse the pending tool calls instead of accepting them (they never run; the agent lock is still accepted)."),
    json_out: bool = typer.Option(False, "--json", help="Print what the session asks of this machine as JSON."),
) -> None:
    """Show what a session from elsewhere would make this machine do, and accept it.

    Shows the agent lock (provider, model, endpoint, key variable, tools,
    approve, env_keep, script steps) when this machine has not accepted its
    endpoint and key variable, and the tool calls recorded on another machine
    that wait for a decision here. At a terminal it asks; --yes accepts;
    otherwise nothing is accepted (exit 3). Acceptance is recorded in this
    state dir; then `kxen-agent --resume SES` goes on.

    \b
    Examples:
      kxen-agent session trust ses_6508
      kxen-agent session trust ses_6508 --yes && kxen-agent --resume ses_6508
    """
    from kxen_agent.runtime.runner import Runner

    runner = Runner(_store())
    ses = runner.sessions.resolve_id(ses)
    doc = runner.trust_report(ses)
    wanted = doc["lockProblem"] is not None or bool(doc["calls"])
    if not json_out:
        _show_trust(doc)
    if not wanted:
        if json_out:
            emit_json(doc)
        else:
            out(f"nothing to accept: this machine already accepts what session {t(ses)} asks of it")
        return
    accept = yes
    if not yes and not json_out and os.isatty(0):
        sys.stderr.write(f"{'refuse the calls' if refuse_calls else 'accept'} for session {ses}? [y/N] ")
        sys.stderr.flush()
        accept = sys.stdin.readline().strip().lower() in ("y", "yes")
    if accept:
        doc = runner.accept_trust(ses, refuse_calls=refuse_calls)
    if json_out:
        emit_json(doc)
    elif accept:
        out(f"accepted in this state dir; continue with `kxen-agent --resume {t(ses)}`")
    else:
        out(f"nothing accepted; `kxen-agent session trust {t(ses)} --yes` accepts it")
    if not accept:
        raise typer.Exit(3)


def _show_trust(doc: dict) -> None:
    a = doc["lock"]
    if doc["lockProblem"] is not None:
        out(f"session {t(doc['session'])}: {t(doc['lockProblem'])}")
        out(f"agent lock {doc['lockId']} ({t(str(a['name']))})")
        out(f"  provider:     {t(str(a['provider']))}   model: {t(str(a['model']))}")
        out(f"  endpoint:     {t(str(doc.get('endpoint') or '-'))}")
        out(f"  key variable: {t(str(doc.get('keyEnv') or '-'))}")
        out(f"  tools:        {t(', '.join(a['tools']) or '-')}")
        out(f"  approve:      {t(', '.join(a['approve']) or '- (no call waits for a yes)')}")
        out(f"  env_keep:     {t(', '.join(a['envKeep']) or '-')}")
        if a.get("mcp"):  # §14.15: the commands this machine would start, and each tool's hints
            from kxen_agent.runtime.mcp_tools import hint_line

            for name, s in a["mcp"]["servers"].items():
                launch = " ".join([s["command"], *s["args"]]) if "command" in s else s["url"]
                out(f"  MCP server {t(name)}: {t(launch)}" + (f"   env_keep: {t(', '.join(s['env_keep']))}"
                                                              if s.get("env_keep") else ""))
            for h in a["mcp"]["tools"]:
                out(f"    {t(h['tool'])}: {hint_line(h)}")
        if a["script"] is not None:
            out("  script steps:")
            for n, step in enumerate(a["script"] if isinstance(a["script"], list) else [a["script"]]):
                out(f"    {n}: {t(dumps_json(step) if not isinstance(step, str) else step)}")
    if doc["calls"]:
        out(f"tool calls of run {t(str(doc['run']))} recorded on another machine, waiting for this machine's decision:")
        for c in doc["calls"]:
            how = (f"decided yes by {t(str(c['decidedBy']))} in state dir {t(str(c['origin'] or 'unknown'))}"
                   if c["state"] == OpState.DECIDED else "never decided")
            out(f"  {t(c['tool'])} {t(c['arguments'])}  ({how})")
