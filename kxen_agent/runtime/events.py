"""What a run reports while it works: events for live output, and what it is doing now.

This module owns the records a :class:`~kxen_agent.runtime.runner.Runner`
hands to its ``listener`` as the run goes (:data:`RunEvent`: a turn
started, a piece of the model's text, a retry, a tool started or
finished, a progress note) and :class:`Activity`, what the run is waiting
for at this moment (what a Ctrl-C will have to wait for). Each event's
:meth:`to_json` is one line of ``kxen-agent --events`` (docs/commands.md lists
the format). Texts in events are the redacted ones the run stores.

It never renders, prints or stores anything: the CLI decides what a
terminal or a driving program sees. Events are not durable; a crashed run
is resumed from the store, never from events.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Union

__all__ = [
    "Activity",
    "Listener",
    "Note",
    "ProviderRetry",
    "RunEvent",
    "RunStarted",
    "TextDelta",
    "ToolFinished",
    "ToolStarted",
    "TurnFinished",
    "TurnStarted",
]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


@dataclass(frozen=True)
class _Event:
    """The fields every event has: the session and the run it is about."""

    name: ClassVar[str] = ""
    session: str
    run: str

    def to_json(self) -> dict[str, Any]:
        """``{"event": NAME, "session", "run", ...}`` with camelCase keys."""
        return {"event": self.name, **{_camel(k): v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class RunStarted(_Event):
    """A run starts or resumes: its model and endpoint, and the run it retries (if any)."""

    name: ClassVar[str] = "run_started"
    index: int
    model: str
    base_url: str | None
    retry_of: str | None
    resumed: bool


@dataclass(frozen=True)
class TurnStarted(_Event):
    """A model call begins: ``turn`` is the turn it will be if it succeeds, ``attempt`` counts retries."""

    name: ClassVar[str] = "turn_started"
    turn: int
    attempt: int


@dataclass(frozen=True)
class TextDelta(_Event):
    """A piece of the model's answer as it streams (not yet durable; a retry discards it)."""

    name: ClassVar[str] = "text_delta"
    turn: int
    text: str


@dataclass(frozen=True)
class ProviderRetry(_Event):
    """An attempt failed transiently and will be retried after ``wait_s`` seconds.

    The text streamed since the last ``turn_started`` is not part of any answer.
    """

    name: ClassVar[str] = "provider_retry"
    turn: int
    attempt: int
    max_attempts: int
    wait_s: float
    error: str


@dataclass(frozen=True)
class TurnFinished(_Event):
    """The model's answer is durable in the session (or was the final answer, about to be)."""

    name: ClassVar[str] = "turn_finished"
    turn: int
    finish_reason: str | None
    tools: tuple[str, ...]
    usage: dict[str, int] | None


@dataclass(frozen=True)
class ToolStarted(_Event):
    """A tool call's ``Started`` is durable and the tool is about to run."""

    name: ClassVar[str] = "tool_started"
    turn: int
    op: str
    call_id: str
    tool: str
    arguments: str


@dataclass(frozen=True)
class ToolFinished(_Event):
    """A tool call's outcome is durable: ``OutcomeKnown`` (with ``is_error``) or ``OutcomeUnknown``."""

    name: ClassVar[str] = "tool_finished"
    turn: int
    op: str
    tool: str
    state: str
    is_error: bool | None
    summary: str
    output_lines: int


@dataclass(frozen=True)
class Note(_Event):
    """A progress note in words (what the CLI prints on stderr without --events)."""

    name: ClassVar[str] = "note"
    text: str


RunEvent = Union[RunStarted, TurnStarted, TextDelta, ProviderRetry, TurnFinished, ToolStarted, ToolFinished, Note]
#: Called on the run's thread with each event; it must not raise (an exception stops the run
#: where it is, as a crash would).
Listener = Callable[[RunEvent], None]


@dataclass(frozen=True)
class Activity:
    """What the run is doing now, for a Ctrl-C to say what it will wait for.

    ``what``: ``model`` (a model call to ``endpoint`` in flight: abandoned at
    once), ``retry-wait`` (waiting to retry a model call: abandoned at once),
    ``tool`` (tool ``tool`` of operation ``op`` running: it gets
    ``window_s``, its cancellation window, to stop), or ``step`` (a durable
    step or nothing in flight: finishes in a moment).
    """

    what: str
    endpoint: str | None = None
    tool: str | None = None
    op: str | None = None
    window_s: float | None = None
    since: float = field(default_factory=time.monotonic)
