"""The Git image of kxen objects (``objects_spec.md`` §16, ``store/gitmap.py``): vectors, strictness, and Git's word.

The ``git-image:`` blocks of §16.10 are read from the spec and rebuilt from
their inputs; every id is also computed by the real ``git hash-object``
(an independent implementation of Git's hashing), and a repository built
from the images passes ``git fsck --strict``. The parsers refuse what the
encoders would never write.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kxen_agent.store.gitmap import (
    BadGitImage,
    Commit,
    encode_commit,
    encode_group_blob,
    encode_pack,
    git_object,
    group_commit,
    kxen_id_of_path,
    lease_commit,
    object_blob,
    objects_commit,
    parse_commit,
    parse_group_blob,
    parse_group_commit,
    parse_lease_commit,
    parse_tree,
)
from kxen_agent.store.objects import encode_object, parse_object
from tests.store.test_spec_vectors import _tagged

IMAGES = {b["git-image"]: b for b in _tagged("git-image")}  # the spec's blocks, read as §13's are
KXEN = {b["vector"]: bytes.fromhex(b["bytes"]) for b in _tagged("vector")}


def _rebuild(v: dict[str, str]):
    """The Git object the block's inputs give, built by gitmap."""
    objs = [parse_object(KXEN[name], name) for name in v.get("objects", "").split()]
    name = v["git-image"]
    if name == "message-blob":
        return object_blob(objs[0].raw)
    if name.startswith("objects-"):
        made = objects_commit(objs, int(v.get("time", "0")))
        if name == "objects-commit":
            return made[-1]
        return next(o for o in made if o.type == "tree" and o.hex == v["id"])  # one of its trees
    group, fence = v["group"], int(v.get("fence", "0"))
    refs = {k: bytes.fromhex(x) for k, x in (kv.split("=") for kv in v["refs"].split(","))} if "refs" in v else {}
    if name == "refs-blob":
        return git_object("blob", encode_group_blob(group, fence, refs))
    if name == "group-commit":
        summary = [tuple(kv.split("=", 1)) for kv in v["summary"].split(";")]
        parents = [bytes.fromhex(p) for p in v["parents"].split()]
        return group_commit(group, fence, refs, parents, int(v["time"]), summary)[-1]
    if name == "lease-commit":
        return lease_commit(group, v["record"].encode("ascii"), None, int(v["time"]))[-1]
    raise AssertionError(f"no rule for vector {name}")


def test_the_spec_has_every_image() -> None:
    assert set(IMAGES) == {"message-blob", "objects-subtree-19", "objects-root-tree", "objects-commit",
                           "refs-blob", "group-commit", "lease-commit"}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_vector_is_rebuilt_byte_for_byte(name: str) -> None:
    v = IMAGES[name]
    got = _rebuild(v)
    assert got.type == v["type"]
    assert got.body.hex() == v["body"]
    assert got.hex == v["id"]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_git_computes_the_same_id(name: str, tmp_path: Path) -> None:
    v = IMAGES[name]
    done = subprocess.run(["git", "hash-object", "-t", v["type"], "--stdin"], input=bytes.fromhex(v["body"]),
                          capture_output=True, check=True, cwd=tmp_path)
    assert done.stdout.decode().strip() == v["id"]


def test_a_blob_is_the_object_bytes_so_b3sum_names_it() -> None:
    v = IMAGES["message-blob"]
    assert bytes.fromhex(v["body"]) == KXEN["session-user-message"]
    obj = parse_object(bytes.fromhex(v["body"]), "blob")
    assert obj.hex == "191a788fce1493b2c060ca97deaccaba06861ffe89ae8dde99f51b9496985859"


def test_the_paths_of_an_objects_tree_are_the_kxen_ids() -> None:
    objs = [encode_object("blob", b"x%d" % i) for i in range(40)]
    made = objects_commit(objs, 5)
    entries = {}
    trees = {o.oid: o for o in made if o.type == "tree"}
    root = trees[parse_commit(made[-1].body, "c").tree]
    for top in parse_tree(root.body, "root"):
        for leaf in parse_tree(trees[top.oid].body, top.name.decode()):
            entries[kxen_id_of_path(top.name + b"/" + leaf.name)] = leaf.oid
    assert entries == {o.id: object_blob(o.raw).oid for o in objs}
    assert kxen_id_of_path(b"refs") is None and kxen_id_of_path(b"zz/" + b"0" * 62) is None


