"""The words a run's state is spelt in (``objects_spec.md`` §14.5, §14.6), in one place.

Every status a run state or a journal entry holds on disk, every word a
reader is shown of one, and the legal moves between them are values here;
no other module of ``kxen_agent`` spells one as a string literal
(``tests/test_status_words.py`` walks the package and fails if one does).

The enums are :class:`~enum.StrEnum`: a member compares, hashes, formats and
serializes to JSON as its word, so a reader can compare a decoded value with
it directly. The strict CBOR encoder takes exact ``str`` only, so a writer
stores ``member.value`` (:func:`plain`); the run writer in
:mod:`kxen_agent.runtime` does it for the keys it owns.

The transition tables (:data:`RUN_MOVES`, :data:`OP_MOVES`) are the §14.5 and
§14.6 state machines as data: :func:`check_run_move` and :func:`check_op_move`
raise :class:`IllegalTransition` for a move that breaks them. A writer
calling them with such a move is a bug in kxen-agent; a reader finding one on
disk reports damage (``fsck`` kind ``run-state``). Pure values, no I/O.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Iterable

__all__ = [
    "INTERRUPTED",
    "OP_MOVES",
    "RUN_MOVES",
    "STATUS_WORDS",
    "TERMINAL",
    "Approval",
    "ApproverName",
    "IllegalTransition",
    "OpSource",
    "OpState",
    "RunStatus",
    "check_op_move",
    "check_run_move",
    "plain",
]


class RunStatus(StrEnum):
    """A run's ``status`` (§14.5)."""

    RUNNING = "running"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


#: The statuses that end a run (settled or not).
TERMINAL: tuple[RunStatus, ...] = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED)

#: Shown, never stored: an unsettled run whose session's lease no live process holds (its process died).
INTERRUPTED = "interrupted"


class OpState(StrEnum):
    """An operation's journal ``state`` (§14.6)."""

    DECIDED = "Decided"  # approved or refused by the user (§14.6), not started yet: its tool turn goes on
    # Nobody could be asked (no terminal, no --yes): the run waits for `run approve` / `run deny` (§14.6).
    PENDING_APPROVAL = "PendingApproval"
    STARTED = "Started"
    OUTCOME_KNOWN = "OutcomeKnown"
    SETTLED = "Settled"
    OUTCOME_UNKNOWN = "OutcomeUnknown"


class OpSource(StrEnum):
    """A journal entry's ``source`` (§14.6): who or what established its state."""

    TOOL = "tool"
    RECOVERY = "recovery"
    CANCEL = "cancel"
    HUMAN = "human"
    POLICY = "policy"


class Approval(StrEnum):
    """A ``Decided`` entry's ``approval`` (§14.6)."""

    YES = "yes"
    NO = "no"


class ApproverName(StrEnum):
    """A ``Decided`` entry's ``approver`` (§14.6): who decided."""

    USER = "user"  # a person at the terminal, once
    USER_ALWAYS = "user-always"  # a person at the terminal, for the rest of the run's calls of the tool
    YES_FLAG = "--yes"  # the run's --yes
    NO_TERMINAL = "no-terminal"  # nobody to ask: refused
    TRUST = "trust"  # `session trust` here, on a call another state dir asked for or decided
    USER_COMMAND = "user-command"  # a person with `run approve` / `run deny`, on a call that waited (§14.6)

    @property
    def human(self) -> bool:
        """Whether a person answered (the entry's ``source`` is then ``human``, else ``policy``)."""
        return self in (ApproverName.USER, ApproverName.USER_ALWAYS, ApproverName.USER_COMMAND)


#: The words only this module may spell as string literals (tests/test_status_words.py). Words that
#: other vocabularies share are left out, so the rule cannot be fooled into flagging unrelated uses:
#: ``tool`` and ``user`` (message roles), ``policy`` (the lock's table), ``cancel`` (events, fault
#: points), ``yes``/``no``, ``--yes`` (a CLI option) and ``trust`` (a CLI command).
STATUS_WORDS: frozenset[str] = frozenset(
    [*(s.value for s in RunStatus), INTERRUPTED, *(s.value for s in OpState),
     OpSource.RECOVERY.value, OpSource.HUMAN.value, ApproverName.USER_ALWAYS.value, ApproverName.NO_TERMINAL.value,
     ApproverName.USER_COMMAND.value])


