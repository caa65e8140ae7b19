"""Crash at every fault point, resume, and check the durable tool boundary.

Each test runs the installed CLI as a real process with
``KXEN_AGENT_FAULT=POINT`` so it SIGKILLs itself at that point, then resumes
it (without the variable) the way a user would, resolving an UNKNOWN
operation by looking at the real side effect. Afterwards:

- the side effect (a marker line appended to a file) happened exactly as
  often as it should: 0 or 1 times, never twice;
- the history holds each tool result exactly once;
- the journal states are the seed's: Started -> OutcomeKnown -> Settled,
  Started -> OutcomeUnknown only where the outcome was not durable;
- ``fsck`` is clean.

One real crash per fault point (the matrix below); the other crash tests
here repeat, through the CLI, what tests/runtime/test_runloop_memory.py
checks in process, and run under ``KXEN_TEST_LONG=1`` only.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.helpers import Cli, read_lines, tool_result_counts, write_agent

# Points where the tool's outcome is durable when the process dies, and where it is not.
KNOWN_POINTS = ("provider:after-response", "tool:after-outcome", "tool:after-turn",
                "run:after-result", "run:after-final-message")
UNKNOWN_POINTS = ("tool:after-started", "tool:after-effect")
FINAL = "all done"


def effect_agent(tmp_path: Path, effects: Path, marker: str) -> Path:
    """An agent whose one tool call appends ``marker`` to ``effects`` (outside the workspace)."""
    steps = [
        {"content": "appending the marker",
         "tool_calls": [{"name": "shell", "arguments": {"command": f"echo {marker} >> '{effects}'"}}]},
        {"content": FINAL},
    ]
    return write_agent(tmp_path / "agent", steps)


def crash(cli: Cli, workspace: Path, task: str, agent: Path, point: str) -> tuple[str, str]:
    """Run until ``KXEN_AGENT_FAULT=point`` kills the process; return its (session, run).

    The killed run prints no result; its progress lines on stderr (written
    before the kill, stderr is unbuffered) name the session and the run.
    """
    p = cli("run", "--workspace", str(workspace), "--task", task, "--agent", str(agent),
            env={"KXEN_AGENT_FAULT": point})
    assert p.killed, str(p)
    assert p.out == "", "a killed run prints no result"
    ses = re.findall(r"session (ses_[0-9a-f]+) created", p.err)
    run = re.findall(r"run (run_[0-9a-f]+) started", p.err)
    assert len(ses) == 1 and len(run) == 1, str(p)
    return ses[0], run[0]


def check_history(cli: Cli, ses: str) -> list[dict]:
    log = cli.log(ses)
    asked, results = tool_result_counts(log)
    assert asked, "the script asked for tool calls"
    assert len(asked) == len(set(asked)), f"a tool call was asked for twice: {asked}"
    assert {c: results[c] for c in asked} == {c: 1 for c in asked}, f"tool results per call: {dict(results)}"
    assert set(results) == set(asked), f"tool results for calls nobody asked for: {dict(results)}"
    # No duplicated assistant message (a provider turn recorded twice).
    contents = [(m["content"], tuple(c["id"] for c in m["toolCalls"])) for m in log if m["role"] == "assistant"]
    assert len(contents) == len(set(contents)), contents
    assert [m["seq"] for m in log] == list(range(len(log)))
    return log


@pytest.mark.parametrize("point", KNOWN_POINTS + UNKNOWN_POINTS)
def test_crash_at_point_then_resume(point: str, cli: Cli, workspace: Path, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    marker = f"MARK-{uuid.uuid4().hex}"
    agent = effect_agent(tmp_path, effects, marker)

    ses, run = crash(cli, workspace, "append the marker", agent, point)

    # The durable state right after the crash is the seed's for that point.
    before = cli.run_show(ses, run)
    states = [j["state"] for j in before["journal"]]
    expected_states = {
        "provider:after-response": [],
        "tool:after-started": ["Started"],
        "tool:after-effect": ["Started"],
        "tool:after-outcome": ["OutcomeKnown"],
        "tool:after-turn": ["OutcomeKnown"],
        "run:after-result": ["Settled"],
        "run:after-final-message": ["Settled"],
    }[point]
    assert states == expected_states, before
    # Its process is gone and holds no lease: shown as interrupted (stored: running, or completed unsettled).
    if point.startswith("run:"):
        assert (before["status"], before["settled"], before["result"]) == ("interrupted", False, FINAL)
        if point == "run:after-result":
            # The run is not finished until it is settled: no new task yet.
            p = cli.resume(ses, "--task", "next", expect=1)
            assert "settlement was interrupted" in p.err and f"--resume {ses}" in p.err, str(p)
    else:
        assert (before["status"], before["settled"]) == ("interrupted", False)
    crash_log = cli.log(ses)
    tool_msgs = [m for m in crash_log if m["role"] == "tool"]
    assert len(tool_msgs) == (1 if point in ("tool:after-turn", "run:after-result", "run:after-final-message") else 0)
    finals = [m for m in crash_log if m["role"] == "assistant" and m["content"] == FINAL]
    assert len(finals) == (1 if point == "run:after-final-message" else 0)
    assert read_lines(effects) == ([] if point in ("provider:after-response", "tool:after-started") else [marker])

    resumed = cli.resume(ses)
    if point in UNKNOWN_POINTS:
        assert resumed.rc == 3, str(resumed)
        res = resumed.json()
        assert (res["session"], res["run"], res["status"]) == (ses, run, "input_required")
        show = cli.run_show(ses, run)
        unknown = [j for j in show["journal"] if j["state"] == "OutcomeUnknown"]
        assert len(unknown) == 1 and len(show["journal"]) == 1, show
        op = unknown[0]["op"]
        assert op.startswith("op_") and res["unknownOps"] == [op]
        assert unknown[0]["tool"] == "shell" and unknown[0]["sideEffects"] is True
        assert unknown[0]["outcome"] is None

        if point == "tool:after-effect":
            # Automatic resume stops at UNKNOWN: resuming again neither runs nor resolves anything.
            again = cli.resume(ses, expect=3)
            assert again.json()["unknownOps"] == [op]
            assert cli.run_show(ses, run)["journal"] == show["journal"]
            assert read_lines(effects) == [marker]

        # Resolve it as a human would: look at the side effect.
        if marker in read_lines(effects):
            verdict = f"verified: {marker} is in effects.log"
            cli("run", "resolve", ses, run, op, "--output", verdict, expect=0)
        else:
            verdict = "verified: the marker is not in effects.log; the command never ran"
            cli("run", "resolve", ses, run, op, "--output", verdict, "--is-error", expect=0)
        resumed = cli.resume(ses)
    else:
        verdict = None

    assert resumed.rc == 0, str(resumed)
    res = resumed.json()
    assert (res["session"], res["run"], res["status"], res["result"], res["settled"]) == (ses, run, "completed", FINAL, True)
    assert res["unknownOps"] == []

    # Exactly the side effects that should have happened.
    assert read_lines(effects) == ([] if point == "tool:after-started" else [marker])

    # Every known op ends Settled; the resolved one keeps its human source and verdict.
    show = cli.run_show(ses, run)
    assert (show["status"], show["settled"], show["turn"]) == ("completed", True, 2)
    assert [j["state"] for j in show["journal"]] == ["Settled"]
    j = show["journal"][0]
    if verdict is not None:
        assert j["source"] == "human"
        assert j["outcome"] == {"output": verdict, "isError": point == "tool:after-started"}
    else:
        assert j["source"] == "tool"
        assert j["outcome"] == {"output": "[exit code 0]", "isError": False}

    log = check_history(cli, ses)
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[2]["content"] == (verdict if verdict is not None else "[exit code 0]")
    assert log[3]["content"] == FINAL
    cli.fsck_clean()


@pytest.mark.long("in process: test_runloop_memory.py::test_a_fault_at_the_nth_occurrence")
def test_fault_at_the_nth_occurrence(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    """``POINT@2``: the first call completes; the process dies after the second call's effect."""
    effects = tmp_path / "effects.log"
    steps = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo first >> '{effects}'"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo second >> '{effects}'"}},
                        {"name": "shell", "arguments": {"command": f"echo third >> '{effects}'"}}]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps)
    ses, run = crash(cli, workspace, "three effects", agent, "tool:after-effect@2")
    assert read_lines(effects) == ["first", "second"]
    show = cli.run_show(ses, run)
    assert [(j["callId"], j["state"]) for j in show["journal"]] == [("call_0_0", "Settled"), ("call_1_0", "Started")]

    resumed = cli.resume(ses, expect=3)
    show = cli.run_show(ses, run)
    assert [(j["callId"], j["state"]) for j in show["journal"]] == [("call_0_0", "Settled"), ("call_1_0", "OutcomeUnknown")]
    op = show["journal"][1]["op"]
    assert resumed.json()["unknownOps"] == [op]
    # The turn's other call did not start while its sibling is UNKNOWN.
    assert read_lines(effects) == ["first", "second"]

    cli("run", "resolve", ses, run, op, "--output", "verified: 'second' is in effects.log", expect=0)
    cli.resume(ses, expect=0)
    assert read_lines(effects) == ["first", "second", "third"]
    show = cli.run_show(ses, run)
    assert [j["state"] for j in show["journal"]] == ["Settled"] * 3
    log = check_history(cli, ses)
    assert [m["content"] for m in log if m["role"] == "tool"] == [
        "[exit code 0]", "verified: 'second' is in effects.log", "[exit code 0]"]
    cli.fsck_clean()