def test_a_repository_of_images_is_fsck_strict_clean(tmp_path: Path) -> None:
    """Git itself indexes the pack (checking every object) and fsck --strict finds nothing."""
    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    objs = [encode_object("message", {"seq": 0, "role": "user", "content": "hi"}), encode_object("blob", b"\x00\xff")]
    made = objects_commit(objs, 1700000000)
    group = group_commit("sessions/ses_0123456789abcdef0123", 2, {"head": objs[0].id}, [made[-1].oid], 1700000001,
                         [("messages", "1"), ("run", "run_0123456789abcdef0123 completed")])
    lease = lease_commit("sessions/ses_0123456789abcdef0123", b"{}", None, 1700000002)
    later = lease_commit("sessions/ses_0123456789abcdef0123", b'{"x": 1}', lease[-1].oid, 1700000003)
    pack = encode_pack(made + group + lease + later)
    path = repo / "objects" / "pack" / f"pack-{pack[-20:].hex()}.pack"
    path.write_bytes(pack)
    subprocess.run(["git", "-C", str(repo), "index-pack", "--strict", str(path)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(repo), "update-ref", "refs/kxen/sessions/ses_0123456789abcdef0123",
                    group[-1].hex], check=True)
    subprocess.run(["git", "-C", str(repo), "update-ref", "refs/kxen/leases/ses_0123456789abcdef0123",
                    later[-1].hex], check=True)
    done = subprocess.run(["git", "-C", str(repo), "fsck", "--strict", "--no-dangling"], capture_output=True, text=True)
    assert done.returncode == 0 and "error" not in done.stderr and "warning" not in done.stderr, done.stderr
    listed = subprocess.run(["git", "-C", str(repo), "rev-list", "--objects", group[-1].hex], capture_output=True,
                            check=True).stdout
    assert {kxen_id_of_path(line[41:]) for line in listed.splitlines()} - {None} == {o.id for o in objs}


def test_group_commit_round_trip() -> None:
    refs = {"meta": b"\x01" * 32, "head": b"\x02" * 32, "runs/run_0123456789abcdef0123": b"\x03" * 32}
    blob, tree, commit = group_commit("sessions/ses_0123456789abcdef0123", 7, refs, [b"\x05" * 20, b"\x06" * 20],
                                      42, [("parent", "ses_0123456789abcdef0124"), ("messages", "12")])
    img = parse_group_commit(commit.body, tree.body, blob.body, "g")
    assert (img.group, img.fence, img.refs) == ("sessions/ses_0123456789abcdef0123", 7, refs)
    assert img.summary == (("parent", "ses_0123456789abcdef0124"), ("messages", "12"))
    assert img.commit.parents == (b"\x05" * 20, b"\x06" * 20) and img.commit.time == 42


BAD_GROUP_BLOBS = [
    (b"kxen-git-group 2\ngroup sessions/s1\nfence 0\n", "not a kxen-git-group 1"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 01\n", "not a kxen-git-group 1"),
    (b"kxen-git-group 1\ngroup sessions/../x\nfence 0\n", "invalid ref group"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"ab" * 32 + b" meta", "bad ref line"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"ab" * 32 + b" meta\n" + b"ab" * 32 + b" head\n",
     "out of order"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"ab" * 32 + b" meta\n" + b"ab" * 32 + b" meta\n",
     "out of order"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"00" * 32 + b" meta\n", "all-zero"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"AB" * 32 + b" meta\n", "bad ref line"),
    (b"kxen-git-group 1\ngroup sessions/s1\nfence 0\n" + b"ab" * 32 + b" tmp_x\n", "invalid ref name"),
]


@pytest.mark.parametrize("data, why", BAD_GROUP_BLOBS)
def test_a_bad_refs_blob_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(BadGitImage, match=why):
        parse_group_blob(data, "blob")


def test_a_commit_not_of_an_image_is_refused() -> None:
    good = encode_commit(Commit(b"\x01" * 20, (b"\x02" * 20,), 9, b"kxen objects 1\n"))
    assert parse_commit(good, "c").time == 9
    for bad in (
        good.replace(b"kxen-agent <kxen-agent@localhost> 9 +0000\ncommitter", b"kxen-agent <x@y> 9 +0000\ncommitter"),
        good.replace(b"9 +0000\n\n", b"9 +0100\n\n"),
        good.replace(b"committer kxen-agent <kxen-agent@localhost> 9", b"committer kxen-agent <kxen-agent@localhost> 8"),
        good[:-1],  # no final LF
        good.replace(b"parent", b"parent " + b"02" * 20 + b"\nparent", 1),  # a parent twice
        b"gpgsig x\n" + good,
    ):
        with pytest.raises(BadGitImage):
            parse_commit(bad, "c")


def test_a_tree_not_of_an_image_is_refused() -> None:
    blob = b"\x01" * 20
    for bad in (b"100755 x\x00" + blob, b"120000 x\x00" + blob, b"100644 b\x00" + blob + b"100644 a\x00" + blob,
                b"100644 a\x00" + blob + b"100644 a\x00" + blob, b"100644 a/b\x00" + blob, b"100644 a\x00" + blob[:5]):
        with pytest.raises(BadGitImage):
            parse_tree(bad, "t")


def test_lease_commit_checks_its_parts() -> None:
    blob, tree, commit = lease_commit("sessions/ses_0123456789abcdef0123", b'{"a": 1}', b"\x09" * 20, 3)
    assert parse_lease_commit(commit.body, tree.body, blob.body, "sessions/ses_0123456789abcdef0123", "l").parents == (
        b"\x09" * 20,)
    with pytest.raises(BadGitImage, match="not the tree's"):
        parse_lease_commit(commit.body, tree.body, b'{"a": 2}', "sessions/ses_0123456789abcdef0123", "l")
    with pytest.raises(BadGitImage, match="kxen lease"):
        parse_lease_commit(commit.body, tree.body, blob.body, "sessions/ses_9999999999abcdef0123", "l")