# ---------------------------------------------------------------- the state machines

class IllegalTransition(Exception):
    """A move the §14.5 / §14.6 table forbids: raised by a writer, it is a kxen-agent bug (nothing was
    written); found on disk, it is damage (``fsck`` kind ``run-state``)."""

    def __init__(self, what: str, old: str | None, new: str) -> None:
        self.what, self.old, self.new = what, old, new
        super().__init__(f"illegal {what} transition {old or '(new)'} -> {new} (objects_spec.md "
                         f"{'§14.5' if what == 'run' else '§14.6'})")


_R = RunStatus
#: §14.5: from each run status (None: the first state of a run) to the statuses its next state may hold.
#: A status may stay (a turn, a settlement, a model change); a terminal one never changes.
RUN_MOVES: dict[RunStatus | None, frozenset[RunStatus]] = {
    None: frozenset({_R.RUNNING}),
    _R.RUNNING: frozenset({_R.RUNNING, _R.INPUT_REQUIRED, _R.COMPLETED, _R.FAILED, _R.CANCELED}),
    # Waiting: for run resolve (then running again), or for this machine's decision (§14.13), whose reason
    # may change while it waits.
    _R.INPUT_REQUIRED: frozenset({_R.INPUT_REQUIRED, _R.RUNNING}),
    _R.COMPLETED: frozenset({_R.COMPLETED}),
    _R.FAILED: frozenset({_R.FAILED}),
    _R.CANCELED: frozenset({_R.CANCELED}),
}

_O = OpState
#: §14.6: from each op state (None: the op's first entry) to the states its next entry may hold.
OP_MOVES: dict[OpState | None, frozenset[OpState]] = {
    None: frozenset({_O.DECIDED, _O.STARTED, _O.PENDING_APPROVAL}),
    # Waiting for a person (no terminal to ask at): only their decision moves it on.
    _O.PENDING_APPROVAL: frozenset({_O.DECIDED}),
    # A decision is re-recorded by `session trust` here; a refusal becomes an error outcome at once.
    _O.DECIDED: frozenset({_O.DECIDED, _O.STARTED, _O.OUTCOME_KNOWN}),
    # Started again: a refused or side-effect-free call re-run after a crash.
    _O.STARTED: frozenset({_O.STARTED, _O.OUTCOME_KNOWN, _O.OUTCOME_UNKNOWN}),
    _O.OUTCOME_UNKNOWN: frozenset({_O.OUTCOME_KNOWN}),  # only `run resolve`
    _O.OUTCOME_KNOWN: frozenset({_O.SETTLED}),
    _O.SETTLED: frozenset(),
}


def check_run_move(old: str | None, new: str) -> RunStatus:
    """``new`` as a :class:`RunStatus` if a run may move to it from ``old`` (None: a new run)."""
    return _check("run", RUN_MOVES, RunStatus, old, new)


def check_op_move(old: str | None, new: str) -> OpState:
    """``new`` as an :class:`OpState` if an op may move to it from ``old`` (None: its first entry)."""
    return _check("operation", OP_MOVES, OpState, old, new)


def _check(what: str, table: dict, enum: type, old: str | None, new: str) -> Any:
    try:
        to = enum(new)
        allowed = table[None if old is None else enum(old)]
    except ValueError:
        raise IllegalTransition(what, old, new) from None
    if to not in allowed:
        raise IllegalTransition(what, old, new)
    return to


def plain(value: Any) -> Any:
    """``value`` with every status word an exact ``str`` (what the CBOR encoder takes), in maps and lists."""
    if isinstance(value, StrEnum):
        return value.value
    if type(value) is dict:
        return {k: plain(v) for k, v in value.items()}
    if type(value) is list:
        return [plain(v) for v in value]
    return value


def words(values: Iterable[StrEnum]) -> tuple[str, ...]:
    """The words of ``values``, as exact strings (for schema checks and messages)."""
    return tuple(v.value for v in values)
