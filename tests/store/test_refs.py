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
from kxen_agent.store.steps import StepTx, TxUpdate, encode_record, parse_header, scan

from .helpers import run_python

G = "sessions/s1"


def _ids(store: Store, n: int) -> list[bytes]:
    return [store.put("blob", b"value %d" % i) for i in range(n)]


def _files(store: Store, group: str = G) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The group's ref file, reflog and step log (objects_spec.md §6.2), None for a missing one."""
    out = []
    for p in (store.refs.ref_path(group), store.refs.log_path(group), store.refs.steps_path(group)):
        try:
            with open(p, "rb") as f:
                out.append(f.read())
        except FileNotFoundError:
            out.append(None)
    return out[0], out[1], out[2]


def _temp_files(d: str) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith("tmp_")] if os.path.isdir(d) else []


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

    # Format 3 (objects_spec.md §6.4, §6.8): the transactions are records of
    # the step log; the ref file and the reflog file are written only by a
    # checkpoint. The group's log length already counts their lines.
    ref, reflog_file, steps = _files(store)
    assert ref is None and reflog_file is None and steps is not None
    assert store.refs.read(G).log_size == len(b"".join(format_reflog_line(e) for e in log))
    assert Store(store.root).refs.reflog(G) == log  # another reader: the same entries, from the step log

    assert store.refs.checkpoint(G) is True
    _, data, _ = _files(store)
    zero = "0" * 64
    lines = data.decode().splitlines(keepends=True)
    assert lines == [
        f"{zero} {a.hex()} {log[0].time_ns} 0 head\tstart run\n",
        f"{zero} {a.hex()} {log[0].time_ns} 0 tip\tstart run\n",
        f"{a.hex()} {b.hex()} {log[2].time_ns} 3 head\tstep with whitespace\n",
    ]
    assert store.refs.read(G).log_size == len(data)
    assert b"".join(format_reflog_line(e) for e in log) == data
    # Folded, not added twice: the reflog is the same, read from the file now.
    assert store.refs.reflog(G) == log and Store(store.root).refs.reflog(G) == log
    assert store.refs.checkpoint(G) is False  # nothing left to fold


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
    assert store.refs.checkpoint(G)  # the reflog file holds "one" and "two" now
    _, log_before, _ = _files(store)
    assert [e.reason for e in parse_reflog(log_before, "x")] == ["one", "two"]
    # What a crash between a checkpoint's reflog append and its ref file
    # rename leaves: well-formed lines past the size the ref file records.
    tail = format_reflog_line(ReflogEntry(b, c, time.time_ns(), 0, "head", "never committed"))
    with open(store.refs.log_path(G), "ab") as f:
        f.write(tail)

    assert [e.reason for e in store.refs.reflog(G)] == ["one", "two"]
    assert store.refs.get(G, "head") == b
    rep = fsck(store)
    assert rep.clean, rep.problems

    # A transaction appends its record to the step log and leaves the reflog
    # file alone; the tail is still ignored.
    store.refs.transaction(G, [RefUpdate("head", b, a)], reason="three")
    assert _files(store)[1] == log_before + tail
    assert [e.reason for e in store.refs.reflog(G)] == ["one", "two", "three"]
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["one", "two", "three"]
    assert fsck(store).clean

    # The next checkpoint cuts the tail before it appends.
    assert store.refs.checkpoint(G)
    _, log_after, _ = _files(store)
    assert log_after.startswith(log_before)
    assert b"never committed" not in log_after
    assert [e.reason for e in parse_reflog(log_after, "x")] == ["one", "two", "three"]
    assert store.refs.read(G).log_size == len(log_after)
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["one", "two", "three"]
    assert fsck(store).clean


