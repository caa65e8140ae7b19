"""Crash simulation: every state a power loss could leave, from a FileIO trace.

The method is ALICE's and CrashMonkey's. A workload runs once against a
store whose :class:`~kxen_agent.store.fsio.TracingIO` records every
mutating file operation with its bytes. The trace is compiled against an
in-memory model of the disk (inodes, directory entries, file contents)
taken from the pre-workload snapshot, and each operation is tagged with the
*barrier* that made it durable:

- file data (``write``, ``append``, ``truncate``) is durable once its inode
  is fsynced;
- a directory entry change (``create``, ``mkdir``, ``rename``, ``unlink``,
  the creation an ``append`` does) is durable once its directory is
  fsynced (both directories for a cross-directory rename). An fsync of a
  file does *not* make its name durable, nor does an fsync of a directory
  make the directory's own name durable: the pessimistic POSIX reading
  that ``objects_spec.md`` §9 is written against.

A *crash state* at crash point ``k`` (operations ``0..k-1`` completed) is
the snapshot plus every operation durable before ``k`` plus a subset of the
pending ones, chosen by a *policy*:

``kill``   every completed operation survives (what a process kill leaves:
           the page cache survives);
``sync``   only what was made durable survives: every unsynced byte and
           every unsynced directory entry change is lost;
``meta``   every directory entry change survives but unsynced data is lost
           (a rename persisted before the renamed file's data: an empty or
           torn file under the new name);
``data``   unsynced data survives, unsynced entry changes are lost;
``subset`` every combination of the above at once, when there are few
           enough: each pending entry change kept or not, each file keeping
           each prefix of its pending writes (ALICE's exhaustive mode);
``random`` where there are too many combinations, seeded random subsets of
           the same kind, the last kept write possibly torn at a random byte.

Each state is materialised into a fresh directory and checked
(:class:`Checker`): the store opens, ``fsck`` is clean (dangling objects and
stray temp files are information, not problems), every ref group is one of
its committed states — never a mixture — and not older than the newest
state whose transaction had *returned* before the crash point, every object
whose write had returned (or whose batch had ended) is present, and the
workload's own recovery (resume a run, import again, gc again...) succeeds
and leaves fsck clean. Identical states are checked once (the expensive
part is cached by content fingerprint; the cheap acknowledgement check is
made for every crash point).

The model is also a self-check of the seam: replaying the whole trace must
reproduce the real directory byte for byte (lock files aside, which the
store never fsyncs and which carry nothing). A write that bypassed
``store.io`` would make that comparison fail.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from kxen_agent.session.sessions import NS
from kxen_agent.store import OS_IO, FileIO, Store, fsck
from kxen_agent.store.fsio import TracingIO
from kxen_agent.store.refs import TEMP_PREFIX

__all__ = [
    "Checker",
    "CrashReport",
    "FS",
    "FastIO",
    "POLICIES",
    "Prepared",
    "Recorder",
    "Trace",
    "TraceError",
    "Workload",
    "explore",
    "long_mode",
    "open_store",
]


#: The policies, in the order :func:`explore` tries them at each crash point.
POLICIES = ("sync", "kill", "meta", "data", "random")


def scratch_dir() -> str | None:
    """Where crash states are materialised: ``KXEN_RELIABILITY_TMP``, else ``/dev/shm`` if usable.

    Hundreds of small directory trees are made and removed per workload; on
    a journaling disk each ``mkdir``/``rmdir`` costs about a millisecond, on
    tmpfs microseconds. Durability is modelled, never taken from the disk,
    so the file system under the scratch dir does not change any verdict.
    """
    env = os.environ.get("KXEN_RELIABILITY_TMP")
    if env:
        return env
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def long_mode() -> bool:
    """``KXEN_RELIABILITY_LONG=1``: explore every policy at every crash point, recover every state."""
    return os.environ.get("KXEN_RELIABILITY_LONG", "") not in ("", "0")


#: The namespaces the CLI opens its stores with: the suites torture a state dir as the CLI makes it.
CLI_NAMESPACES = (NS,)


def open_store(root: str, io: FileIO = OS_IO) -> Store:
    """The store of ``root`` as the CLI opens it (``Store.open(namespaces=(NS,))``), through ``io``."""
    return Store(root, io=io, namespaces=CLI_NAMESPACES)


class FastIO(FileIO):
    """Real files, no fsync system calls: for setting up and checking states, where durability is not under test."""

    def _fsync_fd(self, fd: int) -> None:
        self.fsyncs += 1


# TraceError, the disk model (FS) and the compiled trace (Trace) live in .diskmodel.
from .diskmodel import FS, INF, Trace, TraceError, _is_lock_file  # noqa: E402,F401


# ================================================================== what the workload was told


def group_key(state: Any) -> tuple | None:
    """What "old or new" compares: refs, fence and deleted marker (None: no group)."""
    if not state.exists:
        return None
    return (tuple(sorted(state.refs.items())), state.fence, state.deleted_ns)


@dataclass(frozen=True)
class Commit:
    """A committed state of one group: visible for crash points > ``commit``, required from ``ack`` on."""

    group: str
    state: tuple | None
    commit: int
    ack: float  # INF: the transaction raised, the workload was never told


class Recorder:
    """Wraps a store's writes to learn what the workload was told was durable.

    Steps (``Store.step``; a ref transaction is one): the state each
    committed (returned, or read back from the store if it failed after its
    commit point), the index of its commit point (the append of its
    step-log record, or the rename of a new log), and the index at which
    its commit returned (never, if it raised); its objects are acknowledged
    with it (§6.8). Object writes outside a step (``Store.put``): loose,
    acknowledged at the index at which the put returned, or at which its
    outermost batch ended. :meth:`attach` wraps more store instances (a
    retry opens a new one, as a new process would).
    """

    def __init__(self, store: Store, io: TracingIO) -> None:
        self.store = store
        self.io = io
        self.commits: list[Commit] = []
        self.objects: list[tuple[bytes, float]] = []
        self.problems: list[str] = []
        self._batch_depth = 0
        self._batched: list[bytes] = []
        self.attach(store)

    def attach(self, store: Store) -> None:
        io = self.io
        step = store.step
        put_raw = store.put_raw
        batch = store.batch

        def stepped(group: str, **kw: Any) -> Any:
            # Every commit is a step's (a ref transaction is one step): the commit is noted here.
            s = step(group, **kw)
            commit = s.commit

            def committed(reason: str) -> Any:
                start = io.mark()
                st = None
                taken = list(s.objects)  # what the record carries: the step's objects
                try:
                    st = commit(reason)
                    return st
                finally:
                    end = io.mark()
                    self._note_commit(store, group, start, end, st)
                    if st is not None:  # committed with the record, acknowledged with the commit
                        self.objects.extend((oid, end) for oid in taken)

            s.commit = committed
            return s

        def put(obj: Any) -> bool:
            out = put_raw(obj)
            if self._batch_depth:
                self._batched.append(obj.id)
            else:
                self.objects.append((obj.id, io.mark()))
            return out

        @contextmanager
        def batched() -> Iterator[None]:
            self._batch_depth += 1
            try:
                with batch():
                    yield
            except BaseException:
                if self._batch_depth == 1:
                    self._batched.clear()  # a failed batch acknowledges nothing
                raise
            finally:
                self._batch_depth -= 1
            if self._batch_depth == 0:
                end = io.mark()
                self.objects.extend((oid, end) for oid in self._batched)
                self._batched.clear()

        store.step = stepped  # type: ignore[method-assign]
        store.put_raw = put  # type: ignore[method-assign]
        store.batch = batched  # type: ignore[method-assign]

    def _note_commit(self, store: Store, group: str, start: int, end: int, st: Any) -> None:
        # A transaction's commit point is its step-log record reaching the
        # log (§6.8): the append to the group's log, or the rename that puts
        # a new log (header and first record) in place.
        trace = self.io.trace
        steps_path = os.path.abspath(store.refs.steps_path(group))
        commit = next((i for i in range(end - 1, start - 1, -1)
                       if (trace[i].kind == "append" and os.path.abspath(trace[i].path) == steps_path)
                       or (trace[i].kind == "rename" and trace[i].dst is not None
                           and os.path.abspath(trace[i].dst) == steps_path)), None)
        if commit is None:
            if st is not None:  # it returned, but its commit point is not in the trace
                self.problems.append(f"transaction on {group} returned with no traced append to {steps_path} "
                                     "(bypassed store.io?)")
                self.commits.append(Commit(group, group_key(st), start, end))
            return  # failed before its commit point: it never happened
        if st is not None:
            key = group_key(st)
        else:  # failed after its append (its fsync): the new state may be visible, never acknowledged
            key = group_key(Store(store.root, namespaces=store.namespaces).refs.read(group))
        self.commits.append(Commit(group, key, commit, end if st is not None else INF))

    def removals(self, trace: Trace, end: int) -> None:
        """Ref files the workload unlinked (gc removing a group): committed there, acknowledged at the end."""
        # The first of a group's ref file and step log to go (§6.7): whichever
        # could read as the group alone goes last, so from the first unlink on
        # the group may read as gone.
        root = os.path.abspath(self.store.root)
        tops = {os.path.join(root, "refs"), os.path.join(root, "steps")}
        seen: set[str] = set()
        for i, op in enumerate(trace.ops):
            if (op.kind == "unlink" and os.path.dirname(os.path.dirname(os.path.abspath(op.path))) in tops
                    and not os.path.basename(op.path).startswith(TEMP_PREFIX)):  # a temp file is no group
                ns, gid = os.path.abspath(op.path).split(os.sep)[-2:]
                if f"{ns}/{gid}" not in seen:
                    seen.add(f"{ns}/{gid}")
                    self.commits.append(Commit(f"{ns}/{gid}", None, i, end))


# ================================================================== workloads


class Workload:
    """One operation under test, with its pre-state and what "recovering" means for it."""

    name = "workload"
    #: Objects whose write returned may be gone (gc prunes).
    allow_pruned_objects = False
    #: Set by :func:`explore` before :meth:`run`: to wrap store instances the run opens itself.
    recorder: "Recorder | None" = None

    def setup(self, top: str, aux: str) -> None:
        """Build the pre-workload state dir at ``top/state`` (``aux``: files outside it)."""

    def run(self, store: Store) -> Any:
        """The traced operation (every workload defines it)."""
        raise TypeError(f"workload {type(self).__name__} defines no run()")

    def recover(self, store: Store) -> None:
        """After a crash: what a user does next must work (raise if it does not)."""

    def retry(self, store: Store) -> None:
        """After an I/O error, the disk good again: finish the job (raise if it cannot)."""
        self.recover(store)

    def verify(self, store: Store) -> None:
        """After :meth:`retry`: the job is done."""


# ================================================================== checking a state


@dataclass
class CrashReport:
    workload: str
    ops: int = 0
    crash_points: int = 0
    skipped: int = 0  # crash points inside a run of sibling mkdirs, not explored (normal suite only)
    states: int = 0  # (crash point, policy) pairs checked
    distinct: int = 0  # distinct disk states (content fingerprints)
    recovered: int = 0  # distinct states on which recovery ran
    by_policy: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        pol = ", ".join(f"{p} {n}" for p, n in self.by_policy.items())
        return (f"{self.workload}: {self.ops} ops, {self.crash_points} crash points "
                f"({self.skipped} inside sibling mkdirs skipped), {self.states} states "
                f"({pol}), {self.distinct} distinct, {self.recovered} recovered, "
                f"{len(self.failures)} failures, {self.seconds:.1f}s")


@dataclass
class _Verdict:
    problems: list[str]
    groups: dict[str, tuple | None]
    objects: set[bytes] | None


class Checker:
    """Checks crash states of one traced workload run."""

    def __init__(self, workload: Workload, trace: Trace, rec: Recorder, init_groups: dict[str, tuple | None],
                 scratch: str) -> None:
        self.w = workload
        self.trace = trace
        self.rec = rec
        self.init = init_groups
        self.scratch = scratch
        self.cache: dict[str, _Verdict] = {}
        self.recovered: set[str] = set()
        self.hist: dict[str, list[Commit]] = {}
        for g, key in init_groups.items():
            self.hist[g] = [Commit(g, key, -1, 0)]
        for c in rec.commits:
            self.hist.setdefault(c.group, [Commit(c.group, None, -1, 0)]).append(c)
        self._n = 0

    def _open(self, fs: FS) -> tuple[str, str]:
        self._n += 1
        top = os.path.join(self.scratch, f"s{self._n}")
        fs.materialize(top)
        return top, os.path.join(top, "state")

    def check(self, k: int, policy: str, fs: FS, *, recover: bool, fp: str | None = None) -> list[str]:
        """``fp``: ``fs.fingerprint()`` if the caller has it already."""
        fp = fs.fingerprint() if fp is None else fp
        verdict = self.cache.get(fp)
        problems: list[str] = []
        if verdict is None or (recover and fp not in self.recovered):
            top, root = self._open(fs)
            try:
                if verdict is None:
                    verdict = self.cache[fp] = self._inspect(root)
                if recover and not verdict.problems and fp not in self.recovered:
                    self.recovered.add(fp)
                    problems += self._recover(root)
            finally:
                _remove(top, fs)
        problems = verdict.problems + problems
        if not verdict.problems:
            problems += self._acks(k, verdict)
        return [f"crash point {k}/{len(self.trace)} ({policy}): {p}" for p in problems]

    def _inspect(self, root: str) -> _Verdict:
        try:
            store = open_store(root, io=FastIO())
        except Exception as e:  # the first thing a user does must not fail
            return _Verdict([f"store does not open: {type(e).__name__}: {e}"], {}, None)
        problems: list[str] = []
        try:
            rep = fsck(store)
            problems = [f"fsck: {p.line()}" for p in rep.problems]
            groups = {}
            for g in set(self.hist) | set(store.refs.groups()):
                groups[g] = group_key(store.refs.read(g))
            objects = None
            if not self.w.allow_pruned_objects:
                objects = {oid for oid, _ in self.rec.objects if store.has(oid)}
            return _Verdict(problems, groups, objects)
        except Exception as e:  # what fsck found, then what reading the groups could not get past
            return _Verdict(problems + [f"reading the store failed: {type(e).__name__}: {e}"], {}, None)

    def _acks(self, k: int, v: _Verdict) -> list[str]:
        out = []
        for g, seen in sorted(v.groups.items()):
            hist = self.hist.get(g) or [Commit(g, None, -1, 0)]
            required = max(j for j, c in enumerate(hist) if c.ack <= k)
            allowed = [c.state for c in hist[required:] if c.commit < k]
            if seen not in allowed:
                if seen in [c.state for c in hist]:
                    why = "an older state than one acknowledged" if seen in [c.state for c in hist[:required]] \
                        else "a state committed only after the crash point"
                elif seen is None:
                    why = "nothing: the group is lost"
                else:
                    why = "a state that was never committed (a mixture)"
                out.append(f"group {g} shows {why}: {_show(seen)}; allowed {[_show(s) for s in allowed]}")
        if v.objects is not None:
            lost = [oid.hex()[:16] for oid, ack in self.rec.objects if ack <= k and oid not in v.objects]
            if lost:
                out.append(f"{len(lost)} acknowledged object(s) lost: {', '.join(sorted(set(lost))[:5])}")
        return out

    def _recover(self, root: str) -> list[str]:
        try:
            store = open_store(root, io=FastIO())
            self.w.recover(store)
            store = open_store(root, io=FastIO())
            rep = fsck(store)
            return [f"after recovery, fsck: {p.line()}" for p in rep.problems]
        except Exception as e:
            tb = traceback.format_exception(type(e), e, e.__traceback__)[-3:]
            return [f"recovery failed: {type(e).__name__}: {e} | {' '.join(x.strip() for x in tb)}"]


def _inside_sibling_mkdirs(ops: list, k: int) -> bool:
    """Whether crash point ``k`` falls between two ``mkdir`` of one directory.

    A new state dir's skeleton is 256 fan-out dirs made one after the
    other: three quarters of the crash points of a run in a fresh state
    dir, whose states differ only in how many empty fan-out dirs exist.
    The normal suite explores such a run at its two ends (before the
    first, after the last: there every policy and subset sees the
    unsynced ones); the long mode at every point.
    """
    if not 0 < k < len(ops):
        return False
    before, after = ops[k - 1], ops[k]
    return before.kind == after.kind == "mkdir" and os.path.dirname(before.path) == os.path.dirname(after.path)


def _remove(top: str, fs: FS) -> None:
    """Remove a state ``fs.materialize(top)`` made: its entries, deepest first, then ``top``.

    A state is mostly the skeleton's ~270 empty directories; removing the
    known entries costs a third of what ``shutil.rmtree`` does (it lists
    each directory and opens it). If the check added or removed anything
    (recovery may), the listing no longer fits and ``rmtree`` removes the rest.
    """
    try:
        for rel, node in reversed(list(fs.files())):
            if node.is_dir:
                os.rmdir(os.path.join(top, rel))
            else:
                os.unlink(os.path.join(top, rel))
        os.rmdir(top)
    except OSError:
        shutil.rmtree(top, ignore_errors=True)


def _show(key: tuple | None) -> str:
    if key is None:
        return "absent"
    refs, fence, deleted = key
    body = ",".join(f"{n}={v.hex()[:8]}" for n, v in refs)
    return f"[{body} fence={fence}{' deleted' if deleted is not None else ''}]"


# ================================================================== the driver


class Prepared:
    """A workload's pre-state, set up once; explorations start from copies of it.

    The files outside the state dir (``aux``: a workspace, a bundle) are
    shared, not copied: sessions record their workspace's absolute path.
    """

    def __init__(self, workload: Workload, scratch: str | None = None) -> None:
        self.workload = workload
        self.base = tempfile.mkdtemp(prefix=f"prepared-{workload.name}-", dir=scratch or scratch_dir())
        self.top, self.aux = os.path.join(self.base, "top"), os.path.join(self.base, "aux")
        os.mkdir(self.top)
        os.mkdir(self.aux)
        with quiet_lease():
            workload.setup(self.top, self.aux)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "Prepared":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def quiet_lease() -> Iterator[None]:
    """A lease TTL long enough that no renewer thread writes during a workload (the trace stays one thread's)."""
    old = os.environ.get("KXEN_AGENT_LEASE_TTL_S")
    os.environ["KXEN_AGENT_LEASE_TTL_S"] = "3600"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KXEN_AGENT_LEASE_TTL_S", None)
        else:
            os.environ["KXEN_AGENT_LEASE_TTL_S"] = old


def explore(
    workload: Workload,
    *,
    long: bool | None = None,
    seed: int = 0,
    random_per_point: int | None = None,
    recover_sample: int | None = None,
    scratch: str | None = None,
    io_factory: Callable[[], TracingIO] | None = None,
    policies: tuple[str, ...] = ("sync", "kill", "meta", "data"),
    subsets: bool = True,
    recover_sync: bool = True,
    prepared: "Prepared | None" = None,
    stop_when: Callable[[str], bool] | None = None,
    skip_before: Callable[[], int] | None = None,
) -> CrashReport:
    """Trace ``workload`` once, then check the crash states of every prefix of its trace.

    At every crash point: ``sync``, ``kill``, ``meta`` and ``data``, then
    every ``subset`` if there are at most 32 (long mode: 1024), else
    ``random_per_point`` random ones (default 1; long mode 8). States equal
    to one already checked at the same point are skipped. Recovery runs on
    every distinct ``sync`` state plus ``recover_sample`` others (default
    40; ``recover_sync=False``: only those); in long mode
    (``KXEN_RELIABILITY_LONG=1``) on every distinct state. ``policies`` and
    ``subsets`` narrow the exploration (the composite fault-then-crash
    suite uses ``sync`` and ``kill`` only). ``prepared``: start from a copy
    of a state set up once (:class:`Prepared`) instead of ``workload.setup``. Outside the long mode,
    a crash point between two ``mkdir`` of one directory is skipped (:func:`_inside_sibling_mkdirs`).
    ``stop_when``: stop at the first failure it accepts (a self-test that only needs to see the
    simulator catch a broken store). ``io_factory`` makes the tracing
    FileIO (the suite's self-tests pass deliberately broken ones). ``skip_before``: asked once the
    workload has run, the first crash point to explore (the earlier ones count as skipped).
    """
    long = long_mode() if long is None else long
    if random_per_point is None:
        random_per_point = 8 if long else 1
    subset_limit = 1024 if long else 32
    if recover_sample is None:
        recover_sample = 10**9 if long else 40
    rep = CrashReport(workload.name)
    t0 = time.monotonic()
    base = tempfile.mkdtemp(prefix=f"crashsim-{workload.name.replace(os.sep, '_')}-", dir=scratch or scratch_dir())
    try:
        top, aux, states = os.path.join(base, "top"), os.path.join(base, "aux"), os.path.join(base, "states")
        for d in (aux, states):
            os.mkdir(d)
        with quiet_lease():
            if prepared is not None:
                shutil.copytree(prepared.top, top, symlinks=True)
            else:
                os.mkdir(top)
                workload.setup(top, aux)
            snapshot = FS.capture(top)
            init_store = open_store(os.path.join(top, "state"), io=FastIO())
            init_groups = {g: group_key(init_store.refs.read(g)) for g in init_store.refs.groups()}
            io = io_factory() if io_factory is not None else TracingIO(sync=False)
            store = open_store(os.path.join(top, "state"), io=io)
            rec = Recorder(store, io)
            workload.recorder = rec
            workload.run(store)
        ops = list(io.trace)
        rep.ops = len(ops)
        rep.failures += rec.problems
        try:
            trace = Trace(snapshot, ops, top)
        except TraceError as e:
            rep.failures.append(str(e))
            return rep
        rec.removals(trace, len(ops))
        # The seam is complete: replaying the whole trace gives the real directory.
        real = FS.capture(top).listing(_is_lock_file)
        model = trace.final.listing(_is_lock_file)
        if real != model:
            diff = sorted(set(real) ^ set(model)) or sorted(p for p in real if real[p] != model.get(p))
            rep.failures.append(f"the trace does not reproduce the directory (bypassed store.io?): {diff[:5]}")
        checker = Checker(workload, trace, rec, init_groups, states)
        rng = random.Random(seed)
        sampled_recoveries = 0
        start = skip_before() if skip_before is not None else 0
        with quiet_lease():
            for k in range(len(ops) + 1):
                if stop_when is not None and any(stop_when(f) for f in rep.failures):
                    break
                if k < start:
                    rep.skipped += 1
                    continue
                if not long and _inside_sibling_mkdirs(ops, k):
                    rep.skipped += 1
                    continue
                rep.crash_points += 1
                plan: list[tuple[str, FS]] = [(p, trace.state(k, p)) for p in policies]
                every = trace.subsets(k, subset_limit) if subsets else None
                if not subsets:
                    pass
                elif every is not None:
                    plan += [("subset", fs) for fs in every]
                else:
                    plan += [("random", trace.state(k, "random", rng)) for _ in range(random_per_point)]
                seen_here: set[str] = set()
                for policy, fs in plan:
                    fp = fs.fingerprint()
                    if fp in seen_here:
                        continue  # the same disk at the same crash point: nothing new to check
                    seen_here.add(fp)
                    recover = (policy == "sync" and recover_sync) or long
                    if not recover and fp not in checker.recovered and sampled_recoveries < recover_sample \
                            and rng.random() < 0.25:
                        recover = True
                        sampled_recoveries += 1
                    rep.states += 1
                    rep.by_policy[policy] = rep.by_policy.get(policy, 0) + 1
                    rep.failures += checker.check(k, policy, fs, recover=recover, fp=fp)
        rep.distinct = len(checker.cache)
        rep.recovered = len(checker.recovered)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        rep.seconds = time.monotonic() - t0
    return rep
