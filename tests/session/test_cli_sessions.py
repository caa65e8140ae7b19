"""The session commands end to end: the installed ``kxen-agent`` console
script as a subprocess, real Git repositories, a fresh state dir per test.

Every CLI call goes through :meth:`Kx.run`, which fails the test on any
traceback on stderr and checks the exit code asked for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import CLI_TIMEOUT_S, Proc, cli_env, kxen_argv, run_kxen, spawn_kxen

DEMO_AGENT = str(Path(__file__).resolve().parents[2] / "kxen_agent" / "examples" / "demo-agent" / "agent.toml")
TIMEOUT_S = CLI_TIMEOUT_S
REMOTE = "https://builder:s3cr3t-t0ken@example.com/org/repo.git"
GIT_ID = ["-c", "user.name=Kxen Test", "-c", "user.email=kxen-test@example.invalid"]

SES_RE = re.compile(r"ses_[0-9a-f]{20}")
RUN_RE = re.compile(r"run_[0-9a-f]{20}")
MSG_RE = re.compile(r"msg_[0-9a-f]{64}")
HEX64 = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------- helpers


class Kx:
    """The CLI bound to one state dir, with an isolated Git configuration (over :func:`tests.helpers.run_kxen`)."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        gitconfig = tmp / "gitconfig"
        gitconfig.write_text("")
        self.env = cli_env(self.state, {
            "GIT_CONFIG_GLOBAL": str(gitconfig),
            "GIT_CONFIG_NOSYSTEM": "1",
            "LC_ALL": "C",
            # `run` without --agent: the default agent is configured to be the bundled demo one.
            "KXEN_AGENT_AGENT": DEMO_AGENT,
        }, base={k: v for k, v in os.environ.items() if not k.startswith("GIT_")})

    def run(self, *args: str, code: int | None = 0, env: dict | None = None) -> Proc:
        """Run ``kxen-agent ARGS``; ``code`` None means "any non-zero"."""
        proc = run_kxen(args, env={**self.env, **(env or {})}, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert "Traceback" not in proc.err, str(proc)
        if code is None:
            assert proc.rc != 0, str(proc)
        else:
            assert proc.rc == code, str(proc)
        return proc

    def fail(self, *args: str, code: int | None = None, env: dict | None = None) -> str:
        """Run a command that must be refused; return its one-line error."""
        proc = self.run(*args, code=code, env=env)
        lines = proc.err.strip().splitlines()
        assert len(lines) == 1, proc.err
        assert lines[0].startswith("kxen-agent: error: "), proc.err
        return lines[0]

    def json(self, *args: str, env: dict | None = None):
        return json.loads(self.run(*args, "--json", env=env).out)

    def start(self, workspace: Path, task: str = "first task", *more: str, env: dict | None = None) -> dict:
        res = self.json("run", "--workspace", str(workspace), "--task", task, *more, env=env)
        assert res["status"] == "completed", res
        return res

    def show(self, ses: str) -> dict:
        return self.json("session", "show", ses)

    def log(self, ses: str) -> list[dict]:
        out = self.run("session", "log", ses, "--json").out
        return [json.loads(line) for line in out.splitlines()]

    def ids(self) -> list[str]:
        return [s["id"] for s in self.json("session", "list")["sessions"]]


def git(cwd: Path, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run(["git", *GIT_ID, "-C", str(cwd), *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def make_repo(path: Path, env: dict, remote: str | None = REMOTE) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main", env=env)
    if remote:
        git(path, "remote", "add", "origin", remote, env=env)
    commit(path, env, "README.md")
    return path


def commit(repo: Path, env: dict, name: str = "change.txt") -> str:
    with open(repo / name, "a") as f:
        f.write(f"{name} {os.urandom(4).hex()}\n")
    git(repo, "add", "-A", env=env)
    git(repo, "commit", "-q", "-m", f"change {name}", env=env)
    return git(repo, "rev-parse", "HEAD", env=env)


def reflog_reasons(state: Path, ses: str) -> list[str]:
    # Read by the library in this process (a reader: it takes no lock and writes nothing); a
    # Python process per read cost more CPU than the CLI calls it checks.
    from kxen_agent.store import Store

    return [e.reason for e in Store(str(state)).refs.reflog("sessions/" + ses)]


@pytest.fixture
def kx(tmp_path: Path) -> Kx:
    return Kx(tmp_path)


@pytest.fixture
def repo(tmp_path: Path, kx: Kx) -> Path:
    return make_repo(tmp_path / "repo", kx.env)


# ---------------------------------------------------------------- 1. identities


def test_identities_and_show_json(kx: Kx, repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD", env=kx.env)
    res = kx.start(repo)
    ses, run = res["session"], res["run"]
    assert SES_RE.fullmatch(ses) and RUN_RE.fullmatch(run)

    show = kx.show(ses)
    assert show["id"] == ses
    assert show["parentId"] is None and show["forkPoint"] is None and show["forkKind"] is None
    assert show["branchRootId"] == ses
    assert HEX64.fullmatch(show["agentLock"]) and show["agent"]["lock"] == show["agentLock"]
    ws = show["workspace"]
    real = os.path.realpath(repo)
    assert ws["root"] == real and ws["repoRoot"] == real
    assert HEX64.fullmatch(ws["identity"]) and HEX64.fullmatch(ws["remoteHash"])
    assert ws["branch"] == "main" and ws["head"] == head
    assert [(r["id"], r["status"], r["settled"]) for r in show["runs"]] == [(run, "completed", True)]
    assert "s3cr3t-t0ken" not in json.dumps(show)

    log = kx.log(ses)
    assert log and all(MSG_RE.fullmatch(m["id"]) for m in log)
    assert [m["seq"] for m in log] == list(range(len(log)))
    assert show["head"] == log[-1]["id"] and show["messages"] == len(log)
    assert log[0]["role"] == "user" and log[0]["content"] == "first task" and log[0]["run"] == run

    text = kx.run("session", "show", ses).out
    for needle in (ses, run, show["agentLock"], "branchRootId", real, "completed"):
        assert needle in text
    text = kx.run("session", "log", ses).out
    assert text.startswith(log[0]["id"][:16] + "  #0 user")
    positions = [text.index(m["id"][:16]) for m in log]
    assert positions == sorted(positions)
    assert "-> list_files" in text

    fork = kx.json("session", "fork", ses, "--at", log[0]["id"][:16])
    fshow = kx.show(fork["id"])
    assert SES_RE.fullmatch(fork["id"]) and fork["id"] != ses
    assert (fshow["parentId"], fshow["branchRootId"], fshow["forkPoint"], fshow["forkKind"]) == (
        ses, ses, log[0]["id"], "conversation")
    assert fshow["agentLock"] == show["agentLock"] and fshow["workspace"] == ws and fshow["runs"] == []
    grand = kx.run("session", "fork", fork["id"]).out.splitlines()[0]
    gshow = kx.show(grand)
    assert (gshow["parentId"], gshow["branchRootId"], gshow["forkPoint"]) == (fork["id"], ses, log[0]["id"])


# ---------------------------------------------------------------- 2. agent lock


def write_agent(d: Path, step2_marker: str, name: str = "locked") -> Path:
    d.mkdir(exist_ok=True)
    (d / "agent.toml").write_text(textwrap.dedent(f"""\
        name = "{name}"
        provider = "script"
        script = "steps.json"
        api_key_env = "KXEN_TEST_API_KEY"
        system = "You are {name}."
        tools = ["shell", "read_file"]
        [policy]
        max_turns = 10
    """))
    steps = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo step-zero"}}]},
        {"content": "first task done"},
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo {step2_marker}"}}]},
        {"content": "second task done"},
    ]
    (d / "steps.json").write_text(json.dumps(steps))
    return d / "agent.toml"


def shell_commands(log: list[dict]) -> list[str]:
    return [json.loads(c["arguments"])["command"] for m in log for c in m["toolCalls"] if c["name"] == "shell"]


def test_agent_lock_is_immutable_and_holds_no_secret(kx: Kx, repo: Path, tmp_path: Path) -> None:
    secret = "sk-live-DO-NOT-STORE-4711"
    keyenv = {"KXEN_TEST_API_KEY": secret}
    agent = write_agent(tmp_path / "agent", "OLD-STEP-TWO")
    ses = kx.start(repo, "first", "--agent", str(agent), env=keyenv)["session"]
    show = kx.show(ses)
    lock = show["agentLock"]
    assert show["agent"]["name"] == "locked" and show["agent"]["apiKeyEnv"] == "KXEN_TEST_API_KEY"
    body = kx.run("cat-object", lock, "--json").out
    assert '"KXEN_TEST_API_KEY"' in body and secret not in body

    # Edit the definition and its steps: the session keeps its revision.
    write_agent(tmp_path / "agent", "NEW-STEP-TWO", name="edited")
    res = kx.json("--resume", ses, "--task", "second", env=keyenv)
    assert res["status"] == "completed" and res["result"] == "second task done"
    cmds = shell_commands(kx.log(ses))
    assert cmds == ["echo step-zero", "echo OLD-STEP-TWO"], cmds
    show2 = kx.show(ses)
    assert show2["agentLock"] == lock and show2["agent"]["name"] == "locked"
    assert [r["status"] for r in show2["runs"]] == ["completed", "completed"]

    # The session no longer needs the files at all.
    shutil.rmtree(tmp_path / "agent")
    assert kx.json("--resume", ses, "--task", "third")["status"] == "completed"


# ---------------------------------------------------------------- 3. forks


def test_fork_points_and_refusals(kx: Kx, repo: Path) -> None:
    ses = kx.start(repo)["session"]
    log = kx.log(ses)
    lock = kx.show(ses)["agentLock"]
    # The demo agent: user, assistant(2 calls), tool, tool, assistant(2 calls), ...
    assert [m["role"] for m in log[:4]] == ["user", "assistant", "tool", "tool"]

    head_fork = kx.run("session", "fork", ses).out.splitlines()[0]
    assert kx.show(head_fork)["forkPoint"] == log[-1]["id"]
    assert kx.log(head_fork) == log

    for k, prefix_len in ((0, 8), (3, 12)):
        f = kx.json("session", "fork", ses, "--at", "msg_" + log[k]["id"][4:4 + prefix_len])
        assert f["forkPoint"] == log[k]["id"]
        assert kx.log(f["id"]) == log[: k + 1]  # same ids: the objects are shared

    count = len(kx.ids())
    # An unknown prefix (the only objects it could match are unlikely to
    # exist; the test checks the ones it knows about).
    unknown = next(p for p in ("00000000", "ffffffff", "0f0f0f0f", "f0f0f0f0")
                   if not any(m["id"][4:].startswith(p) for m in log) and not lock.startswith(p))
    err = kx.fail("session", "fork", ses, "--at", "msg_" + unknown)
    assert "not in state dir" in err and str(kx.state) in err
    err = kx.fail("session", "fork", ses, "--at", "msg_12345", code=2)
    assert "not a message id" in err
    err = kx.fail("session", "fork", ses, "--at", "msg_" + lock[:12])
    assert "not a message" in err
    # Splitting a tool call from its results names the nearest valid points.
    for bad in (1, 2):
        err = kx.fail("session", "fork", ses, "--at", log[bad]["id"][:16])
        assert "split" in err and log[0]["id"] in err and log[3]["id"] in err, err
    assert len(kx.ids()) == count


def test_ambiguous_fork_prefix(kx: Kx, repo: Path) -> None:
    ses = kx.start(repo)["session"]
    # Two root messages whose ids share 8 hex digits, written by the library.
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store

    s = SessionStore(Store(str(kx.state)))
    out = [s.append_messages(None, [{"role": "user", "content": c}]).hex() for c in ("c60843", "c116812")]
    assert out[0][:8] == out[1][:8] != out[0][:9]
    count = len(kx.ids())
    err = kx.fail("session", "fork", ses, "--at", "msg_" + out[0][:8], code=2)
    assert "ambiguous" in err
    # Unique with one more digit, but in no session's history.
    err = kx.fail("session", "fork", ses, "--at", "msg_" + out[0][:9])
    assert f"not in the history of session {ses}" in err and kx.log(ses)[-1]["id"] in err
    assert len(kx.ids()) == count


def test_fork_under_the_parents_lease_then_run_in_the_fork(kx: Kx, repo: Path) -> None:
    ses = kx.start(repo)["session"]
    parent_log, parent_show = kx.log(ses), kx.show(ses)
    holder_code = textwrap.dedent("""\
        import sys
        from kxen_agent.store import Store
        from kxen_agent.runtime.lease import Lease
        lease = Lease.acquire(Store(sys.argv[1]), sys.argv[2], run="run_heldbytest", purpose="run")
        print("held", lease.fence, flush=True)
        sys.stdin.read()
        lease.release()
        print("released", flush=True)
    """)
    holder = subprocess.Popen([sys.executable, "-c", holder_code, str(kx.state), ses], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kx.env)
    try:
        assert holder.stdout.readline().startswith("held"), holder.stderr.read()
        # The lease is really held: a run is refused...
        err = kx.fail("--resume", ses, "--task", "while held", code=75)
        assert "busy" in err and "run_heldbytest" in err
        # ...but forking only reads immutable objects.
        fork = kx.json("session", "fork", ses)
        at = kx.json("session", "fork", ses, "--at", parent_log[3]["id"][:16])
        assert fork["parentId"] == ses and at["parentId"] == ses and fork["head"] == parent_show["head"]
    finally:
        out, errs = holder.communicate("", timeout=TIMEOUT_S)
    assert holder.returncode == 0 and "released" in out, errs

    # Running in the fork leaves the parent's history and runs alone.
    res = kx.json("--resume", at["id"], "--task", "continue differently")
    assert res["status"] == "completed" and res["session"] == at["id"]
    flog = kx.log(at["id"])
    assert flog[:4] == parent_log[:4]
    assert flog[4]["role"] == "user" and flog[4]["content"] == "continue differently" and flog[4]["run"] == res["run"]
    assert kx.log(ses) == parent_log
    after = kx.show(ses)
    assert after["runs"] == parent_show["runs"] and after["head"] == parent_show["head"]
    assert [r["id"] for r in kx.show(at["id"])["runs"]] == [res["run"]]


# ---------------------------------------------------------------- 4. worktree forks


def worktree_paths(repo: Path, env: dict) -> list[str]:
    out = git(repo, "worktree", "list", "--porcelain", env=env)
    return [os.path.realpath(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("worktree ")]


def branches(repo: Path, env: dict) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads", env=env).split()


def test_worktree_fork(kx: Kx, repo: Path) -> None:
    ses = kx.start(repo)["session"]
    git(repo, "add", "-A", env=kx.env)
    git(repo, "commit", "-q", "-m", "agent output", env=kx.env)
    now = commit(repo, kx.env)  # HEAD advanced since the session was created
    fork = kx.json("session", "fork", ses, "--worktree", "alt")
    path = os.path.realpath(repo.parent / "repo.worktrees" / "alt")
    assert fork["forkKind"] == "worktree" and fork["parentId"] == ses
    ws = kx.show(fork["id"])["workspace"]
    assert ws["root"] == path and ws["repoRoot"] == path and ws["branch"] == "kxen/alt"
    assert ws["head"] == now, "the worktree must start at the workspace's current HEAD"
    assert ws["identity"] == kx.show(ses)["workspace"]["identity"]
    assert path in worktree_paths(repo, kx.env)
    assert "kxen/alt" in branches(repo, kx.env)
    assert git(Path(path), "rev-parse", "HEAD", env=kx.env) == now
    assert kx.log(fork["id"]) == kx.log(ses)
    # The fork runs in its worktree; the parent's files are untouched.
    before = sorted(os.listdir(repo))
    assert kx.json("--resume", fork["id"], "--task", "work in the worktree")["status"] == "completed"
    assert sorted(os.listdir(repo)) == before


def test_worktree_fork_refusals_leave_nothing_behind(kx: Kx, repo: Path, tmp_path: Path) -> None:
    ses = kx.start(repo)["session"]
    git(repo, "branch", "kxen/taken", env=kx.env)
    count = len(kx.ids())
    trees, heads = worktree_paths(repo, kx.env), branches(repo, kx.env)
    for name in ("../x", "a/b", "x..y", "-x", "kxen/alt"):
        err = kx.fail("session", "fork", ses, "--worktree", name)
        assert "worktree name" in err and repr(name) in err, err
    err = kx.fail("session", "fork", ses, "--worktree", "taken")
    assert "kxen/taken" in err and "already exists" in err
    assert len(kx.ids()) == count
    assert worktree_paths(repo, kx.env) == trees
    assert branches(repo, kx.env) == heads  # kxen/taken is still there, nothing added
    assert not (repo.parent / "repo.worktrees").exists()
    assert not (repo.parent / "x").exists()

    plain = tmp_path / "plain"
    plain.mkdir()
    pses = kx.start(plain)["session"]
    count = len(kx.ids())
    err = kx.fail("session", "fork", pses, "--worktree", "w")
    assert "not a Git repository" in err
    assert len(kx.ids()) == count
    assert not (tmp_path / "plain.worktrees").exists()


# ---------------------------------------------------------------- 5. workspace binding


def test_resume_accepts_new_commits_and_refuses_another_branch(kx: Kx, repo: Path) -> None:
    ses = kx.start(repo)["session"]
    commit(repo, kx.env)
    assert kx.json("--resume", ses, "--task", "after a commit")["status"] == "completed"
    git(repo, "switch", "-q", "-c", "feature", env=kx.env)
    runs = kx.show(ses)["runs"]
    err = kx.fail("--resume", ses, "--task", "on feature")
    assert "'feature'" in err and "'main'" in err and "switch main" in err, err
    assert kx.show(ses)["runs"] == runs
    git(repo, "switch", "-q", "main", env=kx.env)
    assert kx.json("--resume", ses, "--task", "back on main")["status"] == "completed"


def test_moved_repository_needs_an_explicit_rebind(kx: Kx, repo: Path, tmp_path: Path) -> None:
    ses = kx.start(repo)["session"]
    old_root = os.path.realpath(repo)
    moved = tmp_path / "moved" / "repo"
    moved.parent.mkdir()
    shutil.move(str(repo), str(moved))
    new_root = os.path.realpath(moved)

    err = kx.fail("--resume", ses, "--task", "where am I")
    assert old_root in err and "--workspace" in err
    err = kx.fail("--resume", ses, "--task", "here", "--workspace", str(moved))
    assert new_root in err and "--rebind-workspace" in err
    assert kx.show(ses)["workspace"]["root"] == old_root
    err = kx.fail("--resume", ses, "--rebind-workspace", code=2)
    assert "--workspace" in err

    res = kx.json("--resume", ses, "--task", "here", "--workspace", str(moved), "--rebind-workspace")
    assert res["status"] == "completed"
    show = kx.show(ses)
    assert show["workspace"]["root"] == new_root and show["workspace"]["repoRoot"] == new_root
    reasons = reflog_reasons(kx.state, ses)
    assert any(r.startswith("session: rebind") and new_root in r for r in reasons), reasons
    # From now on the new path is the binding.
    assert kx.json("--resume", ses, "--task", "again")["status"] == "completed"


def test_rebind_to_a_clone_and_refusal_of_another_repository(kx: Kx, repo: Path, tmp_path: Path) -> None:
    ses = kx.start(repo)["session"]
    git(repo, "add", "-A", env=kx.env)
    git(repo, "commit", "-q", "-m", "agent output", env=kx.env)
    clone = tmp_path / "runner2" / "checkout"
    git(tmp_path, "clone", "-q", str(repo), str(clone), env=kx.env)
    # Same origin as the original, spelled without credentials.
    git(clone, "remote", "set-url", "origin", "https://example.com/org/repo", env=kx.env)

    stranger = make_repo(tmp_path / "stranger", kx.env, remote="https://example.com/org/other.git")
    before = kx.show(ses)
    rebinds = [r for r in reflog_reasons(kx.state, ses) if "rebind" in r and r.startswith("session:")]
    err = kx.fail("--resume", ses, "--task", "x", "--workspace", str(stranger), "--rebind-workspace")
    assert "origin remote differs" in err and "cannot change that" in err, err
    unrelated = make_repo(tmp_path / "unrelated", kx.env, remote=None)
    kx.fail("--resume", ses, "--task", "x", "--workspace", str(unrelated), "--rebind-workspace")
    after = kx.show(ses)
    assert after["workspace"] == before["workspace"] and after["runs"] == before["runs"]
    assert [r for r in reflog_reasons(kx.state, ses) if "rebind" in r and r.startswith("session:")] == rebinds

    res = kx.json("--resume", ses, "--task", "on the clone", "--workspace", str(clone), "--rebind-workspace")
    assert res["status"] == "completed"
    ws = kx.show(ses)["workspace"]
    assert ws["root"] == os.path.realpath(clone) and ws["identity"] == before["workspace"]["identity"]
    assert ws["remoteHash"] == before["workspace"]["remoteHash"]
    assert any(os.path.realpath(clone) in r for r in reflog_reasons(kx.state, ses))


# ---------------------------------------------------------------- 6. reading


def test_list_tree_delete_and_fsck(kx: Kx, repo: Path) -> None:
    assert "no sessions" in kx.run("session", "list").out
    root = kx.start(repo)["session"]
    log = kx.log(root)
    a = kx.json("session", "fork", root)["id"]
    b = kx.json("session", "fork", root, "--at", log[3]["id"][:16])["id"]
    a1 = kx.json("session", "fork", a)["id"]

    listing = kx.json("session", "list")
    assert listing["stateDir"] == str(kx.state)
    rows = {s["id"]: s for s in listing["sessions"]}
    assert SES_RE.fullmatch(root) and all(s["branchRootId"] == root for s in rows.values())
    assert list(rows) == [root, a, b, a1]
    assert rows[root]["status"] == "completed" and rows[root]["messages"] == len(log)
    assert rows[b]["parentId"] == root and rows[b]["messages"] == 4 and rows[b]["status"] is None

    drawn = kx.run("session", "tree", a1).out.splitlines()
    # As `git log --graph` draws branches: each fork above its parent, the newest straight above it.
    assert drawn[0].startswith(f"* {b}  no runs  ") and f"[conversation] at {log[3]['id'][:16]}" in drawn[0]
    assert drawn[1].startswith(f"| * {a1}  no runs  ") and drawn[1].endswith("<- this session")
    assert drawn[2].startswith(f"| * {a}  no runs  ") and drawn[3] == "|/"
    assert drawn[4].startswith(f"* {root}  completed  ") and drawn[4].endswith("task: first task")
    tree = kx.json("session", "tree", b)
    assert tree["id"] == root
    assert [c["id"] for c in tree["children"]] == [a, b]
    assert [c["id"] for c in tree["children"][0]["children"]] == [a1]

    out = kx.run("session", "delete", a).out
    assert a in out
    assert kx.ids() == [root, b, a1]
    err = kx.fail("session", "show", a, code=1)
    assert f"session {a} is not in state dir {kx.state}" in err
    kx.fail("session", "delete", a, code=1)
    drawn = kx.run("session", "tree", root).out.splitlines()
    # The fork of a deleted fork stays in the tree, above it.
    assert drawn[2].startswith(f"| * {a}  ") and "(deleted)" in drawn[2]
    assert drawn[1].startswith(f"| * {a1}  ")
    assert kx.log(a1) == log
    assert "clean" in kx.run("fsck").out


def test_log_of_a_20000_message_session_streams(kx: Kx, tmp_path: Path) -> None:
    n = 20_000
    plain = tmp_path / "plain"
    plain.mkdir()
    # The messages are one step's objects, in the group's step log (as a run writes them): 20,000
    # loose files cost ten times the CPU of the rest of the test, and the log reads either alike.
    build = textwrap.dedent("""\
        import sys
        from kxen_agent.store import FileIO, Store
        from kxen_agent.session.agent_def import default_agent_definition
        from kxen_agent.session.schema import put
        from kxen_agent.session.sessions import NS, SessionStore
        from kxen_agent.session.workspace import inspect_workspace

        class NoSync(FileIO):  # test setup only: durability is not under test
            def write_tmp(self, d, data, *, sync=True, prefix="tmp_"):
                return super().write_tmp(d, data, sync=False, prefix=prefix)
            def fsync_dir(self, d):
                pass

        s = SessionStore(Store(sys.argv[1], io=NoSync(), namespaces=(NS,)))
        info = s.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(sys.argv[2]))
        with s.store.step(info.group) as step:
            head = None
            for i in range(int(sys.argv[3])):
                v = {"seq": i, "role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "w" * 40}
                if head is not None:
                    v["parent"] = head
                head = put(step, "message", v)
            step.update("head", None, head)
            step.commit("test: history")
        print(info.id)
    """)
    ses = subprocess.run([sys.executable, "-c", build, str(kx.state), str(plain), str(n)], capture_output=True,
                         text=True, check=True, timeout=TIMEOUT_S).stdout.strip()
    # Run the CLI as the only child of a small wrapper that reports its peak RSS.
    out_path = tmp_path / "log.jsonl"
    measure = textwrap.dedent("""\
        import resource, subprocess, sys
        with open(sys.argv[1], "w") as out:
            p = subprocess.run(sys.argv[2:], stdout=out, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(p.stderr)
        print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    """)
    proc = subprocess.run([sys.executable, "-c", measure, str(out_path), *kxen_argv("session", "log", ses, "--json")],
                          capture_output=True, text=True, env=kx.env, timeout=TIMEOUT_S)
    assert "Traceback" not in proc.stderr, proc.stderr
    rc, maxrss_kb = map(int, proc.stdout.split())
    assert rc == 0, proc.stderr
    assert maxrss_kb < 200 * 1024, f"session log peaked at {maxrss_kb // 1024} MB"
    count = 0
    with open(out_path) as f:
        for i, line in enumerate(f):
            m = json.loads(line)
            assert m["seq"] == i and m["content"].startswith(f"message {i} ")
            count += 1
    assert count == n
    assert kx.show(ses)["messages"] == n

    # `session log | head`: the reader goes away after one line. Like git: exit
    # 141 (128 + SIGPIPE), nothing on stderr — not a failure, not a traceback.
    for extra in ((), ("--json",)):
        p = spawn_kxen(["session", "log", ses, *extra], env=kx.env, text=False)
        assert p.stdout is not None and p.stderr is not None
        first = p.stdout.readline()
        p.stdout.close()
        rc = p.wait(timeout=TIMEOUT_S)
        err = p.stderr.read().decode()
        assert b"message 0" in first or first.startswith(b"msg_"), first
        assert (rc, err) == (141, ""), (extra, rc, err)


# ---------------------------------------------------------------- 7. unknown and malformed ids


def test_unknown_and_malformed_session_ids(kx: Kx, repo: Path) -> None:
    kx.start(repo)  # a state dir that exists and has sessions
    unknown = "ses_0123456789abcdef0123"
    for args in (("session", "show", unknown, "--json"), ("session", "log", unknown), ("session", "tree", unknown),
                 ("session", "fork", unknown), ("session", "delete", unknown), ("--resume", unknown, "--task", "x")):
        err = kx.fail(*args, code=1)
        assert unknown in err and str(kx.state) in err and "session import" in err, err
    # "bogus" has a name's form (§14.16): no session has it, exit 1.
    assert "no session is named 'bogus'" in kx.fail("session", "show", "bogus", code=1)
    for args in (("session", "show", "bogus id"), ("session", "log", "ses_"), ("session", "fork", "ses_NOT-AN-ID"),
                 ("--resume", "ses_../../etc", "--task", "x")):
        err = kx.fail(*args, code=2)
        assert "not a session id" in err
    # An empty state dir that does not exist yet is not created by reading.
    (kx.state.parent / "elsewhere").mkdir()
    empty = Kx(kx.state.parent / "elsewhere")
    err = empty.fail("session", "show", unknown, code=1)
    assert str(empty.state) in err
    assert not empty.state.exists()
