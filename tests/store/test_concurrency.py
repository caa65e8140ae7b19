"""Real processes and threads racing on one ref group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from kxen_agent.store import LockBusy, Store, fsck

N = 200
GROUP = "bench/counter"

_WRITER = r"""
import os, sys, time
from kxen_agent.store import RefConflict, Store
root, group, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store = Store(root)  # opened after the barrier: both may initialise the state dir
ref_path = store.refs.ref_path(group)
conflicts = 0
for i in range(n):
    if i == n // 2:
        # Half way: wait for a checkpoint of the group (the folder's), so that
        # checkpoints certainly happen while both writers are at work.
        while not os.path.exists(ref_path):
            time.sleep(0.005)  # a poll: the folder is what ends the wait
    while True:
        cur = store.refs.get(group, "counter")
        count = store.get(cur, "message")["n"] if cur is not None else 0
        # A durable step (objects_spec.md §6.8): the object and the ref change in one step-log record.
        with store.step(group) as step:
            step.update("counter", cur, step.put("message", {"n": count + 1, "by": who, "prev": cur}))
            try:
                step.commit(f"{who} {count + 1}")
                break
            except RefConflict:
                conflicts += 1
print(conflicts, flush=True)
"""

_FOLDER = r"""
import select, sys, time
from kxen_agent.store import Store
from kxen_agent.store.autopack import AutoPacker
root = sys.argv[1]
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
store = Store(root)
while not store.exists:  # the writers make the state dir (a poll)
    time.sleep(0.005)
    store = Store(root)
packer = AutoPacker(store, 1, background=False)
folded = 0
stop = False
while True:
    # Automatic packing as a run's background pass does it: pack, fold the step logs, unlink loose copies.
    folded += packer.pack_now().folded
    if stop:
        break
    if select.select([sys.stdin], [], [], 0.02)[0]:  # paced only; the writers' order does not depend on it
        assert sys.stdin.readline() == "stop\n"
        stop = True  # one more pass: whatever the writers committed last is folded too
