"""The §14.5/§14.6 state machines, checked on every write (a bug) and on every read (damage).

A writer that asks for a move the tables forbid raises IllegalTransition before
anything is written. A state dir holding such a move (crafted here: a
completed run made ``running`` again, an op moved on from ``Settled``) is
damage: ``--resume`` exits 1 with one line naming the object and fsck, never
a traceback, and ``fsck`` reports it as kind ``run-state``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kxen_agent.runtime.plan import JournalWrite, StepPlan
from kxen_agent.runtime.run_reader import JournalView, RunStateDamage, check_states
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.schema import put, read
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.session.status import (OP_MOVES, RUN_MOVES, IllegalTransition, OpState, RunStatus, check_op_move,
                                       check_run_move)
from kxen_agent.store import Store
from kxen_agent.store.memory import MemoryStore
from tests.helpers import Cli, write_agent

READ_STEPS = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}, {"content": "done"}]


# ---------------------------------------------------------------- the tables


def test_the_tables_say_what_the_spec_says() -> None:
    # §14.5: a run starts running; input_required goes back to running; a terminal status never changes.
    check_run_move(None, RunStatus.RUNNING)
    check_run_move(RunStatus.INPUT_REQUIRED, RunStatus.RUNNING)
    with pytest.raises(IllegalTransition):  # a waiting run goes on first; nothing ends it from there
        check_run_move(RunStatus.INPUT_REQUIRED, RunStatus.CANCELED)
    for done in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED):
        assert RUN_MOVES[done] == {done}
        with pytest.raises(IllegalTransition):
            check_run_move(done, RunStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        check_run_move(None, RunStatus.COMPLETED)
    # §14.6: only run resolve leaves OutcomeUnknown, Settled is final, an op starts Decided or Started.
    assert OP_MOVES[OpState.OUTCOME_UNKNOWN] == {OpState.OUTCOME_KNOWN} and OP_MOVES[OpState.SETTLED] == set()
    for bad in [(None, "OutcomeKnown"), ("Settled", "Started"), ("OutcomeKnown", "Started"), ("Started", "Decided")]:
        with pytest.raises(IllegalTransition, match="§14.6"):
            check_op_move(*bad)
    with pytest.raises(IllegalTransition):
        check_op_move("Started", "Finished")  # not a word of the table at all


# ---------------------------------------------------------------- on write: a bug


def finished_run(tmp_path: Path) -> tuple[MemoryStore, Runner, str, str]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "a.txt").write_text("a\n")
    store = MemoryStore("damage")
    runner = Runner(store)
    res = runner.start(str(ws), "read", default_agent_definition(READ_STEPS))
    assert res.status == RunStatus.COMPLETED
    return store, runner, res.session, res.run


def test_an_illegal_write_raises_and_writes_nothing(tmp_path: Path) -> None:
    store, runner, ses, run = finished_run(tmp_path)
    info = SessionStore(store).get(ses)
    oid, st = runner.run_state(info, run)
    before = dict(store.refs.read(info.group).refs)
    with pytest.raises(IllegalTransition, match="completed -> running"):
        runner.commit(StepPlan(info.group, "bad", None, info.head, run=run, current=(oid, st),
                               changes={"status": RunStatus.RUNNING}))
    [settled] = runner.ops(st).values()
    assert settled["state"] == OpState.SETTLED
    with pytest.raises(IllegalTransition, match="Settled -> Started"):
        runner.commit(StepPlan(info.group, "bad", None, info.head, run=run, current=(oid, st), changes={},
                               entries=(JournalWrite(dict(settled, state=OpState.STARTED)),)))
    assert dict(store.refs.read(info.group).refs) == before


# ---------------------------------------------------------------- on read: damage


def test_a_journal_read_back_that_breaks_the_table_is_damage(tmp_path: Path) -> None:
    store, runner, ses, run = finished_run(tmp_path)
    info = SessionStore(store).get(ses)
    oid, st = runner.run_state(info, run)
    [settled] = runner.ops(st).values()
    bad = put(store, "journal", dict(settled, state="Started", previous=st["journal"], timeNs=time.time_ns()))
    with pytest.raises(RunStateDamage, match=f"damaged run state {bad.hex()}: operation {settled['op']}.*Settled "
                                             "-> Started.*kxen-agent fsck"):
        JournalView(run).sync(store, bad)
    assert [where for where, _ in check_states(store, put(store, "run", dict(st, journal=bad, previous=oid)))] == [
        bad.hex()]


def crafted(cli: Cli, workspace: Path, tmp_path: Path, how: str) -> tuple[str, str]:
    """A finished run on disk whose newest state ``how`` breaks the tables: its (session, bad object hex)."""
    (workspace / "a.txt").write_text("a\n")
    agent = write_agent(tmp_path / "agent", READ_STEPS)
    if how == "run":
        cli.run_json(workspace, "read", agent, expect=0)
    else:  # a run that died with its op OutcomeKnown: the resume reads its journal
        assert cli.run_json(workspace, "read", agent, env={"KXEN_AGENT_FAULT": "tool:after-outcome"}).killed
    [s] = cli.sessions()
    ses, run = s["id"], s["runs"][0]["id"]
    store = Store.open(str(cli.state_dir), namespaces=(NS,))
    info = SessionStore(store).get(ses)
    oid = info.runs[run]
    st = read(store, oid, "run")
    changes: dict = {"status": "running", "settled": False}  # completed and settled made running again
    if how == "journal":  # OutcomeKnown moved back to Decided, in a state that stays running
        e = read(store, st["journal"], "journal")
        assert e["state"] == "OutcomeKnown"
        changes = {"journal": put(store, "journal", dict(e, state="Decided", source="human", approval="yes",
                                                         approver="user", previous=st["journal"],
                                                         timeNs=time.time_ns()))}
    with store.step(info.group) as step:
        new = put(step, "run", dict(st, previous=oid, updatedNs=time.time_ns(), **changes))
        step.update(f"runs/{run}", oid, new)
        step.commit("crafted")
    return ses, (new if how == "run" else changes["journal"]).hex()


@pytest.mark.parametrize("how", ["run", "journal"])
def test_resume_of_a_damaged_run_is_one_line_exit_1_and_fsck_names_it(cli: Cli, workspace: Path, tmp_path: Path,
                                                                      how: str) -> None:
    ses, bad = crafted(cli, workspace, tmp_path, how)
    p = cli("--resume", ses)
    assert p.rc == 1, str(p)
    assert "Traceback" not in p.err and len(p.err.strip().splitlines()) == 1, str(p)
    assert f"damaged run state {bad}" in p.err and "kxen-agent fsck" in p.err, str(p)
    rep = cli("fsck", "--json")
    assert rep.rc == 1, str(rep)
    problems = [x for x in rep.json()["problems"] if x["kind"] == "run-state"]
    assert [x["where"] for x in problems] == [bad], rep.json()
