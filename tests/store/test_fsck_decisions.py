"""fsck is never clean over damage, and the spec's open questions decided (issue 24, objects_spec.md §6.9, §11).

Each test is one decision of the spec, checked through fsck or a reader
against real files. Step logs the tests need in a shape no writer makes are
written here byte by byte in format version 1 (§6.8), as a second
implementation would write them: a reader still reads that version, so the
tests do not lean on the writer's encoder.
"""

from __future__ import annotations

import os

import blake3
import pytest

from kxen_agent.store import RefUpdate, Store, fsck
from kxen_agent.store import codec
from kxen_agent.store.fold import fold_step_logs

from .helpers import CLI_NAMESPACES

G = "sessions/ses_dec"


def _open(root) -> Store:
    return Store(str(root), namespaces=CLI_NAMESPACES)


def _problems(store: Store) -> list[tuple[str, str]]:
    return [(p.kind, p.where) for p in fsck(_open(store.root)).problems]


# ------------------------------------------------------------------ stale logs hold nothing (question 8)


def _stale_log_holding_meta(tmp_path):
    """A group whose ref ``meta`` names an object held only by a stale step log.

    A checkpoint that died before its last rename leaves the log of the
    previous generation (§6.8); here the pack the checkpoint relied on is
    lost too, so the stale log is the object's only copy.
    """
    store = _open(tmp_path / "s")
    with store.step(G) as step:
        meta = step.put("blob", b"meta " + b"m" * 500)
        head = step.put("blob", b"head 0")
        step.update("meta", None, meta)
        step.update("head", None, head)
        step.commit("start")
    path = store.refs.steps_path(G)
    stale = open(path, "rb").read()
    fold_step_logs(store)
    open(path, "wb").write(stale)  # the checkpoint's new generation never made it
    for name in os.listdir(store.pack_dir):
        os.unlink(os.path.join(store.pack_dir, name))  # and the pack is lost
    return store, meta, head


def test_a_ref_to_an_object_only_a_stale_log_holds_is_a_problem(tmp_path):
    store, meta, head = _stale_log_holding_meta(tmp_path)
    rep = fsck(_open(store.root))
    assert sorted((p.kind, p.where) for p in rep.problems) == [("missing-object", f"{G}/head"),
                                                               ("missing-object", f"{G}/meta")]
    assert "stale step log" in rep.problems[0].message and store.refs.steps_path(G) in rep.problems[0].message
    assert meta.hex() not in rep.dangling and rep.objects == 0 and rep.in_steps == 2
    # What fsck warned of: the group's next transaction replaces the stale log, and meta is gone.
    fresh = _open(store.root)
    with fresh.step(G) as step:
        new = step.put("blob", b"head 1")
        step.update("head", head, new)
        step.commit("next")
    after = fsck(_open(store.root))
    assert ("missing-object", f"{G}/meta") in [(p.kind, p.where) for p in after.problems]


def test_a_leftover_log_of_a_removed_group_holds_nothing_either(tmp_path):
    store = _open(tmp_path / "s")
    with store.step(G) as step:
        obj = step.put("blob", b"only in the leftover")
        step.update("head", None, obj)
        step.commit("one")
    fold_step_logs(store)
    for name in os.listdir(store.pack_dir):
        os.unlink(os.path.join(store.pack_dir, name))
    log = store.refs.steps_path(G)
    # A removed group's leftover log of generation 1 (no ref file), holding a record by hand.
    os.unlink(store.refs.ref_path(G))
    os.unlink(store.refs.log_path(G))
    rec = _record({"time": 1, "reason": "x", "fence": 0, "updates": [["head", None, obj]]},
                  [(obj, _frame(store, obj, b"only in the leftover"))])
    open(log, "wb").write(_header(G, 1) + rec)
    other = "sessions/ses_other"
    fresh = _open(store.root)
    fresh.refs.transaction(other, [RefUpdate("head", None, obj)], reason="names it")
    rep = fsck(_open(store.root))
    assert [(p.kind, p.where) for p in rep.problems] == [("missing-object", f"{other}/head")]
    assert "leftover" in rep.problems[0].message


