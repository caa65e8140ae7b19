"""gc: packing, the grace period, roots, deleted groups, aborts, and the store lock — with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from kxen_agent.cli import main as cli_main
from kxen_agent.cli.store_cmds import register
from kxen_agent.store import Store, fsck
from kxen_agent.store.fsio import TracingIO
from kxen_agent.store.gc import BadDuration, GcAborted, gc as gc_as_the_cli_runs_it, parse_duration
from kxen_agent.store.locks import LockBusy
from kxen_agent.store.objects import encode_object
from kxen_agent.store.refs import RefUpdate

DAY = 86400.0


def gc(store: Store, **kw):
    """gc as these tests of the pack mechanics need it: it always writes its pack.

    Their stores hold a handful of objects, which the CLI's gc leaves loose
    (a pack would not be smaller); ``test_gc_never_grows_*`` test that rule.
    """
    return gc_as_the_cli_runs_it(store, always_pack=True, **kw)


def history(store: Store, group: str, n: int, *, tag: str = "", head: bytes | None = None) -> list[bytes]:
    """``n`` messages chained by ``parent``, each with a blob; the group's head moved to the last."""
    ids = []
    with store.batch():  # loose objects, named by the ref below
        prev = head
        for i in range(n):
            blob = store.put("blob", f"{tag} output {i}\n".encode() * 3)
            v = {"text": f"{tag} message {i}", "out": blob}
            if prev is not None:
                v["parent"] = prev
            prev = store.put("message", v)
            ids += [blob, prev]
    store.refs.transaction(group, [RefUpdate("head", head if head else None, prev)], reason="test")
    return ids


def garbage(store: Store, n: int, tag: str = "g") -> list[bytes]:
    return [store.put("blob", f"garbage {tag} {i}".encode()) for i in range(n)]


def snapshot(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".lock"):
                continue
            st = os.stat(os.path.join(d, f))
            out[os.path.relpath(os.path.join(d, f), root)] = (st.st_size, st.st_mtime_ns)
    return out


def loose_ids(store: Store) -> set[bytes]:
    return set(store.loose.iter_ids())


def packs(store: Store) -> list[str]:
    return sorted(n for n in os.listdir(store.pack_dir)) if os.path.isdir(store.pack_dir) else []


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize("text,seconds", [("2w", 14 * DAY), ("3d", 3 * DAY), ("12h", 43200), ("30m", 1800), ("45s", 45),
                                          ("1d12h", 1.5 * DAY), ("0", 0), ("now", 0), ("NOW", 0), ("never", None),
                                          ("00000000000001s", 1), ("5217w", 5217 * 7 * DAY)])
def test_prune_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "w", "2x", "-1d", "1.5d", "2 ww", "yesterday"])
def test_bad_prune_durations_are_usage_errors(text):
    with pytest.raises(BadDuration, match="invalid --prune value"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["5218w", "36526d", "99999999999999999999w", "9" * 5000 + "s"])
def test_prune_durations_past_100_years_are_usage_errors(text):
    with pytest.raises(BadDuration, match="longer than 100 years"):
        parse_duration(text)


# ------------------------------------------------------------------ packing and pruning


def test_gc_packs_what_is_reachable_and_keeps_young_garbage_loose(tmp_path):
    store = Store(str(tmp_path / "s"))
    reach = history(store, "ses/a", 10)
    junk = garbage(store, 5)
    rep = gc(store)
    assert rep.packed == len(reach) == rep.reachable
    assert rep.loose_removed == len(reach) and rep.pruned == 0 and rep.kept_unreachable == len(junk)
    assert loose_ids(store) == set(junk)
    assert len([p for p in packs(store) if p.endswith(".idx")]) == 1
    for oid in reach + junk:
        assert Store(store.root).read_raw(oid)
    assert fsck(Store(store.root)).clean
    # A second gc has nothing to do and changes nothing.
    before = snapshot(store.root)
    rep2 = gc(store)
    assert (rep2.packed, rep2.loose_removed, rep2.pruned, rep2.packs_removed) == (0, 0, 0, 0)
    assert snapshot(store.root) == before


