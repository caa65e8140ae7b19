"""The pgid records of the stdio MCP servers a run started, and the reaping of those a dead run left (§14.15).

Each stdio server's process group is recorded, before the server is used, in
``mcp/<owner pid>-<pgid>.json`` under the state dir (written durably:
fsync, rename, fsync of the directory); the run removes it when it has ended
the group. A record whose owner is no longer alive names a group a SIGKILLed
run left behind: :func:`reap_orphans` (called at every run's first tool turn)
kills it if its leader is still the process recorded (its start time, from
``/proc``, so a reused pid is never killed) and removes the record. This
module imports nothing heavy: every run calls it.
"""

from __future__ import annotations

import json
import os
import signal

from .lease import pid_alive, proc_stat

__all__ = ["kill_group", "proc_start", "reap_orphans"]


def proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc``, Linux; as text, §14.15), so a reused pid is never taken
    for it."""
    st = proc_stat(pid)
    return None if st is None else str(st[1])


def _start_ticks(start: str | None) -> int | None:
    return int(start) if isinstance(start, str) and start.isdigit() else None  # anything else: not known


def _alive(pid: int, start: str | None) -> bool:
    return pid_alive(pid, _start_ticks(start))


def kill_group(pgid: int, sig: int) -> bool:
    """Signal process group ``pgid``; whether it had a member to signal."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _reused(pid: int, start: str | None) -> bool:
    """Whether ``pid`` now names a live process other than the one recorded (its start time differs)."""
    st, ticks = proc_stat(pid), _start_ticks(start)
    return st is not None and ticks is not None and st[0] not in (b"Z", b"X") and st[1] != ticks


def reap_orphans(directory: str | None) -> list[str]:
    """Kill the process groups of stdio servers whose run died (its owner pid is gone); say which.

    ``directory``: the state dir's ``mcp/`` (None: nothing recorded, a store with no directory)."""
    if directory is None or not os.path.isdir(directory):
        return []
    done = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                rec = json.loads(f.read())
            owner, pgid = int(rec["owner"]), int(rec["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by a run that died writing it: its server never got past start
        if _alive(owner, rec.get("ownerStart")):
            continue
        # The leader may be gone with members of its group left (a child it started): the group is killed
        # unless the leader's pid names another process now (then the group id is that process's).
        if not _reused(pgid, rec.get("start")) and kill_group(pgid, signal.SIGKILL):
            done.append(f"MCP server {rec.get('server')!r} (process group {pgid}) left by a run that died")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return done
