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
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for_file, write_agent
from tests.remote.conftest import Machine, Remote, make_machine

pytestmark = pytest.mark.parametrize("transport", ["git"])

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


def test_a_claim_needs_the_session_here_and_the_remote_seen(tmp_path: Path, served: Remote) -> None:
    a, b, ses = _pair(tmp_path, served)
    err = b.kx.refused("--resume", "ses_0123456789abcdef0123", "--remote-lease")
    assert "is not in state dir" in err, err
    # a moves the remote on; b's claim is refused in one line saying to pull first.
    (tmp_path / "go").touch()  # a's tool need not wait
    a.kx("--resume", ses, "--task", "more", "--json", expect=0)
    a.kx("session", "push", ses, expect=0)
    before = b.snapshot()
    err = b.kx.refused("--resume", ses, "--task", "x", "--remote-lease", cwd=b.ws)
    assert "pull first" in err and f"kxen-agent session pull {ses}" in err, err
    assert b.snapshot() == before
    assert _lease(b, ses) is None


def test_two_machines_race_for_the_lease_one_wins_the_other_gets_75(tmp_path: Path, served: Remote) -> None:
    a, b, ses = _pair(tmp_path, served)
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
    wait_for_file(tmp_path / "started", procs[winner])
    held = _lease(a, ses)
    assert held is not None and held["fence"] >= 1 and held["run"] in lines[0]
    (tmp_path / "go").touch()
    out, err = procs[winner].communicate(timeout=120)
    assert procs[winner].returncode == 0, err
    assert json.loads(out)["status"] == "completed"
    # Released: no lease ref; the winner's run is on the remote.
    row = _row(a, ses)
    assert row["lease"] is None and row["runStatus"] == "completed" and row["run"] == json.loads(out)["run"]
    served.fsck_strict()


def test_takeover_after_the_holder_dies_and_unknown_stays_unknown(tmp_path: Path, served: Remote) -> None:
    a, b, ses = _pair(tmp_path, served)
    holder = a.kx.spawn("--resume", ses, "--task", "will die", "--remote-lease", "--json")
    wait_for_file(tmp_path / "started", holder)
    # The machine dies: the agent and its tool, SIGKILL, no goodbye.
    holder.kill()
    holder.communicate()
    os.kill(int((tmp_path / "tool.pid").read_text()), signal.SIGKILL)
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


def test_a_stale_holder_is_fenced_out(tmp_path: Path, served: Remote) -> None:
    a, b, ses = _pair(tmp_path, served)
    holder = a.kx.spawn("--resume", ses, "--task", "will pause", "--remote-lease", "--json")
    wait_for_file(tmp_path / "started", holder)
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
        (tmp_path / "go").touch()  # the paused holder's tool may finish now
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


def test_a_plain_push_is_refused_while_another_machine_holds_the_lease(tmp_path: Path, served: Remote) -> None:
    a, b, ses = _pair(tmp_path, served)
    holder = a.kx.spawn("--resume", ses, "--task", "hold", "--remote-lease", "--json")
    try:
        wait_for_file(tmp_path / "started", holder)
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
        (tmp_path / "go").touch()
    holder.communicate(timeout=120)
    assert holder.returncode == 0


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