@pytest.mark.long("in process: test_runloop_memory.py::test_a_read_only_tool_interrupted_after_started_is_run_again")
def test_read_only_tool_interrupted_after_started_is_rerun(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    """A call to a tool without side effects is simply run again after a crash: no UNKNOWN."""
    (workspace / "data.txt").write_text("payload-42\n")
    effects = tmp_path / "effects.log"
    steps = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "data.txt"}},
                        {"name": "shell", "arguments": {"command": f"echo effect >> '{effects}'"}}]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps)
    ses, run = crash(cli, workspace, "read then write", agent, "tool:after-started")
    show = cli.run_show(ses, run)
    assert [(j["tool"], j["state"], j["sideEffects"]) for j in show["journal"]] == [("read_file", "Started", False)]
    read_op = show["journal"][0]["op"]

    res = cli.resume(ses, expect=0).json()
    assert res["status"] == "completed" and res["unknownOps"] == []
    show = cli.run_show(ses, run)
    assert [(j["tool"], j["state"]) for j in show["journal"]] == [("read_file", "Settled"), ("shell", "Settled")]
    assert show["journal"][0]["op"] == read_op, "the re-run keeps its operation id"
    assert show["journal"][0]["outcome"] == {"output": "payload-42\n", "isError": False}
    assert read_lines(effects) == ["effect"]
    log = check_history(cli, ses)
    assert [m["content"] for m in log if m["role"] == "tool"] == ["payload-42\n", "[exit code 0]"]
    cli.fsck_clean()


