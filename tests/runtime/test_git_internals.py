"""The workspace's Git internals out of the file tools' reach; FIFOs, size limits, paths swapped mid-call.

Real files, real Git repositories, the real CLI: an agent with file tools
only must not be able to plant a ``core.fsmonitor`` (or a hook) that a later
``git`` — ours or the user's — would run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kxen_agent.runtime.tools import TOOLS, ToolContext
from kxen_agent.runtime.tools import files as files_mod
from tests.helpers import Cli, git, git_workspace, write_agent

read_file = TOOLS["read_file"]
write_file = TOOLS["write_file"]
edit_file = TOOLS["edit_file"]
list_files = TOOLS["list_files"]


def ctx(ws: Path, **kw) -> ToolContext:
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("cancel_window_s", 5.0)
    kw.setdefault("cancel", threading.Event())
    kw.setdefault("secret_env_names", ())
    return ToolContext(workspace=str(ws), **kw)


@pytest.fixture
def gitenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty global Git configuration (no user's LFS, helpers... in these tests)."""
    cfg = tmp_path / "gitconfig"
    cfg.write_text("")
    env = {"GIT_CONFIG_GLOBAL": str(cfg), "GIT_CONFIG_NOSYSTEM": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def repo(tmp_path: Path, gitenv: dict[str, str]) -> Path:
    ws = git_workspace(Path(os.path.realpath(tmp_path)) / "ws", {"README.md": "hello\n", "src/a.py": "x = 1\n"})
    return ws


def evil_script(tmp_path: Path, marker: Path) -> Path:
    """A program that leaves ``marker`` behind when something runs it."""
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho ran \"$0\" \"$@\" >> '{marker}'\nexit 1\n")
    script.chmod(0o755)
    return script


# ---------------------------------------------------------------- the file tools alone


def _git_targets(repo: Path, tmp_path: Path) -> list[str]:
    """Paths into Git directories of every kind, each reached a different way."""
    (repo / "cfg").symlink_to(".git/config")           # a symlink to .git/config
    (repo / "g").symlink_to(".git")                    # a symlink to .git itself
    # A separate Git directory inside the workspace (what a submodule's or worktree's .git file points to).
    git(tmp_path, "init", "-q", "--separate-git-dir", str(repo / "store.d"), str(repo / "inner"))
    # A bare repository in the workspace.
    git(repo, "init", "-q", "--bare", "vendor/b.git")
    # A linked worktree's Git directory lives in .git/worktrees/NAME.
    git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "side"))
    return [".git/config", ".GIT/config", "./.git/hooks/pre-commit", "cfg", "g/config", "g/hooks/post-checkout",
            "store.d/config", "inner/.git", "sub/.git", "vendor/b.git/config", "vendor/b.git/hooks/x",
            ".git/worktrees/side/config.worktree", ".git. /config", "src/../.git/config"]


def test_file_tools_never_write_or_read_git_internals(repo: Path, tmp_path: Path) -> None:
    targets = _git_targets(repo, tmp_path)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and not p.is_symlink()}
    for path in targets:
        for tool, args in ((write_file, {"path": path, "content": "[core]\n\tfsmonitor = /tmp/evil\n"}),
                           (edit_file, {"path": path, "old": "[core]", "new": "[core]\n\tfsmonitor = /tmp/evil"}),
                           (read_file, {"path": path})):
            out = tool.run(args, ctx(repo))
            assert out.is_error, (tool.name, path, out.output)
            assert "Git internals" in out.output and f"'{path}'" in out.output, (tool.name, path, out.output)
    after = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before
    assert not (repo / "sub").exists() and not (repo / ".GIT").exists()
    # Git agrees nothing changed in its configuration.
    assert "fsmonitor" not in git(repo, "config", "--list")


def test_list_files_hides_and_refuses_git_directories(repo: Path, tmp_path: Path) -> None:
    _git_targets(repo, tmp_path)
    out = list_files.run({}, ctx(repo))
    assert not out.is_error
    listed = out.output.splitlines()
    assert "README.md" in listed and "src/a.py" in listed and "inner/" in listed and "vendor/" in listed
    assert not [x for x in listed if x.startswith((".git", "store.d/", "vendor/b.git")) or x == "inner/.git"], listed
    for path in (".git", "g", "store.d", "vendor/b.git", "g/hooks"):
        out = list_files.run({"path": path}, ctx(repo))
        assert out.is_error and "Git internals" in out.output, (path, out.output)


