"""The pgid records of stdio MCP servers and the reaping of the groups a killed run left (§14.15), in-process
with real processes: a live owner's group is left alone, a dead owner's group is killed, a reused leader pid
is never killed, a half-written record is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from kxen_agent.runtime.mcp_procs import proc_start, reap_orphans


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def test_reaping_follows_the_owner_and_the_leaders_start_time(tmp_path: Path) -> None:
    groups = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(3)]
    try:
        live_owner, dead_owner, reused = groups
        rec = {"ownerStart": None, "server": "s"}

        def write(name: str, **kw: object) -> None:
            (tmp_path / name).write_text(json.dumps(dict(rec, **kw)))

        write("a.json", owner=os.getpid(), ownerStart=proc_start(os.getpid()), pgid=live_owner.pid,
              start=proc_start(live_owner.pid))
        write("b.json", owner=_dead_pid(), pgid=dead_owner.pid, start=proc_start(dead_owner.pid))
        write("c.json", owner=_dead_pid(), pgid=reused.pid, start="1")  # its pid now names another process
        (tmp_path / "d.json").write_text('{"owner": 1')  # a run killed while writing it
        done = reap_orphans(str(tmp_path))
        dead_owner.wait(timeout=10)
        assert done == [f"MCP server 's' (process group {dead_owner.pid}) left by a run that died"]
        assert _alive(live_owner) and _alive(reused)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "d.json"]
        assert reap_orphans(str(tmp_path / "absent")) == []
    finally:
        for p in groups:
            p.kill()
            p.wait()


def test_a_group_whose_leader_is_gone_is_still_reaped(tmp_path: Path) -> None:
    """The server exited (its standard input closed with the killed run) but a child of its group lives on."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    child = int(leader.stdout.readline())
    leader.wait()
    leader.stdout.close()
    try:
        (tmp_path / "r.json").write_text(json.dumps({"owner": _dead_pid(), "ownerStart": None, "pgid": leader.pid,
                                                     "start": "1", "server": "s"}))
        assert len(reap_orphans(str(tmp_path))) == 1
        assert not _running(child) and not list(tmp_path.iterdir())
    finally:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    for _ in range(500):  # SIGKILL is delivered asynchronously: until the kernel has ended it
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return False
        except OSError:
            return False
        time.sleep(0.01)
    return True
