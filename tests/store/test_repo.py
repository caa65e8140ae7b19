"""The state dir: lazy creation, its FORMAT file, crashes during the first write."""

from __future__ import annotations

import errno
import os

import pytest

from kxen_agent.store import BadRefName, FileIO, RefUpdate, StateDirError, Store, fsck
from kxen_agent.store.repo import NAMESPACE_TOPS, skeleton_dirs

from .helpers import CLI_NAMESPACES, run_python


def test_state_dir_is_created_by_the_first_write_only(state_dir):
    store = Store(str(state_dir))
    assert not state_dir.exists() and not store.exists
    assert list(store.iter_ids()) == []
    assert fsck(store).clean
    assert not state_dir.exists()
    store.put("blob", b"x")
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"
    assert store.exists and Store(str(state_dir)).exists
    assert Store(str(state_dir)).format_version == 4


_CRASH_IN_INIT = r"""
import os, sys
from kxen_agent.store import FileIO, Store
io = FileIO()
def hook(op, path):
    if op == "rename" and os.path.basename(path) == "FORMAT":
        os._exit(9)  # killed after the FORMAT temp file exists, before its rename
io.hook = hook
Store(sys.argv[1], io=io).put("blob", b"x")
"""


def test_a_crash_during_the_first_write_does_not_brick_the_dir(state_dir):
    p = run_python(_CRASH_IN_INIT, str(state_dir))
    assert p.returncode == 9, p.stderr.decode()
    leftovers = os.listdir(state_dir)
    # The skeleton's directories (empty) and the temp file; no FORMAT.
    assert "FORMAT" not in leftovers
    assert [n for n in leftovers if n.startswith("FORMAT.tmp_")] and all(
        n.startswith("FORMAT.tmp_") or n in ("objects", "refs", "logs", "locks", "leases", "steps") for n in leftovers
    )
    assert "steps" in leftovers  # version 3's skeleton, made before FORMAT (§10.3)
    store = Store(str(state_dir))
    oid = store.put("blob", b"x")
    assert store.get(oid) == b"x"
    assert fsck(store).clean


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"kxen-agent-state 99\n", "has format version 99, newer than this kxen-agent understands (4)"),
        (b"kxen-agent-state 5\n", "has format version 5, newer than this kxen-agent understands (4)"),
        (b"kxen-agent-state 0\n", "unknown format version 0"),
        (b"kxen-agent-state 1", "is not a kxen-agent format file"),
        (b"", "is not a kxen-agent format file"),
    ],
)
def test_format_file_is_checked(state_dir, content, reason):
    state_dir.mkdir()
    (state_dir / "FORMAT").write_bytes(content)
    with pytest.raises(StateDirError) as ei:
        Store(str(state_dir))
    assert reason in str(ei.value)
    assert "\n" not in str(ei.value)


