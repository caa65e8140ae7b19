"""Cooperative cancellation with real signals: SIGINT/SIGTERM to the CLI.

A tool that stops within the cancellation window has a known outcome and the
run ends ``canceled`` (130); one that must be killed is UNKNOWN and the run
waits in ``input_required`` (3); a second signal never skips the journaling;
with nothing in flight the run ends ``canceled`` and a new task continues it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from .fake_openai import FakeOpenAI
from .test_lease import Bench, bench_factory, long_tool, tool_pid, wait_for  # noqa: F401 (fixture)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def session_and_run(b: Bench) -> tuple[str, str]:
    r = b.cli("session", "list", "--json")
    assert r.returncode == 0, r.stderr
    [s] = json.loads(r.stdout)["sessions"]
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
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["result"] == "done"
    assert b.cli("fsck").returncode == 0


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
    assert b.cli("fsck").returncode == 0


def test_second_signal_during_the_window_does_not_skip_the_journaling(bench_factory, tmp_path):
    window = 2.0
    b = bench_factory([_ignoring_tool(tmp_path), {"content": "done"}], cancel_window_s=window)
    a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(b.agent))
    pid = tool_pid(tmp_path)
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGINT)
    wait_for(lambda: "canceling the run cooperatively" in a.stderr, "the first cancellation note")
    os.kill(a.pid, signal.SIGINT)
    os.kill(a.pid, signal.SIGTERM)
    wait_for(lambda: "still canceling" in a.stderr, "the second-signal note")
    assert a.p.poll() is None, "a second signal must not end the process before the journal is written"
    assert a.wait(timeout=20) == 3, a.stderr
    assert time.monotonic() - t0 >= window * 0.9, "the cancellation window was cut short"
    assert gone(pid)
    ses, run = session_and_run(b)
    shown = b.show_run(ses, run)
    assert shown["status"] == "input_required"
    assert [j["state"] for j in shown["journal"]] == ["OutcomeUnknown"]
    assert b.cli("fsck").returncode == 0


class GatedOpenAI(FakeOpenAI):
    """Holds every answer until ``gate`` is set: a model call in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def _current(self):
        self.gate.wait(30)
        return super()._current()


@pytest.mark.parametrize("answer", ["tool_call", "final"])
def test_cancel_with_no_tool_in_flight_ends_canceled_and_a_new_task_continues(bench_factory, tmp_path, answer):
    b = bench_factory([{"content": "unused"}])
    with GatedOpenAI() as server:
        agent = tmp_path / "openai.toml"
        agent.write_text(
            'name = "o"\nprovider = "openai"\nmodel = "fake-model"\n'
            f'base_url = "{server.base_url}"\ntools = ["shell"]\n[policy]\ncancel_window_s = 0.5\n'
        )
        if answer == "tool_call":
            server.reply_tool_calls([("call_1", "shell", json.dumps({"command": f"touch {tmp_path}/effect"}))])
        else:  # an answer that arrives after the cancel does not complete the run
            server.reply_content("late answer")
        server.gate.clear()
        a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(agent))
        wait_for(lambda: server.requests, "the model call to arrive")
        os.kill(a.pid, signal.SIGINT)
        wait_for(lambda: "canceling the run cooperatively" in a.stderr, "the cancellation note")
        server.gate.set()  # the model answers only after the cancel
        assert a.wait(timeout=20) == 130, a.stderr
        assert not (tmp_path / "effect").exists(), "a tool call must not start after a cancel"
        ses, run = session_and_run(b)
        shown = b.show_run(ses, run)
        assert shown["status"] == "canceled" and shown["settled"] and shown["journal"] == []

        server.reply_content("continued")
        r = b.cli("--resume", ses, "--task", "next", "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert (res["status"], res["result"]) == ("completed", "continued")
    assert b.cli("fsck").returncode == 0



# --- the CLI's notes, in-process ---------------------------------------------

FIRST_NOTE = ("kxen-agent: SIGINT: canceling the run cooperatively; a running tool gets its cancellation "
              "window to stop, then its outcome is journaled...\n")
SECOND_NOTE = ("kxen-agent: SIGTERM again: still canceling \u2014 the journal is being written and will not be "
               "skipped; the process ends on its own within the tool's cancellation window\n")


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_cli_notes_the_first_and_second_signal_then_nothing_and_nothing_with_json(capsys, json_out):
    from kxen_agent.cli.run_cmds import cancellation

    err = ""
    before = signal.getsignal(signal.SIGINT)

    def stderr_has(n: int) -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return err.count("kxen-agent: ") >= n

    with cancellation(json_out) as cancel:
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
    assert err == ("" if json_out else FIRST_NOTE + SECOND_NOTE)
    assert signal.getsignal(signal.SIGINT) is before, "the CLI's previous SIGINT handler was not restored"
