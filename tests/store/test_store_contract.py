"""One contract, two stores: the disk ``Store`` and the in-process ``MemoryStore``.

Every test of the first part runs against both (the ``repo`` fixture): what
:mod:`kxen_agent.store.protocols` promises — ids, lookups, prefixes,
compare-and-swap transactions, fences, reflogs, group listing, locks — must
hold the same way whichever store the session layer and the runner are
given. The second part runs the same script on both side by side and
compares what they hold, down to an exported bundle's bytes. The last part
is what only the memory store promises. Durability, crashes and other
processes are the disk store's own suites' business (test_refs, test_loose,
test_concurrency, the reliability suite).
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from pathlib import Path

import blake3
import pytest

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.session import schema
from kxen_agent.store import (
    ANY,
    AmbiguousId,
    BadRefName,
    CorruptObject,
    LockBusy,
    MissingObject,
    RefConflict,
    RefUpdate,
    StaleFence,
    Store,
)
from kxen_agent.store.bundle import export_bundle
from kxen_agent.store.memory import MemoryLockBusy, MemoryStore
from kxen_agent.store.objects import RawObject, encode_object
from kxen_agent.store.protocols import ExclusiveLock, ObjectStore, RefContainer, Repository
from kxen_agent.store.refs import BadRefValue

G = "sessions/ses_0123456789abcdef"
H = "other/g1"

#: Two root messages whose ids share their first 8 hex digits (see tests/session/test_sessions.py).
COLLIDING = ({"seq": 0, "role": "user", "content": "c60843"}, {"seq": 0, "role": "user", "content": "c116812"})
COLLIDING_PREFIX = "79442e76"


def make(kind: str, tmp_path: Path) -> Repository:
    return Store(str(tmp_path / "state")) if kind == "disk" else MemoryStore("contract")


@pytest.fixture(params=["disk", "memory"])
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Repository:
    return make(request.param, tmp_path)


def blobs(repo: Repository, n: int) -> list[bytes]:
    return [repo.put("blob", b"value %d" % i) for i in range(n)]


def untouched(repo: Repository) -> bool:
    """Nothing was ever written (the disk store creates its state dir at the first write)."""
    if isinstance(repo, Store):
        return not os.path.exists(repo.root)
    return list(repo.iter_ids()) == [] and list(repo.refs.groups()) == []


def snapshot(repo: Repository, group: str = G) -> tuple:
    state = repo.refs.read(group)
    return state, repo.refs.reflog(group, state)


# ==================================================================== objects


def test_both_satisfy_the_protocols(repo: Repository) -> None:
    assert isinstance(repo, Repository) and isinstance(repo, ObjectStore)
    assert isinstance(repo.refs, RefContainer)
    with repo.refs.lock(G, timeout=1) as lock:
        assert isinstance(lock, ExclusiveLock) and lock.held


@pytest.mark.parametrize(("kind", "value"), [
    ("blob", b"hello"),
    ("blob", b""),
    ("message", {"seq": 0, "role": "user", "content": "hi"}),
    ("run", {"id": "run_x", "n": [1, 2, {"deep": None}], "flag": True}),
])
def test_put_get_has_read_raw(repo: Repository, kind: str, value: object) -> None:
    oid = repo.put(kind, value)
    assert repo.has(oid)
    assert repo.get(oid) == value and repo.get(oid, kind) == value
    raw = repo.read_raw(oid)
    assert (raw.id, raw.kind) == (oid, kind)
    assert raw.raw.startswith(kind.encode() + b" %d\x00" % len(raw.body))
    # The id is BLAKE3 of the object bytes, computed here without the store's code.
    assert blake3.blake3(raw.raw).digest() == oid
    assert repo.put(kind, value) == oid  # storing it again changes nothing
    assert list(repo.iter_ids()).count(oid) == 1
    # A value handed out is the caller's: changing it changes nothing stored.
    got = repo.get(oid)
    if isinstance(got, dict):
        got["seq"] = 99
        assert repo.get(oid) == value


def test_wrong_kind_and_missing_objects(repo: Repository) -> None:
    oid = repo.put("blob", b"x")
    with pytest.raises(CorruptObject, match=f"{oid.hex()}: is a blob object, expected a message"):
        repo.get(oid, "message")
    absent = b"\x07" * 32
    assert not repo.has(absent)
    for call in (repo.read_raw, repo.get):
        with pytest.raises(MissingObject) as e:
            call(absent)
        assert absent.hex() in str(e.value) and repo.root in str(e.value)


def test_put_raw_and_iter_ids(repo: Repository) -> None:
    obj = encode_object("blob", b"raw")
    assert repo.put_raw(obj) is True
    assert repo.put_raw(obj) is False
    assert repo.read_raw(obj.id) == obj
    ids = blobs(repo, 20) + [obj.id]
    listed = list(repo.iter_ids())
    assert sorted(listed) == sorted(set(ids)) and len(listed) == len(set(listed))


def test_batches_nest(repo: Repository) -> None:
    with repo.batch():
        with repo.batch():
            a = repo.put("blob", b"a")
    repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="after the batch")
    assert repo.refs.get(G, "head") == a


def test_resolve_prefixes(repo: Repository) -> None:
    oid = repo.put("blob", b"resolve me")
    h = oid.hex()
    assert repo.resolve(h) == oid
    assert repo.resolve(h[:8]) == oid
    assert repo.resolve(f"  {h[:12].upper()}\n") == oid
    for bad in (h[:7], "xyz" * 4, "", h + "0"):
        with pytest.raises(UsageError, match="8 to 64 hex digits"):
            repo.resolve(bad)
    unknown = next(p for p in ("00000000", "ffffffff", "0f0f0f0f") if not h.startswith(p))
    with pytest.raises(MissingObject, match=f"{unknown}…"):
        repo.resolve(unknown)
    with pytest.raises(MissingObject):
        repo.resolve("0" * 64)


def test_an_ambiguous_prefix_is_refused(repo: Repository) -> None:
    a, b = (repo.put("message", v) for v in COLLIDING)
    assert a.hex()[:8] == b.hex()[:8] == COLLIDING_PREFIX
    with pytest.raises(AmbiguousId, match=f"prefix {COLLIDING_PREFIX} is ambiguous \\(2 objects\\)") as e:
        repo.resolve(COLLIDING_PREFIX)
    assert isinstance(e.value, UsageError)
    assert repo.resolve(a.hex()[:12]) == a and repo.resolve(b.hex()[:12]) == b


def test_a_schema_refusal_writes_nothing(repo: Repository) -> None:
    with pytest.raises(KxenError, match="refusing to write a message object .* nothing was written"):
        schema.put(repo, "message", {"seq": "7", "role": "user", "content": "x"})
    assert untouched(repo)
    good = schema.put(repo, "message", {"seq": 0, "role": "user", "content": "x"})
    assert list(repo.iter_ids()) == [good]


# ==================================================================== refs


def test_create_update_delete_with_cas(repo: Repository) -> None:
    a, b = blobs(repo, 2)
    assert repo.refs.read(G).exists is False and repo.refs.get(G, "head") is None
    s1 = repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="create")
    assert (s1.refs, s1.exists, s1.fence) == ({"head": a}, True, 0)
    repo.refs.transaction(G, [RefUpdate("head", a, b)], reason="move")
    assert repo.refs.get(G, "head") == b
    repo.refs.transaction(G, [RefUpdate("head", b, None)], reason="delete")
    assert repo.refs.get(G, "head") is None and repo.refs.read(G).exists  # the group stays, empty
    assert [(e.name, e.old, e.new, e.reason) for e in repo.refs.reflog(G)] == [
        ("head", None, a, "create"), ("head", a, b, "move"), ("head", b, None, "delete")]
    # A state handed out is the caller's: changing its dict changes no ref.
    repo.refs.read(G).refs["head"] = a
    repo.refs.transaction(G, [RefUpdate("tip", None, a)], reason="tip").refs["head"] = a
    assert repo.refs.read(G).refs == {"tip": a}


def test_a_stale_expectation_is_a_conflict_and_changes_nothing(repo: Repository) -> None:
    a, b, c = blobs(repo, 3)
    repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="create")
    repo.refs.transaction(G, [RefUpdate("head", a, b)], reason="move")
    before = snapshot(repo)
    with pytest.raises(RefConflict) as e:
        repo.refs.transaction(G, [RefUpdate("head", a, c)], reason="stale")
    assert (e.value.group, e.value.name, e.value.expected, e.value.found) == (G, "head", a, b)
    assert f"{G}/head" in str(e.value) and "re-read and retry" in str(e.value)
    with pytest.raises(RefConflict):
        repo.refs.transaction(G, [RefUpdate("head", None, c)], reason="create again")
    with pytest.raises(RefConflict) as e:
        repo.refs.transaction(G, [RefUpdate("other", a, None)], reason="delete absent")
    assert e.value.found is None
    assert snapshot(repo) == before


def test_a_multi_ref_transaction_is_all_or_nothing(repo: Repository) -> None:
    a, b, c = blobs(repo, 3)
    repo.refs.transaction(G, [RefUpdate("x", None, a), RefUpdate("y", None, a)], reason="init")
    before = snapshot(repo)
    with pytest.raises(RefConflict) as e:
        repo.refs.transaction(G, [RefUpdate("x", a, b), RefUpdate("new", None, c), RefUpdate("y", b, c)],
                              reason="partly stale")
    assert e.value.name == "y"
    assert snapshot(repo) == before
    state = repo.refs.transaction(G, [RefUpdate("x", a, b), RefUpdate("y", a, None), RefUpdate("runs/r1", None, c)],
                                  reason="three at once")
    assert state.refs == repo.refs.read(G).refs == {"x": b, "runs/r1": c}
    log = repo.refs.reflog(G)[-3:]
    assert [(e.name, e.old, e.new) for e in log] == [("x", a, b), ("y", a, None), ("runs/r1", None, c)]
    assert len({e.time_ns for e in log}) == 1, "one transaction, one time"


def test_any_skips_the_compare_and_two_updates_chain(repo: Repository) -> None:
    a, b = blobs(repo, 2)
    repo.refs.transaction(G, [RefUpdate("head", ANY, a)], reason="r")
    repo.refs.transaction(G, [RefUpdate("head", ANY, b), RefUpdate("head", b, a)], reason="twice")
    assert repo.refs.get(G, "head") == a
    assert [(e.old, e.new) for e in repo.refs.reflog(G)] == [(None, a), (a, b), (b, a)]


def test_bad_names_and_values_are_refused_before_anything_is_written(repo: Repository) -> None:
    a = encode_object("blob", b"never stored").id
    for name in ("..", "a//b", "x.lock", "has space", "a/b/c/d/e", "tmp_x", ""):
        with pytest.raises(BadRefName):
            repo.refs.transaction(G, [RefUpdate(name, None, a)], reason="x")
    for group in ("one", "a/b/c", "a/..", "a/x.lock"):
        with pytest.raises(BadRefName):
            repo.refs.transaction(group, [RefUpdate("head", None, a)], reason="x")
        with pytest.raises(BadRefName):
            repo.refs.read(group)
    with pytest.raises(BadRefName):
        repo.refs.get(G, "a//b")
    for value in (b"short", b"\x00" * 32, "text" * 8):
        with pytest.raises(BadRefValue):
            repo.refs.transaction(G, [RefUpdate("head", None, value)], reason="x")  # type: ignore[arg-type]
    with pytest.raises(BadRefValue):
        repo.refs.transaction(G, [RefUpdate("head", b"\x00" * 32, a)], reason="x")
    assert untouched(repo)


def test_fences(repo: Repository) -> None:
    a, b, c = blobs(repo, 3)
    repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="create")
    state = repo.refs.transaction(G, [], reason="lease", new_fence=3)
    assert state.fence == repo.refs.read(G).fence == 3 and state.refs == {"head": a}
    before = snapshot(repo)
    with pytest.raises(StaleFence) as e:
        repo.refs.transaction(G, [RefUpdate("head", a, b)], reason="paused holder", fence=2)
    assert (e.value.fence, e.value.current, e.value.exit_code) == (2, 3, 75)
    assert G in str(e.value) and "taken over" in str(e.value)
    # The fence is checked before the compare: a stale holder learns it lost the lease.
    with pytest.raises(StaleFence):
        repo.refs.transaction(G, [RefUpdate("head", c, b)], reason="stale and wrong", fence=1)
    for lower in (3, 2):  # a new fence must be higher
        with pytest.raises(StaleFence) as e:
            repo.refs.transaction(G, [], reason="no", new_fence=lower)
        assert (e.value.fence, e.value.current) == (lower, 3)
    assert snapshot(repo) == before
    repo.refs.transaction(G, [RefUpdate("head", a, b)], reason="holder", fence=3)
    repo.refs.transaction(G, [RefUpdate("head", b, c)], reason="take over", fence=3, new_fence=4)
    repo.refs.transaction(G, [RefUpdate("head", c, a)], reason="no fence given")
    log = repo.refs.reflog(G)
    # Each entry records the fence its transaction carried, or the group's.
    assert [(e.reason, e.fence) for e in log] == [
        ("create", 0), ("holder", 3), ("take over", 3), ("no fence given", 4)]
    assert repo.refs.read(G).fence == 4


def test_deleted_mark(repo: Repository) -> None:
    (a,) = blobs(repo, 1)
    repo.refs.transaction(G, [RefUpdate("meta", None, a)], reason="create")
    assert repo.refs.read(G).deleted_ns is None
    repo.refs.transaction(G, [], reason="delete", deleted_ns=12345)
    repo.refs.transaction(G, [], reason="keeps the mark")
    state = repo.refs.read(G)
    assert (state.deleted_ns, state.refs) == (12345, {"meta": a})
    repo.refs.transaction(G, [], reason="restore", deleted_ns=None)
    assert repo.refs.read(G).deleted_ns is None
    assert repo.refs.reflog(G)[-1].reason == "create", "a transaction with no update adds no reflog entry"


def test_reflog_contents_and_the_committed_length(repo: Repository) -> None:
    a, b = blobs(repo, 2)
    t0 = time.time_ns()
    repo.refs.transaction(G, [RefUpdate("head", None, a), RefUpdate("tip", None, a)], reason="start run")
    old = repo.refs.read(G)
    repo.refs.transaction(G, [RefUpdate("head", a, b)], reason="step\twith\nwhitespace", new_fence=3)
    t1 = time.time_ns()
    log = repo.refs.reflog(G)
    assert [(e.name, e.old, e.new, e.reason, e.fence) for e in log] == [
        ("head", None, a, "start run", 0), ("tip", None, a, "start run", 0),
        ("head", a, b, "step with whitespace", 3)]
    assert all(t0 <= e.time_ns <= t1 for e in log)
    # The state records how much reflog is committed; a reflog read against an
    # older state stops there.
    assert 0 < old.log_size < repo.refs.read(G).log_size
    assert repo.refs.reflog(G, old) == log[:2]
    with pytest.raises(ValueError, match="given for the reflog of"):
        repo.refs.reflog(H, old)
    assert repo.refs.reflog(H) == []


def test_group_listing_and_removal(repo: Repository) -> None:
    (a,) = blobs(repo, 1)
    assert list(repo.refs.groups()) == []
    for g in ("sessions/ses_b", "other/z", "sessions/ses_a", "other.x/a", "sessions/ses_fenced"):
        if g.endswith("fenced"):
            repo.refs.transaction(g, [], reason="a fence and nothing else", new_fence=1)
        else:
            repo.refs.transaction(g, [RefUpdate("meta", None, a)], reason="create")
    # By namespace, then id (as the disk store lists directories).
    assert list(repo.refs.groups()) == ["other/z", "other.x/a", "sessions/ses_a", "sessions/ses_b", "sessions/ses_fenced"]
    assert list(repo.refs.groups("sessions")) == ["sessions/ses_a", "sessions/ses_b", "sessions/ses_fenced"]
    assert list(repo.refs.groups("nothing")) == []
    repo.refs.remove_group("sessions/ses_b")
    repo.refs.remove_group("sessions/ses_fenced")
    repo.refs.remove_group("sessions/never")  # nothing to remove: harmless
    assert list(repo.refs.groups("sessions")) == ["sessions/ses_a"]
    gone = repo.refs.read("sessions/ses_fenced")
    assert (gone.exists, gone.refs, gone.fence, gone.log_size) == (False, {}, 0, 0)
    assert repo.refs.reflog("sessions/ses_b") == []
    assert repo.has(a), "removing a group removes no object"


# ==================================================================== locks


def in_thread(fn):
    """Run ``fn`` in another thread; return what it returned or raised."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the other thread is stuck"
    return out


