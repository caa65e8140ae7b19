"""``session rewind`` and ``session fork --worktree --with-code`` with real Git (issue #27 items 3 and 4).

One repository and one scripted run per module (``scene``): turn 1 writes ``src/a.txt`` (v1), turn 2 rewrites it
(v2) and a shell call creates ``new.txt`` and removes ``README.md``. The tests run in order on it and each puts
the workspace back as it found it (``--undo``):

- rewind ``--code`` to the message after turn 1 restores v1, removes ``new.txt``, restores ``README.md``, leaves
  ignored and over-the-bounds files alone (listed); ``--undo`` puts the later files back; ``HEAD`` and the user's
  index are untouched; ``git fsck`` accepts the chain;
- ``--conversation`` forks at the message and touches no file; ``--both`` does both;
- a change no checkpoint holds is refused in one line; ``--force`` checkpoints it first and ``--undo`` returns it;
- a kill after the first file written: the next ``--undo`` completes the interrupted rewind, then puts back
  the files as they were before it;
- ``fork --at MSG --worktree NAME --with-code`` has the early code, and a commit made later on ``main`` is not
  reverted by merging the fork's branch.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import Cli, git, git_workspace, write_agent


def _steps() -> list[dict]:
    return [
        {"content": "first", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "src/a.txt", "content": "v1\n"}}]},
        {"content": "second", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "src/a.txt", "content": "v2\n"}},
            {"name": "shell", "arguments": {"command": "printf 'new\\n' > new.txt && rm README.md && echo ok"}}]},
        {"content": "done"},
    ]


class Scene:
    def __init__(self, root: Path) -> None:
        self.cli = Cli(root / "state")
        self.ws = git_workspace(root / "ws", {"README.md": "# readme\n", "src/keep.txt": "keep\n"})
        (self.ws / ".gitignore").write_text("*.log\n")
        git(self.ws, "add", ".gitignore")
        git(self.ws, "commit", "-q", "-m", "ignore logs")
        (self.ws / "build.log").write_text("ignored\n")
        agent = write_agent(root / "agent", _steps(), policy={"checkpoint_max_file_bytes": 64})
        p = self.cli("run", "--workspace", str(self.ws), "--task", "edit", "--agent", str(agent), expect=0)
        self.ses = p.err.split("session ", 1)[1].split()[0]
        log = self.cli.log(self.ses)
        tools = [m for m in log if m["role"] == "tool"]
        self.after_turn1 = tools[0]["id"]  # the result of turn 1's only call
        self.first = log[0]["id"]  # the task: before any tool ran
        self.head0 = git(self.ws, "rev-parse", "HEAD").strip()

    def files(self) -> dict[str, str]:
        out = {}
        for p in sorted(self.ws.rglob("*")):
            if p.is_file() and ".git" not in p.relative_to(self.ws).parts:
                out[str(p.relative_to(self.ws))] = p.read_text()
        return out


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    return Scene(tmp_path_factory.mktemp("rewind"))


LATER = {".gitignore": "*.log\n", "build.log": "ignored\n", "new.txt": "new\n", "src/a.txt": "v2\n",
         "src/keep.txt": "keep\n"}
EARLY = {".gitignore": "*.log\n", "README.md": "# readme\n", "build.log": "ignored\n", "src/a.txt": "v1\n",
         "src/keep.txt": "keep\n"}


def test_rewind_code_then_undo(scene: Scene) -> None:
    assert scene.files() == LATER
    index_before = (scene.ws / ".git" / "index").read_bytes()
    big = scene.ws / "big.bin"
    big.write_text("x" * 100)  # over checkpoint_max_file_bytes (64): never in a checkpoint
    try:
        p = scene.cli("session", "rewind", scene.ses, "--at", scene.after_turn1, "--code", "--force", expect=0)
        assert "2 file(s) written, 1 removed" in p.out, str(p)
        assert "left alone: big.bin (over checkpoint_max_file_bytes" in p.out and "build.log (ignored)" in p.out
        assert scene.files() == {**EARLY, "big.bin": "x" * 100}
        # Only the work tree changed: HEAD, the user's index and the branches are as they were.
        assert git(scene.ws, "rev-parse", "HEAD").strip() == scene.head0
        assert (scene.ws / ".git" / "index").read_bytes() == index_before
        git(scene.ws, "fsck", "--strict", "--no-dangling")
        # The conversation was not moved: no new session.
        assert len(scene.cli.sessions()) == 1
        p = scene.cli("session", "rewind", scene.ses, "--undo", "--json", expect=0)
        assert p.json()["code"]["written"] == ["new.txt", "src/a.txt"] and p.json()["code"]["removed"] == ["README.md"]
        assert scene.files() == {**LATER, "big.bin": "x" * 100}
    finally:
        big.unlink()


def test_rewind_refuses_changes_no_checkpoint_holds(scene: Scene) -> None:
    (scene.ws / "src" / "keep.txt").write_text("mine\n")
    msg = scene.cli.refused("session", "rewind", scene.ses, "--at", scene.after_turn1, "--code", code=1)
    assert "has changes no checkpoint of session" in msg and "--force" in msg, msg
    assert (scene.ws / "src" / "keep.txt").read_text() == "mine\n"
    scene.cli("session", "rewind", scene.ses, "--at", scene.first, "--code", "--force", expect=0)
    # Before the session's first change: the files of the start (keep.txt as committed).
    assert scene.files() == {".gitignore": "*.log\n", "README.md": "# readme\n", "build.log": "ignored\n",
                             "src/keep.txt": "keep\n"}
    scene.cli("session", "rewind", scene.ses, "--undo", expect=0)
    assert scene.files() == {**LATER, "src/keep.txt": "mine\n"}
    (scene.ws / "src" / "keep.txt").write_text("keep\n")


def test_rewind_conversation_then_both(scene: Scene) -> None:
    p = scene.cli("session", "rewind", scene.ses, "--at", scene.after_turn1, "--conversation", "--json", expect=0)
    conv = p.json()["conversation"]
    assert p.json()["code"] is None and conv["forkPoint"] == scene.after_turn1
    assert scene.files() == LATER  # no file touched
    fork = scene.cli.session_show(conv["session"])
    assert fork["parentId"] == scene.ses
    assert scene.cli.log(conv["session"])[-1]["id"] == scene.after_turn1
    assert len(scene.cli.log(scene.ses)) > len(scene.cli.log(conv["session"]))  # the old branch stays
    p = scene.cli("session", "rewind", scene.ses, "--at", scene.after_turn1, expect=0)  # --both by default
    assert "restored the workspace" in p.out and "conversation: new session" in p.out, str(p)
    assert scene.files() == EARLY
    scene.cli("session", "rewind", scene.ses, "--undo", expect=0)
    assert scene.files() == LATER


def test_a_kill_while_restoring_then_undo(scene: Scene) -> None:
    p = scene.cli("session", "rewind", scene.ses, "--at", scene.after_turn1, "--code",
                  env={"KXEN_AGENT_REWIND_FAULT": "1"})
    assert p.killed, str(p)
    # Half restored: the first change is made (the removal of new.txt), the rest are as before.
    now = scene.files()
    assert now != LATER and now != EARLY
    git(scene.ws, "fsck", "--strict", "--no-dangling")
    p = scene.cli("session", "rewind", scene.ses, "--undo", expect=0)
    assert "completed an interrupted rewind" in p.out, str(p)
    assert scene.files() == LATER


def test_fork_worktree_with_code(scene: Scene) -> None:
    head = git(scene.ws, "rev-parse", "HEAD").strip()
    try:
        _fork_worktree_with_code(scene)
    finally:  # the module's other tests expect the workspace's HEAD as the scene made it
        subprocess.run(["git", "-C", str(scene.ws), "reset", "-q", "--soft", head], check=True)
        subprocess.run(["git", "-C", str(scene.ws), "rm", "-q", "--cached", "later.txt"], check=False)
        (scene.ws / "later.txt").unlink(missing_ok=True)


def _fork_worktree_with_code(scene: Scene) -> None:
    (scene.ws / "later.txt").write_text("committed later\n")
    git(scene.ws, "add", "later.txt")
    git(scene.ws, "commit", "-q", "-m", "later")
    p = scene.cli("session", "fork", scene.ses, "--at", scene.after_turn1, "--worktree", "early", "--with-code",
                  "--json", expect=0)
    wt = Path(p.json()["workspace"]["root"])
    assert (wt / "src" / "a.txt").read_text() == "v1\n" and not (wt / "new.txt").exists()
    assert (wt / "README.md").exists() and not (wt / "later.txt").exists()
    assert git(scene.ws, "merge-base", "--is-ancestor", scene.head0, "kxen/early") == ""
    # Merging the fork's branch into main keeps the later commit: nothing was reverted.
    git(scene.ws, "stash", "-u", "-q")
    try:
        git(scene.ws, "merge", "-q", "--no-edit", "kxen/early")
        assert (scene.ws / "later.txt").read_text() == "committed later\n"
        assert (scene.ws / "src" / "a.txt").read_text() == "v1\n"
    finally:
        subprocess.run(["git", "-C", str(scene.ws), "reset", "-q", "--hard", "HEAD~1"], check=False)
        git(scene.ws, "stash", "pop", "-q")
    msg = scene.cli.refused("session", "fork", scene.ses, "--with-code", code=2)
    assert "--with-code goes with --worktree" in msg


def test_a_restore_never_writes_beyond_a_symbolic_link(tmp_path: Path) -> None:
    from kxen_agent.errors import KxenError
    from kxen_agent.session import checkpoint_restore as cr
    from kxen_agent.session.checkpoints import Repo

    ws = git_workspace(tmp_path / "ws", {"lib/x.txt": "inside\n"})
    tree = git(ws, "rev-parse", "HEAD^{tree}").strip()
    blob = git(ws, "rev-parse", "HEAD:lib/x.txt").strip()
    outside = tmp_path / "outside"
    outside.mkdir()
    git(ws, "rm", "-q", "-r", "lib")
    (ws / "lib").symlink_to(outside)  # made since: no checkpoint holds it
    repo = Repo(str(ws), str(ws), str(ws / ".git"))
    changes, _alone = cr._plan(repo, "4b825dc642cb6eb9a060e54bf8d69288fbee4904", tree, {})
    assert [c.path for c in changes] == ["lib/x.txt"] and changes[0].blob == blob
    with pytest.raises(KxenError, match="is a symbolic link no checkpoint holds"):
        cr._apply(repo, changes, None)
    assert list(outside.iterdir()) == []


def test_a_restore_leaves_what_is_outside_the_bound_directory(tmp_path: Path) -> None:
    from kxen_agent.session import checkpoint_restore as cr
    from kxen_agent.session.checkpoints import Repo

    ws = git_workspace(tmp_path / "ws", {"sub/in.txt": "1\n", "top.txt": "1\n"})
    before = git(ws, "rev-parse", "HEAD").strip()
    (ws / "sub" / "in.txt").write_text("2\n")
    (ws / "top.txt").write_text("2\n")
    git(ws, "commit", "-q", "-am", "both")
    repo = Repo(str(ws / "sub"), str(ws), str(ws / ".git"))  # bound to sub/
    changes, alone = cr._plan(repo, "HEAD", before, {})
    assert [c.path for c in changes] == ["sub/in.txt"]
    assert alone == [("top.txt", "outside the bound directory")]
    cr._apply(repo, changes, None)
    assert (ws / "sub" / "in.txt").read_text() == "1\n" and (ws / "top.txt").read_text() == "2\n"
