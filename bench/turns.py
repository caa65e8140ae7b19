"""Workload 8 of ``bench.run``: store time per turn at a history of 10 / 10,000 / 100,000 messages.

::

    .venv/bin/python -m bench.run --only turns [--quick]

A run holds its history in memory (issue #13, item 1): the provider's
message list is built once per process and extended with what each turn
adds, so the store work of a turn must not depend on the history behind it.
For each size, a fork of the shared conversation (``History``, the fork and
load workloads' content) is resumed with a new task by the real
:class:`~kxen_agent.runtime.runner.Runner` on a fresh
:class:`~kxen_agent.store.Store` with real fsyncs (one CLI process); a
counting provider asks for one ``read_file`` of a 2 KB file per turn,
``TURNS`` times, then answers.

A turn's store time is the wall time from the end of one model call to the
start of the next, minus the tool's own time: the assistant message and
run state, the call's Started and OutcomeKnown, the tool message, Settled,
and the history brought up to date for the next call. The first model
call's history load is *not* a turn (it is workload 4, load for resume).
Figures: the median turn at each size, and turn(100,000)/turn(10) against
the target of at most 1.2; the store reads per turn (the seam's
``read_count``) beside it, which are exact. CPU seconds of the same
intervals are given too: the wall time is mostly fsyncs, whose latency
swings on this shared machine.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

__all__ = ["TURNS", "turn_sizes", "w_turns"]

#: Tool turns per run (the default agent's max_turns is 20: these and the answer fit).
TURNS = 12


def turn_sizes(quick: bool, scale: int) -> list[int]:
    return [10, 100, 300] if quick else [10, 10_000, 100_000 * scale]


class _Provider:
    """Asks for ``read_file notes.txt`` on each of ``turns`` turns, then answers; marks each call's start and end."""

    model = "bench-turns"
    base_url = None

    def __init__(self, store: Any, turns: int) -> None:
        self.store = store
        self.turns = turns
        self.n = 0
        #: (wall, cpu, read_count) at each call's start, and at its end.
        self.starts: list[tuple[float, float, int]] = []
        self.ends: list[tuple[float, float, int]] = []

    def complete(self, messages: list[dict], tools: list[dict], **kw: Any) -> Any:
        from kxen_agent.runtime.providers import AssistantTurn, ToolCall

        self.starts.append((time.perf_counter(), time.process_time(), self.store.io.read_count))
        self.n += 1
        if self.n > self.turns:
            turn = AssistantTurn("done", (), self.model)
        else:
            turn = AssistantTurn(None, (ToolCall(f"call_{self.n}", "read_file", '{"path": "notes.txt"}'),), self.model)
        self.ends.append((time.perf_counter(), time.process_time(), self.store.io.read_count))
        return turn

    def close(self) -> None:
        pass


def turn_run(root: str, ses: str, turns: int) -> dict[str, list[float]]:
    """Resume ``ses`` (a fork, made here) with a new task for ``turns`` tool turns; per turn: wall, CPU, reads."""
    from kxen_agent.runtime import runner as rmod
    from kxen_agent.session.sessions import SessionStore

    from ._kxen import measuring_store

    fork = SessionStore(measuring_store(root)).fork(ses)
    store = measuring_store(root)
    made: list[_Provider] = []

    def factory(agent: dict, endpoint: Any) -> _Provider:
        made.append(_Provider(store, turns))
        return made[-1]

    tool = rmod.TOOLS["read_file"]
    orig_run = tool.run
    tool_wall: list[float] = []
    tool_cpu: list[float] = []

    def run_tool(args: dict, ctx: Any) -> Any:
        t, c = time.perf_counter(), time.process_time()
        try:
            return orig_run(args, ctx)
        finally:
            tool_wall.append(time.perf_counter() - t)
            tool_cpu.append(time.process_time() - c)

    tool.run = run_tool  # type: ignore[method-assign]
    try:
        os.sync()  # what setup left dirty is not a turn's to write out
        runner = rmod.Runner(store, providers=factory)
        # Off: the shared history's 128,000 loose objects would be packed by the first
        # turn's pass (workload "files" measures packing); here only the turns count.
        runner.autopack = None
        result = runner.resume(fork.id, task="benchmark the turns")
    finally:
        del tool.run
    p = made[-1]  # the loop's provider (the first one made is the start's check, closed at once)
    if result.status != "completed" or p.n != turns + 1 or len(tool_wall) != turns:
        raise RuntimeError(f"turn run ended {result.status} after {p.n} model calls and {len(tool_wall)} tool calls")
    wall, cpu, reads = [], [], []
    for i in range(turns):
        (w0, c0, r0), (w1, c1, r1) = p.ends[i], p.starts[i + 1]
        wall.append(w1 - w0 - tool_wall[i])
        cpu.append(c1 - c0 - tool_cpu[i])
        reads.append(float(r1 - r0))
    return {"wall": wall, "cpu": cpu, "reads": reads}


