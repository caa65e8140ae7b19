"""Step logs (objects_spec.md §6.8): one record per durable step, its fsyncs, torn tails, damage, checkpoints."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kxen_agent.store import CorruptRef, RefUpdate, Store, fsck
from kxen_agent.store.fold import fold_step_logs
from kxen_agent.store.fsio import FileIO
from kxen_agent.store.objects import encode_object
from kxen_agent.store.steps import (CorruptSteps, StepTx, TxUpdate, encode_header, encode_record, frame_body, parse_header,
                                    scan)

from .helpers import CLI_NAMESPACES

G = "sessions/ses_steps"


def _open(root: str, io: FileIO | None = None) -> Store:
    return Store(root, io=io or FileIO(), namespaces=CLI_NAMESPACES)


def _step(store: Store, n: int, old: bytes | None) -> bytes:
    """One durable step as the runner makes it: objects put, then the ref that names them."""
    with store.step(G) as step:
        blob = step.put("blob", b"output %d " % n + b"x" * 2000)
        msg = step.put("message", {"role": "tool", "content": f"step {n}", "blob": blob})
        step.update("head", old, msg)
        step.commit(f"step {n}")
    return msg


def test_a_step_is_one_record_and_one_fsync(tmp_path):
    io = FileIO()
    store = _open(str(tmp_path / "s"), io)
    head = _step(store, 0, None)  # creates the log: file + directory fsync
    before = io.fsyncs
    for n in range(1, 11):
        head = _step(store, n, head)
    assert io.fsyncs - before == 10  # one per durable step
    # Nothing loose: the objects are in the records.
    assert list(store.loose.iter_ids()) == []
    path = store.refs.steps_path(G)
    data = open(path, "rb").read()
    group, gen, hlen = parse_header(data, path)
    assert (group, gen) == (G, 0)
    recs, end = scan(data, hlen, path)
    assert end == len(data) and len(recs) == 11
    assert all(len(r.objects) == 2 for r in recs)
    # Another process sees all of it.
    other = _open(store.root)
    assert other.refs.read(G).refs["head"] == head
    assert other.get(head, "message")["content"] == "step 10"
    assert [e.reason for e in other.refs.reflog(G)] == [f"step {n}" for n in range(11)]
    assert fsck(other).clean


def test_new_log_for_a_new_group_costs_two_fsyncs(tmp_path):
    io = FileIO()
    store = _open(str(tmp_path / "s"), io)
    _step(store, 0, None)  # state dir made, first log
    before = io.fsyncs
    with store.step("sessions/ses_other") as step:
        oid = step.put("blob", b"fork")
        step.update("head", None, oid)
        step.commit("new group")
    assert io.fsyncs - before == 2  # the new log's bytes, then its name


@pytest.mark.tools("zstd", "b3sum")
def test_the_id_of_an_object_in_a_log_is_provable_with_standard_tools(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    path = store.refs.steps_path(G)
    data = open(path, "rb").read()
    _, _, hlen = parse_header(data, path)
    recs, _ = scan(data, hlen, path)
    for oid, at, n in recs[0].objects:
        out = subprocess.run(f"dd if={path} bs=1 skip={at} count={n} status=none | zstd -dc | b3sum --no-names",
                             shell=True, check=True, capture_output=True, text=True).stdout.strip()
        assert out == oid.hex()
    assert head in [o for o, _, _ in recs[0].objects]


def test_torn_tail_is_ignored_then_cut_by_the_next_writer(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    path = store.refs.steps_path(G)
    good = os.path.getsize(path)
    # A record cut short, as a power loss in the middle of an append leaves it.
    have = open(path, "rb").read()
    rec = encode_record(StepTx(1, "torn", 0, None, "leave", (TxUpdate("head", head, head[::-1]),)), [],
                        len(have), have[:parse_header(have, path)[2]])
    with open(path, "ab") as f:
        f.write(rec[: len(rec) // 2])
    fresh = _open(store.root)
    assert fresh.refs.read(G).refs["head"] == head  # the tail is not committed
    rep = fsck(fresh)
    assert rep.clean and any("uncommitted tail" in s for s in rep.stray_files)
    head2 = _step(fresh, 1, head)
    assert os.path.getsize(path) > good
    data = open(path, "rb").read()
    recs, end = scan(data, parse_header(data, path)[2], path)
    assert end == len(data) and [r.tx.reason for r in recs] == ["step 0", "step 1"]
    assert _open(store.root).refs.read(G).refs["head"] == head2


def test_a_zero_filled_tail_is_a_torn_append(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    with open(store.refs.steps_path(G), "ab") as f:
        f.write(b"\0" * 4096)  # size reached the disk, data did not
    assert _open(store.root).refs.read(G).refs["head"] == head
    assert fsck(_open(store.root)).clean


def test_damage_before_a_committed_record_is_refused_never_cut(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    _step(store, 1, head)
    path = store.refs.steps_path(G)
    data = bytearray(open(path, "rb").read())
    hlen = parse_header(bytes(data), path)[2]
    data[hlen + 40] ^= 0xFF  # inside the first record: its checksum fails, the second is intact
    open(path, "wb").write(bytes(data))
    fresh = _open(store.root)
    with pytest.raises(CorruptRef, match="damaged"):
        fresh.refs.read(G)
    with pytest.raises(CorruptRef):
        _step(fresh, 2, head)
    assert open(path, "rb").read() == bytes(data)  # no writer cut the damaged log
    assert not fsck(_open(store.root)).clean


def test_scan_refuses_a_record_with_a_good_checksum_that_does_not_parse():
    import blake3

    body = (3).to_bytes(4, "big") + b"\xff\xff\xff"
    line = encode_header(G, 0)
    with pytest.raises(CorruptSteps, match=f"damaged at offset {len(line)}"):
        scan(line + frame_body(body, len(line), line), len(line), "x")
    # The same in a version-1 log.
    line = encode_header(G, 0, version=1)
    head = b"STEP" + len(body).to_bytes(4, "big")
    with pytest.raises(CorruptSteps, match=f"damaged at offset {len(line)}"):
        scan(line + head + body + blake3.blake3(head + body).digest(), len(line), "x")


def test_checkpoint_folds_the_log_and_nothing_is_lost(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = None
    for n in range(5):
        head = _step(store, n, head)
    rep = fold_step_logs(store)
    assert rep.groups == [G] and rep.packed == 10
    path = store.refs.steps_path(G)
    data = open(path, "rb").read()
    assert parse_header(data, path)[1] == 1 and len(data) == len(encode_header(G, 1))
    ref = open(store.refs.ref_path(G), "rb").read().decode()
    assert "\nsteps 1\n" in ref and head.hex() in ref
    fresh = _open(store.root)
    assert fresh.refs.read(G).refs["head"] == head
    assert [e.reason for e in fresh.refs.reflog(G)] == [f"step {n}" for n in range(5)]
    assert fresh.get(head, "message")["content"] == "step 4"
    head = _step(fresh, 5, head)  # the next generation takes records
    assert _open(store.root).refs.read(G).refs["head"] == head
    assert fsck(_open(store.root)).clean


def test_a_checkpoint_that_died_before_the_new_generation_leaves_a_stale_log(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    path = store.refs.steps_path(G)
    stale = open(path, "rb").read()
    fold_step_logs(store)
    open(path, "wb").write(stale)  # as if the checkpoint's last rename never happened
    fresh = _open(store.root)
    st = fresh.refs.read(G)
    assert st.refs["head"] == head and len(fresh.refs.reflog(G)) == 1  # not applied twice
    head2 = _step(fresh, 1, head)  # the writer replaces the stale log
    assert parse_header(open(path, "rb").read(), path)[1] == 1
    assert _open(store.root).refs.read(G).refs["head"] == head2
    assert fsck(_open(store.root)).clean


def test_a_format_2_state_dir_upgrades_on_first_write(tmp_path):
    root = str(tmp_path / "s")
    store = _open(root)
    head = _step(store, 0, None)
    fold_step_logs(store)
    # Make it look as format 2 wrote it: no steps/, no 'steps' line, FORMAT 2.
    shutil.rmtree(os.path.join(root, "steps"))
    ref = store.refs.ref_path(G)
    text = open(ref).read()
    assert "steps 1\n" in text
    open(ref, "w").write(text.replace("steps 1\n", ""))
    open(os.path.join(root, "FORMAT"), "w").write("kxen-agent-state 2\n")
    old = _open(root)
    assert old.format_version == 2 and old.refs.read(G).refs["head"] == head
    head2 = _step(old, 1, head)
    assert open(os.path.join(root, "FORMAT")).read() == "kxen-agent-state 4\n"
    assert os.path.isdir(os.path.join(root, "steps", "sessions"))
    again = _open(root)
    assert again.refs.read(G).refs["head"] == head2
    assert [e.reason for e in again.refs.reflog(G)] == ["step 0", "step 1"]
    assert fsck(again).clean


def test_a_refused_step_writes_nothing_and_a_retry_is_a_new_step(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    path = store.refs.steps_path(G)
    size = os.path.getsize(path)
    from kxen_agent.store import RefConflict

    with store.step(G) as step:
        oid = step.put("blob", b"retry me")
        step.update("head", oid, oid)
        with pytest.raises(RefConflict):
            step.commit("wrong expectation")
    assert os.path.getsize(path) == size and not _open(store.root).has(oid)  # dropped with the step
    with store.step(G) as step:
        step.update("head", head, step.put("blob", b"retry me"))
        step.commit("right one")
    assert _open(store.root).get(oid) == b"retry me"


def test_removing_a_group_leaves_nothing_that_reads_as_it(tmp_path):
    store = _open(str(tmp_path / "s"))
    head = _step(store, 0, None)
    fold_step_logs(store)
    _step(store, 1, head)
    store.refs.remove_group(G)
    fresh = _open(store.root)
    assert not fresh.refs.read(G).exists and G not in list(fresh.refs.groups())
    for p in (fresh.refs.ref_path(G), fresh.refs.steps_path(G), fresh.refs.log_path(G)):
        assert not os.path.exists(p)


def test_an_aborted_gc_loses_no_object_a_step_log_held(tmp_path, monkeypatch):
    import importlib

    gcm = importlib.import_module("kxen_agent.store.gc")  # the package's `gc` name is the function
    GcAborted, gc = gcm.GcAborted, gcm.gc

    root = str(tmp_path / "s")
    store = _open(root)
    head = _step(store, 0, None)
    real = gcm._phase2
    lost = encode_object("blob", b"never written")

    def phase2(*a, **kw):  # another writer commits a ref to a missing object: phase 2's check aborts gc
        other = _open(root)
        m = other.put("message", {"role": "user", "content": "x", "blob": lost.id})
        other.refs.transaction("sessions/ses_b", [RefUpdate("head", None, m)], reason="broken")
        return real(*a, **kw)

    monkeypatch.setattr(gcm, "_phase2", phase2)
    with pytest.raises(GcAborted):
        gc(store, prune="now", always_pack=True)
    fresh = _open(root)
    assert fresh.get(head, "message")["content"] == "step 0"
    assert fresh.has(fresh.get(head, "message")["blob"])
    problems = {(p.kind, p.where) for p in fsck(fresh).problems}
    assert all("ses_b" in w or k == "broken-link" for k, w in problems), problems  # only the broken group


def test_a_damaged_group_does_not_stop_the_others_from_folding(tmp_path):
    store = _open(str(tmp_path / "s"))
    heads = {}
    for g in ("sessions/ses_a", "sessions/ses_b"):
        with store.step(g) as step:
            oid = step.put("blob", g.encode())
            step.update("head", None, oid)
            step.commit("one")
        heads[g] = oid
    fold_step_logs(store)
    for g in heads:
        with store.step(g) as step:
            oid = step.put("blob", g.encode() + b" 2")
            step.update("head", heads[g], oid)
            step.commit("two")
    log = store.refs.log_path("sessions/ses_a")
    with open(log, "r+b") as f:
        f.truncate(os.path.getsize(log) - 10)  # damage: shorter than its ref file records
    rep = fold_step_logs(_open(store.root))
    assert rep.groups == ["sessions/ses_b"]
    fresh = _open(store.root)
    assert fresh.refs.read("sessions/ses_b").steps_gen == 2 and not fresh.refs.read("sessions/ses_b").tail
    with pytest.raises(CorruptRef):
        fresh.refs.reflog("sessions/ses_a")


def test_putting_again_what_a_step_log_holds_writes_nothing(tmp_path):
    store = _open(str(tmp_path / "s"))
    _step(store, 0, None)
    assert store.put_raw(encode_object("blob", b"output 0 " + b"x" * 2000)) is False  # already in the log's record
    assert list(store.loose.iter_ids()) == []


def test_a_log_replaced_by_a_file_with_the_same_inode_number_is_read_again(tmp_path):
    # A checkpoint in another process replaces the log, and the new file can
    # get the old one's inode number (freed by the rename): same (device,
    # inode), another generation. Made here by folding a copy of the state
    # dir and writing its files back, the step log into the very same inode.
    store = _open(str(tmp_path / "s"))
    head = None
    for n in range(3):
        head = _step(store, n, head)
    path = store.refs.steps_path(G)
    assert store.refs.read(G).refs["head"] == head  # cached: 3 records of generation 0
    copy = str(tmp_path / "copy")
    shutil.copytree(store.root, copy)
    fold_step_logs(_open(copy))
    for d, _, files in os.walk(copy):
        for name in files:
            src = os.path.join(d, name)
            dst = os.path.join(store.root, os.path.relpath(src, copy))
            if dst == path:
                with open(dst, "r+b") as f:  # the same inode, the new generation's bytes
                    f.truncate(0)
                    f.write(open(src, "rb").read())
            elif not os.path.exists(dst) or "refs" in dst or "logs" in dst:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
    st = store.refs.read(G)
    assert st.refs["head"] == head and st.steps_gen == 1 and not st.tail
    head = _step(store, 3, head)  # and the writer appends to generation 1
    assert _open(store.root).refs.read(G).refs["head"] == head
    assert fsck(_open(store.root)).clean
