"""Reads O(1) in history, through the CLI (issue #32, item 1).

::

    .venv/bin/python -m bench.reads                      # show/fork at 10 / 5,000 / 100,000 msgs; runs of 50 / 500 / 2,000 calls
    .venv/bin/python -m bench.reads --quick              # tiny sizes: checks that it runs
    .venv/bin/python -m bench.reads --only reads --sizes 10,5000 --repeats 5 --json out.json

**reads**: for each size, a state dir holding one session of that many
messages, left as runs leave it: the history's bulk written as objects and
packed (what automatic packing makes of a long history), then a real
:class:`~kxen_agent.runtime.runner.Runner` resuming it for ``--tail`` tool
calls (4 step-log records each) with automatic packing as the CLI has it,
so the session's step log holds what a run's steps leave in it (the
10-message session is one run of 4 calls). Then, as separate processes,
``kxen-agent session show SES`` and ``kxen-agent session fork SES --at
MSG`` (MSG: 16 hex digits of a message half-way back in the history),
sizes interleaved, ``--repeats`` times: the median wall time and CPU time
(user + system of the child, ``wait4``) of each, and each size's ratio to
the 10-message session's (target: within 1.1x).

**run**: a fresh state dir per size, one whole ``kxen-agent run`` process
with a scripted agent making 50 / 500 / 2,000 ``read_file`` calls (real
fsyncs, automatic packing at its default): the process's wall and CPU time
per call, and each run's per-call time as a ratio to the 50-call run's
(target: 2,000 within 1.2x).

Setup writes without fsyncs (:mod:`._kxen`); every measured process is
the real CLI over a plain file system.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from ._content import Conversation, safe_fork_point

__all__ = ["build_sessions", "cli", "main", "run_process", "w_reads", "w_run"]

#: Tool calls of the run that leaves each session's step log as runs leave it.
TAIL_CALLS = 324  # ~1,300 records: the log the issue measured (1,296 records since its last checkpoint)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _env(state: str) -> dict[str, str]:
    env = dict(os.environ)
    env["KXEN_AGENT_STATE_DIR"] = state
    env.pop("KXEN_AGENT_AUTOPACK", None)
    return env


class _Popen(subprocess.Popen):  # type: ignore[type-arg]
    """A Popen that keeps the child's CPU time (user + system) from wait4."""

    cpu = 0.0

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        try:
            pid, sts, ru = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid:
            self.cpu = ru.ru_utime + ru.ru_stime
        return pid, sts




def cli(state: str, args: list[str], cwd: str | None = None) -> tuple[float, float, str]:
    """Run ``kxen-agent ARGS`` as its own process: (wall s, CPU s of the child, stdout)."""
    exe = os.path.join(os.path.dirname(sys.executable), "kxen-agent")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "kxen_agent"]
    t = time.perf_counter()
    p = _Popen(cmd + args, env=_env(state), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"kxen-agent {' '.join(args)} failed ({p.returncode}): {err.decode()[-800:]}")
    return wall, p.cpu, out.decode()


# ================================================================== setup


def _workspace(work: str) -> str:
    ws = os.path.join(work, "ws")
    os.makedirs(ws, exist_ok=True)
    with open(os.path.join(ws, "notes.txt"), "w") as f:
        f.write(("notes of the benchmark, line after line of them\n" * 60)[:2048])
    return ws


class _Calls:
    """A provider asking for ``read_file notes.txt`` ``calls`` times, then answering."""

    model = "bench-reads"
    base_url = None

    def __init__(self, calls: int) -> None:
        self.calls, self.n = calls, 0

    def complete(self, messages: list[dict], tools: list[dict], **kw: Any) -> Any:
        from kxen_agent.runtime.providers import AssistantTurn, ToolCall

        self.n += 1
        if self.n > self.calls:
            return AssistantTurn("done", (), self.model)
        return AssistantTurn(None, (ToolCall(f"call_{self.n}", "read_file", '{"path": "notes.txt"}'),), self.model)

    def close(self) -> None:
        pass


