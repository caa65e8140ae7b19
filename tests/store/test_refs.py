"""Ref groups: names, compare-and-swap transactions, reflogs, crash tails, fences."""

from __future__ import annotations

import os
import time

import pytest

from kxen_agent.store import ANY, BadRefName, CorruptRef, RefConflict, RefUpdate, StaleFence, Store, fsck
from kxen_agent.store.fsio import FileIO, TracingIO
from kxen_agent.store.refs import (
    ReflogEntry,
    format_reflog_line,
    parse_reflog,
    validate_group,
    validate_ref_name,
)

from .helpers import run_python

G = "sessions/s1"


def _ids(store: Store, n: int) -> list[bytes]:
    return [store.put("blob", b"value %d" % i) for i in range(n)]


def _files(store: Store, group: str = G) -> tuple[bytes | None, bytes | None]:
    out = []
    for p in (store.refs.ref_path(group), store.refs.log_path(group)):
        try:
            with open(p, "rb") as f:
                out.append(f.read())
        except FileNotFoundError:
            out.append(None)
    return out[0], out[1]


# ------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name",
    ["..", "a/..", "a/../b", "/abs", "a//b", "a/", "", "x.lock", "a/x.lock", "has space", "tab\there",
     "a.", ".hidden", "-dash", "a/b/c/d/e", "x" * 65, "ünï", "a\n", "a~", "a:b", "a\\b"],
)
def test_bad_ref_names(name, store: Store):
    with pytest.raises(BadRefName):
        validate_ref_name(name)
    with pytest.raises(BadRefName):
        store.refs.transaction(G, [RefUpdate(name, None, b"\x01" * 32)], reason="x")
    assert not os.path.exists(store.root)  # refused before anything was written


@pytest.mark.parametrize("name", ["head", "a/b/c/d", "run_1.2-x", "x" * 64, "_", "0"])
def test_good_ref_names(name):
    assert validate_ref_name(name) == name


@pytest.mark.parametrize("group", ["one", "a/b/c", "a/..", "../b", "a/b.lock", "a/ b", "/a", "a/"])
def test_bad_group_names(group, store: Store):
    with pytest.raises(BadRefName):
        validate_group(group)
    with pytest.raises(BadRefName):
        store.refs.read(group)


# ------------------------------------------------------------------ CAS


def test_create_update_delete_with_cas(store: Store):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="create")
    assert store.refs.get(G, "head") == a
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="move")
    assert store.refs.get(G, "head") == b
    store.refs.transaction(G, [RefUpdate("head", b, None)], reason="delete")
    assert store.refs.get(G, "head") is None
    assert [(e.old, e.new) for e in store.refs.reflog(G)] == [(None, a), (a, b), (b, None)]
    assert fsck(store).clean


def test_stale_expectation_is_a_conflict_and_changes_nothing(store: Store):
    a, b, c = _ids(store, 3)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="create")
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="move")
    before = _files(store)
    with pytest.raises(RefConflict) as ei:
        store.refs.transaction(G, [RefUpdate("head", a, c)], reason="stale")
    assert ei.value.expected == a and ei.value.found == b
    assert f"{G}/head" in str(ei.value)
    with pytest.raises(RefConflict):
        store.refs.transaction(G, [RefUpdate("head", None, c)], reason="create again")
    with pytest.raises(RefConflict):
        store.refs.transaction(G, [RefUpdate("other", a, None)], reason="delete absent")
    assert _files(store) == before


def test_multi_ref_transaction_is_all_or_nothing(store: Store):
    a, b, c = _ids(store, 3)
    store.refs.transaction(G, [RefUpdate("x", None, a), RefUpdate("y", None, a)], reason="init")
    before = _files(store)
    with pytest.raises(RefConflict) as ei:
        store.refs.transaction(
            G,
            [RefUpdate("x", a, b), RefUpdate("new", None, c), RefUpdate("y", b, c)],  # y is a, not b
            reason="partly stale",
        )
    assert ei.value.name == "y"
    assert _files(store) == before
    assert store.refs.read(G).refs == {"x": a, "y": a}

    state = store.refs.transaction(G, [RefUpdate("x", a, b), RefUpdate("y", a, None)], reason="both")
    assert state.refs == {"x": b}
    assert store.refs.read(G).refs == {"x": b}


def test_any_skips_the_compare(store: Store):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", ANY, a)], reason="r")
    store.refs.transaction(G, [RefUpdate("head", ANY, b)], reason="r")
    assert store.refs.get(G, "head") == b


def test_value_must_be_an_id(store: Store):
    with pytest.raises(ValueError):
        store.refs.transaction(G, [RefUpdate("head", None, b"short")], reason="r")


# ------------------------------------------------------------------ reflog