def test_a_writer_does_not_count_on_a_stale_logs_copy(tmp_path):
    """Putting content that only a stale log holds writes it again: the ref that names it outlives the log."""
    store, meta, head = _stale_log_holding_meta(tmp_path)
    fresh = _open(store.root)
    other = "sessions/ses_other"
    assert fresh.refs.read(G).refs["meta"] == meta and fresh.get(meta) == b"meta " + b"m" * 500  # the log is read
    assert fresh.put("blob", b"meta " + b"m" * 500) == meta
    assert fresh.loose.has(meta)  # written loose, not taken for present
    fresh.refs.transaction(other, [RefUpdate("head", None, meta)], reason="names it")
    with fresh.step(G) as step:
        new = step.put("blob", b"head 1")
        step.update("head", head, new)
        step.commit("replaces the stale log")
    rep = fsck(_open(store.root))
    assert ("missing-object", f"{other}/head") not in [(p.kind, p.where) for p in rep.problems]
    assert [(p.kind, p.where) for p in rep.problems] == []  # G/meta is loose now too


# ------------------------------------------------------------------ version-1 logs by hand


def _header(group: str, gen: int) -> bytes:
    return b"kxen-steps 1 %s %d\n" % (group.encode(), gen)


def _record(tx: dict, objects=()) -> bytes:
    txb = codec.encode(tx)
    body = len(txb).to_bytes(4, "big") + txb + b"".join(oid + len(f).to_bytes(4, "big") + f for oid, f in objects)
    head = b"STEP" + len(body).to_bytes(4, "big")
    return head + body + blake3.blake3(head + body).digest()


def _frame(store: Store, oid: bytes, data: bytes) -> bytes:
    from kxen_agent.store.objects import compress_loose, encode_object

    obj = encode_object("blob", data)
    assert obj.id == oid
    return compress_loose(obj.raw)


def _log_of(store: Store, group: str, gen: int, txs: list[dict], objects=None) -> str:
    """Write ``group``'s step log of generation ``gen`` holding one record per transaction map."""
    path = store.refs.steps_path(group)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = _header(group, gen) + b"".join(_record(tx, (objects or {}).get(i, ())) for i, tx in enumerate(txs))
    with open(path, "wb") as f:
        f.write(data)
    return path


def _tx(updates, *, fence=0, reason="r", **extra) -> dict:
    return {"time": 1, "reason": reason, "fence": fence, "updates": updates, **extra}


@pytest.fixture
def blobs(tmp_path):
    store = _open(tmp_path / "s")
    ids = [store.put("blob", b"blob %d" % i) for i in range(3)]
    return store, ids


def _read_fails(store: Store, group: str, words: str) -> None:
    from kxen_agent.store import CorruptRef

    with pytest.raises(CorruptRef) as e:
        _open(store.root).refs.read(group)
    assert words in str(e.value)
    # Named once: by its step log's path when the log is what is damaged, else by the group.
    problems = _problems(store)
    assert ("corrupt-ref", group) in problems or ("corrupt-ref", store.refs.steps_path(group)) in problems


# ------------------------------------------------------------------ question 5: a reason's form


@pytest.mark.parametrize("reason", ["a\x00b", "a\tb", "a  b", " a", "a\n", "a\x1b[31m", "a\u2028b"])
def test_a_record_whose_reason_is_not_in_reflog_form_is_damage(blobs, reason):
    store, (x, _y, _z) = blobs
    _log_of(store, G, 0, [_tx([["head", None, x]], reason=reason)])
    _read_fails(store, G, "reason")


def test_a_record_whose_reason_holds_what_the_writer_writes_reads(blobs):
    store, (x, _y, _z) = blobs
    reason = "session: rebind to /srv/a\ufffdb \u00e9t\u00e9"  # U+FFFD for a control, non-ASCII kept
    _log_of(store, G, 0, [_tx([["head", None, x]], reason=reason)])
    fresh = _open(store.root)
    assert [e.reason for e in fresh.refs.reflog(G)] == [reason]
    assert fsck(fresh).clean


# ------------------------------------------------------------------ question 6: one ref twice in a record


