"""Run every benchmark side by side and print a table of ratios.

::

    .venv/bin/python -m bench.run [--quick] [--scale N] [--repeats R] [--only W,...] [--dir DIR] [--json FILE]

One process runs every comparison; each figure is the median of ``R``
repeats (default 3; forks 7), and within a repeat kxen and its peers run
one after the other on the same content, so that a noisy machine slows
both. Ratios are the figures; absolute times are context.

Workloads (``--only`` takes these names):

- ``fork``: fork a session of 10, 1,000 and 100,000 messages
  (``SessionStore.fork``, durable) vs copying the JSONL file's prefix.
- ``durable``: the real :class:`~kxen_agent.runtime.runner.Runner` with a
  scripted agent whose tool (``read_file`` of a 2 KB file) is cheap; each
  tool call's four durable steps (Started, OutcomeKnown, the turn's
  messages, Settled) timed and their fsyncs counted with the store's
  :class:`~kxen_agent.store.fsio.FileIO` counter (and ``strace -f -c`` of a
  child process when strace exists), vs the floor: the same number of
  ``write`` + ``fsync`` appends to one file.
- ``export``: export and import+verify of a session of N messages, and the
  size of a family of 10 forks, vs Git (``git fast-import``, ``git bundle
  create``, ``git fetch`` from the bundle with ``fetch.fsckObjects``),
  dulwich (a pack written and read back) and JSONL (+zstd).
- ``load``: load a 100,000-message history for the next provider call
  (time, and peak memory with tracemalloc) vs parsing the JSONL file.
- ``fsck``: kxen fsck (loose, and packed after an import) vs ``git fsck``.
- ``remote``: a session pushed to, and pulled from, a Git remote vs ``git
  push``/``git fetch`` of the same messages as commits, and the size of an
  incremental push (``bench/remote.py``).
- ``turns``: store time per turn of a real run resumed on a history of 10,
  10,000 and 100,000 messages (the run holds its history in memory: a
  turn's cost must not grow with it), ``bench/turns.py``.
- ``files``: the files a session of 2,000 tool calls leaves in a fresh state
  dir, with automatic packing and without (``bench/turns.py``).
- ``checkpoints``: a workspace checkpoint per tool call on a 10,000-file
  repository with 1 and 1,000 files changed vs ``git stash create``, and a
  run's time per call with checkpoints on and off (``bench/checkpoints.py``).
- ``scaling``: every export, import, fsck and load figure is measured at
  two sizes, N and 10 N; this prints how each cost grew.

Sizes: the default run uses N = 10,000 messages for export and fsck (and
1,000 for the scaling baseline) and 100,000 for load (10,000 baseline);
``--scale 10`` multiplies every size but the fork baselines by 10.
``--quick`` uses tiny sizes and one repeat: it checks that the benchmark
runs (the test suite uses it), its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from . import _peers as peers
from ._content import Conversation, content_bytes, safe_fork_point

WORKLOADS = ("fork", "durable", "export", "load", "fsck", "remote", "turns", "files", "checkpoints")
FAMILY_FORKS = 10


# ================================================================== plan and results


@dataclass
class Plan:
    fork_sizes: list[int]
    load_sizes: list[int]  # [baseline, measured]: 10x apart
    export_sizes: list[int]  # [baseline, measured]: 10x apart
    durable_calls: int
    repeats: int
    fork_repeats: int
    strace: bool
    quick: bool
    scale: int

    @property
    def text_chars(self) -> int:
        return (1 << 20) if self.quick else (16 << 20)


def make_plan(quick: bool, scale: int, repeats: int | None) -> Plan:
    if quick:
        return Plan([10, 100, 300], [30, 300], [20, 200], 2, repeats or 1, repeats or 2, False, True, scale)
    r = repeats or 3
    return Plan(
        [10, 1000, 100_000 * scale], [10_000 * scale, 100_000 * scale], [1000 * scale, 10_000 * scale],
        20, r, max(r, 7), shutil.which("strace") is not None, False, scale,
    )


@dataclass
class Row:
    workload: str
    figure: str
    kxen: str
    peer: str
    ratio: float | None
    ratio_text: str
    target: str
    met: bool | None


@dataclass
class Results:
    plan: Plan
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, workload: str, figure: str, kxen: str, peer: str, ratio: float | None, target: str = "",
            met: bool | None = None, fmt: str = "{:.2f}x", cpu: float | None = None) -> None:
        text = fmt.format(ratio) if ratio is not None else "-"
        if cpu is not None:  # the same ratio in CPU seconds: steadier on a shared machine
            text += f" (CPU {cpu:.2f}x)"
        self.rows.append(Row(workload, figure, kxen, peer, ratio, text, target, met))


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def timed(fn: Callable[..., Any], *a: Any, **kw: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    r = fn(*a, **kw)
    return time.perf_counter() - t, r


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def ctimed(fn: Callable[..., Any], *a: Any, **kw: Any) -> tuple[float, float, Any]:
    """Wall and CPU seconds (this process and the children it waited for, e.g. git)."""
    c, t = _cpu(), time.perf_counter()
    r = fn(*a, **kw)
    return time.perf_counter() - t, _cpu() - c, r


def ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def rate(n: float, s: float, unit: str = "msg/s") -> str:
    v = n / s if s > 0 else float("inf")
    return f"{v:,.0f} {unit}"


def mib(b: float) -> str:
    return f"{b / (1 << 20):.3g} MiB"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ================================================================== shared setup


class History:
    """One long conversation, as kxen sessions (state dir ``A``) and JSONL files.

    Sessions of every needed length share one chain of message objects (a
    session of k messages has the k-th message as its head), exactly as
    the prefixes of one conversation would.
    """

    def __init__(self, work: str, lengths: list[int], text_chars: int) -> None:
        from ._kxen import Builder

        self.work = work
        total = max(lengths)
        t0 = time.perf_counter()
        self.messages = list(Conversation(1, text_chars).messages(total))
        # A history must not end inside a tool turn (a fork there is refused).
        self.lengths = {n: safe_fork_point(self.messages, n) for n in lengths}
        log(f"conversation of {total:,} messages, {content_bytes(self.messages) / 1e6:.1f} MB of content "
            f"({time.perf_counter() - t0:.1f} s)")
        self.root = os.path.join(work, "A")
        self.workspace = os.path.join(work, "ws")  # every session's
        b = Builder(self.root, self.workspace)
        t0 = time.perf_counter()
        heads = b.chain(self.messages, list(self.lengths.values()))
        self.sessions = {n: b.session(heads[k]) for n, k in self.lengths.items()}
        self.system = b.lock["system"]
        log(f"kxen history written ({time.perf_counter() - t0:.1f} s)")
        self.jsonl: dict[int, tuple[str, int]] = {}
        base = os.path.join(work, "jsonl", "base.jsonl")
        os.makedirs(os.path.dirname(base), exist_ok=True)
        ends = peers.write_jsonl(base, self.messages, "ses-base")
        for n, k in self.lengths.items():
            path = os.path.join(work, "jsonl", f"s{n}.jsonl")
            peers.write_jsonl(path, [], f"s{n}", prefix_from=base, prefix_bytes=ends[k - 1])
            self.jsonl[n] = (path, ends[k - 1])
        os.unlink(base)


# ================================================================== 1. fork


def w_fork(plan: Plan, res: Results, hist: History, work: str) -> None:
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store
    from kxen_agent.store.fsio import FaultyIO

    from ._kxen import measuring_store

    sizes = plan.fork_sizes
    kx: dict[int, list[float]] = {n: [] for n in sizes}
    fs: dict[int, list[int]] = {n: [] for n in sizes}
    jl: dict[int, list[float]] = {n: [] for n in sizes}
    jd: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: list[float] = []  # the largest fork with every fsync skipped: the CPU part
    ap: list[float] = []  # one write+fsync append on this disk, the unit a fork is published against
    out = os.path.join(work, "jsonl-forks")
    os.makedirs(out, exist_ok=True)
    for r in range(plan.fork_repeats):
        # Sizes in a rotating order, and os.sync() first: on ext4 (data=ordered)
        # an fsync also writes out other files' dirty data, so a fork measured
        # right after a 100 MB copy would pay for the copy.
        order = sizes[r % len(sizes):] + sizes[: r % len(sizes)]
        for n in order:
            os.sync()
            store = measuring_store(hist.root)
            t, _info = timed(SessionStore(store).fork, hist.sessions[n])
            kx[n].append(t)
            fs[n].append(store.io.fsyncs)
        for n in order:
            src, nbytes = hist.jsonl[n]
            for durable, acc in ((False, jl), (True, jd)):
                os.sync()
                dst = os.path.join(out, f"fork-{n}-{r}-{int(durable)}.jsonl")
                t, _ = timed(peers.jsonl_copy_prefix, src, dst, nbytes, durable=durable)
                acc[n].append(t)
                os.unlink(dst)
        nosync = Store(hist.root, io=FaultyIO(None, sync=False))
        cpu.append(timed(SessionStore(nosync).fork, hist.sessions[sizes[-1]])[0])
        os.sync()
        ap.append(median(floor_run(os.path.join(out, f"append-{r}.log"), 5, [b"x" * 200 + b"\n"])))
    lo, hi = sizes[0], sizes[-1]
    res.raw["fork"] = {"sizes": {n: hist.lengths[n] for n in sizes}, "kxen_s": kx, "fsyncs": fs, "jsonl_s": jl,
                       "kxen_nosync_s": cpu, "append_s": ap,
                       "jsonl_durable_s": jd, "jsonl_bytes": {n: hist.jsonl[n][1] for n in sizes}}
    for n in sizes:
        res.add("1 fork", f"fork at {n:,} msgs: kxen vs JSONL prefix copy ({mib(hist.jsonl[n][1])})",
                f"{ms(median(kx[n]))}, {median(fs[n]):.0f} fsyncs", ms(median(jl[n])), median(jl[n]) / median(kx[n]),
                "", None, "{:.3g}x faster")
    g = median(kx[hi]) / median(kx[lo])
    res.add("1 fork", f"kxen fork({hi:,}) / fork({lo:,})", ms(median(kx[hi])), ms(median(kx[lo])), g, "<= 1.2",
            g <= 1.2)
    s = median(jl[hi]) / median(kx[hi])
    res.add("1 fork", f"JSONL copy (never fsynced) / kxen fork at {hi:,} msgs", ms(median(kx[hi])),
            ms(median(jl[hi])), s, "(context: the 100x target is retired)", None)
    n_fs = median(fs[hi])
    res.add("1 fork", f"fsyncs of a fork at {hi:,} (a fresh store, FileIO counter) vs the durable JSONL copy's",
            f"{n_fs:.0f}", "2", n_fs / 2, "<= 2 fsyncs", n_fs <= 2, "{:.2f}x")
    s = median(kx[hi]) / median(ap)
    res.add("1 fork", f"kxen fork at {hi:,} / one fsync'd append on this disk", ms(median(kx[hi])),
            ms(median(ap)), s, "(context)", None)
    s = median(jd[hi]) / median(kx[hi])
    res.add("1 fork", f"durable JSONL copy (+fsync of file and directory) / kxen fork at {hi:,}", ms(median(kx[hi])),
            ms(median(jd[hi])), s, "(context)", None)
    s = median(jl[hi]) / median(cpu)
    res.add("1 fork", f"JSONL copy / kxen fork with its fsyncs skipped, at {hi:,} (context)", ms(median(cpu)),
            ms(median(jl[hi])), s, "(context)", None)


# ================================================================== 2. durable step


DURABLE_STEPS_PER_CALL = 4  # Started, OutcomeKnown, the turn's messages, Settled


def _durable_workspace(work: str) -> tuple[str, str]:
    ws = os.path.join(work, "ws-durable")
    os.makedirs(ws, exist_ok=True)
    conv = Conversation(7, 1 << 16)
    text = ""
    while len(text.encode()) < 2048:
        text += conv._excerpt()[1]
    text = text.encode()[:2048].decode("utf-8", "ignore")
    with open(os.path.join(ws, "notes.txt"), "w") as f:
        f.write(text)
    return ws, text


def durable_state(work: str, earlier: int) -> str:
    """A state dir that has seen a session of ``earlier`` messages (so every
    fan-out directory exists, as in a user's); each run opens it afresh, as
    one CLI process does."""
    from ._kxen import Builder

    state = os.path.join(work, "C")
    b = Builder(state, os.path.join(work, "ws-builder"))
    msgs = list(Conversation(9, 1 << 20).messages(earlier))
    b.session(b.chain(msgs, [])[len(msgs)])
    return state


def durable_run(state_dir: str, ws: str, calls: int) -> dict:
    """One real run of ``calls`` tool turns; per tool call: seconds (tool time removed) and fsyncs."""
    from kxen_agent.runtime import runner as rmod
    from kxen_agent.session.agent_def import default_agent_definition

    from ._kxen import measuring_store

    store = measuring_store(state_dir)
    steps = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}] * calls
    steps.append({"content": "done"})
    lock = default_agent_definition(steps, name="bench-durable")
    lock["policy"]["max_turns"] = calls + 5
    per_call: list[tuple[float, int]] = []
    tool_time = [0.0]
    orig_turn = rmod._RunCtx.tool_turn
    tool = rmod.TOOLS["read_file"]
    orig_run = tool.run

    def run_tool(args: dict, ctx: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig_run(args, ctx)
        finally:
            tool_time[0] += time.perf_counter() - t

    def tool_turn(self: Any, assistant: Any, ops: Any) -> None:
        tool_time[0] = 0.0
        f0, t0 = store.io.fsyncs, time.perf_counter()
        orig_turn(self, assistant, ops)
        per_call.append((time.perf_counter() - t0 - tool_time[0], store.io.fsyncs - f0))

    rmod._RunCtx.tool_turn = tool_turn  # type: ignore[method-assign]
    tool.run = run_tool  # type: ignore[method-assign]
    try:
        runner = rmod.Runner(store)
        runner.autopack = None  # the steps alone (workload 8 "files" measures packing)
        total, result = timed(runner.start, ws, "benchmark the durable steps", lock)
    finally:
        rmod._RunCtx.tool_turn = orig_turn  # type: ignore[method-assign]
        del tool.run
    if result.status != "completed" or len(per_call) != calls:
        raise RuntimeError(f"durable run ended {result.status} after {len(per_call)} of {calls} tool calls")
    return {"per_call_s": [p[0] for p in per_call], "per_call_fsyncs": [p[1] for p in per_call],
            "total_s": total, "total_fsyncs": store.io.fsyncs}


def floor_run(path: str, calls: int, records: list[bytes]) -> list[float]:
    """The physical floor: each durable step one ``write`` + ``fsync`` append to one file."""
    out = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(calls):
            t = time.perf_counter()
            for rec in records:
                os.write(fd, rec)
                os.fsync(fd)
            out.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return out


def _floor_records(output: str) -> list[bytes]:
    """What a JSONL agent would append for one tool call's four durable steps."""
    base = {"op": "op_0123456789abcdef0123", "run": "run_0123456789abcdef0123", "turn": 1, "callId": "call_1_0",
            "tool": "read_file", "arguments": '{"path":"notes.txt"}', "sideEffects": False}
    recs = [dict(base, state="Started"), dict(base, state="OutcomeKnown", output=output, isError=False)]
    line = peers.jsonl_line({"role": "tool", "content": output, "tool_call_id": "call_1_0"}, 3, "ses-floor")
    return [json.dumps(recs[0]).encode() + b"\n", json.dumps(recs[1]).encode() + b"\n", line,
            json.dumps(dict(base, state="Settled")).encode() + b"\n"]


def _strace_fsyncs(work: str, ws: str, calls: int, state: str) -> int | None:
    out = os.path.join(work, f"strace-{calls}.txt")
    cmd = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out,
           sys.executable, "-m", "bench.run", "--child-durable", state, ws, str(calls)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    if p.returncode != 0:
        log(f"strace child failed: {p.stderr[-500:]}")
        return None
    total = 0
    with open(out) as f:
        for line in f:
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync"):
                total += int(parts[3])
    return total


def w_durable(plan: Plan, res: Results, work: str) -> None:
    ws, text = _durable_workspace(work)
    calls = plan.durable_calls
    recs = _floor_records(text)
    kx_t: list[float] = []
    kx_f: list[float] = []
    whole_f: list[float] = []
    fl_t: list[float] = []
    state = durable_state(work, 200 if plan.quick else 2000)
    for r in range(plan.repeats):
        d = durable_run(state, ws, calls)
        kx_t.append(median(d["per_call_s"]))
        kx_f.append(sum(d["per_call_fsyncs"]) / calls)
        whole_f.append(d["total_fsyncs"] / calls)
        fl_t.append(median(floor_run(os.path.join(work, f"floor{r}.log"), calls, recs)))
    res.raw["durable"] = {"kxen_per_call_s": kx_t, "kxen_fsyncs_per_call": kx_f, "run_fsyncs_per_call": whole_f,
                          "floor_per_call_s": fl_t}
    steps = DURABLE_STEPS_PER_CALL
    per_step = median(kx_f) / steps
    res.add("2 durable", "fsyncs per durable step (FileIO counter)", f"{per_step:.2f}", "1 (floor)", per_step,
            "<= 2", per_step <= 2, "{:.2f}")
    if plan.strace:
        lo, hi = 2, 2 + max(calls // 2, 4)
        a, b = _strace_fsyncs(work, ws, lo, state), _strace_fsyncs(work, ws, hi, state)
        if a is not None and b is not None:
            v = (b - a) / (hi - lo)
            res.raw["durable"]["strace_fsyncs_per_turn"] = v
            res.add("2 durable", "fsync syscalls per tool turn (strace -f -c, whole process)",
                    f"{v:.1f} ({v / (steps + 1):.2f}/step)", f"{steps + 1} (floor)", v / (steps + 1), "<= 2",
                    v / (steps + 1) <= 2, "{:.2f}")
    o = median(kx_t) / median(fl_t)
    res.add("2 durable", f"store time per tool call ({steps} durable steps) / floor", ms(median(kx_t)),
            ms(median(fl_t)), o, "<= 2x", o <= 2)
    res.add("2 durable", "floor: one write+fsync append on this disk (context)", "",
            ms(median(fl_t) / steps), None, "(context)", None)
    res.add("2 durable", "whole run: fsyncs per tool call incl. provider turn, lease, create (context)",
            f"{median(whole_f):.1f}", f"{steps + 1}", median(whole_f) / (steps + 1), "(context)", None)


def child_durable(state: str, ws: str, calls: int) -> None:
    d = durable_run(state, ws, calls)
    print(json.dumps({"total_fsyncs": d["total_fsyncs"]}))


# ================================================================== 3. export / import, 5. fsck


class ExportSet:
    """A session of N messages and a family of 10 forks: kxen (state dir B), JSONL, Git."""

    def __init__(self, work: str, n: int, base: list[dict], conv2: Conversation) -> None:
        from ._kxen import Builder

        self.dir = os.path.join(work, f"export-{n}")
        os.makedirs(self.dir, exist_ok=True)
        self.n = safe_fork_point(base, n)
        msgs = base[: self.n]
        own_n = max(1, n // 10)
        points = sorted({safe_fork_point(msgs, n // 2 + i * n // 20) for i in range(FAMILY_FORKS)})
        points = [p if p > 0 else 1 for p in points]
        while len(points) < FAMILY_FORKS:  # tiny sizes: several forks at one point
            points.append(points[-1])
        self.own = [list(conv2.messages(own_n)) for _ in range(FAMILY_FORKS)]
        self.points = points
        self.root = os.path.join(self.dir, "B")
        b = Builder(self.root, os.path.join(self.dir, "ws"))
        heads = b.chain(msgs, points)
        self.ses = b.session(heads[self.n])
        self.forks = [b.fork_with(self.ses, heads[p], own) for p, own in zip(points, self.own)]
        self.unique_messages = self.n + sum(len(o) for o in self.own)
        # JSONL: the session file, and each fork's file (prefix + its own lines)
        jd = os.path.join(self.dir, "jsonl")
        os.makedirs(jd, exist_ok=True)
        self.jsonl = os.path.join(jd, "base.jsonl")
        ends = peers.write_jsonl(self.jsonl, msgs, "ses-base")
        self.fork_jsonl = []
        for i, (p, own) in enumerate(zip(points, self.own)):
            path = os.path.join(jd, f"fork{i}.jsonl")
            peers.write_jsonl(path, own, f"ses-fork{i}", start=p, prefix_from=self.jsonl, prefix_bytes=ends[p - 1])
            self.fork_jsonl.append(path)
        self.fork_messages = sum(p + len(o) for p, o in zip(points, self.own))
        # Git: the same messages, one commit (tree + blob) per message
        fam = peers.GitFamily()
        fam.add("base", msgs)
        for i, (p, own) in enumerate(zip(points, self.own)):
            fam.add(f"fork{i}", own, from_branch="base", at=p)
        self.git = os.path.join(self.dir, "git")
        peers.git_fast_import(self.git, fam)
        self.content = content_bytes(msgs)


def _fresh(path: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def export_round(es: ExportSet, r: int, groups: list[str], branches: list[str], jsonl: list[str],
                 tag: str) -> dict[str, float | int]:
    """One repeat of export and import+verify for each peer; seconds and bytes."""
    from kxen_agent.store import export_bundle, import_bundle

    from ._kxen import measuring_store

    d = _fresh(os.path.join(es.dir, f"round-{tag}-{r}"))
    out: dict[str, float | int] = {}
    # kxen
    bundle = os.path.join(d, "kxen.bundle")
    out["kxen_export"], out["kxen_export_cpu"], info = ctimed(export_bundle, measuring_store(es.root), groups, bundle)
    out["kxen_bytes"] = info.file_bytes
    out["kxen_objects"] = info.objects
    dest = os.path.join(d, "kxen-import")
    out["kxen_import"], out["kxen_import_cpu"], _ = ctimed(import_bundle, measuring_store(dest), bundle)
    # git
    gb = os.path.join(d, "git.bundle")
    out["git_export"], out["git_export_cpu"], _ = ctimed(peers.git, "bundle", "create", "-q", gb, *branches, cwd=es.git)
    out["git_bytes"] = os.path.getsize(gb)
    gdest = os.path.join(d, "git-import")

    def git_import() -> None:
        peers.git("init", "-q", "--bare", gdest)
        peers.git("-c", "fetch.fsckObjects=true", "fetch", "-q", gb, "refs/heads/*:refs/heads/*", cwd=gdest)

    out["git_import"], out["git_import_cpu"], _ = ctimed(git_import)
    # dulwich
    dbase = os.path.join(d, "dulwich-export")
    out["dulwich_export"], out["dulwich_export_cpu"], out["dulwich_objects"] = ctimed(
        peers.dulwich_export, es.git, branches, dbase)
    out["dulwich_bytes"] = os.path.getsize(dbase + ".pack")
    out["dulwich_import"], out["dulwich_import_cpu"], _ = ctimed(
        peers.dulwich_import, dbase + ".pack", os.path.join(d, "dulwich-import"))
    # JSONL + zstd
    zd = _fresh(os.path.join(d, "jsonl-zst"))
    out["jsonl_export"], out["jsonl_export_cpu"], zs = ctimed(peers.jsonl_zstd_export, jsonl, zd)
    out["jsonl_zst_bytes"] = sum(os.path.getsize(z) for z in zs)
    out["jsonl_bytes"] = sum(os.path.getsize(j) for j in jsonl)
    out["jsonl_import"], out["jsonl_import_cpu"], _ = ctimed(peers.jsonl_zstd_import, zs, _fresh(os.path.join(d, "jsonl-in")))
    out["kxen_import_dir"] = dest  # type: ignore[assignment]
    return out


def w_export(plan: Plan, res: Results, sets: dict[int, ExportSet]) -> dict[int, dict[str, float]]:
    meds: dict[int, dict[str, float]] = {}
    for n, es in sets.items():
        rounds = []
        for r in range(plan.repeats):
            log(f"export/import round {r + 1}/{plan.repeats} at {es.n:,} messages")
            rounds.append(export_round(es, r, [f"sessions/{es.ses}"], ["base"], [es.jsonl], "single"))
        meds[n] = {k: median([x[k] for x in rounds]) for k in rounds[0] if k != "kxen_import_dir"}
        meds[n]["import_dir"] = rounds[-1]["kxen_import_dir"]  # type: ignore[assignment]
    n = max(sets)
    es, m = sets[n], meds[n]
    res.raw["export"] = {str(k): {a: b for a, b in v.items() if a != "import_dir"} for k, v in meds.items()}
    N = es.n

    def speed(figure: str, op: str, peer: str, target: str, need: float | None) -> None:
        k, p = m[f"kxen_{op}"], m[f"{peer}_{op}"]
        cpu = m[f"{peer}_{op}_cpu"] / m[f"kxen_{op}_cpu"]
        res.add("3 export", figure, rate(N, k), rate(N, p), p / k, target,
                None if need is None else p >= need * k, cpu=cpu)

    speed(f"export {N:,} msgs: kxen vs git bundle create", "export", "git", ">= 1.0", 1.0)
    speed("export: kxen vs dulwich (read objects, write a pack)", "export", "dulwich", ">= 5", 5.0)
    speed("export: kxen vs JSONL+zstd", "export", "jsonl", "(context)", None)
    speed(f"import+verify {N:,} msgs: kxen vs git init + fetch from the bundle (fetch.fsckObjects)", "import",
          "git", ">= 1.0", 1.0)
    speed("import+verify: kxen vs dulwich (index the pack, check it)", "import", "dulwich", ">= 5", 5.0)
    speed("import+verify: kxen vs JSONL+zstd (decompress, parse every line)", "import", "jsonl", "(context)", None)
    # Per object, each side counting its own objects (Git: commit + tree + blob
    # per message; kxen: a message, and a blob for content over 1 KiB).
    ko, go = m["kxen_objects"], m["dulwich_objects"]
    for op, what in (("export", "export"), ("import", "import+verify")):
        k, g = m[f"kxen_{op}"], m[f"git_{op}"]
        res.add("3 export", f"{what}: objects/s, kxen ({ko:,.0f} objects) vs git ({go:,.0f} objects)",
                f"{ko / k:,.0f} obj/s", f"{go / g:,.0f} obj/s", (ko / k) / (go / g), "(context)", None)
    per = lambda b: f"{b / N:,.0f} B/msg"  # noqa: E731
    res.add("3 size", f"bundle of {N:,} msgs: kxen / git bundle", per(m["kxen_bytes"]), per(m["git_bytes"]),
            m["kxen_bytes"] / m["git_bytes"], "<= 0.8", m["kxen_bytes"] <= 0.8 * m["git_bytes"])
    res.add("3 size", "kxen bundle / dulwich pack (no deltas)", per(m["kxen_bytes"]), per(m["dulwich_bytes"]),
            m["kxen_bytes"] / m["dulwich_bytes"], "(context)", None)
    res.add("3 size", "kxen bundle / JSONL+zstd", per(m["kxen_bytes"]), per(m["jsonl_zst_bytes"]),
            m["kxen_bytes"] / m["jsonl_zst_bytes"], "(context)", None)
    res.add("3 size", "kxen bundle / JSONL (raw)", per(m["kxen_bytes"]), per(m["jsonl_bytes"]),
            m["kxen_bytes"] / m["jsonl_bytes"], "(context)", None)
    # The family: 10 forks sharing history (sizes; one round)
    log(f"family of {FAMILY_FORKS} forks at {es.n:,} messages")
    f = export_round(es, 0, [f"sessions/{s}" for s in es.forks], [f"fork{i}" for i in range(FAMILY_FORKS)],
                     es.fork_jsonl, "family")
    res.raw["family"] = {k: v for k, v in f.items() if k != "kxen_import_dir"}
    res.raw["family"].update(points=es.points, own=[len(o) for o in es.own], fork_messages=es.fork_messages,
                             unique_messages=es.unique_messages)
    fm = es.fork_messages
    res.add("3 size", f"family of {FAMILY_FORKS} forks ({fm:,} msgs in the forks' files): kxen bundle / "
            "sum of JSONL+zstd", mib(f["kxen_bytes"]), mib(f["jsonl_zst_bytes"]), f["kxen_bytes"] / f["jsonl_zst_bytes"],
            "<= 0.15", f["kxen_bytes"] <= 0.15 * f["jsonl_zst_bytes"])
    res.add("3 size", f"family: messages stored once ({es.unique_messages:,}) / messages in the forks' files "
            "(the dedup bound)", "", "", es.unique_messages / fm, "(context)", None)
    res.add("3 size", "family: kxen bundle / git bundle of the 10 branches", mib(f["kxen_bytes"]), mib(f["git_bytes"]),
            f["kxen_bytes"] / f["git_bytes"], "<= 0.8", f["kxen_bytes"] <= 0.8 * f["git_bytes"])
    return meds


def w_fsck(plan: Plan, res: Results, sets: dict[int, ExportSet], meds: dict[int, dict[str, float]] | None) -> dict:
    from kxen_agent.session.schema import SESSION_SCHEMA
    from kxen_agent.store import fsck

    from ._kxen import measuring_store

    out: dict[int, dict[str, float]] = {}
    for n, es in sets.items():
        kl, kp, gf, klc, kpc, gfc = [], [], [], [], [], []
        packed = meds[n]["import_dir"] if meds else None
        for _ in range(plan.repeats):
            # as `kxen-agent fsck` runs it: bytes, closure and the session schema
            t, c, rep = ctimed(fsck, measuring_store(es.root), schema=SESSION_SCHEMA)
            if not rep.clean:
                raise RuntimeError(f"fsck of {es.root} found problems: {[p.line() for p in rep.problems][:3]}")
            kl.append(t)
            klc.append(c)
            if packed:
                t, c, rep = ctimed(fsck, measuring_store(packed), schema=SESSION_SCHEMA)  # type: ignore[arg-type]
                kp.append(t)
                kpc.append(c)
            t, c, _ = ctimed(peers.git, "fsck", "--no-progress", cwd=es.git)
            gf.append(t)
            gfc.append(c)
        out[n] = {"kxen_loose": median(kl), "git": median(gf), "kxen_loose_cpu": median(klc), "git_cpu": median(gfc)}
        if kp:
            out[n]["kxen_packed"] = median(kp)
            out[n]["kxen_packed_cpu"] = median(kpc)
    n = max(sets)
    es, m = sets[n], out[n]
    U = es.unique_messages
    res.raw["fsck"] = {str(k): v for k, v in out.items()}
    res.add("5 fsck", f"fsck {U:,} msgs (session + forks), loose: kxen vs git fsck", rate(U, m["kxen_loose"]),
            rate(U, m["git"]), m["git"] / m["kxen_loose"], ">= 1.0", m["git"] >= m["kxen_loose"],
            cpu=m["git_cpu"] / m["kxen_loose_cpu"])
    if "kxen_packed" in m:
        # The imported store holds only the single session (es.n messages).
        gp = m["git"] * es.n / U  # git's time scaled to the same message count
        res.add("5 fsck", f"fsck {es.n:,} msgs, packed (an import): kxen vs git fsck (per msg)",
                rate(es.n, m["kxen_packed"]), rate(U, m["git"]), gp / m["kxen_packed"], ">= 1.0",
                gp >= m["kxen_packed"], cpu=m["git_cpu"] * es.n / U / m["kxen_packed_cpu"])
    return out


# ================================================================== 4. load for resume


def _kxen_load(root: str, ses: str, index: bool = True) -> list[dict]:
    from kxen_agent.runtime.history import RunHistory
    from kxen_agent.session.sessions import SessionStore

    from ._kxen import measuring_store

    ss = SessionStore(measuring_store(root))
    info = ss.get(ses)
    agent = ss.agent(info)
    # Exactly what the runner sends the provider on a process's first turn
    # (runner._loop starts its RunHistory from the session's history index,
    # then runner.provider_turn; later turns read only what was added: workload 8).
    h = RunHistory(ss)
    if index:
        h.start(ses)
    return h.messages(info.head, [{"role": "system", "content": agent.get("system", "")}])


def _write_history_index(root: str, ses: str) -> float:
    """What the runner does after each run of the session (RunHistory.finish): its history index; seconds."""
    from kxen_agent.runtime.history import RunHistory
    from kxen_agent.session.sessions import SessionStore

    from ._kxen import measuring_store

    ss = SessionStore(measuring_store(root))
    t = time.perf_counter()
    err = RunHistory(ss).finish(ses, ss.get(ses).head)
    if err:
        raise RuntimeError(err)
    return time.perf_counter() - t


def _peak(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        r = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del r
    finally:
        tracemalloc.stop()
    return peak


def w_load(plan: Plan, res: Results, hist: History, packed: tuple[str, str, str, int] | None = None) -> dict:
    """``packed``: (state dir, session, JSONL file, messages) of a packed store (an import) to load too."""
    out: dict[int, dict[str, float]] = {}
    for n in plan.load_sizes:
        ses, (path, nbytes) = hist.sessions[n], hist.jsonl[n]
        # Objects only first (no index yet: a session's first resume after an import, or a fork of a
        # session without one), then the index the runner writes after a run, then through it.
        # (At most 100,000 messages: at 1,000,000 the loose objects outgrow the page cache and each
        # objects-only load reads 1.28 million files from disk, tens of minutes on this machine.)
        objects = n <= 100_000
        b = peers.jsonl_load_for_resume(path, hist.system)
        if objects and _kxen_load(hist.root, ses, False) != b:
            raise RuntimeError(f"kxen (objects) and JSONL loads differ at {n} messages")
        ot = [timed(_kxen_load, hist.root, ses, False)[0] for _ in range(plan.repeats if objects else 0)]
        written = _write_history_index(hist.root, ses)
        if _kxen_load(hist.root, ses) != b:
            raise RuntimeError(f"kxen (history index) and JSONL loads differ at {n} messages")
        del b
        kt, jt, kc, jc = [], [], [], []
        for _ in range(plan.repeats):
            t, c, _r = ctimed(_kxen_load, hist.root, ses)
            kt.append(t)
            kc.append(c)
            del _r
            t, c, _r = ctimed(peers.jsonl_load_for_resume, path, hist.system)
            jt.append(t)
            jc.append(c)
            del _r
        out[n] = {"kxen_s": median(kt), "jsonl_s": median(jt), "kxen_cpu": median(kc), "jsonl_cpu": median(jc),
                  "objects_s": median(ot) if ot else math.nan, "index_write_s": written,
                  "kxen_peak": _peak(lambda: _kxen_load(hist.root, ses)),
                  "objects_peak": _peak(lambda: _kxen_load(hist.root, ses, False)) if objects else math.nan,
                  "jsonl_peak": _peak(lambda: peers.jsonl_load_for_resume(path, hist.system))}
    n = max(plan.load_sizes)
    m = out[n]
    res.raw["load"] = {str(k): v for k, v in out.items()}
    N = hist.lengths[n]
    res.add("4 load", f"load {N:,} msgs for the next call (history index, as a run leaves it): kxen / JSONL parse",
            ms(m["kxen_s"]), ms(m["jsonl_s"]), m["kxen_s"] / m["jsonl_s"], "<= 1.5 (1.0)", m["kxen_s"] <= 1.5 * m["jsonl_s"],
            cpu=m["kxen_cpu"] / m["jsonl_cpu"])
    res.add("4 load", "peak memory (tracemalloc): kxen / JSONL", mib(m["kxen_peak"]), mib(m["jsonl_peak"]),
            m["kxen_peak"] / m["jsonl_peak"], "<= 2", m["kxen_peak"] <= 2 * m["jsonl_peak"])
    k = max(x for x in out if not math.isnan(out[x]["objects_s"]))
    o = out[k]
    res.add("4 load", f"load {hist.lengths[k]:,} msgs from the objects only (no index: a first resume after an import): "
            "kxen / JSONL", ms(o["objects_s"]), ms(o["jsonl_s"]), o["objects_s"] / o["jsonl_s"], "(context)", None)
    res.add("4 load", "peak memory, objects only: kxen / JSONL", mib(o["objects_peak"]), mib(o["jsonl_peak"]),
            o["objects_peak"] / o["jsonl_peak"], "(context)", None)
    res.add("4 load", f"writing the index of {N:,} msgs after a run that had none (the runner, once)",
            ms(m["index_write_s"]), ms(m["jsonl_s"]), m["index_write_s"] / m["jsonl_s"], "(context)", None)
    if packed is not None:
        root, ses, path, k = packed
        kt, jt = [], []
        for _ in range(plan.repeats):
            kt.append(timed(_kxen_load, root, ses, False)[0])
            jt.append(timed(peers.jsonl_load_for_resume, path, hist.system)[0])
        res.raw["load_packed"] = {"messages": k, "kxen_s": kt, "jsonl_s": jt}
        res.add("4 load", f"load {k:,} msgs from a pack (an imported session, no index yet): kxen / JSONL parse",
                ms(median(kt)), ms(median(jt)), median(kt) / median(jt), "(context)", None)
    return out


# ================================================================== 6. scaling


def scaling_rows(res: Results, plan: Plan, exp: dict | None, fsck_: dict | None, load: dict | None) -> None:
    def row(what: str, lo: int, hi: int, d: dict, kkey: str, peer: str, pkey: str) -> None:
        gk, gp = d[hi][kkey] / d[lo][kkey], d[hi][pkey] / d[lo][pkey]
        res.add("6 scaling", f"{what} {lo:,} -> {hi:,} msgs: time growth, kxen vs {peer}", f"{gk:.1f}x",
                f"{gp:.1f}x", gk / gp, "(context)", None)

    if exp:
        lo, hi = sorted(exp)
        row("export", lo, hi, exp, "kxen_export", "git", "git_export")
        row("import+verify", lo, hi, exp, "kxen_import", "git", "git_import")
    if fsck_:
        lo, hi = sorted(fsck_)
        row("fsck", lo, hi, fsck_, "kxen_loose", "git", "git")
    if load:
        lo, hi = sorted(load)
        row("load", lo, hi, load, "kxen_s", "JSONL", "jsonl_s")


# ================================================================== table


def table(res: Results) -> str:
    head = "| workload | figure | kxen | peer | ratio | target | met |\n|---|---|---|---|---|---|---|\n"
    lines = []
    for r in res.rows:
        met = "" if r.met is None else ("**met**" if r.met else "**MISSED**")
        lines.append(f"| {r.workload} | {r.figure} | {r.kxen} | {r.peer} | {r.ratio_text} | {r.target} | {met} |")
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks that it runs")
    ap.add_argument("--scale", type=int, default=1, help="multiply the sizes (10: the 10x scaling run)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per figure (default 3; forks 7)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", default=None, help="also write every raw figure to this file")
    ap.add_argument("--child-durable", nargs=3, metavar=("STATE", "WS", "CALLS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_durable:
        state, ws, calls = args.child_durable
        child_durable(state, ws, int(calls))
        return 0
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {', '.join(bad)}; choose from {', '.join(WORKLOADS)}")
    if args.scale < 1:
        ap.error("--scale must be at least 1")
    plan = make_plan(args.quick, args.scale, args.repeats)
    res = Results(plan)
    work = args.dir or tempfile.mkdtemp(prefix="kxen-bench-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    try:
        log(f"plan: {asdict(plan)}; work dir {work}")
        hist = None
        if "fork" in only or "load" in only or "turns" in only:
            from .turns import turn_sizes

            lengths = sorted(set((plan.fork_sizes if "fork" in only else []) + (plan.load_sizes if "load" in only else [])
                                 + (turn_sizes(plan.quick, plan.scale) if "turns" in only else [])))
            hist = History(work, lengths, plan.text_chars)
        if "fork" in only:
            log("1 fork")
            w_fork(plan, res, hist, work)  # type: ignore[arg-type]
        if "durable" in only:
            log("2 durable steps")
            w_durable(plan, res, work)
        exp = fsck_ = load = None
        sets: dict[int, ExportSet] = {}
        if "export" in only or "fsck" in only:
            base = hist.messages if hist is not None and len(hist.messages) >= max(plan.export_sizes) else None
            if base is None:
                base = list(Conversation(1, plan.text_chars).messages(max(plan.export_sizes)))
            conv2 = Conversation(2, plan.text_chars)
            for n in plan.export_sizes:
                t0 = time.perf_counter()
                sets[n] = ExportSet(work, n, base, conv2)
                log(f"export set of {n:,} messages + family built ({time.perf_counter() - t0:.1f} s)")
            if "export" in only:
                log("3 export / import")
                exp = w_export(plan, res, sets)
            if "fsck" in only:
                log("5 fsck")
                fsck_ = w_fsck(plan, res, sets, exp)
        if "load" in only:
            log("4 load for resume")
            packed = None
            if exp is not None:
                es = sets[max(sets)]
                packed = (str(exp[max(sets)]["import_dir"]), es.ses, es.jsonl, es.n)
            load = w_load(plan, res, hist, packed)  # type: ignore[arg-type]
        if "remote" in only:
            log("7 remote")
            from .remote import w_remote

            w_remote(plan, res, work, timed=ctimed, median=median, rate=rate, mib=mib, log=log)
        if "turns" in only:
            log("8 store time per turn")
            from .turns import w_turns

            w_turns(plan, res, hist, median=median, ms=ms, log=log)
        if "files" in only:
            log("8 files per session")
            from .turns import w_files

            w_files(plan, res, work, median=median, ms=ms, log=log)
        if "checkpoints" in only:
            log("9 workspace checkpoints")
            from .checkpoints import w_checkpoints

            w_checkpoints(plan, res, work, median=median, ms=ms, log=log)
        scaling_rows(res, plan, exp, fsck_, load)
        res.rows.sort(key=lambda r: r.workload)
        print(f"\nkxen-agent benchmarks: {'quick (sizes meaningless)' if plan.quick else 'default'} run, "
              f"scale {plan.scale}, median of {plan.repeats} repeats (forks {plan.fork_repeats}), "
              f"{os.cpu_count()} CPUs, {time.perf_counter() - t_start:.0f} s\n")
        print(table(res))
        missed = [r for r in res.rows if r.met is False]
        print(f"\n{sum(1 for r in res.rows if r.met)} targets met, {len(missed)} missed")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"plan": asdict(plan), "rows": [asdict(r) for r in res.rows], "raw": res.raw}, f, indent=1,
                          default=str)
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
