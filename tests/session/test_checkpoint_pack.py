"""The pack and the commit a checkpoint writes itself (``kxen_agent/session/checkpoint_pack.py``) are what Git
reads back and checks: ``git verify-pack``, ``git fsck --strict``, every object's content, and a commit id equal
to the one ``git commit-tree`` gives the same tree, parents, identity, time and message."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kxen_agent.session import checkpoint_pack as cpk
from tests.helpers import git, git_workspace

IDENT = "kxen-agent <checkpoint@kxen-agent.invalid>"


def run(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], input=input, check=True, capture_output=True,
                          env={**os.environ, **(env or {})}).stdout


def test_a_pack_of_loose_objects_and_a_commit_is_what_git_reads(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    q = tmp_path / "quarantine"
    q.mkdir()
    env = {"GIT_OBJECT_DIRECTORY": str(q), "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(repo / ".git" / "objects")}
    # Sizes around every boundary of the entry header's size encoding, and one over the read chunk.
    contents = [b"", b"x" * 15, b"y" * 16, b"z" * 127, b"w" * 128, b"v" * 2047, bytes(range(256)) * 5000]
    ids = [run(repo, "hash-object", "-w", "--stdin", input=c, env=env).decode().strip() for c in contents]
    tree_in = "".join(f"100644 blob {i}\tf{n}\n" for n, i in enumerate(ids)).encode()
    tree = run(repo, "mktree", input=tree_in, env=env).decode().strip()
    head = git(repo, "rev-parse", "HEAD").strip()
    msg = "kxen-agent checkpoint: ses_x run before op\n\nleft out: none\n".encode()
    commit, body = cpk.commit_object(tree, [head], IDENT, msg, when=1_700_000_000)
    loose = sorted({*ids, tree})
    pack_dir = repo / ".git" / "objects" / "pack"
    path = cpk.write_pack(str(q), loose, [(commit, "commit", body)], str(pack_dir))
    assert not [n for n in os.listdir(pack_dir) if n.startswith("tmp_")]
    listed = run(repo, "verify-pack", "-v", path[:-5] + ".idx").decode()
    assert all(o in listed for o in [*loose, commit])
    for oid, content in zip(ids, contents):
        assert run(repo, "cat-file", "blob", oid) == content
    run(repo, "update-ref", "refs/kxen/checkpoints/ses_x", commit)  # Git parses the commit from the pack
    run(repo, "fsck", "--strict", "--no-dangling")
    # The same commit from Git itself: same id.
    git_env = {"GIT_AUTHOR_NAME": "kxen-agent", "GIT_AUTHOR_EMAIL": "checkpoint@kxen-agent.invalid",
               "GIT_COMMITTER_NAME": "kxen-agent", "GIT_COMMITTER_EMAIL": "checkpoint@kxen-agent.invalid",
               "GIT_AUTHOR_DATE": f"1700000000 {body.split(b' 1700000000 ')[1][:5].decode()}",
               "GIT_COMMITTER_DATE": f"1700000000 {body.split(b' 1700000000 ')[1][:5].decode()}"}
    assert run(repo, "commit-tree", tree, "-p", head, "-F", "-", input=msg, env=git_env).decode().strip() == commit


def test_a_loose_object_that_does_not_match_its_id_is_refused(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    q = tmp_path / "q"
    q.mkdir()
    env = {"GIT_OBJECT_DIRECTORY": str(q)}
    good = run(repo, "hash-object", "-w", "--stdin", input=b"good\n", env=env).decode().strip()
    other = run(repo, "hash-object", "-w", "--stdin", input=b"other\n", env=env).decode().strip()
    src = q / other[:2] / other[2:]
    dst = q / good[:2] / good[2:]
    os.chmod(dst, 0o644)
    dst.write_bytes(src.read_bytes())  # "good" now holds another object's bytes
    pack_dir = tmp_path / "pack"
    pack_dir.mkdir()
    with pytest.raises(ValueError, match="does not match its id"):
        cpk.write_pack(str(q), [good], [], str(pack_dir))
    assert os.listdir(pack_dir) == []
