"""Recovery as a pure function (issue #13, item 5): ``next_step`` on every durable state, in-process.

No store, no runner, no CLI: the decision the run loop (and a resume after
a crash) takes from (status, settled, newest message, op states). Every
combination is enumerated and checked against the rules in words; the
runner's behaviour on real runs stays covered by ``test_runloop_memory.py``
and the crash suites.
"""

from __future__ import annotations

import itertools

import pytest

from kxen_agent.runtime.recovery import (AskModel, FinishSettlement, LastMessage, OpState, ResumeAfterResolution,
                                         RunStatus, RunTools, SettleThenAsk, Stop, next_step)
from kxen_agent.runtime.results import TERMINAL
from kxen_agent.session.schema import OP_STATES, RUN_STATUSES

RUN = "run_a"
LASTS = [None] + [LastMessage(role, run, asks) for role, run, asks in itertools.product(
    ("user", "assistant", "tool", "compaction"), (RUN, "run_other", None), (False, True))]
OPS = [[], [OpState.SETTLED], [OpState.OUTCOME_KNOWN], [OpState.STARTED], [OpState.DECIDED],
       [OpState.SETTLED, OpState.OUTCOME_UNKNOWN], [OpState.OUTCOME_KNOWN, OpState.OUTCOME_UNKNOWN]]


def test_the_enums_are_the_schemas_words() -> None:
    assert {s.value for s in RunStatus} == set(RUN_STATUSES)
    assert {s.value for s in OpState} == set(OP_STATES)
    assert {s.value for s in RunStatus if s.terminal} == set(TERMINAL)


@pytest.mark.parametrize("status", list(RunStatus), ids=lambda s: s.value)
def test_every_state_has_exactly_the_rules_step(status: RunStatus) -> None:
    for settled, last, ops in itertools.product((False, True), LASTS, OPS):
        step = next_step(RUN, status, settled, last, ops)
        unknown = OpState.OUTCOME_UNKNOWN in ops
        mine = last is not None and last.run == RUN
        if status.terminal:
            expected = Stop("settled") if settled else FinishSettlement()
        elif status is RunStatus.INPUT_REQUIRED:
            expected = Stop("waits for run resolve") if unknown else ResumeAfterResolution()
        elif mine and last.role == "assistant" and last.asks_tools:
            expected = RunTools()
        elif mine and last.role == "tool":
            expected = SettleThenAsk()
        else:
            expected = AskModel()
        assert step == expected, (status, settled, last, ops)


def test_a_crash_between_a_turns_steps_resumes_at_the_next_one() -> None:
    # The states a running run passes through in one tool turn, in order, and the step each resumes with.
    ask = LastMessage("assistant", RUN, True)
    results = LastMessage("tool", RUN, False)
    running = RunStatus.RUNNING
    assert next_step(RUN, running, False, LastMessage("user", RUN, False), []) == AskModel()  # task written
    assert next_step(RUN, running, False, ask, []) == RunTools()  # the call asked for, not started
    assert next_step(RUN, running, False, ask, [OpState.DECIDED]) == RunTools()  # approved (or refused), not started
    assert next_step(RUN, running, False, ask, [OpState.STARTED]) == RunTools()  # started: the tool turn recovers it
    assert next_step(RUN, running, False, ask, [OpState.OUTCOME_KNOWN]) == RunTools()  # outcome known
    assert next_step(RUN, running, False, results, [OpState.OUTCOME_KNOWN]) == SettleThenAsk()  # results written
    assert next_step(RUN, running, False, results, [OpState.SETTLED]) == SettleThenAsk()  # settled: nothing left
    # A compaction written before the model call: the call is next.
    assert next_step(RUN, running, False, LastMessage("compaction", RUN, False), [OpState.SETTLED]) == AskModel()
    # Another run's turns never make this run run tools.
    assert next_step(RUN, running, False, LastMessage("assistant", "run_old", True), []) == AskModel()


def test_steps_are_frozen_values() -> None:
    with pytest.raises(AttributeError):
        Stop("settled").why = "other"  # type: ignore[misc]
    assert RunStatus("input_required") is RunStatus.INPUT_REQUIRED
    with pytest.raises(ValueError):
        RunStatus("paused")
