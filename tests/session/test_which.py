"""``session which COMMIT`` (commits a tool call made, read from the workspace checkpoints' recorded HEADs)
and ``session list --branch``. The CLI as a subprocess on a real Git repository."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import write_agent
from tests.session.test_cli_sessions import Kx, git, make_repo

IDENT = "-c user.name=agent -c user.email=agent@example.invalid"


def test_which_names_the_tool_call_of_a_commit_and_an_amend_and_none_for_the_users(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    start = git(repo, "rev-parse", "HEAD", env=kx.env)
    agent = write_agent(tmp_path / "agent", [
        {"tool_calls": [{"name": "shell", "arguments": {
            "command": f"echo one > a.txt && git add a.txt && git {IDENT} commit -q -m agent-one"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {
            "command": f"echo two >> a.txt && git add a.txt && git {IDENT} commit -q --amend -m agent-amended"}}]},
        {"content": "done"},
    ], tools=["shell"])
    res = kx.json("run", "--workspace", str(repo), "--task", "commit", "--agent", str(agent), "-n", "committer")
    ses = res["session"]
    amended = git(repo, "rev-parse", "HEAD", env=kx.env)
    first = git(repo, "reflog", "--format=%H", env=kx.env).split()[1]  # the commit the amend replaced
    assert first not in (amended, start)
    fork = kx.json("session", "fork", ses)["id"]
    ops = [j["op"] for j in kx.json("run", "show", ses)["journal"]]

    def which(rev: str, code: int = 0) -> dict:
        return json.loads(kx.run("session", "which", rev, "--workspace", str(repo), "--json", code=code).out)

    made = which("HEAD")["madeBy"]
    assert [(m["op"], m["tool"], m["sessions"]) for m in made] == [(ops[1], "shell", [ses, fork])]
    assert made[0]["headBefore"] == first and made[0]["headAfter"] == amended
    made = which(first)["madeBy"]
    assert [(m["op"], m["headBefore"]) for m in made] == [(ops[0], start)]
    # A commit of the user's own: none, exit 1; so is one from before the session.
    git(repo, "commit", "-q", "--allow-empty", "-m", "mine", env=kx.env)
    assert which("HEAD", code=1)["madeBy"] == []
    assert which(start, code=1)["madeBy"] == []
    assert "made by no tool call" in kx.run("session", "which", "HEAD", "-w", str(repo), code=1).out
    assert "is not a commit" in kx.fail("session", "which", "no-such-rev", "-w", str(repo), code=1)

    # session list --branch: the sessions bound to that branch.
    assert {s["id"] for s in kx.json("session", "list", "--branch", "main")["sessions"]} == {ses, fork}
    assert kx.json("session", "list", "--branch", "other")["sessions"] == []


def test_continue_on_a_branch_finds_the_session_bound_to_it(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    on_main = kx.json("run", "--workspace", str(repo), "--task", "on main")["session"]
    git(repo, "switch", "-q", "-c", "feature", env=kx.env)
    on_feature = kx.json("run", "--workspace", str(repo), "--task", "on feature")["session"]
    git(repo, "switch", "-q", "main", env=kx.env)
    # The session bound to main, though the feature one was active last.
    res = json.loads(kx.run("--continue", "--workspace", str(repo), "--task", "more", "--json").out)
    assert res["session"] == on_main
    assert {s["id"] for s in kx.json("session", "list", "--branch", "feature")["sessions"]} == {on_feature}
