"""The fleet case: one Git remote holding many sessions (issue 32, item 5).

::

    .venv/bin/python -m bench.fleet [--sizes 1,500,10000] [--repeats 3] [--pushers 8 --rounds 5]

**The builder** (:func:`build_remote`) makes a bare remote of N sessions
with one ``git fast-import`` stream, not N pushes, in the exact layout a
first ``session push`` makes (``objects_spec.md`` §16.1-§16.5): per
session an objects commit (no parent; a fan-out tree of its kxen objects'
blobs) and on top of it the group commit (tree: the ``refs`` blob; message
``kxen group sessions/<ses>`` and the summary), named by
``refs/kxen/sessions/<ses>``; one session in 100 also holds a remote lease
(``refs/kxen/leases/<ses>``, a lease commit, §16.6). Each session has
fresh ids: its own metadata object (``id``, ``branchRootId``), its own two
messages; the agent lock is shared, as a fleet's runners share one agent.
:func:`template_check` pushes one real session and proves that the
builder's image of that same session is, commit for commit, what the
push wrote (the same SHA-1s).

**The figures** (each through the CLI, a process as a user runs it, or
in-process where the issue asks for ratios of one operation):

- ``session ls-remote`` warm (nothing new since this state dir last
  looked) and cold (a fresh state dir) at each size; the ``git``
  processes each started (a counting wrapper on ``PATH``);
- push and pull of one session against the remote of N vs of 1 (first
  push, a 10-message incremental push, a pull into a fresh state dir): the
  ratio of the medians and the bytes each push added to the remote, for
  a remote as built and one **maintained** as a hosting service keeps it
  (packed refs and a commit-graph, :func:`build_remote`), each with the
  push narrowed (the remote advertises only the refs it needs,
  ``receive.hideRefs``) and plain (``KXEN_AGENT_NARROW_PUSH=0``: every
  ref, as ``git push`` speaks protocol v0); then Git's own floor, a plain
  ``git push`` of one commit into the same remotes, both ways, with the
  advertisement it received and the remote's connectivity check (its
  ``rev-list --not --all``) from a trace;
- P runner processes pushing P different sessions to one bare remote at
  once, R rounds: every push must land (no compare-and-swap failure
  between unrelated sessions).

Times are wall clock with CPU (user+sys, the process and its children)
beside them; the machine is shared, so the CPU figures and the ratios are
the ones to read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["FleetSession", "build_remote", "git_counter", "make_session", "template_check"]

_T = 1_760_000_000  # a fixed clock: identical builds write identical bytes
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def _git(*args: str, cwd: str | None = None, input: bytes | None = None) -> bytes:
    p = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=dict(os.environ, **_GIT_ENV))
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout


# ---------------------------------------------------------------- one session's Git image


@dataclass(frozen=True)
class FleetSession:
    """One session of the fleet: its id, its kxen objects (parents before children) and refs, its summary."""

    ses: str
    objects: tuple  # RawObject, in the order a push lists them
    refs: dict
    summary: tuple
    lease: bytes | None  # the holder record of its remote lease, if it holds one


def _ses_id(i: int, salt: str) -> str:
    return f"ses_{salt}{i:08d}"


_WS_RECORD: dict | None = None


def make_session(i: int, *, salt: str = "f1eet", agent: Any = None, workspace: dict | None = None,
                 leased: bool = False) -> FleetSession:
    """Session ``i`` of a fleet: metadata, a user task and an answer, ``head`` on the answer."""
    from kxen_agent.store.objects import encode_object

    ses = _ses_id(i, salt)
    agent = agent or _agent()
    ws = workspace or _workspace_record()
    meta = encode_object("session", {
        "id": ses, "parentId": None, "branchRootId": ses, "forkPoint": None, "forkKind": None,
        "agent": agent.id, "workspace": ws, "createdNs": _T * 10**9 + i, "reason": "create",
        "revisedNs": _T * 10**9 + i})
    m0 = encode_object("message", {"seq": 0, "role": "user", "content": f"fleet task {i}: check the build"})
    m1 = encode_object("message", {"seq": 1, "role": "assistant", "parent": m0.id,
                                   "content": f"Task {i} done: the build is green."})
    refs = {"head": m1.id, "meta": meta.id}
    summary = (("parent", "-"), ("fork-kind", "-"), ("head", "msg_" + m1.id.hex()), ("messages", "2"))
    lease = None
    if leased:
        lease = json.dumps({"expiresNs": (_T + 3600) * 10**9, "fence": 1, "host": f"runner-{i % 97}",
                            "pid": 1000 + i, "run": None, "session": ses, "sinceNs": _T * 10**9,
                            "ttlMs": 60000}, sort_keys=True).encode("ascii")
    # Parents first, as a push's walk from the refs finds them (the order is the pack's, not the tree's).
    return FleetSession(ses, (m1, m0, meta, agent), refs, summary, lease)


_AGENT = None


def _agent():
    global _AGENT
    if _AGENT is None:
        from kxen_agent.session.agent_def import default_agent_definition
        from kxen_agent.store.objects import encode_object

        _AGENT = encode_object("agent", default_agent_definition([{"content": "done"}], name="fleet"))
    return _AGENT


def _workspace_record() -> dict:
    global _WS_RECORD
    if _WS_RECORD is None:
        _WS_RECORD = {"root": "/srv/fleet/repo", "identity": "1" * 64, "repo_root": "/srv/fleet/repo",
                      "remote_hash": "2" * 64, "branch": "main", "head": "3" * 40}
    return _WS_RECORD


def image(s: FleetSession, when: int = _T):
    """The Git objects a first push of ``s`` makes: (objects commit's objects, group commit's objects)."""
    from kxen_agent.store.gitmap import group_commit, objects_commit

    made = objects_commit(list(s.objects), when)
    gc = group_commit(f"sessions/{s.ses}", 0, dict(s.refs), [made[-1].oid], when, s.summary)
    return made, gc


# ---------------------------------------------------------------- the builder


def _commit_header(ref: str, when: int, message: bytes) -> bytes:
    ident = b"kxen-agent <kxen-agent@localhost> %d +0000\n" % when
    return (b"commit " + ref.encode("ascii") + b"\nauthor " + ident + b"committer " + ident
            + b"data %d\n" % len(message) + message)


def fast_import_stream(sessions: Iterable[FleetSession], when: int = _T) -> Iterable[bytes]:
    """The ``git fast-import`` commands of the sessions' first pushes (and their lease commits)."""
    from kxen_agent.store.gitmap import encode_group_blob, _summary_lines

    shared: dict[bytes, int] = {}  # kxen id -> mark of a blob two sessions share (the agent lock)
    mark = 0
    for s in sessions:
        ref = f"refs/kxen/sessions/{s.ses}"
        out: list[bytes] = []
        blobs = {}
        for obj in s.objects:
            if obj.id in blobs:
                continue
            if obj.kind == "agent":
                if obj.id not in shared:
                    mark += 1
                    shared[obj.id] = mark
                    out.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(obj.raw), obj.raw))
                blobs[obj.id] = b":%d" % shared[obj.id]
            else:
                blobs[obj.id] = None
        # The objects commit: no parent (a new ref), its tree the fan-out of §16.3.
        out.append(_commit_header(ref, when, b"kxen objects %d\n" % len(blobs)))
        byid = {o.id: o for o in s.objects}
        for kid, m in blobs.items():
            path = kid.hex()[:2].encode() + b"/" + kid.hex()[2:].encode()
            if m is not None:
                out.append(b"M 100644 " + m + b" " + path + b"\n")
            else:
                raw = byid[kid].raw
                out.append(b"M 100644 inline " + path + b"\ndata %d\n%s\n" % (len(raw), raw))
        # The group commit on top: its first parent is the objects commit (the ref's tip), its tree the refs blob.
        message = b"kxen group sessions/" + s.ses.encode("ascii") + b"\n"
        lines = _summary_lines(s.summary)
        if lines:
            message += b"\n" + lines
        refs_blob = encode_group_blob(f"sessions/{s.ses}", 0, dict(s.refs))
        out.append(_commit_header(ref, when, message))
        out.append(b"deleteall\nM 100644 inline refs\ndata %d\n%s\n" % (len(refs_blob), refs_blob))
        if s.lease is not None:
            msg = b"kxen lease sessions/" + s.ses.encode("ascii") + b"\n"
            out.append(_commit_header(f"refs/kxen/leases/{s.ses}", when, msg))
            out.append(b"M 100644 inline lease\ndata %d\n%s\n" % (len(s.lease), s.lease))
        yield b"".join(out)


