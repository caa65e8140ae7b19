"""``kxen-agent session ...``: list, show, log, tree, fork, delete, export, import."""

from __future__ import annotations

import sys
import time
from typing import Optional

import typer

from kxen_agent.errors import KxenError
from kxen_agent.runtime.runner import Runner, sum_usage
from kxen_agent.session.sessions import NS, SessionInfo, SessionStore
from kxen_agent.store import Store

from .run_cmds import usage_line
from ._render import dumps_json, emit_json, err, out, term_block, term_text as t

# Without a command: one usage-error line listing the commands (main.click_error_line), not the help.
session_app = typer.Typer(help="List, inspect, fork, delete, export and import sessions.", no_args_is_help=False)


def _sessions() -> SessionStore:
    return SessionStore(Store.open(namespaces=(NS,)))


def _runs_json(runner: Runner, info: SessionInfo) -> list[dict]:
    runs = []
    for run, oid in info.runs.items():
        st = runner.read_run(info, run, oid)
        runs.append({"id": run, "index": st["index"], "status": runner.shown_status(info.id, st),
                     "settled": st.get("settled", False),
                     "turn": st["turn"], "model": st["model"], "task": st["task"], "usage": st.get("usage")})
    runs.sort(key=lambda r: r["index"])
    return runs


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


@session_app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json")) -> None:
    """Every session in the state dir."""
    store = Store.open(namespaces=(NS,))
    runner = Runner(store)
    rows = []

    def damaged(group: str, e: Exception) -> None:
        # As `git for-each-ref` does with a broken ref: say so, list the rest.
        err(f"kxen-agent: warning: ignoring {t(group, quote=False)}, which does not read as a session: "
            f"{t(str(e), quote=False)}; `kxen-agent fsck` checks the state dir")

    for info in runner.sessions.list(on_damaged=damaged):
        try:  # its head and runs are read here: one damaged session is named, the others listed
            runs = _runs_json(runner, info)
            d = info.to_json()
            d["messages"] = runner.sessions.message_count(info)
        except KxenError as e:
            damaged(info.group, e)
            continue
        d["runs"] = runs
        d["status"] = runs[-1]["status"] if runs else None
        rows.append(d)
    if json_out:
        emit_json({"stateDir": store.root, "sessions": rows})
        return
    if not rows:
        out(f"no sessions in {t(store.root)}")
        return
    for d in rows:
        fork = f" fork of {t(d['parentId'])} ({t(d['forkKind'] or '-')})" if d["parentId"] else ""
        out(f"{t(d['id'])}  {t(d['status'] or 'no runs'):<14} {d['messages']:>6} msgs  {t(d['workspace']['root'])}{fork}")


@session_app.command("show")
def show_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """Ids, fork fields, workspace binding, agent lock, runs and their statuses."""
    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(ses)
    agent = runner.sessions.agent(info)
    d = info.to_json()
    d["messages"] = runner.sessions.message_count(info)
    d["agent"] = {"lock": info.agent_oid.hex(), "name": agent.get("name"), "provider": agent.get("provider"),
                  "model": agent.get("model"), "tools": agent.get("tools"), "policy": agent.get("policy"),
                  "apiKeyEnv": agent.get("api_key_env")}
    d["runs"] = _runs_json(runner, info)
    d["usage"] = sum_usage(r["usage"] for r in d["runs"])
    if json_out:
        emit_json(d)
        return
    # Every stored text goes through t(): an imported session's values are someone else's bytes.
    out(f"session {t(d['id'])}")
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
    out(f"  messages:     {d['messages']} (head {t(d['head'] or '-')})")
    out(f"  usage:        {usage_line(d['usage'])}")
    out("  runs:")
    for r in d["runs"]:
        out(f"    {t(r['id'])}  #{r['index']} {t(r['status'])}{'' if r['settled'] else ' (not settled)'}  "
            f"turns {r['turn']}  task: {t(r['task'][:60])}")


@session_app.command("log")
def log_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """The session's messages, oldest first (streamed)."""
    sessions = _sessions()
    info = sessions.get(ses)
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


@session_app.command("tree")
def tree_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """The fork tree around SES, drawn."""
    sessions = _sessions()
    root, children, family = sessions.tree(ses)

    def label(sid: str) -> str:
        info = family.get(sid)
        if info is None:
            return f"{t(sid)} (deleted or not here)"
        m = info.meta
        extra = f" at {t(m['forkPoint'][:16])}" if m.get("forkPoint") else ""
        kind = f" [{t(m['forkKind'])}]" if m.get("forkKind") else ""
        gone = " (deleted)" if info.deleted_ns is not None else ""
        mark = "  <- this session" if sid == ses else ""
        return f"{t(sid)}{kind}{extra}{gone}  {t(info.workspace.root)}{mark}"

    if json_out:
        def node(sid: str) -> dict:
            return {"id": sid, "forkKind": family[sid].meta.get("forkKind") if sid in family else None,
                    "forkPoint": family[sid].meta.get("forkPoint") if sid in family else None,
                    "deleted": family[sid].deleted_ns is not None if sid in family else True,
                    "children": [node(c) for c in children.get(sid, [])]}
        emit_json(node(root))
        return

    out(label(root))

    def draw(sid: str, prefix: str) -> None:
        kids = children.get(sid, [])
        for i, c in enumerate(kids):
            last = i == len(kids) - 1
            out(f"{prefix}{'└── ' if last else '├── '}{label(c)}")
            draw(c, prefix + ("    " if last else "│   "))

    draw(root, "")


