"""Findings of the spec review: each test failed before its fix (objects_spec.md §§ cited)."""

from __future__ import annotations

import os

import pytest

from kxen_agent.errors import KxenError
from kxen_agent.store import BadRefName, CorruptObject, CorruptRef, FileIO, MissingObject, RefUpdate, Store, fsck
from kxen_agent.store import codec, objects
from kxen_agent.store.codec import DecodeError, EncodeError
from kxen_agent.store.objects import compress_loose, encode_object
from kxen_agent.store.repo import StateDirError, skeleton_dirs
from kxen_agent.store.refs import (
    BadRefValue,
    ReflogEntry,
    format_reflog_line,
    parse_ref_file,
    parse_reflog,
    validate_group,
    validate_ref_name,
)

from .helpers import CLI_NAMESPACES

G = "sessions/s1"
TEMP = "tmp_0123456789abcdef"  # what FileIO.write_tmp names a temp file


class TracingIO(FileIO):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str]] = []
        self.hook = lambda op, path: self.ops.append((op, path))


def _blob_in(prefix: str) -> objects.RawObject:
    i = 0
    while True:
        obj = encode_object("blob", b"hardening %d" % i)
        if obj.id.hex().startswith(prefix):
            return obj
        i += 1


def _touch(path: str, data: bytes = b"") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.fixture
def populated(store: Store) -> dict[str, bytes]:
    a, b = store.put("blob", b"a"), store.put("blob", b"b")
    store.refs.transaction(G, [RefUpdate("head", None, a)], reason="first")
    return {"a": a, "b": b}


# ------------------------------------------------- 1. tmp_ names (§6.1, §6.2)


@pytest.mark.parametrize("group", ["sessions/tmp_x", "tmp_ns/s1", f"sessions/{TEMP}"])
def test_group_segment_starting_with_tmp_is_refused(store: Store, group):
    with pytest.raises(BadRefName, match="not starting with 'tmp_'"):
        validate_group(group)
    with pytest.raises(BadRefName):
        store.refs.transaction(group, [RefUpdate("head", None, b"\x01" * 32)], reason="x")
    assert not os.path.exists(store.root)


@pytest.mark.parametrize("name", ["tmp_a", "runs/tmp_r/tip"])
def test_ref_name_segment_starting_with_tmp_is_refused(name):
    with pytest.raises(BadRefName):
        validate_ref_name(name)
    assert validate_ref_name("x_tmp_a") == "x_tmp_a"


def test_groups_skip_only_real_temp_files(store: Store, populated):
    ns_dir = os.path.dirname(store.refs.ref_path(G))
    _touch(os.path.join(ns_dir, TEMP), b"half-written ref file")
    fake = _touch(os.path.join(ns_dir, "tmp_notatemp"), b"kxen-refs 1\nfence 0\nlog 0\n")
    assert list(store.refs.groups()) == [G, "sessions/tmp_notatemp"]
    rep = fsck(store)
    assert [(p.kind, p.where) for p in rep.problems] == [("corrupt-ref", "sessions/tmp_notatemp")]
    assert rep.stray_files == [os.path.join(ns_dir, TEMP)]
    assert os.path.exists(fake)


# ------------------------------------------------- 2. durability (§5.2, §9.1, §9.3)


def test_an_object_found_present_has_its_name_synced(state_dir):
    obj = _blob_in("5a")
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    store.ensure_initialized()
    with store.shared_lock():  # the store lock's files exist now (their creation is a "create" too)
        pass
    # Another process renamed it in and has not fsynced the directory yet.
    _touch(store.loose.path(obj.id), compress_loose(obj.raw))
    fanout = os.path.dirname(store.loose.path(obj.id))
    io.ops.clear()
    assert store.put_raw(obj) is False
    assert ("fsync_dir", fanout) in io.ops
    assert not any(op in ("create", "rename") for op, _ in io.ops)

    # This instance made that name durable: put again, no directory fsync.
    io.ops.clear()
    assert store.put_raw(obj) is False
    assert ("fsync_dir", fanout) not in io.ops

    # Another instance has not: its put syncs, deferred to its batch's barrier.
    other = Store(str(state_dir), io=io)
    io.ops.clear()
    with other.batch():
        assert other.put_raw(obj) is False
        assert ("fsync_dir", fanout) not in io.ops  # deferred to the barrier
    assert io.ops.count(("fsync_dir", fanout)) == 1
    io.ops.clear()
    with other.batch():  # the barrier has run: durable for this instance too
        assert other.put_raw(obj) is False
    assert ("fsync_dir", fanout) not in io.ops