def build_remote(path: str, n: int, *, salt: str = "f1eet", leases_every: int = 100, pack_refs: bool = True,
                 maintained: bool = False, extra: Sequence[FleetSession] = ()) -> list[str]:
    """A bare remote at ``path`` holding ``n`` fleet sessions (and ``extra``); their ids, in order.

    One ``git fast-import`` (one pack); ``pack_refs``: the refs then packed,
    as the remote's own gc leaves them (the pushes that follow add loose ones);
    ``maintained``: kept as a hosting service keeps a repository, its refs
    packed and a commit-graph of everything reachable (``git pack-refs
    --all``, ``git commit-graph write --reachable``: what scheduled
    maintenance writes), so Git reads a commit from the graph instead of
    inflating it.
    """
    if os.path.exists(path):
        shutil.rmtree(path)
    _git("init", "-q", "--bare", path)
    sessions = [make_session(i, salt=salt, leased=leases_every > 0 and i % leases_every == leases_every - 1)
                for i in range(n)] + list(extra)
    proc = subprocess.Popen(["git", "fast-import", "--quiet", "--done"], cwd=path, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, **_GIT_ENV))
    assert proc.stdin is not None
    for chunk in fast_import_stream(sessions):
        proc.stdin.write(chunk)
    proc.stdin.write(b"done\n")
    proc.stdin.close()
    err = proc.stderr.read() if proc.stderr else b""
    if proc.wait() != 0:
        raise RuntimeError(f"git fast-import failed: {err.decode(errors='replace')[-2000:]}")
    if pack_refs or maintained:
        _git("pack-refs", "--all", cwd=path)
    if maintained:
        _git("commit-graph", "write", "--reachable", cwd=path)
    return [s.ses for s in sessions]


