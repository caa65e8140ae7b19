"""Fault injection: ``KXEN_AGENT_FAULT=POINT[@N][,POINT[@N]...]``.

At the N-th time (default: first) the process reaches POINT it kills itself
with SIGKILL — no cleanup, no flush, exactly like a crash. Tests and anyone
checking the guarantees use it; the points are listed in docs/testing.md ("Fault injection").

A spec naming an unknown point or a bad N is refused (:func:`check_spec`,
called by the runner before it writes anything): a misspelt point would
otherwise never fire, and a crash test would pass without crashing.
"""

from __future__ import annotations

import os
import signal

from kxen_agent.errors import UsageError

__all__ = ["FaultSpecError", "POINTS", "check_spec", "fault"]

POINTS = (
    # Reached only when the answer streams (live output on a terminal, or
    # --events): the first piece of text has been shown, the rest has not come.
    "provider:mid-stream",
    "provider:after-response",
    "compaction:after-response",
    "compaction:after-message",
    "approval:after-decided",
    "tool:after-started",
    "tool:after-effect",
    "tool:after-outcome",
    "tool:after-turn",
    "run:after-result",
    "run:after-final-message",
)

_counts: dict[str, int] = {}


class FaultSpecError(UsageError):
    """``KXEN_AGENT_FAULT`` names an unknown point or a bad occurrence number.

    The run's crash points only; a bad ``KXEN_AGENT_IO_FAULT`` (the store's
    I/O faults) is the store's own error, a different class.
    """


def _targets() -> dict[str, int]:
    spec = os.environ.get("KXEN_AGENT_FAULT", "")
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, at, n = part.partition("@")
        if point not in POINTS:
            raise FaultSpecError(
                f"KXEN_AGENT_FAULT={spec!r}: unknown fault point {point!r}; known points: {', '.join(POINTS)}"
            )
        if at and not (n.isdigit() and int(n) > 0):
            raise FaultSpecError(f"KXEN_AGENT_FAULT={spec!r}: {part!r} needs a positive occurrence number after '@'")
        out[point] = int(n) if at else 1
    return out


def check_spec() -> None:
    """Raise :class:`FaultSpecError` if ``KXEN_AGENT_FAULT`` is set but invalid."""
    _targets()


def fault(point: str) -> None:
    """Die here if ``KXEN_AGENT_FAULT`` names this point (and occurrence)."""
    targets = _targets()
    if point not in targets:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == targets[point]:
        os.kill(os.getpid(), signal.SIGKILL)