def test_unreachable_objects_go_only_after_the_grace_period(tmp_path):
    store = Store(str(tmp_path / "s"))
    reach = history(store, "ses/a", 5)
    junk = garbage(store, 4)
    now = time.time()
    rep = gc(store, prune="2w", now=now + 13 * DAY)
    assert rep.pruned == 0 and loose_ids(store) == set(junk)
    rep = gc(store, prune="2w", now=now + 15 * DAY)
    assert rep.pruned == len(junk) and loose_ids(store) == set()
    s2 = Store(store.root)
    assert all(s2.has(o) for o in reach) and not any(s2.has(o) for o in junk)
    assert fsck(s2).clean


def test_prune_never_keeps_everything(tmp_path):
    store = Store(str(tmp_path / "s"))
    history(store, "ses/a", 3)
    junk = garbage(store, 3)
    rep = gc(store, prune="never", now=time.time() + 1000 * DAY)
    assert rep.pruned == 0 and set(junk) <= loose_ids(store)


def test_objects_named_by_reflogs_are_roots(tmp_path):
    store = Store(str(tmp_path / "s"))
    first = history(store, "ses/a", 4, tag="first")
    old_head = first[-1]
    # Move the head to an unrelated history: the old one is only in the reflog now.
    new = history(store, "ses/b", 2, tag="second")
    store.refs.transaction("ses/a", [RefUpdate("head", old_head, new[-1])], reason="rewind")
    rep = gc(store, prune="now")
    s2 = Store(store.root)
    assert all(s2.has(o) for o in first + new) and rep.pruned == 0
    assert fsck(s2).clean


def logical(root: str) -> tuple[dict, dict]:
    """What a state dir holds, whatever its files: each group's refs, fence, mark and reflog; each object's bytes."""
    s = Store(root)
    groups = {}
    for g in s.refs.groups():
        st = s.refs.read(g)
        groups[g] = (st.refs, st.fence, st.deleted_ns, s.refs.reflog(g, st))
    return groups, {oid: s.read_raw(oid).raw for oid in s.iter_ids()}


def test_gc_aborts_and_changes_nothing_when_a_reachable_object_is_missing(tmp_path):
    store = Store(str(tmp_path / "s"))
    history(store, "ses/a", 3)
    garbage(store, 3)
    lost = encode_object("blob", b"never written")
    msg = store.put("message", {"text": "points at nothing", "out": lost.id})
    store.refs.transaction("ses/b", [RefUpdate("head", None, msg)], reason="broken")
    with store.step("ses/d") as step:  # a durable step: its object in its step-log record
        carried = step.put("blob", b"carried by a step record")
        step.update("head", None, carried)
        step.commit("a step")
    assert store.steps.has(carried) and carried not in loose_ids(store)

    # Format 3: step records are pending (ses/d's carries its object); gc
    # aborts in phase 1, before its pack and before it folds the step logs
    # (objects_spec.md §12.11): not a byte changes.
    before, content = snapshot(store.root), logical(store.root)
    with pytest.raises(GcAborted, match=lost.hex):
        gc(store, prune="now", now=time.time() + 100 * DAY)
    assert snapshot(store.root) == before
    assert logical(store.root) == content
    assert not packs(store) and store.steps.has(carried)

    store.refs.transaction("ses/c", [RefUpdate("head", None, lost.id)], reason="broken too")
    store.refs.transaction("ses/b", [RefUpdate("head", msg, None)], reason="repair b")
    before, content = snapshot(store.root), logical(store.root)
    with pytest.raises(GcAborted, match="is missing"):
        gc(store, prune="now")
    assert snapshot(store.root) == before
    assert logical(store.root) == content