print(folded, flush=True)
"""

_READER = r"""
import sys, time
from kxen_agent.store import Store
from kxen_agent.store.refs import format_ref_file, parse_ref_file
root, group, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store(root)
ref_path = store.refs.ref_path(group)
reads, last, seen, gens = 0, 0, set(), set()
deadline = time.monotonic() + 120
print("ready", flush=True)
while time.monotonic() < deadline:
    # The ref file, whenever there is one, is whole: only ever replaced by a rename.
    try:
        with open(ref_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        pass
    else:
        base = parse_ref_file(data, group, ref_path)  # a torn file raises CorruptRef
        assert format_ref_file(base.refs, base.fence, base.log_size, base.deleted_ns, base.steps_gen) == data
    # The group's state: its ref file, then its step log's committed records (§6.8);
    # the reflog checked against that one snapshot.
    state = store.refs.read(group)
    if not state.exists:
        continue
    log = store.refs.reflog(group, state)
    cur = state.refs["counter"]
    n = store.get(cur, "message")["n"]
    assert len(log) == n and log[-1].new == cur, (len(log), n)
    assert n >= last, (n, last)
    last = n
    reads += 1
    seen.add(n)
    gens.add(state.steps_gen)
    if n == total:
        break
print(reads, len(seen), last, len(gens), flush=True)
"""


def _spawn(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
def test_two_processes_cas_increment_one_ref(state_dir):
    # Two writers, each step a step-log record; a third process packs and
    # folds the log into the ref file (checkpoints) meanwhile, and a reader
    # watches the group throughout.
    root = str(state_dir)
    reader = _spawn(_READER, root, GROUP, str(2 * N))
    folder = _spawn(_FOLDER, root)
    writers = [_spawn(_WRITER, root, GROUP, who, str(N)) for who in ("w1", "w2")]
    procs = [reader, folder, *writers]
    try:
        for p in procs:
            assert p.stdout.readline() == "ready\n", p.stderr.read()
        for w in (folder, *writers):
            w.stdin.write("go\n")
            w.stdin.flush()
        for w in writers:
            _, err = w.communicate(timeout=300)
            assert w.returncode == 0, err
        folder.stdin.write("stop\n")
        folder.stdin.flush()
        folded_out, err = folder.communicate(timeout=120)
        assert folder.returncode == 0, err
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    reads, versions, last, gens = map(int, out.split())
    assert last == 2 * N
    assert versions > 1  # the reader really watched the ref move
    assert gens > 1  # ... and the ref file being checkpointed
    assert int(folded_out) >= 2  # one before the writers' half-way wait ended, one at least after

    store = Store(root)
    state = store.refs.read(GROUP)
    assert state.steps_gen >= 2 and not state.tail  # the last pass folded every record
    log = store.refs.reflog(GROUP)
    assert len(log) == 2 * N
    assert log[0].old is None
    for prev, entry in zip(log, log[1:]):
        assert entry.old == prev.new  # an unbroken old -> new chain
    final = store.refs.get(GROUP, "counter")
    assert final == log[-1].new
    # Walk the objects back along "prev": 2N increments, N by each writer.
    by = {"w1": 0, "w2": 0}
    cur, expect = final, 2 * N
    while cur is not None:
        value = store.get(cur, "message")
        assert value["n"] == expect
        by[value["by"]] += 1
        cur, expect = value["prev"], expect - 1
    assert expect == 0 and by == {"w1": N, "w2": N}
    for i, entry in enumerate(log, 1):
        value = store.get(entry.new, "message")
        assert value["n"] == i and entry.reason == f"{value['by']} {i}"
    rep = fsck(store)
    assert rep.clean, rep.problems
    assert rep.reachable == 2 * N


_INIT = r"""
import sys
from kxen_agent.store import Store
root, i = sys.argv[1], sys.argv[2]
print("ready", flush=True)
assert sys.stdin.readline() == "go\n"
Store(root).put("blob", b"from %s" % i.encode())
"""


@pytest.mark.slow
def test_processes_initialising_one_state_dir_at_once(tmp_path):
    # Each process sees the dir absent or half-created (a FORMAT temp file,
    # or FORMAT plus objects/); none may mistake it for a foreign directory.
    for round_ in range(3):
        root = str(tmp_path / f"state{round_}")
        procs = [_spawn(_INIT, root, str(i)) for i in range(6)]
        try:
            for p in procs:
                assert p.stdout.readline() == "ready\n"
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            results = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (_, err) in zip(procs, results):
            assert p.returncode == 0, err
        store = Store(root)
        assert len(list(store.iter_ids())) == 6
        assert fsck(store).clean


def test_threads_of_one_process_exclude_each_other(store: Store):
    store.ensure_initialized()
    inside = 0
    overlaps = 0
    entries = 0
    errors: list[BaseException] = []

    def critical() -> None:
        nonlocal inside, overlaps, entries
        inside += 1
        entries += 1
        if inside != 1:
            overlaps += 1
        time.sleep(0)  # give the other thread every chance to barge in
        if inside != 1:
            overlaps += 1
        inside -= 1

    start = threading.Barrier(2)

    def worker(use_lock: bool) -> None:
        try:
            start.wait(30)
            for _ in range(300):
                if use_lock:
                    with store.lock_group("t/g", timeout=30):
                        critical()
                else:
                    critical()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        # Control: without the lock the detector does see overlaps.
        ts = [threading.Thread(target=worker, args=(False,)) for _ in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert overlaps > 0
        overlaps = entries = 0
        ts = [threading.Thread(target=worker, args=(True,)) for _ in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert entries == 600 and overlaps == 0


def test_a_thread_cannot_take_a_lock_its_sibling_holds(store: Store):
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with store.lock_group("t/g"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(30)
        with pytest.raises(LockBusy):
            with store.lock_group("t/g", timeout=0):
                pass
        t0 = time.monotonic()
        with pytest.raises(LockBusy) as ei:
            with store.lock_group("t/g", timeout=0.2):
                pass
        assert time.monotonic() - t0 >= 0.2
        assert store.refs.lock_path("t/g") in str(ei.value)
        # Another group is independent.
        with store.lock_group("t/other", timeout=0):
            pass
    finally:
        release.set()
        t.join()
    with store.lock_group("t/g", timeout=0):
        pass


_HOLDER = r"""
import sys, time
from kxen_agent.store import Store
with Store(sys.argv[1]).lock_group(sys.argv[2]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_killed_holder_does_not_block_the_next_locker(store: Store):
    store.ensure_initialized()
    p = _spawn(_HOLDER, store.root, "t/g")
    try:
        assert p.stdout.readline() == "locked\n", p.stderr.read()
        with pytest.raises(LockBusy):  # really held by the other process
            with store.lock_group("t/g", timeout=0):
                pass
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
        t0 = time.monotonic()
        with store.lock_group("t/g", timeout=5):
            waited = time.monotonic() - t0
        assert waited < 5
        assert os.path.exists(store.refs.lock_path("t/g"))  # left behind, harmless
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
