"""Workspace checkpoints of real runs (``objects_spec.md`` §14.14), through the installed CLI and real Git.

- a scripted run of shell and file edits: each operation's ``session diff --op`` is exactly what its tool did,
  the journal names a before checkpoint on ``Started`` and an after on ``Settled``, ``session show`` counts them;
- a kill at each fault point of a tool turn leaves refs ``git fsck`` accepts and a journal naming only
  checkpoints that exist; an UNKNOWN shell operation shows its workspace diff in ``run show``;
- ``[policy] checkpoints = false`` and a workspace outside Git record nothing, and ``session diff`` says so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import Cli, git, git_workspace, write_agent

SHA1 = re.compile(r"[0-9a-f]{40}")


def steps_edits() -> list[dict]:
    return [
        {"content": "shell and write", "tool_calls": [
            {"name": "shell", "arguments": {"command": "printf 'one\\n' > one.txt && rm README.md && echo ok"}},
            {"name": "write_file", "arguments": {"path": "src/w.txt", "content": "written\n"}},
        ]},
        {"content": "read and edit", "tool_calls": [
            {"name": "read_file", "arguments": {"path": "src/w.txt"}},
            {"name": "edit_file", "arguments": {"path": "src/w.txt", "old": "written", "new": "edited"}},
        ]},
        {"content": "done"},
    ]


def session_of(p) -> tuple[str, str]:
    ses = re.findall(r"session (ses_[0-9a-f]+) created", p.err)
    run = re.findall(r"run (run_[0-9a-f]+) started", p.err)
    assert len(ses) == 1 and len(run) == 1, str(p)
    return ses[0], run[0]


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def commit_exists(repo: Path, oid: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", oid + "^{commit}"],
                          capture_output=True).returncode == 0


def journal_checkpoints(cli: Cli, ses: str, run: str) -> list[str]:
    ids = []
    for j in cli.run_show(ses, run)["journal"]:
        ids += [j[k] for k in ("checkpointBefore", "checkpointAfter") if j.get(k)]
    return ids


def test_session_diff_per_op_is_what_the_tools_did(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    git(workspace, "config", "user.name", "x")  # the user's identity is not needed: checkpoints carry their own
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "ignored.log").write_text("never recorded\n")
    agent = write_agent(tmp_path / "agent", steps_edits())
    p = cli("run", "--workspace", str(workspace), "--task", "edit", "--agent", str(agent), expect=0)
    ses, run = session_of(p)
    journal = {j["tool"]: j for j in cli.run_show(ses, run)["journal"]}
    assert journal["read_file"]["checkpointBefore"] is None and journal["read_file"]["checkpointAfter"] is None
    sh, wr, ed = journal["shell"], journal["write_file"], journal["edit_file"]
    for j in (sh, wr, ed):
        assert SHA1.fullmatch(j["checkpointBefore"]) and SHA1.fullmatch(j["checkpointAfter"]), j
    # One checkpoint after each call; the before of the next call of the run is the after of the previous one.
    assert wr["checkpointBefore"] == sh["checkpointAfter"] and ed["checkpointBefore"] == wr["checkpointAfter"]

    def files(op: str) -> list[tuple[str, str, int | None, int | None]]:
        d = cli("session", "diff", ses, "--op", op, "--json", expect=0).json()
        return [(f["path"], f["status"], f["added"], f["deleted"]) for f in d["files"]]

    assert files(sh["op"]) == [("README.md", "D", 0, 1), ("one.txt", "A", 1, 0)]
    assert files(wr["op"]) == [("src/w.txt", "A", 1, 0)]
    assert files(ed["op"]) == [("src/w.txt", "M", 1, 1)]
    text = cli("session", "diff", ses, "--op", ed["op"], expect=0).out
    assert "-written\n+edited\n" in text, text
    whole = cli("session", "diff", ses, "--run", run, "--json", expect=0).json()
    assert [f["path"] for f in whole["files"]] == ["README.md", "one.txt", "src/w.txt"]
    assert "ignored.log" not in cli("session", "diff", ses, "--stat", expect=0).out
    # The checkpoint tree is the workspace: the after of the last op holds the edited file, nothing ignored.
    after = ed["checkpointAfter"]
    assert git_out(workspace, "show", f"{after}:src/w.txt") == "edited\n"
    assert "ignored.log" not in git_out(workspace, "ls-tree", "-r", "--name-only", after)
    # A chain under the session's ref, whose commits have HEAD as their last parent; Git accepts them.
    ref = f"refs/kxen/checkpoints/{ses}"
    assert git_out(workspace, "rev-parse", ref).strip() == after
    head = git_out(workspace, "rev-parse", "HEAD").strip()
    assert git_out(workspace, "rev-list", "--parents", "-n1", after).split()[1:] == [wr["checkpointAfter"], head]
    git_out(workspace, "fsck", "--strict", "--no-dangling")
    # Nothing of the user's changed: their index, HEAD and status are as the tools left the files.
    assert git_out(workspace, "status", "--porcelain", "-uall").splitlines() == [
        " D README.md", "?? .gitignore", "?? one.txt", "?? src/w.txt"]
    show = cli("session", "show", ses, "--json", expect=0).json()["checkpoints"]
    assert show["count"] == 4 and show["bytes"] > 0 and show["ref"] == ref, show
    assert "checkpoints:  4 (" in cli("session", "show", ses, expect=0).out
    # Up to a message: the results of the first turn hold the shell's and write_file's changes, not the edit.
    first_results = [m["id"] for m in cli.log(ses) if m["role"] == "tool"][1]
    at = cli("session", "diff", ses, "--at", first_results, "--json", expect=0).json()
    assert (at["from"], at["to"]) == (sh["checkpointBefore"], wr["checkpointAfter"])
    # A journal naming a checkpoint the repository does not have (refs deleted, objects pruned): said, exit 1.
    git(workspace, "update-ref", "-d", ref)
    git(workspace, "-c", "gc.reflogExpire=now", "gc", "-q", "--prune=now")
    msg = cli.refused("session", "diff", ses, "--op", ed["op"], code=1)
    assert f"checkpoint {ed['checkpointBefore']} ({ed['op']}, before) is not in the repository" in msg, msg


def test_no_checkpoints_when_off_or_outside_git(cli: Cli, tmp_path: Path) -> None:
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo x > x.txt"}}]}, {"content": "done"}]
    ws = git_workspace(tmp_path / "ws")
    off = write_agent(tmp_path / "off", steps, policy={"checkpoints": False})
    p = cli("run", "--workspace", str(ws), "--task", "t", "--agent", str(off), expect=0)
    ses, run = session_of(p)
    assert "no workspace checkpoints: [policy] checkpoints = false" in p.err
    assert journal_checkpoints(cli, ses, run) == []
    assert git_out(ws, "for-each-ref", "refs/kxen/") == ""
    msg = cli.refused("session", "diff", ses, code=1)
    assert "no checkpoints: [policy] checkpoints = false" in msg
    plain = tmp_path / "plain"
    plain.mkdir()
    p = cli("run", "--workspace", str(plain), "--task", "t", "--agent", str(write_agent(tmp_path / "on", steps)),
            expect=0)
    ses, run = session_of(p)
    assert "is not in a Git repository" in p.err and journal_checkpoints(cli, ses, run) == []
    assert "not in a Git repository" in cli.refused("session", "diff", ses, code=1)


TOOL_POINTS = ("tool:after-started", "tool:after-effect", "tool:after-outcome", "tool:after-turn")


@pytest.mark.parametrize("point", TOOL_POINTS)
def test_a_kill_in_a_tool_turn_leaves_only_checkpoints_that_exist(point: str, cli: Cli, workspace: Path,
                                                                  tmp_path: Path) -> None:
    steps = [{"content": "change", "tool_calls": [
        {"name": "shell", "arguments": {"command": "printf 'from the shell\\n' > made.txt"}}]},
        {"content": "done"}]
    agent = write_agent(tmp_path / "agent", steps)
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent),
            env={"KXEN_AGENT_FAULT": point})
    assert p.killed, str(p)
    ses, run = session_of(p)
    git_out(workspace, "fsck", "--strict", "--no-dangling")
    named = journal_checkpoints(cli, ses, run)
    assert named and all(commit_exists(workspace, c) for c in named), named
    resumed = cli.resume(ses)
    show = cli.run_show(ses, run)
    if point in ("tool:after-started", "tool:after-effect"):
        assert resumed.rc == 3, str(resumed)
        [op] = show["journal"]
        assert op["state"] == "OutcomeUnknown" and op["checkpointBefore"] == named[0]
        # The evidence a human decides on: what changed in the workspace since the op's before checkpoint.
        text = cli("run", "show", ses, run, expect=0).out
        if point == "tool:after-effect":
            assert re.search(r"made\.txt \| 1 \+", text), text
            assert "+from the shell" in cli("run", "show", ses, run, "--diff", expect=0).out
        else:  # killed before the effect: nothing changed
            assert "(none)" in text, text
        assert show["journal"][0]["workspaceChanges"][0].startswith("changes in the workspace since checkpoint")
        cli("run", "resolve", ses, run, op["op"], "--output", "checked", expect=0)
        cli.resume(ses, expect=0)
    else:
        assert resumed.rc == 0, str(resumed)
    git_out(workspace, "fsck", "--strict", "--no-dangling")
    named = journal_checkpoints(cli, ses, run)
    assert all(commit_exists(workspace, c) for c in named), named
    [op] = cli.run_show(ses, run)["journal"]
    assert op["state"] == "Settled" and op["checkpointBefore"]
    if point == "tool:after-turn":
        # The process that took the after checkpoint died before Settled: the resume cannot name it.
        assert op["checkpointAfter"] is None
        d = cli("session", "diff", ses, "--op", op["op"], "--json", expect=0)
        assert "has no after checkpoint" in d.err and [f["path"] for f in d.json()["files"]] == ["made.txt"]


def test_a_forks_checkpoints_chain_onto_its_parents_at_the_fork_point(cli: Cli, workspace: Path,
                                                                      tmp_path: Path) -> None:
    steps = [{"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "first\n"}}]},
             {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "second\n"}}]},
             {"content": "done"}]
    p = cli("run", "--workspace", str(workspace), "--task", "t",
            "--agent", str(write_agent(tmp_path / "parent", steps)), expect=0)
    ses, run = session_of(p)
    first, second = cli.run_show(ses, run)["journal"]
    point = next(m["id"] for m in cli.log(ses) if m["role"] == "tool")  # the results of the first call
    fork = cli("session", "fork", ses, "--at", point, "--json", expect=0).json()["id"]
    # The script provider answers by the number of assistant messages it is shown: the fork's history has one.
    fork_steps = [{"content": "(the parent's first turn)"},
                  {"tool_calls": [{"name": "write_file", "arguments": {"path": "c.txt", "content": "fork\n"}}]},
                  {"content": "done"}]
    cli("--resume", fork, "--task", "in the fork", "--agent", str(write_agent(tmp_path / "fork", fork_steps)),
        expect=0)
    chain = git_out(workspace, "rev-list", "--first-parent", f"refs/kxen/checkpoints/{fork}").split()
    # The fork's own checkpoints come first, then its parent's at the fork point (the first call's after).
    assert first["checkpointAfter"] in chain and second["checkpointAfter"] not in chain
    own = chain[:chain.index(first["checkpointAfter"])]
    # Its before (the workspace holds b.txt, which the parent wrote after the fork point) and its after.
    [fork_op] = cli.run_show(fork, cli.session_show(fork)["runs"][0]["id"])["journal"]
    assert own == [fork_op["checkpointAfter"], fork_op["checkpointBefore"]], (own, fork_op)
    assert cli("session", "show", fork, "--json", expect=0).json()["checkpoints"]["count"] == 2
    # The fork's diff starts at the checkpoint before the parent's first call (its history holds that call).
    d = cli("session", "diff", fork, "--json", expect=0).json()
    assert (d["from"], d["to"]) == (first["checkpointBefore"], own[0])
    # b.txt, which the parent wrote after the fork point, is in the workspace too: the fork's checkpoint holds it.
    assert [f["path"] for f in d["files"]] == ["a.txt", "b.txt", "c.txt"]

    # Retention: once a gc removes the deleted fork's group, its checkpoint ref goes (the parent's stays).
    cli("session", "delete", fork, expect=0)
    rep = cli("gc", "--prune=now", "--json", expect=0).json()
    assert rep["checkpointRefsDeleted"] == [f"refs/kxen/checkpoints/{fork}"], rep
    assert git_out(workspace, "for-each-ref", "--format=%(refname)", "refs/kxen/").split() == [
        f"refs/kxen/checkpoints/{ses}"]
    assert cli("gc", "--prune=now", "--json", expect=0).json()["checkpointRefsDeleted"] == []


@pytest.mark.parametrize("point,proven", [("tool:after-effect", True), ("tool:after-started", False)])
def test_a_file_write_the_workspace_proves_is_settled_without_asking(point: str, proven: bool, cli: Cli,
                                                                     workspace: Path, tmp_path: Path) -> None:
    steps = [{"tool_calls": [{"name": "edit_file", "arguments": {"path": "README.md", "old": "test workspace",
                                                                 "new": "edited workspace"}}]},
             {"content": "done"}]
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(write_agent(tmp_path / "a", steps)),
            env={"KXEN_AGENT_FAULT": point})
    assert p.killed, str(p)
    ses, run = session_of(p)
    resumed = cli.resume(ses)
    [op] = cli.run_show(ses, run)["journal"]
    if proven:
        assert resumed.rc == 0, str(resumed)
        assert (op["state"], op["outcome"]["output"]) == ("Settled", "edited 'README.md': replaced 1 occurrence")
        assert op["source"] == "recovery"  # settled by the resume from the workspace, no question asked
    else:  # killed before the edit: the file is as it was, which proves nothing
        assert resumed.rc == 3 and op["state"] == "OutcomeUnknown", str(resumed)
        assert (workspace / "README.md").read_text() == "# test workspace\n"