def test_ordinary_files_next_to_git_still_work(repo: Path) -> None:
    assert not write_file.run({"path": "docs/git.md", "content": "a .git file is a link\n"}, ctx(repo)).is_error
    assert not edit_file.run({"path": "docs/git.md", "old": "link", "new": "pointer"}, ctx(repo)).is_error
    assert read_file.run({"path": "docs/git.md"}, ctx(repo)).output == "a .git file is a pointer\n"
    assert not write_file.run({"path": ".gitignore", "content": "*.o\n"}, ctx(repo)).is_error
    assert not write_file.run({"path": "x.git", "content": "not a directory\n"}, ctx(repo)).is_error


# ---------------------------------------------------------------- non-regular files and size


_FIFO_CHILD = """
import json, sys, threading
from kxen_agent.runtime.tools import TOOLS, ToolContext
ctx = ToolContext(workspace=sys.argv[1], timeout_s=5, cancel_window_s=1, cancel=threading.Event(), secret_env_names=())
out = {}
for name, args in (("edit_file", {"path": "pipe", "old": "a", "new": "b"}), ("read_file", {"path": "pipe"}),
                   ("write_file", {"path": "pipe", "content": "x"})):
    o = TOOLS[name].run(args, ctx)
    out[name] = [o.is_error, o.output]
print(json.dumps(out))
"""


def test_fifo_is_refused_at_once_and_left_alone(tmp_path: Path) -> None:
    ws = Path(os.path.realpath(tmp_path)) / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe")
    # In a child process: a tool that blocks on the FIFO must fail this test, not hang it.
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _FIFO_CHILD, str(ws)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 20
    out = json.loads(done.stdout)
    for name, (is_error, text) in out.items():
        assert is_error and "'pipe' is a FIFO, not a regular file" in text, (name, text)
    assert (ws / "pipe").is_fifo()


def test_files_over_max_file_bytes_are_refused(tmp_path: Path) -> None:
    ws = Path(os.path.realpath(tmp_path)) / "ws"
    ws.mkdir()
    big = b"line\n" * 400  # 2000 bytes
    (ws / "big.txt").write_bytes(big)
    c = ctx(ws, max_file_bytes=1024)
    out = edit_file.run({"path": "big.txt", "old": "line", "new": "x"}, c)
    assert out.is_error and "'big.txt' is 2000 bytes, over the 1024-byte limit of edit_file" in out.output
    assert (ws / "big.txt").read_bytes() == big
    out = write_file.run({"path": "new.txt", "content": "y" * 1025}, c)
    assert out.is_error and "over the 1024-byte limit of write_file" in out.output and not (ws / "new.txt").exists()
    # An edit that would grow a file past the limit is refused too.
    (ws / "small.txt").write_text("a" * 1000)
    out = edit_file.run({"path": "small.txt", "old": "a" * 1000, "new": "b" * 1100}, c)
    assert out.is_error and (ws / "small.txt").read_text() == "a" * 1000
    # read_file reads at most the smaller of its cap and the limit.
    out = read_file.run({"path": "big.txt"}, c)
    assert not out.is_error and out.output.startswith("line\n") and "[output truncated: 976 bytes omitted]" in out.output
    # The default limit is 8 MiB.
    assert ToolContext(workspace=str(ws), timeout_s=1, cancel_window_s=1, cancel=threading.Event(),
                       secret_env_names=()).max_file_bytes == 8 << 20


# ---------------------------------------------------------------- a path swapped mid-call