@pytest.mark.parametrize("torn", ["half", "all but its last byte", "zeros"])
def test_uncommitted_step_record_is_ignored_then_cut(store: Store, torn):
    # The step log's counterpart (§6.8): a record whose append a crash or a
    # power loss cut short, or whose size reached the disk and not its
    # bytes, is an uncommitted tail: readers ignore it, the next writer cuts it.
    a, b, c = _committed_tail_case(store)
    path = store.refs.steps_path(G)
    with open(path, "rb") as f:
        good = f.read()
    rec = encode_record(StepTx(time.time_ns(), "never committed", 0, None, "leave", (TxUpdate("head", b, c),)), [],
                        len(good), good[:parse_header(good, path)[2]])
    bad = {"half": rec[: len(rec) // 2], "all but its last byte": rec[:-1], "zeros": bytes(len(rec))}[torn]
    with open(path, "ab") as f:
        f.write(bad)

    for reader in (store, Store(store.root)):
        assert reader.refs.get(G, "head") == b
        assert [e.reason for e in reader.refs.reflog(G)] == ["one", "two"]
    rep = fsck(Store(store.root))
    assert rep.clean, rep.problems
    assert [s for s in rep.stray_files if s.startswith(path)], rep.stray_files  # listed as information

    writer = Store(store.root)  # not the instance that read the tail first
    writer.refs.transaction(G, [RefUpdate("head", b, a)], reason="three")
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(good) and b"never committed" not in data
    recs, end = scan(data, parse_header(data, path)[2], path)
    assert end == len(data) and [r.tx.reason for r in recs] == ["one", "two", "three"]
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["one", "two", "three"]
    rep = fsck(Store(store.root))
    assert rep.clean and not [s for s in rep.stray_files if s.startswith(path)]


_CRASH = r"""
import os, sys
from kxen_agent.store import Store, FileIO, RefUpdate
root, group, action, op, where = sys.argv[1:6]
io = FileIO()
store = Store(root, io=io)
target = {"ref": store.refs.ref_path(group), "steps": store.refs.steps_path(group)}[where]
def hook(o, path):
    if o == op and path == target:
        os._exit(9)  # die like a power cut, right before this operation
io.hook = hook
if action == "checkpoint":
    store.refs.checkpoint(group)
else:
    old = bytes.fromhex(sys.argv[6]) if sys.argv[6] else None
    store.refs.transaction(group, [RefUpdate("head", old, bytes.fromhex(sys.argv[7]))], reason="crashed")
"""


def test_crash_before_the_rename_leaves_a_tail_the_next_writer_cuts(store: Store):
    # The ref file's rename is a checkpoint's commit point (§6.8 step 2):
    # a checkpoint that dies before it leaves the old ref file, the old step
    # log, and the reflog lines it appended as a tail past the ref file's log.
    a, b, c = _committed_tail_case(store)
    assert store.refs.checkpoint(G)
    store.refs.transaction(G, [RefUpdate("head", b, c)], reason="three")
    ref_before, log_before, steps_before = _files(store)
    p = run_python(_CRASH, store.root, G, "checkpoint", "rename", "ref")
    assert p.returncode == 9, p.stderr.decode()

    ref_now, log_now, steps_now = _files(store)
    assert ref_now == ref_before and steps_now == steps_before
    assert len(log_now) > len(log_before) and log_now.startswith(log_before)
    assert [e.reason for e in parse_reflog(log_now[len(log_before):], "x")] == ["three"]
    assert _temp_files(os.path.dirname(store.refs.ref_path(G)))  # the new ref file, never renamed in
    fresh = Store(store.root)
    assert fresh.refs.get(G, "head") == c
    assert [e.reason for e in fresh.refs.reflog(G)] == ["one", "two", "three"]  # "three" once
    assert fsck(fresh).clean

    fresh.refs.transaction(G, [RefUpdate("head", c, a)], reason="retried")
    assert fresh.refs.checkpoint(G)
    _, log_after, _ = _files(store)
    assert [e.reason for e in parse_reflog(log_after, "x")] == ["one", "two", "three", "retried"]
    assert Store(store.root).refs.read(G).log_size == len(log_after)
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["one", "two", "three", "retried"]
    assert fsck(Store(store.root)).clean


def test_crash_before_a_new_step_logs_rename_leaves_the_group_as_it_was(store: Store):
    # A group's first step writes its log whole under a temp name and renames
    # it in (§6.8 writing step 4): dying before the rename leaves no group.
    (a,) = _ids(store, 1)
    p = run_python(_CRASH, store.root, G, "transaction", "rename", "steps", "", a.hex())
    assert p.returncode == 9, p.stderr.decode()
    steps_dir = os.path.dirname(store.refs.steps_path(G))
    left = _temp_files(steps_dir)
    assert len(left) == 1 and _files(store) == (None, None, None)
    fresh = Store(store.root)
    assert not fresh.refs.read(G).exists and list(fresh.refs.groups()) == []
    rep = fsck(fresh)
    assert rep.clean and rep.stray_files == [os.path.join(steps_dir, left[0])]
    fresh.refs.transaction(G, [RefUpdate("head", None, a)], reason="retried")
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["retried"]
    assert fsck(Store(store.root)).clean


def test_crash_between_a_checkpoints_ref_file_and_its_new_generation_loses_nothing(store: Store):
    # The ref file is durable before the log's new generation exists (§6.8):
    # a checkpoint that dies in between leaves a ref file holding everything
    # beside a log of the old generation, which readers pass over as stale.
    a, b, c = _committed_tail_case(store)
    _, _, steps_before = _files(store)
    p = run_python(_CRASH, store.root, G, "checkpoint", "rename", "steps")
    assert p.returncode == 9, p.stderr.decode()
    ref_now, log_now, steps_now = _files(store)
    assert steps_now == steps_before and b"\nsteps 1\n" in ref_now
    assert [e.reason for e in parse_reflog(log_now, "x")] == ["one", "two"]
    fresh = Store(store.root)
    assert fresh.refs.get(G, "head") == b
    assert [e.reason for e in fresh.refs.reflog(G)] == ["one", "two"]  # not applied twice
    assert fsck(fresh).clean
    fresh.refs.transaction(G, [RefUpdate("head", b, c)], reason="three")  # replaces the stale log
    _, _, steps_after = _files(store)
    assert parse_header(steps_after, "x")[1] == 1
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["one", "two", "three"]
    assert fsck(Store(store.root)).clean


def test_reflog_shorter_than_recorded_is_corrupt(store: Store):
    a, b, c = _committed_tail_case(store)
    assert store.refs.checkpoint(G)
    store.refs.transaction(G, [RefUpdate("head", b, c)], reason="three")  # a record for a checkpoint to fold
    path = store.refs.log_path(G)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-10])
    before = _files(store)
    with pytest.raises(CorruptRef, match="shorter"):
        store.refs.reflog(G)
    with pytest.raises(CorruptRef, match="shorter"):
        Store(store.root).refs.reflog(G)
    # The writer of the reflog, a checkpoint (§6.8 step 1), refuses, and writes nothing.
    with pytest.raises(CorruptRef, match="shorter"):
        store.refs.checkpoint(G)
    assert _files(store) == before
    rep = fsck(Store(store.root))
    assert [(p.kind, p.where) for p in rep.problems] == [("corrupt-ref", G)]


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
    reflog_before = store.refs.reflog(G)
    with pytest.raises(StaleFence):
        store.refs.transaction(G, [RefUpdate("head", a, b)], reason="take over", new_fence=new_fence)
    assert _files(store) == before
    state = store.refs.transaction(G, [], reason="take over", new_fence=6)
    assert state.fence == 6 and store.refs.read(G).fence == 6
    assert store.refs.reflog(G) == reflog_before  # no updates, no reflog lines
    assert store.refs.checkpoint(G)  # the record folded: the fence kept, still no line of its own
    assert Store(store.root).refs.read(G).fence == 6
    assert [e.reason for e in parse_reflog(_files(store)[1], "x")] == ["lease"]


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


