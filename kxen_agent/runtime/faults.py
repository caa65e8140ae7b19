"""Fault injection: ``KXEN_AGENT_FAULT=POINT[@N][,POINT[@N]...]``.

At the N-th time (default: first) the process reaches POINT it kills itself
with SIGKILL — no cleanup, no flush, exactly like a crash. Tests and anyone
checking the guarantees use it; the points are listed in the README.
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "fault"]

POINTS = (
    "provider:after-response",
    "tool:after-started",
    "tool:after-effect",
    "tool:after-outcome",
    "tool:after-turn",
    "run:after-result",
    "run:after-final-message",
)

_counts: dict[str, int] = {}


def _targets() -> dict[str, int]:
    spec = os.environ.get("KXEN_AGENT_FAULT", "")
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, n = part.partition("@")
        out[point] = int(n) if n.isdigit() and int(n) > 0 else 1
    return out


def fault(point: str) -> None:
    """Die here if ``KXEN_AGENT_FAULT`` names this point (and occurrence)."""
    targets = _targets()
    if point not in targets:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == targets[point]:
        os.kill(os.getpid(), signal.SIGKILL)