def w_turns(plan: Any, res: Any, hist: Any, *, median: Callable[[list[float]], float],
            ms: Callable[[float], str], log: Callable[[str], None]) -> dict:
    """Measure the store time per turn at each size of ``turn_sizes``; add the rows (workload ``8 turns``)."""
    sizes = turn_sizes(plan.quick, plan.scale)
    ws = hist.workspace
    with open(os.path.join(ws, "notes.txt"), "w") as f:
        f.write(("notes of the benchmark, line after line of them\n" * 60)[:2048])
    turns = 2 if plan.quick else TURNS
    out: dict[int, dict[str, list[float]]] = {n: {"wall": [], "cpu": [], "reads": []} for n in sizes}
    for r in range(plan.repeats):
        order = sizes[r % len(sizes):] + sizes[: r % len(sizes)]
        for n in order:
            log(f"turns round {r + 1}/{plan.repeats}: history of {hist.lengths[n]:,} messages")
            d = turn_run(hist.root, hist.sessions[n], turns)
            for k, v in d.items():
                out[n][k] += v
    res.raw["turns"] = {str(n): {**v, "messages": hist.lengths[n]} for n, v in out.items()}
    lo, hi = sizes[0], sizes[-1]
    for n in sizes:
        m = out[n]
        res.add("8 turns", f"store time per turn at {hist.lengths[n]:,} msgs (wall; CPU; store reads)",
                f"{ms(median(m['wall']))}; {ms(median(m['cpu']))}; {median(m['reads']):.0f} reads", "", None,
                "", None)
    g = median(out[hi]["wall"]) / median(out[lo]["wall"])
    gc = median(out[hi]["cpu"]) / median(out[lo]["cpu"])
    res.add("8 turns", f"store time per turn: turn({hist.lengths[hi]:,}) / turn({hist.lengths[lo]:,})",
            ms(median(out[hi]["wall"])), ms(median(out[lo]["wall"])), g, "<= 1.2", g <= 1.2, cpu=gc)
    gr = median(out[hi]["reads"]) / median(out[lo]["reads"])
    res.add("8 turns", "store reads per turn: turn(largest) / turn(smallest) (exact)",
            f"{median(out[hi]['reads']):.0f}", f"{median(out[lo]['reads']):.0f}", gr, "(context)", None)
    return out


# ================================================================== files per session (automatic packing)