def template_check(work: str) -> dict:
    """Push one real session; prove the builder makes the same Git objects for it (same SHA-1s)."""
    from kxen_agent.session.remote import push_sessions
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store.objects import decode_body

    from ._kxen import Builder, measuring_store

    remote = os.path.join(work, "template.git")
    ws = _workspace(os.path.join(work, "template-ws"), remote)
    state = os.path.join(work, "template-state")
    shutil.rmtree(state, ignore_errors=True)
    b = Builder(state, ws)
    head = b.chain([{"role": "user", "content": "fleet task 0: check the build"},
                    {"role": "assistant", "content": "Task 0 done: the build is green."}], [2])[2]
    ses = b.session(head)
    push_sessions(measuring_store(state), [ses])
    tip = _git("rev-parse", f"refs/kxen/sessions/{ses}", cwd=remote).decode().strip()
    info = SessionStore(b.store).get(ses)
    meta = b.store.read_raw(info.meta_oid)
    agent = b.store.read_raw(info.meta["agent"])
    m1 = b.store.read_raw(head)
    m0 = b.store.read_raw(b.store.get(head, "message")["parent"])
    when = int(_git("log", "-1", "--format=%ct", tip, cwd=remote).decode())
    s = FleetSession(ses, (m1, m0, meta, agent), {"head": head, "meta": meta.id},
                     (("parent", "-"), ("fork-kind", "-"), ("head", "msg_" + head.hex()), ("messages", "2")), None)
    made, gc = image(s, when)
    # The same through fast-import, into a scratch remote.
    scratch = os.path.join(work, "template-fi.git")
    shutil.rmtree(scratch, ignore_errors=True)
    _git("init", "-q", "--bare", scratch)
    _git("fast-import", "--quiet", cwd=scratch, input=b"".join(fast_import_stream([s], when)))
    fi_tip = _git("rev-parse", f"refs/kxen/sessions/{ses}", cwd=scratch).decode().strip()
    ok = gc[-1].hex == tip == fi_tip
    # A fleet session's metadata has the fields of a real one.
    if set(b.store.get(info.meta_oid, "session")) != set(decode_body(make_session(0).objects[2])):
        raise AssertionError("a fleet session's metadata has other keys than a real one's")
    if not ok:
        raise AssertionError(f"the builder's image differs from a real push: push {tip}, gitmap {gc[-1].hex}, "
                             f"fast-import {fi_tip}")
    return {"session": ses, "commit": tip}


