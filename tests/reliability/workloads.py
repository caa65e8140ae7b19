"""The workloads the power-loss and I/O-error suites torture, and the fault driver.

Each :class:`~.crashsim.Workload` is one operation a user runs (a run with
tool calls from an empty state dir, a fork, an import, a gc), the state it
starts from, what recovering from a crash means for it, and what finishing
it after an I/O error means.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from kxen_agent.errors import KxenError
from kxen_agent.runtime.runner import TERMINAL, Runner, RunResult
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import SessionStore, msg_id
from kxen_agent.store import Store, fsck
from kxen_agent.store.fsio import MUTATING_OPS, FaultyIO

from .crashsim import FastIO, Workload, open_store, quiet_lease, scratch_dir

__all__ = [
    "ForkAfterDeathWorkload",
    "ForkWorkload",
    "FaultReport",
    "FaultThenRetry",
    "barrier_faults",
    "fault_points",
    "op_key",
    "AutoPackWorkload",
    "GcWorkload",
    "ImportWorkload",
    "LooseWorkload",
    "ResumeWorkload",
    "RunWorkload",
    "UpgradeWorkload",
    "READ_VARIANTS",
    "VARIANTS",
    "all_workloads",
    "crash_workloads",
    "inject_faults",
    "settle",
]

#: A run with tool calls: a side effect (shell), a write, a read whose output
#: is kept in a blob (> 1 KiB), then a final answer.
STEPS = [
    {"tool_calls": [
        {"name": "shell", "arguments": {"command": "echo effect >> effects.txt"}},
        {"name": "write_file", "arguments": {"path": "big.txt", "content": "kxen " * 300}},
    ]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
    {"content": "done"},
]
TASK = "touch the workspace, then read it back"


def agent() -> dict:
    return default_agent_definition(STEPS, name="reliability")


def settle(store: Store, ses: str, task: str = TASK) -> RunResult:
    """Bring ``ses`` to a settled, completed run, as a user would after a crash.

    Resume its unfinished run (or start one with ``task`` if none was
    recorded); an operation whose outcome is UNKNOWN is resolved the way a
    human would (the effect file shows it ran) and the run resumed again.
    """
    r = Runner(store)
    info = r.sessions.get(ses)
    latest = r.latest_run(info)
    if latest is None:
        res = r.resume(ses, task=task)
    else:
        run, oid, st = latest
        if st["status"] in TERMINAL and st.get("settled"):
            return r.result_of(info, run, oid, st)
        res = r.resume(ses)
    for _ in range(5):
        if res.status != "input_required":
            break
        if not res.unknown_ops:
            raise AssertionError(f"run {res.run} is input_required without an UNKNOWN operation")
        for op in res.unknown_ops:
            r.resolve(ses, res.run, op, "checked by hand: effects.txt shows the command ran")
        res = r.resume(ses)
    if res.status != "completed" or not res.settled:
        raise AssertionError(f"run {res.run} of {ses} ended {res.status} (settled={res.settled}): {res.error}")
    return res


class RunWorkload(Workload):
    """``Runner.start`` from a state dir that does not exist yet: create it, the session, the run, three turns."""

    name = "run"

    def setup(self, top: str, aux: str) -> None:
        self.ws = os.path.join(aux, "ws")
        os.makedirs(self.ws, exist_ok=True)

    def run(self, store: Store) -> Any:
        res = Runner(store).start(self.ws, TASK, agent())
        if res.status != "completed":
            raise AssertionError(f"the traced run ended {res.status}: {res.error}")
        return res

    def recover(self, store: Store) -> None:
        for info in SessionStore(store).list():
            settle(store, info.id)

    def retry(self, store: Store) -> None:
        if not SessionStore(store).list():
            self.run(store)  # nothing was recorded: start again
        self.recover(store)

    def verify(self, store: Store) -> None:
        sessions = SessionStore(store).list()
        assert sessions, "no session after the retry"
        for info in sessions:
            latest = Runner(store).latest_run(info)
            assert latest is not None and latest[2]["status"] == "completed" and latest[2]["settled"], info.id


def _completed_session(store: Store, ws: str) -> str:
    res = Runner(store).start(ws, TASK, agent())
    assert res.status == "completed", res
    return res.session


class ForkWorkload(Workload):
    """Two forks of a finished session: at its head, and at its first message."""

    name = "fork"

    def setup(self, top: str, aux: str) -> None:
        self.ws = os.path.join(aux, "ws")
        os.makedirs(self.ws, exist_ok=True)
        store = open_store(os.path.join(top, "state"), io=FastIO())
        self.parent = _completed_session(store, self.ws)
        ss = SessionStore(store)
        info = ss.get(self.parent)
        self.head = info.head
        self.first = msg_id(ss.history(info.head)[0].oid)

    def run(self, store: Store) -> Any:
        ss = SessionStore(store)
        a = ss.fork(self.parent)
        b = ss.fork(self.parent, at=self.first)
        return a, b

    def recover(self, store: Store) -> None:
        ss = SessionStore(store)
        assert ss.get(self.parent).head == self.head, "the parent's history moved"
        again = ss.fork(self.parent)
        assert again.head == self.head
        for info in ss.list():
            if info.meta.get("parentId") == self.parent:
                ss.history(info.head)  # every fork's history reads back

    def verify(self, store: Store) -> None:
        forks = [i for i in SessionStore(store).list() if i.meta.get("parentId") == self.parent]
        assert any(i.head == self.head for i in forks), "no fork at the parent's head"


class _Interrupted(BaseException):
    """Stops a run in the middle (as a kill would, but in this process)."""


class ForkAfterDeathWorkload(ForkWorkload):
    """A writer of the parent dies between its step's append and the append's fsync; then the parent
    is forked at its head, which that record holds (``objects_spec.md`` §9.3 rule 12).

    The dead writer's record is committed (visible: its checksum is good)
    but not durable; the fork names a message only that record holds, so
    the fork must make the parent's log durable (``StepLogs.make_durable``)
    before its own record commits, or a power loss keeps the fork and
    loses what its head names.
    """

    name = "fork-after-death"

    def run(self, store: Store) -> Any:
        io = store.io
        group = SessionStore(store).group(self.parent)
        log = os.path.abspath(store.refs.steps_path(group))
        outer = io.hook  # a fault driver's (FaultThenRetry, fault_points): it sees every operation still
        last: list[tuple[str, str]] = [("", "")]

        def die_before_the_fsync(op: str, path: str) -> None:
            if outer is not None:
                outer(op, path)
            if op == "fsync" and last[0] == ("append", log) and os.path.abspath(path) == log:
                raise _Interrupted()
            last[0] = (op, os.path.abspath(path))

        # The dying writer is another process: a store instance of its own.
        dying = open_store(store.root, io=io)
        if self.recorder is not None:
            self.recorder.attach(dying)
        io.hook = die_before_the_fsync
        try:
            with dying.step(group) as step:
                head = SessionStore(step).append_messages(
                    self.head, [{"role": "user", "content": "a question nobody answered"}])
                step.update("head", self.head, head)
                step.commit("message: user")
            raise AssertionError("the parent's writer did not die")
        except _Interrupted:
            pass
        finally:
            io.hook = outer
        return super().run(store)

    def recover(self, store: Store) -> None:
        ss = SessionStore(store)
        info = ss.get(self.parent)
        ss.history(info.head)  # the dead writer's step is there or not: either way the history reads
        again = ss.fork(self.parent)
        assert again.head == info.head
        for f in ss.list():
            if f.meta.get("parentId") == self.parent:
                ss.history(f.head)  # every fork's history reads back: nothing it names was lost

    def verify(self, store: Store) -> None:
        ss = SessionStore(store)
        head = ss.get(self.parent).head
        forks = [i for i in ss.list() if i.meta.get("parentId") == self.parent]
        assert any(i.head == head for i in forks), "no fork at the parent's head"
        for f in forks:
            ss.history(f.head)


class LooseWorkload(Workload):
    """Objects put outside any step (a library caller's "objects first, refs
    last", §9.3 rule 1): written loose, one alone and three in a batch, then named by ref
    transactions of a namespace outside the skeleton, in a group that has a step log already
    (found, not made) and in a new one."""

    name = "loose"
    GROUPS = ("lib/found", "lib/new")

    def setup(self, top: str, aux: str) -> None:
        from kxen_agent.store import RefUpdate

        store = open_store(os.path.join(top, "state"), io=FastIO())
        self.first = store.put("blob", b"found group's first object")
        store.refs.transaction("lib/found", [RefUpdate("first", None, self.first)], reason="setup")
        self.want = {"lib/found": {"first": self.first}, "lib/new": {}}

    def _write(self, store: Store) -> None:
        from kxen_agent.store import ANY, RefUpdate

        one = store.put("blob", b"a loose object, alone")
        with store.batch():
            batch = [store.put("blob", b"a loose object in a batch, #%d" % i) for i in range(3)]
        store.refs.transaction("lib/found", [RefUpdate("one", ANY, one), RefUpdate("batch", ANY, batch[1])],
                               reason="loose objects, named")
        store.refs.transaction("lib/new", [RefUpdate("batch", ANY, batch[2]), RefUpdate("first", ANY, batch[0])],
                               reason="loose objects, named")
        self.want = {"lib/found": {"first": self.first, "one": one, "batch": batch[1]},
                     "lib/new": {"batch": batch[2], "first": batch[0]}}

    def run(self, store: Store) -> Any:
        self._write(store)

    def recover(self, store: Store) -> None:
        for g in self.GROUPS:
            for oid in store.refs.read(g).refs.values():
                store.read_raw(oid)  # MissingObject if a ref outlived its object
        self._write(store)
        self.verify(store)

    def retry(self, store: Store) -> None:
        self._write(store)

    def verify(self, store: Store) -> None:
        for g in self.GROUPS:
            refs = dict(store.refs.read(g).refs)
            assert refs == self.want[g], f"{g}: {refs}"
            for oid in refs.values():
                store.read_raw(oid)


class UpgradeWorkload(Workload):
    """A format-3 state dir whose group has a step log of version 1 (objects_spec.md §6.8.1), with a
    torn tail after its three records: the first write replaces FORMAT with 4, then the log by a
    version-2 log holding the three records re-framed and the new one (a durable replace), and the
    second write appends to it. The version-1 records must never be lost, whatever the crash."""

    name = "upgrade"
    G = "lib/old"

    def setup(self, top: str, aux: str) -> None:
        from kxen_agent.store.objects import compress_loose, encode_object
        from kxen_agent.store.steps import StepTx, TxUpdate, encode_header, encode_record_v1

        root = os.path.join(top, "state")
        store = open_store(root, io=FastIO())
        store.ensure_initialized()
        objs = [encode_object("blob", b"a version-1 record's object, #%d" % i) for i in range(3)]
        data, old = encode_header(self.G, 0, version=1), None
        for i, o in enumerate(objs):
            data += encode_record_v1(StepTx(1_700_000_000_000_000_000 + i, f"version 1, #{i}", i, i + 1, "leave",
                                            (TxUpdate("head", old, o.id),)), [(o.id, compress_loose(o.raw))])
            old = o.id
        data += encode_record_v1(StepTx(1_700_000_000_000_000_009, "torn", 3, None, "leave", ()), [])[:30]
        path = store.refs.steps_path(self.G)
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(data)
        with open(os.path.join(root, "FORMAT"), "wb") as f:
            f.write(b"kxen-agent-state 3\n")
        self.old = [o.id for o in objs]
        self.want = {"head": self.old[-1]}

    def _write(self, store: Store) -> None:
        from kxen_agent.store import ANY

        with store.step(self.G) as step:
            new = step.put("blob", b"the write that upgrades the log")
            step.update("head", ANY, new)
            step.commit("upgrade")
        fence = store.refs.read(self.G).fence + 1
        with store.step(self.G) as step:
            more = step.put("blob", b"an append to version 2")
            step.update("more", ANY, more)
            step.new_fence(fence)
            step.commit("append")
        self.want = {"head": new, "more": more}

    def run(self, store: Store) -> Any:
        self._write(store)

    def recover(self, store: Store) -> None:
        st = store.refs.read(self.G)
        assert st.fence >= 3, f"{self.G}: fence {st.fence}, the version-1 records raised it to 3"
        for oid in [*self.old, *st.refs.values()]:
            store.read_raw(oid)  # MissingObject if a version-1 record was lost
        self._write(store)
        self.verify(store)

    def verify(self, store: Store) -> None:
        from kxen_agent.store.steps import read_header

        st = store.refs.read(self.G)
        assert dict(st.refs) == self.want and st.fence >= 4, f"{self.G}: {st.refs}, fence {st.fence}"
        for oid in self.old:
            store.read_raw(oid)
        with open(store.refs.steps_path(self.G), "rb") as f:
            assert read_header(f.read(), self.G)[0] == 2
        with open(os.path.join(store.root, "FORMAT"), "rb") as f:
            assert f.read() == b"kxen-agent-state 4\n"


class ResumeWorkload(Workload):
    """Resolve an UNKNOWN operation by hand, then resume the run to its end.

    The pre-state is a run interrupted right after its shell command took
    effect (``Started`` durable, no outcome), resumed once: the operation is
    ``OutcomeUnknown`` and the run waits in ``input_required``.
    """

    name = "resume"

    def setup(self, top: str, aux: str) -> None:
        ws = os.path.join(aux, "ws")
        os.makedirs(ws, exist_ok=True)
        effects = os.path.join(ws, "effects.txt")
        io = FastIO()

        def stop_after_the_effect(op: str, path: str) -> None:
            if os.path.exists(effects):
                raise _Interrupted()

        io.hook = stop_after_the_effect
        store = open_store(os.path.join(top, "state"), io=io)
        try:
            Runner(store).start(ws, TASK, agent())
            raise AssertionError("the run was not interrupted")
        except _Interrupted:
            pass
        io.hook = None
        [info] = SessionStore(store).list()
        self.ses = info.id
        res = Runner(open_store(store.root, io=FastIO())).resume(self.ses)
        assert res.status == "input_required" and len(res.unknown_ops) == 1, res
        self.run_id, self.op = res.run, res.unknown_ops[0]

    def run(self, store: Store) -> Any:
        r = Runner(store)
        r.resolve(self.ses, self.run_id, self.op, "checked by hand: effects.txt shows the command ran")
        res = r.resume(self.ses)
        if res.status != "completed":
            raise AssertionError(f"the resumed run ended {res.status}: {res.error}")
        return res

    def recover(self, store: Store) -> None:
        settle(store, self.ses)

    def verify(self, store: Store) -> None:
        info = SessionStore(store).get(self.ses)
        latest = Runner(store).latest_run(info)
        assert latest is not None and latest[2]["status"] == "completed" and latest[2]["settled"]


class ImportWorkload(Workload):
    """Import a bundle that fast-forwards a session imported earlier (new pack, ref updates);
    with ``fresh``, into a state dir that does not exist yet."""

    name = "import"

    def __init__(self, fresh: bool = False) -> None:
        self.fresh = fresh
        if fresh:
            self.name = "import-fresh"

    def setup(self, top: str, aux: str) -> None:
        from kxen_agent.store.bundle import export_bundle, import_bundle, verify_bundle

        ws = os.path.join(aux, "ws")
        os.makedirs(ws, exist_ok=True)
        src = open_store(os.path.join(aux, "src"), io=FastIO())
        ses = _completed_session(src, ws)
        group = f"sessions/{ses}"
        old = os.path.join(aux, "old.kxb")
        export_bundle(src, [group], old)
        res = Runner(src).resume(ses, task="a second task")
        assert res.status == "completed", res
        self.bundle = os.path.join(aux, "new.kxb")
        export_bundle(src, [group], self.bundle)
        self.refs = {g: dict(r) for g, r in verify_bundle(self.bundle).refs.items()}
        if not self.fresh:
            import_bundle(open_store(os.path.join(top, "state"), io=FastIO()), old)

    def run(self, store: Store) -> Any:
        from kxen_agent.store.bundle import import_bundle

        return import_bundle(store, self.bundle)

    def recover(self, store: Store) -> None:
        self.run(store)
        self.verify(store)

    def verify(self, store: Store) -> None:
        for g, refs in self.refs.items():
            assert dict(store.refs.read(g).refs) == refs, f"group {g} is not the bundle's after the import"


class GcWorkload(Workload):
    """gc with no grace period over an older pack, step logs with records, a deleted fork (folded into
    its ref file) and dangling objects; it packs even where the pack is not smaller (``always_pack``):
    a handful of objects would otherwise stay in their step logs, and the pack, fold and removal
    paths unexercised."""

    name = "gc"
    allow_pruned_objects = True

    def setup(self, top: str, aux: str) -> None:
        from kxen_agent.store.gc import gc

        ws = os.path.join(aux, "ws")
        os.makedirs(ws, exist_ok=True)
        store = open_store(os.path.join(top, "state"), io=FastIO())
        self.live = _completed_session(store, ws)
        ss = SessionStore(store)
        fork = ss.fork(self.live).id
        res = Runner(store).resume(fork, task="work in the fork")
        assert res.status == "completed", res
        ss.delete(fork)
        self.deleted = fork
        for i in range(3):
            store.put("blob", b"dangling %d" % i)
        # An older pack for this gc to replace, and the step logs folded into ref files: a handful of
        # objects packs no smaller than it stands in step logs, which gc alone would leave as they are.
        gc(store, prune="never", always_pack=True)
        res = Runner(store).resume(self.live, task="more work after the first gc")
        assert res.status == "completed", res
        self.head = ss.get(self.live).head

    def run(self, store: Store) -> Any:
        from kxen_agent.store.gc import gc

        return gc(store, prune="now", now=time.time() + 60, always_pack=True)

    def recover(self, store: Store) -> None:
        self.run(store)
        self.verify(store)

    def verify(self, store: Store) -> None:
        ss = SessionStore(store)
        info = ss.get(self.live)
        assert info.head == self.head, "gc moved a live ref"
        ss.history(info.head)
        assert not store.refs.read(f"sessions/{self.deleted}").exists, "the expired deleted group is still there"


class AutoPackWorkload(Workload):
    """An automatic packing pass (``objects_spec.md`` §12.11a) over a session's loose objects and dangling
    ones, young and past gc's grace period: every object stays readable, whatever the crash."""

    name = "autopack"

    def setup(self, top: str, aux: str) -> None:
        ws = os.path.join(aux, "ws")
        os.makedirs(ws, exist_ok=True)
        store = open_store(os.path.join(top, "state"), io=FastIO())
        self.live = _completed_session(store, ws)
        young = store.put("blob", b"dangling, young")
        old = store.put("blob", b"dangling, past the grace period")
        past = time.time() - 30 * 86400
        os.utime(store.loose.path(old), (past, past))
        self.head = SessionStore(store).get(self.live).head
        self.before = set(store.loose.iter_ids())
        assert {young, old} <= self.before

    def run(self, store: Store) -> Any:
        from kxen_agent.store.autopack import AutoPacker

        return AutoPacker(store, 1, background=False).pack_now()

    def recover(self, store: Store) -> None:
        self.verify(store)  # nothing is lost at any crash point, before the pass is run again
        self.run(store)
        self.verify(store)
        assert not list(store.loose.iter_ids()), "a second pass leaves loose objects"

    def verify(self, store: Store) -> None:
        ss = SessionStore(store)
        info = ss.get(self.live)
        assert info.head == self.head, "packing moved a ref"
        ss.history(info.head)
        for oid in self.before:
            store.read_raw(oid)  # MissingObject if the pass lost it


_NORMALIZE = [
    (re.compile(r"(?<=objects/)[0-9a-f]{2}(?=/|$)"), "XX"),  # fan-out dirs
    (re.compile(r"(?<=objects/XX/)[0-9a-f]{62}"), "ID"),
    (re.compile(r"ses_[0-9a-f]+"), "ses_*"),
    (re.compile(r"tmp_[0-9a-z_]*[0-9a-f]{16}"), "tmp_*"),
    (re.compile(r"pack-[0-9a-f]{64}"), "pack-*"),
]


def op_key(op: str, prev: str | None, path: str) -> tuple[str, str | None, str]:
    """An operation as the code that issues it sees it: random ids and hex names normalised.

    Object and session ids are random, so "operation number N" is a
    different operation from one run to the next; (kind, the kind before,
    normalised path) and its occurrence number name the same one.
    """
    for rx, repl in _NORMALIZE:
        path = rx.sub(repl, path)
    return op, prev, path


class FaultThenRetry(Workload):
    """``inner`` fails once at the ``nth`` operation matching ``key`` (:func:`op_key`), then a new
    store retries the job with a good disk.

    Explored as one trace: the retry may not assume a barrier that failed
    (a directory whose creation was not made durable, an object or a ref
    written before the error), so a power loss after the retry must still
    find everything the retry acknowledged.
    """

    def __init__(self, inner: Workload, key: tuple[str, str | None, str], nth: int = 1,
                 err: int = errno.EIO) -> None:
        self.inner = inner
        self.key = key
        self.nth = nth
        self.err = err
        kind, _prev, path = key
        self.name = f"{inner.name}+{errno.errorcode[err]}@{kind}:{path}#{nth}"
        self.allow_pruned_objects = inner.allow_pruned_objects
        self.fired = False
        #: Operations of the trace completed when the fault fired: the crash points up to here are those
        #: of a clean run of ``inner`` (what tests/reliability/test_power_loss.py explores).
        self.fault_at = 0

    def setup(self, top: str, aux: str) -> None:
        self.inner.setup(top, aux)

    def run(self, store: Store) -> Any:
        io = store.io
        top = os.path.dirname(store.root)
        seen = 0
        prev: list[str | None] = [None]

        def fail_once(op: str, path: str) -> None:
            nonlocal seen
            key = op_key(op, prev[0], os.path.relpath(path, top))
            prev[0] = op
            if not self.fired and key == self.key:
                seen += 1
                if seen == self.nth:
                    self.fired = True
                    self.fault_at = len(getattr(io, "trace", ()))
                    raise OSError(self.err, os.strerror(self.err), path)

        io.hook = fail_once
        try:
            self.inner.run(store)
        except (OSError, KxenError):
            pass
        finally:
            io.hook = None
        retry = open_store(store.root, io=io)  # a new process, the same disk
        if self.recorder is not None:
            self.recorder.attach(retry)
        self.inner.retry(retry)
        self.inner.verify(retry)

    def recover(self, store: Store) -> None:
        self.inner.recover(store)


def fault_points(workload: Workload, kinds: tuple[str, ...] = MUTATING_OPS) -> list[tuple[tuple[str, str | None, str], int]]:
    """Every operation of one clean run of ``workload`` whose kind is in ``kinds``, as (key, nth)."""
    base = tempfile.mkdtemp(prefix=f"points-{workload.name}-", dir=scratch_dir())
    try:
        top, aux = os.path.join(base, "top"), os.path.join(base, "aux")
        os.mkdir(top)
        os.mkdir(aux)
        with quiet_lease():
            workload.setup(top, aux)
            keys: list[tuple[str, str | None, str]] = []
            prev: list[str | None] = [None]

            def note(op: str, path: str) -> None:
                keys.append(op_key(op, prev[0], os.path.relpath(path, top)))
                prev[0] = op

            io = FaultyIO(None, sync=False)
            io.hook = note
            workload.run(open_store(os.path.join(top, "state"), io=io))
        counts: dict[tuple, int] = {}
        out = []
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
            if key[0] in kinds:
                out.append((key, counts[key]))
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def barrier_faults(workload: Workload) -> list[tuple[tuple[str, str | None, str], int]]:
    """The directory fsyncs right after a mkdir: where a failed barrier leaves a name that nothing
    syncs again by itself (``makedirs`` leaves an existing directory alone, §9.1) unless the code
    using the directory re-syncs it."""
    return [(k, n) for k, n in fault_points(workload, ("fsync_dir",)) if k[1] == "mkdir"]


def all_workloads() -> list[Workload]:
    return [RunWorkload(), ResumeWorkload(), ForkWorkload(), ForkAfterDeathWorkload(), ImportWorkload(),
            ImportWorkload(fresh=True), GcWorkload(), AutoPackWorkload(), LooseWorkload()]


def crash_workloads() -> list[Workload]:
    """The power-loss suite's workloads: :func:`all_workloads` and the version-1 log's upgrade. The
    upgrade is left out of the I/O-error suite's list: its 1,176 trials took 4 min, too long for the
    normal suite (RELIABILITY.md gives their figures, 0 failures)."""
    return [*all_workloads(), UpgradeWorkload()]


# ================================================================== I/O errors

#: (errno, persistent) pairs: a full disk that stays full, a transient one, a dying one.
VARIANTS = ((errno.ENOSPC, False), (errno.ENOSPC, True), (errno.EIO, False), (errno.EIO, True))


@dataclass
class FaultReport:
    workload: str
    total_ops: int = 0
    points: int = 0  # the N failed (all of total_ops unless sampled)
    distinct: int = 0  # distinct operations (op_key) among them, when ``first`` chose them
    trials: int = 0
    faults: int = 0  # OSErrors actually raised by the faulty disk
    raised: dict[str, int] = field(default_factory=dict)  # what the library call raised, by type
    absorbed: int = 0  # a fault fired but the call still succeeded (a best-effort step failed)
    unfired: int = 0  # the run took fewer operations this time (random ids: other fan-out dirs)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def merge(self, other: "FaultReport") -> None:
        self.trials += other.trials
        self.faults += other.faults
        self.absorbed += other.absorbed
        self.unfired += other.unfired
        for k, v in other.raised.items():
            self.raised[k] = self.raised.get(k, 0) + v
        self.failures += other.failures

    def line(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.raised.items()))
        return (f"{self.workload}: {self.total_ops} ops, {self.trials} trials, {self.faults} faults injected, "
                f"raised: {kinds}; absorbed {self.absorbed}, not reached {self.unfired}; {len(self.failures)} failures, {self.seconds:.1f}s")


