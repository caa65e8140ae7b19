"""Two "machines" and a real Git remote: the fixtures of the session push/pull/lease tests.

A *machine* is a state dir, a clone of the code repository and the
installed CLI bound to that state dir. The *remote* is one bare repository
served three ways: by path, by ``git daemon --enable=receive-pack`` on
127.0.0.1 (``git://``) and by ``git http-backend`` behind a small local HTTP
server (smart HTTP); each machine's clone has that URL as ``origin``, so
every command below finds the remote the way a user's would.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import git, write_agent
from tests.remote.gitserver import GitDaemon, HttpGitServer, bare_repo
from tests.session.test_transfer import Kx as TransferKx

TRANSPORTS = ("path", "git", "http")

#: The scripted agent: a tool turn and an answer per task (the provider picks the
#: step by the number of assistant messages so far).
STEPS = [
    {"content": "Looking around.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo first"}}]},
    {"content": "First task done."},
    {"content": "Second task.", "tool_calls": [{"name": "write_file", "arguments": {"path": "B.md", "content": "b\n"}}]},
    {"content": "Second task done."},
    {"content": "Third task.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo third"}}]},
    {"content": "Third task done."},
]


class Kx(TransferKx):
    """The strict test CLI, refusing with exit 1 by default (``session push``/``pull`` refusals)."""

    def refused(self, *args: str, code: int | None = 1, cwd: Path | None = None) -> str:  # type: ignore[override]
        return super().refused(*args, code=code, cwd=cwd)


@dataclass
class Remote:
    """The bare repository and the URL the machines know it by."""

    path: Path
    url: str

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True,
                              check=True).stdout

    def refs(self) -> dict[str, str]:
        out = {}
        for line in self.git("for-each-ref", "--format=%(objectname) %(refname)", "refs/kxen/").splitlines():
            oid, ref = line.split(" ")
            out[ref] = oid
        return out

    def fsck_strict(self) -> None:
        done = subprocess.run(["git", "-C", str(self.path), "fsck", "--strict", "--no-dangling"], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        assert "error" not in done.stderr and "warning" not in done.stderr, done.stderr


@dataclass
class Machine:
    name: str
    state: Path
    ws: Path
    kx: Kx
    agent: Path

    def run(self, task: str, *extra: str, expect: int | None = 0) -> dict:
        p = self.kx("run", "--workspace", str(self.ws), "--task", task, "--agent", str(self.agent), "--json", *extra,
                    expect=expect)
        return p.json()

    def log(self, ses: str) -> list[dict]:
        return self.kx.log(ses)

    def json(self, *args: str, expect: int = 0) -> Any:
        return self.kx(*args, "--json", expect=expect, cwd=self.ws).json()

    def snapshot(self) -> dict[str, bytes]:
        """Every file of the state dir with its bytes (the mirror's too): to prove nothing was written."""
        if not self.state.exists():
            return {}
        return {str(p.relative_to(self.state)): p.read_bytes() for p in sorted(self.state.rglob("*")) if p.is_file()}


def _code_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# code\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def served(tmp_path: Path, transport: str) -> Iterator[Remote]:
    """The bare remote ``remote.git`` with a code commit on ``main``, by the transport under test."""
    base = tmp_path / "served"
    base.mkdir()
    path = bare_repo(base / "remote.git")
    # Every push keeps its pack as received: the tests measure what was sent.
    subprocess.run(["git", "-C", str(path), "config", "receive.unpackLimit", "1"], check=True)
    seed = _code_repo(tmp_path / "seed")
    git(seed, "push", "-q", str(path), "main")
    subprocess.run(["git", "-C", str(path), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    if transport == "path":
        yield Remote(path, str(path))
    elif transport == "git":
        daemon = GitDaemon(base)
        try:
            yield Remote(path, daemon.url("remote.git"))
        finally:
            daemon.stop()
    else:
        web = HttpGitServer(base)
        try:
            yield Remote(path, web.url("remote.git"))
        finally:
            web.stop()


def make_machine(tmp_path: Path, name: str, remote: Remote, *, env: dict[str, str] | None = None) -> Machine:
    ws = tmp_path / f"{name}-ws"
    subprocess.run(["git", "clone", "-q", remote.url, str(ws)], check=True, capture_output=True,
                   env=dict(os.environ, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1"))
    agent = write_agent(tmp_path / f"{name}-agent", STEPS)
    # Each machine is set up with the same agent definition: a session pulled from the other runs here
    # unasked (a lock that is not this machine's own waits for `session trust`: tests/runtime/test_trust.py).
    env = {"KXEN_AGENT_AGENT": str(agent), **(env or {})}
    return Machine(name, tmp_path / f"{name}-state", ws, Kx(tmp_path / f"{name}-state", env=env), agent)


@pytest.fixture
def machines(tmp_path: Path, served: Remote) -> Iterator[tuple[Machine, Machine]]:
    a, b = make_machine(tmp_path, "a", served), make_machine(tmp_path, "b", served)
    yield a, b
    a.kx.kill_spawned()
    b.kx.kill_spawned()


def both_went_on(a: Machine, b: Machine) -> str:
    """A session a ran and pushed, b pulled, and both then ran a task of their own on: its id."""
    ses = a.run("first task")["session"]
    a.kx("session", "push", ses, expect=0)
    b.kx("session", "pull", ses, expect=0, cwd=b.ws)
    a.kx("--resume", ses, "--task", "on a", "--json", expect=0)
    b.kx("--resume", ses, "--task", "on b", "--json", expect=0, cwd=b.ws)
    return ses