def test_a_record_may_update_one_ref_twice_each_old_chained(blobs):
    store, (x, y, z) = blobs
    _log_of(store, G, 0, [_tx([["head", None, x], ["head", x, y]])])
    fresh = _open(store.root)
    assert fresh.refs.read(G).refs["head"] == y
    assert [(e.old, e.new) for e in fresh.refs.reflog(G)] == [(None, x), (x, y)]
    assert fsck(fresh).clean
    # The store's own transactions do the same (§6.4).
    fresh.refs.transaction(G, [RefUpdate("head", y, z), RefUpdate("head", z, x)], reason="twice")
    assert _open(store.root).refs.read(G).refs["head"] == x and fsck(_open(store.root)).clean


def test_a_second_update_whose_old_is_not_the_first_ones_new_is_damage(blobs):
    store, (x, y, z) = blobs
    _log_of(store, G, 0, [_tx([["head", None, x], ["head", None, y]])])
    _read_fails(store, G, "was not what the record says it replaced")


# ------------------------------------------------------------------ question 7: a fence below the group's


def test_a_record_with_a_fence_below_the_groups_is_damage(blobs):
    store, (x, y, _z) = blobs
    path = _log_of(store, G, 0, [_tx([["head", None, x]], fence=2, newFence=2), _tx([["head", x, y]], fence=1)])
    second = len(_header(G, 0)) + len(_record(_tx([["head", None, x]], fence=2, newFence=2)))
    _read_fails(store, G, f"at offset {second}: the record's fence 1 is below the group's 2")
    assert open(path, "rb").read()[second:second + 4] == b"STEP"  # the offset is the file's (question 22)


def test_a_record_with_the_groups_fence_or_above_reads(blobs):
    store, (x, y, z) = blobs
    _log_of(store, G, 0, [_tx([["head", None, x]], fence=2, newFence=2), _tx([["head", x, y]], fence=2),
                          _tx([["head", y, z]], fence=5)])
    fresh = _open(store.root)
    st = fresh.refs.read(G)
    assert st.refs["head"] == z and st.fence == 2 and fsck(fresh).clean


def test_a_new_fence_that_does_not_rise_is_damage(blobs):
    store, (x, _y, _z) = blobs
    _log_of(store, G, 0, [_tx([["head", None, x]], fence=2, newFence=2), _tx([], fence=2, newFence=2)])
    _read_fails(store, G, "the fence goes down or stays")


# ------------------------------------------------------------------ question 10: a cache's group


def test_a_cache_of_a_group_that_only_a_leftover_log_names_is_a_stray(blobs):
    store, (x, _y, _z) = blobs
    _log_of(store, G, 3, [_tx([["head", None, x]])])  # no ref file: a removed group's leftover
    _log_of(store, "sessions/ses_live", 0, [_tx([["head", None, x]])])  # a group in its generation-0 log
    _log_of(store, "sessions/ses_empty", 0, [])  # no committed record: no group
    cache = os.path.join(store.root, "cache", "history", "sessions")
    os.makedirs(cache)
    for ses in ("ses_dec", "ses_live", "ses_empty"):
        open(os.path.join(cache, ses), "wb").write(b"kxen-history 1\n")
    rep = fsck(_open(store.root))
    assert rep.clean
    assert sorted(p for p in rep.stray_files if p.startswith(cache)) == [
        os.path.join(cache, "ses_dec"), os.path.join(cache, "ses_empty")]


# ------------------------------------------------------------------ question 11: number ranges


@pytest.mark.parametrize("line, ok", [
    ("fence 18446744073709551615", True), ("fence 18446744073709551616", False),
    ("log 18446744073709551616", False), ("steps 9999999999999999999", True),
    ("steps 10000000000000000000", False), ("deleted 18446744073709551616", False),
])
def test_ref_file_numbers_are_64_bit_and_a_generation_19_digits(tmp_path, line, ok):
    from kxen_agent.store import CorruptRef
    from kxen_agent.store.refs import parse_ref_file

    key = line.split()[0]
    fields = {"fence": "fence 0", "log": "log 0", "steps": "steps 1", "deleted": "deleted 5"}
    fields[key] = line
    data = ("kxen-refs 1\n" + "\n".join(fields[k] for k in ("fence", "log", "steps", "deleted")) + "\n").encode()
    if ok:
        parse_ref_file(data, G, "x")
    else:
        with pytest.raises(CorruptRef, match="over its limit"):
            parse_ref_file(data, G, "x")