#: The variants for failing reads: a read error once (a bad sector read again fine), and a disk that keeps failing.
READ_VARIANTS = ((errno.EIO, False), (errno.EIO, True))


def inject_faults(workload: Workload, *, rotate: bool = False, scratch: str | None = None,
                  jobs: int | None = None, reads: bool = False, sample: int | None = None,
                  seed: int = 0, first: int | None = None) -> FaultReport:
    """Fail operation N, for N = 1 .. the workload's total, with each of :data:`VARIANTS`.

    ``rotate``: one variant per N, taken in turn (N = 1 ENOSPC once, N = 2
    ENOSPC persistent, ...), so every operation fails once and every
    variant is tried at a quarter of the operations: the normal suite's
    budget for long workloads. ``jobs``: trials run in that many forked
    processes (default: up to 2, the CPUs there are); each trial has its
    own copy of the pre-state, so they are independent.

    ``reads``: fail read and metadata operations instead (``read``,
    ``stat``, ``listdir``...: :data:`~kxen_agent.store.fsio.READ_OPS`,
    numbered by ``FileIO.read_count``), with :data:`READ_VARIANTS`.
    ``sample``: fail only that many of the N, drawn with ``seed`` (for a
    workload with too many operations to fail each in the time there is).
    ``first`` (writes only): fail the first ``first`` occurrences of every
    distinct operation (:func:`op_key`: kind, kind before, normalised path)
    and ``sample`` of the others (a run repeats the same few dozen
    operations step after step; each of them still fails).

    After each trial: the call raised a one-line :class:`KxenError` or the
    injected ``OSError`` (anything else is a failure); with a good disk
    again the store opens and fsck is clean; the workload's retry finishes
    the job (for reads: on the same store, its disk healed, as a
    long-running process goes on after a transient read error); fsck is
    still clean.
    """
    global _POOL_CTX
    rep = FaultReport(workload.name + (" (reads)" if reads else ""))
    t0 = time.monotonic()
    base = tempfile.mkdtemp(prefix=f"iofault-{workload.name}-", dir=scratch or scratch_dir())
    try:
        top0, aux = os.path.join(base, "top0"), os.path.join(base, "aux")
        os.mkdir(top0)
        os.mkdir(aux)
        with quiet_lease():
            workload.setup(top0, aux)
            count_dir = os.path.join(base, "count")
            shutil.copytree(top0, count_dir, symlinks=True)
            io = FaultyIO(None, sync=False, reads=reads)
            keys: list[tuple[str, str | None, str]] = []
            if first is not None:
                if reads:
                    raise ValueError("first= chooses among write operations")
                prev: list[str | None] = [None]

                def note(op: str, path: str) -> None:
                    keys.append(op_key(op, prev[0], os.path.relpath(path, count_dir)))
                    prev[0] = op

                io.hook = note
            workload.run(open_store(os.path.join(count_dir, "state"), io=io))
            rep.total_ops = io.read_count if reads else io.op_count
            variants = READ_VARIANTS if reads else VARIANTS
            points = list(range(1, rep.total_ops + 1))
            if first is not None:
                assert len(keys) == rep.total_ops, (len(keys), rep.total_ops)
                seen: dict[tuple, int] = {}
                chosen, others = [], []
                for n, key in zip(points, keys):
                    seen[key] = seen.get(key, 0) + 1
                    (chosen if seen[key] <= first else others).append(n)
                rep.distinct = len(seen)
                if sample is not None and sample < len(others):
                    others = random.Random(seed).sample(others, sample)
                points = sorted(chosen + others)
            elif sample is not None and sample < len(points):
                points = sorted(random.Random(seed).sample(points, sample))
            rep.points = len(points)
            plan = [(n, err, persistent, reads) for i, n in enumerate(points)
                    for err, persistent in ((variants[i % len(variants)],) if rotate else variants)]
            jobs = min(2, os.cpu_count() or 1) if jobs is None else jobs
            _POOL_CTX = (workload, base, top0)
            try:
                if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
                    chunks = [list(enumerate(plan))[i::jobs] for i in range(jobs)]
                    with multiprocessing.get_context("fork").Pool(jobs) as pool:
                        parts = pool.map(_run_trials, chunks)
                else:
                    parts = [_run_trials(list(enumerate(plan)))]
            finally:
                _POOL_CTX = None
            for part in parts:
                rep.merge(part)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rep.seconds = time.monotonic() - t0
    return rep