def files_run(work: str, calls: int, threshold: int | None) -> dict[str, Any]:
    """A fresh state dir, one session, one run of ``calls`` read_file calls as the CLI runs it
    (real fsyncs; automatic packing at ``threshold``, None: the default; 0: off). Files left, and the
    turns' wall times while a background pass ran and while none did."""
    from kxen_agent.runtime import runner as rmod
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.store.autopack import AutoPacker

    from ._kxen import measuring_store

    root = os.path.join(work, f"files-{calls}-{threshold}")
    ws = os.path.join(work, "ws-files")
    os.makedirs(ws, exist_ok=True)
    with open(os.path.join(ws, "notes.txt"), "w") as f:
        f.write(("notes of the benchmark, line after line of them\n" * 60)[:2048])
    store = measuring_store(root)
    made: list[_Provider] = []
    stamps: list[tuple[float, bool]] = []
    runner = rmod.Runner(store)

    def factory(agent: dict, endpoint: Any) -> _Provider:
        p = _Provider(store, calls)
        inner = p.complete

        def complete(messages: list[dict], tools: list[dict], **kw: Any) -> Any:
            stamps.append((time.perf_counter(), runner.autopack is not None and runner.autopack.running()))
            return inner(messages, tools, **kw)

        p.complete = complete  # type: ignore[method-assign]
        made.append(p)
        return p

    runner.providers = factory
    runner.autopack = None if threshold == 0 else AutoPacker(store, threshold)
    lock = default_agent_definition([{"content": "unused"}], name="bench-files")
    lock["policy"]["max_turns"] = calls + 5
    t0 = time.perf_counter()
    result = runner.start(ws, "benchmark the files a session leaves", lock)
    total = time.perf_counter() - t0
    if result.status != "completed":
        raise RuntimeError(f"files run ended {result.status}")
    files = sum(len(names) for _, _, names in os.walk(root))
    busy, idle = [], []
    for (a, _), (b, running) in zip(stamps, stamps[1:]):
        (busy if running else idle).append(b - a)
    reports = runner.autopack.reports if runner.autopack is not None else []
    return {"files": files, "total_s": total, "busy_turns_s": busy, "idle_turns_s": idle,
            "passes": len(reports), "packed": sum(r.packed for r in reports),
            "pass_s": [r.seconds for r in reports], "longest_hold_s": max([r.longest_hold_s for r in reports] or [0.0])}


def w_files(plan: Any, res: Any, work: str, *, median: Callable[[list[float]], float],
            ms: Callable[[float], str], log: Callable[[str], None]) -> dict:
    """Files a 2,000-call session leaves, with automatic packing and without (workload ``8 files``)."""
    calls, threshold = (60, 100) if plan.quick else (2000, None)
    log(f"files: a session of {calls:,} tool calls, automatic packing on")
    on = files_run(work, calls, threshold)
    log(f"files: the same, automatic packing off ({AUTOPACK_OFF_NOTE})")
    off = files_run(work, calls, 0)
    res.raw["files"] = {"calls": calls, "on": on, "off": off}
    res.add("8 files", f"files in the state dir after one session of {calls:,} tool calls: packing on / off",
            f"{on['files']:,}", f"{off['files']:,}", on["files"] / off["files"], "<= 7,000 files",
            on["files"] <= 7000)
    res.add("8 files", f"automatic packing: {on['passes']} pass(es), {on['packed']:,} objects packed; longest pass "
            "(background); longest hold of the store lock", f"{ms(max(on['pass_s'] or [0]))}; "
            f"{ms(on['longest_hold_s'])}", "", None, "(context)", None)
    if on["busy_turns_s"] and on["idle_turns_s"]:
        b, i = on["busy_turns_s"], on["idle_turns_s"]
        res.add("8 files", f"turn time while a pass runs / while none does ({len(b)} and {len(i)} turns; "
                "max of the former)", f"{ms(median(b))} (max {ms(max(b))})", ms(median(i)), median(b) / median(i),
                "(context)", None)
    res.add("8 files", "whole run with packing / without (time)", ms(on["total_s"]), ms(off["total_s"]),
            on["total_s"] / off["total_s"], "(context)", None)
    return res.raw["files"]


AUTOPACK_OFF_NOTE = "KXEN_AGENT_AUTOPACK=0: what every session left before"
