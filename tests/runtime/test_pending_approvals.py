"""Approvals that wait durably (``objects_spec.md`` §14.6 ``PendingApproval``): a call that
``[policy] approve`` lists and nobody at a terminal can answer pauses the run (exit 3); a person
decides it from another process (``run approve`` / ``run deny``), on the state dir that will run it,
then ``--resume`` goes on. Real processes, real files; the question on a terminal goes to the
controlling terminal, never to a redirected standard error."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

from tests.helpers import Cli, git, git_workspace, spawn_kxen, write_agent

from .test_approvals import PROMPT, PtyRun, run_args, shell_step


def _agent(tmp_path: Path, *, read: bool = True) -> Path:
    """Two shell calls in one turn (with ``read``, a read_file call between them, which needs no approval)."""
    calls = [{"name": "shell", "arguments": {"command": "echo one > one.txt"}},
             {"name": "read_file", "arguments": {"path": "README.md"}},
             {"name": "shell", "arguments": {"command": "echo two > two.txt"}}]
    steps = [{"content": "working", "tool_calls": calls if read else calls[::2]}, {"content": "done"}]
    return write_agent(tmp_path / "agent", steps, policy={"approve": ["shell"]})


def _waiting(cli: Cli, ses: str) -> list[str]:
    return [w["op"] for w in cli.run_show(ses, cli.session_show(ses)["runs"][-1]["id"])["waitingForApproval"]]


def test_a_call_nobody_can_answer_pauses_and_is_decided_from_another_process(
        cli: Cli, workspace: Path, tmp_path: Path) -> None:
    res = cli(*run_args(workspace, _agent(tmp_path)), expect=3).json()  # standard input: not a terminal
    ses, run = res["session"], res["run"]
    assert res["status"] == "input_required" and res["unknownOps"] == [], res
    assert "2 tool call(s) wait for approval" in res["error"] and f"kxen-agent run approve {ses} OP" in res["error"]
    assert f"kxen-agent --resume {ses}" in res["error"]
    assert not (workspace / "one.txt").exists(), "nothing after the first waiting call ran"
    show = cli.run_show(ses, run)
    first, second = [w["op"] for w in show["waitingForApproval"]]
    assert [(j["tool"], j["state"], j["outcome"]) for j in show["journal"]] == [
        ("shell", "PendingApproval", None), ("shell", "PendingApproval", None)]
    assert show["waitingForApproval"][0]["approve"] == f"kxen-agent run approve {ses} {first}"
    text = cli("run", "show", ses, expect=0).out
    assert f"`kxen-agent run deny {ses} {second} --reason TEXT`" in text and '"command": "echo two > two.txt"' in text

    # `run resolve` settles UNKNOWN outcomes, not approvals.
    refused = cli("run", "resolve", ses, first, "--output", "ok", expect=1)
    assert "waits for approval" in refused.err and f"kxen-agent run approve {ses} {first}" in refused.err

    cli("run", "approve", ses, first[:10], expect=0)  # a prefix, from a process of its own
    assert "already" in cli("run", "approve", ses, first, expect=1).err  # a decision is made once
    again = cli.resume(ses, "--json", expect=3).json()  # one call still waits: it pauses again, listing it
    assert second in again["error"] and first not in again["error"] and not (workspace / "one.txt").exists()
    assert _waiting(cli, ses) == [second]

    cli("run", "deny", ses, run, second, "--reason", "no, write three.txt instead", expect=0)
    done = cli.resume(ses, "--json", expect=0).json()
    assert done["status"] == "completed" and done["run"] == run, done
    assert (workspace / "one.txt").read_text() == "one\n" and not (workspace / "two.txt").exists()
    tools = [m["content"] for m in cli.log(ses) if m["role"] == "tool"]
    assert tools[-1] == "refused by the user: no, write three.txt instead", tools  # what the model saw
    approvals = {j["op"]: j["approval"] for j in cli.run_show(ses, run)["journal"]}
    assert approvals[first] == {"answer": "yes", "by": "user-command"}
    assert approvals[second] == {"answer": "no", "by": "user-command"}
    cli.fsck_clean()


def test_the_question_goes_to_the_terminal_not_a_redirected_stderr(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    """``run ... 2>log`` with standard input on the terminal: the question is on the terminal; "r" refuses
    with a reason, which the model is shown."""
    agent = write_agent(tmp_path / "agent", [shell_step("echo made > made.txt"), {"content": "ok"}],
                        policy={"approve": ["shell"]})
    log = tmp_path / "stderr.log"
    master, slave = pty.openpty()
    with open(log, "wb") as err:
        p = PtyRun.__new__(PtyRun)
        p.master, p.screen = master, b""
        p.proc = spawn_kxen(run_args(workspace, agent), env=cli.env, stdin=slave, stderr=err,
                            stdout=subprocess.PIPE, text=False, start_new_session=True)
        os.close(slave)
        p.wait_for(PROMPT)
        p.answer("r")
        p.wait_for(b"the reason")
        p.answer("use a file tool instead")
        rc, res = p.finish()
    assert rc == 0 and res["status"] == "completed", p.screen
    assert b"allow shell?" not in log.read_bytes()
    assert not (workspace / "made.txt").exists()
    [j] = cli.run_show(res["session"], res["run"])["journal"]
    assert j["outcome"]["output"] == "refused by the user: use a file tool instead"


def test_a_decision_counts_only_on_the_state_dir_that_runs_the_call(tmp_path: Path) -> None:
    """Paused on A, moved to B by export/import: B decides (its own `run approve`) and runs the call; a
    decision A made before the export is not acted on in B until B decides too."""
    ws_a = git_workspace(tmp_path / "A")
    ws_b = tmp_path / "B"
    git(tmp_path, "clone", "-q", str(ws_a), str(ws_b))
    git(ws_b, "remote", "remove", "origin")
    # Only calls that need approval: a call asked for elsewhere that needs none waits for `session trust` (§14.13).
    agent = _agent(tmp_path, read=False)
    own = {"KXEN_AGENT_AGENT": str(agent)}  # both machines' configured agent: the lock is B's own too
    a, b = Cli(tmp_path / "state-a", env=own), Cli(tmp_path / "state-b", env=own)

    def move(ses: str, name: str) -> None:
        bundle = tmp_path / f"{name}.bundle"
        a("session", "export", ses, "--output", str(bundle), expect=0)
        b("session", "import", str(bundle), "--workspace", str(ws_b), expect=0)

    # 1. Undecided on A: B decides both and runs them.
    ses = a(*run_args(ws_a, agent), expect=3).json()["session"]
    move(ses, "one")
    first, second = _waiting(b, ses)
    assert b.resume(ses, "--json", expect=3).json()["status"] == "input_required"  # still waits in B
    decided = b("run", "approve", ses, "--all", expect=0).out  # both, one step each
    assert first in decided and second in decided and f"continue with `kxen-agent --resume {ses}`" in decided
    assert b.resume(ses, "--json", expect=0).json()["status"] == "completed"
    assert (ws_b / "one.txt").exists() and (ws_b / "two.txt").exists() and not (ws_a / "one.txt").exists()

    # 2. Decided on A before the export: B does not act on A's decision; B's own decision runs the call.
    ses = a(*run_args(ws_a, agent, "again"), expect=3).json()["session"]
    for op in _waiting(a, ses):
        a("run", "approve", ses, op, expect=0)
    (ws_b / "one.txt").unlink()
    move(ses, "two")
    held = b.resume(ses, "--json", expect=3).json()
    assert held["status"] == "input_required" and "another machine" in held["error"], held
    assert not (ws_b / "one.txt").exists()
    for op in [j["op"] for j in b.run_show(ses, held["run"])["journal"]]:
        b("run", "approve", ses, op, expect=0)
    assert b.resume(ses, "--json", expect=0).json()["status"] == "completed"
    assert (ws_b / "one.txt").read_text() == "one\n"
    b.fsck_clean()


def test_no_terminal_is_locked_only_when_set_to_refuse(tmp_path: Path) -> None:
    from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
    from kxen_agent.store.objects import encode_object

    head = 'name = "a"\nprovider = "openai"\nmodel = "m"\n[policy]\napprove = ["shell"]\n'
    plain = parse_agent_definition(head, ".", "a.toml")
    paused = parse_agent_definition(head + 'no_terminal = "pause"\n', ".", "a.toml")
    refuse = parse_agent_definition(head + 'no_terminal = "refuse"\n', ".", "a.toml")
    assert encode_object("agent", paused).id == encode_object("agent", plain).id and plain["version"] == 3
    assert refuse["version"] == 6 and refuse["policy"]["no_terminal"] == "refuse"
    try:
        parse_agent_definition(head + 'no_terminal = "ask"\n', ".", "a.toml")
    except AgentDefinitionError as e:
        assert "policy.no_terminal" in str(e) and '"pause" or "refuse"' in str(e)
    else:
        raise AssertionError("a bad no_terminal was accepted")


def test_the_chat_says_what_a_paused_run_waits_for_and_resume_goes_on(cli: Cli, workspace: Path,
                                                                      tmp_path: Path) -> None:
    import pexpect

    from tests.test_interactive import PROMPT, command, spawn

    agent = write_agent(tmp_path / "agent", [shell_step("echo made > made.txt"), {"content": "made it"}],
                        policy={"approve": ["shell"]})
    ses = cli(*run_args(workspace, agent), expect=3).json()["session"]
    [op] = _waiting(cli, ses)
    child = spawn(cli, workspace, "chat", "--resume", ses)
    child.expect("wait for approval")
    child.expect(f"kxen-agent run approve {ses} {op}")
    child.expect(PROMPT)
    cli("run", "approve", ses, op, expect=0)  # from another process, while the chat is open
    command(child, "/resume", r"<- ok", "made it")
    assert (workspace / "made.txt").read_text() == "made\n"
    child.send("\x04")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
