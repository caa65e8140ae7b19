"""The history index (issue #13, item 4; objects_spec.md §14.12): a resume starts from one file.

The byte format first (round trip, canonical CBOR, every torn length and
every flipped byte of a small file: never a traceback, never an entry that
was not written), then :class:`RunHistory` joining an index to a head (its
own, a fork's parent's, a longer branch's, a damaged one), then the runner
on a disk state dir (the index written after a run; the next process's
first turn reads only what the index lacks), fsck and gc.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kxen_agent.runtime import history_index as hi
from kxen_agent.runtime.history import RunHistory
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import RefUpdate, Store, codec
from kxen_agent.store.fsio import FaultyIO, FileIO

from tests.helpers import Proc, cli_env, run_kxen

from .test_history import Tooling, chat, full, session_with_history


def entries_of(ss: SessionStore, head: bytes | None) -> list[hi.Entry]:
    return [(m.oid, m.to_provider(), m.through if m.role == "compaction" else None) for m in ss.history(head)]


def sample_entries() -> list[hi.Entry]:
    a, b, c, d = (bytes([i]) * 32 for i in range(1, 5))
    return [
        (a, {"role": "user", "content": "fix the bug"}, None),
        (b, {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": '{"path": "a.py"}'}]}, None),
        (c, {"role": "tool", "content": "x" * 3000, "tool_call_id": "call_1"}, None),
        (d, {"role": "compaction", "content": "summary"}, b),
    ]


# ------------------------------------------------------------------ bytes


def test_round_trip_and_the_body_is_canonical_cbor() -> None:
    entries = sample_entries()
    data = hi.MAGIC + hi.encode_segments(None, entries)
    parsed = hi.parse_index(data)
    assert parsed.stopped is None and parsed.good_bytes == len(data)
    assert parsed.entries == entries
    # The frame's CBOR is the canonical encoding of §2 (the fast encoder's output, checked).
    values = hi.encode_entries(entries)
    assert codec.encode_ordered(values) == codec.encode(values)
    assert codec.decode(codec.encode(values)) == values


def test_segments_chain_by_their_base() -> None:
    entries = sample_entries()
    one = hi.MAGIC + hi.encode_segment(None, entries[:2])
    two = one + hi.encode_segment(entries[1][0], entries[2:])
    assert hi.parse_index(two).entries == entries
    # A segment whose base is not the previous segment's last message (a stale writer's) ends the prefix.
    stale = one + hi.encode_segment(entries[0][0], entries[2:])
    p = hi.parse_index(stale)
    assert p.entries == entries[:2] and p.good_bytes == len(one) and "base" in (p.stopped or "")


def test_every_torn_length_gives_a_prefix() -> None:
    entries = sample_entries()
    first = hi.MAGIC + hi.encode_segment(None, entries[:1])
    data = first + hi.encode_segment(entries[0][0], entries[1:])
    for cut in range(len(data)):
        p = hi.parse_index(data[:cut])
        expect = entries[:1] if cut >= len(first) else []
        assert p.entries == expect, cut
        assert p.stopped is not None or cut in (len(hi.MAGIC), len(first))


def test_every_flipped_byte_gives_a_prefix_of_what_was_written() -> None:
    entries = sample_entries()
    data = hi.MAGIC + hi.encode_segment(None, entries[:2]) + hi.encode_segment(entries[1][0], entries[2:])
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x41
        p = hi.parse_index(bytes(bad))
        assert p.entries == entries[: len(p.entries)], i
        assert len(p.entries) < len(entries), f"a flip at byte {i} went unnoticed"


def test_hostile_bytes_never_raise() -> None:
    import blake3

    for body in (b"", b"\xa0", codec.encode([{"id": b"x"}]), codec.encode([1, 2]), codec.encode([{"id": bytes(32)}])):
        import zstandard

        frame = zstandard.ZstdCompressor().compress(body)
        head = hi._SEG.pack(hi.SEGMENT_MAGIC, 1, hi.NO_BASE, len(frame))
        seg = head + frame + blake3.blake3(head + frame).digest()
        p = hi.parse_index(hi.MAGIC + seg)
        assert p.entries == [] and p.stopped
    for junk in (b"kxen-history 2\n", hi.MAGIC + b"HSEG" + b"\xff" * 40, hi.MAGIC + b"\x00" * 100):
        assert hi.parse_index(junk).entries == []


# ------------------------------------------------------------------ RunHistory and an index, on disk


def long_session(tmp_path: Path, n: int = 600) -> tuple[Store, str]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "notes.txt").write_text("some notes\n")
    ses = session_with_history(tmp_path / "state", ws, n)
    return Store(str(tmp_path / "state"), io=FileIO(), namespaces=(NS,)), ses


def test_finish_writes_the_index_and_start_reads_only_what_it_lacks(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    head = ss.get(ses).head
    h = RunHistory(ss)
    assert h.start(ses) == 0  # no index yet
    assert h.finish(ses, head) is None
    path = store.caches.path(hi.HISTORY, f"sessions/{ses}")
    assert hi.read_index(store.io, path).entries == entries_of(ss, head)
    # A new process: the index gives all 600, the store is read for nothing else.
    h2 = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    assert h2.start(ses) == 600
    assert h2.messages(head) == full(ss, head) and h2.reads == 0
    # Ten messages later: the next run appends one segment, not the whole file again.
    size = os.path.getsize(path)
    head2 = ss.append_messages(head, chat(10, start=600))
    assert h2.finish(ses, head2) is None and h2.reads == 10
    assert os.path.getsize(path) > size
    assert hi.read_index(store.io, path).entries == entries_of(ss, head2)
    with open(path, "rb") as f:
        assert f.read(size) == open(path, "rb").read()[:size], "appended, not rewritten"


def test_a_fork_starts_from_its_parents_index(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    parent_head = ss.get(ses).head
    RunHistory(ss).finish(ses, parent_head)
    fork = ss.fork(ses)
    fork_head = ss.append_messages(ss.get(fork.id).head, chat(3, start=600, tag="fork"))
    store.refs.transaction(f"{NS}/{fork.id}", [RefUpdate("head", ss.get(fork.id).head, fork_head)], reason="test")
    h = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    assert h.start(fork.id) == 600  # the parent's
    assert h.messages(fork_head) == full(ss, fork_head) and h.reads == 3
    h.finish(fork.id, fork_head)  # the fork's own index, written whole
    fork_index = store.caches.path(hi.HISTORY, f"sessions/{fork.id}")
    assert hi.read_index(store.io, fork_index).entries == entries_of(ss, fork_head)


def test_an_index_of_a_longer_branch_is_cut_to_the_head(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    head = ss.get(ses).head
    longer = ss.append_messages(head, chat(20, start=600, tag="later"))
    RunHistory(ss).finish(ses, longer)  # the index holds 620; the session's head is message 599
    h = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    assert h.start(ses) == 620
    assert h.messages(head) == full(ss, head) and h.reads == 1  # the head itself, found held
    other = ss.append_messages(head, chat(2, start=600, tag="other"))
    assert h.messages(other) == full(ss, other) and h.reads == 3


def test_a_damaged_index_is_read_up_to_the_damage_then_rewritten(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path, 2000)
    ss = SessionStore(store)
    head = ss.get(ses).head
    RunHistory(ss).finish(ses, head)
    path = store.caches.path(hi.HISTORY, f"sessions/{ses}")
    parsed = hi.read_index(store.io, path)
    data = bytearray(open(path, "rb").read())
    assert len(parsed.entries) == 2000
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    h = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    got = h.start(ses)
    assert 0 < got < 2000
    assert h.messages(head) == full(ss, head) and h.reads == 2000 - got
    h.finish(ses, head)
    again = hi.read_index(store.io, path)
    assert again.stopped is None and again.entries == entries_of(ss, head)


def test_no_index_below_the_threshold(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path, hi.INDEX_MIN_MESSAGES - 1)
    ss = SessionStore(store)
    RunHistory(ss).finish(ses, ss.get(ses).head)
    assert not os.path.exists(store.caches.path(hi.HISTORY, f"sessions/{ses}"))


# ------------------------------------------------------------------ the runner


@pytest.fixture(autouse=True)
def no_lease_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", "3600")


def resume(store_root: str, ses: str, calls: int) -> tuple[Tooling, Store]:
    store = Store(store_root, io=FileIO(), namespaces=(NS,))  # a fresh counter, as one CLI process
    tooling = Tooling(store, calls)
    result = Runner(store, providers=tooling.factory).resume(ses, task="read the notes")
    assert result.status == "completed", result
    return tooling, store


def test_a_run_writes_the_index_and_the_next_process_starts_from_it(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    first, _ = resume(store.root, ses, 2)
    path = store.caches.path(hi.HISTORY, f"sessions/{ses}")
    ss = SessionStore(Store(store.root, namespaces=(NS,)))
    head = ss.get(ses).head
    assert hi.read_index(FileIO(), path).entries == entries_of(ss, head)  # written after the run, all of it
    second, st2 = resume(store.root, ses, 2)
    # The first turn of the second process read the index, not 600 messages and their 200 blobs
    # (the other reads of a first turn, the same in both, are refs, run state, journal and agent).
    assert first.read_marks[0] - second.read_marks[0] >= 800 - 10, (first.read_marks, second.read_marks)
    # And the model was sent exactly the stored history.
    sent = second.sent[0][1:]
    assert sent == full(ss, head) + sent[len(full(ss, head)):]
    assert len(sent) == len(full(ss, head)) + 1  # the history, then the new task
    assert hi.read_index(FileIO(), path).entries == entries_of(ss, SessionStore(st2).get(ses).head)


# ------------------------------------------------------------------ fsck and gc


def fsck(root: str) -> Proc:
    return run_kxen(["fsck"], env=cli_env(root), timeout=300)


def test_fsck_checks_the_index_against_the_objects(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    head = ss.get(ses).head
    RunHistory(ss).finish(ses, head)
    r = fsck(store.root)
    assert r.rc == 0, r.err + r.out
    assert "stray" not in r.out
    path = store.caches.path(hi.HISTORY, f"sessions/{ses}")
    # Checksums that hold over content that is not the messages': a problem, exit 1.
    entries = entries_of(ss, head)
    oid, p, t = entries[5]
    entries[5] = (oid, dict(p, content="not what the message says"), t)
    hi.write_index(FileIO(), path, entries)
    r = fsck(store.root)
    assert r.rc == 1
    assert "history-index" in r.err and "entry 5" in r.err, r.err
    # A torn tail is a note, not a problem.
    hi.write_index(FileIO(), path, entries_of(ss, head))
    with open(path, "ab") as f:
        f.write(b"HSEG\x00\x00")
    r = fsck(store.root)
    assert r.rc == 0, r.err
    assert "history index" in r.out and "torn" in r.out


def test_gc_removes_a_pruned_sessions_index(tmp_path: Path) -> None:
    from kxen_agent.store import gc

    store, ses = long_session(tmp_path)
    ss = SessionStore(store)
    RunHistory(ss).finish(ses, ss.get(ses).head)
    path = store.caches.path(hi.HISTORY, f"sessions/{ses}")
    assert os.path.exists(path)
    ss.delete(ses)
    gc(store, prune=0)
    assert not os.path.exists(path)
    # A leftover of a group that no longer exists is a stray file for fsck.
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(hi.MAGIC)
    r = fsck(store.root)
    assert "stray file" in r.out and ses in r.out, r.out


# ------------------------------------------------------------------ the spec's vector (§14.12)


def test_the_spec_vector_reads_and_encodes_back() -> None:
    import re

    import blake3
    import zstandard

    text = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text()
    m = re.search(r"```\nhistory-index: two-messages\n(.*?)```", text, re.S)
    assert m, "objects_spec.md §14.12 has no history-index block"
    v = dict(line.split(": ", 1) for line in m.group(1).strip().split("\n"))
    data, cbor = bytes.fromhex(v["bytes"]), bytes.fromhex(v["cbor"])
    assert len(data) == 189
    a, b = bytes([0x11]) * 32, bytes([0x22]) * 32
    entries = [(a, {"role": "user", "content": "hi"}, None),
               (b, {"role": "assistant", "content": None,
                    "tool_calls": [{"id": "c1", "name": "ls", "arguments": "{}"}]}, None)]
    p = hi.parse_index(data)
    assert p.stopped is None and p.entries == entries
    # The table's offsets, the frame's content and the checksum rule.
    assert data[15:19] == b"HSEG" and int.from_bytes(data[19:23], "big") == 2 and data[23:55] == bytes(32)
    assert int.from_bytes(data[55:59], "big") == 98
    assert zstandard.ZstdDecompressor().decompress(data[59:157]) == cbor == codec.encode(hi.encode_entries(entries))
    assert data[157:] == blake3.blake3(data[15:157]).digest()
    # The normative parts encode back the same (the frame is informative: this library's level-3 frame).
    again = hi.MAGIC + hi.encode_segment(None, entries)
    assert again[:55] == data[:55] and zstandard.ZstdDecompressor().decompress(again[59:-32]) == cbor


@pytest.mark.parametrize("n", [20, 600])
def test_one_runner_running_twice_sends_the_whole_history_the_second_time(tmp_path: Path, n: int) -> None:
    # finish() syncs the held history to the run's last message behind the list the last model call
    # was handed; the next run's first call must still get every message (the first run's answer too).
    store, ses = long_session(tmp_path, n)
    s2 = Store(store.root, io=FileIO(), namespaces=(NS,))
    tooling = Tooling(s2, 1)
    runner = Runner(s2, providers=tooling.factory)
    assert runner.resume(ses, task="first").status == "completed"
    before = len(tooling.sent)
    assert runner.resume(ses, task="second").status == "completed"
    ss = SessionStore(s2)
    stored = full(ss, ss.get(ses).head)
    sent = tooling.sent[before][1:]
    assert sent[-1] == {"role": "user", "content": "second"}
    assert sent == stored[: len(sent)]
    assert {"role": "assistant", "content": "done"} in sent


def test_a_tool_calls_other_keys_survive_the_index() -> None:
    a = bytes([7]) * 32
    e = [(a, {"role": "assistant", "content": None,
              "tool_calls": [{"id": "c", "name": "n", "arguments": "{}", "type": "function"}]}, None)]
    assert hi.parse_index(hi.MAGIC + hi.encode_segment(None, e)).entries == e
    values = hi.encode_entries(e)
    assert codec.encode_ordered(values) == codec.encode(values)


def test_start_reads_no_segment_past_the_heads_history(tmp_path: Path) -> None:
    store, ses = long_session(tmp_path)
    ss = SessionStore(Store(store.root, io=FaultyIO(None, sync=False), namespaces=(NS,)))  # setup: no fsyncs
    head = ss.get(ses).head
    longer = ss.append_messages(head, chat(1500, start=600, tag="later"))
    RunHistory(ss).finish(ses, longer)  # 2,100 entries in several segments; the head is message 599
    assert len(hi.read_index(store.io, store.caches.path(hi.HISTORY, f"sessions/{ses}")).entries) == 2100
    h = RunHistory(SessionStore(Store(store.root, namespaces=(NS,))))
    got = h.start(ses)
    assert 600 <= got < 2100
    assert h.messages(head) == full(ss, head)


# ------------------------------------------------------------------ issue 24: what fsck reports, the frame rules


def small_session(tmp_path: Path, n: int = 6) -> tuple[SessionStore, str, list[hi.Entry]]:
    store, ses = long_session(tmp_path, n)
    ss = SessionStore(store)
    return ss, ses, entries_of(ss, ss.get(ses).head)


def test_an_entry_naming_an_object_that_is_not_a_message_is_a_problem(tmp_path: Path) -> None:
    ss, ses, entries = small_session(tmp_path)
    blob = ss.store.put("blob", b"not a message at all")
    _oid, p, t = entries[3]
    entries[3] = (blob, p, t)
    hi.write_index(FileIO(), ss.store.caches.path(hi.HISTORY, f"sessions/{ses}"), entries)
    problems, notes = hi.verify_indexes(SessionStore(Store(ss.store.root, namespaces=(NS,))))
    assert len(problems) == 1 and "entry 3" in problems[0][1] and "a blob object, not a message" in problems[0][1]
    assert notes == []


def test_an_entry_of_another_shape_ends_the_good_prefix_and_is_no_problem(tmp_path: Path) -> None:
    """§14.12: shape (types, keys) is the reader's check, ending the prefix; fields that differ are fsck's."""
    ss, ses, entries = small_session(tmp_path)
    path = ss.store.caches.path(hi.HISTORY, f"sessions/{ses}")
    good = hi.encode_segments(None, entries[:3])
    bad = hi.encode_entries(entries[3:])
    bad[0]["role"] = "system"  # no message has that role
    body = codec.encode(bad)
    import blake3
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    head = hi._SEG.pack(hi.SEGMENT_MAGIC, len(bad), entries[2][0], len(frame))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(hi.MAGIC + good + head + frame + blake3.blake3(head + frame).digest())
    parsed = hi.read_index(FileIO(), path)
    assert len(parsed.entries) == 3 and "shape" in parsed.stopped
    problems, notes = hi.verify_indexes(ss)
    assert problems == [] and len(notes) == 1


def _segment_with_frame(entries: list[hi.Entry], frame: bytes) -> bytes:
    import blake3

    head = hi._SEG.pack(hi.SEGMENT_MAGIC, len(entries), hi.NO_BASE, len(frame))
    return hi.MAGIC + head + frame + blake3.blake3(head + frame).digest()


def test_the_frame_rules_are_a_loose_objects() -> None:
    """§14.12 (question 14): the frame field is one zstd frame as §5.1 says, else the segment is not good."""
    import zstandard

    entries = sample_entries()
    body = codec.encode(hi.encode_entries(entries))
    one = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    assert hi.parse_index(_segment_with_frame(entries, one)).entries == entries
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"skip"
    half = len(body) // 2
    two = (zstandard.ZstdCompressor(write_content_size=True).compress(body[:half])
           + zstandard.ZstdCompressor(write_content_size=True).compress(body[half:]))
    # The same frame naming dictionary 7 (Dictionary_ID_flag 1: one byte after the descriptor).
    assert one[4] & 0x23 == 0x20  # single segment, no dictionary id: the id goes right after the descriptor
    with_dict = one[:4] + bytes([one[4] | 0x01, 7]) + one[5:]
    assert zstandard.get_frame_parameters(with_dict).dict_id == 7
    for frame in (no_size, skippable + one, one + skippable, two, one + b"\x00", with_dict):
        parsed = hi.parse_index(_segment_with_frame(entries, frame))
        assert parsed.entries == [] and parsed.stopped is not None, frame[:8]
    # Non-canonical CBOR of the right entries (a map's keys out of order) is read: nothing here is
    # content-addressed, and fsck compares values with the messages, not encodings.
    values = hi.encode_entries(entries)
    import cbor2

    loose_order = cbor2.dumps([dict(reversed(list(v.items()))) for v in values])
    assert loose_order != codec.encode(values)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(loose_order)
    assert hi.parse_index(_segment_with_frame(entries, frame)).entries == entries
