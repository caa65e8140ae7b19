"""The rough edges a new user met (issue 29, item 4), one test each, with real processes and files."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers import Cli, spawn_kxen, wait_for_file, write_agent
from tests.runtime.test_approvals import PROMPT, PtyRun, run_args, shell_step


def test_a_new_task_after_a_failed_run_says_the_previous_was_abandoned_and_the_error_is_said_once(
        cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [{"content": "looking", "tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "ok"}]
    agent = write_agent(tmp_path / "agent", steps, policy={"max_turns": 1})
    failed = cli("run", "--workspace", str(workspace), "--task", "first job", "--agent", str(agent), expect=1)
    assert failed.out.count("max_turns (1) reached") == 1 and "max_turns" not in failed.err, str(failed)
    ses = cli.sessions()[0]["id"]
    cli.resume(ses, "--task", "second job", expect=0)
    users = [m["content"] for m in cli.log(ses) if m["role"] == "user"]
    assert users[0] == "first job"
    assert users[1] == ("[The previous task was abandoned: its run was failed before it was done. Do not go on "
                        "with it; this is the new task.]\n\nsecond job"), users
    assert [r["task"] for r in cli.session_show(ses)["runs"]] == ["first job", "second job"]  # the task alone


def test_a_refused_call_has_a_result_line(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", [shell_step("echo x > x.txt"), {"content": "fine"}],
                        policy={"approve": ["shell"]})
    p = PtyRun(cli, *run_args(workspace, agent))
    p.wait_for(PROMPT)
    p.answer("n")
    rc, _ = p.finish()
    assert rc == 0 and b"<- error: refused by the user" in p.screen, p.screen


def test_a_canceled_run_names_the_next_command(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", [shell_step("touch started; sleep 30"), {"content": "done"}])
    proc = spawn_kxen(["run", "--workspace", str(workspace), "--task", "wait", "--agent", str(agent)], env=cli.env)
    wait_for_file(workspace / "started", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    ses = cli.sessions()[0]["id"]
    assert f"next: `kxen-agent --resume {ses} --retry` tries its task again; `kxen-agent --resume {ses} --task TEXT`" \
        in out, out
    assert "canceled by the user" not in err, "the error is said once, in the result"


def test_a_read_only_state_dir_is_named_as_such(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", [{"content": "hi"}])
    for code, words in (("EROFS", "is on a read-only file system"), ("EACCES", "is not writable by this user")):
        p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent),
                env={"KXEN_AGENT_IO_FAULT": f"{code}@1+"}, expect=1)
        [line] = p.err.strip().splitlines()
        assert f"({code})" in line and words in line and "check the disk" not in line, line


def test_a_refusal_that_calls_no_model_does_not_import_the_sdk(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    from tests.runtime.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        server.reply_content("done")
        agent = write_agent(tmp_path / "agent", None, provider="openai", model="m", base_url=server.base_url)
        ses = cli.run_json(workspace, "t", agent, expect=0).json()["session"]
    # An `openai` whose import fails loudly: a command that imports it says so.
    shadow = tmp_path / "loud" / "openai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the openai SDK was imported')\n")
    loud = {"PYTHONPATH": str(shadow.parent)}
    nothing = cli("--resume", ses, env=loud, expect=2)  # one code for "nothing to do", as --retry's
    assert "nothing to resume" in nothing.err and "imported" not in nothing.err, str(nothing)
    gone = cli("--resume", ses, "--task", "x", "--workspace", str(tmp_path / "nowhere"), env=loud)
    assert gone.rc != 0 and "imported" not in gone.err and "nowhere" in gone.err, str(gone)
    # A run that calls the model imports it first, and refuses before anything is written.
    runs = len(cli.session_show(ses)["runs"])
    assert cli("--resume", ses, "--task", "x", env=loud, expect=2).err.count("\n") == 1
    assert len(cli.session_show(ses)["runs"]) == runs


def test_a_typo_is_told_from_a_foreign_id(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    ses = cli.run_json(workspace, "t", write_agent(tmp_path / "agent", [{"content": "hi"}]), expect=0).json()["session"]
    typo = ses[:6] + ("0" if ses[6] != "0" else "1") + ses[7:]  # one character off
    said = cli("session", "show", typo, expect=1).err
    assert f"did you mean {ses}?" in said and "local to the state dir" not in said, said
    short = cli("session", "show", "ses_zzzz", expect=1).err
    assert "no session in state dir" in short and "begins with ses_zzzz" in short, short
    foreign = cli("session", "show", "ses_0123456789abcdef0123", expect=1).err
    assert "session ids are local to the state dir" in foreign and "did you mean" not in foreign, foreign


def test_progress_is_erased_on_a_terminal_and_never_printed_off_one(cli: Cli, workspace: Path,
                                                                   tmp_path: Path) -> None:
    import pty
    import subprocess

    cli.run_json(workspace, "t", write_agent(tmp_path / "agent", [{"content": "hi"}]), expect=0)
    assert "fsck:" not in cli("fsck", expect=0).err  # off a terminal: no counter at all
    master, slave = pty.openpty()
    proc = spawn_kxen(["fsck"], env=cli.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                      text=False)
    os.close(slave)
    out, _ = proc.communicate(timeout=60)
    screen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    assert proc.returncode == 0 and b"fsck: " in screen, screen
    assert screen.endswith(b"\r\x1b[K"), screen  # the counter's line is erased, nothing is left on it
