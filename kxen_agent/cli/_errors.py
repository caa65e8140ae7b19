"""One line for an OSError that reaches the command line: what failed, where, and what to do next.

Shared by every command (:mod:`.main`) and the interactive session (:mod:`.chat`), which keeps its prompt.
"""

from __future__ import annotations

import os

__all__ = ["os_error_line"]


def os_error_line(e: OSError) -> str:
    """One line for an OSError: what failed, on which path, and what to do."""
    import errno as _errno

    name = _errno.errorcode.get(e.errno or 0, "")
    what = e.strerror or str(e)
    # A path may come as bytes (os calls given bytes): shown as the text it is, never as b'...'.
    where = f" on {os.fsdecode(e.filename)}" if e.filename else ""
    if e.errno in (_errno.EROFS, _errno.EACCES, _errno.EPERM):
        # Not a failing disk: a place this process may not write (a read-only mount, another user's dir).
        state = os.environ.get("KXEN_AGENT_STATE_DIR") or "the state dir"
        why = "is on a read-only file system" if e.errno == _errno.EROFS else "is not writable by this user"
        return " ".join(
            f"cannot write{where}: {what} ({name}): {state} (or the file named) {why}; what was acknowledged before is intact — "
            f"run where it is writable (KXEN_AGENT_STATE_DIR chooses the state dir; reads such as `kxen-agent "
            f"session list` still work), or fix its mount or owner".split())
    hint = "free some space" if e.errno in (_errno.ENOSPC, _errno.EDQUOT) else "check the disk"
    return " ".join(
        f"I/O error{where}: {what}{f' ({name})' if name else ''}; nothing acknowledged was lost — "
        f"{hint}, then retry (`kxen-agent fsck` verifies the state dir; a run goes on with `kxen-agent --resume` and its session id, which `kxen-agent session list` shows)".split()
    )