def test_reflog_numbers_are_64_bit():
    from kxen_agent.store import CorruptRef
    from kxen_agent.store.refs import parse_reflog

    line = "%s %s %%d %%d head\tr\n" % ("0" * 64, "1" * 64)
    assert parse_reflog((line % (2**64 - 1, 2**64 - 1)).encode(), "x")[0].fence == 2**64 - 1
    for t, f in ((2**64, 0), (0, 2**64)):
        with pytest.raises(CorruptRef, match="a number over"):
            parse_reflog((line % (t, f)).encode(), "x")


# ------------------------------------------------------------------ question 12: step logs under FORMAT 1 or 2


@pytest.mark.parametrize("version", [1, 2])
def test_a_step_log_under_an_older_format_is_read_and_reported(blobs, version):
    store, (x, _y, _z) = blobs
    store.refs.transaction(G, [RefUpdate("head", None, x)], reason="one")
    with open(os.path.join(store.root, "FORMAT"), "wb") as f:
        f.write(b"kxen-agent-state %d\n" % version)
    fresh = _open(store.root)
    assert fresh.format_version == version
    assert fresh.refs.read(G).refs["head"] == x  # its records were committed: still applied
    rep = fsck(fresh)
    assert [(p.kind, p.where) for p in rep.problems] == [("corrupt-ref", store.refs.steps_path(G))]
    assert "kxen-agent-state 4" in rep.problems[0].message
    # A writer of this version upgrades FORMAT, and fsck is clean again.
    fresh.refs.transaction(G, [RefUpdate("head", x, None)], reason="two")
    assert fsck(_open(store.root)).clean


# ------------------------------------------------------------------ question 13: the report's counts


def test_the_report_counts_as_section_11_defines(tmp_path):
    from kxen_agent.store.objects import encode_object

    store = _open(tmp_path / "s")
    a = store.put("blob", b"loose and packed and in a log")
    with store.step(G) as step:
        step.put("blob", b"loose and packed and in a log")
        b = step.put("blob", b"only in the log")
        step.update("head", None, b)
        step.commit("one")
    store.refs.transaction("sessions/ses_two", [RefUpdate("head", None, a), RefUpdate("meta", None, a)], reason="a")
    with store.pack_writer(None) as w:
        w.add(encode_object("blob", b"loose and packed and in a log"))
        w.seal().commit()
    rep = fsck(_open(store.root))
    assert rep.clean
    raw_a = len(encode_object("blob", b"loose and packed and in a log").raw)
    raw_b = len(encode_object("blob", b"only in the log").raw)
    # Distinct objects once; copies per place; bytes of each distinct object once.
    assert (rep.objects, rep.loose, rep.packed, rep.in_steps) == (2, 1, 1, 2)  # a is in the record too
    assert rep.bytes == raw_a + raw_b
    assert (rep.groups, rep.refs, rep.reachable) == (2, 3, 2)


# ------------------------------------------------------------------ question 17: a group commit's summary (§16.4)


def _group_commit_with_message(message: bytes):
    from kxen_agent.store import gitmap

    blob, tree, commit = gitmap.group_commit(G, 0, {}, [], 1_700_000_000)
    body = commit.body[: commit.body.index(b"\n\n") + 2] + message
    return body, tree.body, blob.body


@pytest.mark.parametrize("summary, ok", [
    (b"", True),
    (b"\nhead: -\nmessages: 0\n", True),
    (b"\nrun: r1 completed\nrun: r2 failed\n", True),  # a key may repeat; order is kept
    (b"\nnote: \xc3\xa9t\xc3\xa9 ok\n", True),
    (b"\n", False),  # an empty line and no summary
    (b"head: -\n", False),  # no empty line before it
    (b"\n\nhead: -\n", False),  # an empty summary line
    (b"\nhead: a\rb\n", False),  # CR: a control character
    (b"\nhead: a\x1bb\n", False),
    (b"\nhead: a\tb\n", False),
    (b"\nHead: x\n", False),
    (b"\nhead:x\n", False),
    (b"\nhead: \xff\n", False),
])
def test_a_group_commits_summary_is_empty_or_key_value_lines(summary, ok):
    from kxen_agent.store import gitmap

    body, tree, blob = _group_commit_with_message(b"kxen group %s\n" % G.encode() + summary)
    if ok:
        gitmap.parse_group_commit(body, tree, blob, "c")
    else:
        with pytest.raises(gitmap.BadGitImage):
            gitmap.parse_group_commit(body, tree, blob, "c")


