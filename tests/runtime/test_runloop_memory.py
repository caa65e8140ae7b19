"""The run loop in-process, over a ``MemoryStore``: runs, crashes, recovery, resolution, forks, the lease.

The cases ``test_runs.py`` and ``test_faults.py`` drive through the CLI in
real processes, here called as a library with the script provider and the
real tools in a tmp workspace. A crash is a :class:`Crash` raised from the
runner's fault hook at a named point (nothing in the runner catches a
``BaseException``, as nothing catches a SIGKILL): what was durable stays,
the rest never happens. The lease is the memory store's, shared by the
threads of this process. Durability itself (fsync, torn files, real
SIGKILLs) is the CLI and reliability suites' business.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from kxen_agent.runtime.faults import POINTS
from kxen_agent.runtime.lease import Lease, LeaseBusy, LeaseLost, MemoryLeaseBackend
from kxen_agent.runtime.runner import RunError, Runner, RunResult
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.schema import SESSION_SCHEMA
from kxen_agent.session.sessions import Message, SessionError, SessionInfo, SessionStore, msg_id
from kxen_agent.errors import UsageError
from kxen_agent.store import StaleFence
from kxen_agent.store.memory import MemoryStore
from kxen_agent.store.objects import a_kind, links_of

FINAL = "all done"
KNOWN_POINTS = ("provider:mid-stream", "provider:after-response", "tool:after-outcome", "tool:after-turn",
                "run:after-result", "run:after-final-message")
UNKNOWN_POINTS = ("tool:after-started", "tool:after-effect")
# Passed only with [policy] approve or context_tokens: test_approvals.py and test_compaction.py crash there.
assert set(KNOWN_POINTS + UNKNOWN_POINTS) == set(POINTS) - {"approval:after-decided", "compaction:after-response",
                                                            "compaction:after-message"}


class Crash(BaseException):
    """The process "dies" here: raised from the fault hook, caught by nothing in the runner."""


def crash_at(point: str, nth: int = 1) -> Callable[[str], None]:
    """A fault hook that crashes the ``nth`` time the run passes ``point``."""
    assert point in POINTS
    seen: Counter = Counter()

    def hook(p: str) -> None:
        assert p in POINTS, p
        seen[p] += 1
        if p == point and seen[p] == nth:
            raise Crash(p)

    return hook


def no_fault(point: str) -> None:
    assert point in POINTS, point


class Bench:
    """A memory store, a plain-directory workspace and an effects file outside it."""

    def __init__(self, tmp: Path) -> None:
        self.store = MemoryStore("runloop")
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.effects = tmp / "effects.log"
        self.events: list[str] = []

    def runner(self, fault: Callable[[str], None] = no_fault, **kw) -> Runner:
        # Streamed, as on a terminal: the answer's text comes in pieces, so
        # the loop passes every fault point, provider:mid-stream included.
        kw.setdefault("stream", True)
        return Runner(self.store, fault=fault, on_event=self.events.append, **kw)

    @property
    def sessions(self) -> SessionStore:
        return SessionStore(self.store)

    def shell(self, line: str) -> dict:
        return {"name": "shell", "arguments": {"command": f"echo {line} >> '{self.effects}'"}}

    def agent(self, steps: list[dict]) -> dict:
        return default_agent_definition(steps)

    def start(self, task: str, steps: list[dict], fault: Callable[[str], None] = no_fault) -> RunResult:
        return self.runner(fault).start(str(self.ws), task, self.agent(steps))

    def crash(self, task: str, steps: list[dict], point: str, nth: int = 1) -> tuple[str, str]:
        """Start a run that crashes at ``point``; its (session, run)."""
        with pytest.raises(Crash):
            self.start(task, steps, crash_at(point, nth))
        [info] = self.sessions.list()
        [run] = info.runs
        return info.id, run

    def state(self, ses: str, run: str) -> dict:
        return Runner(self.store).run_state(self.sessions.get(ses), run)[1]

    def ops(self, ses: str, run: str) -> list[dict]:
        """The latest entry of each op, as ``run show`` lists them."""
        r = Runner(self.store)
        return list(r.ops(r.run_state(self.sessions.get(ses), run)[1]).values())

    def output(self, entry: dict) -> str | None:
        return Runner(self.store).entry_output(entry)

    def log(self, ses: str) -> list[Message]:
        return self.sessions.history(self.sessions.get(ses).head)

    def effect_lines(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(tmp_path)


def one_effect(bench: Bench, line: str = "effect") -> list[dict]:
    return [{"content": "appending", "tool_calls": [bench.shell(line)]}, {"content": FINAL}]


def check_history(log: list[Message]) -> None:
    """Each tool call asked once and answered once; no provider turn recorded twice; seqs in order."""
    asked = [c["id"] for m in log if m.role == "assistant" for c in m.tool_calls]
    answered = Counter(m.tool_call_id for m in log if m.role == "tool")
    assert len(asked) == len(set(asked)), asked
    assert answered == Counter({c: 1 for c in asked}), (asked, answered)
    turns = [(m.content, tuple(c["id"] for c in m.tool_calls)) for m in log if m.role == "assistant"]
    assert len(turns) == len(set(turns)), turns
    assert [m.seq for m in log] == list(range(len(log)))


def check_store(store: MemoryStore) -> None:
    """What ``fsck`` checks of a state dir, over the memory store: every ref and link names a present
    object of the kind the session schema asks, every object reachable has its schema's shape, and each
    ref is where its reflog ends."""
    for group in store.refs.groups():
        state = store.refs.read(group)
        last = {e.name: e.new for e in store.refs.reflog(group, state)}
        assert {n: v for n, v in last.items() if v is not None} == state.refs, group
        stack = []
        for name, oid in state.refs.items():
            want = SESSION_SCHEMA.ref_kind(group, name)
            assert want is None or store.read_raw(oid).kind == want, f"{group}/{name}"
            stack.append(oid)
        seen: set[bytes] = set()
        while stack:
            oid = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            obj = store.read_raw(oid)
            value = store.get(oid)
            for child, kind in SESSION_SCHEMA.check(obj.kind, value):
                got = store.read_raw(child).kind
                assert got == kind, f"{oid.hex()} links to {a_kind(got)} where {a_kind(kind)} belongs"
            stack.extend(links_of(obj.kind, value))


# ==================================================================== runs


def test_a_completed_run(bench: Bench) -> None:
    res = bench.start("do it", one_effect(bench))
    assert (res.status, res.result, res.error, res.turn, res.model, res.settled, res.unknown_ops) == (
        "completed", FINAL, None, 2, "script", True, [])
    assert res.exit_code == 0 and res.to_json()["unknownOps"] == []
    assert bench.effect_lines() == ["effect"]
    [op] = bench.ops(res.session, res.run)
    assert (op["state"], op["source"], op["tool"], op["sideEffects"]) == ("Settled", "tool", "shell", True)
    assert bench.output(op) == "[exit code 0]" and op["isError"] is False
    log = bench.log(res.session)
    assert [(m.role, m.run) for m in log] == [("user", res.run), ("assistant", res.run), ("tool", res.run),
                                             ("assistant", res.run)]
    assert [m.content for m in log] == ["do it", "appending", "[exit code 0]", FINAL]
    check_history(log)
    # Every ref update of the run carried its lease's fence (the first grant: 1).
    group = f"sessions/{res.session}"
    assert bench.store.refs.read(group).fence == 1
    assert {e.fence for e in bench.store.refs.reflog(group) if e.name != "meta"} == {1}
    assert Lease.holder(bench.store, res.session) is None, "the lease was given back"
    assert any(f"run {res.run} started" in e for e in bench.events)
    check_store(bench.store)


def test_consecutive_runs_and_resume_refusals(bench: Bench) -> None:
    steps = one_effect(bench, "one") + [{"tool_calls": [bench.shell("two")]}, {"content": "second task done"}]
    first = bench.start("task one", steps)
    ses, run0 = first.session, first.run
    runner = bench.runner()
    with pytest.raises(RunError, match=f"nothing to resume: run {run0} of session {ses} is completed"):
        runner.resume(ses)
    second = runner.resume(ses, task="task two")
    assert (second.session, second.status, second.result) == (ses, "completed", "second task done")
    assert second.run != run0 and bench.state(ses, second.run)["index"] == 1
    assert sorted(bench.sessions.get(ses).runs) == sorted([run0, second.run])
    log = bench.log(ses)
    assert [(m.role, m.run) for m in log] == (
        [("user", run0), ("assistant", run0), ("tool", run0), ("assistant", run0)]
        + [("user", second.run), ("assistant", second.run), ("tool", second.run), ("assistant", second.run)])
    assert log[4].content == "task two"
    assert bench.effect_lines() == ["one", "two"]
    third = runner.resume(ses, task="task three\n")
    assert third.result == "script finished" and bench.state(ses, third.run)["task"] == "task three\n"
    # One grant per run, and one for the refused resume (it decides under the lease): one fence each.
    assert bench.store.refs.read(f"sessions/{ses}").fence == 4
    check_history(bench.log(ses))
    check_store(bench.store)


def test_a_new_task_is_refused_while_a_run_is_unfinished(bench: Bench) -> None:
    ses, run = bench.crash("one effect", one_effect(bench), "tool:after-effect")
    before = bench.log(ses)
    runner = bench.runner()
    with pytest.raises(RunError, match=f"run {run} of session {ses} is still running"):
        runner.resume(ses, task="something else")
    assert runner.resume(ses).status == "input_required"
    with pytest.raises(RunError, match="still input_required.*resolve"):
        runner.resume(ses, task="something else")
    assert list(bench.sessions.get(ses).runs) == [run]
    assert bench.log(ses) == before
    assert bench.effect_lines() == ["effect"]


def test_max_turns_fails_the_run(bench: Bench) -> None:
    loop = {"tool_calls": [{"name": "list_files", "arguments": {}}]}
    agent = dict(bench.agent([loop, loop, loop, {"content": FINAL}]))
    agent["policy"] = dict(agent["policy"], max_turns=2)
    res = bench.runner().start(str(bench.ws), "loop", agent)
    assert (res.status, res.settled, res.turn, res.exit_code) == ("failed", True, 2, 1)
    assert "max_turns (2)" in res.error
    assert [m.role for m in bench.log(res.session)] == ["user", "assistant", "tool", "assistant", "tool"]


# ==================================================================== crash and recovery


@pytest.mark.parametrize("point", KNOWN_POINTS + UNKNOWN_POINTS)
def test_crash_at_each_point_then_resume(bench: Bench, point: str) -> None:
    ses, run = bench.crash("append the marker", one_effect(bench, "MARK"), point)

    # What is durable right after the crash is the seed's for that point.
    st = bench.state(ses, run)
    expected = {
        "provider:mid-stream": [],
        "provider:after-response": [],
        "tool:after-started": ["Started"],
        "tool:after-effect": ["Started"],
        "tool:after-outcome": ["OutcomeKnown"],
        "tool:after-turn": ["OutcomeKnown"],
        "run:after-result": ["Settled"],
        "run:after-final-message": ["Settled"],
    }[point]
    assert [e["state"] for e in bench.ops(ses, run)] == expected
    if point.startswith("run:"):
        assert (st["status"], st["settled"], st["result"]) == ("completed", False, FINAL)
        if point == "run:after-result":
            with pytest.raises(RunError, match=f"settlement was interrupted.*--resume {ses}"):
                bench.runner().resume(ses, task="next")
    else:
        assert st["status"] == "running"
    crashed = bench.log(ses)
    tools = 1 if point in ("tool:after-turn", "run:after-result", "run:after-final-message") else 0
    assert len([m for m in crashed if m.role == "tool"]) == tools
    assert len([m for m in crashed if m.content == FINAL]) == (1 if point == "run:after-final-message" else 0)
    assert bench.effect_lines() == ([] if point in ("provider:mid-stream", "provider:after-response",
                                                    "tool:after-started") else ["MARK"])

    res = bench.runner().resume(ses)
    verdict = None
    if point in UNKNOWN_POINTS:
        assert (res.session, res.run, res.status, res.exit_code) == (ses, run, "input_required", 3)
        [op] = bench.ops(ses, run)
        assert (op["state"], op["source"], op["tool"], op["sideEffects"]) == ("OutcomeUnknown", "recovery", "shell", True)
        assert res.unknown_ops == [op["op"]] and bench.output(op) is None
        # Resuming again neither runs nor resolves anything.
        again = bench.runner().resume(ses)
        assert again.unknown_ops == [op["op"]] and bench.ops(ses, run) == [op]
        # A human looks at the side effect, then resolves that exact op.
        ran = "MARK" in bench.effect_lines()
        verdict = "verified: MARK is in effects.log" if ran else "verified: the command never ran"
        bench.runner().resolve(ses, run, op["op"], verdict, is_error=not ran)
        res = bench.runner().resume(ses)

    assert (res.session, res.run, res.status, res.result, res.settled, res.unknown_ops) == (
        ses, run, "completed", FINAL, True, [])
    # The side effect happened at most once, and exactly when it should.
    assert bench.effect_lines() == ([] if point == "tool:after-started" else ["MARK"])
    st = bench.state(ses, run)
    assert (st["status"], st["settled"], st["turn"]) == ("completed", True, 2)
    [op] = bench.ops(ses, run)
    assert op["state"] == "Settled"
    if verdict is not None:
        assert (op["source"], bench.output(op), op["isError"]) == ("human", verdict, point == "tool:after-started")
    else:
        assert (op["source"], bench.output(op), op["isError"]) == ("tool", "[exit code 0]", False)
    log = bench.log(ses)
    check_history(log)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[2].content == (verdict if verdict is not None else "[exit code 0]") and log[3].content == FINAL
    check_store(bench.store)


def test_resolve_moves_only_an_unknown_op_and_never_runs_it(bench: Bench) -> None:
    ses, run = bench.crash("one effect", one_effect(bench), "tool:after-effect")
    [started] = bench.ops(ses, run)
    op = started["op"]
    runner = bench.runner()
    # Right after the crash the op is Started: recovery decides first, not a human.
    with pytest.raises(RunError, match=f"operation {op} is Started, not OutcomeUnknown"):
        runner.resolve(ses, run, op, "too early")
    assert bench.ops(ses, run) == [started]
    runner.resume(ses)
    [unknown] = bench.ops(ses, run)
    with pytest.raises(RunError, match="op_00000000000000000000 is not in run"):
        runner.resolve(ses, run, "op_00000000000000000000", "x")
    with pytest.raises(RunError, match="run_00000000000000000000 is not in session"):
        runner.resolve(ses, "run_00000000000000000000", op, "x")
    assert bench.ops(ses, run) == [unknown]
    out = runner.resolve(ses, run, op, "verified: effect present")
    assert out == {"session": ses, "run": run, "op": op, "state": "OutcomeKnown", "source": "human", "isError": False}
    with pytest.raises(RunError, match="is OutcomeKnown, not OutcomeUnknown"):
        runner.resolve(ses, run, op, "changed my mind", is_error=True)
    assert runner.resume(ses).status == "completed"
    with pytest.raises(RunError, match="is Settled"):
        runner.resolve(ses, run, op, "again")
    assert bench.effect_lines() == ["effect"], "resolving never executes the operation"
    assert [m.content for m in bench.log(ses) if m.role == "tool"] == ["verified: effect present"]


def test_a_fault_at_the_nth_occurrence(bench: Bench) -> None:
    steps = [{"tool_calls": [bench.shell("first")]},
             {"tool_calls": [bench.shell("second"), bench.shell("third")]},
             {"content": FINAL}]
    ses, run = bench.crash("three effects", steps, "tool:after-effect", nth=2)
    assert bench.effect_lines() == ["first", "second"]
    assert [(e["callId"], e["state"]) for e in bench.ops(ses, run)] == [("call_0_0", "Settled"), ("call_1_0", "Started")]
    res = bench.runner().resume(ses)
    ops = bench.ops(ses, run)
    assert [(e["callId"], e["state"]) for e in ops] == [("call_0_0", "Settled"), ("call_1_0", "OutcomeUnknown")]
    assert res.unknown_ops == [ops[1]["op"]]
    assert bench.effect_lines() == ["first", "second"], "the turn's other call waits while its sibling is UNKNOWN"
    bench.runner().resolve(ses, run, ops[1]["op"], "verified: 'second' is in effects.log")
    assert bench.runner().resume(ses).status == "completed"
    assert bench.effect_lines() == ["first", "second", "third"]
    assert [e["state"] for e in bench.ops(ses, run)] == ["Settled"] * 3
    log = bench.log(ses)
    check_history(log)
    assert [m.content for m in log if m.role == "tool"] == [
        "[exit code 0]", "verified: 'second' is in effects.log", "[exit code 0]"]


def test_a_read_only_tool_interrupted_after_started_is_run_again(bench: Bench) -> None:
    (bench.ws / "data.txt").write_text("payload-42\n")
    steps = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "data.txt"}}, bench.shell("effect")]},
             {"content": FINAL}]
    ses, run = bench.crash("read then write", steps, "tool:after-started")
    [read_op] = bench.ops(ses, run)
    assert (read_op["tool"], read_op["state"], read_op["sideEffects"]) == ("read_file", "Started", False)
    res = bench.runner().resume(ses)
    assert (res.status, res.unknown_ops) == ("completed", [])
    ops = bench.ops(ses, run)
    assert [(e["tool"], e["state"]) for e in ops] == [("read_file", "Settled"), ("shell", "Settled")]
    assert ops[0]["op"] == read_op["op"], "the re-run keeps its operation id"
    assert bench.output(ops[0]) == "payload-42\n"
    assert bench.effect_lines() == ["effect"]
    assert any("has no side effects; running it again" in e for e in bench.events)
    check_history(bench.log(ses))


def test_an_outcome_known_but_unsettled_is_written_once_even_after_a_second_crash(bench: Bench) -> None:
    """A large output (kept in a blob the journal links) is recovered whole from the journal, and the
    recovering run crashing at the next point changes nothing."""
    command = f"echo once >> '{bench.effects}'; head -c 5000 /dev/zero | tr '\\0' x; echo"
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}, {"content": FINAL}]
    ses, run = bench.crash("big output", steps, "tool:after-outcome")
    [known] = bench.ops(ses, run)
    assert known["state"] == "OutcomeKnown" and "outputBlob" in known
    with pytest.raises(Crash):
        bench.runner(crash_at("tool:after-turn")).resume(ses)
    assert len([m for m in bench.log(ses) if m.role == "tool"]) == 1
    assert bench.runner().resume(ses).status == "completed"
    expected = "x" * 5000 + "\n[exit code 0]"
    log = bench.log(ses)
    check_history(log)
    assert [m.content for m in log if m.role == "tool"] == [expected]
    [op] = bench.ops(ses, run)
    assert (op["state"], bench.output(op)) == ("Settled", expected)
    assert bench.effect_lines() == ["once"]
    check_store(bench.store)


# ==================================================================== forks


def test_forks_share_history_and_never_split_a_tool_turn(bench: Bench) -> None:
    steps = one_effect(bench, "one") + [{"tool_calls": [bench.shell("two")]}, {"content": "second"},
                                        {"content": "on the fork"}]
    first = bench.start("task one", steps)
    ses = first.session
    sessions = bench.sessions
    parent = sessions.get(ses)
    history = sessions.history(parent.head)

    # At the head: one new object (the fork's metadata), the whole history shared.
    before = set(bench.store.iter_ids())
    fork = sessions.fork(ses)
    added = set(bench.store.iter_ids()) - before
    assert added == {fork.meta_oid}
    assert [m.oid for m in sessions.history(fork.head)] == [m.oid for m in history]
    assert (fork.meta["parentId"], fork.meta["forkPoint"], fork.meta["forkKind"], fork.agent_oid) == (
        ses, msg_id(parent.head), "conversation", parent.agent_oid)
    assert fork.meta["branchRootId"] == ses and fork.runs == {}

    # At a message (a unique prefix of its id): the fork's history ends there.
    at = history[2]  # the tool result: the turn it ends is whole
    early = sessions.fork(ses, at="msg_" + at.oid.hex()[:10])
    assert early.head == at.oid and early.meta["forkPoint"] == at.id
    assert [m.oid for m in sessions.history(early.head)] == [m.oid for m in history[:3]]

    # A run in the parent that dies with a call started: its head asks for a tool
    # call whose result is not in the history.
    with pytest.raises(Crash):
        bench.runner(crash_at("tool:after-started")).resume(ses, task="task two")
    pending = sessions.get(ses)
    asking = sessions.read_message(pending.head)
    assert asking.role == "assistant" and asking.tool_calls
    count = len(sessions.list())
    with pytest.raises(SessionError, match=f"cannot fork session {ses} at its newest message {asking.id}.*"
                                           f"fork --at {msg_id(asking.parent)}"):
        sessions.fork(ses)
    with pytest.raises(UsageError, match=f"would split tool call\\(s\\) {asking.tool_calls[0]['id']}"):
        sessions.fork(ses, at=asking.id)
    assert len(sessions.list()) == count, "a refused fork writes no session"
    ok = sessions.fork(ses, at=msg_id(asking.parent))
    assert ok.head == asking.parent

    # The fork made at the head runs on its own; its parent does not move.
    res = bench.runner().resume(fork.id, task="fork task")
    assert res.status == "completed" and res.session == fork.id
    assert sessions.get(ses).head == pending.head
    fork_log = sessions.history(sessions.get(fork.id).head)
    assert [m.oid for m in fork_log[: len(history)]] == [m.oid for m in history]
    assert fork_log[len(history)].content == "fork task"
    root, children, _ = sessions.tree(ok.id)
    assert root == ses and sorted(children[ses]) == sorted([fork.id, early.id, ok.id])
    check_store(bench.store)


# ==================================================================== the lease


class Park:
    """A fault hook that holds the run at ``point`` until released (the run keeps its lease meanwhile)."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.parked = threading.Event()
        self.go = threading.Event()

    def __call__(self, p: str) -> None:
        if p == self.point and not self.parked.is_set():
            self.parked.set()
            assert self.go.wait(30), "the test never let the parked run go"


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_run_holds_the_session_against_every_other_thread(bench: Bench) -> None:
    park = Park("tool:after-started")
    holder, out = in_thread(lambda: bench.start("long", one_effect(bench), park))
    assert park.parked.wait(30)
    [info] = bench.sessions.list()
    [run] = info.runs
    other = bench.runner()
    for attempt in (lambda: other.resume(info.id), lambda: other.resume(info.id, task="more"),
                    lambda: other.resolve(info.id, run, "op_00000000000000000000", "x")):
        with pytest.raises(LeaseBusy) as e:
            attempt()
        assert e.value.exit_code == 75
        assert f"session {info.id} is busy" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
        assert f"run {run}" in str(e.value) and "it is alive" in str(e.value)
    # Reading and forking need no lease.
    assert bench.sessions.fork(info.id, at=bench.sessions.history(info.head)[0].id).head is not None
    assert Lease.holder(bench.store, info.id)["run"] == run
    park.go.set()
    holder.join(30)
    assert out["value"].status == "completed", out
    assert bench.effect_lines() == ["effect"]
    with pytest.raises(RunError, match="nothing to resume"):
        other.resume(info.id)