def test_a_held_group_lock_is_busy_for_everyone_else(repo: Repository) -> None:
    with repo.refs.lock(G, timeout=1):
        # Another thread: at once, and after a bounded wait.
        now = in_thread(lambda: repo.refs.lock(G, timeout=0).__enter__())
        assert isinstance(now.get("error"), LockBusy), now
        start = time.monotonic()
        later = in_thread(lambda: repo.refs.lock(G, timeout=0.2).__enter__())
        assert isinstance(later.get("error"), LockBusy) and time.monotonic() - start >= 0.19, later
        err = later["error"]
        # The message names the time it waited: at least the timeout (more when the machine is busy).
        waited = re.search(r"\(waited (\d+\.\d)s\)", str(err))
        assert err.exit_code == 75 and waited and float(waited.group(1)) >= 0.2, str(err)
        # The same thread too: a group lock is not re-entrant.
        with pytest.raises(LockBusy):
            with repo.refs.lock(G, timeout=0):
                pass
        # Another group's lock is another lock.
        with repo.refs.lock(H, timeout=0):
            pass
    with repo.refs.lock(G, timeout=0):
        pass  # free again


def test_a_transaction_waits_for_the_lock_and_compares_what_it_finds_then(repo: Repository) -> None:
    a, b = blobs(repo, 2)
    out: dict = {}

    def late() -> None:
        try:
            repo.refs.transaction(G, [RefUpdate("head", None, b)], reason="late")
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=late)
    with repo.step(G, timeout=1) as step:
        # Started while the step holds the lock, so it can only commit after
        # this block, and must compare against what the holder wrote in it.
        t.start()
        step.update("head", None, a)
        step.commit("holder")
    t.join(30)
    assert not t.is_alive()
    assert isinstance(out.get("error"), RefConflict) and out["error"].found == a, out
    assert repo.refs.get(G, "head") == a
    assert [e.reason for e in repo.refs.reflog(G)] == ["holder"]