@pytest.mark.parametrize("op", ["append", "fsync"])
def test_failing_disk_during_commit_leaves_the_old_state(state_dir, op):
    # A transaction's commit point is the fsync of its step-log append
    # (§6.8): a disk that fails before the append, or at its fsync (the
    # record written, not durable: the writer cuts it), leaves the old state.
    io = FileIO()
    store = Store(str(state_dir), io=io)
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="ok")
    before = _files(store)
    steps_path = store.refs.steps_path(G)
    failed = []

    def hook(o, path):
        if o == op and path == steps_path and not failed:
            failed.append(o)
            raise OSError(28, "No space left on device")

    io.hook = hook
    with pytest.raises(OSError):
        store.refs.transaction(G, [RefUpdate("head", a, b)], reason="enospc")
    io.hook = None
    assert failed == [op]
    for reader in (store, Store(store.root)):
        assert reader.refs.get(G, "head") == a
        assert [e.reason for e in reader.refs.reflog(G)] == ["ok"]
    assert _files(store) == before  # the step log as it was: nothing appended, or the append cut
    assert _temp_files(os.path.dirname(steps_path)) == []
    assert fsck(store).clean
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="retry")
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["ok", "retry"]
    assert fsck(Store(store.root)).clean


def test_failing_disk_while_making_a_new_step_log_leaves_no_group(state_dir):
    io = FileIO()
    store = Store(str(state_dir), io=io)
    (a,) = _ids(store, 1)
    steps_path = store.refs.steps_path(G)

    def hook(o, path):
        if o == "rename" and path == steps_path:
            raise OSError(28, "No space left on device")

    io.hook = hook
    with pytest.raises(OSError):
        store.refs.transaction(G, [RefUpdate("head", None, a)], reason="enospc")
    io.hook = None
    assert _files(store) == (None, None, None)
    assert _temp_files(os.path.dirname(steps_path)) == []  # the temp file was removed
    assert not Store(store.root).refs.read(G).exists and fsck(store).clean
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="retry")
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["retry"]


