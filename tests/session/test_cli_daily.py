"""The daily path at the terminal (issue #16), driven as a user drives it.

The installed ``kxen-agent`` console script as a subprocess, real Git for
every workspace layout, a pty where a terminal matters (``run`` with no
task waits for no input on a terminal). Helpers come from
``tests/helpers.py``; every Git call has an isolated configuration.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kxen_agent.cli.run_cmds import DEMO_AGENT
from tests.helpers import Cli, Proc, write_agent

BYTES_REPR = re.compile(r"(?<![\w'])b'")  # a path shown as Python bytes: b'/tmp/x'

GIT_ID = {"GIT_AUTHOR_NAME": "kxen test", "GIT_AUTHOR_EMAIL": "t@kxen.invalid",
          "GIT_COMMITTER_NAME": "kxen test", "GIT_COMMITTER_EMAIL": "t@kxen.invalid"}


@pytest.fixture
def kx(tmp_path: Path) -> Cli:
    gitconfig = tmp_path / "gitconfig"
    # Local-path submodules (the superproject test) need the file transport.
    gitconfig.write_text("[protocol \"file\"]\n\tallow = always\n[init]\n\tdefaultBranch = main\n")
    env = {k: v for k, v in os.environ.items() if k.startswith("GIT_")}
    c = Cli(tmp_path / "state", env={**{k: "" for k in env}, "GIT_CONFIG_GLOBAL": str(gitconfig),
                                     "GIT_CONFIG_NOSYSTEM": "1", **GIT_ID})
    for k in env:  # inherited GIT_* variables must not point the tests at another repository
        c.env.pop(k, None)
    c.env.update({"GIT_CONFIG_GLOBAL": str(gitconfig), "GIT_CONFIG_NOSYSTEM": "1", **GIT_ID})
    # A user who has configured a default agent (README: the default agent): the bundled scripted one.
    c.env["KXEN_AGENT_AGENT"] = str(DEMO_AGENT)
    yield c
    c.kill_spawned()


def g(kx: Cli, cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=kx.env, capture_output=True, text=True, check=True).stdout


def repo(kx: Cli, path: Path, *, remote: str | None = "https://example.com/org/repo.git",
         files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    g(kx, path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "# r\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    g(kx, path, "add", "-A")
    g(kx, path, "commit", "-q", "-m", "initial")
    if remote:
        g(kx, path, "remote", "add", "origin", remote)
    return path


def one_line_error(p: Proc, code: int) -> str:
    assert p.rc == code, str(p)
    assert "Traceback" not in p.err and not BYTES_REPR.search(p.err), str(p)
    lines = p.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kxen-agent: error: "), str(p)
    return lines[0]


def start(kx: Cli, ws: Path, task: str = "first task", agent: Path | None = None) -> dict:
    extra = ("--agent", str(agent)) if agent else ()
    p = kx("run", "--task", task, "--json", *extra, cwd=ws, expect=0)
    return p.json()


# ------------------------------------------------------------------ defaults


def test_run_defaults_to_this_directory_and_reads_a_task_from_stdin(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws", files={"README.md": "x\n", "pkg/sub/f.txt": "y\n"})
    res = start(kx, ws)
    assert kx.session_show(res["session"])["workspace"]["root"] == os.path.realpath(ws)
    # Started in a subdirectory, the session works in that subdirectory.
    sub = start(kx, ws / "pkg" / "sub")
    shown = kx.session_show(sub["session"])["workspace"]
    assert shown["root"] == os.path.realpath(ws / "pkg" / "sub") and shown["repoRoot"] == os.path.realpath(ws)

    piped = kx("run", "--json", input="the task\nfrom a pipe\n", cwd=ws, expect=0)
    ses = piped.json()["session"]
    assert kx.log(ses)[0]["content"] == "the task\nfrom a pipe\n"
    dash = kx("run", "--task-file", "-", "--json", input="dash task", cwd=ws, expect=0)
    assert kx.log(dash.json()["session"])[0]["content"] == "dash task"
    empty = kx("run", input="  \n", cwd=ws, expect=2)
    assert "the task on standard input is empty" in empty.err, str(empty)
    assert len(kx.sessions()) == 4  # the refused one created nothing


def test_run_on_a_terminal_with_no_task_asks_for_one_instead_of_waiting(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    main_fd, tty = pty.openpty()
    try:
        p = kx("run", stdin=tty, cwd=ws)
    finally:
        os.close(tty)
        os.close(main_fd)
    assert p.rc == 2 and "run needs a task: --task TEXT" in p.err, str(p)
    assert not kx.state_dir.exists()


def test_continue_resumes_the_latest_session_bound_here(kx: Cli, tmp_path: Path) -> None:
    ws, other = repo(kx, tmp_path / "ws"), repo(kx, tmp_path / "other", remote="https://example.com/o/other")
    first = start(kx, ws)["session"]
    second = start(kx, ws)["session"]
    elsewhere = start(kx, other)["session"]
    p = kx("--continue", "--task", "next", "--json", cwd=ws, expect=0)
    assert p.json()["session"] == second
    # Now `first` is the one with the newest activity.
    kx("--resume", first, "--task", "again", cwd=ws, expect=0)
    assert kx("-c", "--task", "more", "--json", cwd=ws, expect=0).json()["session"] == first
    assert kx("-c", "--task", "x", "--json", "--workspace", str(other), expect=0).json()["session"] == elsewhere
    assert len(kx.sessions()) == 3
    lonely = repo(kx, tmp_path / "lonely", remote="https://example.com/o/lonely")
    err = one_line_error(kx("--continue", "--task", "x", cwd=lonely), 1)
    assert os.path.realpath(lonely) in err and "kxen-agent run --task" in err
    err = one_line_error(kx("--continue", "--resume", first), 2)
    assert "either --resume SES or --continue" in err


# ------------------------------------------------------------------ ids


def test_unique_prefixes_for_sessions_runs_and_ops(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    effects = tmp_path / "effects.log"
    agent = write_agent(tmp_path / "agent", [
        {"tool_calls": [{"name": "shell", "arguments": {"command": f"echo e >> '{effects}'"}}]},
        {"content": "done"}])
    crashed = kx("run", "--task", "t", "--agent", str(agent), "--json", cwd=ws,
                 env={"KXEN_AGENT_FAULT": "tool:after-effect"})
    assert crashed.killed, str(crashed)
    [s] = kx.sessions()
    ses, run = s["id"], s["runs"][0]["id"]
    assert s["status"] == "interrupted"  # its process is gone
    short = ses[:8]
    assert kx.session_show(short)["id"] == ses
    res = kx("--resume", short, "--json", expect=3).json()
    assert res["session"] == ses and res["status"] == "input_required"
    [op] = res["unknownOps"]
    # run show SES: the latest run; a run prefix works too.
    assert kx("run", "show", short, "--json", expect=0).json()["run"] == run
    assert kx("run", "show", ses, run[:8], "--json", expect=0).json()["run"] == run
    # run resolve SES OP finds the run; the op may be a prefix.
    done = kx("run", "resolve", short, op[:7], "--output", "verified", "--json", expect=0).json()
    assert done["run"] == run and done["op"] == op
    assert kx("--resume", short, "--json", expect=0).json()["status"] == "completed"
    # cat-object takes a msg_ id.
    msg = kx.log(ses)[0]["id"]
    obj = kx("cat-object", msg[:16], "--json", expect=0).json()
    assert obj["kind"] == "message" and obj["id"] == msg[len("msg_"):]
    err = one_line_error(kx("run", "show", ses, "run_zzzz"), 1)
    assert f"kxen-agent session show {ses}" in err
    err = one_line_error(kx("session", "show", "ses_"), 2)
    assert "at least 4" in err


def test_an_ambiguous_prefix_lists_the_candidates(kx: Cli, tmp_path: Path) -> None:
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import RefUpdate, Store

    ses = start(kx, repo(kx, tmp_path / "ws"))["session"]
    store = Store.open(str(kx.state_dir), namespaces=(NS,))
    twin = ses[:10] + "f" * (len(ses) - 10) if not ses.endswith("f" * (len(ses) - 10)) else ses[:10] + "0" * (len(ses) - 10)
    meta = store.refs.read(f"{NS}/{ses}").refs["meta"]
    store.refs.transaction(f"{NS}/{twin}", [RefUpdate("meta", None, meta)], reason="test: a second id with the prefix")
    err = one_line_error(kx("session", "show", ses[:10]), 2)
    assert "ambiguous" in err and ses in err and twin in err
    assert kx.session_show(ses)["id"] == ses  # the full id is never ambiguous


# ------------------------------------------------------------------ session list


def test_session_list_dates_last_task_status_and_filters(kx: Cli, tmp_path: Path) -> None:
    ws, other = repo(kx, tmp_path / "ws"), repo(kx, tmp_path / "other", remote="https://example.com/o/x")
    a = start(kx, ws, task="first line of the task\nsecond line\n")["session"]
    b = start(kx, other, task="other task")["session"]
    out = kx("session", "list", expect=0).out.splitlines()
    [line_a] = [ln for ln in out if ln.startswith(a)]
    assert "completed" in line_a and "created 20" in line_a and "active 20" in line_a
    assert line_a.endswith("task: first line of the task…"), line_a  # one line, no quoted "\n"
    assert '"' not in line_a and "\\n" not in line_a
    rows = kx("session", "list", "--workspace", str(ws), "--json", expect=0).json()["sessions"]
    assert [r["id"] for r in rows] == [a] and rows[0]["lastTask"] == "first line of the task\nsecond line\n"
    assert rows[0]["lastActivityNs"] >= rows[0]["createdNs"]
    assert [r["id"] for r in kx.sessions()] == [a, b]  # least recently active first
    assert kx("session", "list", "--since", "1h", "--json", expect=0).json()["sessions"] != []
    assert kx("session", "list", "--since", "2999-01-01", "--json", expect=0).json()["sessions"] == []
    err = one_line_error(kx("session", "list", "--since", "soon"), 2)
    assert "neither a duration" in err


# ------------------------------------------------------------------ help and conventions


def test_version_and_top_level_help_order(kx: Cli) -> None:
    from kxen_agent import __version__

    assert kx("--version", expect=0).out.strip() == f"kxen-agent {__version__}"
    text = kx("--help", expect=0).out
    daily, plumbing = text.index("Daily commands:"), text.index("Plumbing:")
    assert daily < plumbing
    for name in ("run", "session"):
        assert daily < text.index(f"\n  {name} ") < plumbing
    for name in ("fsck", "gc", "cat-object", "bundle", "demo"):
        assert text.index(f"\n  {name} ") > plumbing
    assert "--resume SES" in text and "--continue" in text and "Examples:" in text


def _commands():
    from kxen_agent.cli.main import COMMANDS, load_command

    for name in COMMANDS:
        cmd = load_command(name)
        yield (name,), cmd
        # Through click's API: a group's subcommands are built when asked for (cli/main.LazyGroup).
        for sub in cmd.list_commands(None) if hasattr(cmd, "list_commands") else ():
            yield (name, sub), cmd.get_command(None, sub)


def test_every_command_help_teaches() -> None:
    from kxen_agent.cli.main import COMMANDS

    allowed = {"SES", "SES...", "RUN", "[RUN]", "[RUN] OP", "MSG", "FILE", "DIR", "DIR|SES=DIR", "TEXT", "NAME",
               "DURATION", "WHEN", "FORMAT", "ID", "MODEL", "URL", "NAME_OR_URL", "PATTERN", "ROLE", "COMMIT",
               "RECIPIENT", "KEY"}
    seen = 0
    for path, cmd in _commands():
        where = "kxen-agent " + " ".join(path)
        assert (cmd.help or "").strip(), where
        assert "Example" in cmd.help, f"{where} --help has no example"
        if len(path) == 1:
            # The top-level listing shows the purpose the command's own help starts with.
            assert cmd.help.strip().splitlines()[0].strip() == COMMANDS[path[0]][2], where
        for p in cmd.params:
            if p.name == "help":
                continue
            flag = getattr(p, "is_flag", False) and not getattr(p, "count", False)
            if getattr(p, "param_type_name", "") == "option":
                assert (p.help or "").strip(), f"{where} {p.opts} has no help"
            if p.name == "json_out":
                assert len(p.help) > 20, f"{where} --json is not described"
            if not flag:
                assert p.metavar in allowed, f"{where} {p.opts}: metavar {p.metavar!r}"
        seen += 1
    assert seen >= 17


def test_help_text_has_no_type_placeholders(kx: Cli) -> None:
    for args in (("--help",), ("run", "--help"), ("run", "resolve", "--help"), ("session", "fork", "--help"),
                 ("session", "import", "--help"), ("gc", "--help"), ("cat-object", "--help")):
        text = kx(*args, expect=0).out
        assert "<str>" not in text and " TEXT " not in text.replace("--task TEXT", "").replace("--output TEXT", ""), \
            (args, text)


def test_misplaced_words_get_what_was_meant(kx: Cli) -> None:
    err = one_line_error(kx("--resume", "--task", "hi"), 2)
    assert "--resume needs a session id" in err and "kxen-agent --resume SES --task hi" in err
    assert "no such command" not in err
    err = one_line_error(kx("resume"), 2)
    assert "did you mean `kxen-agent --resume SES" in err
    err = one_line_error(kx("fork", "x"), 2)
    assert "kxen-agent session fork SES" in err


def test_io_errors_show_paths_as_text() -> None:
    from kxen_agent.cli.main import os_error_line

    line = os_error_line(OSError(28, "No space left on device", b"/var/lib/kx\xc3\xa9/objects/tmp_1"))
    assert "b'" not in line and "/var/lib/kxé/objects/tmp_1" in line and "SES" not in line


# ------------------------------------------------------------------ workspaces that follow the user


def _meta(kx: Cli, ses: str) -> dict:
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    store = Store.open(str(kx.state_dir), namespaces=(NS,))
    return store.get(store.refs.read(f"{NS}/{ses}").refs["meta"], "session")


def test_branch_switch_forks_onto_the_new_branch(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    ses = start(kx, ws)["session"]
    g(kx, ws, "switch", "-q", "-c", "feature-x")
    err = one_line_error(kx("--resume", ses, "--task", "go on"), 1)
    assert f"kxen-agent session fork {ses} --workspace {os.path.realpath(ws)}" in err
    fork = kx("session", "fork", ses[:9], "--workspace", str(ws), "--json", expect=0).json()
    assert fork["workspace"]["branch"] == "feature-x" and fork["parentId"] == ses
    assert _meta(kx, fork["id"])["reason"] == "fork-workspace"
    assert kx("--resume", fork["id"], "--task", "on the branch", "--json", expect=0).json()["status"] == "completed"
    stranger = repo(kx, tmp_path / "stranger", remote="https://example.com/org/other")
    err = one_line_error(kx("session", "fork", ses, "--workspace", str(stranger)), 1)
    assert "origin remote differs" in err
    err = one_line_error(kx("session", "fork", ses, "--workspace", str(ws), "--worktree", "w"), 2)
    assert "not both" in err


def test_a_move_names_the_rebind_which_exits_0_with_nothing_to_run(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    ses = start(kx, ws)["session"]
    moved = tmp_path / "moved"
    shutil.move(str(ws), str(moved))
    err = one_line_error(kx("--resume", ses), 2)
    assert f"kxen-agent --resume {ses} --workspace NEW_PATH --rebind-workspace" in err and "no longer exists" in err
    p = kx("--resume", ses, "--workspace", str(moved), "--rebind-workspace", expect=0)
    assert "nothing to resume" in p.out and f"--resume {ses} --task" in p.out
    assert kx.session_show(ses)["workspace"]["root"] == os.path.realpath(moved)
    # Moved again and resumed with --workspace only: the hint names the whole command.
    again = tmp_path / "again"
    shutil.move(str(moved), str(again))
    err = one_line_error(kx("--resume", ses, "--task", "x", "--workspace", str(again)), 1)
    assert f"kxen-agent --resume {ses} --workspace {os.path.realpath(again)} --rebind-workspace" in err


def test_an_identity_mismatch_names_the_part_that_differs(kx: Cli, tmp_path: Path) -> None:
    src = repo(kx, tmp_path / "src", remote=None, files={"README.md": "x\n", "a/f": "1\n", "b/f": "2\n"})
    ses = start(kx, src)["session"]
    clone = tmp_path / "clone"
    g(kx, tmp_path, "clone", "-q", str(src), str(clone))
    err = one_line_error(kx("--resume", ses, "--task", "x", "--workspace", str(clone), "--rebind-workspace"), 1)
    assert "has an origin remote and the session's had none" in err and "remote remove origin" in err
    sub = start(kx, src / "a")["session"]
    err = one_line_error(kx("--resume", sub, "--task", "x", "--workspace", str(src / "b"), "--rebind-workspace"), 1)
    assert "subdirectory differs" in err and "'a'" in err and "'b'" in err
    unrelated = repo(kx, tmp_path / "unrelated", remote=None)
    err = one_line_error(kx("--resume", ses, "--task", "x", "--workspace", str(unrelated), "--rebind-workspace"), 1)
    assert "root commits differ" in err


def test_core_worktree_elsewhere_is_refused_at_run(kx: Cli, tmp_path: Path) -> None:
    odd = repo(kx, tmp_path / "odd")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    g(kx, odd, "config", "core.worktree", str(elsewhere))
    err = one_line_error(kx("run", "--task", "x", cwd=odd), 2)
    assert "outside its repository's work tree" in err and os.path.realpath(elsewhere) in err
    assert not kx.state_dir.exists()


def _worktrees(kx: Cli, repo_dir: Path) -> list[str]:
    return [ln.split(" ", 1)[1] for ln in g(kx, repo_dir, "worktree", "list", "--porcelain").splitlines()
            if ln.startswith("worktree ")]


def test_a_failed_worktree_fork_leaves_nothing_and_the_retry_works(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws", files={"README.md": "x\n", "pkg/f": "1\n"})
    ses = start(kx, ws / "pkg")["session"]  # bound to a subdirectory: the worktree's top is not the binding
    failed = kx("session", "fork", ses, "--worktree", "alt", env={"KXEN_AGENT_IO_FAULT": "ENOSPC@1+"})
    assert failed.rc != 0 and "Traceback" not in failed.err, str(failed)
    assert _worktrees(kx, ws) == [os.path.realpath(ws)]
    assert "kxen/alt" not in g(kx, ws, "branch", "--list")
    assert not (tmp_path / "ws.worktrees").exists()
    fork = kx("session", "fork", ses, "--worktree", "alt", "--json", expect=0).json()
    assert fork["workspace"]["root"] == os.path.realpath(tmp_path / "ws.worktrees" / "alt" / "pkg")


def test_git_failures_show_the_fatal_line(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    ses = start(kx, ws)["session"]
    # A branch named `kxen` makes `kxen/x` impossible: git prints its progress, then "fatal: ...".
    g(kx, ws, "branch", "kxen")
    err = one_line_error(kx("session", "fork", ses, "--worktree", "x"), 1)
    assert "fatal:" in err and "Preparing worktree" not in err, err
    assert _worktrees(kx, ws) == [os.path.realpath(ws)]


def _superproject(kx: Cli, tmp_path: Path) -> tuple[Path, Path]:
    lib = repo(kx, tmp_path / "lib-src", remote=None, files={"lib.txt": "lib\n"})
    sup = repo(kx, tmp_path / "super", remote="https://example.com/org/super")
    g(kx, sup, "submodule", "add", "-q", str(lib), "libs/lib")
    g(kx, sup, "commit", "-q", "-m", "add the submodule")
    return sup, sup / "libs" / "lib"


def test_submodule_worktrees_go_beside_the_superproject(kx: Cli, tmp_path: Path) -> None:
    sup, sub = _superproject(kx, tmp_path)
    ses = start(kx, sub)["session"]
    fork = kx("session", "fork", ses, "--worktree", "try", "--json", expect=0).json()
    where = tmp_path / "super.worktrees" / "try" / "libs" / "lib"
    assert fork["workspace"]["root"] == os.path.realpath(where)
    assert (where / "lib.txt").read_text() == "lib\n"
    # Nothing appeared inside the superproject (the run's own notes in the submodule aside).
    assert g(kx, sup, "status", "--porcelain", "--ignore-submodules=all") == ""
    assert not (sup / "libs" / "lib.worktrees").exists()


def test_a_superproject_worktree_has_its_submodules(kx: Cli, tmp_path: Path) -> None:
    sup, _sub = _superproject(kx, tmp_path)
    ses = start(kx, sup)["session"]
    fork = kx("session", "fork", ses, "--worktree", "alt", "--json", expect=0).json()
    wt = Path(fork["workspace"]["root"])
    assert (wt / "libs" / "lib" / "lib.txt").read_text() == "lib\n"


def test_delete_with_worktree_and_undelete(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    ses = start(kx, ws)["session"]
    fork = kx("session", "fork", ses, "--worktree", "exp", "--json", expect=0).json()
    wt = Path(fork["workspace"]["root"])
    (wt / "new.txt").write_text("not committed\n")
    err = one_line_error(kx("session", "delete", fork["id"], "--worktree"), 2)
    assert "uncommitted changes" in err and "new.txt" in err
    assert wt.exists() and kx.session_show(fork["id"])["deleted"] is False
    g(kx, wt, "add", "new.txt")
    g(kx, wt, "commit", "-q", "-m", "work on the branch")
    head = g(kx, wt, "rev-parse", "HEAD").strip()
    err = one_line_error(kx("session", "delete", ses, "--worktree"), 2)
    assert "not a worktree kxen-agent created" in err
    p = kx("session", "delete", fork["id"][:9], "--worktree", expect=0)
    assert "removed worktree" in p.out and f"session undelete {fork['id']}" in p.out
    assert not wt.exists() and "kxen/exp" not in g(kx, ws, "branch", "--list")
    assert fork["id"] not in [s["id"] for s in kx.sessions()]
    p = kx("session", "undelete", fork["id"][:9], expect=0)
    assert "re-created worktree" in p.out, str(p)
    assert (wt / "new.txt").read_text() == "not committed\n" and g(kx, wt, "rev-parse", "HEAD").strip() == head
    assert kx("--resume", fork["id"], "--task", "back", "--json", expect=0).json()["status"] == "completed"
    err = one_line_error(kx("session", "undelete", fork["id"]), 1)
    assert "not deleted" in err
    # A plain delete keeps the worktree; undelete brings the session back.
    kx("session", "delete", ses, expect=0)
    assert kx("session", "undelete", ses, "--json", expect=0).json()["deleted"] is False
    assert ses in [s["id"] for s in kx.sessions()]


# ------------------------------------------------------------------ gc


def _gc(kx: Cli, *args: str) -> dict:
    return kx("gc", *args, "--json", expect=0).json()


def test_gc_never_grows_the_store(kx: Cli, tmp_path: Path) -> None:
    ws = repo(kx, tmp_path / "ws")
    ses = start(kx, ws)["session"]
    for i in range(3):
        kx("--resume", ses, "--task", f"task {i}", expect=0)
    rep = _gc(kx, "--prune=1y")
    assert rep["bytesAfter"] <= rep["bytesBefore"], rep
    assert rep["prune"] == "1y"
    again = _gc(kx, "--prune=2.weeks.ago")
    assert again["bytesAfter"] <= again["bytesBefore"] and again["packedObjects"] == 0, again
    # An imported (packed) store, then a few loose objects more: still no growth.
    bundle = tmp_path / "s.bundle"
    kx("session", "export", ses, "-o", str(bundle), expect=0)
    other = Cli(tmp_path / "state2", env=kx.env)
    other.env["KXEN_AGENT_STATE_DIR"] = str(tmp_path / "state2")
    other("session", "import", str(bundle), "--workspace", str(ws), expect=0)
    other("--resume", ses, "--task", "one more", expect=0)
    rep = other("gc", "--json", expect=0).json()
    assert rep["bytesAfter"] <= rep["bytesBefore"], rep
    other.fsck_clean()
    kx.fsck_clean()
    err = one_line_error(kx("gc", "--prune=1x"), 2)
    assert "6mo, 1y" in err


def test_prune_durations() -> None:
    from kxen_agent.store.gc import BadDuration, parse_duration

    day = 86400.0
    assert parse_duration("1y") == 365 * day and parse_duration("6mo") == 180 * day
    assert parse_duration("2.weeks.ago") == parse_duration("2weeks") == parse_duration("2w") == 14 * day
    assert parse_duration("1 year") == 365 * day and parse_duration("1y6mo") == 545 * day
    assert parse_duration("3 days ago") == 3 * day and parse_duration("never") is None
    for bad in ("1x", "y", "1", "ago", "1.5d", "-1d", "101y", "1y ago ago"):
        with pytest.raises(BadDuration):
            parse_duration(bad)
