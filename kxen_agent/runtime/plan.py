"""A durable step of a run as a value: what it writes and which refs it moves.

Every change a run makes to the store is one :class:`StepPlan`, built by the
loop (or by :mod:`.approvals`, :mod:`.compaction`, :mod:`.trust`) and committed
by :meth:`~kxen_agent.runtime.runner.Runner.commit`, the one place that makes
a ``Store.step`` and moves refs (``objects_spec.md`` §14.6: every step writes
its objects and moves the refs in one step carrying the lease's fence). A
reader sees in the plan the messages appended to ``head``, the journal
entries and the run state a step adds — nothing else is written.

Records only: building a plan reads and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["KEEP_OUTPUT", "Committed", "JournalWrite", "StepPlan"]


class _Keep:
    def __repr__(self) -> str:
        return "KEEP_OUTPUT"


#: :attr:`JournalWrite.output`: the entry keeps the ``output``/``outputBlob`` it carries (a ``Settled`` entry
#: copies its ``OutcomeKnown``'s: the output is not read back to be written again).
KEEP_OUTPUT: Any = _Keep()


@dataclass(frozen=True)
class JournalWrite:
    """One journal entry to add (§14.6): its keys but ``previous``/``timeNs`` (the commit sets those), and
    its output text (stored inline or as a blob by size), None for none, or :data:`KEEP_OUTPUT`."""

    entry: Mapping[str, Any]
    output: Any = None


@dataclass(frozen=True)
class StepPlan:
    """One durable step of session ``group``, committed in one ref transaction under ``fence``.

    ``messages`` are appended to ``head`` (the session head the step starts from), which then names the
    last. With ``changes``, run ``run`` gets a new state: ``current`` (its state now, as (id, value); None
    for the run's first state, which ``changes`` then is whole) updated by ``changes``, linking the
    ``entries`` written (oldest first) as its journal.
    """

    group: str
    reason: str
    fence: int | None
    head: bytes | None
    messages: tuple[Mapping[str, Any], ...] = ()
    run: str | None = None
    current: tuple[bytes, Mapping[str, Any]] | None = None
    changes: Mapping[str, Any] | None = None
    entries: tuple[JournalWrite, ...] = field(default=())
    meta: tuple[bytes, Mapping[str, Any]] | None = None
    #: Texts written as blobs in the step, before the run state that links them (a run's instructions, §14.5).
    blobs: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Committed:
    """What :meth:`Runner.commit` made durable: the session's head, and the run's state (id, value) if it wrote one."""

    head: bytes | None
    state: tuple[bytes, dict] | None
