"""The one door to git: the repository's own command keys undone, the user's kept; bounded processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kxen_agent.session import gitproc
from kxen_agent.session.workspace import git as ws_git
from tests.helpers import git, git_workspace


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "global.gitconfig"
    cfg.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return cfg


def recorder(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A filter program that records that it ran, then passes its input through."""
    marker = tmp_path / f"{name}.ran"
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/sh\necho ran >> '{marker}'\ncat\n")
    script.chmod(0o755)
    return script, marker


def test_checkout_runs_the_users_filter_never_the_repositorys(tmp_path: Path, home: Path) -> None:
    users, users_ran = recorder(tmp_path, "users-lfs")
    repos, repos_ran = recorder(tmp_path, "repo-filter")
    home.write_text(f"[filter \"lfs\"]\n\tsmudge = {users}\n\tclean = {users}\n\trequired = true\n")
    repo = git_workspace(tmp_path / "repo", {".gitattributes": "*.bin filter=lfs\n*.txt filter=own\n",
                                             "a.bin": "binary\n", "b.txt": "text\n"})
    users_ran.unlink(missing_ok=True)
    # The repository redefines the user's filter and adds one of its own, required.
    for key, value in (("filter.lfs.smudge", str(repos)), ("filter.own.smudge", str(repos)),
                       ("filter.own.required", "true"), ("credential.helper", f"!{repos}"),
                       ("core.sshCommand", str(repos)), ("submodule.x.update", f"!{repos}")):
        git(repo, "config", key, value)
    config, env = gitproc.repository_overrides(chdir=str(repo))
    assert f"filter.lfs.smudge={users}" in config
    assert "filter.own.smudge=" in config and "filter.own.required=false" in config
    assert "credential.helper=" in config and "core.sshcommand=ssh" in config
    assert "submodule.x.update=checkout" in config and env == {}
    p = ws_git(str(repo), "worktree", "add", "-q", str(tmp_path / "wt"), "HEAD")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "wt" / "a.bin").read_text() == "binary\n" and (tmp_path / "wt" / "b.txt").read_text() == "text\n"
    assert users_ran.exists(), "the user's (global) filter must keep working: Git LFS lives there"
    assert not repos_ran.exists()


def test_keys_only_the_user_sets_are_left_alone(tmp_path: Path, home: Path) -> None:
    home.write_text("[credential]\n\thelper = store\n[core]\n\tsshCommand = ssh -4\n")
    repo = git_workspace(tmp_path / "repo")
    assert gitproc.repository_overrides(chdir=str(repo)) == ([], {})
    git(repo, "config", "credential.helper", "!evil")
    config, _ = gitproc.repository_overrides(chdir=str(repo))
    assert config == ["credential.helper=", "credential.helper=store"]
    # A key a -c would split wrongly (a URL with "=") goes through GIT_CONFIG_KEY_n.
    git(repo, "config", "credential.https://h.example/?a=b.helper", "!evil")
    config, env = gitproc.repository_overrides(chdir=str(repo))
    assert config == ["credential.helper=", "credential.helper=store"]
    assert env == {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "credential.https://h.example/?a=b.helper",
                   "GIT_CONFIG_VALUE_0": ""}
    shown = gitproc.run(["config", "--get-all", "credential.https://h.example/?a=b.helper"], cwd=str(repo), env=env)
    assert shown.stdout == b"!evil\n\n"  # the file's, then ours, which Git reads last and which resets the list


def test_a_git_past_its_timeout_is_killed_with_its_children(tmp_path: Path, home: Path) -> None:
    repo = git_workspace(tmp_path / "repo")
    pidfile = tmp_path / "child.pid"
    # An alias runs a shell, whose child would outlive a kill of git alone.
    git(repo, "config", "alias.slow", f"!sh -c 'sleep 60 & echo $! > {pidfile}; wait'")
    started = time.monotonic()
    with pytest.raises(gitproc.GitTimeout, match="did not finish within 1 s"):
        gitproc.run(["slow"], cwd=str(repo), timeout=1)
    assert time.monotonic() - started < 15
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the sleep git's alias started survived the timeout"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")