# ------------------------------------------------------------------ question 18: Dictionary_ID 0 (§12.3 rule 3)


def _with_dict_id(frame: bytes, did: int) -> bytes:
    """``frame`` (single segment, no dictionary id) naming dictionary ``did`` in one byte."""
    assert frame[4] & 0x23 == 0x20
    return frame[:4] + bytes([frame[4] | 0x01, did]) + frame[5:]


def test_a_frame_naming_dictionary_0_names_none():
    import zstandard

    from kxen_agent.store.objects import CorruptObject
    from kxen_agent.store.pack.compress import Decompressor
    from kxen_agent.store.pack.format import METHOD_ZSTD, METHOD_ZSTD_DICT

    samples = [b'{"role": "tool", "content": "line %d of output %d"}' % (i, i * 7) * 3 for i in range(400)]
    d = zstandard.train_dictionary(2048, samples)
    did = d.dict_id()
    raw = samples[5]
    plain = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    dicted = zstandard.ZstdCompressor(dict_data=d, write_content_size=True, write_dict_id=False).compress(raw)
    dec = Decompressor(d.as_bytes())
    # Method 2: no id, id 0 (RFC 8878: no dictionary named; the pack's is used) or the pack's own id.
    for frame in (dicted, _with_dict_id(dicted, 0)):
        assert dec.decompress_raw(METHOD_ZSTD_DICT, len(raw), frame, "e") == raw
    if did < 256:
        assert dec.decompress_raw(METHOD_ZSTD_DICT, len(raw), _with_dict_id(dicted, did), "e") == raw
    with pytest.raises(CorruptObject, match="names dictionary"):
        dec.decompress_raw(METHOD_ZSTD_DICT, len(raw), _with_dict_id(dicted, (did + 1) % 256 or 1), "e")
    # Method 1: no id, or 0; any other is refused before decompressing.
    for frame in (plain, _with_dict_id(plain, 0)):
        assert dec.decompress_raw(METHOD_ZSTD, len(raw), frame, "e") == raw
    with pytest.raises(CorruptObject, match="names dictionary"):
        dec.decompress_raw(METHOD_ZSTD, len(raw), _with_dict_id(plain, 9), "e")


# ------------------------------------------------------------------ question 22: offsets from the file's start


def test_fsck_names_a_bad_frame_and_a_tail_by_offsets_from_the_files_start(blobs):
    store, (x, y, _z) = blobs
    good = _frame(store, x, b"blob 0")
    # A record whose checksum holds over an entry whose frame is not its id's object.
    path = _log_of(store, G, 0, [_tx([["head", None, x]]), _tx([["head", x, y]])],
                   objects={0: [(x, good)], 1: [(y, good)]})
    with open(path, "ab") as f:
        f.write(b"STEP\x00\x00")  # a torn append
    data = open(path, "rb").read()
    rep = fsck(_open(store.root))
    bad = [p for p in rep.problems if p.kind == "corrupt-object"]
    assert len(bad) == 1 and bad[0].where.startswith(f"{path} at offset ")
    at = int(bad[0].where.rsplit(" ", 1)[1])
    assert data[at:at + 4] == b"\x28\xb5\x2f\xfd" and data[at - 36:at - 4] == y  # the frame, after its id
    tail = [s for s in rep.stray_files if s.startswith(path)]
    assert tail and f"an uncommitted tail of 6 bytes from offset {len(data) - 6}" in tail[0]


# ------------------------------------------------------------------ question 21: §7.2 and check 3 in format 3