# ==================================================================== steps (Store.step)


def records(repo: Repository, group: str = G) -> int | None:
    """How many records the group's step log holds (None for the memory store, which has no log)."""
    if not isinstance(repo, Store):
        return None
    log = Store(repo.root).steps.load(group)  # a fresh instance reads what is on disk
    return 0 if log is None else len(log.records)


def test_a_step_puts_updates_and_commits_as_one(repo: Repository) -> None:
    base = repo.put("blob", b"base")
    repo.refs.transaction(G, [RefUpdate("head", None, base)], reason="first")
    before = records(repo)
    step = repo.step(G)
    msg = step.put("message", {"seq": 0, "role": "user", "content": "in a step"})
    blob = step.put("blob", b"out")
    assert step.objects == (msg, blob)
    # Nobody but the step sees its objects before the commit.
    assert not repo.has(msg) and not repo.has(blob)
    step.update("head", base, msg)
    step.update("out", None, blob)
    state = step.commit("one step")
    assert state is step.state and state.refs == {"head": msg, "out": blob}
    assert repo.refs.read(G).refs == {"head": msg, "out": blob}
    assert repo.get(msg, "message")["content"] == "in a step" and repo.get(blob) == b"out"
    log = repo.refs.reflog(G)
    assert [(e.name, e.reason) for e in log] == [("head", "first"), ("head", "one step"), ("out", "one step")]
    assert log[1].time_ns == log[2].time_ns, "one step, one time"
    if before is not None:
        assert records(repo) == before + 1, "one commit, one step-log record"
    with pytest.raises(RuntimeError, match="has ended"):
        step.update("head", msg, base)


