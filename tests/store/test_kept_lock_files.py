"""Lock files kept open across holds through fasteners, and step logs kept open by their appender (issue 32).

A process opens each lock file once, through its kept ``fasteners`` lock, and
keeps the descriptor (objects_spec.md §8.1): these check that a kept
descriptor never locks a file the path no longer names, that two paths of
one file still exclude each other, that the kept descriptors stay bounded
and a held one is never closed, that a forked child starts with no lock
held, and that a step log kept open still sees other writers' records.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fasteners
import pytest

from kxen_agent.store import LockBusy, Store, file_lock, locks, store_lock

from .helpers import CLI_NAMESPACES

PROBE = ("import fcntl, os, sys\n"
         "fd = os.open(sys.argv[1], os.O_RDWR)\n"
         "how = fcntl.LOCK_SH if sys.argv[2] == 'sh' else fcntl.LOCK_EX\n"
         "try:\n"
         "    fcntl.lockf(fd, how | fcntl.LOCK_NB)\n"
         "    print('free')\n"
         "except OSError:\n"
         "    print('held')\n")


def _other_process_sees(path: Path, how: str = "ex") -> str:
    """'held' or 'free': whether another process could take the lock (``ex`` or ``sh``) on the file at ``path``."""
    return subprocess.run([sys.executable, "-c", PROBE, str(path), how], capture_output=True, text=True,
                          check=True).stdout.strip()


def _open_lock_files() -> int:
    return sum(1 for f in locks._files.values() if f.is_open)


def test_the_lock_is_fasteners_own_and_its_file_stays_open_between_holds(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "g.lock"
    with file_lock(str(path)) as lock:
        lf = lock._file
        assert isinstance(lf.ipl, fasteners.InterProcessLock)
        assert _other_process_sees(path) == "held"
    assert _other_process_sees(path) == "free"
    assert lf.is_open  # kept: the next hold neither opens nor closes it
    fd = lf.ipl.lockfile.fileno()
    with file_lock(str(path)) as lock:
        assert lock._file is lf and lf.ipl.lockfile.fileno() == fd
        assert _other_process_sees(path) == "held"
    assert _other_process_sees(path) == "free"


def test_a_lock_file_replaced_by_hand_is_locked_anew_not_through_the_old_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "g.lock"
    with file_lock(str(path)):
        assert _other_process_sees(path) == "held"
    assert _other_process_sees(path) == "free"
    path.unlink()  # by hand: the store never removes a lock file
    path.write_bytes(b"")
    with file_lock(str(path)):
        # The kept descriptor names the removed file: locking through it would leave this one free.
        assert _other_process_sees(path) == "held"
    assert _other_process_sees(path) == "free"


def test_two_paths_of_one_lock_file_exclude_each_other_in_one_process(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "locks").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with file_lock(str(real / "locks" / "g.lock")):
        with pytest.raises(LockBusy):
            with file_lock(str(tmp_path / "link" / "locks" / "g.lock"), timeout=0):
                pass
    with file_lock(str(tmp_path / "link" / "locks" / "g.lock"), timeout=0):
        assert _other_process_sees(real / "locks" / "g.lock") == "held"


def test_kept_descriptors_stay_bounded_and_a_held_one_is_never_closed(tmp_path: Path) -> None:
    held = tmp_path / "held.lock"
    with file_lock(str(held)):
        for i in range(3 * locks.KEEP_OPEN):
            with file_lock(str(tmp_path / f"g{i}.lock")):
                pass
        assert _open_lock_files() <= locks.KEEP_OPEN
        assert _other_process_sees(held) == "held"  # its descriptor was not closed under it
    assert _other_process_sees(held) == "free"


def test_the_store_lock_keeps_its_file_open_and_sees_a_replaced_one(tmp_path: Path) -> None:
    root = tmp_path / "state"
    lock = store_lock(str(root))
    gc_lock = root / "locks" / "gc.lock"
    with lock.shared(5):
        assert _other_process_sees(gc_lock, "ex") == "held" and _other_process_sees(gc_lock, "sh") == "free"
    kept = lock._ipl
    assert isinstance(kept, fasteners.InterProcessReaderWriterLock) and not kept.lockfile.closed
    with lock.exclusive(5):
        assert lock._ipl is kept and _other_process_sees(gc_lock, "sh") == "held"
    gc_lock.unlink()
    gc_lock.write_bytes(b"")
    with lock.shared(5):
        assert lock._ipl is not kept and _other_process_sees(gc_lock, "ex") == "held"
    assert _other_process_sees(gc_lock, "ex") == "free"


def test_a_forked_child_holds_nothing_and_can_take_the_lock_itself(tmp_path: Path) -> None:
    path = tmp_path / "g.lock"
    r, w = os.pipe()
    with file_lock(str(path)):
        pid = os.fork()
        if pid == 0:  # the child: it inherited no fcntl lock, and no held thread lock
            code = 1
            try:
                os.close(r)
                try:
                    with file_lock(str(path), timeout=0):
                        code = 2  # got it: wrong, the parent holds it
                except LockBusy:
                    code = 0
                os.write(w, bytes([code]))
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
        assert got == b"\x00"  # busy in the child: the parent's lock, seen through the child's own thread lock
        assert _other_process_sees(path) == "held"  # the child's exit closed its copies: the parent's lock stays


def test_a_log_kept_open_still_sees_another_writers_records_and_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path / "state")
    group = "sessions/ses_pinned"
    a, b = Store(root, namespaces=CLI_NAMESPACES), Store(root, namespaces=CLI_NAMESPACES)

    def step(store: Store, old: bytes | None, i: int) -> bytes:
        with store.step(group) as s:
            oid = s.put("blob", b"object %d" % i)
            s.update("head", old, oid)
            s.commit(f"step {i}")
        return oid

    h1 = step(a, None, 1)
    assert a.steps.load(group).pin is not None  # kept open by the process that appended
    h2 = step(b, h1, 2)  # another writer appends: same file, grown
    assert a.refs.read(group).refs["head"] == h2
    b.refs.checkpoint(group)  # replaces the log by a new generation: a new file
    h3 = step(b, h2, 3)
    assert a.refs.read(group).refs["head"] == h3
    assert a.steps.load(group).ident == b.steps.load(group).ident
    h4 = step(a, h3, 4)
    assert b.refs.read(group).refs["head"] == h4 and a.refs.read(group).refs["head"] == h4
