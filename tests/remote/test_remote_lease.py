"""The cross-machine run lease (``--remote-lease``): one winner, 75 for the other, takeover after expiry, the fence.

Two machines hold the same session (one pushed it, the other pulled it) and
race for its lease through the real remote. The runs' tools wait on files
the test creates, and a holder is stopped or killed by its pid: every wait
is for an event (a file, a process exit, a lease's recorded expiry), never
a sleep that hides a race.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import git, wait_for_file, write_agent
from tests.remote.conftest import Machine, Remote, _code_repo, make_machine
from tests.remote.gitserver import GitDaemon, bare_repo

#: Long enough for one CLI call on a loaded machine to land before it runs out.
TTL = "6"


def _steps(tmp: Path) -> list[dict]:
    """Task 1 answers at once; task 2's tool records its pid, says it started, and waits for GO."""
    wait = (f"echo $$ > {tmp}/tool.pid; touch {tmp}/started; "
            f"while [ ! -f {tmp}/go ]; do sleep 0.05; done; echo went")
    return [
        {"content": "Set up."},
        {"content": "Waiting.", "tool_calls": [{"name": "shell", "arguments": {"command": wait}}]},
        {"content": "Done waiting."},
    ]


def _pair(tmp_path: Path, served: Remote) -> tuple[Machine, Machine, str]:
    """Machines a and b with one session, pushed by a, pulled by b; short leases."""
    env = {"KXEN_AGENT_LEASE_TTL_S": TTL}
    a, b = make_machine(tmp_path, "a", served, env=env), make_machine(tmp_path, "b", served, env=env)
    steps = _steps(tmp_path)
    for m in (a, b):
        write_agent(m.agent.parent, steps)
    ses = a.run("set up")["session"]
    a.kx("session", "push", ses, expect=0)
    b.kx("session", "pull", ses, expect=0, cwd=b.ws)
    return a, b, ses


@dataclass
class _Shared:
    """The module's remote (``git daemon``) and pair of machines, and their state as set up."""

    work: Path
    served: Remote
    a: Machine
    b: Machine
    ses: str
    kept: Path
    dirs: tuple[str, ...]


