"""A Hypothesis state machine over the library, checked against an in-memory model.

Two state dirs (A and B) and one real Git workspace. The rules are what a
user does: start a session with a task, give an existing session a new
task, fork it (at its head, at a user message, or — refused — between an
assistant's tool calls and their results), export sessions from one state
dir and import them into the other, delete a session, gc (``--prune=now``
only: this test is the only writer), and crash-and-reopen: drop the
:class:`Store` object and open the directory again, after leaving what an
interrupted writer leaves (an uncommitted reflog tail, a temp ref file
that was never renamed, an object no ref names).

The model is plain data: per state dir, per session, its messages (role,
content, tool call ids, run), parent, fork point, runs and whether it is
deleted. The script provider is a pure function of the history, so the
model predicts every message a run writes. After every step both state
dirs are reopened from disk and compared with the model, and fsck must be
clean.

``KXEN_STATE_MACHINE_EXAMPLES`` / ``KXEN_STATE_MACHINE_STEPS`` raise the
budget (defaults: 10 examples of up to 25 steps, 20 under ``KXEN_TEST_LONG=1``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from kxen_agent.errors import UsageError
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import SessionStore, msg_id
from kxen_agent.session.transfer import export_sessions, import_sessions
from kxen_agent.store import BundleRefused, Store, fsck, gc
from kxen_agent.store.fsio import FileIO
from kxen_agent.store.refs import ReflogEntry, format_reflog_line
from kxen_agent.store.steps import StepTx, TxUpdate, encode_record
from tests.helpers import depth

#: 6 examples by default (each a fresh pair of state dirs, ~1.5 s of CPU); KXEN_TEST_LONG=1: 20, as before.
EXAMPLES = int(os.environ.get("KXEN_STATE_MACHINE_EXAMPLES") or depth(fast=6, long=20))
STEPS_PER_EXAMPLE = int(os.environ.get("KXEN_STATE_MACHINE_STEPS", "25"))

BIG = "x" * 1500  # a tool output past the 1 KiB blob threshold
#: What the script agent says, step by step (the step is the number of
#: assistant messages already in the session's history).
SCRIPT = [
    {"content": "plan", "tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt", "content": "hello\n"}}]},
    {"content": "read", "tool_calls": [
        {"name": "read_file", "arguments": {"path": "notes.txt"}},
        {"name": "write_file", "arguments": {"path": "big.txt", "content": BIG}},
    ]},
    {"content": "done 1"},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
    {"content": "done 2"},
]
AGENT = default_agent_definition(SCRIPT, name="state-machine")
FINISHED = "script finished"
TASKS = st.sampled_from(["fix the build", "write notes", "t" * 1100, "ünïcode task"])

STATS = {"examples": 0, "steps": 0, "fsck": 0, "rules": {}}


def _tool_output(call: dict) -> str:
    args = call["arguments"]
    if call["name"] == "write_file":
        return f"wrote {len(args['content'].encode())} bytes to '{args['path']}'"
    return {"notes.txt": "hello\n", "big.txt": BIG}[args["path"]]


# ------------------------------------------------------------------ the model

Msg = tuple  # (role, content, tool call ids, tool_call_id, run)


@dataclass
class ModelSession:
    messages: list[Msg]
    root: str
    parent: str | None = None
    fork_point: str | None = None  # msg_<hex>, as the library names it
    runs: set[str] = field(default_factory=set)
    deleted: bool = False

    def copy(self) -> "ModelSession":
        return ModelSession(list(self.messages), self.root, self.parent, self.fork_point, set(self.runs), self.deleted)


def predict_run(history: list[Msg], task: str, run: str) -> list[Msg]:
    """The messages a run of the script agent appends to ``history``."""
    out: list[Msg] = [("user", task, (), None, run)]
    n = sum(1 for m in history if m[0] == "assistant")
    while True:
        step = SCRIPT[n] if n < len(SCRIPT) else {"content": FINISHED}
        calls = step.get("tool_calls", [])
        ids = tuple(f"call_{n}_{k}" for k in range(len(calls)))
        out.append(("assistant", step.get("content"), ids, None, run))
        n += 1
        if not calls:
            return out
        out += [("tool", _tool_output(c), (), cid, run) for cid, c in zip(ids, calls)]


class _NoSyncIO(FileIO):
    """Real files, no fsync: this test checks logic, the power-loss suite checks durability."""

    def _fsync_fd(self, fd: int) -> None:
        self.fsyncs += 1


def _git_workspace(path: str) -> str:
    os.makedirs(path)
    ident = ["-c", "user.name=kxen test", "-c", "user.email=test@kxen.invalid", "-c", "commit.gpgsign=false"]
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("# state machine workspace\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", *ident, *args], cwd=path, check=True, capture_output=True)
    return path


def _fingerprint(root: str) -> list[tuple[str, int, int]]:
    out = []
    for d, _dirs, files in os.walk(root):
        for f in files:
            st_ = os.stat(os.path.join(d, f))
            out.append((os.path.join(d, f), st_.st_size, st_.st_mtime_ns))
    return sorted(out)


def _scratch_base() -> str | None:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


# ------------------------------------------------------------------ the machine


class LibraryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.top = tempfile.mkdtemp(prefix="kxen-sm-", dir=_scratch_base())
        self.ws = _git_workspace(os.path.join(self.top, "ws"))
        self.paths = {"A": os.path.join(self.top, "A"), "B": os.path.join(self.top, "B")}
        self.stores = {k: Store(p, io=_NoSyncIO()) for k, p in self.paths.items()}
        self.model: dict[str, dict[str, ModelSession]] = {"A": {}, "B": {}}
        self.bundles = 0
        self.checked: dict[str, object] = {}  # store -> its files when fsck last found it clean
        STATS["examples"] += 1

    def teardown(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)

    def _count(self, name: str) -> None:
        STATS["steps"] += 1
        STATS["rules"][name] = STATS["rules"].get(name, 0) + 1

    def _live(self, s: str) -> list[str]:
        # In creation order, never sorted: ids are random, and Hypothesis
        # replays draws by position.
        return [k for k, v in self.model[s].items() if not v.deleted]

    def _any_live(self) -> bool:
        return any(self._live(s) for s in "AB")

    def _pick(self, data, s: str | None = None) -> tuple[str, str]:
        stores = [x for x in "AB" if self._live(x)] if s is None else [s]
        s = data.draw(st.sampled_from(stores), label="store")
        return s, data.draw(st.sampled_from(self._live(s)), label="session")

    # -------------------------------------------------------------- rules

    @initialize(task=TASKS)
    def first_session(self, task: str) -> None:
        self.start("A", task)

    @rule(s=st.sampled_from("AB"), task=TASKS)
    def start(self, s: str, task: str) -> None:
        self._count("start")
        res = Runner(self.stores[s]).start(self.ws, task, AGENT)
        assert res.status == "completed" and res.settled, res
        self.model[s][res.session] = ModelSession(predict_run([], task, res.run), res.session, runs={res.run})

    @precondition(_any_live)
    @rule(data=st.data(), task=TASKS)
    def new_task(self, data, task: str) -> None:
        self._count("new_task")
        s, ses = self._pick(data)
        runner = Runner(self.stores[s])
        runner.own_locks = [AGENT]  # both state dirs are set up with the agent (an imported lock is their own)
        res = runner.resume(ses, task=task)
        assert res.status == "completed" and res.settled, res
        m = self.model[s][ses]
        m.messages += predict_run(m.messages, task, res.run)
        m.runs.add(res.run)

    @precondition(_any_live)
    @rule(data=st.data(), where=st.sampled_from(["head", "user", "between-calls"]))
    def fork(self, data, where: str) -> None:
        self._count(f"fork-{where}")
        s, ses = self._pick(data)
        m = self.model[s][ses]
        ss = SessionStore(self.stores[s])
        history = ss.history(ss.get(ses).head)
        if where == "head":
            at, n = None, len(m.messages)
        else:
            want = (lambda x: x[0] == "user") if where == "user" else (lambda x: x[0] == "assistant" and x[2])
            points = [i for i, x in enumerate(m.messages) if want(x)]
            if not points:  # a fork at a first user message has no tool calls yet
                return
            i = data.draw(st.sampled_from(points), label="at")
            at, n = history[i].id, i + 1
        if where == "between-calls":
            with pytest.raises(UsageError, match="would split tool call"):
                ss.fork(ses, at=at)
            return
        new = ss.fork(ses, at=at)
        point = msg_id(history[n - 1].oid) if n else None
        assert new.meta["forkPoint"] == point and new.meta["forkKind"] == "conversation"
        self.model[s][new.id] = ModelSession(m.messages[:n], m.root, parent=ses, fork_point=point)

    @precondition(_any_live)
    @rule(data=st.data(), fmt=st.sampled_from(["pack", "json"]))
    def transfer(self, data, fmt: str) -> None:
        self._count(f"transfer-{fmt}")
        src = data.draw(st.sampled_from([x for x in "AB" if self._live(x)]), label="from")
        dst = "B" if src == "A" else "A"
        chosen = data.draw(st.lists(st.sampled_from(self._live(src)), min_size=1, max_size=3, unique=True), label="sessions")
        self.bundles += 1
        path = os.path.join(self.top, f"bundle-{self.bundles}.{'json' if fmt == 'json' else 'kxb'}")
        export_sessions(self.stores[src], chosen, path, fmt=fmt)
        # Import refuses (all of it) when a session here is not an ancestor of the bundle's.
        refused = False
        for ses in chosen:
            mine, theirs = self.model[dst].get(ses), self.model[src][ses]
            if mine is not None and (
                mine.messages != theirs.messages[: len(mine.messages)] or not mine.runs <= theirs.runs
            ):
                refused = True
        if refused:
            with pytest.raises(BundleRefused):
                import_sessions(self.stores[dst], path, self.ws)
            return
        import_sessions(self.stores[dst], path, self.ws)
        for ses in chosen:
            self.model[dst][ses] = self.model[src][ses].copy()

    @precondition(lambda self: len(self._live("A")) + len(self._live("B")) >= 3)  # keep sessions to work on
    @rule(data=st.data())
    def delete(self, data) -> None:
        self._count("delete")
        s, ses = self._pick(data)
        SessionStore(self.stores[s]).delete(ses)
        self.model[s][ses].deleted = True

    @rule(s=st.sampled_from("AB"), prune=st.sampled_from(["now", None]))
    def collect(self, s: str, prune: str | None) -> None:
        # prune=now only because nothing else writes to this state dir.
        self._count(f"gc-{prune}")
        gc(self.stores[s], prune=prune)
        if prune == "now":
            self.model[s] = {k: v for k, v in self.model[s].items() if not v.deleted}

    @rule(s=st.sampled_from("AB"), tail=st.booleans(), temp_ref=st.booleans(), orphan=st.booleans())
    def crash_and_reopen(self, s: str, tail: bool, temp_ref: bool, orphan: bool) -> None:
        """Drop the Store and reopen it, after leaving what an interrupted writer leaves."""
        self._count("crash_and_reopen")
        store = self.stores[s]
        groups = list(store.refs.groups("sessions"))
        lost = None
        if orphan:  # objects written, the ref transaction never ran
            lost = store.put("message", {"seq": 0, "role": "user", "content": f"lost {secrets.token_hex(4)}"})
        if groups and tail:
            g = groups[0]
            # A step record cut short by a crash in its append (objects_spec.md §6.8)...
            if os.path.exists(store.refs.steps_path(g)):
                # (a writer cuts an earlier tail before it appends: as it would)
                log = store.steps.load(g)
                rec = encode_record(StepTx(time.time_ns(), "crashed", 0, None, "leave",
                                           (TxUpdate("head", None, lost or b"\x07" * 32),)), [], log.end, log.line)
                os.truncate(store.refs.steps_path(g), log.end)
                with open(store.refs.steps_path(g), "ab") as f:
                    f.write(rec[: len(rec) // 2])
            # ... and, in a group a checkpoint has folded, its reflog appended, the ref file never renamed in.
            if os.path.exists(store.refs.log_path(g)):
                line = format_reflog_line(ReflogEntry(None, lost or b"\x07" * 32, time.time_ns(), 0, "head", "crashed"))
                with open(store.refs.log_path(g), "ab") as f:
                    f.write(line + line[: len(line) // 2])  # a whole line, then a torn one
        if groups and temp_ref:  # a new step log written to its temp name, never renamed
            d = os.path.dirname(store.refs.steps_path(groups[0]))
            with open(os.path.join(d, f"tmp_{secrets.token_hex(8)}"), "wb") as f:
                f.write(b"kxen-steps 2 sessions/ses_0 0\n")
        del store
        self.stores[s] = Store(self.paths[s], io=_NoSyncIO())

    # -------------------------------------------------------------- checks

    @invariant()
    def disk_matches_model(self) -> None:
        for s in "AB":
            store = Store(self.paths[s])  # what is on disk, read by a new process would see
            ss = SessionStore(store)
            model = self.model[s]
            every = {i.id: i for i in ss.list(include_deleted=True)}
            assert set(every) == set(model), (s, sorted(every), sorted(model))
            assert {i.id for i in ss.list()} == set(self._live(s))
            for ses, m in model.items():
                info = every[ses]
                assert (info.deleted_ns is not None) == m.deleted
                got = [(x.role, x.content, tuple(c["id"] for c in x.tool_calls), x.tool_call_id, x.run)
                       for x in ss.history(info.head)]
                assert got == m.messages, (s, ses)
                assert ss.message_count(info) == len(m.messages)
                assert info.meta.get("parentId") == m.parent and info.meta.get("forkPoint") == m.fork_point
                assert info.meta["branchRootId"] == m.root
                assert set(info.runs) == m.runs, (s, ses)
                latest = Runner(store).latest_run(info)
                if latest is not None:
                    assert latest[2]["status"] == "completed" and latest[2]["settled"]
            # fsck again only if a file changed since it last passed (the model is compared every time).
            files = _fingerprint(self.paths[s])
            if self.checked.get(s) != files:
                rep = fsck(store)
                assert rep.clean, [p.line() for p in rep.problems]
                STATS["fsck"] += 1
                self.checked[s] = files


@pytest.mark.slow
def test_library_state_machine(monkeypatch):
    monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", "3600")  # no renewer thread writes during a step
    t0 = time.monotonic()
    run_state_machine_as_test(
        LibraryMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS_PER_EXAMPLE,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    print(f"\nstate machine: {STATS['examples']} examples, {STATS['steps']} steps, {STATS['fsck']} fsck runs in "
          f"{time.monotonic() - t0:.1f}s; rules: {dict(sorted(STATS['rules'].items()))}")
    assert STATS["steps"] > 0
