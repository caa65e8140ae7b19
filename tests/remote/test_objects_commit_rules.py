"""A pull checks every rule of ``objects_spec.md`` §16.3 before any ref moves (§16.7 pull step 1).

Before, a pull found objects by the paths ``git rev-list --objects`` printed
and never looked at the objects commits themselves: an objects commit whose
message counted 65 objects over a tree of 64, one with a parent, and one
holding a blob of mode ``100755`` were all pulled. Each case here builds the
remote's Git objects by hand from a real session (``store/gitmap.py``'s
encoders, ``git index-pack``), breaks one rule, and pulls — into a fresh
state dir (which must not appear), into a state dir of its own (whose files
must not change) and, for an update, into the state dir of a machine that
already holds the session (whose refs must not move). The control case,
the same objects built by the same code with no rule broken, pulls.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from kxen_agent.errors import KxenError
from kxen_agent.session.remote_pull import pull_sessions
from kxen_agent.store import RawObject, Store, encode_object
from kxen_agent.store.gitmap import Commit, GitObject, TreeEntry, encode_commit, encode_tree, git_object, group_commit
from tests.helpers import git
from tests.remote.conftest import Machine, Remote, make_machine
from tests.remote.gitserver import bare_repo
from tests.remote.test_hostile_remote import _install, _session

TIME = 1700000000


@dataclass
class Image:
    """What one case plants: kxen id -> (mode, blob bytes) and the objects commit's message, parents and extras."""

    entries: dict[bytes, tuple[bytes, bytes]]
    message: bytes | None = None  # None: the right count
    parents: tuple[bytes, ...] = ()
    extra: tuple[GitObject, ...] = ()
    more_parents: tuple[bytes, ...] = ()  # the group commit's parents after the objects commit
    root_extra: tuple[TreeEntry, ...] = ()


def plant(remote: Remote, ses: str, refs: dict[str, bytes], img: Image, previous: bytes | None = None) -> str:
    """Install ``img`` as the remote's image of ``ses`` (a group commit on ``previous``, if given); its commit."""
    made: list[GitObject] = list(img.extra)
    subtrees: dict[str, list[TreeEntry]] = {}
    for kid, (mode, data) in img.entries.items():
        b = git_object("blob", data)
        made.append(b)
        subtrees.setdefault(kid.hex()[:2], []).append(TreeEntry(mode, kid.hex()[2:].encode(), b.oid))
    tops = list(img.root_extra)
    for k, entries in subtrees.items():
        t = git_object("tree", encode_tree(entries))
        made.append(t)
        tops.append(TreeEntry(b"40000", k.encode(), t.oid))
    root = git_object("tree", encode_tree(tops))
    message = img.message if img.message is not None else b"kxen objects %d\n" % len(img.entries)
    oc = git_object("commit", encode_commit(Commit(root.oid, img.parents, TIME, message)))
    parents = (oc.oid, *img.more_parents)
    if previous is not None:
        parents = (previous, *parents)
    gc = group_commit(f"sessions/{ses}", 0, refs, list(parents), TIME, [("messages", "2")])
    _install(remote, [*made, root, oc, *gc], {f"refs/kxen/sessions/{ses}": gc[-1].hex})
    return gc[-1].hex


def good(objs: dict[bytes, RawObject]) -> dict[bytes, tuple[bytes, bytes]]:
    return {k: (b"100644", o.raw) for k, o in objs.items()}


def padded(objs: dict[bytes, RawObject], n: int) -> dict[bytes, tuple[bytes, bytes]]:
    """The session's objects and kxen blobs no ref reaches, ``n`` entries in all (each hashes to its id)."""
    out = good(objs)
    i = 0
    while len(out) < n:
        extra = encode_object("blob", b"padding %d\n" % i)
        out[extra.id] = (b"100644", extra.raw)
        i += 1
    return out


Case = Callable[[dict[str, bytes], dict[bytes, RawObject]], tuple[Image, str]]


def count_65_over_64(refs: dict, objs: dict) -> tuple[Image, str]:
    return Image(padded(objs, 64), b"kxen objects 65\n"), "its message counts 65 objects, its tree holds 64"


def count_under(refs: dict, objs: dict) -> tuple[Image, str]:
    return Image(good(objs), b"kxen objects 1\n"), f"its message counts 1 objects, its tree holds {len(objs)}"


def with_a_parent(refs: dict, objs: dict) -> tuple[Image, str]:
    other = git_object("commit", encode_commit(Commit(git_object("tree", b"").oid, (), TIME, b"kxen objects 1\n")))
    empty = git_object("tree", b"")
    return Image(good(objs), parents=(other.oid,), extra=(empty, other)), "an objects commit has no parents, this one has 1"


def mode_100755(refs: dict, objs: dict) -> tuple[Image, str]:
    entries = good(objs)
    entries[refs["head"]] = (b"100755", entries[refs["head"]][1])  # an object the refs take
    return Image(entries), "tree entry mode '100755'"


def mode_100755_unreached(refs: dict, objs: dict) -> tuple[Image, str]:
    entries = padded(objs, len(objs) + 1)
    extra = next(k for k in entries if k not in objs)
    entries[extra] = (b"100755", entries[extra][1])  # no ref reaches it: the image is still malformed
    return Image(entries), "tree entry mode '100755'"