def test_reflog_records_old_new_time_fence_and_reason(store: Store):
    a, b = _ids(store, 2)
    t0 = time.time_ns()
    store.refs.transaction(G, [RefUpdate("head", None, a), RefUpdate("tip", None, a)], reason="start run")
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="step\twith\nwhitespace", new_fence=3)
    t1 = time.time_ns()

    log = store.refs.reflog(G)
    assert [(e.name, e.old, e.new, e.reason, e.fence) for e in log] == [
        ("head", None, a, "start run", 0),
        ("tip", None, a, "start run", 0),
        ("head", a, b, "step with whitespace", 3),
    ]
    assert all(t0 <= e.time_ns <= t1 for e in log)
    assert log[0].time_ns == log[1].time_ns  # one transaction, one time

    _, data = _files(store)
    zero = "0" * 64
    lines = data.decode().splitlines(keepends=True)
    assert lines == [
        f"{zero} {a.hex()} {log[0].time_ns} 0 head\tstart run\n",
        f"{zero} {a.hex()} {log[0].time_ns} 0 tip\tstart run\n",
        f"{a.hex()} {b.hex()} {log[2].time_ns} 3 head\tstep with whitespace\n",
    ]
    assert store.refs.read(G).log_size == len(data)
    assert b"".join(format_reflog_line(e) for e in log) == data


def test_two_updates_of_one_ref_chain_in_the_reflog(store: Store):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a), RefUpdate("head", a, b)], reason="twice")
    log = store.refs.reflog(G)
    assert [(e.old, e.new) for e in log] == [(None, a), (a, b)]
    assert store.refs.get(G, "head") == b
    assert fsck(store).clean


def _committed_tail_case(store: Store) -> tuple[bytes, bytes, bytes]:
    a, b, c = _ids(store, 3)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="one")
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="two")
    return a, b, c


def test_uncommitted_reflog_tail_is_ignored_then_cut(store: Store):
    a, b, c = _committed_tail_case(store)
    _, log_before = _files(store)
    # What a crash between the reflog append and the ref file rename leaves:
    # well-formed lines past the size the ref file records.
    tail = format_reflog_line(ReflogEntry(b, c, time.time_ns(), 0, "head", "never committed"))
    with open(store.refs.log_path(G), "ab") as f:
        f.write(tail)

    assert [e.reason for e in store.refs.reflog(G)] == ["one", "two"]
    assert store.refs.get(G, "head") == b
    rep = fsck(store)
    assert rep.clean, rep.problems

    store.refs.transaction(G, [RefUpdate("head", b, a)], reason="three")
    _, log_after = _files(store)
    assert log_after.startswith(log_before)
    assert b"never committed" not in log_after
    assert [e.reason for e in parse_reflog(log_after, "x")] == ["one", "two", "three"]
    assert fsck(store).clean


_CRASH_BEFORE_RENAME = r"""
import os, sys
from kxen_agent.store import Store, FileIO, RefUpdate
root, group, old, new = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3]), bytes.fromhex(sys.argv[4])
io = FileIO()
store = Store(root, io=io)
ref_path = store.refs.ref_path(group)
def hook(op, path):
    if op == "rename" and path == ref_path:
        os._exit(9)  # die like a power cut: after the reflog append, before the commit point
io.hook = hook
store.refs.transaction(group, [RefUpdate("head", old, new)], reason="crashed")
"""


def test_crash_before_the_rename_leaves_a_tail_the_next_writer_cuts(store: Store):
    a, b, c = _committed_tail_case(store)
    ref_before, log_before = _files(store)
    p = run_python(_CRASH_BEFORE_RENAME, store.root, G, b.hex(), c.hex())
    assert p.returncode == 9, p.stderr.decode()

    ref_now, log_now = _files(store)
    assert ref_now == ref_before
    assert len(log_now) > len(log_before) and b"crashed" in log_now
    assert store.refs.get(G, "head") == b
    assert [e.reason for e in store.refs.reflog(G)] == ["one", "two"]
    assert fsck(store).clean

    store.refs.transaction(G, [RefUpdate("head", b, c)], reason="retried")
    _, log_after = _files(store)
    assert b"crashed" not in log_after
    assert [e.reason for e in store.refs.reflog(G)] == ["one", "two", "retried"]
    assert fsck(store).clean


def test_reflog_shorter_than_recorded_is_corrupt(store: Store):
    _committed_tail_case(store)
    path = store.refs.log_path(G)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-10])
    with pytest.raises(CorruptRef, match="shorter"):
        store.refs.reflog(G)
    with pytest.raises(CorruptRef, match="shorter"):
        store.refs.transaction(G, [RefUpdate("head", ANY, None)], reason="x")


@pytest.mark.parametrize(
    "content",
    [b"", b"kxen-refs 2\nfence 0\nlog 0\n", b"kxen-refs 1\nfence x\nlog 0\n", b"kxen-refs 1\nfence 0\nlog 0",
     b"kxen-refs 1\nfence 0\nlog 0\n" + b"ab" * 32 + b" bad name\n",
     b"kxen-refs 1\nfence 0\nlog 0\n" + b"ab" * 32 + b" b\n" + b"ab" * 32 + b" a\n",
     b"kxen-refs 1\nfence 0\nlog 0\n" + b"AB" * 32 + b" a\n", b"kxen-refs 1\nfence 0\nlog 0\n\xff\n"],
)
def test_corrupt_ref_files_are_refused(store: Store, content):
    path = store.refs.ref_path(G)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptRef):
        store.refs.read(G)