def _bulk(cache: str, n: int, bulk: int, tail_calls: int, ws: str) -> tuple[str, str]:
    """A state dir holding a session of ``bulk`` messages, packed (kept in ``cache`` across runs of this
    bench: the bulk is the same whatever the code under test): (state dir, session)."""
    from ._kxen import Builder

    root = os.path.join(cache, f"bulk-{n}-{tail_calls}")
    done = os.path.join(root, ".bench-session")
    if os.path.exists(done):
        with open(done) as f:
            return root, f.read().strip()
    shutil.rmtree(root, ignore_errors=True)
    b = Builder(root, ws)
    b.lock["policy"]["max_turns"] = tail_calls + 5
    if bulk > 0:
        from kxen_agent.store.autopack import AutoPacker

        msgs = list(Conversation(1, 1 << 20).messages(bulk))
        k = safe_fork_point(msgs, bulk)
        ses = b.session(b.chain(msgs[:k], [])[k])
        AutoPacker(b.store, 1, background=False).pack_now()  # the bulk packed, as automatic packing leaves it
    else:
        ses = b.sessions.create(b.lock, b.ws).id
    with open(done, "w") as f:
        f.write(ses)
    return root, ses


def _plan(n: int, tail: int) -> tuple[int, int]:
    """(tool calls of the tail run, messages of the bulk) of a session of about ``n`` messages."""
    tail_calls = min(tail, max(1, (n - 2) // 2))
    return tail_calls, n - (2 * tail_calls + 2)


def _shared_bulk(cache: str, sizes: list[int], tail: int, ws: str) -> tuple[str, dict[int, str]]:
    """One state dir holding the bulk of every size's session (the largest's reused from :func:`_bulk`)."""
    from kxen_agent.store.autopack import AutoPacker

    from ._kxen import Builder

    root = os.path.join(cache, "bulk-shared-" + "-".join(map(str, sizes)) + f"-{tail}")
    meta = os.path.join(root, ".bench-sessions")
    if os.path.exists(meta):
        with open(meta) as f:
            return root, {int(k): v for k, v in json.load(f).items()}
    big = max(sizes)
    tc, bulk = _plan(big, tail)
    src, ses = _bulk(cache, big, bulk, tc, ws)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(src, root, symlinks=True)
    os.unlink(os.path.join(root, ".bench-session"))
    b = Builder(root, ws)
    b.lock["policy"]["max_turns"] = tail + 5
    out = {big: ses}
    for n in sizes:
        if n == big:
            continue
        tc, bulk = _plan(n, tail)
        if bulk > 0:
            msgs = list(Conversation(2 + n, 1 << 20).messages(bulk))
            k = safe_fork_point(msgs, bulk)
            out[n] = b.session(b.chain(msgs[:k], [])[k])
        else:
            out[n] = b.sessions.create(b.lock, b.ws).id
    AutoPacker(b.store, 1, background=False).pack_now()
    with open(meta, "w") as f:
        json.dump(out, f)
    return root, out


def _tail(root: str, ses: str, tail_calls: int, ws: str) -> str:
    """The tail run of ``ses`` (its step log left as a run leaves it); MSG of the session."""
    from kxen_agent.runtime import runner as rmod
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store
    from kxen_agent.store.autopack import AutoPacker
    from kxen_agent.store.fsio import FaultyIO

    store = Store(root, io=FaultyIO(None, sync=False), namespaces=("sessions",))
    runner = rmod.Runner(store, providers=lambda agent, endpoint: _Calls(tail_calls))
    runner.autopack = AutoPacker.for_store(store)  # as the CLI has it
    result = runner.resume(ses, task="benchmark the reads", workspace=ws)
    if result.status != "completed":
        raise RuntimeError(f"setup run ended {result.status}")
    sessions = SessionStore(store)
    info = sessions.get(ses)
    # MSG: a message half-way back that splits no tool turn (a user task or a final answer).
    want = (sessions.message_count(info) - 1) // 2
    for m in sessions.iter_back(info.head):
        if m.seq <= want and (m.role == "user" or (m.role == "assistant" and not m.tool_calls)):
            return "msg_" + m.oid.hex()[:16]
    raise RuntimeError(f"no fork point in {ses}")


def build_sessions(work: str, sizes: list[int], tail: int = TAIL_CALLS, cache: str | None = None,
                   shared: bool = True) -> dict[int, tuple[str, str, str]]:
    """Each size's session (see the module doc): {n: (state dir, session, MSG)}. ``shared``: all in one
    state dir, as a user's sessions are (else one state dir each: the smallest then holds no pack)."""
    ws = _workspace(cache or work)
    out = {}
    if shared:
        src, ses = _shared_bulk(cache or work, sizes, tail, ws)
        root = os.path.join(work, "S")
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(src, root, symlinks=True)
        os.unlink(os.path.join(root, ".bench-sessions"))
        for n in sizes:
            out[n] = (root, ses[n], _tail(root, ses[n], _plan(n, tail)[0], ws))
        return out
    for n in sizes:
        tc, bulk = _plan(n, tail)
        src, ses1 = _bulk(cache or work, n, bulk, tc, ws)
        root = os.path.join(work, f"S{n}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(src, root, symlinks=True)
        os.unlink(os.path.join(root, ".bench-session"))
        out[n] = (root, ses1, _tail(root, ses1, tc, ws))
    return out


# ================================================================== workloads


def w_reads(work: str, sizes: list[int], repeats: int, tail: int, out: dict, cache: str | None = None,
            shared: bool = True) -> None:
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store

    t = time.perf_counter()
    built = build_sessions(work, sizes, tail, cache, shared)
    log(f"reads: sessions built ({time.perf_counter() - t:.1f} s), {'one state dir' if shared else 'a state dir each'}")
    out["shared"] = shared
    for n in sizes:
        st = Store(built[n][0])
        g = f"sessions/{built[n][1]}"
        _, lg = st.refs.read_with_log(g)
        recs = len(lg.records) if lg is not None else 0
        msgs = SessionStore(st).message_count(SessionStore(st).get(built[n][1]))
        log(f"reads: session of {msgs:,} messages, {recs} step-log records, {len(st.packs)} packs")
        out.setdefault("setup", {})[n] = {"messages": msgs, "records": recs, "packs": len(st.packs)}
    res: dict[str, dict[int, dict[str, list[float]]]] = {op: {n: {"wall": [], "cpu": []} for n in sizes}
                                                         for op in ("show", "fork")}
    for r in range(repeats):
        order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
        for n in order:
            root, ses, msg = built[n]
            for op, args in (("show", ["session", "show", ses]), ("fork", ["session", "fork", ses, "--at", msg])):
                w, c, _ = cli(root, args)
                res[op][n]["wall"].append(w)
                res[op][n]["cpu"].append(c)
    out["reads"] = res
    lo = sizes[0]
    for op in ("show", "fork"):
        for n in sizes:
            w, c = median(res[op][n]["wall"]), median(res[op][n]["cpu"])
            wr = w / median(res[op][lo]["wall"])
            cr = c / median(res[op][lo]["cpu"])
            log(f"{op:5} {out['setup'][n]['messages']:>7,} msgs: wall {w * 1e3:7.1f} ms ({wr:.2f}x), "
                f"CPU {c * 1e3:7.1f} ms ({cr:.2f}x)")


def _git_workspace(work: str) -> str:
    ws = os.path.join(work, f"ws-git-{time.monotonic_ns()}")
    os.makedirs(ws)
    with open(os.path.join(ws, "notes.txt"), "w") as f:
        f.write(("notes of the benchmark, line after line of them\n" * 60)[:2048])
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b.invalid", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@b.invalid")
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", *cmd], cwd=ws, env=env, check=True, capture_output=True)
    return ws


def run_process(work: str, calls: int, checkpoints: bool | None = None) -> tuple[float, float, int]:
    """One whole ``kxen-agent run`` of ``calls`` tool calls in a fresh state dir: (wall, CPU, files left).

    ``checkpoints`` None: ``read_file`` calls (no workspace checkpoint is ever taken); True / False:
    ``write_file`` calls in a Git workspace, workspace checkpoints on / off (``policy.checkpoints``)."""
    root = os.path.join(work, f"R{calls}-{time.monotonic_ns()}")
    agent = os.path.join(work, f"agent-{calls}-{checkpoints}")
    os.makedirs(agent, exist_ok=True)
    if checkpoints is None:
        ws = _workspace(work)
        steps = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}] * calls
        tools, extra = '["read_file"]', ""
    else:
        ws = _git_workspace(work)
        steps = [{"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": f"call {i}\n"}}]}
                 for i in range(calls)]
        tools, extra = '["write_file"]', f"checkpoints = {'true' if checkpoints else 'false'}\n"
    steps.append({"content": "done"})
    with open(os.path.join(agent, "steps.json"), "w") as f:
        json.dump(steps, f)
    with open(os.path.join(agent, "agent.toml"), "w") as f:
        f.write('name = "bench-run"\nprovider = "script"\nscript = "steps.json"\n'
                'tools = %s\n\n[policy]\nmax_turns = %d\n%s' % (tools, calls + 5, extra))
    w, c, _ = cli(root, ["run", "-q", "--task", "benchmark a whole run", "--agent",
                         os.path.join(agent, "agent.toml"), "--workspace", ws], cwd=ws)
    files = sum(len(names) for _, _, names in os.walk(root))
    shutil.rmtree(root)
    return w, c, files