def test_two_threads_racing_for_a_new_task_exactly_one_runs(bench: Bench) -> None:
    steps = one_effect(bench, "zero") + [{"tool_calls": [bench.shell("race")]}, {"content": "raced"}]
    ses = bench.start("setup", steps).session
    park = Park("tool:after-started")
    barrier = threading.Barrier(2)
    refused = threading.Event()

    def contender() -> RunResult:
        barrier.wait()
        try:
            return bench.runner(park).resume(ses, task="race")
        except LeaseBusy:
            refused.set()
            raise

    threads = [in_thread(contender) for _ in range(2)]
    # One holds the lease parked at its tool call until the other has been refused.
    assert park.parked.wait(30) and refused.wait(30)
    park.go.set()
    for t, _ in threads:
        t.join(30)
    outs = [out for _, out in threads]
    assert sorted("value" if "value" in o else type(o["error"]).__name__ for o in outs) == ["LeaseBusy", "value"]
    [won] = [o["value"] for o in outs if "value" in o]
    assert (won.status, won.result) == ("completed", "raced")
    assert len(bench.sessions.get(ses).runs) == 2
    assert bench.effect_lines() == ["zero", "race"]


class PausableLeases(MemoryLeaseBackend):
    """The memory lease backend whose renewals fail for one fence: that holder is "paused" and expires."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.paused_fence: int | None = None

    def stage_record(self, ses: str, data: bytes):
        if json.loads(data)["fence"] == self.paused_fence:
            raise OSError("renewal paused by the test")  # the renewer retries: the lease runs out
        return super().stage_record(ses, data)


def test_takeover_after_expiry_fences_out_a_paused_holder(bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process twin of the lease torture's regression: the holder pauses after ``Started``, its
    lease expires, another runner takes over (the op becomes UNKNOWN); the old holder then continues
    and must not run the side effect (``Lease.check`` before a side-effecting tool)."""
    monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", "0.3")
    leases = PausableLeases(bench.store.root)
    taken: dict = {}

    def pause_and_lose_the_lease(point: str) -> None:
        if point != "tool:after-started" or taken:
            return
        [info] = bench.sessions.list()
        leases.paused_fence = info.fence
        deadline = time.monotonic() + 10
        while Lease.holder(bench.store, info.id, backend=leases)["expiresNs"] >= time.time_ns():
            assert time.monotonic() < deadline, "the paused holder's lease did not expire"
            time.sleep(0.01)
        taken["result"] = bench.runner(leases=leases).resume(info.id)

    with pytest.raises((StaleFence, LeaseLost)):
        bench.runner(pause_and_lose_the_lease, leases=leases).start(str(bench.ws), "append once",
                                                                      bench.agent(one_effect(bench)))
    res = taken["result"]
    assert res.status == "input_required" and len(res.unknown_ops) == 1
    assert bench.effect_lines() == [], "the fenced-out holder ran the side effect of an op it no longer owned"
    ses = res.session
    assert bench.store.refs.read(f"sessions/{ses}").fence == 2
    bench.runner(leases=leases).resolve(ses, res.run, res.unknown_ops[0], "verified: never ran", is_error=True)
    done = bench.runner(leases=leases).resume(ses)
    assert done.status == "completed" and bench.effect_lines() == []
    check_history(bench.log(ses))
