"""Session names (objects_spec.md §14.16): given, taken wherever an id is, renamed, unique, and never
taken over by a session from elsewhere. The CLI as a subprocess on real Git repositories; the rules of
a name on the memory store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.session import names
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store.memory import MemoryStore
from tests.session.test_cli_sessions import REMOTE, Kx, git, make_repo, reflog_reasons


# ---------------------------------------------------------------- the rules, in memory


@pytest.mark.parametrize("text", ["cafe", "2024", "ses_6508", "SES_x", "run_1", "op_ab", "msg_12", "a b", "-x",
                                  "a//b", "a/", "x" * 101, "é"])
def test_a_name_that_looks_like_an_id_or_is_no_name_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        names.check_name(text)


@pytest.mark.parametrize("text", ["fix-login", "fix-login/1", "v1.2_b", "Zed", "x" * 100])
def test_names_accepted(text: str) -> None:
    assert names.check_name(text) == text


def test_fork_names_count_up_and_skip_taken_ones(tmp_path: Path) -> None:
    sessions = SessionStore(MemoryStore())
    ws = inspect_workspace(str(make_repo(tmp_path / "r", {}, remote=None)))
    root = sessions.create(default_agent_definition([{"content": "done"}]), ws, name="topic")
    a = sessions.fork(root.id)
    sessions.fork(root.id, name="topic/2")
    c = sessions.fork(root.id)
    d = sessions.fork(a.id)
    assert [names.name_of(sessions.get(s).meta) for s in (a.id, c.id, d.id)] == ["topic/1", "topic/3", "topic/1/1"]
    unnamed = sessions.create(default_agent_definition([{"content": "done"}]), ws)
    assert names.name_of(sessions.fork(unnamed.id).meta) is None
    with pytest.raises(names.NameTaken):
        sessions.fork(root.id, name="topic/1")
    # A rename keeps every other key, links the old metadata, and frees the old name.
    info = names.rename(sessions, a.id, "other")
    assert info.meta["previous"] == a.meta_oid and info.meta["reason"] == "rename"
    assert {k: v for k, v in info.meta.items() if k not in ("name", "previous", "reason", "revisedNs")} == \
        {k: v for k, v in a.meta.items() if k not in ("name", "previous", "reason", "revisedNs")}
    assert sessions.resolve_id("other") == a.id
    assert names.name_of(sessions.fork(root.id).meta) == "topic/1"
    # A rebind copies the name.
    assert sessions.store.get(sessions.rebound_meta(info.meta, info.meta_oid, ws, "import"), "session")["name"] == \
        "other"
    # From elsewhere: a name held here is dropped; the session's own name here, if any, stays.
    assert names.importable(sessions, "ses_elsewhere1", {"name": "topic"}) == \
        (None, names.NameDropped("ses_elsewhere1", "topic", root.id))
    assert names.importable(sessions, a.id, {"name": "topic"}, "other") == \
        ("other", names.NameDropped(a.id, "topic", root.id, "other"))
    assert names.importable(sessions, a.id, {"name": "free-one"}, "other") == ("free-one", None)
    assert names.importable(sessions, a.id, {"name": "cafe"})[1].holder == "-"


# ---------------------------------------------------------------- the commands


def test_names_across_commands_rename_and_clashes(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    res = kx.json("run", "--workspace", str(repo), "--task", "first task", "-n", "fix-login")
    ses = res["session"]
    assert kx.show("fix-login")["id"] == ses and kx.show(ses)["name"] == "fix-login"
    # --resume NAME, run show NAME, session log NAME: the name is read wherever the id is.
    again = json.loads(kx.run("--resume", "fix-login", "--task", "second task", "--json").out)
    assert again["session"] == ses and again["status"] == "completed"
    assert kx.json("run", "show", "fix-login")["session"] == ses
    assert kx.log("fix-login") == kx.log(ses)
    # A fork is named <parent>/<n>; --name names it; a name of a fork is taken by fork itself.
    f1 = kx.json("session", "fork", "fix-login")
    assert f1["name"] == "fix-login/1"
    f2 = kx.json("session", "fork", "fix-login/1", "--name", "try-b")
    assert f2["name"] == "try-b" and f2["parentId"] == f1["id"]
    # Clashes and id-like names: one line, exit 2, nothing written.
    before = reflog_reasons(kx.state, f1["id"])
    line = kx.fail("session", "rename", f1["id"], "try-b", code=2)
    assert f"taken by session {f2['id']}" in line
    assert "looks like an id" in kx.fail("session", "rename", f1["id"], "beef", code=2)
    assert "taken by session" in kx.fail("run", "--workspace", str(repo), "--task", "t", "-n", "fix-login", code=2)
    assert "taken by session" in kx.fail("session", "fork", ses, "-n", "try-b", code=2)
    assert reflog_reasons(kx.state, f1["id"]) == before
    assert len(kx.ids()) == 3
    assert "no session is named 'nope'" in kx.fail("session", "show", "nope", code=1)
    # Rename: the old name is free, the new one works, the reflog says so.
    kx.run("session", "rename", "fix-login/1", "first-fork")
    assert kx.show("first-fork")["id"] == f1["id"]
    assert reflog_reasons(kx.state, f1["id"])[-1] == "session: rename first-fork"
    kx.fail("session", "show", "fix-login/1", code=1)
    # The tree and the list show names.
    assert "first-fork" in kx.run("session", "tree", "fix-login").out
    assert "(try-b)" in kx.run("session", "list").out

    # Export by name; import into a state dir where one of the names is taken: dropped, said once.
    bundle = tmp_path / "family.bundle"
    kx.run("session", "export", "fix-login", "first-fork", "try-b", "--output", str(bundle))
    (tmp_path / "b").mkdir()
    other = Kx(tmp_path / "b")
    repo_b = tmp_path / "b" / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(repo_b)], check=True, capture_output=True)
    git(repo_b, "remote", "set-url", "origin", REMOTE, env=other.env)
    mine = other.json("run", "--workspace", str(repo_b), "--task", "local work", "-n", "try-b")["session"]
    proc = other.run("session", "import", str(bundle), "--workspace", str(repo_b))
    notes = [ln for ln in proc.err.splitlines() if ln.startswith("note: ")]
    assert notes == [f"note: session {f2['id']}: its name 'try-b' is taken here by session {mine}; kept without "
                     f"a name (name it: kxen-agent session rename {f2['id']} NAME)"]
    assert other.show("try-b")["id"] == mine
    assert other.show(f2["id"])["name"] is None
    assert other.show("fix-login")["id"] == ses and other.show("first-fork")["id"] == f1["id"]
    # Importing again builds on the binding here, which has no name: nothing is dropped anew, nothing renamed.
    again = json.loads(other.run("session", "import", str(bundle), "--workspace", str(repo_b), "--json").out)
    assert again["droppedNames"] == [] and other.show(f2["id"])["name"] is None
    other.run("fsck")


def test_a_pulled_name_never_takes_a_local_one(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Kx(tmp_path / "a")
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    repo_a = make_repo(tmp_path / "a" / "repo", a.env, remote=str(remote))
    git(repo_a, "push", "-q", "origin", "main", env=a.env)
    ses = a.json("run", "--workspace", str(repo_a), "--task", "t", "-n", "shared-name")["session"]
    a.run("session", "push", "shared-name")
    b = Kx(tmp_path / "b")
    repo_b = tmp_path / "b" / "repo"
    subprocess.run(["git", "clone", "-q", "-b", "main", str(remote), str(repo_b)], check=True, capture_output=True)
    mine = b.json("run", "--workspace", str(repo_b), "--task", "t", "-n", "shared-name")["session"]
    rep = json.loads(b.run("session", "pull", ses, "--workspace", str(repo_b), "--json").out)
    assert rep["droppedNames"] == [{"session": ses, "name": "shared-name", "heldBy": mine, "kept": None}]
    assert b.show("shared-name")["id"] == mine and b.show(ses)["name"] is None
    b.run("fsck")
