"""Any bundle that verifies resumes within 256 MiB (``runtime/history_bound.py``).

The bundle bounds (``test_bundle_bounds.py``) stop a bundle whose objects
are huge; they cannot stop one whose *history* is: a text blob is stored
once however many messages name it, so a bundle of a few KB — one 64 MiB
blob of one letter (within the floor every bundle has) and hundreds of user
messages naming it — verifies and imports under the default limits. Before
the view's bounds a ``--resume`` of it read the blob once per message and
held every copy: 625 MB for 8 messages, 2.4 GB for 36. Each case runs the
real CLI in a fresh process and reads its peak resident set (``VmHWM``, as
``tests/reliability/test_memory_bound.py`` does), under an address-space
limit of 1.5 GiB so that the old code fails fast instead of swapping.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kxen_agent.runtime.history import RunHistory
from kxen_agent.runtime.history_bound import ELIDED, HISTORY_CHARS, MESSAGE_CHARS
from kxen_agent.session import SessionStore
from kxen_agent.store import Store, codec
from kxen_agent.store.objects import decode_stored, encode_object, links_of
from tests.store.test_bundle_bounds import HB, letter_blob, real_session

ROOT = Path(__file__).resolve().parents[2]
LIMIT_KB = 256 << 10
AS_LIMIT = 3 << 29  # 1.5 GiB of address space

_HWM_HOOK = """
import atexit, os

def _write_hwm():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["KXEN_TEST_HWM_FILE"], "w") as out:
        out.write(kb)

if os.environ.get("KXEN_TEST_HWM_FILE"):
    atexit.register(_write_hwm)
"""


def shared_blob_bundle(tmp: Path, n: int) -> tuple[Path, str]:
    """A real session, then ``n`` user messages that all name one 64 MiB text blob: the bundle and the session."""
    ses, refs, objs = real_session(tmp)
    bid, frame, raw_len = letter_blob(0)
    entries = {bid: HB.entry(bid, frame, method=1, raw_len=raw_len)}
    links: dict[bytes, list[bytes]] = {bid: []}
    size = raw_len
    head = refs["head"]
    last = decode_stored(objs[head])
    seq = last["seq"]
    for _ in range(n):
        seq += 1
        msg = encode_object("message", {"seq": seq, "role": "user", "parent": head, "contentBlob": bid,
                                        "run": last["run"]})
        objs[msg.id] = msg
        head = msg.id
    for oid, o in objs.items():
        entries[oid] = HB.stored_entry(o)
        links[oid] = list(links_of(o.kind, decode_stored(o))) if o.kind != "blob" else []
        size += len(o.raw)
    new_refs = dict(refs, head=head)
    order: list[bytes] = []
    seen: set[bytes] = set()
    stack = [new_refs[k] for k in sorted(new_refs, reverse=True)]
    while stack:
        oid = stack.pop()
        if oid not in seen:
            seen.add(oid)
            order.append(oid)
            stack.extend(reversed(links[oid]))
    header = codec.encode({"capabilities": [], "objects": len(order), "refs": {f"sessions/{ses}": new_refs},
                           "size": size}, links_only=True)
    path = tmp / f"shared-{n}.kxb"
    path.write_bytes(HB.bundle(header, HB.pack_section([entries[o] for o in order])))
    return path, ses


def measured(args: list[str], tmp: Path) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in KiB) of one ``kxen-agent`` process under the address-space limit."""
    hook = tmp / "hwm-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_HWM_HOOK)
    hwm = tmp / "hwm.txt"
    hwm.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")}
    env.update(KXEN_AGENT_STATE_DIR=str(tmp / "state"), PYTHONPATH=f"{hook}{os.pathsep}{ROOT}",
               KXEN_TEST_HWM_FILE=str(hwm), XDG_CONFIG_HOME=str(tmp / "xdg"))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    done = subprocess.run([sys.executable, "-m", "kxen_agent", *args], env=env, cwd=tmp, capture_output=True,
                          text=True, preexec_fn=limit, timeout=300)
    return done.returncode, done.stdout, done.stderr, int(hwm.read_text()) if hwm.exists() else -1


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """600 messages naming one 64 MiB blob (a 127 KB bundle), verified and imported with the default limits."""
    tmp = tmp_path_factory.mktemp("shared")
    path, ses = shared_blob_bundle(tmp, 600)
    assert path.stat().st_size < 150_000
    code, _out, err, _rss = measured(["bundle", "verify", str(path)], tmp)
    assert code == 0, err
    ws = tmp / "src-ws"  # the session's own workspace (real_session made it)
    code, _out, err, rss = measured(["session", "import", str(path), "--workspace", str(ws)], tmp)
    assert code == 0, err
    assert rss < LIMIT_KB, rss
    # The bundle came from another state dir: its agent lock gets no key and
    # its calls do not run until this machine accepts them (issue 25).
    code, _out, err, rss = measured(["session", "trust", ses, "--yes"], tmp)
    assert code == 0, err
    assert rss < LIMIT_KB, rss
    return tmp, ses, ws


