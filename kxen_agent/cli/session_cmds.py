"""``kxen-agent session ...``: list, show, log, tree, fork, delete, export, import."""

from __future__ import annotations

import time
from typing import Optional

import typer

from kxen_agent.runtime.runner import Runner
from kxen_agent.session.sessions import SessionInfo, SessionStore
from kxen_agent.store import Store

from ._render import emit_json, out

session_app = typer.Typer(help="List, inspect, fork, delete, export and import sessions.", no_args_is_help=True)


def _sessions() -> SessionStore:
    return SessionStore(Store.open())


def _runs_json(runner: Runner, info: SessionInfo) -> list[dict]:
    runs = []
    for run, oid in info.runs.items():
        st = runner.store.get(oid, "run")
        runs.append({"id": run, "index": st["index"], "status": st["status"], "settled": st.get("settled", False),
                     "turn": st["turn"], "model": st["model"], "task": st["task"]})
    runs.sort(key=lambda r: r["index"])
    return runs


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


@session_app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json")) -> None:
    """Every session in the state dir."""
    store = Store.open()
    runner = Runner(store)
    rows = []
    for info in runner.sessions.list():
        runs = _runs_json(runner, info)
        d = info.to_json()
        d["messages"] = runner.sessions.message_count(info)
        d["runs"] = runs
        d["status"] = runs[-1]["status"] if runs else None
        rows.append(d)
    if json_out:
        emit_json({"stateDir": store.root, "sessions": rows})
        return
    if not rows:
        out(f"no sessions in {store.root}")
        return
    for d in rows:
        fork = f" fork of {d['parentId']} ({d['forkKind']})" if d["parentId"] else ""
        out(f"{d['id']}  {d['status'] or 'no runs':<14} {d['messages']:>6} msgs  {d['workspace']['root']}{fork}")


@session_app.command("show")
def show_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """Ids, fork fields, workspace binding, agent lock, runs and their statuses."""
    runner = Runner(Store.open())
    info = runner.sessions.get(ses)
    agent = runner.sessions.agent(info)
    d = info.to_json()
    d["messages"] = runner.sessions.message_count(info)
    d["agent"] = {"lock": info.agent_oid.hex(), "name": agent.get("name"), "provider": agent.get("provider"),
                  "model": agent.get("model"), "tools": agent.get("tools"), "policy": agent.get("policy"),
                  "apiKeyEnv": agent.get("api_key_env")}
    d["runs"] = _runs_json(runner, info)
    if json_out:
        emit_json(d)
        return
    out(f"session {d['id']}")
    out(f"  parentId:     {d['parentId'] or '-'}")
    out(f"  branchRootId: {d['branchRootId']}")
    out(f"  forkPoint:    {d['forkPoint'] or '-'}")
    out(f"  forkKind:     {d['forkKind'] or '-'}")
    out(f"  created:      {_when(d['createdNs'])}")
    ws = d["workspace"]
    out(f"  workspace:    {ws['root']}")
    out(f"    identity:   {ws['identity']}")
    if ws.get("repoRoot"):
        out(f"    repository: {ws['repoRoot']}  branch {ws.get('branch') or '(detached)'}  HEAD {ws.get('head') or '(none)'}")
        if ws.get("remoteHash"):
            out(f"    remote:     {ws['remoteHash']} (hash of the credential-free origin URL)")
    a = d["agent"]
    out(f"  agent lock:   {a['lock']} ({a['name']}, {a['provider']}/{a['model']})")
    out(f"  messages:     {d['messages']} (head {d['head'] or '-'})")
    out("  runs:")
    for r in d["runs"]:
        out(f"    {r['id']}  #{r['index']} {r['status']}{'' if r['settled'] else ' (not settled)'}  turns {r['turn']}  task: {r['task'][:60]}")


@session_app.command("log")
def log_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """The session's messages, oldest first (streamed)."""
    sessions = _sessions()
    info = sessions.get(ses)
    if json_out:
        # JSON Lines: one message per line, so a long history streams.
        import json
        import sys

        for m in sessions.iter_forward(info.head):
            sys.stdout.write(json.dumps(m.to_json(), ensure_ascii=False) + "\n")
        return
    for m in sessions.iter_forward(info.head):
        head = f"{m.id[:16]}  #{m.seq} {m.role}" + (f" ({m.run})" if m.run else "")
        out(head)
        if m.content:
            for line in m.content.rstrip("\n").split("\n"):
                out(f"    {line}")
        for c in m.tool_calls:
            out(f"    -> {c['name']} {c['arguments']}  [{c['id']}]")


@session_app.command("tree")
def tree_cmd(ses: str = typer.Argument(..., metavar="SES"), json_out: bool = typer.Option(False, "--json")) -> None:
    """The fork tree around SES, drawn."""
    sessions = _sessions()
    root, children, family = sessions.tree(ses)

    def label(sid: str) -> str:
        info = family.get(sid)
        if info is None:
            return f"{sid} (deleted or not here)"
        m = info.meta
        extra = f" at {m['forkPoint'][:16]}" if m.get("forkPoint") else ""
        kind = f" [{m['forkKind']}]" if m.get("forkKind") else ""
        gone = " (deleted)" if info.deleted_ns is not None else ""
        mark = "  <- this session" if sid == ses else ""
        return f"{sid}{kind}{extra}{gone}  {info.workspace.root}{mark}"

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
    extra = f", worktree {ws.root} on branch {ws.branch}" if worktree else ""
    out(f"forked from {ses} at {info.meta.get('forkPoint') or '(empty history)'} ({info.meta['forkKind']}{extra})")


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
) -> None:
    """Write a self-contained, credential-free bundle of the sessions."""
    from kxen_agent.session.transfer import export_sessions

    from ._render import Progress

    store = Store.open()
    prog = Progress("export", enabled=not json_out)
    info = export_sessions(store, sessions, output, fmt=fmt, progress=prog)
    prog.done()
    if json_out:
        emit_json(info.to_json())
        return
    out(f"wrote {output}: {len(info.refs)} session(s), {info.objects} objects, {info.file_bytes} bytes ({info.format})")


@session_app.command("import")
def import_cmd(
    bundle: str = typer.Argument(..., metavar="FILE"),
    workspace: str = typer.Option(..., "--workspace", "-w", help="The workspace to bind the imported sessions to."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Verify a bundle, import its sessions and bind them to WORKSPACE."""
    from kxen_agent.runtime.lease import Lease
    from kxen_agent.session.transfer import import_sessions

    from ._render import Progress

    store = Store.open()
    prog = Progress("import", enabled=not json_out)
    res = import_sessions(store, bundle, workspace, progress=prog,
                          acquire_lease=lambda ses: Lease.acquire(store, ses, purpose="import"))
    prog.done()
    if json_out:
        emit_json(res.to_json())
        return
    for ses, status in sorted(res.sessions.items()):
        out(f"{ses}: {status}, bound to {res.workspace.root}")
    out(f"imported {bundle}: {res.result.new_objects} new objects; resume with `kxen-agent --resume SES --workspace {res.workspace.root}`")