def test_a_refused_step_drops_its_objects(repo: Repository) -> None:
    a = repo.put("blob", b"a")
    repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="first")
    before = records(repo)
    step = repo.step(G)
    lost = step.put("blob", b"never stored")
    step.update("head", None, lost)  # expects no head: there is one
    with pytest.raises(RefConflict):
        step.commit("refused")
    assert not repo.has(lost) and lost not in set(repo.iter_ids())
    assert repo.refs.read(G).refs == {"head": a} and len(repo.refs.reflog(G)) == 1
    assert records(repo) == before
    with pytest.raises(RuntimeError, match="has ended"):
        step.commit("again")


def test_a_refused_step_with_fail_loose_keeps_its_objects(repo: Repository) -> None:
    a = repo.put("blob", b"a")
    repo.refs.transaction(G, [RefUpdate("head", None, a)], reason="first")
    with repo.step(G, fail="loose") as step:
        kept = step.put("blob", b"kept")
        step.update("head", None, kept)
        with pytest.raises(RefConflict):
            step.commit("refused")
    assert repo.has(kept) and repo.get(kept) == b"kept"
    assert repo.refs.read(G).refs == {"head": a}


def test_a_step_left_without_commit_writes_nothing(repo: Repository) -> None:
    with repo.step(G) as step:
        oid = step.put("blob", b"undecided")
    assert not repo.has(oid) and not repo.refs.read(G).exists
    with pytest.raises(ValueError, match="fail="):
        repo.step(G, fail="keep")