def w_run(work: str, calls_list: list[int], repeats: int, out: dict, checkpoints: bool | None = None) -> None:
    res: dict[int, dict[str, list[float]]] = {c: {"wall": [], "cpu": [], "files": []} for c in calls_list}
    key = "run" if checkpoints is None else f"run-checkpoints-{'on' if checkpoints else 'off'}"
    for r in range(repeats):
        for calls in calls_list:
            os.sync()
            w, c, files = run_process(work, calls, checkpoints)
            res[calls]["wall"].append(w / calls)
            res[calls]["cpu"].append(c / calls)
            res[calls]["files"].append(files)
            log(f"{key} of {calls:,} calls: {w:.1f} s wall, {c:.1f} s CPU, {files} files")
    out[key] = res
    lo = calls_list[0]
    for calls in calls_list:
        w, c = median(res[calls]["wall"]), median(res[calls]["cpu"])
        log(f"{key} {calls:>5,} calls: per call wall {w * 1e3:6.2f} ms ({w / median(res[lo]['wall']):.2f}x), "
            f"CPU {c * 1e3:6.2f} ms ({c / median(res[lo]['cpu']):.2f}x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="reads,run", help="reads, run, checkpoints (comma-separated)")
    ap.add_argument("--sizes", default=None, help="messages (default 10,5000,100000)")
    ap.add_argument("--calls", default=None, help="tool calls per run (default 50,500,2000)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--run-repeats", type=int, default=None)
    ap.add_argument("--tail", type=int, default=TAIL_CALLS)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--cache", default=None, help="keep the sessions' packed bulk here between runs")
    ap.add_argument("--separate", action="store_true", help="a state dir per size (default: one for all)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in (args.sizes or ("10,60,300" if args.quick else "10,5000,100000")).split(",")]
    calls = [int(x) for x in (args.calls or ("5,20" if args.quick else "50,500,2000")).split(",")]
    repeats = 1 if args.quick else args.repeats
    tail = 20 if args.quick else args.tail
    work = tempfile.mkdtemp(prefix="kxen-reads-", dir=args.dir)
    out: dict[str, Any] = {"load_start": os.getloadavg()}
    try:
        only = args.only.split(",")
        if "reads" in only:
            w_reads(work, sizes, repeats, tail, out, args.cache, not args.separate)
        if "run" in only:
            w_run(work, calls, args.run_repeats or (1 if args.quick else 3), out)
        if "checkpoints" in only:  # write_file calls in a Git workspace, workspace checkpoints on and off
            for on in (True, False):
                w_run(work, calls, args.run_repeats or 1, out, checkpoints=on)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_end"] = os.getloadavg()
    log(f"load average at start {out['load_start']}, at end {out['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