def test_reflog_consistency_is_judged_on_the_ref_file_with_its_log_applied(tmp_path):
    store = _open(tmp_path / "s")
    ids = [store.put("blob", b"v%d" % i) for i in range(4)]
    store.refs.transaction(G, [RefUpdate("head", None, ids[0]), RefUpdate("gone", None, ids[1])], reason="0")
    fold_step_logs(store)  # ref file of generation 1, its reflog file: two lines
    store.refs.transaction(G, [RefUpdate("head", ids[0], ids[2]), RefUpdate("gone", ids[1], None)], reason="1")
    ref = open(store.refs.ref_path(G)).read()
    assert ids[0].hex() in ref and "gone" in ref  # the ref file alone disagrees with the group's state
    assert fsck(_open(store.root)).clean  # the state (ref file + records) and reflog (file + records) agree
    reflog = store.refs.log_path(G)
    with open(reflog, "ab") as f:
        f.write(b"junk past the committed length, no newline")  # an uncommitted tail: ignored
    assert fsck(_open(store.root)).clean
    committed = int(ref.split("\nlog ")[1].split("\n")[0])
    with open(reflog, "r+b") as f:
        f.truncate(committed - 1)  # shorter than the base's log: damage
    assert _problems(store) == [("corrupt-ref", G)]


# ------------------------------------------------------------------ questions 19 and 20: JSON bundle limits, whitespace


@pytest.fixture
def json_bundle(tmp_path):
    from kxen_agent.store.bundle.export import export_bundle

    store = _open(tmp_path / "s")
    x = store.put("blob", b"carried")
    store.refs.transaction(G, [RefUpdate("head", None, x)], reason="one")
    path = tmp_path / "b.json"
    export_bundle(store, [G], str(path), fmt="json")
    return path, path.read_bytes()


@pytest.mark.parametrize("after, ok", [
    (b"", True), (b"\n", True), (b" \t\r\n" * 1000, True),
    (b"\x0c", False), (b"\x0b", False), (b"\xc2\xa0", False), (b"\xef\xbb\xbf", False), (b"\x00", False),
    (b"\n{}", False),
])
def test_only_json_whitespace_may_follow_a_json_bundle(json_bundle, after, ok):
    """§12.8's "whitespace" is RFC 8259's: SP, TAB, LF, CR, in any amount; nothing else (question 20)."""
    from kxen_agent.store.bundle import BadBundle, verify_bundle

    path, data = json_bundle
    path.write_bytes(data + after)
    if ok:
        verify_bundle(str(path))
    else:
        with pytest.raises(BadBundle):
            verify_bundle(str(path))


def test_a_json_member_over_its_limit_is_refused_by_every_reader(json_bundle):
    """§12.13's limits are the format's (question 19): a value of 16 MiB + 1 characters is refused."""
    from kxen_agent.store.bundle import BadBundle, verify_bundle
    from kxen_agent.store.bundle.header import MAX_HEADER_SIZE

    path, data = json_bundle
    import json

    text = data.decode()
    at = text.index('"refs":') + len('"refs":')
    while text[at] == " ":
        at += 1
    value_end = json.JSONDecoder().raw_decode(text, at)[1]
    value = data[at:value_end]
    for pad, ok in ((MAX_HEADER_SIZE - len(value), True), (MAX_HEADER_SIZE - len(value) + 1, False)):
        padded = value[:1] + b" " * pad + value[1:]  # inside the value: it counts
        path.write_bytes(data[:at] + padded + data[value_end:])
        if ok:
            verify_bundle(str(path))
        else:
            with pytest.raises(BadBundle, match="longer than"):
                verify_bundle(str(path))


# ------------------------------------------------------------------ question 1: a good record after torn bytes


def test_a_good_record_after_torn_bytes_is_damage_that_no_writer_cuts(blobs):
    """A version-1 log: bytes that are no record, then a committed record raising the fence (§6.9 question 1)."""
    store, (x, y, z) = blobs
    first = _record(_tx([["head", None, x]], fence=1, newFence=1))
    raised = _record(_tx([["head", x, y]], fence=2, newFence=2))
    path = store.refs.steps_path(G)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = _header(G, 0) + first + b"\x00" * 60 + raised  # a torn append, then a good record
    open(path, "wb").write(data)
    _read_fails(store, G, "offset")
    fresh = _open(store.root)
    from kxen_agent.store import CorruptRef

    with pytest.raises(CorruptRef):
        fresh.refs.transaction(G, [RefUpdate("head", None, z)], reason="would cut", fence=1)
    assert open(path, "rb").read() == data  # nothing cut: the fence stays at 2 in the file
