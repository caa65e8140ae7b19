"""The workspace's Git configuration cannot make ``session push``/``ls-remote`` run a command; git is bounded.

Real git, a real bare remote, a real (silent) server socket and real
signals: an ``ext::`` URL rewrite or an ``uploadpack`` program planted in
the workspace's ``.git/config`` runs nothing; a remote that never answers is
given up after the timeout, and SIGTERM leaves no ``git`` process and no
scratch ``kxen-git-*`` directory behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kxen_agent.session.gitio import Workbench, resolve_remote
from tests.helpers import git
from tests.remote.conftest import Machine, Remote, _code_repo, make_machine
from tests.remote.gitserver import bare_repo


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    path = bare_repo(tmp_path / "remote.git")
    seed = _code_repo(tmp_path / "seed")
    git(seed, "push", "-q", str(path), "main")
    m = make_machine(tmp_path, "a", Remote(path, str(path)))
    yield m
    m.kx.kill_spawned()


def evil(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "evil-ran.txt"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho \"$0 $*\" >> '{marker}'\nexit 1\n")
    script.chmod(0o755)
    return script, marker


def test_ext_rewrite_in_the_workspace_config_runs_nothing_on_push_or_ls_remote(machine: Machine,
                                                                             tmp_path: Path) -> None:
    ses = machine.run("first task")["session"]
    script, marker = evil(tmp_path)
    origin = git(machine.ws, "remote", "get-url", "origin").strip()
    # What an agent's file tools could once write: the origin now reaches a command.
    git(machine.ws, "config", "protocol.ext.allow", "always")
    git(machine.ws, "config", f"url.ext::{script}.insteadOf", origin)
    before = machine.snapshot()
    for args in (("session", "push", ses), ("session", "ls-remote")):
        line = machine.kx.refused(*args, cwd=machine.ws)
        assert "ext::" in line and "never runs" in line, line
    assert not marker.exists(), marker.read_text()
    assert machine.snapshot() == before
    # Named on the command line, the same.
    line = machine.kx.refused("session", "ls-remote", "--remote", f"ext::{script}", cwd=machine.ws)
    assert "ext::" in line and not marker.exists()
    # A rewrite in the user's own (global) configuration is stopped by Git: protocol.ext.allow=never.
    git(machine.ws, "config", "--unset", f"url.ext::{script}.insteadOf")
    gcfg = tmp_path / "global.gitconfig"
    gcfg.write_text(f'[url "ext::{script}"]\n\tinsteadOf = {origin}\n[protocol "ext"]\n\tallow = always\n')
    p = machine.kx("session", "ls-remote", cwd=machine.ws, env={"GIT_CONFIG_GLOBAL": str(gcfg)})
    assert p.rc != 0 and not marker.exists(), str(p)


def test_upload_pack_program_in_the_workspace_config_is_refused(machine: Machine, tmp_path: Path) -> None:
    ses = machine.run("first task")["session"]
    script, marker = evil(tmp_path)
    for key in ("uploadpack", "receivepack"):
        git(machine.ws, "config", f"remote.origin.{key}", str(script))
        for args in (("session", "push", ses), ("session", "ls-remote"), ("session", "pull", ses)):
            line = machine.kx.refused(*args, cwd=machine.ws)
            assert f"remote.origin.{key}" in line and "never runs" in line, line
        git(machine.ws, "config", "--unset", f"remote.origin.{key}")
    assert not marker.exists(), marker.read_text()
    # Without them, the same remote works.
    machine.kx("session", "push", ses, expect=0, cwd=machine.ws)


def test_a_workbench_copies_only_what_names_the_remote(machine: Machine, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    script, marker = evil(tmp_path)
    for key, value in (("credential.helper", f"!{script}"), ("core.sshCommand", str(script)),
                       ("core.fsmonitor", str(script)), ("http.extraHeader", "X-Evil: 1"),
                       ("remote.origin.pushurl", "/elsewhere/push.git"),
                       ("url./mirror/.insteadOf", "/upstream/")):
        git(machine.ws, "config", key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    r = resolve_remote(str(machine.ws), None, what="the test workspace")
    with Workbench(r, mirror=None) as bench:
        text = Path(bench.path, "config").read_text()
        listed = subprocess.run(["git", "--git-dir", bench.path, "config", "--list", "--local"],
                                capture_output=True, text=True, check=True).stdout
    assert "include" not in text and str(script) not in text and "extraheader" not in listed.lower()
    assert "remote.origin.url=" in listed and "remote.origin.pushurl=/elsewhere/push.git" in listed
    assert "remote.origin.fetch=" in listed and "url./mirror/.insteadof=/upstream/" in listed
    assert not marker.exists()


# ---------------------------------------------------------------- a remote that never answers


class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers; knows when each client goes away."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.closed = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self._conns.append(conn)
        self.accepted.set()
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.closed.set()  # the client's end went away: its process is gone
                return

    def url(self) -> str:
        return f"git://127.0.0.1:{self.port}/never.git"

    def stop(self) -> None:
        for c in self._conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent() -> SilentServer:
    s = SilentServer()
    yield s
    s.stop()


def processes_naming(text: str) -> list[str]:
    """The command lines of live processes that mention ``text``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        if text in cmd and state[state.rfind(b")") + 2:].split()[0] not in (b"Z", b"X"):
            found.append(cmd)
    return found


def test_sigterm_during_a_silent_remote_leaves_no_git_and_no_scratch(machine: Machine, tmp_path: Path,
                                                                     silent: SilentServer) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = machine.kx.spawn("session", "ls-remote", "--remote", silent.url(), "--workspace", str(machine.ws),
                            env={"TMPDIR": str(scratch)})
    assert silent.accepted.wait(30), "git never connected"
    assert [p.name for p in scratch.iterdir() if p.name.startswith("kxen-git-")], "no workbench while git runs"
    assert processes_naming(f"127.0.0.1:{silent.port}"), "no git process while it waits"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.strip().splitlines() == [err.strip()] and "terminated" in err and "Traceback" not in err, err
    assert silent.closed.wait(10), "git kept the connection open after kxen-agent ended"
    assert processes_naming(f"127.0.0.1:{silent.port}") == []
    assert list(scratch.iterdir()) == []


def test_a_silent_remote_times_out(machine: Machine, tmp_path: Path, silent: SilentServer) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    started = time.monotonic()
    p = machine.kx("session", "ls-remote", "--remote", silent.url(), "--workspace", str(machine.ws),
                   env={"TMPDIR": str(scratch), "KXEN_AGENT_GIT_TIMEOUT_S": "1.5"})
    assert p.rc == 1 and "gave no answer within 1.5 s" in p.err and "KXEN_AGENT_GIT_TIMEOUT_S" in p.err, str(p)
    assert time.monotonic() - started < 30
    assert silent.accepted.is_set() and silent.closed.wait(10)
    assert processes_naming(f"127.0.0.1:{silent.port}") == [] and list(scratch.iterdir()) == []
