"""``/rewind MSG`` in the interactive session: `session rewind`'s code, in a real pty."""

from __future__ import annotations

from pathlib import Path

import pexpect

from tests.helpers import Cli, write_agent
from tests.test_interactive import PROMPT, command, spawn

STEPS = [
    {"content": "Writing it.", "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "A\n"}}]},
    {"content": "Wrote a.txt."},
    {"content": "Fresh start."},
]


def test_rewind_restores_the_files_and_goes_on_in_a_fork(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path / "agent", STEPS)
    child = spawn(cli, workspace, "chat", "--agent", str(agent))
    child.expect(PROMPT)
    command(child, "write a.txt", r"<- ok", "Wrote a.txt.")
    assert (workspace / "a.txt").read_text() == "A\n"
    [ses] = [s["id"] for s in cli.sessions()]
    task = cli.log(ses)[0]["id"]  # the first message: before the file was written
    command(child, "/rewind", "give --at MSG")  # the command's own refusal, one line
    child.send(f"/rewind {task[:12]}\r")
    child.expect(r"restored the workspace to checkpoint [0-9a-f]{12}: 0 file\(s\) written, 1 removed")
    child.expect(r"now in (ses_[0-9a-f]+); /resume " + ses + " goes back")
    fork = child.match.group(1)
    child.expect(PROMPT)
    assert not (workspace / "a.txt").exists()
    assert cli.session_show(fork)["parentId"] == ses
    command(child, f"/resume {ses}", f"session {ses}")  # the rewind was the old session's: undone from there
    command(child, "/rewind --undo", "put the workspace back to checkpoint")
    assert (workspace / "a.txt").read_text() == "A\n"
    child.send("\x04")  # Ctrl-D
    child.expect(f"session {ses}: ")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    cli.fsck_clean()