def _workspace(path: str, origin: str) -> str:
    """A code repository whose ``origin`` is ``origin`` (created bare if missing), one commit on main."""
    if not os.path.exists(origin):
        _git("init", "-q", "--bare", origin)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    _git("init", "-q", "-b", "main", cwd=path)
    _git("-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-q", "--allow-empty", "-m", "code",
         cwd=path)
    _git("remote", "add", "origin", origin, cwd=path)
    return path


# ---------------------------------------------------------------- counting git processes


def git_counter(bin_dir: str, log: str) -> dict[str, str]:
    """Environment that puts a ``git`` on PATH which appends its arguments to ``log``, then runs the real one."""
    real = shutil.which("git")
    assert real is not None
    os.makedirs(bin_dir, exist_ok=True)
    script = os.path.join(bin_dir, "git")
    with open(script, "w") as f:
        f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "$KXEN_GIT_COUNT_LOG"\nexec {real} "$@"\n')
    os.chmod(script, 0o755)
    return {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "KXEN_GIT_COUNT_LOG": log}


def count_log(log: str) -> dict[str, int]:
    """How many git processes the log names, by subcommand (the ``-c``/``--git-dir`` options skipped)."""
    out: dict[str, int] = {}
    if not os.path.exists(log):
        return out
    for line in open(log, encoding="utf-8", errors="replace"):
        words = line.split()
        i = 0
        while i < len(words) and words[i].startswith("-"):
            i += 2 if words[i] in ("-c", "-C") else 1
        sub = words[i] if i < len(words) else "?"
        out[sub] = out.get(sub, 0) + 1
    return out


# ---------------------------------------------------------------- measuring


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cli(args: Sequence[str], *, state: str, cwd: str, env: dict | None = None) -> tuple[float, float, bytes]:
    """Run ``kxen-agent ARGS`` as a process; (wall s, CPU s of it and its children, stdout)."""
    e = dict(os.environ, KXEN_AGENT_STATE_DIR=state, **(env or {}))
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "kxen_agent", *args], cwd=cwd, env=e, capture_output=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if p.returncode != 0:
        raise RuntimeError(f"kxen-agent {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    return wall, cpu, p.stdout


def ls_remote_figures(work: str, sizes: Sequence[int], repeats: int, log=print) -> list[dict]:
    rows = []
    for n in sizes:
        remote = os.path.join(work, f"fleet-{n}.git")
        t0 = time.perf_counter()
        build_remote(remote, n)
        log(f"built a remote of {n:,} sessions in {time.perf_counter() - t0:.1f} s")
        ws = _workspace(os.path.join(work, f"ws-{n}"), remote)
        cold, warm, cold_cpu, warm_cpu = [], [], [], []
        counts: dict[str, dict] = {}
        for r in range(repeats):
            state = os.path.join(work, f"state-{n}-{r}")
            shutil.rmtree(state, ignore_errors=True)
            _init_state(state)
            for kind, dest, cdest in (("cold", cold, cold_cpu), ("warm", warm, warm_cpu)):
                glog = os.path.join(work, f"git-{n}-{r}-{kind}.log")
                if os.path.exists(glog):
                    os.unlink(glog)
                env = git_counter(os.path.join(work, "bin"), glog) if r == 0 else {}
                wall, cpu, out = cli(["session", "ls-remote", "--json"], state=state, cwd=ws, env=env)
                listed = json.loads(out)["sessions"]
                assert len(listed) == n and not any("error" in s for s in listed), (n, len(listed))
                dest.append(wall)
                cdest.append(cpu)
                if r == 0:
                    counts[kind] = count_log(glog)
        row = {"sessions": n, "cold_s": statistics.median(cold), "cold_cpu_s": statistics.median(cold_cpu),
               "warm_s": statistics.median(warm), "warm_cpu_s": statistics.median(warm_cpu),
               "cold_git": sum(counts["cold"].values()), "warm_git": sum(counts["warm"].values()),
               "cold_git_by": counts["cold"], "warm_git_by": counts["warm"]}
        log(json.dumps(row))
        rows.append(row)
    return rows


def _init_state(state: str) -> None:
    """A fresh state dir that exists (as a runner's does): the store's skeleton, no session."""
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    from kxen_agent.store.objects import encode_object

    # The first write creates the state dir (objects_spec.md §10.3): one object, no session.
    Store(state, namespaces=(NS,)).put_raw(encode_object("blob", b"fleet"))


def _cpu_all() -> float:
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def _timed(fn, *a, **kw) -> tuple[float, float, Any]:
    c0, t0 = _cpu_all(), time.perf_counter()
    v = fn(*a, **kw)
    return time.perf_counter() - t0, _cpu_all() - c0, v


def _conversation(n: int, tag: str) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"role": "user" if i % 2 == 0 else "assistant",
                    "content": f"{tag} message {i}: " + "fleet work in progress. " * 8})
    return out