def test_a_deleted_group_goes_only_after_the_grace_period_and_an_undeleted_one_never(tmp_path):
    store = Store(str(tmp_path / "s"))
    kept = history(store, "ses/kept", 3, tag="kept")
    gone = history(store, "ses/gone", 3, tag="gone")
    store.refs.transaction("ses/gone", [], reason="session: delete", deleted_ns=time.time_ns())
    now = time.time()
    rep = gc(store, prune="2w", now=now + 13 * DAY)
    assert rep.groups_removed == [] and store.refs.read("ses/gone").exists
    assert all(Store(store.root).has(o) for o in gone)
    rep = gc(store, prune="2w", now=now + 15 * DAY)
    assert rep.groups_removed == ["ses/gone"]
    assert not os.path.exists(store.refs.ref_path("ses/gone")) and not os.path.exists(store.refs.log_path("ses/gone"))
    assert not os.path.exists(store.refs.steps_path("ses/gone"))  # its step log too (§6.7)
    s2 = Store(store.root)
    assert not any(s2.has(o) for o in gone) and all(s2.has(o) for o in kept)
    assert list(s2.refs.groups()) == ["ses/kept"]
    # A group that is not marked deleted is never removed, however old.
    gc(store, prune="now", now=now + 10_000 * DAY)
    assert list(Store(store.root).refs.groups()) == ["ses/kept"] and fsck(Store(store.root)).clean


def test_unreachable_objects_of_a_young_replaced_pack_become_loose_with_its_age(tmp_path):
    store = Store(str(tmp_path / "s"))
    gone = history(store, "ses/gone", 3, tag="gone")
    gc(store)  # pack O holds ses/gone's history
    (old_idx,) = [p for p in packs(store) if p.endswith(".idx")]
    t0 = time.time()
    store.refs.transaction("ses/gone", [], reason="delete", deleted_ns=time.time_ns())
    history(store, "ses/new", 2, tag="new")  # something loose to pack: O gets replaced
    now = t0 + 15 * DAY
    young = now - 1 * DAY
    os.utime(os.path.join(store.pack_dir, old_idx[:-4] + ".pack"), (young, young))
    rep = gc(store, prune="2w", now=now)
    assert rep.groups_removed == ["ses/gone"] and rep.packs_removed == 1
    assert rep.exploded == len(gone) and set(gone) <= loose_ids(store)
    assert {round(os.stat(store.loose.path(o)).st_mtime) for o in gone} == {round(young)}
    rep = gc(store, prune="2w", now=now + 14 * DAY)
    assert rep.pruned == len(gone) and not (set(gone) & loose_ids(store))
    assert fsck(Store(store.root)).clean


def test_writing_a_packed_object_again_freshens_its_pack(tmp_path):
    store = Store(str(tmp_path / "s"))
    history(store, "ses/a", 2)
    gc(store)
    (pack,) = [os.path.join(store.pack_dir, p) for p in packs(store) if p.endswith(".pack")]
    os.utime(pack, (1_000_000, 1_000_000))
    store = Store(store.root)
    assert store.put("blob", b" output 0\n" * 3) and not loose_ids(store)
    assert os.stat(pack).st_mtime > time.time() - 60


def test_the_times_the_grace_period_is_judged_by_are_set_through_the_seam(tmp_path):
    # The three utime calls gc's grace period depends on (an object written
    # again, loose or packed; an exploded object keeping its pack's age) are
    # operations of the store's FileIO: traced, and failed by a fault injector.
    io = TracingIO(sync=False)
    store = Store(str(tmp_path / "s"), io=io)
    gone = history(store, "ses/gone", 3, tag="gone")
    gc(store)
    (old_pack,) = [os.path.join(store.pack_dir, p) for p in packs(store) if p.endswith(".pack")]
    t0 = time.time()
    store.refs.transaction("ses/gone", [], reason="delete", deleted_ns=time.time_ns())
    history(store, "ses/new", 2, tag="new")
    again = store.put("blob", b"new output 0\n" * 3)  # loose, written again: its file is touched
    store.put("blob", b"gone output 0\n" * 3)  # packed, written again: its pack is touched
    before = [op.path for op in io.trace if op.kind == "utime"]
    assert store.loose.path(again) in before and old_pack in before
    now = t0 + 15 * DAY
    young = now - 1 * DAY
    os.utime(old_pack, (young, young))
    mark = io.mark()
    rep = gc(store, prune="2w", now=now)
    assert rep.exploded == len(gone)
    exploded = {op.path for op in io.trace[mark:] if op.kind == "utime"}
    assert exploded == {store.loose.path(o) for o in gone}
    assert {round(os.stat(p).st_mtime) for p in exploded} == {round(young)}


