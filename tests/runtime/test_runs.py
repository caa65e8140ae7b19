"""Runs through the installed CLI: resolve, consecutive runs, exit codes and
``--json``, tool confinement and enforcement, and credential redaction.

Real processes, real Git workspaces, real files; see ``test_faults.py`` for
the crash-and-resume matrix.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

from tests.helpers import CLI_TIMEOUT_S, Cli, object_bytes, read_lines, step_log_frames, wait_for_file, write_agent

FINAL = "all done"


def one_effect_steps(effects: Path, line: str = "effect") -> list[dict]:
    return [
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo {line} >> '{effects}'"}}]},
        {"content": FINAL},
    ]


def crashed_unknown(cli: Cli, workspace: Path, tmp_path: Path) -> tuple[str, str, Path]:
    """A session whose run died after its shell call's effect: (session, run, effects file)."""
    effects = tmp_path / "effects.log"
    agent = write_agent(tmp_path / "agent", one_effect_steps(effects))
    crashed = cli.run_json(workspace, "one effect", agent, env={"KXEN_AGENT_FAULT": "tool:after-effect"})
    assert crashed.killed, str(crashed)
    [s] = cli.sessions()
    return s["id"], s["runs"][0]["id"], effects


# ------------------------------------------------------------------ resolve


def test_resolve_refuses_anything_but_an_unknown_op_and_never_reexecutes(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    ses, run, effects = crashed_unknown(cli, workspace, tmp_path)
    assert read_lines(effects) == ["effect"]
    started = cli.run_show(ses, run)
    [entry] = started["journal"]
    op = entry["op"]
    assert entry["state"] == "Started"

    # Right after the crash the op is Started: recovery, not a human, decides first.
    p = cli("run", "resolve", ses, run, op, "--output", "too early")
    assert p.rc != 0 and "not OutcomeUnknown" in p.err and op in p.err, str(p)
    assert cli.run_show(ses, run) == started

    cli.resume(ses, expect=3)
    unknown = cli.run_show(ses, run)
    assert [j["state"] for j in unknown["journal"]] == ["OutcomeUnknown"]

    # An op id that is not in the run, and a run that is not in the session.
    p = cli("run", "resolve", ses, run, "op_00000000000000000000", "--output", "x")
    assert p.rc == 1 and "op_00000000000000000000" in p.err and "not in run" in p.err, str(p)
    p = cli("run", "resolve", ses, "run_00000000000000000000", op, "--output", "x")
    assert p.rc == 1 and "run_00000000000000000000" in p.err, str(p)
    assert cli.run_show(ses, run) == unknown

    out = cli("run", "resolve", ses, run, op, "--output", "verified: effect present", "--json", expect=0).json()
    assert out == {"session": ses, "run": run, "op": op, "state": "OutcomeKnown", "source": "human", "isError": False}
    resolved = cli.run_show(ses, run)
    assert resolved["journal"][0]["state"] == "OutcomeKnown"
    assert read_lines(effects) == ["effect"], "resolve never executes the operation"

    # A second resolution of the same op is refused: its outcome is known now.
    p = cli("run", "resolve", ses, run, op, "--output", "changed my mind", "--is-error")
    assert p.rc == 1 and "OutcomeKnown" in p.err, str(p)
    assert cli.run_show(ses, run) == resolved

    cli.resume(ses, expect=0)
    settled = cli.run_show(ses, run)
    assert [j["state"] for j in settled["journal"]] == ["Settled"]
    p = cli("run", "resolve", ses, run, op, "--output", "again")
    assert p.rc == 1 and "Settled" in p.err, str(p)
    assert cli.run_show(ses, run) == settled
    assert read_lines(effects) == ["effect"], "nothing ran the command again"
    cli.fsck_clean()


# ------------------------------------------------------------------ consecutive runs


def test_consecutive_runs_and_resume_refusals(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    steps = one_effect_steps(effects, "one") + [
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo two >> '{effects}'"}}]},
        {"content": "second task done"},
    ]
    agent = write_agent(tmp_path / "agent", steps)
    first = cli.run_json(workspace, "task one", agent, expect=0).json()
    ses, run0 = first["session"], first["run"]

    p = cli.resume(ses, expect=2)  # as --retry with nothing to retry: the request is wrong
    assert "nothing to resume" in p.err and ses in p.err and "--task" in p.err, str(p)

    second = cli.resume(ses, "--task", "task two", expect=0).json()
    run1 = second["run"]
    assert second["session"] == ses and run1 != run0
    assert (second["status"], second["result"]) == ("completed", "second task done")
    runs = cli.session_show(ses)["runs"]
    assert [(r["id"], r["index"], r["status"], r["task"]) for r in runs] == [
        (run0, 0, "completed", "task one"), (run1, 1, "completed", "task two")]
    assert cli.run_show(ses, run1)["index"] == 1

    log = cli.log(ses)
    assert [(m["role"], m["run"]) for m in log] == (
        [("user", run0), ("assistant", run0), ("tool", run0), ("assistant", run0)]
        + [("user", run1), ("assistant", run1), ("tool", run1), ("assistant", run1)])
    assert log[4]["content"] == "task two"
    assert read_lines(effects) == ["one", "two"]

    # A task file works the same way.
    task_file = tmp_path / "task3.md"
    task_file.write_text("task three\n")
    third = cli.resume(ses, "--task-file", str(task_file), expect=0).json()
    assert third["result"] == "script finished"
    assert cli.run_show(ses, third["run"])["task"] == "task three\n"


def test_new_task_refused_while_a_run_is_unfinished(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    ses, run, effects = crashed_unknown(cli, workspace, tmp_path)
    before_log = cli.log(ses)

    # Crashed (still "running"): a new task is refused, nothing changes.
    p = cli.resume(ses, "--task", "something else")
    assert p.rc == 1 and run in p.err and "still running" in p.err and f"--resume {ses}" in p.err, str(p)

    cli.resume(ses, expect=3)
    p = cli.resume(ses, "--task", "something else")
    assert p.rc == 1 and "input_required" in p.err and "resolve" in p.err, str(p)
    assert [r["id"] for r in cli.session_show(ses)["runs"]] == [run]
    assert cli.log(ses) == before_log
    assert read_lines(effects) == ["effect"]


# ------------------------------------------------------------------ exit codes and --json


def test_completed_run_json_and_exit_code(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    agent = write_agent(tmp_path / "agent", one_effect_steps(effects))
    res = cli.run_json(workspace, "do it", agent, expect=0).json()
    assert {"session", "run", "status"} <= set(res)
    assert res["session"].startswith("ses_") and res["run"].startswith("run_")
    assert (res["status"], res["result"], res["error"], res["turn"], res["model"], res["settled"], res["unknownOps"]) == (
        "completed", FINAL, None, 2, "script", True, [])

    # Without --json: a readable summary on stdout, same exit code.
    text = cli("run", "--workspace", str(workspace), "--task", "again", "--agent", str(tmp_path / "agent" / "agent.toml"), expect=0)
    assert "completed" in text.out and f"result: {FINAL}" in text.out
    assert read_lines(effects) == ["effect", "effect"]


def test_max_turns_fails_the_run(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    loop = {"tool_calls": [{"name": "list_files", "arguments": {}}]}
    agent = write_agent(tmp_path / "agent", [loop, loop, loop, {"content": FINAL}], policy={"max_turns": 2})
    p = cli.run_json(workspace, "loop", agent, expect=1)
    res = p.json()
    assert res["status"] == "failed" and res["settled"] is True and res["turn"] == 2
    assert "max_turns (2)" in res["error"]
    log = cli.log(res["session"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant", "tool"]
    cli.resume(res["session"], expect=2)  # failed is terminal: nothing to resume


def test_bad_agent_definition_is_refused_before_anything_is_written(cli: Cli, state_dir: Path, workspace: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", [{"content": "x"}], tools=["shell", "teleport"])
    p = cli.run_json(workspace, "t", agent, expect=2)
    assert "tools" in p.err and "teleport" in p.err and p.out == "", str(p)
    assert not state_dir.exists()

    # A script step calling a tool the agent does not list is refused the same way.
    agent = write_agent(tmp_path / "agent2", [{"tool_calls": [{"name": "shell", "arguments": {"command": "true"}}]}],
                        tools=["read_file"])
    p = cli.run_json(workspace, "t", agent, expect=2)
    assert "script" in p.err and "shell" in p.err, str(p)
    assert not state_dir.exists()


def test_usage_errors_exit_2_and_write_nothing(cli: Cli, state_dir: Path, workspace: Path, tmp_path: Path) -> None:
    agent = str(write_agent(tmp_path / "agent", [{"content": FINAL}]))
    p = cli("run", "--workspace", str(workspace), "--agent", agent, "--json", expect=2)
    assert "--task" in p.err, str(p)
    # (Without --workspace, run binds the current directory: tests/session/test_cli_daily.py.)
    p = cli("run", "--workspace", str(workspace / "missing"), "--task", "t", "--agent", agent, expect=2)
    assert str(workspace / "missing") in p.err, str(p)
    assert not state_dir.exists()


def test_unknown_session_names_the_state_dir_and_import(cli: Cli, state_dir: Path) -> None:
    p = cli.resume("ses_00000000000000000000")
    assert p.rc == 1, str(p)
    assert str(state_dir) in p.err and "session import" in p.err and "KXEN_AGENT_STATE_DIR" in p.err, str(p)
    p = cli("run", "show", "ses_00000000000000000000", "run_00000000000000000000")
    assert p.rc == 1 and str(state_dir) in p.err, str(p)
    assert not state_dir.exists(), "looking a session up writes nothing"


# ------------------------------------------------------------------ confinement


def test_paths_escaping_the_workspace_are_tool_errors(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("outside data\n")
    os.symlink(secret, workspace / "link.txt")
    steps = [
        {"tool_calls": [
            {"name": "write_file", "arguments": {"path": "../outside.txt", "content": "escaped"}},
            {"name": "read_file", "arguments": {"path": "link.txt"}},
            {"name": "read_file", "arguments": {"path": str(secret)}},
            {"name": "write_file", "arguments": {"path": "inside.txt", "content": "fine"}},
        ]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps)
    res = cli.run_json(workspace, "try to escape", agent, expect=0).json()
    assert not outside.exists()
    assert (workspace / "inside.txt").read_text() == "fine"
    log = cli.log(res["session"])
    tools = [m["content"] for m in log if m["role"] == "tool"]
    assert "escapes the workspace" in tools[0] and "../outside.txt" in tools[0]
    assert "escapes the workspace" in tools[1] and "outside data" not in tools[1]
    assert "escapes the workspace" in tools[2] and "outside data" not in tools[2]
    assert tools[3].startswith("wrote 4 bytes")
    show = cli.run_show(res["session"], res["run"])
    assert [j["outcome"]["isError"] for j in show["journal"]] == [True, True, True, False]
    assert [j["state"] for j in show["journal"]] == ["Settled"] * 4


# ------------------------------------------------------------------ redaction


def test_the_key_value_is_never_persisted_nor_given_to_the_shell(cli: Cli, state_dir: Path, workspace: Path, tmp_path: Path) -> None:
    value = f"sk-kxen-{uuid.uuid4().hex}"
    steps = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": 'echo "value=[$FAKE_KEY_ENV]"; env'}}]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps, api_key_env="FAKE_KEY_ENV")
    env = {"FAKE_KEY_ENV": value, "KXEN_TEST_MARKER_ENV": "visible"}
    res = cli.run_json(workspace, f"the key is {value}; keep it safe", agent, env=env, expect=0).json()
    assert value not in str(res)

    log = cli.log(res["session"])
    [shell_out] = [m["content"] for m in log if m["role"] == "tool"]
    assert "value=[]" in shell_out, shell_out
    assert "KXEN_TEST_MARKER_ENV=visible" in shell_out, "env ran and printed the environment"
    assert "FAKE_KEY_ENV" not in shell_out, "the key's variable is removed from the shell's environment"
    assert log[0]["content"] == "the key is [REDACTED]; keep it safe"
    assert cli.run_show(res["session"], res["run"])["task"] == "the key is [REDACTED]; keep it safe"

    files = list(object_bytes(state_dir))
    assert any(p.parent.parent.name == "steps" and step_log_frames(p.read_bytes()) for p, _ in files), \
        "the run's objects are read out of its step log"
    leaks = [str(p) for p, data in files if value.encode() in data]
    assert leaks == []
    assert any(b"[REDACTED]" in data for _, data in files)
    cli.fsck_clean()


# ------------------------------------------------------------------ cancellation


def test_ctrl_c_cancels_a_running_command_and_the_rest_of_the_turn(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    started, effects = tmp_path / "started", tmp_path / "effects.log"
    steps = [
        {"tool_calls": [
            {"name": "shell", "arguments": {"command": f"touch '{started}'; sleep 30; echo late >> '{effects}'"}},
            {"name": "shell", "arguments": {"command": f"echo second >> '{effects}'"}},
        ]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps, policy={"cancel_window_s": 5})
    proc = cli.spawn("run", "--workspace", str(workspace), "--task", "long", "--agent", str(agent), "--json")
    wait_for_file(started, proc)

    # One active run per session: while it runs, another process may neither run nor resolve it.
    [s] = cli.sessions()
    [r] = s["runs"]
    busy = cli.resume(s["id"], expect=75)
    assert "busy" in busy.err and str(proc.pid) in busy.err, str(busy)
    busy = cli("run", "resolve", s["id"], r["id"], "op_00000000000000000000", "--output", "x", expect=75)
    assert proc.poll() is None

    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 130, f"{out}\n{err}"
    res = json.loads(out)
    assert (res["session"], res["run"]) == (s["id"], r["id"])
    assert (res["status"], res["settled"], res["unknownOps"]) == ("canceled", True, [])
    assert not effects.exists(), "neither the rest of the command nor the second call ran"

    show = cli.run_show(res["session"], res["run"])
    [op] = show["journal"]
    assert (op["state"], op["outcome"]["isError"]) == ("Settled", True)
    log = cli.log(res["session"])
    tools = [m["content"] for m in log if m["role"] == "tool"]
    assert len(tools) == 2 and "[canceled:" in tools[0] and tools[1].startswith("[not run:")
    p = cli.resume(res["session"], expect=2)
    assert "nothing to resume" in p.err


def test_command_outliving_the_cancel_window_is_unknown(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    """A command that ignores SIGTERM is killed after the window: its outcome is UNKNOWN, not 'canceled'."""
    started = tmp_path / "started"
    steps = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"trap '' TERM; touch '{started}'; sleep 30"}}]},
        {"content": FINAL},
    ]
    agent = write_agent(tmp_path / "agent", steps, policy={"cancel_window_s": 0.3})
    proc = cli.spawn("run", "--workspace", str(workspace), "--task", "stubborn", "--agent", str(agent), "--json")
    wait_for_file(started, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 3, f"{out}\n{err}"
    res = json.loads(out)
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1
    [op] = cli.run_show(res["session"], res["run"])["journal"]
    assert (op["state"], op["source"], op["op"]) == ("OutcomeUnknown", "cancel", res["unknownOps"][0])
    assert "SIGKILL" in op["note"]

    cli("run", "resolve", res["session"], res["run"], op["op"], "--output", "verified: nothing changed",
        "--is-error", expect=0)
    done = cli.resume(res["session"], expect=0).json()
    assert done["status"] == "completed"
    tools = [m["content"] for m in cli.log(res["session"]) if m["role"] == "tool"]
    assert tools == ["verified: nothing changed"]
