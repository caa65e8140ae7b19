"""Approvals before side effects (``[policy] approve``, §14.6 ``Decided``): the
installed CLI on a real pseudo-terminal answering yes / no / always, standard
input that is not a terminal (refused unless ``--yes``), crashes before and
after the decision, and ``run show`` saying who approved what."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime.approvals import REFUSED
from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
from tests.helpers import Cli, run_kxen, spawn_kxen, write_agent

PROMPT = b"[y]es / [n]o / [a]lways for this run / [r]efuse with a reason: "


class PtyRun:
    """``kxen-agent ARGS`` with standard input and standard error on a pseudo-terminal; stdout a pipe."""

    def __init__(self, cli: Cli, *args: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        self.proc = spawn_kxen(args, env={**cli.env, **(env or {})}, stdin=slave, stderr=slave,
                               stdout=subprocess.PIPE, text=False, start_new_session=True)
        os.close(slave)
        self.screen = b""

    def wait_for(self, text: bytes, count: int = 1, timeout: float = 30) -> None:
        """Read the terminal until ``text`` has appeared ``count`` times (fail on timeout or exit)."""
        deadline = time.monotonic() + timeout
        while self.screen.count(text) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {text!r}; the terminal shows:\n{self.screen.decode(errors='replace')}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the process closed its side
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}:\n{self.screen.decode(errors='replace')}"
                self.screen += chunk

    def answer(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def finish(self, timeout: float = 60) -> tuple[int, dict]:
        out, _ = self.proc.communicate(timeout=timeout)
        self.drain()
        os.close(self.master)
        return self.proc.returncode, json.loads(out) if out.strip() else {}

    def drain(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                return
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.screen += chunk


def shell_step(command: str, content: str = "working") -> dict:
    return {"content": content, "tool_calls": [{"name": "shell", "arguments": {"command": command}}]}


def approving_agent(tmp_path: Path, steps: list[dict], approve: list[str]) -> Path:
    return write_agent(tmp_path / "agent", steps, policy={"approve": approve})


def run_args(workspace: Path, agent: Path, task: str = "do it") -> list[str]:
    return ["run", "--workspace", str(workspace), "--task", task, "--agent", str(agent), "--json"]


def approvals(cli: Cli, ses: str, run: str) -> list[tuple[str, str, dict | None]]:
    return [(j["tool"], j["state"], j["approval"]) for j in cli.run_show(ses, run)["journal"]]


def test_yes_on_the_terminal_runs_the_call_and_run_show_says_who(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [shell_step("echo made > made.txt"), {"content": "done"}]
    p = PtyRun(cli, *run_args(workspace, approving_agent(tmp_path, steps, ["shell"])))
    p.wait_for(PROMPT)
    assert b"wants to call shell" in p.screen and b'"command": "echo made > made.txt"' in p.screen
    assert not (workspace / "made.txt").exists(), "nothing runs before the answer"
    p.answer("y")
    rc, res = p.finish()
    assert rc == 0 and res["status"] == "completed", p.screen
    assert (workspace / "made.txt").read_text() == "made\n"
    assert approvals(cli, res["session"], res["run"]) == [("shell", "Settled", {"answer": "yes", "by": "user"})]
    text = cli("run", "show", res["session"], res["run"], expect=0).out
    assert "approved by the user" in text
    cli.fsck_clean()


def test_no_refuses_the_call_and_the_run_goes_on(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [shell_step("echo made > made.txt"), {"content": "fine, I did not"}]
    p = PtyRun(cli, *run_args(workspace, approving_agent(tmp_path, steps, ["shell"])))
    p.wait_for(PROMPT)
    p.answer("maybe")  # not an answer: asked again
    p.wait_for(PROMPT, count=2)
    p.answer("n")
    rc, res = p.finish()
    assert rc == 0 and res["result"] == "fine, I did not", p.screen
    assert not (workspace / "made.txt").exists()
    tools = [m for m in cli.log(res["session"]) if m["role"] == "tool"]
    assert [m["content"] for m in tools] == [REFUSED]
    show = cli.run_show(res["session"], res["run"])
    [j] = show["journal"]
    assert (j["state"], j["outcome"], j["approval"]) == ("Settled", {"output": REFUSED, "isError": True},
                                                        {"answer": "no", "by": "user"})
    assert "refused by the user" in cli("run", "show", res["session"], expect=0).out


def test_always_asks_once_for_the_tool_in_this_run(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [shell_step("echo one >> log.txt"), shell_step("echo two >> log.txt"),
             {"content": "wrote", "tool_calls": [{"name": "write_file",
                                                   "arguments": {"path": "w.txt", "content": "w"}}]},
             {"content": "done"}]
    p = PtyRun(cli, *run_args(workspace, approving_agent(tmp_path, steps, ["shell", "write_file"])))
    p.wait_for(PROMPT)
    p.answer("a")
    p.wait_for(b"allow write_file?")  # another tool: asked on its own
    assert p.screen.count(b"allow shell?") == 1
    p.answer("yes")
    rc, res = p.finish()
    assert rc == 0, p.screen
    assert (workspace / "log.txt").read_text() == "one\ntwo\n" and (workspace / "w.txt").read_text() == "w"
    assert [a for _, _, a in approvals(cli, res["session"], res["run"])] == [
        {"answer": "yes", "by": "user-always"}, {"answer": "yes", "by": "user-always"},
        {"answer": "yes", "by": "user"}]


def test_read_only_and_unlisted_tools_never_ask(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [{"content": "look", "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}},
                                                {"name": "write_file", "arguments": {"path": "x", "content": "x"}}]},
             {"content": "done"}]
    res = cli(*run_args(workspace, approving_agent(tmp_path, steps, ["shell"])), expect=0).json()
    assert (workspace / "x").read_text() == "x"
    assert [a for _, _, a in approvals(cli, res["session"], res["run"])] == [None, None]


def test_without_a_terminal_no_terminal_refuse_refuses_unless_yes(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    # [policy] no_terminal = "refuse" keeps the refusal of a call nobody can be asked about: never the user's.
    agent = write_agent(tmp_path / "agent", [shell_step("echo made > made.txt"), {"content": "done"}],
                        policy={"approve": ["shell"], "no_terminal": "refuse"})
    res = cli(*run_args(workspace, agent)).json()  # standard input: not a terminal
    assert res["status"] == "completed" and not (workspace / "made.txt").exists()
    [j] = cli.run_show(res["session"], res["run"])["journal"]
    assert j["approval"] == {"answer": "no", "by": "no-terminal"}
    assert j["outcome"] == {"output": "refused: no terminal to ask", "isError": True}
    assert "no terminal to ask at (give --yes to approve)" in cli("run", "show", res["session"], expect=0).out

    res = cli(*run_args(workspace, agent), "--yes", expect=0).json()
    assert (workspace / "made.txt").read_text() == "made\n"
    assert approvals(cli, res["session"], res["run"]) == [("shell", "Settled", {"answer": "yes", "by": "--yes"})]


def test_piped_task_waits_for_approval_without_yes(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = approving_agent(tmp_path, [shell_step("echo made > made.txt"), {"content": "done"}], ["shell"])
    done = run_kxen(["run", "--workspace", str(workspace), "--agent", str(agent), "--json"],
                    input="a task piped in", env=cli.env, expect=3)
    assert not (workspace / "made.txt").exists()
    res = done.json()
    assert res["status"] == "input_required" and "wait for approval" in res["error"]
    assert [m for m in cli.log(res["session"]) if m["role"] == "tool"] == []


def test_crash_after_the_answer_never_asks_again(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = approving_agent(tmp_path, [shell_step("echo made >> made.txt"), {"content": "done"}], ["shell"])
    p = PtyRun(cli, *run_args(workspace, agent), env={"KXEN_AGENT_FAULT": "approval:after-decided"})
    p.wait_for(PROMPT)
    p.answer("y")
    rc, _ = p.finish()
    assert rc == -signal.SIGKILL, p.screen
    assert not (workspace / "made.txt").exists()
    [s] = cli.sessions()
    # No terminal now: had it asked again, the call would be refused.
    res = cli.resume(s["id"], expect=0).json()
    assert (workspace / "made.txt").read_text() == "made\n"
    assert approvals(cli, s["id"], res["run"]) == [("shell", "Settled", {"answer": "yes", "by": "user"})]


def test_crash_while_asking_asks_again(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = approving_agent(tmp_path, [shell_step("echo made >> made.txt"), {"content": "done"}], ["shell"])
    p = PtyRun(cli, *run_args(workspace, agent))
    p.wait_for(PROMPT)
    os.killpg(p.proc.pid, signal.SIGKILL)  # the process dies before anyone answered
    rc, _ = p.finish()
    assert rc == -signal.SIGKILL
    [s] = cli.sessions()
    q = PtyRun(cli, "--resume", s["id"], "--json")
    q.wait_for(PROMPT)
    q.answer("y")
    rc, res = q.finish()
    assert rc == 0 and (workspace / "made.txt").read_text() == "made\n", q.screen
    assert approvals(cli, s["id"], res["run"]) == [("shell", "Settled", {"answer": "yes", "by": "user"})]


def test_ctrl_c_while_asking_cancels_the_run_and_runs_nothing(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = approving_agent(tmp_path, [shell_step("echo made >> made.txt"), {"content": "done"}], ["shell"])
    p = PtyRun(cli, *run_args(workspace, agent))
    p.wait_for(PROMPT)
    p.proc.send_signal(signal.SIGINT)
    rc, res = p.finish()
    assert rc == 130 and res["status"] == "canceled", p.screen
    assert not (workspace / "made.txt").exists()
    assert cli.run_show(res["session"], res["run"])["journal"] == [], "an unanswered call has no journal entry"


@pytest.mark.parametrize(("approve", "why"), [
    ('["read_file"]', "'read_file' changes nothing, so its calls never ask"),
    ('["browser"]', "unknown tool 'browser'"),
    ('["shell", "shell"]', "listed twice"),
    ('"shell"', "expected an array of tool names"),
])
def test_bad_approve_lists_are_refused_in_one_line(approve: str, why: str) -> None:
    text = f'name = "a"\nprovider = "openai"\nmodel = "m"\n[policy]\napprove = {approve}\n'
    with pytest.raises(AgentDefinitionError, match=why) as info:
        parse_agent_definition(text, ".", "agent.toml")
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value)


def test_the_spec_decided_vector_passes_the_schema_and_broken_ones_do_not() -> None:
    import ast
    import re

    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.schema import check
    from kxen_agent.store.objects import SchemaViolation

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text(encoding="utf-8")
    block = re.search(r"^vector: journal-decided\nkind: journal\nvalue: (.*)$", spec, re.M)
    assert block, "objects_spec.md §14.9 has the journal-decided vector"
    value = ast.literal_eval(block.group(1))
    check("journal", value)
    check("journal", {**value, "state": "Started", "source": "tool"})
    for bad in [{"approval": "maybe"}, {"approver": "someone"}, {"source": "robot"}]:
        with pytest.raises(SchemaViolation):
            check("journal", {**value, **bad})
    for missing in ("approval", "approver"):
        with pytest.raises(SchemaViolation, match=missing):
            check("journal", {k: v for k, v in value.items() if k != missing})
    lock = default_agent_definition([{"content": "hi"}])
    check("agent", {**lock, "policy": {**lock["policy"], "approve": ["shell", "edit_file"]}})
    check("agent", {**lock, "policy": {k: v for k, v in lock["policy"].items() if k != "approve"}})
    with pytest.raises(SchemaViolation, match="policy.approve"):
        check("agent", {**lock, "policy": {**lock["policy"], "approve": ["read_file"]}})