#: How each remote is kept (:func:`build_remote`): as built (one pack, packed refs), maintained (a commit-graph too).
KEEPS = ("built", "maintained")
#: How a session push asks for the remote's refs: narrowed (``receive.hideRefs``,
#: :mod:`kxen_agent.session.narrow_push`) or plain (every ref advertised, ``KXEN_AGENT_NARROW_PUSH=0``).
MODES = ("narrow", "plain")


def _stored_bytes(repo: str) -> int:
    """The bytes of every file under the repository's ``objects/`` (what a push added, by difference)."""
    total = 0
    for d, _, files in os.walk(os.path.join(repo, "objects")):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def push_pull_figures(work: str, sizes: Sequence[int], repeats: int, messages: int = 200, log=print,
                      keeps: Sequence[str] = KEEPS, modes: Sequence[str] = MODES) -> dict:
    """Push (first, then 10 more messages) and pull of one session against remotes of each size.

    For each way the remote is kept (``keeps``) and each way of pushing
    (``modes``): the medians at each size, the ratio of the largest size's
    to the smallest's, the bytes the remote stored for each push; then
    Git's own floor: a plain ``git push`` of one commit, with every ref
    advertised and with the narrowed ``receive-pack``, its ref
    advertisement and the remote's connectivity check (a ``GIT_TRACE2_EVENT``
    trace).
    """
    from kxen_agent.session import narrow_push

    res: dict[str, Any] = {}
    saved = os.environ.get(narrow_push.ENV)
    try:
        for keep in keeps:
            for mode in modes:
                os.environ[narrow_push.ENV] = "1" if mode == "narrow" else "0"
                res[f"{keep}/{mode}"] = _push_pull(work, sizes, repeats, messages, keep, mode, log)
    finally:
        if saved is None:
            os.environ.pop(narrow_push.ENV, None)
        else:
            os.environ[narrow_push.ENV] = saved
    for keep in keeps:
        res[f"{keep}/git"] = _git_push_floor(work, sizes, keep, max(repeats, 3), log)
    return res