def test_a_step_with_a_stale_fence_is_refused(repo: Repository) -> None:
    a = repo.put("blob", b"a")
    with repo.step(G) as grant:
        grant.update("head", None, a)
        grant.new_fence(3)
        assert grant.commit("grant").fence == 3
    stale = repo.step(G, fence=2)
    oid = stale.put("blob", b"stale")
    stale.update("head", a, oid)
    with pytest.raises(StaleFence) as e:
        stale.commit("stale holder")
    assert (e.value.fence, e.value.current) == (2, 3)
    assert not repo.has(oid) and repo.refs.read(G).refs == {"head": a}
    ok = repo.step(G, fence=3)
    ok.update("head", a, None)
    ok.mark_deleted(12345)
    state = ok.commit("holder")
    assert state.refs == {} and state.deleted_ns == 12345 and state.fence == 3
    assert repo.refs.reflog(G)[-1].fence == 3
    lower = repo.step(G)
    lower.new_fence(3)  # not higher than the group's
    with pytest.raises(StaleFence):
        lower.commit("no")


def test_a_step_reads_its_own_objects_first(repo: Repository) -> None:
    outside = repo.put("blob", b"stored before")
    with repo.step(G) as step:
        mine = step.put("message", {"seq": 0, "role": "user", "content": "mine"})
        assert step.has(mine) and step.has(outside) and not repo.has(mine)
        assert step.get(mine, "message")["content"] == "mine" and step.get(outside) == b"stored before"
        assert step.read_raw(mine).id == mine
        with pytest.raises(CorruptObject, match="expected a blob"):
            step.get(mine, "blob")
        # The session schema writes through any object store: a step is one.
        child = schema.put(step, "message", {"seq": 1, "role": "user", "content": "child", "parent": mine})
        step.update("head", None, child)
        step.commit("two messages")
    assert repo.get(child, "message")["parent"] == mine and repo.has(mine)


