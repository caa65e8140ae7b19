"""Cooperative cancellation with real signals: SIGINT/SIGTERM to the CLI.

A tool that stops within the cancellation window has a known outcome and the
run ends ``canceled`` (130); one that must be killed is UNKNOWN and the run
waits in ``input_required`` (3); a second signal never skips the journaling.
A model call in flight is aborted within a second (the server sees its
connection close) and the run ends ``canceled``, as does a wait to retry
one; ``--retry`` then re-attempts the task. The notes say what is waited for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from kxen_agent.runtime.events import Activity

from .fake_openai import FakeOpenAI, Reply
from .test_lease import Bench, bench_factory, long_tool, tool_pid, wait_for  # noqa: F401 (fixture)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def session_and_run(b: Bench) -> tuple[str, str]:
    r = b.cli("session", "list", "--json")
    assert r.rc == 0, r.err
    [s] = json.loads(r.out)["sessions"]
    return s["id"], s["runs"][-1]["id"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_cooperative_tool_ends_canceled_with_outcome_journaled(bench_factory, tmp_path, sig):
    b = bench_factory([long_tool(tmp_path, 30), {"content": "done"}], cancel_window_s=2)
    a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(b.agent), "--json")
    pid = tool_pid(tmp_path)
    t0 = time.monotonic()
    os.kill(a.pid, sig)
    assert a.wait(timeout=15) == 130, a.stderr
    assert time.monotonic() - t0 < 5, "cancellation must return promptly"
    assert gone(pid)
    res = json.loads(a.stdout)
    assert res["status"] == "canceled" and res["settled"] and not res["unknownOps"]

    [op] = b.show_run(res["session"], res["run"])["journal"]
    assert op["state"] == "Settled"
    assert "[canceled: the command was stopped with SIGTERM" in op["outcome"]["output"]
    assert op["outcome"]["isError"] is True

    # The state is durable and the session goes on with a new task.
    r = b.cli("--resume", res["session"], "--task", "next", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["result"] == "done"
    assert b.cli("fsck").rc == 0


def _ignoring_tool(tmp: Path) -> dict:
    return {"tool_calls": [{"name": "shell", "arguments": {
        "command": f"trap '' INT TERM; echo $$ > {tmp}/tool.pid; exec sleep 30"}}]}


def test_sigint_during_tool_ignoring_signals_is_unknown_and_input_required(bench_factory, tmp_path):
    b = bench_factory([_ignoring_tool(tmp_path), {"content": "done"}], cancel_window_s=0.5)
    a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(b.agent), "--json")
    pid = tool_pid(tmp_path)
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGINT)
    assert a.wait(timeout=20) == 3, a.stderr
    assert time.monotonic() - t0 < 8
    assert gone(pid), "the tool that ignored SIGTERM must have been killed"
    res = json.loads(a.stdout)
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1
    [op] = b.show_run(res["session"], res["run"])["journal"]
    assert (op["op"], op["state"], op["source"]) == (res["unknownOps"][0], "OutcomeUnknown", "cancel")
    assert op["outcome"] is None and "did not exit within 0.5s" in op["note"]
    assert b.cli("fsck").rc == 0


def test_second_signal_during_the_window_does_not_skip_the_journaling(bench_factory, tmp_path):
    # Long enough that the second signal lands inside the window on a loaded machine.
    window = 4.0
    b = bench_factory([_ignoring_tool(tmp_path), {"content": "done"}], cancel_window_s=window)
    a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(b.agent))
    pid = tool_pid(tmp_path)
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGINT)
    # The note says what is waited for: this tool, in its window.
    first = wait_for(lambda: re.search(r"SIGINT: canceling the run: tool shell \((op_[0-9a-f]+)\) was asked to stop "
                                       r"and gets up to 4s \(its cancellation window\); then its outcome is journaled",
                                       a.stderr), "the first cancellation note")
    os.kill(a.pid, signal.SIGINT)
    os.kill(a.pid, signal.SIGTERM)
    # Which of the two is handled first is the kernel's choice (both pending: the later frame runs first).
    second = wait_for(lambda: re.search(r"SIG(?:INT|TERM) again: still canceling \u2014 waiting for tool shell "
                                        r"\((op_[0-9a-f]+)\) to stop: at most ([0-9.]+)s left of its 4s "
                                        r"cancellation window", a.stderr), "the second-signal note")
    assert second.group(1) == first.group(1)
    assert 0 < float(second.group(2)) <= window
    assert a.p.poll() is None, "a second signal must not end the process before the journal is written"
    assert a.wait(timeout=20) == 3, a.stderr
    assert time.monotonic() - t0 >= window * 0.9, "the cancellation window was cut short"
    assert a.stderr.count("still canceling") == 1, "a third signal changes nothing, not even a note"
    assert gone(pid)
    ses, run = session_and_run(b)
    shown = b.show_run(ses, run)
    assert shown["status"] == "input_required"
    assert [j["state"] for j in shown["journal"]] == ["OutcomeUnknown"]
    assert shown["journal"][0]["op"] == first.group(1)
    assert b.cli("fsck").rc == 0


def _openai_agent(tmp_path: Path, server: FakeOpenAI) -> Path:
    agent = tmp_path / "openai.toml"
    agent.write_text('name = "o"\nprovider = "openai"\nmodel = "fake-model"\n'
                     f'base_url = "{server.base_url}"\ntools = ["shell"]\n[policy]\ncancel_window_s = 0.5\n')
    return agent


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "events"])
def test_ctrl_c_during_a_slow_model_call_aborts_it_within_a_second(bench_factory, tmp_path, streamed):
    """The model takes 30 s to answer; SIGINT closes the connection at once and the run is canceled (130)."""
    b = bench_factory([{"content": "unused"}])
    with FakeOpenAI() as server:
        agent = _openai_agent(tmp_path, server)
        server.reply(Reply(content="too late", delay_s=30))
        a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(agent),
                    *(["--events"] if streamed else []))
        wait_for(lambda: server.requests, "the model call to arrive")
        t0 = time.monotonic()
        os.kill(a.pid, signal.SIGINT)
        assert a.wait(timeout=20) == 130, a.stderr
        ended = time.monotonic() - t0
        wait_for(lambda: server.abandoned, "the server to see the connection close", timeout=5)
        assert server.abandoned[0] - t0 < 1.0, "the request must be aborted (its connection closed) within 1 s"
        assert ended < 5, f"the process took {ended:.1f}s to end after the model call was aborted"
        if streamed:
            [note] = [e for e in map(json.loads, a.stdout.splitlines()) if e["event"] == "note"
                      and e["text"].startswith("SIGINT")]
            text = note["text"]
        else:
            text = a.stderr
        assert (f"SIGINT: canceling the run: the model call to {server.base_url} is aborted now; no tool is running, "
                "nothing else is waited for") in text
        ses, run = session_and_run(b)
        shown = b.show_run(ses, run)
        assert (shown["status"], shown["settled"], shown["journal"]) == ("canceled", True, [])
        assert "during the model call" in shown["error"] and "aborted" in shown["error"]
        assert len(server.chat_requests()) == 1, "a canceled call is not retried"

        server.clear()
        server.reply_content("continued")
        r = b.cli("--resume", ses, "--retry", "--json")
        assert r.rc == 0, r.err
        res = json.loads(r.out)
        assert (res["status"], res["result"], res["retryOf"]) == ("completed", "continued", run)
    assert b.cli("fsck").rc == 0


def test_ctrl_c_while_waiting_to_retry_after_a_429_is_canceled_not_failed(bench_factory, tmp_path):
    b = bench_factory([{"content": "unused"}])
    with FakeOpenAI() as server:
        agent = _openai_agent(tmp_path, server)
        server.reply_error(429, "slow down", headers={"Retry-After": "30"})
        a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(agent))
        wait_for(lambda: "retrying in 30.0s" in a.stderr, "the retry note")
        t0 = time.monotonic()
        os.kill(a.pid, signal.SIGINT)
        assert a.wait(timeout=20) == 130, a.stderr
        assert time.monotonic() - t0 < 5
        assert "the wait to retry the model call is abandoned" in a.stderr
        assert len(server.chat_requests()) == 1
        ses, run = session_and_run(b)
        assert b.show_run(ses, run)["status"] == "canceled"


def test_tool_calls_answered_after_the_cancel_are_not_run(bench_factory, tmp_path):
    """The answer (tool calls) is on its way when SIGINT comes: the call is recorded, reported not run, never run."""
    b = bench_factory([{"content": "unused"}])
    with FakeOpenAI() as server:
        agent = _openai_agent(tmp_path, server)
        server.reply_tool_calls([("call_1", "shell", json.dumps({"command": f"touch {tmp_path}/effect"}))],
                                content="about to run it", hold_after=2)
        a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(agent), "--events")
        wait_for(lambda: '"text_delta"' in a.stdout, "the answer to start streaming")
        os.kill(a.pid, signal.SIGINT)
        assert a.wait(timeout=20) == 130, a.stderr
        assert not (tmp_path / "effect").exists(), "a tool call must not start after a cancel"
        ses, run = session_and_run(b)
        shown = b.show_run(ses, run)
        assert shown["status"] == "canceled" and shown["journal"] == []


# --- the CLI's notes, in-process ---------------------------------------------


@pytest.mark.parametrize("activity", [
    (Activity("model", endpoint="http://m/v1"),
     "SIGINT: canceling the run: the model call to http://m/v1 is aborted now; no tool is running, nothing else is "
     "waited for...",
     "SIGTERM again: still canceling \u2014 nothing is running; the run's state is being written and the process ends "
     "in a moment"),
    (Activity("step"),
     "SIGINT: canceling the run: no model call or tool is in flight; the run stops after the durable step in "
     "progress...",
     "SIGTERM again: still canceling \u2014 nothing is running; the run's state is being written and the process ends "
     "in a moment"),
], ids=["model", "step"])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_cli_notes_the_first_and_second_signal_then_nothing_and_nothing_with_json(capsys, monkeypatch, json_out,
                                                                                  activity):
    from kxen_agent.cli._live import make_view
    from kxen_agent.cli.run_cmds import cancellation

    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    doing, first_note, second_note = activity
    err = ""
    before = signal.getsignal(signal.SIGINT)

    def stderr_has(n: int) -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return err.count("kxen-agent: ") >= n

    view = make_view(json_out=json_out, events=False, quiet=False)
    with cancellation(view, lambda: doing) as cancel:
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(cancel.is_set, "the cancel event")
        if not json_out:
            wait_for(lambda: stderr_has(1), "the first note", timeout=5)
        os.kill(os.getpid(), signal.SIGTERM)
        if not json_out:
            wait_for(lambda: stderr_has(2), "the second note", timeout=5)
        os.kill(os.getpid(), signal.SIGINT)
    # Leaving the context closes the wake-up pipe's write end; the watcher
    # handles every byte before it, so nothing more can be printed after this.
    err += capsys.readouterr().err
    assert err == ("" if json_out else f"kxen-agent: {first_note}\nkxen-agent: {second_note}\n")
    assert signal.getsignal(signal.SIGINT) is before, "the CLI's previous SIGINT handler was not restored"
