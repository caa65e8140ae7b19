"""A checkpoint stages exactly the paths ``ls-files`` names, by ``update-index``: the tree it records is the one
``git add -A`` + ``write-tree`` would make of the same work tree, whatever changed — edits, deletions, new files
in new directories, a file that became a directory and a directory that became a file, a symlink, a mode change,
and more files at once than a pathspec list was ever given (the old ``add -A -- .`` path past 200)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kxen_agent.session import checkpoints as ckpt
from kxen_agent.session.workspace import inspect_workspace
from tests.helpers import git, git_workspace


def add_all_tree(repo: Path, tmp: Path) -> str:
    """What plain Git makes of the work tree: a fresh index, `add -A`, `write-tree`."""
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp / "ref-index")}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], env=env, check=True, capture_output=True)
    return subprocess.run(["git", "-C", str(repo), "write-tree"], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_the_checkpoint_tree_is_what_add_all_makes(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"a.txt": "a\n", "d/b.txt": "b\n", "d/c.txt": "c\n", "e/f.txt": "f\n",
                                           "run.sh": "echo\n", **{f"many/{i}.txt": f"{i}\n" for i in range(300)}})
    cp = ckpt.Checkpointer(ckpt.open_repo(inspect_workspace(str(repo)), {}), "ses_stage0000000000000",
                           str(tmp_path / "index"), ckpt.Bounds())
    first = cp.take("start")
    ref = tmp_path / "r0"
    ref.mkdir()
    assert first.tree == add_all_tree(repo, ref)
    # Every kind of change at once.
    (repo / "a.txt").write_text("a, edited\n")
    (repo / "d" / "c.txt").unlink()
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "g.txt").write_text("g\n")
    (repo / "e" / "f.txt").unlink()
    (repo / "e").rmdir()
    (repo / "e").write_text("e is a file now\n")  # a directory became a file
    (repo / "d" / "b.txt").unlink()
    (repo / "d").rmdir()
    (repo / "d").mkdir()
    (repo / "d" / "b.txt").mkdir()  # a file became a directory
    (repo / "d" / "b.txt" / "inner.txt").write_text("inner\n")
    os.symlink("a.txt", repo / "link")
    os.chmod(repo / "run.sh", 0o755)
    for i in range(0, 300, 2):
        (repo / "many" / f"{i}.txt").write_text(f"{i} changed\n")  # 150 changed, beside the rest
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "skip.log").write_text("ignored\n")
    second = cp.take("all at once")
    ref = tmp_path / "r1"
    ref.mkdir()
    assert second.tree == add_all_tree(repo, ref)
    listing = git(repo, "ls-tree", "-r", second.commit)
    assert "skip.log" not in listing and "d/b.txt/inner.txt" in listing and "120000 blob" in listing
    # More than 200 paths at once (the size at which a pathspec list used to give way to `add -A -- .`).
    shutil.rmtree(repo / "many")
    third = cp.take("many gone")
    ref = tmp_path / "r2"
    ref.mkdir()
    assert third.tree == add_all_tree(repo, ref) and "many/" not in git(repo, "ls-tree", "-r", third.commit)