_POOL_CTX: tuple[Workload, str, str] | None = None


def _run_trials(trials: list[tuple[int, tuple[int, int, bool, bool]]]) -> FaultReport:
    assert _POOL_CTX is not None
    workload, base, top0 = _POOL_CTX
    rep = FaultReport(workload.name)
    with quiet_lease():
        for i, (n, err, persistent, reads) in trials:
            d = os.path.join(base, f"t{i}")
            shutil.copytree(top0, d, symlinks=True)
            try:
                _one_trial(workload, rep, os.path.join(d, "state"), n, err, persistent, reads)
            finally:
                shutil.rmtree(d, ignore_errors=True)
    return rep


def _one_trial(workload: Workload, rep: FaultReport, root: str, n: int, err: int, persistent: bool,
               reads: bool = False) -> None:
    what = f"{'read ' if reads else ''}op {n} {errno.errorcode[err]} {'persistent' if persistent else 'once'}"
    rep.trials += 1
    io = FaultyIO(n, err, persistent=persistent, sync=False, reads=reads)
    store: Store | None = None
    try:
        store = open_store(root, io=io)
        workload.run(store)
        if io.faults:
            rep.absorbed += 1
        else:
            rep.unfired += 1
    except KxenError as e:
        rep.raised[type(e).__name__] = rep.raised.get(type(e).__name__, 0) + 1
        if "\n" in str(e):
            rep.failures.append(f"{what}: {type(e).__name__} message is not one line: {e!r}")
    except OSError as e:
        rep.raised["OSError"] = rep.raised.get("OSError", 0) + 1
        if e.errno != err:
            rep.failures.append(f"{what}: OSError with errno {e.errno}, not the injected {err}: {e}")
    except Exception as e:  # noqa: BLE001 - anything else is what we are looking for
        rep.failures.append(f"{what}: unexpected {type(e).__name__}: {e}")
    rep.faults += io.faults
    try:
        rep1 = fsck(open_store(root, io=FastIO()))
        if rep1.problems:
            rep.failures.append(f"{what}: fsck after the error: {[p.line() for p in rep1.problems][:3]}")
            return
        if reads:
            # The disk reads again; the same store goes on (its caches must
            # not hold what the failed read made it believe).
            io.heal()
            if store is None:  # the store did not even open: a new one, over the same disk
                store = open_store(root, io=io)
        else:
            store = open_store(root, io=FastIO())  # space returns: a new process, a good disk
        workload.retry(store)
        workload.verify(store)
        rep2 = fsck(open_store(root, io=FastIO()))
        if rep2.problems:
            rep.failures.append(f"{what}: fsck after the retry: {[p.line() for p in rep2.problems][:3]}")
    except Exception as e:  # noqa: BLE001
        rep.failures.append(f"{what}: retry with a good disk failed: {type(e).__name__}: {e}")