def test_a_step_refuses_bad_names_and_values_before_anything(repo: Repository) -> None:
    with pytest.raises(BadRefName):
        repo.step("no-slash")
    step = repo.step(G)
    with pytest.raises(BadRefName):
        step.update("bad..name", None, b"\x01" * 32)
    with pytest.raises(BadRefValue):
        step.update("head", None, b"short")
    assert untouched(repo)


def test_a_held_step_makes_others_wait(repo: Repository) -> None:
    with repo.step(G, timeout=1):
        with pytest.raises(LockBusy):
            with repo.refs.lock(G, timeout=0):
                pass
        with pytest.raises(LockBusy):
            repo.step(G, timeout=0).commit("x")
    repo.step(G, timeout=0).commit("free again")
    assert [e for e in repo.refs.reflog(G)] == []  # an empty step moves no ref
    assert repo.refs.read(G).exists


# ==================================================================== the same script, the same store


def script(repo: Repository) -> None:
    """Objects and ref transactions of every sort, the same on any store."""
    ids = [repo.put("blob", b"blob %d" % i) for i in range(5)]
    parent = None
    for i in range(4):
        v = {"seq": i, "role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
        if parent is not None:
            v["parent"] = parent
        parent = repo.put("message", v)
    repo.refs.transaction(G, [RefUpdate("head", None, parent), RefUpdate("meta", None, ids[0])], reason="create")
    repo.refs.transaction(G, [], reason="lease: run", new_fence=1)
    repo.refs.transaction(G, [RefUpdate("runs/r1", None, ids[1]), RefUpdate("runs/r1", ids[1], ids[2])],
                          reason="run r1: two steps", fence=1)
    repo.refs.transaction(H, [RefUpdate("x", ANY, ids[3])], reason="other\tgroup")
    repo.refs.transaction(H, [RefUpdate("x", ids[3], None)], reason="gone", deleted_ns=7)


def test_the_same_script_makes_the_same_store(tmp_path: Path) -> None:
    disk, mem = make("disk", tmp_path), make("memory", tmp_path)
    script(disk)
    script(mem)
    assert sorted(disk.iter_ids()) == sorted(mem.iter_ids())
    for oid in disk.iter_ids():
        assert disk.read_raw(oid) == mem.read_raw(oid)
    assert list(disk.refs.groups()) == list(mem.refs.groups()) == [H, G]
    for g in (G, H):
        d, m = disk.refs.read(g), mem.refs.read(g)
        assert d == m, (d, m)  # refs, fence, deleted mark, and the reflog's length in bytes
        strip = [(e.old, e.new, e.fence, e.name, e.reason) for e in disk.refs.reflog(g)]
        assert strip == [(e.old, e.new, e.fence, e.name, e.reason) for e in mem.refs.reflog(g)]
    # An export reads only the protocol: the same bundle, byte for byte.
    for fmt in ("pack", "json"):
        outs = []
        for store in (disk, mem):
            buf = io.BytesIO()
            export_bundle(store, [G], buf, fmt=fmt)
            outs.append(buf.getvalue())
        assert outs[0] == outs[1], fmt


# ==================================================================== the memory store's own promises


def test_memory_store_verifies_what_it_is_given_and_touches_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mem = MemoryStore("mine")
    assert mem.root == "memory:mine" and "memory:mine" in repr(mem)
    good = encode_object("blob", b"true")
    lying = RawObject(encode_object("blob", b"other").id, good.kind, good.raw, good.body_offset)
    with pytest.raises(CorruptObject, match="content hashes to"):
        mem.put_raw(lying)
    assert not mem.has(lying.id)
    script(mem)
    assert os.listdir(tmp_path) == []
    assert list(MemoryStore().iter_ids()) == [], "two memory stores share nothing"


def test_memory_lock_busy_names_the_lock_and_a_thread() -> None:
    mem = MemoryStore("locks")
    with mem.refs.lock(G):
        err = in_thread(lambda: mem.refs.lock(G, timeout=0).__enter__())["error"]
    assert isinstance(err, MemoryLockBusy) and isinstance(err, LockBusy)
    assert err.path == f"memory:locks/locks/{G}.lock"
    assert "held by another thread of this process" in str(err)


def test_the_new_modules_name_their_public_surface() -> None:
    from kxen_agent.store import memory, protocols

    for mod in (memory, protocols):
        assert mod.__all__ == sorted(mod.__all__)
        assert all(hasattr(mod, name) for name in mod.__all__)


def test_a_memory_step_verifies_a_raw_object_as_put_raw_does() -> None:
    mem = MemoryStore("steps")
    good = encode_object("blob", b"true")
    lying = RawObject(encode_object("blob", b"other").id, good.kind, good.raw, good.body_offset)
    step = mem.step(G)
    with pytest.raises(CorruptObject, match="content hashes to"):
        step.put_raw(lying)
    assert step.objects == () and step.put_raw(good) is True and step.put_raw(good) is False
