"""The interactive session (`kxen-agent chat`, `kxen-agent` alone at a terminal), driven in a real pty.

Each test drives one session through several steps, as a person would:
what it waits for is what the terminal shows (or what the fake model
server received), never a delay. Also here: the provider, its SDK and its
key are checked before a session or a run is written (exit 2, the state
dir unchanged).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time
from pathlib import Path

import pexpect

from tests.helpers import KXEN_AGENT, Cli, write_agent
from tests.runtime.fake_openai import FakeOpenAI, Reply

#: The prompt: the session's short id (or "new session") and ">".
PROMPT = r"(new session|ses_[0-9a-f]{8})>"
#: A GitHub token format (§14.11 rule 6): redacted from the prompt history as from the session.
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"

STEPS = [
    {"content": "Let me look.", "tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"content": "There is one file: README.md."},
    {"content": "Second answer, no tool."},
    {"content": "Noting it.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo checked > NOTES.md"}}]},
    {"content": "Wrote NOTES.md."},
]


def spawn(cli: Cli, cwd: Path, *args: str, env: dict | None = None, stderr: Path | None = None) -> pexpect.spawn:
    """``kxen-agent ARGS`` on a pseudo-terminal (with ``stderr``: standard error redirected to that file)."""
    # No cursor position requests: pexpect's terminal answers none (a real one does).
    e = dict(cli.env, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", PAGER="cat", **(env or {}))
    if stderr is None:
        return pexpect.spawn(KXEN_AGENT, list(args), cwd=str(cwd), env=e, encoding="utf-8", timeout=30,
                             dimensions=(50, 200))
    return pexpect.spawn("/bin/sh", ["-c", 'exec "$@" 2>"$LOG"', "sh", KXEN_AGENT, *args], cwd=str(cwd),
                         env=dict(e, LOG=str(stderr)), encoding="utf-8", timeout=30, dimensions=(50, 200))


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling a condition another process makes true, not waiting out a race


def command(child: pexpect.spawn, line: str, *shown: str) -> None:
    """Type ``line`` and Enter; expect each of ``shown`` in order, then the prompt back."""
    child.send(line + "\r")
    for text in shown:
        child.expect(text)
    child.expect(PROMPT)


def test_two_turns_a_tool_multi_line_history_and_every_slash_command(cli: Cli, workspace: Path,
                                                                     tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", STEPS, policy={"approve": ["shell"]})
    # Standard error redirected (`2>log`): what the person must see still reaches the terminal.
    log = tmp_path / "stderr.log"
    child = spawn(cli, workspace, "chat", "--agent", str(agent), stderr=log)
    child.expect("a new session in")
    child.expect(PROMPT)
    # Alt-Enter (Esc, Enter) adds a line; Enter sends.
    child.send(f"what files are there?\x1b\ruse {TOKEN} if you must\r")
    child.expect(r"-> list_files")
    child.expect(r"<- ok: README.md")
    child.expect(r"There is one file: README\.md\.")
    child.expect(PROMPT)
    command(child, "and now?", "Second answer, no tool.")

    child.send("/help\r")
    child.expect("Esc or Ctrl-C cancels a run; Ctrl-D leaves")
    shown = child.before
    assert all(f"  {c}" in shown for c in ("/sessions", "/resume [SES]", "/fork [MSG]", "/compact", "/model [NAME]",
                                           "/show [RUN]", "/diff [--run RUN|--op OP|--at MSG] [--stat]", "/help",
                                           "/quit")), shown
    assert "  /rewind MSG [--code|--conversation] [--force] | --undo" in shown
    child.expect(PROMPT)
    command(child, "/nope", r"no command /nope; /help lists them")
    command(child, "/show\x1b\rmore", "a slash command is one line")
    child.send("/show\r")
    child.expect(r"(run_[0-9a-f]+)  #0 completed")
    run0 = child.match.group(1)
    child.expect(r"#1 completed\s+turns 1\s+task: and now\?")
    child.expect(PROMPT)
    command(child, f"/show {run0[:10]}", f"run {run0} ", r"journal \(1 operation", r"list_files")
    command(child, "/model gpt-x", "model gpt-x from the next run on")
    command(child, "/compact", "uses the script provider, which cannot summarize")
    command(child, "/resume", "nothing to resume")
    child.send("/fork\r")
    child.expect(r"now in the fork (ses_[0-9a-f]+); /resume (ses_[0-9a-f]+) goes back")
    fork, first = child.match.group(1), child.match.group(2)
    child.expect(PROMPT)
    child.send("/sessions\r")
    child.expect(r"\*\s+1\s+" + fork + r"\s+no runs")
    child.expect(r"2\s+" + first + r"\s+completed.*and now\?")
    child.expect("open which")
    child.send("2\r")
    child.expect(f"session {first}")
    child.expect(PROMPT)
    # A third run, on the model /model chose; its call waits for a yes: the question reads the terminal.
    child.send("leave a note\r")
    child.expect(r"allow shell\?")
    child.send("y\r")
    child.expect(r"-> shell")
    child.expect("Wrote NOTES.md.")
    child.expect(PROMPT)
    assert (workspace / "NOTES.md").read_text() == "checked\n"
    command(child, "/diff --stat", r"NOTES\.md +\| +1 \+")
    command(child, "/diff --bogus", r"/diff takes")
    command(child, "/show", r"#2 completed")
    child.send("/quit\r")
    child.expect(f"session {first}: `kxen-agent chat -c` continues it here")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert log.read_text() == ""

    runs = cli.session_show(first)["runs"]
    assert [r["status"] for r in runs] == ["completed"] * 3
    assert runs[0]["task"] == "what files are there?\nuse [REDACTED] if you must"
    third = cli.run_show(first, runs[2]["id"])
    assert third["requestedModel"] == "gpt-x"
    assert [(j["tool"], j["approval"]) for j in third["journal"]] == [("shell", {"answer": "yes", "by": "user"})]
    assert cli.session_show(fork)["parentId"] == first

    # The prompt history: one 0600 file for this workspace, redacted, oldest first.
    (hist,) = (cli.state_dir / "prompts").iterdir()
    assert stat.S_IMODE(hist.stat().st_mode) == 0o600
    entries = [json.loads(line) for line in hist.read_text().splitlines()]
    assert entries[:3] == ["what files are there?\nuse [REDACTED] if you must", "and now?", "/help"]
    assert TOKEN not in hist.read_text()
    cli.fsck_clean()
    assert cli("fsck", "--json").json()["strayFiles"] == []

    # The history comes back in the next session here: Up recalls the last entry.
    child = spawn(cli, workspace, "chat", "-c")
    child.expect(f"session {first}")
    child.expect(PROMPT)
    child.send("\x1b[A")  # Up
    child.expect("/quit")
    child.send("\r")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_esc_cancels_a_slow_model_call_and_a_kill_leaves_a_session_chat_c_resumes(cli: Cli, workspace: Path,
                                                                                  tmp_path: Path) -> None:
    with FakeOpenAI() as server:
        agent = write_agent(tmp_path / "agent", None, provider="openai", model="gpt-test", base_url=server.base_url)
        server.reply(Reply(content="too slow", delay_s=60))
        child = spawn(cli, workspace, "chat", "--agent", str(agent))
        child.expect(PROMPT)
        child.send("first\r")
        wait_for(lambda: len(server.chat_requests()) == 1, "the model call")
        child.send("\x1b")  # Esc
        child.expect("Esc: canceling the run: the model call to .* is aborted now")
        child.expect(r"run run_\w+: canceled after 0 turn\(s\) — the next message starts a new run")
        child.expect(PROMPT)
        wait_for(lambda: server.abandoned, "the server to see the call abandoned")

        server.clear()
        server.reply_content("fast answer")
        command(child, "second", "fast answer")
        # Ctrl-C during a run is Esc's twin.
        server.clear()
        server.reply(Reply(content="too slow", delay_s=60))
        child.send("third\r")
        wait_for(lambda: len(server.chat_requests()) == 3, "the third model call")
        child.sendintr()
        child.expect("SIGINT: canceling the run")
        child.expect("canceled after 0 turn")
        child.expect(PROMPT)

        # kill -9 in the middle of a model call: the run is left running, its process gone.
        child.send("fourth\r")
        wait_for(lambda: len(server.chat_requests()) == 4, "the fourth model call")
        os.kill(child.pid, signal.SIGKILL)
        child.expect(pexpect.EOF)
        child.close()
        assert child.signalstatus == signal.SIGKILL

        server.clear()
        server.reply_content("resumed answer")
        child = spawn(cli, workspace, "chat", "-c")
        child.expect(r"run (run_\w+) is interrupted: /resume continues it")
        killed = child.match.group(1)
        child.expect(PROMPT)
        command(child, "fifth", f"run {killed} is interrupted: /resume continues it")
        command(child, "/resume", "resumed answer")
        server.clear()
        server.reply_content("a summary of it all")
        command(child, "/compact", r"message\(s\) through msg_\w+ summarized in msg_\w+")
        child.sendeof()  # Ctrl-D leaves
        child.expect("`kxen-agent chat -c` continues it here")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0

    (ses,) = [s["id"] for s in cli.sessions()]
    runs = cli.session_show(ses)["runs"]
    assert [r["status"] for r in runs] == ["canceled", "completed", "canceled", "completed"]
    assert runs[3]["id"] == killed and runs[3]["task"] == "fourth"
    cli.fsck_clean()


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_provider_sdk_and_key_are_checked_before_anything_is_written(cli: Cli, workspace: Path,
                                                                    tmp_path: Path) -> None:
    with FakeOpenAI() as server:
        agent = write_agent(tmp_path / "agent", None, provider="openai", model="gpt-test", base_url=server.base_url,
                            api_key_env="KXEN_TEST_CHAT_KEY")
        p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), expect=2)
        assert p.err.strip().splitlines() == [p.err.strip()] and "KXEN_TEST_CHAT_KEY is not set or empty" in p.err
        assert not cli.state_dir.exists() and server.requests == []

        keyed = {"KXEN_TEST_CHAT_KEY": "sk-test-key-1234"}
        ses = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), "--json", env=keyed,
                  expect=0).json()["session"]
        before = _tree(cli.state_dir)
        for args in (["--resume", ses, "--task", "more"], ["--resume", ses, "--retry"]):
            p = cli(*args, expect=2)
            assert "KXEN_TEST_CHAT_KEY is not set or empty" in p.err and len(p.err.strip().splitlines()) == 1
        assert _tree(cli.state_dir) == before, "nothing written"
        assert len(server.chat_requests()) == 1

    # Off a terminal: `chat` refuses in one line, `kxen-agent` alone prints the help as before.
    p = cli("chat", expect=2)
    assert "needs a terminal" in p.err and len(p.err.strip().splitlines()) == 1
    assert "Daily commands" in cli(expect=0).out
    # At a terminal with nothing to run: the agent is named before the prompt, nothing is written.
    child = spawn(cli, workspace, env={"KXEN_AGENT_AGENT": str(tmp_path / "none.toml")})
    child.expect("names no file")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert _tree(cli.state_dir) == before
    # With a default agent: `kxen-agent` alone opens the prompt; leaving at once writes nothing.
    script = write_agent(tmp_path / "script", [{"content": "x"}])
    child = spawn(cli, workspace, env={"KXEN_AGENT_AGENT": str(script)})
    child.expect("a new session in")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and _tree(cli.state_dir) == before
    assert re.search(r"chat +Talk with the agent at the terminal", cli("--help", expect=0).out)


def test_the_interactive_bench_runs(tmp_path: Path) -> None:
    from bench.interactive import measure

    rows = measure(1, 1, tmp_path)
    assert len(rows) == 3 and all(r["cpuMs"] > 0 and r["wallMs"] > 0 for r in rows.values()), rows