def test_directory_swapped_for_a_symlink_mid_call_is_a_tool_error_naming_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(os.path.realpath(tmp_path))
    ws, outside = root / "ws", root / "outside"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f.txt").write_text("old\n")
    outside.mkdir()
    (outside / "f.txt").write_text("outside\n")
    real_resolve = files_mod._resolve

    def resolve_then_swap(path: str, c: ToolContext) -> str:
        real = real_resolve(path, c)
        # What a background process could do between the check and the use.
        os.rename(ws / "sub", ws / "sub.moved")
        (ws / "sub").symlink_to(outside)
        return real

    monkeypatch.setattr(files_mod, "_resolve", resolve_then_swap)
    for tool, args in ((write_file, {"path": "sub/f.txt", "content": "pwned\n"}),
                       (edit_file, {"path": "sub/f.txt", "old": "old", "new": "pwned"}),
                       (read_file, {"path": "sub/f.txt"}), (list_files, {"path": "sub"})):
        out = tool.run(args, ctx(ws))
        assert out.is_error, (tool.name, out.output)
        assert f"path '{args['path']}' changed while the tool was using it: 'sub'" in out.output, out.output
        (ws / "sub").unlink()
        os.rename(ws / "sub.moved", ws / "sub")
    assert (outside / "f.txt").read_text() == "outside\n" and (ws / "sub" / "f.txt").read_text() == "old\n"


def test_file_swapped_for_a_symlink_mid_call_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(os.path.realpath(tmp_path))
    ws = root / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("old\n")
    (root / "secret").write_text("s3cret\n")
    real_resolve = files_mod._resolve

    def resolve_then_swap(path: str, c: ToolContext) -> str:
        real = real_resolve(path, c)
        (ws / "f.txt").unlink()
        (ws / "f.txt").symlink_to(root / "secret")
        return real

    monkeypatch.setattr(files_mod, "_resolve", resolve_then_swap)
    out = read_file.run({"path": "f.txt"}, ctx(ws))
    assert out.is_error and "path 'f.txt' changed while the tool was using it" in out.output
    assert "s3cret" not in out.output


# ---------------------------------------------------------------- end to end: the fsmonitor attack


def _kx(tmp_path: Path, gitenv: dict[str, str]) -> Cli:
    return Cli(tmp_path / "state", env=gitenv)


def test_an_agent_with_file_tools_only_cannot_plant_fsmonitor(repo: Path, tmp_path: Path,
                                                               gitenv: dict[str, str]) -> None:
    marker = tmp_path / "ran.txt"
    evil = evil_script(tmp_path, marker)
    config_before = (repo / ".git" / "config").read_bytes()
    (repo / "cfg").symlink_to(".git/config")
    git(repo, "add", "cfg")
    git(repo, "commit", "-q", "-m", "a link")
    planted = f"[core]\n\tfsmonitor = {evil}\n\thooksPath = {tmp_path}\n"
    calls = [
        {"name": "write_file", "arguments": {"path": ".git/config", "content": planted}},
        {"name": "edit_file", "arguments": {"path": ".git/config", "old": "[core]", "new": planted.strip()}},
        {"name": "write_file", "arguments": {"path": "cfg", "content": planted}},
        {"name": "edit_file", "arguments": {"path": "cfg", "old": "[core]", "new": planted.strip()}},
        {"name": "write_file", "arguments": {"path": ".git/hooks/post-checkout", "content": f"#!/bin/sh\n{evil}\n"}},
        {"name": "write_file", "arguments": {"path": "nested/.git", "content": f"gitdir: {tmp_path}\n"}},
    ]
    agent = write_agent(tmp_path / "agent", [{"content": "Planting.", "tool_calls": calls}, {"content": "Done."}],
                        tools=["read_file", "write_file", "edit_file", "list_files"])
    kx = _kx(tmp_path, gitenv)
    res = kx.run_json(repo, "plant it", agent, expect=0).json()
    assert res["status"] == "completed"
    assert (repo / ".git" / "config").read_bytes() == config_before
    assert not (repo / ".git" / "hooks" / "post-checkout").exists() and not (repo / "nested").exists()
    outputs = [e for e in kx.log(res["session"]) if e.get("role") == "tool"]
    assert len(outputs) == len(calls)
    assert all("Git internals" in json.dumps(e) for e in outputs), outputs
    # Git (ours, then the user's) runs nothing the agent wanted.
    fork = kx("session", "fork", res["session"], "--worktree", "alt", "--json", expect=0).json()
    kx("session", "delete", fork["id"], "--worktree", expect=0)
    kx("session", "undelete", fork["id"], expect=0)
    subprocess.run(["git", "status"], cwd=repo, check=True, capture_output=True, env={**os.environ, **gitenv})
    assert not marker.exists(), marker.read_text()