# ------------------------------------------------------------------ fences


def test_stale_fence_is_refused_and_changes_nothing(store: Store):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="lease 5", new_fence=5)
    assert store.refs.read(G).fence == 5
    before = _files(store)

    with pytest.raises(StaleFence) as ei:
        store.refs.transaction(G, [RefUpdate("head", a, b)], reason="old holder", fence=4)
    assert (ei.value.fence, ei.value.current) == (4, 5)
    assert _files(store) == before

    # The current fence (or a newer one) may write.
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="holder", fence=5)
    assert store.refs.get(G, "head") == b
    assert store.refs.reflog(G)[-1].fence == 5


@pytest.mark.parametrize("new_fence", [5, 4, 0])
def test_new_fence_must_increase(store: Store, new_fence):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="lease", new_fence=5)
    before = _files(store)
    with pytest.raises(StaleFence):
        store.refs.transaction(G, [RefUpdate("head", a, b)], reason="take over", new_fence=new_fence)
    assert _files(store) == before
    state = store.refs.transaction(G, [], reason="take over", new_fence=6)
    assert state.fence == 6 and store.refs.read(G).fence == 6
    assert _files(store)[1] == before[1]  # no updates, no reflog lines


def test_fence_check_comes_before_the_compare(store: Store):
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="lease", new_fence=2)
    with pytest.raises(StaleFence):
        store.refs.transaction(G, [RefUpdate("head", b, a)], reason="x", fence=1)


def test_deleted_mark_roundtrips(store: Store):
    a = _ids(store, 1)[0]
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="x", deleted_ns=123)
    assert store.refs.read(G).deleted_ns == 123
    store.refs.transaction(G, [], reason="keep")
    assert store.refs.read(G).deleted_ns == 123
    store.refs.transaction(G, [], reason="undelete", deleted_ns=None)
    assert store.refs.read(G).deleted_ns is None


def test_remove_group(store: Store):
    a = _ids(store, 1)[0]
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="x")
    assert list(store.refs.groups()) == [G]
    store.refs.remove_group(G)
    assert list(store.refs.groups()) == []
    assert store.refs.read(G).exists is False
    assert store.refs.reflog(G) == []


def test_failing_disk_during_commit_leaves_the_old_state(state_dir):
    io = FileIO()
    store = Store(str(state_dir), io=io)
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="ok")
    before = _files(store)

    def hook(op, path):
        if op == "rename" and path == store.refs.ref_path(G):
            raise OSError(28, "No space left on device")

    io.hook = hook
    with pytest.raises(OSError):
        store.refs.transaction(G, [RefUpdate("head", a, b)], reason="enospc")
    io.hook = None
    assert store.refs.get(G, "head") == a
    assert [e.reason for e in store.refs.reflog(G)] == ["ok"]
    assert _files(store)[0] == before[0]
    assert [n for n in os.listdir(os.path.dirname(store.refs.ref_path(G))) if n.startswith("tmp_")] == []
    assert fsck(store).clean
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="retry")
    assert [e.reason for e in store.refs.reflog(G)] == ["ok", "retry"]


def test_lock_files_are_created_through_the_seam_only_when_missing(state_dir):
    # objects_spec.md §8.1: a lock file carries nothing, but making one is a
    # change on disk; the store's FileIO makes it (fasteners then opens it).
    io = TracingIO(sync=False)
    store = Store(str(state_dir), io=io)
    (a,) = _ids(store, 1)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="first")
    locks = os.path.join(store.root, "locks")
    created = sorted(op.path for op in io.trace if op.kind == "create" and op.path.startswith(locks + os.sep))
    assert created == sorted([os.path.join(locks, "gc.lock"), os.path.join(locks, "gc-gate.lock"),
                              store.refs.lock_path(G)])
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(locks) for f in fs) == created
    mark = io.mark()
    store.refs.transaction(G, [RefUpdate("head", a, None)], reason="second")
    assert [op for op in io.trace[mark:] if op.kind == "create" and op.path.startswith(locks + os.sep)] == []


def test_a_lock_file_that_cannot_be_created_fails_the_transaction_and_frees_the_lock(state_dir):
    io = FileIO()
    store = Store(str(state_dir), io=io, lock_timeout=2.0)  # a lock left taken fails the retry quickly
    (a,) = _ids(store, 1)

    def full_disk(op: str, path: str) -> None:
        if op == "create" and path == store.refs.lock_path(G):
            raise OSError(28, "No space left on device", path)

    io.hook = full_disk
    with pytest.raises(OSError) as ei:
        store.refs.transaction(G, [RefUpdate("head", None, a)], reason="enospc")
    assert ei.value.errno == 28 and not os.path.exists(store.refs.lock_path(G))
    io.hook = None
    # Neither this thread's lock nor the store lock stayed taken: the retry goes through at once.
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="retry")
    assert [e.reason for e in store.refs.reflog(G)] == ["retry"] and fsck(store).clean
