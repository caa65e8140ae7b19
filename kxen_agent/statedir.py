"""Where the state dir is when no path is given: one rule for the store and for the lean start.

``kxen_agent.store`` opens it, and ``session grep``'s start (``cli/start.py``
-> ``session/grep_stamp.py``), which does not import the store, finds it
the same way. This module imports nothing of kxen-agent and must stay that
way: every layer uses it.
"""

from __future__ import annotations

import os

__all__ = ["default_state_dir"]


def default_state_dir() -> str:
    """``KXEN_AGENT_STATE_DIR`` (made absolute), else ``$XDG_DATA_HOME/kxen-agent`` when that is an absolute
    path (the XDG rule: a relative one is ignored), else ``~/.local/share/kxen-agent``."""
    env = os.environ.get("KXEN_AGENT_STATE_DIR")
    if env:
        return os.path.abspath(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "kxen-agent")