def test_stale_temp_files_and_orphan_packs_are_removed_after_the_grace_period(tmp_path):
    store = Store(str(tmp_path / "s"))
    history(store, "ses/a", 2)
    gc(store)
    old = time.time() - 30 * DAY
    stale = [os.path.join(store.pack_dir, "tmp_pack_dead"), os.path.join(store.pack_dir, "pack-" + "ab" * 32 + ".pack"),
             os.path.join(os.path.dirname(store.loose.path(b"\x12" * 32)), "tmp_0123")]
    fresh = os.path.join(store.pack_dir, "tmp_pack_inflight")
    for p in stale + [fresh]:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "wb").write(b"x")
    for p in stale:
        os.utime(p, (old, old))
    rep = gc(store)
    assert rep.tmp_removed == 3 and not any(os.path.exists(p) for p in stale) and os.path.exists(fresh)


def test_gc_does_not_create_a_state_dir(tmp_path):
    rep = gc(Store(str(tmp_path / "none")))
    assert rep.packed == 0 and not os.path.exists(tmp_path / "none")


# ------------------------------------------------------------------ processes

WRITER = r"""
import json, os, sys
from kxen_agent.store import Store
root, n = sys.argv[1], int(sys.argv[2])
s = Store(root)
head, heads = None, []
for i in range(n):
    with s.step("ses/w") as step:  # objects and the ref in one step: gc's prune cannot fall in between
        blob = step.put("blob", os.urandom(32) + b" output %d" % i)
        v = {"i": i, "out": blob}
        if head:
            v["parent"] = head
        m = step.put("message", v)
        step.update("head", head, m)
        step.commit("w")
    head = m
    heads.append(m.hex())
    s.put("blob", b"garbage %d " % i + os.urandom(8))  # never referenced: prunable
    if i == 0:
        print("ready", flush=True)
print(json.dumps(heads), flush=True)
"""