def test_a_durable_name_unlinked_and_put_back_is_synced_again(state_dir):
    obj = _blob_in("5a")
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    assert store.put_raw(obj) is True
    path = store.loose.path(obj.id)
    fanout = os.path.dirname(path)
    # gc pruned it, another process renamed a copy back in and has not synced.
    os.unlink(path)
    _touch(path + ".x", compress_loose(obj.raw))
    os.utime(path + ".x", ns=(1, 1))
    os.rename(path + ".x", path)
    io.ops.clear()
    assert store.put_raw(obj) is False
    assert ("fsync_dir", fanout) in io.ops


def test_a_failed_batch_does_not_count_its_objects_durable(state_dir):
    obj = _blob_in("5a")
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    store.ensure_initialized()
    fanout = os.path.dirname(store.loose.path(obj.id))
    with pytest.raises(RuntimeError):
        with store.batch():
            assert store.put_raw(obj) is True
            raise RuntimeError("boom")
    io.ops.clear()
    assert store.put_raw(obj) is False
    assert ("fsync_dir", fanout) in io.ops


def test_a_new_state_dir_is_made_with_a_durable_skeleton_before_format(tmp_path):
    root = str(tmp_path / "state")
    io = TracingIO()
    Store(root, io=io, namespaces=CLI_NAMESPACES).ensure_initialized()
    ops = io.ops
    fmt = ops.index(("rename", os.path.join(root, "FORMAT")))
    for rel in skeleton_dirs(CLI_NAMESPACES):
        d = os.path.join(root, rel)
        assert os.path.isdir(d)
        made = ops.index(("mkdir", d))
        # Its name is durable before FORMAT exists: its parent is synced
        # after its mkdir and before FORMAT is renamed in.
        assert ("fsync_dir", os.path.dirname(d)) in ops[made:fmt], rel
    # Version 3's skeleton holds the step logs' directories (§10.3).
    assert {"steps", os.path.join("steps", "sessions")} <= set(skeleton_dirs(CLI_NAMESPACES))
    assert (tmp_path / "state" / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"


def test_in_a_version_2_dir_an_object_write_syncs_only_its_fanout_dir(state_dir):
    Store(str(state_dir)).ensure_initialized()
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    obj = _blob_in("c3")
    assert store.put_raw(obj) is True
    fanout = os.path.join(store.root, "objects", "c3")
    # This instance found FORMAT: before its first write it syncs the
    # state dir and its parent once (their names may be a failed
    # creator's), then the object's own two fsyncs.
    assert [p for op, p in io.ops if op == "fsync_dir"] == [store.root, os.path.dirname(store.root), fanout]
    assert io.fsyncs == 4
    io.ops.clear()
    io.fsyncs = 0
    obj2 = _blob_in("c4")
    assert store.put_raw(obj2) is True
    assert [p for op, p in io.ops if op == "fsync_dir"] == [os.path.join(store.root, "objects", "c4")]
    assert io.fsyncs == 2  # the temp file and the fan-out dir


def test_upgrading_a_version_1_dir_syncs_directories_found_existing(state_dir):
    # A version-1 dir was made lazily: a fan-out dir may come from a
    # process that died before syncing objects/. The first write of this
    # version makes the whole skeleton durable, then writes FORMAT 3.
    os.makedirs(os.path.join(str(state_dir), "objects", "c3"))
    (state_dir / "FORMAT").write_bytes(b"kxen-agent-state 1\n")
    io = TracingIO()
    store = Store(str(state_dir), io=io, namespaces=CLI_NAMESPACES)
    assert store.format_version == 1
    obj = _blob_in("c3")
    assert store.put_raw(obj) is True
    fmt = io.ops.index(("rename", os.path.join(store.root, "FORMAT")))
    synced = [p for op, p in io.ops[:fmt] if op == "fsync_dir"]
    assert os.path.join(store.root, "objects") in synced and store.root in synced
    assert os.path.join(store.root, "steps") in synced  # steps/sessions, made by the upgrade
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"
    assert store.get(obj.id) == obj.body
    for rel in skeleton_dirs(CLI_NAMESPACES):
        assert os.path.isdir(os.path.join(store.root, rel))


@pytest.mark.parametrize("extra", [
    ("file", "objects/ab/x"),
    ("file", "refs/sessions/g"),
    ("file", "locks/gc.lock"),
    ("file", "objects/FORMAT.tmp_0123456789abcdef"),
    ("dir", "objects/zz"),
    ("symlink", "refs"),
])
def test_without_format_anything_but_the_skeleton_makes_a_dir_foreign(tmp_path, extra):
    root = tmp_path / "state"
    root.mkdir()
    kind, rel = extra
    for d in skeleton_dirs(CLI_NAMESPACES):
        if kind == "symlink" and (d == rel or d.startswith(rel + os.sep)):
            continue
        (root / d).mkdir()
    if kind == "file":
        (root / rel).write_bytes(b"")
    elif kind == "dir":
        (root / rel).mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", root / rel)
    with pytest.raises(StateDirError, match="not a kxen-agent state dir"):
        Store(str(root))


def test_without_format_an_unlistable_dir_is_foreign(tmp_path, monkeypatch):
    root = tmp_path / "state"
    (root / "objects").mkdir(parents=True)
    import kxen_agent.store.repo as repo_mod

    real_scandir = os.scandir

    def scandir_that_cannot_list(path="."):
        # A subdirectory it may not list (EACCES; root ignores the mode
        # bits, so the error is simulated).
        if os.fspath(path) == str(root / "objects"):
            raise PermissionError(13, "Permission denied", str(root / "objects"))
        return real_scandir(path)

    monkeypatch.setattr(repo_mod.os, "scandir", scandir_that_cannot_list)
    with pytest.raises(StateDirError, match="not a kxen-agent state dir"):
        Store(str(root))


def test_upgrading_a_version_1_dir_with_its_whole_skeleton_syncs_every_parent(state_dir):
    for d in skeleton_dirs(CLI_NAMESPACES):
        os.makedirs(os.path.join(str(state_dir), d), exist_ok=True)
    (state_dir / "FORMAT").write_bytes(b"kxen-agent-state 1\n")
    io = TracingIO()
    store = Store(str(state_dir), io=io, namespaces=CLI_NAMESPACES)
    store.put("blob", b"z")
    fmt = io.ops.index(("rename", os.path.join(store.root, "FORMAT")))
    synced = {p for op, p in io.ops[:fmt] if op == "fsync_dir"}
    assert {os.path.dirname(os.path.join(store.root, d)) for d in skeleton_dirs(CLI_NAMESPACES)} <= synced


def test_upgrading_a_version_2_dir_makes_the_step_logs_dirs_durable_before_format(state_dir):
    # Version 2's skeleton has no steps/ (§10.2): the first write of this
    # version makes it, syncs every skeleton directory's parent (those
    # found existing too), and only then replaces FORMAT with version 3.
    for d in skeleton_dirs(CLI_NAMESPACES):
        if d.split(os.sep)[0] != "steps":
            os.makedirs(os.path.join(str(state_dir), d), exist_ok=True)
    (state_dir / "FORMAT").write_bytes(b"kxen-agent-state 2\n")
    io = TracingIO()
    store = Store(str(state_dir), io=io, namespaces=CLI_NAMESPACES)
    assert store.format_version == 2 and not os.path.exists(os.path.join(store.root, "steps"))
    store.put("blob", b"z")
    fmt = io.ops.index(("rename", os.path.join(store.root, "FORMAT")))
    for d in ("steps", os.path.join("steps", "sessions")):
        made = io.ops.index(("mkdir", os.path.join(store.root, d)))
        assert ("fsync_dir", os.path.dirname(os.path.join(store.root, d))) in io.ops[made:fmt], d
    synced = {p for op, p in io.ops[:fmt] if op == "fsync_dir"}
    assert {os.path.dirname(os.path.join(store.root, d)) for d in skeleton_dirs(CLI_NAMESPACES)} <= synced
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"
    assert fsck(Store(store.root, namespaces=CLI_NAMESPACES)).clean


def test_a_first_write_that_died_before_format_leaves_a_usable_empty_dir(tmp_path):
    root = tmp_path / "state"
    root.mkdir()
    for rel in skeleton_dirs(CLI_NAMESPACES)[:40]:
        (root / rel).mkdir()
    (root / "FORMAT.tmp_0123456789abcdef").write_bytes(b"kxen-agent-state 4\n")
    store = Store(str(root))
    assert not store.exists
    store.put("blob", b"hello")
    assert (root / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"
    assert os.path.isdir(root / "steps")  # the rest of the skeleton was made
    # Anything else in it is somebody else's directory.
    other = tmp_path / "other"
    (other / "objects" / "zz").mkdir(parents=True)
    with pytest.raises(StateDirError, match="not a kxen-agent state dir"):
        Store(str(other))


@pytest.mark.parametrize("found", [False, True], ids=["made", "found"])
def test_existing_ref_dirs_have_their_names_synced_before_the_commit(state_dir, populated, found):
    # A namespace outside the skeleton: its directories are made on first
    # use, and a found-existing one has its name synced (§9.1): steps/<ns>
    # before a transaction's commit (§6.8 writing step 1), refs/<ns> and
    # logs/<ns> before a checkpoint's.
    if found:  # made by a process that died before it synced their parents
        for top in ("refs", "logs", "steps"):
            os.makedirs(os.path.join(str(state_dir), top, "agents"))
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    store.refs.transaction("agents/s2", [RefUpdate("head", None, populated["a"])], reason="x")
    steps_path = store.refs.steps_path("agents/s2")
    renamed = io.ops.index(("rename", steps_path))  # a new log: its directory's fsync is the commit point
    assert io.ops[renamed + 1] == ("fsync_dir", os.path.dirname(steps_path))
    assert os.path.join(store.root, "steps") in [p for op, p in io.ops[:renamed] if op == "fsync_dir"]
    io.ops.clear()
    assert store.refs.checkpoint("agents/s2")
    commit = io.ops.index(("rename", store.refs.ref_path("agents/s2")))
    before = [p for op, p in io.ops[:commit] if op == "fsync_dir"]
    for d in ("refs", "logs"):
        assert os.path.join(store.root, d) in before
    assert Store(str(state_dir)).refs.get("agents/s2", "head") == populated["a"]


def test_skeleton_ref_dirs_need_no_sync_of_their_parents(state_dir, populated):
    io = TracingIO()
    store = Store(str(state_dir), io=io, namespaces=CLI_NAMESPACES)
    store.refs.transaction("sessions/s2", [RefUpdate("head", None, populated["a"])], reason="x")
    synced = [p for op, p in io.ops if op == "fsync_dir"]
    assert synced == [
        # (no fsync of the state dir and its parent: the settled marker says they returned, §10.3)
        os.path.join(store.root, "steps", "sessions"),  # the new step log's name: the commit
    ]
    io.ops.clear()
    assert store.refs.checkpoint("sessions/s2")
    synced = [p for op, p in io.ops if op == "fsync_dir"]
    assert synced == [
        os.path.join(store.root, "logs", "sessions"),  # a new reflog's name
        os.path.join(store.root, "refs", "sessions"),  # the ref file's rename: the checkpoint's commit
        os.path.join(store.root, "steps", "sessions"),  # the log's new generation
    ]
    io.ops.clear()
    store.refs.transaction("sessions/s2", [RefUpdate("head", populated["a"], populated["b"])], reason="y")
    assert [p for op, p in io.ops if op == "fsync_dir"] == []  # a log this instance made: one file fsync
    assert [op for op, _ in io.ops] == ["append", "fsync"]


def test_a_reflog_no_commit_counts_has_its_name_synced(state_dir, populated):
    # A group's first checkpoint died after creating its reflog, before the
    # directory fsync and its commit: the file exists, the ref file's log is 0.
    log = _touch(os.path.join(str(state_dir), "logs", "sessions", "s3"), b"uncommitted tail\n")
    io = TracingIO()
    store = Store(str(state_dir), io=io)
    store.refs.transaction("sessions/s3", [RefUpdate("head", None, populated["a"])], reason="x")
    assert store.refs.checkpoint("sessions/s3")
    appended = io.ops.index(("append", log))
    commit = io.ops.index(("rename", store.refs.ref_path("sessions/s3")))
    assert ("fsync_dir", os.path.dirname(log)) in io.ops[appended:commit]
    assert [e.reason for e in store.refs.reflog("sessions/s3")] == ["x"]
    with open(log, "rb") as f:
        assert b"uncommitted tail" not in f.read()


def test_a_step_log_found_existing_has_its_name_synced_before_the_append(state_dir, populated):
    # The step log's counterpart (§6.8 writing step 3.2): another instance
    # made G's log and may have died before syncing steps/<ns>; this one
    # syncs it once before its first append to that file.
    steps_dir = os.path.join(str(state_dir), "steps", "sessions")
    io = TracingIO()
    store = Store(str(state_dir), io=io, namespaces=CLI_NAMESPACES)
    a, b = populated["a"], populated["b"]
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="found")
    path = store.refs.steps_path(G)
    appended = io.ops.index(("append", path))
    assert ("fsync_dir", steps_dir) in io.ops[:appended]
    io.ops.clear()
    store.refs.transaction(G, [RefUpdate("head", b, a)], reason="again")
    assert ("fsync_dir", steps_dir) not in io.ops  # once per log file per instance
    # Another instance's checkpoint replaced the file: a new one, synced again.
    assert Store(str(state_dir)).refs.checkpoint(G)
    io.ops.clear()
    store.refs.transaction(G, [RefUpdate("head", a, b)], reason="after a checkpoint")
    appended = io.ops.index(("append", path))
    assert ("fsync_dir", steps_dir) in io.ops[:appended]
    assert [e.reason for e in Store(str(state_dir)).refs.reflog(G)] == ["first", "found", "again",
                                                                        "after a checkpoint"]


# ------------------------------------------------- 3. element limit (§2.7)


def test_the_element_limit_is_two_to_the_24(store: Store):
    assert codec.MAX_ITEMS == 2**24
    body = b"\x9a\x01\x00\x00\x01" + b"\x00" * (2**24 + 1)  # the data could hold it
    with pytest.raises(DecodeError) as ei:
        codec.decode(body)
    assert str(ei.value) == "array declares 16777217 elements, more than the limit 16777216 (at byte 0)"


def test_the_encoder_refuses_what_the_decoder_would(monkeypatch):
    monkeypatch.setattr(codec, "MAX_ITEMS", 3)
    assert codec.decode(codec.encode([1, 2, 3])) == [1, 2, 3]
    with pytest.raises(EncodeError, match="array of 4 elements, more than the limit 3"):
        codec.encode([1, 2, 3, 4])
    with pytest.raises(EncodeError, match="map of 4 entries, more than the limit 3"):
        encode_object("message", {"a": 1, "b": 2, "c": 3, "d": 4})
    with pytest.raises(DecodeError, match="map declares 4 entries, more than the limit 3"):
        codec.decode(bytes.fromhex("a4616101616202616303616404"))


def test_decode_limit_message_names_the_limit():
    with pytest.raises(DecodeError, match=r"array declares 3 elements, more than the limit 2 \(at byte 1\)"):
        codec.decode(bytes.fromhex("8183000000"), max_items=2)


# ------------------------------------------------- 4. fsck


def test_fsck_checks_the_reflog_against_one_snapshot(store: Store, populated):
    other = Store(store.root)
    real_read = store.refs.read
    commits = []

    def read_then_someone_commits(group):
        state = real_read(group)
        if not commits:  # a commit lands between the ref file read and the reflog read
            commits.append(other.refs.transaction(G, [RefUpdate("head", populated["a"], populated["b"])], reason="x"))
        return state

    store.refs.read = read_then_someone_commits
    rep = fsck(store)
    assert commits and rep.problems == []


def test_reflog_refuses_a_state_of_another_group(store: Store, populated):
    with pytest.raises(ValueError):
        store.refs.reflog("sessions/other", store.refs.read(G))


@pytest.mark.parametrize("entry", ["dir", "has space", "x.lock"])
def test_fsck_survives_odd_entries_under_refs(store: Store, populated, entry):
    path = os.path.join(os.path.dirname(store.refs.ref_path(G)), entry)
    if entry == "dir":
        os.makedirs(os.path.join(path, "inner"))
    else:
        _touch(path, b"junk")
    rep = fsck(store)
    assert [(p.kind, p.where) for p in rep.problems] == [("corrupt-ref", f"sessions/{entry}")]
    if entry == "dir":
        with pytest.raises(CorruptRef, match="Is a directory"):
            store.refs.read("sessions/dir")


def test_a_non_object_name_under_objects_is_a_stray(store: Store, populated):
    stray = _touch(os.path.join(store.root, "objects", "AB"), b"x")
    assert len(list(store.iter_ids())) == 2
    rep = fsck(store)
    assert rep.clean and rep.stray_files == [stray]


def test_a_skeleton_dir_missing_or_replaced_by_a_file_is_a_problem(store: Store, populated):
    gone = os.path.join(store.root, "objects", "ab")
    os.rmdir(gone)  # an empty skeleton fan-out dir
    in_the_way = os.path.join(store.root, "objects", "cd")
    os.rmdir(in_the_way)
    _touch(in_the_way, b"x")
    rep = fsck(store)
    assert sorted((p.kind, p.where) for p in rep.problems) == [("skeleton", gone), ("skeleton", in_the_way)]
    assert "missing" in rep.problems[0].message + rep.problems[1].message
    assert rep.stray_files == []
    # A write into the missing fan-out dir makes it again.
    obj = _blob_in("ab")
    Store(store.root).put_raw(obj)
    assert [p.where for p in fsck(store).problems] == [in_the_way]


def test_upgrading_a_version_1_dir_refuses_a_file_in_the_skeletons_way(state_dir):
    os.makedirs(os.path.join(str(state_dir), "objects"))
    _touch(os.path.join(str(state_dir), "objects", "ab"), b"x")
    (state_dir / "FORMAT").write_bytes(b"kxen-agent-state 1\n")
    store = Store(str(state_dir))
    with pytest.raises(StateDirError, match=r"objects/ab is in the way .* move it out of the state dir"):
        store.put("blob", b"y")
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 1\n"  # not upgraded


def test_temp_files_anywhere_are_strays_not_problems(store: Store, populated):
    root = store.root
    strays = sorted(
        _touch(os.path.join(root, *p))
        for p in [
            ("FORMAT.tmp_0123456789abcdef",),
            ("refs", "sessions", TEMP),
            ("logs", "sessions", TEMP),
            ("steps", "sessions", TEMP),
            ("objects", "pack", "tmp_pack_0123456789abcdef"),
            ("objects", "00", TEMP),
        ]
    )
    rep = fsck(store)
    assert rep.clean and rep.stray_files == strays
    assert rep.to_json()["strayFiles"] == strays


# ------------------------------------------------- 5. only lower-case names are objects (§5.1)


def test_upper_case_object_names_are_strays(store: Store, populated):
    h = populated["b"].hex()
    with open(store.loose.path(populated["b"]), "rb") as f:
        frame = f.read()
    upper_file = _touch(os.path.join(store.root, "objects", h[:2], h[2:].upper()), frame)
    upper_dir = os.path.join(store.root, "objects", h[:2].upper() if h[:2].upper() != h[:2] else "AB")
    _touch(os.path.join(upper_dir, h[2:]), frame)
    assert sorted(store.iter_ids()) == sorted(populated.values())
    rep = fsck(store)
    assert rep.clean and rep.objects == 2
    assert rep.stray_files == sorted([upper_file, upper_dir])


def test_a_non_hex_name_does_not_break_prefix_lookup(store: Store, populated):
    _touch(os.path.join(store.root, "objects", "ab", "000000" + "z" * 56))
    with pytest.raises(MissingObject):
        store.resolve("ab000000")


# ------------------------------------------------- 6. strict ref file and reflog (§6.3, §7.1)

_ID = "ab" * 32


@pytest.mark.parametrize("value", ["+1", "007", "1_0", "-5", " 1", "1 ", "1\r", "٣", ""])
@pytest.mark.parametrize("line", ["fence", "log", "deleted"])
def test_ref_file_numbers_are_plain_decimals(line, value):
    fields = {"fence": "1", "log": "0", "deleted": "5"}
    fields[line] = value
    text = f"kxen-refs 1\nfence {fields['fence']}\nlog {fields['log']}\ndeleted {fields['deleted']}\n{_ID} head\n"
    with pytest.raises(CorruptRef):
        parse_ref_file(text.encode("utf-8"), G, "x")
    good = text.replace(f"{line} {value}\n", f"{line} 10\n")
    assert parse_ref_file(good.encode(), G, "x").refs == {"head": bytes.fromhex(_ID)}


def _line() -> str:
    e = ReflogEntry(None, bytes.fromhex(_ID), 1700000000000000000, 3, "head", "a reason")
    return format_reflog_line(e).decode()


@pytest.mark.parametrize(
    ("old", "new"),
    [(" 3 head\t", " +3 head\t"), (" 3 head\t", " 03 head\t"), (" 3 head\t", " 1_0 head\t"),
     (" 3 head\t", " -3 head\t"), (" 3 head\t", "  3 head\t"), (" 1700000000000000000 ", " 1_700000000000000000 "),
     (_ID, _ID.upper()), ("00000000", "0000000O"), (" head\t", " x.lock\t"), (" head\t", " head\r\t"),
     ("a reason\n", "a reason\r\n"), ("a reason", "a  reason"), ("a reason", " a reason"), ("\ta reason", " a reason")],
)
def test_reflog_lines_are_strict(old, new):
    good = _line()
    assert parse_reflog(good.encode(), "x")[0].fence == 3
    bad = good.replace(old, new, 1)
    assert bad != good
    with pytest.raises(CorruptRef):
        parse_reflog(bad.encode(), "x")


# ------------------------------------------------- 7. the all-zero id is not a ref value (§6.3, §6.4)


@pytest.mark.parametrize("update", [RefUpdate("head", None, bytes(32)), RefUpdate("head", bytes(32), b"\x01" * 32),
                                    RefUpdate("head", None, b"short")])
def test_zero_or_malformed_ref_values_are_refused_before_anything_is_written(store: Store, update):
    with pytest.raises(BadRefValue) as ei:
        store.refs.transaction(G, [update], reason="x")
    assert isinstance(ei.value, KxenError) and isinstance(ei.value, ValueError)
    assert "all-zero" in str(ei.value) or "not a 32-byte object id" in str(ei.value)
    assert store.refs.read(G).exists is False


def test_a_ref_file_holding_the_zero_id_is_corrupt():
    with pytest.raises(CorruptRef, match="all-zero id"):
        parse_ref_file(f"kxen-refs 1\nfence 0\nlog 0\n{'0' * 64} head\n".encode(), G, "x")


# ------------------------------------------------- 8. the header's length limit message (§3.1)


@pytest.mark.parametrize("digits", ["999999999", "67108865", "9" * 20])
def test_an_over_long_length_is_refused_as_over_the_limit(digits):
    for kind in ("blob", "message", "journal"):
        with pytest.raises(CorruptObject) as ei:
            objects.parse_object(f"{kind} {digits}\0".encode(), "x")
        assert ei.value.reason == f"declared length {digits} exceeds the limit 67108864"
    with pytest.raises(CorruptObject, match="bad header"):
        objects.parse_object(b"blob " + b"9" * 21 + b"\0", "x")


def test_a_write_remakes_the_lock_directory_removed_by_hand(store: Store, populated):
    # locks/ is a skeleton directory (fsck reports it missing); the next
    # write makes it again, through the seam, before its lock files.
    import shutil

    shutil.rmtree(os.path.join(store.root, "locks"))
    io = TracingIO()
    again = Store(store.root, io=io, namespaces=CLI_NAMESPACES)
    again.refs.transaction(G, [RefUpdate("head", populated["a"], populated["b"])], reason="after rm")
    locks = os.path.join(store.root, "locks")
    assert ("mkdir", locks) in io.ops and ("create", os.path.join(locks, "gc.lock")) in io.ops
    assert io.ops.index(("mkdir", locks)) < io.ops.index(("create", os.path.join(locks, "gc.lock")))
    assert fsck(again).clean  # locks/ and locks/sessions/ are there again