def test_foreign_or_non_directory_is_refused(tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.db").write_bytes(b"")
    with pytest.raises(StateDirError, match="is not empty and is not a kxen-agent state dir"):
        Store(str(tmp_path / "foreign"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StateDirError, match="Not a directory"):
        Store(str(tmp_path / "file"))


# ------------------------------------------------------------------ the skeleton's namespaces


def test_the_skeleton_holds_the_namespaces_the_store_is_given(tmp_path):
    bare = Store(str(tmp_path / "bare"))
    bare.ensure_initialized()
    assert bare.namespaces == () and bare.skeleton_dirs() == skeleton_dirs()
    for top in NAMESPACE_TOPS:
        assert os.listdir(tmp_path / "bare" / top) == []  # the store names no namespace of its own
    cli = Store(str(tmp_path / "cli"), namespaces=CLI_NAMESPACES)
    cli.ensure_initialized()
    assert cli.namespaces == CLI_NAMESPACES
    for top in NAMESPACE_TOPS:
        assert os.listdir(tmp_path / "cli" / top) == list(CLI_NAMESPACES)
    assert set(cli.skeleton_dirs()) - set(skeleton_dirs()) == {os.path.join(t, ns) for t in NAMESPACE_TOPS
                                                               for ns in CLI_NAMESPACES}
    # Byte for byte the layout of objects_spec.md §1.3/§10.3: refs/, logs/, locks/, leases/, steps/,
    # each with sessions/.
    tops = ["refs", "logs", "locks", "leases", "steps"]
    assert sorted(NAMESPACE_TOPS) == sorted(tops)
    assert sorted(d for d in cli.skeleton_dirs() if not d.startswith("objects")) == sorted(
        [*tops, *(os.path.join(t, "sessions") for t in tops)])


@pytest.mark.parametrize("ns", ["", "a/b", "tmp_x", "x.lock", "..", "ses sions"])
def test_a_namespace_that_is_no_ref_segment_is_refused(state_dir, ns):
    with pytest.raises(BadRefName, match="invalid namespace"):
        Store(str(state_dir), namespaces=(ns,))
    assert not state_dir.exists()


def test_namespaces_given_as_one_string_are_refused(state_dir):
    with pytest.raises(TypeError, match=r"namespaces=\('sessions',\)"):
        Store(str(state_dir), namespaces="sessions")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        skeleton_dirs("sessions")


def test_a_store_given_no_namespaces_reads_and_checks_a_state_dir_made_with_them(state_dir):
    made = Store(str(state_dir), namespaces=CLI_NAMESPACES)
    oid = made.put("blob", b"x")
    made.refs.transaction("sessions/s1", [RefUpdate("head", None, oid)], reason="first")
    bare = Store(str(state_dir))
    assert bare.refs.get("sessions/s1", "head") == oid
    rep = fsck(bare)
    assert rep.clean and rep.groups == 1 and rep.stray_files == [] and rep.dangling == []
    bare.refs.transaction("sessions/s1", [RefUpdate("head", oid, None)], reason="second")
    assert fsck(Store(str(state_dir), namespaces=CLI_NAMESPACES)).clean


def test_a_namespace_directory_missing_is_damage_only_to_a_store_given_that_namespace(state_dir):
    Store(str(state_dir), namespaces=CLI_NAMESPACES).put("blob", b"x")
    gone = state_dir / "leases" / "sessions"
    gone.rmdir()
    assert fsck(Store(str(state_dir))).clean
    rep = fsck(Store(str(state_dir), namespaces=CLI_NAMESPACES))
    assert [(p.kind, p.where) for p in rep.problems] == [("skeleton", str(gone))]


def test_an_unfinished_first_write_with_other_namespaces_is_not_a_foreign_dir(state_dir):
    # A first write by a store given namespaces died before FORMAT; a store
    # given none (or others) finds only skeleton directories and a FORMAT temp file.
    state_dir.mkdir()
    for rel in skeleton_dirs(("sessions", "agents")):
        (state_dir / rel).mkdir()
    (state_dir / "FORMAT.tmp_0123456789abcdef").write_bytes(b"kxen-agent-state 4\n")
    store = Store(str(state_dir))
    assert not store.exists
    store.put("blob", b"y")
    assert (state_dir / "FORMAT").read_bytes() == b"kxen-agent-state 4\n"
    # A file in a namespace directory is not a skeleton's, nor a directory one level deeper.
    for extra in ("refs/agents/g", "refs/agents/deeper/"):
        other = state_dir.parent / f"other-{extra.count('/')}"
        for rel in skeleton_dirs(("agents",)):
            (other / rel).mkdir(parents=True, exist_ok=True)
        (other / extra).mkdir() if extra.endswith("/") else (other / extra).write_bytes(b"")
        with pytest.raises(StateDirError, match="not a kxen-agent state dir"):
            Store(str(other))


def test_a_state_dir_that_cannot_be_listed_is_an_io_error_not_a_foreign_dir(state_dir):
    # Without FORMAT, the store walks the directory to tell an unfinished
    # first write from somebody else's files. A read error says nothing of
    # whose the directory is: it is reported as what it is (permission
    # denied still means "not ours to fill", test_hardening).
    state_dir.mkdir()
    (state_dir / "objects").mkdir()
    io = FileIO()

    def failing_disk(op: str, path: str) -> None:
        if op == "listdir":
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    io.read_hook = failing_disk
    with pytest.raises(OSError) as ei:
        Store(str(state_dir), io=io)
    assert ei.value.errno == errno.EIO
    io.read_hook = None
    assert not Store(str(state_dir), io=io).exists  # an unfinished empty store, once the disk reads again