def _push_pull(work: str, sizes: Sequence[int], repeats: int, messages: int, keep: str, mode: str, log) -> dict:
    from kxen_agent.session.remote import push_sessions
    from kxen_agent.session.remote_pull import pull_sessions
    from kxen_agent.store import RefUpdate

    from ._kxen import Builder, measuring_store

    res: dict[Any, Any] = {}
    for n in sizes:
        src = os.path.join(work, f"fleet-{n}-{keep}.git")
        if not os.path.exists(src):
            build_remote(src, n, maintained=keep == "maintained")
        remote = os.path.join(work, f"pp-{n}-{keep}-{mode}.git")
        shutil.rmtree(remote, ignore_errors=True)
        shutil.copytree(src, remote)
        refs = _git("for-each-ref", "--format=%(objectname) %(refname)", cwd=remote)
        rounds = []
        for r in range(repeats):
            tag = f"{n}-{keep}-{mode}-{r}"
            ws = _workspace(os.path.join(work, f"pp-ws-{tag}"), remote)
            state = os.path.join(work, f"pp-state-{tag}")
            shutil.rmtree(state, ignore_errors=True)
            b = Builder(state, ws)
            msgs = _conversation(messages + 10, f"pp{tag}")
            head = b.chain(msgs[:messages], [messages])[messages]
            ses = b.session(head)
            row: dict[str, float] = {}
            stored = _stored_bytes(remote)
            row["push"], row["push_cpu"], _ = _timed(push_sessions, measuring_store(state), [ses])
            row["push_bytes"], stored = _stored_bytes(remote) - stored, _stored_bytes(remote)
            more = b.chain(msgs[messages:], [10], parent=head)[10]
            b.store.refs.transaction(f"sessions/{ses}", [RefUpdate("head", head, more)], reason="bench: 10 more")
            row["inc"], row["inc_cpu"], _ = _timed(push_sessions, measuring_store(state), [ses])
            row["inc_bytes"] = _stored_bytes(remote) - stored
            dest = os.path.join(work, f"pp-pulled-{tag}")
            shutil.rmtree(dest, ignore_errors=True)
            clone = os.path.join(work, f"pp-clone-{tag}")
            shutil.rmtree(clone, ignore_errors=True)
            _git("clone", "-q", ws, clone)  # the same code commit, another checkout
            _git("remote", "set-url", "origin", remote, cwd=clone)
            row["pull"], row["pull_cpu"], _ = _timed(pull_sessions, measuring_store(dest), [ses], clone)
            rounds.append(row)
        med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
        med["refs"] = len(refs.splitlines())
        res[n] = med
        log(f"{keep} remote, {mode} push: push/pull against {n:,} sessions: {json.dumps(med)}")
    lo, hi = min(sizes), max(sizes)
    res["ratios"] = {}
    for k in ("push", "inc", "pull"):
        res["ratios"][k] = res[hi][k] / res[lo][k]
        res["ratios"][k + "_cpu"] = res[hi][k + "_cpu"] / res[lo][k + "_cpu"]
    log(f"{keep} remote, {mode} push: ratios {hi:,} / {lo:,}: {json.dumps(res['ratios'])}")
    return res


def _git_push_floor(work: str, sizes: Sequence[int], keep: str, repeats: int, log) -> dict:
    """Git's own cost of a remote's size: ``git push`` of one new commit, every ref advertised or narrowed."""
    from kxen_agent.session.narrow_push import receive_pack_command

    probe = os.path.join(work, "probe.git")
    if not os.path.exists(probe):
        _git("init", "-q", "--bare", probe)
    blob = _git("hash-object", "-w", "--stdin", cwd=probe, input=b"probe\n").decode().strip()
    tree = _git("mktree", cwd=probe, input=f"100644 blob {blob}\tprobe\n".encode()).decode().strip()
    res: dict[Any, Any] = {}
    for n in sizes:
        remote = os.path.join(work, f"pp-{n}-{keep}-plain.git")
        if not os.path.exists(remote):
            shutil.copytree(os.path.join(work, f"fleet-{n}-{keep}.git"), remote)
        row: dict[str, Any] = {}
        for how in ("plain", "narrow"):
            times, cpus = [], []
            for r in range(repeats + 1):
                ref = f"refs/kxen/probe/{how}-{r}"
                extra = [f"--receive-pack={receive_pack_command([ref])}"] if how == "narrow" else []
                commit = _probe_commit(probe, tree, f"{n}-{keep}-{how}-{r}")
                if r == repeats:  # one more, traced (not timed): the advertisement and the connectivity check
                    row[how] = _traced_push(work, probe, remote, extra, f"{commit}:{ref}")
                    continue
                c0, t0 = _children_cpu(), time.perf_counter()
                _git("push", "-q", *extra, remote, f"{commit}:{ref}", cwd=probe)
                times.append(time.perf_counter() - t0)
                cpus.append(_children_cpu() - c0)
            row[how].update(s=statistics.median(times), cpu=statistics.median(cpus))
        res[n] = row
        log(f"{keep} remote: git push of one commit into {n:,} sessions: {json.dumps(row)}")
    lo, hi = min(sizes), max(sizes)
    res["ratios"] = {how: res[hi][how]["cpu"] / res[lo][how]["cpu"] for how in ("plain", "narrow")}
    return res