def test_resume_of_a_verified_bundle_stays_within_256_mib(imported: tuple[Path, str, Path]) -> None:
    tmp, ses, _ws = imported
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, out, err, rss = measured(["--resume", ses, "--task", "go on", "--json"], tmp)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert code == 0, err
    assert json.loads(out)["status"] == "completed", out
    assert 0 < rss < LIMIT_KB, f"--resume peaked at {rss} KiB"
    print(f"--resume of 600 messages naming one 64 MiB blob: peak {rss} KiB")
    # The blob is read for the newest few messages only (the view's 8 Mi characters), not 600 times.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 30, f"--resume took {cpu:.1f} s of CPU"


@contextlib.contextmanager
def address_space_room(room: int) -> Iterator[None]:
    """This process may map at most ``room`` more bytes meanwhile (a MemoryError, not the OOM killer, if not)."""
    with open("/proc/self/status") as f:
        vm = int(next(line.split()[1] for line in f if line.startswith("VmSize:"))) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + room, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_the_model_is_shown_the_newest_messages_within_the_bounds(imported: tuple[Path, str, Path]) -> None:
    tmp, ses, _ws = imported
    sessions = SessionStore(Store.open(str(tmp / "state"), namespaces=("sessions",)))
    info = sessions.get(ses)
    history = RunHistory(sessions)
    with address_space_room(1 << 30):
        shown = history.messages(info.head)
    assert len(shown) == len(history) > 600
    big = [m for m in shown if m is not ELIDED and len(m["content"] or "") > MESSAGE_CHARS // 2]
    assert len(big) == HISTORY_CHARS // MESSAGE_CHARS  # the newest eight, each cut to its head and tail
    assert all(m is not ELIDED for m in shown[-len(big):])
    assert "characters of this message not shown: one message shows at most 1048576" in big[0]["content"]
    assert big[0]["content"].startswith("0 aaaa") and big[0]["content"].endswith("aaaa")
    assert sum(len(m["content"] or "") for m in shown if m is not ELIDED) < HISTORY_CHARS + 2 * MESSAGE_CHARS
    k = sum(1 for m in shown if m is not ELIDED)  # the newest k are shown (with what --resume runs added)
    assert k < 16 and all(m is ELIDED for m in shown[:-k]) and all(m is not ELIDED for m in shown[-k:])
    # Nothing stored changed: the store's message still holds all 64 MiB.
    pos = next(i for i, m in enumerate(shown) if m is big[0])
    assert len(sessions.read_message(history.oid_at(pos)).content or "") == 64 << 20


def test_no_history_index_is_written_of_a_cut_history(imported: tuple[Path, str, Path]) -> None:
    tmp, ses, _ws = imported
    code, _out, err, _rss = measured(["--resume", ses, "--task", "again", "--json"], tmp)
    assert code == 0, err
    code, out, err, _rss = measured(["fsck", "--json"], tmp)
    assert code == 0 and json.loads(out)["clean"], (out, err)
