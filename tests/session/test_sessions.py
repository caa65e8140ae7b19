"""SessionStore against both stores: ids, messages, O(1) forks,
fork points, prefix resolution, delete and the fork tree.

Every test that uses the store only as storage runs twice (the ``sessions``
fixture): over a real store on disk and over a ``MemoryStore``, since the
session layer is written against the store protocols. What is about files
(objects written, object files read) runs on disk only (``disk_sessions``).

The workspace is a plain directory (identity ``dir``): nothing here needs
Git. Bulk histories on disk are written through a :class:`FileIO` that
skips fsync (the seam the store provides for tests): durability is not
under test here, and 5,000 fsyncs would dominate the run time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.runtime.lease import Lease
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import (
    BLOB_THRESHOLD,
    SessionStore,
    UnknownSession,
    msg_id,
)
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store import FileIO, RefUpdate, Store
from kxen_agent.store.memory import MemoryStore
from kxen_agent.store.objects import encode_object
from kxen_agent.store.protocols import Repository

SES_RE = re.compile(r"ses_[0-9a-f]{20}")
MSG_RE = re.compile(r"msg_[0-9a-f]{64}")

# Two root messages whose object ids share their first 8 hex digits
# (found by search; the test checks they still collide).
COLLIDING_CONTENTS = ("c60843", "c116812")
COLLIDING_PREFIX = "79442e76"


class NoSyncIO(FileIO):
    """Real files, no fsync; counts reads of object files."""

    def __init__(self) -> None:
        super().__init__()
        self.object_reads = 0

    def read(self, path: str) -> bytes:
        if f"{os.sep}objects{os.sep}" in path:
            self.object_reads += 1
        return super().read(path)

    def write_tmp(self, directory: str, data: bytes, *, sync: bool = True, prefix: str = "tmp_") -> str:
        return super().write_tmp(directory, data, sync=False, prefix=prefix)

    def fsync_dir(self, directory: str) -> None:
        pass

    def fsync_path(self, path: str) -> None:
        pass


@pytest.fixture
def io() -> NoSyncIO:
    return NoSyncIO()


@pytest.fixture
def store(tmp_path: Path, io: NoSyncIO) -> Store:
    return Store(str(tmp_path / "state"), io=io)


@pytest.fixture(params=["disk", "memory"])
def repo(request: pytest.FixtureRequest, store: Store) -> Repository:
    return store if request.param == "disk" else MemoryStore("sessions-test")


@pytest.fixture
def sessions(repo: Repository) -> SessionStore:
    return SessionStore(repo)


@pytest.fixture
def disk_sessions(store: Store) -> SessionStore:
    return SessionStore(store)


@pytest.fixture
def wsdir(tmp_path: Path) -> str:
    d = tmp_path / "ws"
    d.mkdir()
    return str(d)


def new_session(sessions: SessionStore, wsdir: str, messages: list[dict] | None = None):
    info = sessions.create(default_agent_definition([{"content": "done"}]), inspect_workspace(wsdir))
    if messages:
        head = sessions.append_messages(None, messages)
        sessions.store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="test: history")
    return sessions.get(info.id)


def chat(n: int, tag: str = "m") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} {i}"} for i in range(n)]


def tool_turn_history() -> list[dict]:
    """user, assistant asking two calls, their two results, final answer."""
    return [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "two calls", "tool_calls": [
            {"id": "call_a", "name": "shell", "arguments": "{}"},
            {"id": "call_b", "name": "shell", "arguments": "{}"},
        ]},
        {"role": "tool", "content": "out a", "tool_call_id": "call_a"},
        {"role": "tool", "content": "out b", "tool_call_id": "call_b"},
        {"role": "assistant", "content": "finished"},
    ]


def object_files(store: Store) -> set[bytes]:
    """The ids of every object stored: loose files, packs and step logs, as a fresh process reads them."""
    return set(Store(store.root, namespaces=store.namespaces).iter_ids())


def ids(sessions: SessionStore, head: bytes | None) -> list[str]:
    return [m.id for m in sessions.iter_forward(head)]


# ---------------------------------------------------------------- identities


def test_ids_and_root_session_fields(sessions: SessionStore, wsdir: str) -> None:
    info = new_session(sessions, wsdir, chat(3))
    assert SES_RE.fullmatch(info.id)
    j = info.to_json()
    assert j["parentId"] is None and j["forkPoint"] is None and j["forkKind"] is None
    assert j["branchRootId"] == info.id
    assert re.fullmatch(r"[0-9a-f]{64}", j["agentLock"])
    msgs = sessions.history(info.head)
    assert [m.seq for m in msgs] == [0, 1, 2]
    for m in msgs:
        assert MSG_RE.fullmatch(m.id)
        assert m.id == "msg_" + m.oid.hex() == msg_id(m.oid)
    assert j["head"] == msgs[-1].id
    assert sessions.message_count(info) == 3
    # Ids are random, not derived from content: the same inputs make another id.
    assert new_session(sessions, wsdir).id != info.id


def test_large_identical_contents_are_one_blob(sessions: SessionStore, wsdir: str) -> None:
    big = "x" * (BLOB_THRESHOLD + 1)
    info = new_session(sessions, wsdir, [{"role": "user", "content": "a"}])
    store = sessions.store
    before, ids_before = (object_files(store) if isinstance(store, Store) else set()), set(store.iter_ids())
    head = sessions.append_messages(info.head, [
        {"role": "tool", "content": big, "tool_call_id": "c1"},
        {"role": "tool", "content": big, "tool_call_id": "c2"},
    ])
    # Two message objects and a single shared blob.
    assert len(set(store.iter_ids()) - ids_before) == 3
    if isinstance(store, Store):
        assert len(object_files(store) - before) == 3
    assert [m.content for m in sessions.history(head)][1:] == [big, big]


# ---------------------------------------------------------------- O(1) forks


def test_fork_cost_does_not_grow_with_the_history(disk_sessions: SessionStore, store: Store, io: NoSyncIO,
                                                  wsdir: str) -> None:
    sessions = disk_sessions
    reads = {}
    for n in (10, 5000):
        parent = new_session(sessions, wsdir, chat(n, tag=f"h{n}"))
        first = sessions.history(parent.head)[0]
        for at in (None, first.id[:12]):
            before = object_files(store)
            io.object_reads = 0
            fork = sessions.fork(parent.id, at=at)
            if at is None:
                reads[n] = io.object_reads
            added = object_files(store) - before
            # Exactly one new object: the fork's metadata; no message is copied.
            assert added == {fork.meta_oid}, f"fork of a {n}-message history at {at} wrote {len(added)} objects"
            if at is None:
                assert fork.head == parent.head
            else:
                assert fork.head == first.oid and ids(sessions, fork.head) == [first.id]
    # At the head, a fork reads the same objects whatever the history's length.
    assert reads[10] == reads[5000], reads


def test_fork_shares_history_and_fields(sessions: SessionStore, wsdir: str) -> None:
    parent = new_session(sessions, wsdir, chat(6))
    hist = sessions.history(parent.head)
    fork = sessions.fork(parent.id, at=hist[3].id[:14])
    assert ids(sessions, fork.head) == [m.id for m in hist[:4]]
    assert fork.meta["parentId"] == parent.id
    assert fork.meta["branchRootId"] == parent.id
    assert fork.meta["forkPoint"] == hist[3].id
    assert fork.meta["forkKind"] == "conversation"
    assert fork.agent_oid == parent.agent_oid
    assert fork.meta["workspace"] == parent.meta["workspace"]
    grand = sessions.fork(fork.id)
    assert grand.meta["branchRootId"] == parent.id and grand.meta["parentId"] == fork.id
    # Writing into the fork leaves the parent alone.
    new_head = sessions.append_messages(fork.head, [{"role": "user", "content": "only in the fork"}])
    sessions.store.refs.transaction(fork.group, [RefUpdate("head", fork.head, new_head)], reason="test")
    assert ids(sessions, sessions.get(parent.id).head) == [m.id for m in hist]
    assert len(ids(sessions, new_head)) == 5


def test_fork_needs_no_lease_and_leaves_the_fence_alone(sessions: SessionStore, wsdir: str) -> None:
    store = sessions.store
    parent = new_session(sessions, wsdir, chat(4))
    lease = Lease.acquire(store, parent.id, run="run_test", purpose="run")
    try:
        fence = store.refs.read(parent.group).fence
        fork = sessions.fork(parent.id)
        at = sessions.fork(parent.id, at=sessions.history(parent.head)[1].id)
        assert fork.head == parent.head and at.meta["parentId"] == parent.id
        assert store.refs.read(parent.group).fence == fence == lease.fence
        lease.check()  # still ours
    finally:
        lease.release()


def test_fork_of_an_empty_session(sessions: SessionStore, wsdir: str) -> None:
    parent = new_session(sessions, wsdir)
    fork = sessions.fork(parent.id)
    assert fork.head is None and fork.meta["forkPoint"] is None


# ---------------------------------------------------------------- fork points


def test_fork_refuses_to_split_a_tool_call_from_its_results(sessions: SessionStore, wsdir: str) -> None:
    parent = new_session(sessions, wsdir, tool_turn_history())
    user, asking, res_a, res_b, final = sessions.history(parent.head)
    for bad in (asking, res_a):
        with pytest.raises(UsageError) as e:
            sessions.fork(parent.id, at=bad.id)
        text = str(e.value)
        assert "split" in text and "call_b" in text
        assert user.id in text and res_b.id in text, text  # the nearest valid points
    for good in (user, res_b, final):
        assert sessions.fork(parent.id, at=good.id).head == good.oid


def test_default_fork_refuses_a_head_with_pending_tool_calls(sessions: SessionStore, wsdir: str) -> None:
    parent = new_session(sessions, wsdir, tool_turn_history()[:2])
    user = sessions.history(parent.head)[0]
    count = len(sessions.list())
    with pytest.raises(KxenError) as e:
        sessions.fork(parent.id)
    assert user.id in str(e.value) and "call_a" in str(e.value)
    assert len(sessions.list()) == count
    assert sessions.fork(parent.id, at=user.id).head == user.oid


def test_fork_point_prefixes(sessions: SessionStore, wsdir: str) -> None:
    store = sessions.store
    parent = new_session(sessions, wsdir, chat(5))
    other = new_session(sessions, wsdir, chat(3, tag="other"))
    hist = sessions.history(parent.head)
    count = len(sessions.list())
    assert sessions.fork(parent.id, at="msg_" + hist[2].oid.hex()[:8]).head == hist[2].oid
    assert sessions.fork(parent.id, at=hist[2].id.upper().replace("MSG_", "msg_")).head == hist[2].oid
    count += 2

    def refused(at: str, *needles: str) -> None:
        with pytest.raises(UsageError) as e:
            sessions.fork(parent.id, at=at)
        for n in needles:
            assert n in str(e.value), str(e.value)
        assert len(sessions.list()) == count

    refused("msg_1234567", "not a message id")  # 7 digits
    refused(hist[2].oid.hex()[:12], "not a message id")  # no msg_ prefix
    refused("msg_xyz12345", "not a message id")
    unknown = next(p for p in ("00000000", "ffffffff", "0f0f0f0f") if not any(
        i.hex().startswith(p) for i in store.iter_ids()))
    refused("msg_" + unknown, "not in state dir", store.root)
    refused("msg_" + parent.agent_oid.hex()[:10], "not a message")
    # In the store, but in another session's history (forks share objects, so
    # membership is decided by walking this session's chain).
    refused(sessions.history(other.head)[1].id[:14], "not in the history of session", parent.id)
    # A message newer than the parent's head (only in a fork) is not in the parent.
    fork = sessions.fork(parent.id, at=hist[1].id)
    count += 1
    extra = sessions.append_messages(fork.head, [{"role": "user", "content": "fork only"}])
    store.refs.transaction(fork.group, [RefUpdate("head", fork.head, extra)], reason="test")
    refused(msg_id(extra), "not in the history")


def test_ambiguous_message_prefix_is_refused(sessions: SessionStore, wsdir: str) -> None:
    a = new_session(sessions, wsdir, [{"role": "user", "content": COLLIDING_CONTENTS[0]}])
    b = new_session(sessions, wsdir, [{"role": "user", "content": COLLIDING_CONTENTS[1]}])
    assert a.head.hex()[:8] == b.head.hex()[:8] == COLLIDING_PREFIX
    assert encode_object("message", {"seq": 0, "role": "user", "content": COLLIDING_CONTENTS[0]}).id == a.head
    with pytest.raises(UsageError) as e:
        sessions.fork(a.id, at="msg_" + COLLIDING_PREFIX)
    assert "ambiguous" in str(e.value)
    # One more digit decides.
    assert sessions.fork(a.id, at="msg_" + a.head.hex()[:12]).head == a.head


# ---------------------------------------------------------------- lookup, delete, tree


def test_unknown_and_malformed_session_ids(sessions: SessionStore) -> None:
    store = sessions.store
    with pytest.raises(UnknownSession) as e:
        sessions.get("ses_00000000000000000000")
    assert store.root in str(e.value) and "session import" in str(e.value)
    assert e.value.exit_code == 1
    for bad in ("ses_", "bogus", "ses_ABC12345", "ses_../../x", "msg_0000000000"):
        with pytest.raises(UsageError):
            sessions.get(bad)


def test_delete_hides_and_tree_keeps_the_forks_of_a_deleted_fork(sessions: SessionStore, wsdir: str) -> None:
    root = new_session(sessions, wsdir, chat(4))
    mid = sessions.fork(root.id)
    leaf = sessions.fork(mid.id)
    side = sessions.fork(root.id)
    r, children, family = sessions.tree(leaf.id)
    assert r == root.id
    assert children[root.id] == [mid.id, side.id] and children[mid.id] == [leaf.id]

    sessions.delete(mid.id)
    assert mid.id not in [s.id for s in sessions.list()]
    with pytest.raises(UnknownSession):
        sessions.get(mid.id)
    with pytest.raises(UnknownSession):
        sessions.delete(mid.id)
    assert sessions.get(mid.id, include_deleted=True).deleted_ns is not None
    r, children, family = sessions.tree(root.id)
    assert children[root.id] == [mid.id, side.id]
    assert children[mid.id] == [leaf.id], "the fork of a deleted fork vanished from the tree"
    assert family[mid.id].deleted_ns is not None
    # The leaf still reads its (shared) history.
    assert ids(sessions, sessions.get(leaf.id).head) == ids(sessions, root.head)


def test_iter_forward_streams_oldest_first(sessions: SessionStore, wsdir: str) -> None:
    info = new_session(sessions, wsdir, chat(50))
    fwd = list(sessions.iter_forward(info.head))
    assert [m.seq for m in fwd] == list(range(50))
    assert [m.id for m in fwd] == [m.id for m in reversed(list(sessions.iter_back(info.head)))]
    assert list(sessions.iter_forward(None)) == []
