"""A hostile remote: ``session pull`` refuses what does not verify, and writes nothing to the state dir.

Each case builds the remote's Git objects by hand (``store/gitmap.py``'s
encoders, packed and indexed by ``git index-pack``) from a real session,
then breaks one thing: a ref naming an object the remote does not hold,
bytes that do not hash to their kxen id, an object that hashes right but
breaks the session schema, a link or ref to the wrong kind, another
session's image under the ref, a commit that is no image at all. The pull
must refuse in one line — into a fresh state dir (which must not appear)
and into one holding another session (whose files must not change). The
2 GiB object is an opt-in slow case.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from kxen_agent.errors import KxenError
from kxen_agent.session import SessionStore, default_agent_definition, inspect_workspace
from kxen_agent.session.remote_pull import pull_sessions
from kxen_agent.store import RawObject, RefUpdate, Store, encode_object
from kxen_agent.store.gitmap import (
    GitObject,
    TreeEntry,
    encode_commit,
    encode_pack,
    encode_tree,
    git_object,
    group_commit,
    object_blob,
    Commit,
)
from kxen_agent.store.objects import MAX_OBJECT_SIZE, decode_stored, links_of
from tests.helpers import depth, git
from tests.remote.conftest import STEPS, Machine, Remote, make_machine
from tests.remote.gitserver import bare_repo


def _session(m: Machine) -> tuple[str, dict[str, bytes], dict[bytes, RawObject]]:
    """A real session in ``m``'s state dir (two messages, one long enough for a blob): id, refs, objects."""
    store = Store.open(str(m.state), namespaces=("sessions",))
    sessions = SessionStore(store)
    info = sessions.create(default_agent_definition(STEPS), inspect_workspace(str(m.ws)))
    head = sessions.append_messages(None, [{"role": "user", "content": "hello"},
                                           {"role": "assistant", "content": "x" * 2000}])
    store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="test")
    refs = dict(store.refs.read(info.group).refs)
    objs: dict[bytes, RawObject] = {}
    stack = list(refs.values())
    while stack:
        oid = stack.pop()
        if oid in objs:
            continue
        objs[oid] = store.read_raw(oid)
        stack.extend(links_of(objs[oid].kind, decode_stored(objs[oid])))
    return info.id, refs, objs


def _plant(remote: Remote, ses: str, group: str, refs: dict[str, bytes], blobs: dict[bytes, bytes],
           extra: list[GitObject] = ()) -> None:
    """Write an image by hand: ``blobs`` (kxen id -> the blob's bytes) under an objects commit, a group commit."""
    subtrees: dict[str, list[TreeEntry]] = {}
    made: list[GitObject] = list(extra)
    for kid, data in blobs.items():
        b = git_object("blob", data)
        made.append(b)
        subtrees.setdefault(kid.hex()[:2], []).append(TreeEntry(b"100644", kid.hex()[2:].encode(), b.oid))
    tops = []
    for k, entries in subtrees.items():
        t = git_object("tree", encode_tree(entries))
        made.append(t)
        tops.append(TreeEntry(b"40000", k.encode(), t.oid))
    root = git_object("tree", encode_tree(tops))
    oc = git_object("commit", encode_commit(Commit(root.oid, (), 1700000000, b"kxen objects %d\n" % len(blobs))))
    gc = group_commit(group, 0, refs, [oc.oid], 1700000000, [("messages", "2")])
    made += [root, oc] + gc
    _install(remote, made, {f"refs/kxen/sessions/{ses}": gc[-1].hex})


def _install(remote: Remote, objects: list[GitObject], refs: dict[str, str]) -> None:
    pack = encode_pack(objects)
    path = remote.path / "objects" / "pack" / f"pack-{pack[-20:].hex()}.pack"
    path.write_bytes(pack)
    subprocess.run(["git", "-C", str(remote.path), "index-pack", str(path)], check=True, capture_output=True)
    for ref, oid in refs.items():
        remote.git("update-ref", ref, oid)


def _raw(objs: dict[bytes, RawObject]) -> dict[bytes, bytes]:
    return {k: o.raw for k, o in objs.items()}


def _bad_message() -> RawObject:
    """A message that hashes right but whose ``seq`` is text (§14.4 says int)."""
    return encode_object("message", {"seq": "0", "role": "user", "content": "hi"})


Case = Callable[[Remote, str, dict[str, bytes], dict[bytes, RawObject]], str]