def test_git_config_changed_by_a_run_is_reported_at_its_end(repo: Path, tmp_path: Path,
                                                            gitenv: dict[str, str]) -> None:
    steps = [{"content": "Configuring.", "tool_calls": [
        {"name": "shell", "arguments": {"command": "git config core.fsmonitor /tmp/nothing-here && "
                                                   "printf '#!/bin/sh\\n' > .git/hooks/pre-push"}}]},
             {"content": "Done."}]
    agent = write_agent(tmp_path / "agent", steps)
    kx = _kx(tmp_path, gitenv)
    # Progress notes (this warning is one) go to stderr off a terminal without --json.
    p = kx("run", "--workspace", str(repo), "--task", "configure", "--agent", str(agent), expect=0)
    warnings = [ln for ln in p.err.splitlines() if "changed during the run" in ln]
    assert any(".git/config changed during the run" in ln for ln in warnings), p.err
    assert any(".git/hooks/pre-push changed during the run" in ln for ln in warnings), p.err
    # A run that changes nothing there says nothing.
    steps2 = [{"content": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
              {"content": "Done."}]
    agent2 = write_agent(tmp_path / "agent2", steps2)
    p = kx("run", "--workspace", str(repo), "--task", "read", "--agent", str(agent2), expect=0)
    assert "completed" in p.err and "changed during the run" not in p.err, p.err


def test_workspace_config_commands_do_not_run_in_worktree_fork_delete_undelete(repo: Path, tmp_path: Path,
                                                                              gitenv: dict[str, str]) -> None:
    marker = tmp_path / "ran.txt"
    evil = evil_script(tmp_path, marker)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "reference-transaction", "post-index-change"):
        (hooks / hook).symlink_to(evil)
    # A filter whose smudge a checkout runs: the attributes are committed, the command is the repository's.
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    (repo / "data.txt").write_text("data\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "attributes")
    agent = write_agent(tmp_path / "agent", [{"content": "Nothing to do."}])
    kx = _kx(tmp_path, gitenv)
    ses = kx.run_json(repo, "idle", agent, expect=0).json()["session"]
    # Written after the session exists, as a shell tool (or anyone) could.
    for key, value in (("core.fsmonitor", str(evil)), ("core.hooksPath", str(hooks)),
                       ("filter.evil.smudge", str(evil)), ("filter.evil.clean", str(evil)),
                       ("filter.evil.required", "true"), ("core.sshCommand", str(evil))):
        git(repo, "config", key, value)
    assert subprocess.run(["git", "status"], cwd=repo, capture_output=True,
                          env={**os.environ, **gitenv}).returncode != 0 or marker.exists(), "the trap is not armed"
    marker.unlink(missing_ok=True)
    fork = kx("session", "fork", ses, "--worktree", "alt", "--json", expect=0).json()
    wt = Path(fork["workspace"]["root"])
    assert (wt / "data.txt").read_text() == "data\n"
    kx("session", "delete", fork["id"], "--worktree", expect=0)
    assert not wt.exists()
    kx("session", "undelete", fork["id"], expect=0)
    assert (wt / "data.txt").read_text() == "data\n"
    assert not marker.exists(), marker.read_text()


def test_max_file_bytes_of_the_definition_reaches_the_tools(repo: Path, tmp_path: Path,
                                                           gitenv: dict[str, str]) -> None:
    (repo / "big.txt").write_text("x" * 3000)
    steps = [{"content": "Editing.", "tool_calls": [
        {"name": "edit_file", "arguments": {"path": "big.txt", "old": "xx", "new": "y"}}]}, {"content": "Done."}]
    agent = write_agent(tmp_path / "agent", steps, policy={"max_file_bytes": 2048})
    kx = _kx(tmp_path, gitenv)
    res = kx.run_json(repo, "edit", agent, expect=0).json()
    tool = [e for e in kx.log(res["session"]) if e.get("role") == "tool"]
    assert len(tool) == 1 and "over the 2048-byte limit of edit_file" in json.dumps(tool[0]), tool
    assert (repo / "big.txt").read_text() == "x" * 3000