@pytest.mark.parametrize("spec", ["tool:after-strated", "tool:after-effect@0", "tool:after-effect@two"])
def test_a_bad_fault_spec_is_refused_before_anything_is_written(spec: str, cli: Cli, state_dir: Path,
                                                                 workspace: Path, tmp_path: Path) -> None:
    """A misspelt point would never fire, and a crash test would pass without crashing."""
    agent = effect_agent(tmp_path, tmp_path / "effects.log", "MARK")
    p = cli.run_json(workspace, "t", agent, env={"KXEN_AGENT_FAULT": spec}, expect=2)
    assert "KXEN_AGENT_FAULT" in p.err, str(p)
    if "@" in spec:
        assert "positive occurrence number" in p.err, str(p)
    else:
        assert "unknown fault point 'tool:after-strated'" in p.err and "tool:after-started" in p.err, str(p)
    assert not state_dir.exists()
    assert not (tmp_path / "effects.log").exists()


@pytest.mark.long("in process: test_runloop_memory.py::"
                   "test_an_outcome_known_but_unsettled_is_written_once_even_after_a_second_crash")
def test_large_outcome_recovered_from_the_journal_after_a_crash(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    """An output too big to inline (kept in a blob the journal links) survives the crash whole, and the
    recovering process crashing again at the next point changes nothing."""
    effects = tmp_path / "effects.log"
    command = f"echo once >> '{effects}'; head -c 5000 /dev/zero | tr '\\0' x; echo"
    agent = write_agent(tmp_path / "agent", [
        {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]},
        {"content": FINAL},
    ])
    ses, run = crash(cli, workspace, "big output", agent, "tool:after-outcome")
    again = cli.resume(ses, env={"KXEN_AGENT_FAULT": "tool:after-turn"})
    assert again.killed, str(again)
    cli.resume(ses, expect=0)
    expected = "x" * 5000 + "\n[exit code 0]"
    [tool] = [m["content"] for m in check_history(cli, ses) if m["role"] == "tool"]
    assert tool == expected
    show = cli.run_show(ses, run)
    assert [(j["state"], j["outcome"]["output"]) for j in show["journal"]] == [("Settled", expected)]
    assert read_lines(effects) == ["once"]
    cli.fsck_clean()
