"""Run and operation states as types, and recovery as a pure function of them.

A run's state object says ``status`` in words (``objects_spec.md`` §14.5)
and each journal entry an op's ``state`` (§14.6); :class:`RunStatus` and
:class:`OpState` are those words as enums (defined in
:mod:`kxen_agent.session.status`, re-exported here). :func:`next_step` is the run
loop's decision: from what is durable — the run's status and settlement,
the Session's newest message, the states of the run's operations — to the
next step, as a value (:data:`Step`). It reads nothing, writes nothing and
calls nothing, so it is tested on every combination in-process
(``tests/runtime/test_recovery.py``); the loop in
:mod:`~kxen_agent.runtime.runner` carries the step out. After a crash the
same function decides what resuming does: a process that died anywhere
leaves one of these states, and each has exactly one next step.

Limitation: the decision for each call of an interrupted tool turn (run it,
run it again, call it UNKNOWN) is still made inside the runner's tool turn;
:func:`provable_file_outcome` is the one rule it asks here: whether a file
tool's effect is proven by the workspace (``objects_spec.md`` §14.14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Union

from kxen_agent.session.status import OpState, RunStatus

__all__ = [
    "AskModel",
    "FinishSettlement",
    "LastMessage",
    "OpState",
    "ResumeAfterResolution",
    "RunStatus",
    "RunTools",
    "SettleThenAsk",
    "Step",
    "Stop",
    "WAITS_FOR_APPROVAL",
    "next_step",
    "provable_file_outcome",
]


@dataclass(frozen=True)
class LastMessage:
    """What :func:`next_step` needs of the Session's newest message."""

    role: str
    run: str | None
    asks_tools: bool


@dataclass(frozen=True)
class FinishSettlement:
    """A terminal run whose settlement was interrupted: write the final message (if completed), mark settled."""


@dataclass(frozen=True)
class Stop:
    """Nothing to do in this process: ``why`` (settled, or waiting for ``run resolve``)."""

    why: str


@dataclass(frozen=True)
class ResumeAfterResolution:
    """``input_required`` with no UNKNOWN op left: every one was resolved; the run goes on."""


@dataclass(frozen=True)
class RunTools:
    """The newest message is this run's assistant turn asking for tools: run (or recover) its calls."""


@dataclass(frozen=True)
class SettleThenAsk:
    """The turn's tool messages are in the Session: settle its ops, then ask the model."""


@dataclass(frozen=True)
class AskModel:
    """Ask the model for the next turn."""


#: :class:`Stop`'s ``why`` while a call waits for `run approve` / `run deny` (§14.6 ``PendingApproval``).
WAITS_FOR_APPROVAL = "waits for approval"

Step = Union[FinishSettlement, Stop, ResumeAfterResolution, RunTools, SettleThenAsk, AskModel]


def next_step(run: str, status: RunStatus, settled: bool, last: LastMessage | None,
              ops: Iterable[OpState]) -> Step:
    """The loop's next step for run ``run``, from its durable state (see the module doc)."""
    if status.terminal:
        return Stop("settled") if settled else FinishSettlement()
    if status is RunStatus.INPUT_REQUIRED:
        ops = tuple(ops)
        if any(s is OpState.OUTCOME_UNKNOWN for s in ops):
            return Stop("waits for run resolve")
        if any(s is OpState.PENDING_APPROVAL for s in ops):
            return Stop(WAITS_FOR_APPROVAL)
        return ResumeAfterResolution()
    if last is not None and last.run == run:
        if last.role == "assistant" and last.asks_tools:
            return RunTools()
        if last.role == "tool":
            return SettleThenAsk()
    return AskModel()


def provable_file_outcome(tool: str, args: Mapping[str, Any], before: bytes | None, now: bytes | None) -> bool:
    """Whether a ``write_file``/``edit_file`` call found ``Started`` after a crash provably took effect (§14.14).

    ``before``: the file's bytes in the operation's before checkpoint (None: absent there); ``now``: its
    bytes in the workspace (None: absent, or not a regular file). Proven when the file now holds exactly what
    the call would have written — ``content``, or the before bytes with their one occurrence of ``old``
    replaced — and that differs from ``before``. Never for any other tool (the shell's effects cannot be
    read back): only a provable outcome is known.
    """
    if now is None:
        return False
    if tool == "write_file":
        content = args.get("content")
        if not isinstance(content, str):
            return False
        try:
            expected = content.encode("utf-8")
        except UnicodeEncodeError:
            return False
    elif tool == "edit_file":
        old, new = args.get("old"), args.get("new")
        if before is None or not isinstance(old, str) or not isinstance(new, str) or not old:
            return False
        try:
            text = before.decode("utf-8")
            if text.count(old) != 1:
                return False  # the call would have been refused: nothing was written
            expected = text.replace(old, new, 1).encode("utf-8")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return False
    else:
        return False
    return now == expected and before != expected