def upper_case_name(refs: dict, objs: dict) -> tuple[Image, str]:
    blob = git_object("blob", b"x")
    sub = git_object("tree", encode_tree([TreeEntry(b"100644", b"A" * 62, blob.oid)]))
    return (Image(good(objs), message=b"kxen objects %d\n" % len(objs), extra=(blob, sub),
                  root_extra=(TreeEntry(b"40000", b"ff", sub.oid),)),
            "is not a 100644 entry named by 62 lower-case hex digits")


def a_blob_in_the_root(refs: dict, objs: dict) -> tuple[Image, str]:
    blob = git_object("blob", b"x")
    return (Image(good(objs), extra=(blob,), root_extra=(TreeEntry(b"100644", b"README", blob.oid),)),
            "is not a subtree named by two lower-case hex digits")


def two_objects_commits(refs: dict, objs: dict) -> tuple[Image, str]:
    kid, (_, data) = next(iter(good(objs).items()))
    blob = git_object("blob", data)
    sub = git_object("tree", encode_tree([TreeEntry(b"100644", kid.hex()[2:].encode(), blob.oid)]))
    root = git_object("tree", encode_tree([TreeEntry(b"40000", kid.hex()[:2].encode(), sub.oid)]))
    oc2 = git_object("commit", encode_commit(Commit(root.oid, (), TIME + 1, b"kxen objects 1\n")))
    return (Image(good(objs), extra=(blob, sub, root, oc2), more_parents=(oc2.oid,)),
            "at most one objects commit among its parents")


def not_kxen_history(refs: dict, objs: dict) -> tuple[Image, str]:
    empty = git_object("tree", b"")
    stray = git_object("commit", b"tree %s\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n\nhello\n"
                       % empty.hex.encode())
    return Image(good(objs), extra=(empty, stray), more_parents=(stray.oid,)), "not a commit of a kxen Git image"


CASES = [count_65_over_64, count_under, with_a_parent, mode_100755, mode_100755_unreached, upper_case_name,
         a_blob_in_the_root, two_objects_commits, not_kxen_history]


@dataclass
class World:
    remote: Remote
    a: Machine  # writes the sessions the cases break
    b: Machine  # no state dir
    c: Machine  # a state dir of its own


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("rules")
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
    yield World(remote, make_machine(tmp, "a", remote), make_machine(tmp, "b", remote), c)


def _plant_case(world: World, case: Case, ses: str, refs: dict, objs: dict) -> str:
    img, why = case(refs, objs)
    plant(world.remote, ses, refs, img)
    return why


def _refused(store_dir: Path, ws: Path, ses: str) -> str:
    with pytest.raises(KxenError) as refused:
        pull_sessions(Store.open(str(store_dir), namespaces=("sessions",)), [ses], str(ws))
    return str(refused.value)


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_a_malformed_objects_commit_is_refused_with_nothing_written(case: Case, world: World) -> None:
    ses, refs, objs = _session(world.a)
    why = _plant_case(world, case, ses, refs, objs)
    before = world.c.snapshot()
    for m in (world.b, world.c):
        msg = _refused(m.state, m.ws, ses)
        assert why in msg and "\n" not in msg and "nothing was pulled" in msg, msg
        assert "bad Git image" in msg, msg
    assert not world.b.state.exists()
    assert world.c.snapshot() == before


def test_the_same_image_with_no_rule_broken_pulls(world: World, tmp_path: Path) -> None:
    """The control: the planting code makes a good image when nothing is broken (64 entries, padding unreached)."""
    ses, refs, objs = _session(world.a)
    plant(world.remote, ses, refs, Image(padded(objs, 64)))
    m = make_machine(tmp_path, "d", world.remote)
    report = pull_sessions(Store.open(str(m.state), namespaces=("sessions",)), [ses], str(m.ws))
    assert report.sessions == {ses: "created"}
    assert report.new_objects == len(objs)  # the padding no ref reaches is not taken
    m.kx.fsck_clean()


def test_an_update_whose_new_objects_commit_is_malformed_moves_no_ref(world: World, tmp_path: Path) -> None:
    """A machine that pulled the session once pulls an update: only the new commits are judged, and refused."""
    ses, refs, objs = _session(world.a)
    first = plant(world.remote, ses, refs, Image(good(objs)))
    d = make_machine(tmp_path, "d", world.remote)
    store = Store.open(str(d.state), namespaces=("sessions",))
    assert pull_sessions(store, [ses], str(d.ws)).sessions == {ses: "created"}
    before = d.snapshot()
    newer = encode_object("message", {"seq": 2, "role": "user", "content": "more", "parent": refs["head"]})
    entries = {newer.id: (b"100644", newer.raw)}
    plant(world.remote, ses, dict(refs, head=newer.id), Image(entries, b"kxen objects 2\n"), bytes.fromhex(first))
    msg = _refused(d.state, d.ws, ses)
    assert "its message counts 2 objects, its tree holds 1" in msg, msg
    assert d.snapshot() == before


def test_the_cli_refuses_in_one_line_with_exit_1(world: World) -> None:
    ses, refs, objs = _session(world.a)
    why = _plant_case(world, mode_100755, ses, refs, objs)
    err = world.b.kx.refused("session", "pull", ses, cwd=world.b.ws)
    assert why in err and "objects commit" in err, err
    assert not world.b.state.exists()