@session_app.command("fork")
def fork_cmd(
    ses: str = typer.Argument(..., metavar="SES"),
    at: Optional[str] = typer.Option(None, "--at", help="Fork point: a msg_ id (default: the newest message)."),
    worktree: Optional[str] = typer.Option(None, "--worktree", help="Also create a Git worktree on branch kxen/NAME."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """A new complete Session sharing SES's history up to the fork point."""
    sessions = _sessions()
    info = sessions.fork(ses, at=at, worktree=worktree)
    if json_out:
        emit_json(info.to_json())
        return
    out(f"{info.id}")
    ws = info.workspace
    extra = f", worktree {t(ws.root)} on branch {t(str(ws.branch))}" if worktree else ""
    out(f"forked from {t(ses)} at {t(info.meta.get('forkPoint') or '(empty history)')} ({t(info.meta['forkKind'])}{extra})")


@session_app.command("delete")
def delete_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """Mark SES deleted; gc removes its refs after the grace period."""
    info = _sessions().delete(ses)
    if json_out:
        emit_json({"session": info.id, "deleted": True})
    else:
        out(f"session {info.id} deleted (its objects are removed by `kxen-agent gc` after the grace period)")


@session_app.command("export")
def export_cmd(
    sessions: list[str] = typer.Argument(..., metavar="SES...", help="Sessions to export (forks share history in the bundle)."),
    output: str = typer.Option(..., "--output", "-o", help="Bundle file; a .json name writes the JSON form."),
    fmt: Optional[str] = typer.Option(None, "--format", help="pack or json (default: by the file name)."),
    json_out: bool = typer.Option(False, "--json"),
    scan: bool = typer.Option(False, "--scan", help="Look for text that looks like a credential first; "
                              "refuse to write if there is any."),
    allow_secrets: bool = typer.Option(False, "--allow-secrets", help="With --scan: warn, then write anyway."),
) -> None:
    """Write a self-contained, credential-free bundle of the sessions."""
    from kxen_agent.errors import UsageError
    from kxen_agent.session.transfer import export_sessions, session_objects

    from ._render import Progress
    from .secret_scan import SecretScan

    if allow_secrets and not scan:
        raise UsageError("--allow-secrets goes with --scan (it writes a bundle the scan found credentials in)")
    store = Store.open(namespaces=(NS,))
    if scan:
        found = SecretScan()
        for obj in session_objects(store, sessions):
            found(obj)
        found.warn(f"export to {t(output)}")
        if found.hits and not allow_secrets:
            raise KxenError(f"refusing to write {t(output)}: the sessions hold {len(found.hits)} text(s) that look "
                            "like credentials (listed above); nothing was written — remove them, or give "
                            "--allow-secrets to write the bundle anyway")
    prog = Progress("export", enabled=not json_out)
    info = export_sessions(store, sessions, output, fmt=fmt, progress=prog)
    prog.done()
    if json_out:
        emit_json(info.to_json())
        return
    out(f"wrote {t(output)}: {len(info.refs)} session(s), {info.objects} objects, {info.file_bytes} bytes ({info.format})")


@session_app.command("import")
def import_cmd(
    bundle: str = typer.Argument(..., metavar="FILE"),
    workspace: list[str] = typer.Option(
        ..., "--workspace", "-w", metavar="DIR|SES=DIR",
        help="The workspace to bind the imported sessions to; SES=DIR binds one session elsewhere "
             "(a worktree fork: a worktree of its branch). Repeatable."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Verify a bundle, import its sessions and bind them to WORKSPACE."""
    from kxen_agent.runtime.lease import Lease, lease_ttl_s
    from kxen_agent.session.transfer import import_sessions

    from ._render import Progress

    lease_ttl_s()  # a bad KXEN_AGENT_LEASE_TTL_S is refused before any object is imported
    default, per_session = _workspaces(workspace)
    store = Store.open(namespaces=(NS,))
    prog = Progress("import", enabled=not json_out)
    res = import_sessions(store, bundle, default, workspaces=per_session, progress=prog,
                          acquire_lease=lambda ses: Lease.acquire(store, ses, purpose="import"))
    prog.done()
    if json_out:
        emit_json(res.to_json())
        return
    for ses, status in sorted(res.sessions.items()):
        out(f"{t(ses)}: {status}, bound to {t(res.bindings[ses].root)}")
    where = t(res.workspace.root) if all(b == res.workspace for b in res.bindings.values()) else "DIR (as bound above)"
    out(f"imported {t(bundle)}: {res.result.new_objects} new objects; "
        f"resume with `kxen-agent --resume SES --workspace {where}`")


def _workspaces(values: list[str]) -> tuple[str, dict[str, str]]:
    """``--workspace`` values: one DIR (the default binding), and SES=DIR for sessions bound elsewhere."""
    from kxen_agent.errors import UsageError
    from kxen_agent.session.schema import SES_RE

    default: list[str] = []
    per_session: dict[str, str] = {}
    for v in values:
        ses, eq, d = v.partition("=")
        if eq and SES_RE.fullmatch(ses):
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
