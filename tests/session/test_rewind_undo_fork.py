"""``session rewind --undo`` after ``--both`` takes the fork's id as well as the original's (issue #27).

One real Git repository and one scripted run: turn 1 writes ``a.txt`` v1, turn 2 rewrites it (v2). A ``--both``
rewind to the message after turn 1 restores v1 and forks; ``--undo`` given the fork's id puts v2 back (on the
parent's chain, which the fork shares the workspace with), a second one redoes v1; a fork not made by that
rewind is refused in one line, as is a session with no rewind at all.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import Cli, git_workspace, write_agent

STEPS = [
    {"content": "first", "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "v1\n"}}]},
    {"content": "second", "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "v2\n"}}]},
    {"content": "done"},
]


def test_undo_takes_the_fork_a_both_rewind_made(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "state", strict=True)
    ws = git_workspace(tmp_path / "ws")
    agent = write_agent(tmp_path / "agent", STEPS)
    p = cli("run", "--workspace", str(ws), "--task", "edit", "--agent", str(agent), expect=0)
    ses = p.err.split("session ", 1)[1].split()[0]
    log = cli.log(ses)
    after_turn1 = [m for m in log if m["role"] == "tool"][0]["id"]
    other = cli("session", "fork", ses, "--at", log[0]["id"], "--json", expect=0).json()["id"]

    rewound = cli("session", "rewind", ses, "--at", after_turn1, "--json", expect=0).json()
    fork = rewound["conversation"]["session"]
    assert (ws / "a.txt").read_text() == "v1\n" and rewound["code"]["session"] == ses
    text = cli("session", "rewind", fork, "--undo", expect=0).out
    assert (ws / "a.txt").read_text() == "v2\n"
    assert f"undoing the rewind of session {ses}, the parent of fork {fork}" in text
    again = cli("session", "rewind", fork, "--undo", "--json", expect=0).json()
    assert (ws / "a.txt").read_text() == "v1\n" and again["code"]["session"] == ses and again["session"] == fork

    # A fork made otherwise (at another message) undoes nothing of its parent's: one line, nothing changed.
    line = cli.refused("session", "rewind", other, "--undo", code=2)
    assert f"session {other} has no rewind to undo: --undo takes the session a rewind was made on, or the fork" in line
    assert (ws / "a.txt").read_text() == "v1\n"
    cli("session", "rewind", ses, "--undo", expect=0)  # the parent's own --undo still works on the same chain
    assert (ws / "a.txt").read_text() == "v2\n"
