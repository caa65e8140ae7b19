"""A checkpoint names what changed with ``git status`` and the untracked cache kept in the session's index
(``objects_spec.md`` §14.14): whatever the cache and the index's stat data remember from the last checkpoint,
the tree recorded is the one ``git add -A`` + ``write-tree`` make of the same work tree.

The cases are the ones a cache could get wrong: a file rewritten with the same size and time (only Git's racy
rule can see it), a new file in a directory the cache has seen, a ``.gitignore`` or ``info/exclude`` change
that un-ignores a file, a deleted directory, a session bound to a subdirectory, and an index copied mid-merge.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from kxen_agent.session import checkpoints as ckpt
from kxen_agent.session.workspace import inspect_workspace
from tests.helpers import git, git_workspace


def add_all_tree(repo: Path, index: Path) -> str:
    """What plain Git makes of the work tree: a fresh index, `add -A`, `write-tree`."""
    index.unlink(missing_ok=True)
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], env=env, check=True, capture_output=True)
    return subprocess.run(["git", "-C", str(repo), "write-tree"], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkpointer(root: Path, index: Path, ses: str = "ses_status00000000000001", **bounds: int) -> ckpt.Checkpointer:
    return ckpt.Checkpointer(ckpt.open_repo(inspect_workspace(str(root)), {}), ses, str(index), ckpt.Bounds(**bounds))


def blob(repo: Path, commit: str, path: str) -> str:
    return git(repo, "show", f"{commit}:{path}")


def test_a_file_rewritten_with_the_same_size_and_time_is_seen(tmp_path: Path) -> None:
    # Stat data cannot tell: same size, same inode, same mtime, and ctime not trusted (the repository says so).
    # The file's time is not older than the kept index's, so Git's racy rule must compare its content — after
    # the index was copied, written by three git processes, replaced and stamped with the checkpoint's start.
    repo = git_workspace(tmp_path / "ws", {"f.txt": "aaaa\n", "g.txt": "g\n"})
    git(repo, "config", "core.trustctime", "false")
    f = repo / "f.txt"
    when = time.time_ns() + 30 * 10**9  # written "at the same time as" the index, at the clock's grain
    os.utime(f, ns=(when, when))
    cp = checkpointer(repo, tmp_path / "index")
    first = cp.take("first")
    assert blob(repo, first.commit, "f.txt") == "aaaa\n"
    for text in ("bbbb\n", "cccc\n"):
        with open(f, "r+") as fh:  # in place: the same inode
            fh.write(text)
        os.utime(f, ns=(when, when))
        got = cp.take(f"rewrote {text.strip()}")
        assert not got.reused and blob(repo, got.commit, "f.txt") == text
        assert got.tree == add_all_tree(repo, tmp_path / "ref-index")


def test_new_files_in_directories_the_cache_has_seen(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"d/a.txt": "a\n", "d/e/b.txt": "b\n", "top.txt": "t\n"})
    (repo / "d" / "old-untracked.txt").write_text("u\n")
    cp = checkpointer(repo, tmp_path / "index")
    first = cp.take("first")  # builds the untracked cache: d and d/e are seen
    assert first.tree == add_all_tree(repo, tmp_path / "ref-index")
    steps = [
        lambda: (repo / "d" / "new.txt").write_text("new\n"),                     # in a seen directory
        lambda: (repo / "d" / "e" / "f").mkdir(),                                 # an empty directory: nothing
        lambda: (repo / "d" / "e" / "f" / "deep.txt").write_text("deep\n"),       # in a directory made since
        lambda: (repo / "d" / "new.txt").unlink(),                                # a file this session recorded
        lambda: (repo / "d" / "old-untracked.txt").rename(repo / "d" / "e" / "moved.txt"),
        lambda: (repo / "top2.txt").write_text("t2\n"),                           # at the top
    ]
    for i, step in enumerate(steps):
        step()
        got = cp.take(f"step {i}")
        assert got.tree == add_all_tree(repo, tmp_path / "ref-index"), f"step {i}"
    # The cache lives in the session's index only: not in the repository's index, not in its configuration.
    assert b"UNTR" in (tmp_path / "index").read_bytes()
    assert b"UNTR" not in (repo / ".git" / "index").read_bytes()
    assert "untrackedcache" not in (repo / ".git" / "config").read_text().lower()


def test_an_ignore_rule_that_goes_away_un_ignores_the_file(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {".gitignore": "*.log\n", "sub/.gitignore": "build/\n", "a.txt": "a\n"})
    (repo / "x.log").write_text("log\n")
    (repo / "sub" / "build").mkdir()
    (repo / "sub" / "build" / "out.o").write_text("o\n")
    (repo / "y.tmp").write_text("tmp\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("*.tmp\n")
    cp = checkpointer(repo, tmp_path / "index")
    names = lambda c: set(git(repo, "ls-tree", "-r", "--name-only", c).split())  # noqa: E731
    first = cp.take("all ignored")
    assert not {"x.log", "sub/build/out.o", "y.tmp"} & names(first.commit)
    (repo / ".gitignore").write_text("# nothing\n")
    second = cp.take("top rule gone")
    assert "x.log" in names(second.commit) and "sub/build/out.o" not in names(second.commit)
    (repo / "sub" / ".gitignore").write_text("!build/\n")
    third = cp.take("nested rule gone")
    assert "sub/build/out.o" in names(third.commit)
    (repo / ".git" / "info" / "exclude").write_text("# nothing\n")
    fourth = cp.take("exclude rule gone")
    assert "y.tmp" in names(fourth.commit)
    assert fourth.tree == add_all_tree(repo, tmp_path / "ref-index")
    # And back: an ignored file the checkpoint already holds stays (as `add -A` keeps a tracked one).
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "z.log").write_text("new and ignored\n")
    fifth = cp.take("ignored again")
    assert "x.log" in names(fifth.commit) and "z.log" not in names(fifth.commit)


def test_a_deleted_directory_and_one_made_again(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"lib/a.txt": "a\n", "lib/inner/b.txt": "b\n", "keep.txt": "k\n"})
    (repo / "lib" / "inner" / "untracked.txt").write_text("u\n")
    cp = checkpointer(repo, tmp_path / "index")
    first = cp.take("first")
    assert "lib/inner/untracked.txt" in git(repo, "ls-tree", "-r", "--name-only", first.commit)
    shutil.rmtree(repo / "lib")
    gone = cp.take("lib gone")
    assert "lib/" not in git(repo, "ls-tree", "-r", "--name-only", gone.commit)
    assert gone.tree == add_all_tree(repo, tmp_path / "ref-index")
    (repo / "lib" / "inner").mkdir(parents=True)
    (repo / "lib" / "inner" / "other.txt").write_text("o\n")
    again = cp.take("lib again")
    assert git(repo, "ls-tree", "-r", "--name-only", again.commit, "lib").split() == ["lib/inner/other.txt"]
    assert again.tree == add_all_tree(repo, tmp_path / "ref-index")


def test_a_session_bound_to_a_subdirectory_records_only_under_it(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"app/src/m.py": "m\n", "app/big.bin": "b\n", "top.txt": "t\n"})
    cp = checkpointer(repo / "app", tmp_path / "index", max_file_bytes=10)
    first = cp.take("first")
    head_tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    assert first.tree == head_tree
    (repo / "app" / "src" / "m.py").write_text("m2\n")
    (repo / "app" / "src" / "new" ).mkdir()
    (repo / "app" / "src" / "new" / "n.py").write_text("n\n")
    (repo / "app" / "big.bin").write_text("x" * 11)  # over the bound: left out, listed relative to app/
    (repo / "top.txt").write_text("changed outside\n")
    (repo / "outside.txt").write_text("new outside\n")
    got = cp.take("second")
    assert dict(got.left_out) == {"big.bin": "over checkpoint_max_file_bytes (11 > 10)"}
    assert blob(repo, got.commit, "app/src/m.py") == "m2\n" and blob(repo, got.commit, "app/src/new/n.py") == "n\n"
    assert blob(repo, got.commit, "top.txt") == "t\n" and blob(repo, got.commit, "app/big.bin") == "b\n"
    assert "outside.txt" not in git(repo, "ls-tree", "--name-only", got.commit).split()
    assert ckpt.left_out_of(cp.repo, got.commit) == {"big.bin"}


def test_an_index_copied_mid_merge_and_an_intent_to_add_entry(tmp_path: Path) -> None:
    repo = git_workspace(tmp_path / "ws", {"c.txt": "base\n", "o.txt": "o\n"})
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "c.txt").write_text("theirs\n")
    git(repo, "commit", "-q", "-am", "theirs")
    git(repo, "checkout", "-q", "main")
    (repo / "c.txt").write_text("ours\n")
    git(repo, "commit", "-q", "-am", "ours")
    subprocess.run(["git", "-C", str(repo), "merge", "-q", "other"], capture_output=True)  # conflicts in c.txt
    assert "<<<<<<<" in (repo / "c.txt").read_text()
    (repo / "n.txt").write_text("intent\n")
    git(repo, "add", "-N", "n.txt")
    # The session's first checkpoint starts from a copy of this index: unmerged entries and an intent-to-add.
    got = checkpointer(repo, tmp_path / "index").take("mid-merge")
    assert got.tree == add_all_tree(repo, tmp_path / "ref-index")
    assert "<<<<<<<" in blob(repo, got.commit, "c.txt") and blob(repo, got.commit, "n.txt") == "intent\n"
    assert "c.txt" in git(repo, "diff", "--name-only", "--diff-filter=U")  # the user's merge is untouched