def absent_object(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    blobs = _raw(objs)
    del blobs[refs["head"]]
    _plant(remote, ses, f"sessions/{ses}", refs, blobs)
    return "which the remote does not hold"


def bytes_not_matching_the_id(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    blobs = _raw(objs)
    blobs[refs["head"]] = blobs[refs["head"]].replace(b"x" * 10, b"y" * 10) if b"x" * 10 in blobs[refs["head"]] \
        else blobs[refs["head"]][:-1] + b"!"
    _plant(remote, ses, f"sessions/{ses}", refs, blobs)
    return "not to its id"


def schema_violation(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    bad = _bad_message()
    blobs = dict(_raw(objs), **{})
    blobs[bad.id] = bad.raw
    _plant(remote, ses, f"sessions/{ses}", dict(refs, head=bad.id), blobs)
    return "does not match objects_spec.md"


def ref_of_the_wrong_kind(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    agent = decode_stored(objs[refs["meta"]])["agent"]
    _plant(remote, ses, f"sessions/{ses}", dict(refs, head=agent), _raw(objs))
    # Found as the walk meets it: the ref's target is an agent, or it is asked to be both.
    return "a message"


def another_sessions_image(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    other = "ses_0123456789abcdef0123"
    _plant(remote, other, f"sessions/{other}", refs, _raw(objs))
    remote.git("update-ref", f"refs/kxen/sessions/{ses}", remote.git("rev-parse", f"refs/kxen/sessions/{other}").strip())
    remote.git("update-ref", "-d", f"refs/kxen/sessions/{other}")
    return f"not of sessions/{ses}"


def not_an_image(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    remote.git("update-ref", f"refs/kxen/sessions/{ses}", remote.git("rev-parse", "refs/heads/main").strip())
    return "not a commit of a kxen Git image"


def metadata_of_another_session(remote: Remote, ses: str, refs: dict, objs: dict) -> str:
    meta = decode_stored(objs[refs["meta"]])
    other = encode_object("session", dict(meta, id="ses_0123456789abcdef0123"))
    blobs = _raw(objs)
    blobs[other.id] = other.raw
    _plant(remote, ses, f"sessions/{ses}", dict(refs, meta=other.id), blobs)
    return "the metadata of session"


CASES = [absent_object, bytes_not_matching_the_id, schema_violation, ref_of_the_wrong_kind,
         another_sessions_image, not_an_image, metadata_of_another_session]


@dataclass
class Hostile:
    remote: Remote
    a: Machine  # wrote the sessions the cases break
    b: Machine  # no state dir
    c: Machine  # a state dir of its own


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """One served remote, and the machines; each case breaks a session of its own there."""
    tmp = tmp_path_factory.mktemp("hostile")
    base = tmp / "served"
    base.mkdir()
    path = bare_repo(base / "remote.git")
    seed = tmp / "seed"
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    git(seed, "commit", "-q", "--allow-empty", "-m", "code")
    git(seed, "push", "-q", str(path), "main")
    subprocess.run(["git", "-C", str(path), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    remote = Remote(path, str(path))
    c = make_machine(tmp, "c", remote)
    c.run("something of c's own")
    yield Hostile(remote, make_machine(tmp, "a", remote), make_machine(tmp, "b", remote), c)


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_a_hostile_remote_is_refused_with_nothing_written(case: Case, hostile: Hostile) -> None:
    ses, refs, objs = _session(hostile.a)
    why = case(hostile.remote, ses, refs, objs)
    before = hostile.c.snapshot()
    for m in (hostile.b, hostile.c):
        store = Store.open(str(m.state), namespaces=("sessions",))
        with pytest.raises(KxenError) as refused:
            pull_sessions(store, [ses], str(m.ws))
        msg = str(refused.value)
        assert why in msg and "\n" not in msg and "nothing was pulled" in msg, msg
        if case is ref_of_the_wrong_kind:
            assert "an agent" in msg, msg
    # Nothing written: no state dir where there was none, not a byte changed where there was one.
    assert not hostile.b.state.exists()
    assert hostile.c.snapshot() == before


def test_the_refusal_is_one_line_and_exit_1(hostile: Hostile) -> None:
    ses, refs, objs = _session(hostile.a)
    why = bytes_not_matching_the_id(hostile.remote, ses, refs, objs)
    err = hostile.b.kx.refused("session", "pull", ses, cwd=hostile.b.ws)
    assert why in err, err
    assert not hostile.b.state.exists()
    before = hostile.c.snapshot()
    assert why in hostile.c.kx.refused("session", "pull", ses, cwd=hostile.c.ws)
    assert hostile.c.snapshot() == before
    hostile.c.kx.fsck_clean()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["path"])
def test_an_object_over_the_size_limit_is_refused_before_it_is_read(served: Remote, tmp_path: Path) -> None:
    """The pull learns the size from Git's object header and refuses before reading the object.
    1 MiB over the limit by default (Git hashes, packs and indexes every byte: the cost of this
    test); KXEN_TEST_LONG=1: 2 GiB, as before."""
    a = make_machine(tmp_path, "a", served)
    ses, refs, objs = _session(a)
    big = tmp_path / "big"
    size = depth(fast=MAX_OBJECT_SIZE + (1 << 20), long=2 << 30)
    with open(big, "wb") as f:
        f.truncate(size)  # zeros: Git compresses them to a few MiB
    oid = subprocess.run(["git", "-C", str(served.path), "hash-object", "-w", str(big)], capture_output=True,
                         text=True, check=True).stdout.strip()
    big.unlink()
    blobs = _raw(objs)
    head = refs["head"]
    del blobs[head]
    # The head message's path names the 2 GiB blob, in a well-formed objects commit (§16.3).
    fake = bytes.fromhex(oid)
    rest = [object_blob(b) for b in blobs.values()]
    subtrees: dict[str, list[TreeEntry]] = {head.hex()[:2]: [TreeEntry(b"100644", head.hex()[2:].encode(), fake)]}
    for kid, b in zip(blobs, rest):
        subtrees.setdefault(kid.hex()[:2], []).append(TreeEntry(b"100644", kid.hex()[2:].encode(), b.oid))
    trees = {k: git_object("tree", encode_tree(v)) for k, v in subtrees.items()}
    root = git_object("tree", encode_tree([TreeEntry(b"40000", k.encode(), t.oid) for k, t in trees.items()]))
    oc = git_object("commit", encode_commit(Commit(root.oid, (), 1700000000, b"kxen objects %d\n" % len(objs))))
    gc = group_commit(f"sessions/{ses}", 0, refs, [oc.oid], 1700000000)
    _install(served, [*rest, *trees.values(), root, oc, *gc], {f"refs/kxen/sessions/{ses}": gc[-1].hex})
    b = make_machine(tmp_path, "b", served)
    err = b.kx.refused("session", "pull", ses, cwd=b.ws)
    assert f"{size} bytes, more than the" in err, err
    assert not b.state.exists()