@pytest.fixture(scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Shared]:
    """One remote over ``git://`` (as the ``served`` fixture makes it) and one pair (a ran, pushed; b
    pulled), set up once for the module: ~2 s of CPU per test (two clones, a run, a push, a pull) that
    each test then gets back as it was."""
    work = tmp_path_factory.mktemp("remote-lease")
    base = work / "served"
    base.mkdir()
    path = bare_repo(base / "remote.git")
    subprocess.run(["git", "-C", str(path), "config", "receive.unpackLimit", "1"], check=True)
    seed = _code_repo(work / "seed")
    git(seed, "push", "-q", str(path), "main")
    subprocess.run(["git", "-C", str(path), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    daemon = GitDaemon(base)
    try:
        served = Remote(path, daemon.url("remote.git"))
        a, b, ses = _pair(work, served)
        kept = work / "kept"
        dirs = (a.state.name, a.ws.name, b.state.name, b.ws.name)
        for name in dirs:
            shutil.copytree(work / name, kept / name, symlinks=True)
        shutil.copytree(path, kept / "remote.git", symlinks=True)
        yield _Shared(work, served, a, b, ses, kept, dirs)
    finally:
        daemon.stop()


@pytest.fixture
def pair(_shared: _Shared) -> Iterator[tuple[Machine, Machine, str, Path, Remote]]:
    """Machines a and b holding one session, the remote and the tools' signal files as set up:
    (a, b, the session, the directory of the tools' signal files, the remote)."""
    sh = _shared
    for name in sh.dirs:
        shutil.rmtree(sh.work / name)
        shutil.copytree(sh.kept / name, sh.work / name, symlinks=True)
    shutil.rmtree(sh.served.path)
    shutil.copytree(sh.kept / "remote.git", sh.served.path, symlinks=True)
    for name in ("go", "started", "tool.pid"):
        (sh.work / name).unlink(missing_ok=True)
    yield sh.a, sh.b, sh.ses, sh.work, sh.served
    for m in (sh.a, sh.b):
        m.kx.kill_spawned()
        m.kx.spawned.clear()
    if (sh.work / "tool.pid").exists():  # a tool a killed holder left waiting for GO
        try:
            os.kill(int((sh.work / "tool.pid").read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def _lease(m: Machine, ses: str) -> dict | None:
    listing = m.json("session", "ls-remote")
    (row,) = [s for s in listing["sessions"] if s["id"] == ses]
    return row["lease"]


def _row(m: Machine, ses: str) -> dict:
    (row,) = [s for s in m.json("session", "ls-remote")["sessions"] if s["id"] == ses]
    return row


def _wait_past(expires_ns: int) -> None:
    """Wait until the wall clock passes a lease's recorded expiry: the event a takeover needs."""
    while time.time_ns() <= expires_ns:
        time.sleep(min(0.05, max(0.0, (expires_ns - time.time_ns()) / 1e9) + 0.001))


def test_a_claim_needs_the_session_here_and_the_remote_seen(pair) -> None:
    a, b, ses, tmp, served = pair
    err = b.kx.refused("--resume", "ses_0123456789abcdef0123", "--remote-lease")
    assert "is not in state dir" in err, err
    # a moves the remote on; b's claim is refused in one line saying to pull first.
    (tmp / "go").touch()  # a's tool need not wait
    a.kx("--resume", ses, "--task", "more", "--json", expect=0)
    a.kx("session", "push", ses, expect=0)
    before = b.snapshot()
    err = b.kx.refused("--resume", ses, "--task", "x", "--remote-lease", cwd=b.ws)
    assert "pull first" in err and f"kxen-agent session pull {ses}" in err, err
    assert b.snapshot() == before
    assert _lease(b, ses) is None


def test_two_machines_race_for_the_lease_one_wins_the_other_gets_75(pair) -> None:
    a, b, ses, tmp, served = pair
    pa = a.kx.spawn("--resume", ses, "--task", "race", "--remote-lease", "--json")
    pb = b.kx.spawn("--resume", ses, "--task", "race", "--remote-lease", "--json")
    procs = {"a": pa, "b": pb}
    # The loser ends on its own (75); the winner waits in its tool for GO.
    deadline = time.monotonic() + 120
    while all(p.poll() is None for p in procs.values()):
        assert time.monotonic() < deadline, "neither claimant finished"
        time.sleep(0.02)
    loser = next(n for n, p in procs.items() if p.poll() is not None)
    winner = "b" if loser == "a" else "a"
    out, err = procs[loser].communicate()
    assert procs[loser].returncode == 75, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "is busy on" in lines[0], err
    assert f"host {socket.gethostname()}" in lines[0] and "run run_" in lines[0], lines[0]
    # The lease on the remote is the winner's, naming its run.
    wait_for_file(tmp / "started", procs[winner])
    held = _lease(a, ses)
    assert held is not None and held["fence"] >= 1 and held["run"] in lines[0]
    (tmp / "go").touch()
    out, err = procs[winner].communicate(timeout=120)
    assert procs[winner].returncode == 0, err
    assert json.loads(out)["status"] == "completed"
    # Released: no lease ref; the winner's run is on the remote.
    row = _row(a, ses)
    assert row["lease"] is None and row["runStatus"] == "completed" and row["run"] == json.loads(out)["run"]
    served.fsck_strict()


def test_takeover_after_the_holder_dies_and_unknown_stays_unknown(pair) -> None:
    a, b, ses, tmp, served = pair
    holder = a.kx.spawn("--resume", ses, "--task", "will die", "--remote-lease", "--json")
    wait_for_file(tmp / "started", holder)
    # The machine dies: the agent and its tool, SIGKILL, no goodbye.
    holder.kill()
    holder.communicate()
    os.kill(int((tmp / "tool.pid").read_text()), signal.SIGKILL)
    # Until its lease expires the dead holder still holds it (another host's death cannot be seen).
    err = b.kx.refused("--resume", ses, "--remote-lease", code=75, cwd=b.ws)
    assert "expires in" in err and f"host {socket.gethostname()}" in err and "run run_" in err, err
    # The tool's Started step reached the remote before the tool ran.
    assert b.json("session", "pull", ses)["sessions"] == {ses: "updated"}
    lease = _lease(b, ses)
    assert lease is not None and f"run {lease['run']}" in err
    _wait_past(lease["expiresNs"])
    res = b.kx("--resume", ses, "--remote-lease", "--json", cwd=b.ws).json()
    # The operation a started may have run: it is UNKNOWN here, never run again.
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1, res
    row = _row(b, ses)
    assert row["runStatus"] == "input_required" and row["lease"] is None and row["fence"] == lease["fence"] + 1
    served.fsck_strict()


def test_a_stale_holder_is_fenced_out(pair) -> None:
    a, b, ses, tmp, served = pair
    holder = a.kx.spawn("--resume", ses, "--task", "will pause", "--remote-lease", "--json")
    wait_for_file(tmp / "started", holder)
    os.kill(holder.pid, signal.SIGSTOP)  # a frozen VM: no renewals
    try:
        b.kx("session", "pull", ses, expect=0, cwd=b.ws)
        lease = _lease(b, ses)
        assert lease is not None
        _wait_past(lease["expiresNs"])
        res = b.kx("--resume", ses, "--remote-lease", "--json", cwd=b.ws).json()
        assert res["status"] == "input_required" and len(res["unknownOps"]) == 1, res
        taken = _row(b, ses)
    finally:
        (tmp / "go").touch()  # the paused holder's tool may finish now
        os.kill(holder.pid, signal.SIGCONT)
    out, err = holder.communicate(timeout=120)
    assert holder.returncode == 75, (out, err)
    assert "taken over" in err, err
    # Nothing the stale holder did after losing the lease reached the remote.
    assert _row(b, ses)["commit"] == taken["commit"]
    assert b.json("session", "pull", ses)["sessions"] == {ses: "unchanged"}
    run = res["run"]
    shown = b.kx.run_show(ses, run)
    assert [j["state"] for j in shown["journal"]] == ["OutcomeUnknown"]


def test_a_plain_push_is_refused_while_another_machine_holds_the_lease(pair) -> None:
    a, b, ses, tmp, served = pair
    holder = a.kx.spawn("--resume", ses, "--task", "hold", "--remote-lease", "--json")
    try:
        wait_for_file(tmp / "started", holder)
        ref = f"refs/kxen/sessions/{ses}"
        before = served.refs()[ref]  # (the holder's renewals move the lease ref meanwhile)
        err = b.kx.refused("session", "push", ses, code=75, cwd=b.ws)
        assert "is busy on" in err and "remote lease is held by" in err, err
        assert served.refs()[ref] == before
        # A live holder renews: past the expiry it had, the lease is still its own, further out.
        first = _lease(b, ses)
        assert first is not None
        _wait_past(first["expiresNs"])
        later = _lease(b, ses)
        assert later is not None and not later["expired"] and later["expiresNs"] > first["expiresNs"]
        assert (later["fence"], later["run"], later["sinceNs"]) == (first["fence"], first["run"], first["sinceNs"])
        assert "is busy on" in b.kx.refused("session", "push", ses, code=75, cwd=b.ws)
    finally:
        (tmp / "go").touch()
    holder.communicate(timeout=120)
    assert holder.returncode == 0


@pytest.mark.parametrize("transport", ["git"])
def test_run_with_remote_lease_creates_the_session_there(tmp_path: Path, served: Remote) -> None:
    a = make_machine(tmp_path, "a", served, env={"KXEN_AGENT_LEASE_TTL_S": TTL})
    (tmp_path / "go").touch()
    write_agent(a.agent.parent, _steps(tmp_path))
    res = a.run("set up", "--remote-lease")
    ses = res["session"]
    row = _row(a, ses)
    assert (row["runStatus"], row["run"], row["lease"], row["fence"]) == ("completed", res["run"], None, 1)
    assert row["local"] == "same"
    # Without a remote to hold the lease on, nothing is created.
    bare = tmp_path / "no-origin"
    bare.mkdir()
    before = a.snapshot()
    err = a.kx.refused("run", "--workspace", str(bare), "--task", "t", "--agent", str(a.agent), "--remote-lease",
                       code=2)
    assert "no remote 'origin'" in err, err
    assert a.snapshot() == before