def test_gc_again_and_again_while_another_process_writes_loses_nothing(tmp_path):
    root = str(tmp_path / "s")
    store = Store(root)
    history(store, "ses/base", 5)
    p = subprocess.Popen([sys.executable, "-c", WRITER, root, "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip() == b"ready", p.stderr.read()
        runs = 0
        pruned = 0
        while p.poll() is None:
            rep = gc(Store(root), prune="now")
            runs += 1
            pruned += rep.pruned
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err.decode()
    assert runs >= 2 and pruned > 0  # gc really ran against the writer, and pruned its garbage
    gc(Store(root), prune="now")
    heads = [bytes.fromhex(h) for h in json.loads(out.splitlines()[-1])]
    s = Store(root)
    rep = fsck(s)
    assert rep.clean, [p.line() for p in rep.problems]
    assert rep.dangling == []
    # Every head ever committed is still there, and the final chain is whole.
    assert all(s.has(h) for h in heads)
    n, cur = 0, s.refs.get("ses/w", "head")
    while cur is not None:
        v = s.get(cur, "message")
        assert s.get(v["out"], "blob")
        n += 1
        cur = v.get("parent")
    assert n == len(heads) == 120


READER = r"""
import sys
from kxen_agent.store import Store
s = Store(sys.argv[1])
ids = [bytes.fromhex(x) for x in open(sys.argv[2]).read().split()]
assert all(s.read_raw(i) for i in ids)
print("ready", len(s.packs), flush=True)
sys.stdin.readline()
assert all(s.read_raw(i).id == i for i in ids)
print("ok", len(s.packs), flush=True)
"""


def test_a_reader_with_an_old_pack_list_still_finds_everything_after_gc(tmp_path):
    root = str(tmp_path / "s")
    store = Store(root)
    a = history(store, "ses/a", 8, tag="a")
    gc(store)  # pack O
    b = history(store, "ses/b", 8, tag="b")  # loose
    old = packs(store)
    ids = tmp_path / "ids"
    ids.write_text(" ".join(o.hex() for o in a + b))
    p = subprocess.Popen([sys.executable, "-c", READER, root, str(ids)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline().split() == [b"ready", b"1"], p.stderr.read()
        rep = gc(Store(root), prune="now")
        assert rep.packs_removed == 1 and rep.loose_removed == len(b)
        assert not set(old) & set(packs(Store(root)))  # the pack the reader holds is gone
        out, err = p.communicate(b"go\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err.decode()
    assert out.split() == [b"ok", b"1"]  # it reloaded: the one pack it now has is the new one


HOLD = r"""
import sys
from kxen_agent.store import Store
from kxen_agent.store.locks import file_lock
root, mode = sys.argv[1], sys.argv[2]
s = Store(root)
if mode == "shared":
    cm = s.shared_lock()
elif mode == "exclusive":
    cm = s.pruning()
elif mode == "gc-run":
    cm = file_lock(root + "/locks/gc-run.lock")
elif mode == "churn":  # back-to-back writers, as a busy agent
    import select
    n = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        with s.shared_lock():
            s.put("blob", b"churn %d" % n)
            n += 1
        if n == 20:
            print("held", flush=True)
    print("entered", n, flush=True)
    sys.exit(0)
with cm:
    print("held", flush=True)
    sys.stdin.readline()
"""


def _hold(root: str, mode: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, root, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"held", p.stderr.read()
    return p


def _release(p: subprocess.Popen) -> bytes:
    out, err = p.communicate(b"\n", timeout=30)
    assert p.returncode == 0, err.decode()
    return out


def test_pruning_waits_for_writers_and_writers_wait_for_pruning(tmp_path):
    root = str(tmp_path / "s")
    store = Store(root, lock_timeout=0.3)
    store.ensure_initialized()
    p = _hold(root, "shared")
    with store.shared_lock():  # writers share
        pass
    with pytest.raises(LockBusy, match="gc.lock"):
        with store.pruning(timeout=0.3):
            pass
    _release(p)
    with store.pruning(timeout=5):
        pass

    p = _hold(root, "exclusive")
    t0 = time.monotonic()
    with pytest.raises(LockBusy):
        store.put("blob", b"blocked while gc prunes")
    assert time.monotonic() - t0 < 5
    with pytest.raises(LockBusy):
        store.refs.transaction("ses/x", [RefUpdate("head", None, b"\x01" * 32)], reason="blocked")
    _release(p)
    assert store.put("blob", b"after gc")


def test_gc_gets_its_turn_among_back_to_back_writers(tmp_path):
    # Three processes writing back to back keep the shared side held almost
    # all the time; without the gate gc would poll for a gap that never comes.
    root = str(tmp_path / "s")
    store = Store(root)
    store.ensure_initialized()
    writers = [_hold(root, "churn") for _ in range(3)]
    try:
        t0 = time.monotonic()
        with store.pruning(timeout=30):
            waited = time.monotonic() - t0
            before = len(list(Store(root).loose.iter_ids()))
            assert len(list(Store(root).loose.iter_ids())) == before  # nobody writes while gc holds it
    finally:
        outs = [_release(p) for p in writers]
    assert all(int(o.split()[1]) >= 20 for o in outs)
    assert waited < 5, waited


def test_one_gc_at_a_time(tmp_path):
    root = str(tmp_path / "s")
    store = Store(root)
    history(store, "ses/a", 2)
    p = _hold(root, "gc-run")
    try:
        with pytest.raises(LockBusy, match="gc-run.lock"):
            gc(store)
    finally:
        _release(p)
    assert gc(store).packed == 4


def test_the_store_lock_between_threads_of_one_process(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.ensure_initialized()
    inside, leave = threading.Event(), threading.Event()

    def writer():
        with store.shared_lock():
            with store.step("ses/t"):  # re-entrant: a step takes the shared lock again
                inside.set()
                leave.wait(10)

    t = threading.Thread(target=writer)
    t.start()
    inside.wait(10)
    with pytest.raises(LockBusy):
        with store.pruning(timeout=0.2):
            pass
    with store.shared_lock(timeout=1):  # another thread shares
        with pytest.raises(RuntimeError, match="inside a step or Store.shared_lock"):
            with store.pruning(timeout=0.2):
                pass
    leave.set()
    t.join()
    with store.pruning(timeout=5):
        assert store.put("blob", b"gc itself may write")  # the exclusive owner enters the shared side


# ------------------------------------------------------------------ CLI


def _cli(capsys, monkeypatch, state: str, *args: str) -> tuple[int, str, str]:
    register(cli_main.app)
    monkeypatch.setenv("KXEN_AGENT_STATE_DIR", state)
    code = cli_main.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_gc_command(tmp_path, capsys, monkeypatch):
    root = str(tmp_path / "s")
    store = Store(root)
    history(store, "ses/a", 3)
    garbage(store, 2)
    code, out, err = _cli(capsys, monkeypatch, root, "gc", "--json")
    assert code == 0 and err == ""
    rep = json.loads(out)
    assert rep["packedObjects"] == 6 and rep["keptUnreachable"] == 2 and rep["prune"] == "2w"
    assert rep["packSkipped"] is None and rep["bytesAfter"] < rep["bytesBefore"]
    assert set(rep) >= {"stateDir", "reachable", "pack", "looseRemoved", "pruned", "groupsRemoved", "bytesBefore", "bytesAfter"}
    code, out, err = _cli(capsys, monkeypatch, root, "gc", "--prune=now")
    assert code == 0 and "pruned 2 unreachable objects" in out and err == ""
    code, out, err = _cli(capsys, monkeypatch, root, "gc", "--prune=fortnight")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "invalid --prune value" in err

def _bytes(store: Store) -> int:
    """Disk usage of the objects, as du counts it (the measure gc decides and reports by).

    In format 3 objects live in step logs too (objects_spec.md §6.8): ``objects/`` and ``steps/``.
    """
    total = 0
    for top in ("objects", "steps"):
        for dirpath, _dirs, files in os.walk(os.path.join(store.root, top)):
            total += sum(os.lstat(os.path.join(dirpath, f)).st_blocks * 512 for f in files)
    return total


def test_gc_never_grows_the_store(tmp_path):
    # One message and its blob: two loose blocks, which a pack and its index cannot beat.
    tiny = Store(str(tmp_path / "tiny"))
    history(tiny, "ses/a", 1)
    before = _bytes(tiny)
    rep = gc_as_the_cli_runs_it(tiny)
    assert rep.pack is None and "would not be smaller" in rep.pack_skipped
    assert _bytes(tiny) == before == rep.bytes_before == rep.bytes_after
    assert fsck(tiny).clean
    # A conversation's worth: the pack is smaller, and written.
    store = Store(str(tmp_path / "s"))
    history(store, "ses/a", 200)
    before = _bytes(store)
    rep = gc_as_the_cli_runs_it(store)
    assert rep.pack is not None and rep.pack_skipped is None and rep.bytes_after == _bytes(store) < before
    # Already packed: gc again writes nothing; with a few loose objects more it never grows the store.
    rep = gc_as_the_cli_runs_it(store)
    assert rep.pack is None and rep.bytes_after == rep.bytes_before
    history(store, "ses/b", 2, tag="b")
    before = _bytes(store)
    rep = gc_as_the_cli_runs_it(store)
    assert rep.bytes_after <= before and _bytes(store) == rep.bytes_after
    assert fsck(store).clean