def _traced_push(work: str, repo: str, remote: str, extra: Sequence[str], spec: str) -> dict:
    """One ``git push`` traced: bytes of ref advertisement received, the remote's receive-pack and rev-list seconds.

    ``GIT_TRACE_PACKET`` gives the advertisement (every ``push<`` line
    before the first flush); ``GIT_TRACE2_EVENT`` each process's run time
    and the connectivity check's (the ``rev-list ... --not --all`` that
    receive-pack starts): wall times, of a single push.
    """
    packets, events = os.path.join(work, "trace-packets"), os.path.join(work, "trace-events")
    for f in (packets, events):
        if os.path.exists(f):
            os.unlink(f)
    env = dict(os.environ, **_GIT_ENV, GIT_TRACE_PACKET=packets, GIT_TRACE2_EVENT=events)
    p = subprocess.run(["git", "push", "-q", *extra, remote, spec], cwd=repo, env=env, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"traced git push failed: {p.stderr.decode(errors='replace')[-2000:]}")
    advert, refs = 0, 0
    for line in open(packets, encoding="utf-8", errors="replace"):
        if "push< " not in line:
            continue
        payload = line.split("push< ", 1)[1].rstrip("\n")
        if payload == "0000":
            break
        advert += len(payload) + 4  # the pkt-line length prefix
        refs += 1
    starts, out = {}, {"advert_bytes": advert, "advert_refs": refs}
    for line in open(events, encoding="utf-8", errors="replace"):
        ev = json.loads(line)
        if ev.get("event") == "start" and any(a == "receive-pack" or a.endswith("git-receive-pack")
                                              for a in ev.get("argv", [])):
            starts[ev["sid"]] = "receive_pack_s"
        elif ev.get("event") == "child_start" and "--alternate-refs" in ev.get("argv", []):
            starts[(ev["sid"], ev["child_id"])] = "connectivity_s"
        elif ev.get("event") == "child_exit" and (ev["sid"], ev["child_id"]) in starts:
            out[starts[(ev["sid"], ev["child_id"])]] = ev["t_rel"]
        elif ev.get("event") == "atexit" and ev["sid"] in starts:
            out[starts[ev["sid"]]] = ev["t_abs"]
    return out


def _probe_commit(repo: str, tree: str, tag: str) -> str:
    env = dict(os.environ, **_GIT_ENV, GIT_AUTHOR_NAME="p", GIT_AUTHOR_EMAIL="p@example.invalid",
               GIT_COMMITTER_NAME="p", GIT_COMMITTER_EMAIL="p@example.invalid")
    p = subprocess.run(["git", "commit-tree", tree, "-m", f"probe {tag}"], cwd=repo, env=env, capture_output=True,
                       check=True)
    return p.stdout.decode().strip()