@pytest.mark.parametrize(("op", "target"), [("append", "log"), ("fsync", "log"), ("rename", "ref")])
def test_failing_disk_during_a_checkpoint_leaves_the_old_state(state_dir, op, target):
    # A checkpoint writes the reflog, then the ref file (its rename is the
    # commit point); a failure before that leaves the group as it was, the
    # reflog's new bytes (if any) a tail that the next checkpoint cuts.
    io = FileIO()
    store = Store(str(state_dir), io=io)
    a, b = _ids(store, 2)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="ok")
    assert store.refs.checkpoint(G)
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="two")
    ref_before, log_before, steps_before = _files(store)
    path = {"log": store.refs.log_path(G), "ref": store.refs.ref_path(G)}[target]
    failed = []

    def hook(o, p):
        if o == op and p == path and not failed:
            failed.append(o)
            raise OSError(28, "No space left on device")

    io.hook = hook
    with pytest.raises(OSError):
        store.refs.checkpoint(G)
    io.hook = None
    assert failed == [op]
    ref_now, log_now, steps_now = _files(store)
    assert ref_now == ref_before and steps_now == steps_before and log_now.startswith(log_before)
    for reader in (store, Store(store.root)):
        assert reader.refs.get(G, "head") == b
        assert [e.reason for e in reader.refs.reflog(G)] == ["ok", "two"]
    assert _temp_files(os.path.dirname(store.refs.ref_path(G))) == []
    assert fsck(store).clean
    assert store.refs.checkpoint(G)
    _, log_after, _ = _files(store)
    assert [e.reason for e in parse_reflog(log_after, "x")] == ["ok", "two"]
    assert [e.reason for e in Store(store.root).refs.reflog(G)] == ["ok", "two"]
    assert fsck(Store(store.root)).clean


def test_lock_files_are_created_through_the_seam_only_when_missing(state_dir):
    # objects_spec.md §8.1: a lock file carries nothing, but making one is a
    # change on disk; the store's FileIO makes it (fasteners then opens it).
    io = TracingIO(sync=False)
    store = Store(str(state_dir), io=io)
    (a,) = _ids(store, 1)
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="first")
    locks = os.path.join(store.root, "locks")
    # (Not the settled marker, §10.3: an empty file of its own among them, made through the seam too.)
    created = sorted(op.path for op in io.trace if op.kind == "create" and op.path.startswith(locks + os.sep)
                     and not os.path.basename(op.path).startswith("settled-"))
    assert created == sorted([os.path.join(locks, "gc.lock"), os.path.join(locks, "gc-gate.lock"),
                              store.refs.lock_path(G)])
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(locks) for f in fs
                  if not f.startswith("settled-")) == created
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
