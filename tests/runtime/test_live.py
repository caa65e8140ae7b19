"""Live output: the model's text on a terminal as it arrives (a real pty), nothing streamed off one,
``--quiet``, ``--events`` JSON Lines, and the ``provider:mid-stream`` fault point.

The proof that text streams is ordering, not timing: the fake server holds
the rest of its answer until the test has read the first words on the
terminal, so they can only have come through while the answer was in flight.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import Cli, write_agent

from .fake_openai import FakeOpenAI, Reply

TOOL = json.dumps({"command": "echo checked"})


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def openai_agent(tmp_path: Path, server: FakeOpenAI) -> Path:
    return write_agent(tmp_path / "agent", None, provider="openai", model="gpt-test", base_url=server.base_url)


class PtyRun:
    """``kxen-agent ARGS`` with stderr on a pseudo-terminal (stdout a pipe, as with `> out.json`)."""

    def __init__(self, cli: Cli, *args: str) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.proc = cli.spawn(*args, stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        self.seen = b""

    def read_until(self, cond, what: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while not cond(self.text):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; the terminal showed {self.text!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.1))
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the process closed the terminal's last writer
                    chunk = b""
                if not chunk:
                    assert cond(self.text), f"the terminal closed before {what}; it showed {self.text!r}"
                    break
                self.seen += chunk
        return self.text

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self.read_until(lambda _: False if self._more() else True, "the end of output")
        os.close(self.master)
        return self.proc.returncode, out, self.text

    def _more(self) -> bool:
        ready, _, _ = select.select([self.master], [], [], 0.2)
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 4096)
        except OSError:
            return False
        self.seen += chunk
        return bool(chunk)

    @property
    def text(self) -> str:
        # The terminal turns "\n" into "\r\n".
        return self.seen.decode("utf-8", "replace").replace("\r\n", "\n")


def test_on_a_terminal_the_answer_streams_and_tool_calls_show_as_they_happen(cli: Cli, server: FakeOpenAI,
                                                                             workspace: Path, tmp_path: Path) -> None:
    server.reply_tool_calls([("call_1", "shell", TOOL)], content="Let me check the files.", hold_after=3)
    server.reply_content("All done \x1b[2J here.\n")
    run = PtyRun(cli, "run", "--workspace", str(workspace), "--task", "check", "--agent",
                 str(openai_agent(tmp_path, server)), "--json")
    run.read_until(lambda s: "Let me " in s, "the first words of the answer")
    # The server has not sent the rest yet: what the terminal shows arrived while the answer was in flight.
    assert "check the files" not in run.text and run.proc.poll() is None
    server.gate.set()
    rc, out, shown = run.finish()
    assert rc == 0, shown
    assert "Let me check the files." in shown
    assert '  -> shell {"command": "echo checked"}' in shown
    assert "  <- ok: checked (2 lines)" in shown
    assert "All done \\x1b[2J here." in shown and "\x1b[2J" not in shown, "the model's escape codes are shown escaped"
    assert shown.index("Let me check") < shown.index("  -> shell") < shown.index("  <- ok") < shown.index("All done")
    res = json.loads(out)  # --json: stdout stays one result document
    assert (res["status"], res["result"]) == ("completed", "All done \x1b[2J here.\n")
    assert all(r.streamed for r in server.requests)


def test_off_a_terminal_nothing_streams_and_quiet_silences_the_terminal(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                                        tmp_path: Path) -> None:
    agent = str(openai_agent(tmp_path, server))
    server.reply_tool_calls([("call_1", "shell", TOOL)], content="Let me check the files.")
    server.reply_content("All done.")
    p = cli("run", "--workspace", str(workspace), "--task", "check", "--agent", agent, expect=0)
    assert "Let me check" not in p.err and "All done" not in p.err, p.err
    assert "kxen-agent: turn 1: shell" in p.err and 'shell {"command": "echo checked"}' in p.err
    assert "result: All done." in p.out
    assert not any(r.streamed for r in server.requests), "off a terminal the answer is not even streamed"

    server.clear()
    server.reply_content("quietly done.")
    run = PtyRun(cli, "run", "--workspace", str(workspace), "--task", "again", "--agent", agent, "--quiet")
    rc, out, shown = run.finish()
    assert rc == 0 and shown == "", shown
    assert "result: quietly done." in out
    assert not server.requests[-1].streamed


def test_events_are_json_lines_ending_with_the_result_document(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                               tmp_path: Path) -> None:
    agent = str(openai_agent(tmp_path, server))
    server.reply_tool_calls([("call_1", "shell", TOOL)], content="Checking now.",
                            usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    server.reply_content("Checked: all fine.")
    p = cli("run", "--workspace", str(workspace), "--task", "check", "--agent", agent, "--events", expect=0)
    events = p.jsonl()
    kinds = [e["event"] for e in events]
    assert kinds[0] == "note" and kinds[-1] == "run_finished"
    assert [k for k in kinds if k != "text_delta" and k != "note"] == [
        "run_started", "turn_started", "turn_finished", "tool_started", "tool_finished", "turn_started",
        "turn_finished", "run_finished"]
    by = {k: [e for e in events if e["event"] == k] for k in set(kinds)}
    ses, run = by["run_started"][0]["session"], by["run_started"][0]["run"]
    assert all(e["session"] == ses and e["run"] == run for e in events if e["event"] not in ("note", "run_finished"))
    assert "".join(e["text"] for e in by["text_delta"] if e["turn"] == 1) == "Checking now."
    assert "".join(e["text"] for e in by["text_delta"] if e["turn"] == 2) == "Checked: all fine."
    assert by["turn_finished"][0] == {"event": "turn_finished", "session": ses, "run": run, "turn": 1,
                                      "finishReason": "tool_calls", "tools": ["shell"],
                                      "usage": {"inputTokens": 10, "outputTokens": 5}}
    started, finished = by["tool_started"][0], by["tool_finished"][0]
    assert (started["tool"], started["callId"], started["arguments"]) == ("shell", "call_1", TOOL)
    assert (finished["op"], finished["state"], finished["isError"], finished["summary"]) == (
        started["op"], "OutcomeKnown", False, "checked")
    final = by["run_finished"][0]
    res = cli.run_show(ses, run)
    assert final["result"]["status"] == "completed" and final["result"]["result"] == res["result"]
    assert set(final["result"]) == {"session", "run", "status", "turn", "model", "result", "error", "unknownOps",
                                    "settled", "requestedModel", "baseUrl", "retryOf", "usage"}
    assert p.err == "", "--events keeps stderr for errors"
    assert all(r.streamed for r in server.requests)

    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", agent, "--events", "--json", expect=2)
    assert "--events and --json" in p.err and p.out == ""
    p = cli("--resume", ses, "--retry", "--events", expect=2)
    assert [e["event"] for e in p.jsonl()] == ["error"] and "nothing to retry" in p.jsonl()[0]["message"]


def test_a_stream_cut_mid_answer_is_retried_and_recorded_once(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                              tmp_path: Path) -> None:
    server.reply(Reply(content="a first try that breaks off", drop_after=4, headers={}))
    server.reply(Reply(content="the whole answer"))
    # The retry waits the policy's backoff (0.5 to 1 s) after the cut.
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(openai_agent(tmp_path, server)),
            "--events", expect=0)
    events = p.jsonl()
    kinds = [e["event"] for e in events]
    retry = kinds.index("provider_retry")
    assert "text_delta" in kinds[:retry], "text had arrived before the cut"
    assert "middle of the streamed answer" in events[retry]["error"] and events[retry]["attempt"] == 1
    assert events[-1]["result"]["result"] == "the whole answer"
    log = cli.log(events[-1]["session"])
    assert [(m["role"], m["content"]) for m in log] == [("user", "t"), ("assistant", "the whole answer")]
    assert len(server.requests) == 2


@pytest.mark.parametrize("provider", ["script", "openai"])
def test_a_kill_mid_stream_loses_nothing_durable(cli: Cli, server: FakeOpenAI, workspace: Path, tmp_path: Path,
                                                 provider: str) -> None:
    if provider == "script":
        agent = write_agent(tmp_path / "agent", [{"content": "streamed in several words"}])
    else:
        agent = openai_agent(tmp_path, server)
        server.reply_content("streamed in several words")
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), "--events",
            env={"KXEN_AGENT_FAULT": "provider:mid-stream"})
    assert p.killed, str(p)
    events = p.jsonl()
    assert [e["event"] for e in events][-1] == "text_delta", "killed right after the first piece was shown"
    ses = events[-1]["session"]
    assert [m["role"] for m in cli.log(ses)] == ["user"], "nothing of a half-streamed answer is durable"
    res = cli.resume(ses, expect=0).json()
    assert res["result"] == "streamed in several words"
    assert [(m["role"], m["content"]) for m in cli.log(ses)] == [("user", "t"),
                                                                 ("assistant", "streamed in several words")]
    cli.fsck_clean()