def _pusher(state: str, ws: str, rounds: int, start_at: float, out: str) -> None:
    """One runner: a session of its own, then ``rounds`` times 5 more messages and a push; results as JSON lines."""
    from kxen_agent.session.remote import push_sessions
    from kxen_agent.store import RefUpdate

    from ._kxen import Builder, measuring_store

    b = Builder(state, ws)
    tag = os.path.basename(state)
    msgs = _conversation(4 + 5 * rounds, tag)
    head = b.chain(msgs[:4], [4])[4]
    ses = b.session(head)
    while time.time() < start_at:
        time.sleep(0.005)  # a common start, so that the pushes overlap
    with open(out, "a") as f:
        for r in range(rounds):
            if r:
                new = b.chain(msgs[4 + 5 * r: 9 + 5 * r], [5], parent=head)[5]
                b.store.refs.transaction(f"sessions/{ses}", [RefUpdate("head", head, new)], reason="bench: more")
                head = new
            t0 = time.perf_counter()
            try:
                push_sessions(measuring_store(state), [ses])
                f.write(json.dumps({"ses": ses, "round": r, "ok": True, "s": time.perf_counter() - t0}) + "\n")
            except Exception as e:  # every failure is a figure: say which
                f.write(json.dumps({"ses": ses, "round": r, "ok": False, "error": str(e)[:400]}) + "\n")
            f.flush()


def concurrent_pushers(work: str, remote: str, pushers: int, rounds: int, log=print) -> dict:
    """``pushers`` processes push ``rounds`` times each, at once, to ``remote``: how many landed."""
    procs = []
    out = os.path.join(work, "pushers.jsonl")
    if os.path.exists(out):
        os.unlink(out)
    start_at = time.time() + 3.0 + 0.3 * pushers
    for i in range(pushers):
        ws = _workspace(os.path.join(work, f"pusher-ws-{i}"), remote)
        state = os.path.join(work, f"pusher-state-{i}")
        shutil.rmtree(state, ignore_errors=True)
        code = (f"from bench.fleet import _pusher; _pusher({state!r}, {ws!r}, {rounds}, {start_at!r}, "
                f"{out + '.' + str(i)!r})")
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
    for p in procs:
        p.wait()
    results = []
    for i in range(pushers):
        path = out + "." + str(i)
        if os.path.exists(path):
            results += [json.loads(line) for line in open(path)]
    ok = sum(1 for x in results if x["ok"])
    failed = [x for x in results if not x["ok"]]
    # Every pushed session's ref names the commit of its last round.
    remote_refs = _git("for-each-ref", "--format=%(refname)", "refs/kxen/sessions/", cwd=remote).decode().split()
    landed = {x["ses"] for x in results} <= {r.rsplit("/", 1)[1] for r in remote_refs}
    res = {"pushers": pushers, "rounds": rounds, "pushes": len(results), "landed": ok, "failed": failed,
           "all_refs_present": landed, "exit_codes": [p.returncode for p in procs],
           "median_push_s": statistics.median(x["s"] for x in results if x["ok"]) if ok else None}
    log(f"concurrent pushers: {json.dumps(res)[:2000]}")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,500,10000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--only", default="template,ls,pushpull,pushers")
    ap.add_argument("--pushers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", dest="json_out", default=None, help="write the figures here as JSON")
    a = ap.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="kxen-fleet-")
    os.makedirs(work, exist_ok=True)
    only = set(a.only.split(","))
    figures: dict[str, Any] = {}
    if "template" in only:
        figures["template"] = template_check(work)
        print("template: the builder's image of a real push is identical:", figures["template"])
    if "ls" in only:
        figures["ls_remote"] = ls_remote_figures(work, [int(x) for x in a.sizes.split(",")], a.repeats)
    sizes = [int(x) for x in a.sizes.split(",")]
    if "pushpull" in only:
        figures["push_pull"] = push_pull_figures(work, [min(sizes), max(sizes)], a.repeats)
    if "pushers" in only:
        src = os.path.join(work, f"fleet-{max(sizes)}-maintained.git")
        if not os.path.exists(src):
            build_remote(src, max(sizes), maintained=True)
        remote = os.path.join(work, "pushers.git")
        shutil.rmtree(remote, ignore_errors=True)
        shutil.copytree(src, remote)
        figures["pushers"] = concurrent_pushers(work, remote, a.pushers, a.rounds)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
