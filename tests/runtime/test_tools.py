"""Tools against real files and real processes."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime.redaction import redact
from kxen_agent.runtime.tools import (
    TOOLS,
    Tool,
    ToolContext,
    ToolOutcome,
    ToolOutcomeUnknown,
    tool_specs,
)

shell = TOOLS["shell"]
read_file = TOOLS["read_file"]
write_file = TOOLS["write_file"]
edit_file = TOOLS["edit_file"]
list_files = TOOLS["list_files"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return Path(os.path.realpath(root))


def make_ctx(ws: Path, **kw) -> ToolContext:
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("cancel_window_s", 5.0)
    kw.setdefault("cancel", threading.Event())
    kw.setdefault("secret_env_names", ())
    return ToolContext(workspace=str(ws), **kw)


def wait_for(cond, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie has no effects left; PID 1 may not reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def read_pid(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip() != "")
    return int(path.read_text().split()[0])


# --- registry and specs ------------------------------------------------------


def test_registry_and_specs():
    assert sorted(TOOLS) == ["edit_file", "list_files", "read_file", "search", "shell", "write_file"]
    assert {n for n, t in TOOLS.items() if t.side_effects} == {"shell", "write_file", "edit_file"}
    assert all(isinstance(t, Tool) and t.name == n for n, t in TOOLS.items())
    specs = tool_specs(["shell", "read_file"])
    assert [s["function"]["name"] for s in specs] == ["shell", "read_file"]
    for s in specs:
        assert s["type"] == "function"
        assert set(s["function"]) == {"name", "description", "parameters"}
        assert s["function"]["parameters"]["type"] == "object"
    assert specs[0]["function"]["parameters"]["required"] == ["command"]
    with pytest.raises(UsageError, match="unknown tool 'nope'"):
        tool_specs(["nope"])


def test_package_exports_its_sorted_all_and_each_tool_lives_in_its_concept_module():
    import kxen_agent.runtime.tools as tools
    from kxen_agent.runtime.tools import files, protocol, registry
    from kxen_agent.runtime.tools import shell as shell_mod

    assert tools.__all__ == sorted(tools.__all__)
    assert set(tools.__all__) == {
        "TOOLS", "Tool", "ToolContext", "ToolOutcome", "ToolOutcomeUnknown", "tool_specs",
    }
    for mod in (protocol, files, shell_mod, registry):
        assert mod.__all__ == sorted(mod.__all__) and all(hasattr(mod, n) for n in mod.__all__)
    assert tools.TOOLS is registry.TOOLS and tools.ToolOutcome is protocol.ToolOutcome
    assert type(TOOLS["shell"]).__module__ == shell_mod.__name__
    assert {type(t).__module__ for n, t in TOOLS.items() if n not in ("shell", "search")} == {files.__name__}


def test_redact():
    assert redact("key=abcd1234 again abcd1234", ["abcd1234"]) == "key=[REDACTED] again [REDACTED]"
    assert redact("a ab abc", ["", "ab", "abc"]) == "a ab abc"  # shorter than 4: left alone
    assert redact("xx-secret-long-yy", ["secret", "secret-long"]) == "xx-[REDACTED]-yy"


@pytest.mark.parametrize(
    "tool, arguments, expected",
    [
        ("shell", {}, "missing required argument 'command'"),
        ("shell", {"command": 42}, "argument 'command' must be a string, got int"),
        ("read_file", {"path": None}, "argument 'path' must be a string"),
        ("write_file", {"path": "a"}, "missing required argument 'content'"),
        ("edit_file", {"path": "a", "old": "x", "new": 1}, "argument 'new' must be a string"),
        ("list_files", {"path": ["."]}, "argument 'path' must be a string"),
        ("list_files", {"dir": "."}, "unknown argument(s) dir"),
        ("read_file", ["a"], "arguments must be a JSON object"),
    ],
)
def test_bad_arguments_are_error_outcomes(ws, tool, arguments, expected):
    out = TOOLS[tool].run(arguments, make_ctx(ws))
    assert out.is_error
    assert expected in out.output


# --- confinement -------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("outside secret")
    return d


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "list_files"])
@pytest.mark.parametrize("path", ["../outside/secret.txt", "{outside}/secret.txt", "link/secret.txt", "sub/../../outside/secret.txt"])
def test_paths_confined(ws, outside, tool, path):
    (ws / "link").symlink_to(outside)
    (ws / "sub").mkdir()
    path = path.format(outside=outside)
    args = {"path": path, "content": "pwned", "old": "outside", "new": "pwned"}
    schema = TOOLS[tool].parameters["properties"]
    out = TOOLS[tool].run({k: v for k, v in args.items() if k in schema}, make_ctx(ws))
    assert out == ToolOutcome(out.output, is_error=True)
    assert f"path '{path}' escapes the workspace" in out.output
    assert (outside / "secret.txt").read_text() == "outside secret"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_symlinked_file_escape_refused(ws, outside):
    (ws / "innocent.txt").symlink_to(outside / "secret.txt")
    out = read_file.run({"path": "innocent.txt"}, make_ctx(ws))
    assert out.is_error and "escapes the workspace" in out.output
    out = write_file.run({"path": "innocent.txt", "content": "x"}, make_ctx(ws))
    assert out.is_error and (outside / "secret.txt").read_text() == "outside secret"


def test_absolute_path_inside_is_fine(ws):
    (ws / "a.txt").write_text("inside")
    out = read_file.run({"path": str(ws / "a.txt")}, make_ctx(ws))
    assert out == ToolOutcome("inside", is_error=False)


# --- file tools ----------------------------------------------------------------


def test_read_file_caps_output(ws):
    (ws / "big.txt").write_text("x" * 300)
    out = read_file.run({"path": "big.txt"}, make_ctx(ws, output_cap=100))
    assert not out.is_error
    assert out.output == "x" * 100 + "\n[output truncated: 200 bytes omitted]"


def test_read_file_errors(ws):
    (ws / "d").mkdir()
    assert "no such file 'nope.txt'" in read_file.run({"path": "nope.txt"}, make_ctx(ws)).output
    out = read_file.run({"path": "d"}, make_ctx(ws))
    assert out.is_error and "is a directory" in out.output


def test_write_file_creates_dirs_atomically(ws):
    out = write_file.run({"path": "a/b/c.txt", "content": "héllo\n"}, make_ctx(ws))
    assert out == ToolOutcome("wrote 7 bytes to 'a/b/c.txt'", is_error=False)
    assert (ws / "a/b/c.txt").read_text(encoding="utf-8") == "héllo\n"
    out = write_file.run({"path": "a/b/c.txt", "content": "new"}, make_ctx(ws))
    assert not out.is_error and (ws / "a/b/c.txt").read_text() == "new"
    assert os.listdir(ws / "a/b") == ["c.txt"]  # no temp file left behind


def test_write_file_keeps_mode(ws):
    (ws / "run.sh").write_text("old")
    os.chmod(ws / "run.sh", 0o751)
    assert not write_file.run({"path": "run.sh", "content": "new"}, make_ctx(ws)).is_error
    assert (ws / "run.sh").stat().st_mode & 0o7777 == 0o751


@pytest.mark.parametrize("text, found", [("abc", 0), ("a TARGET b", 1), ("TARGET TARGET", 2)])
def test_edit_file_occurrences(ws, text, found):
    (ws / "f.txt").write_bytes(text.encode() + b"\r\n")
    out = edit_file.run({"path": "f.txt", "old": "TARGET", "new": "done"}, make_ctx(ws))
    if found == 1:
        assert out == ToolOutcome("edited 'f.txt': replaced 1 occurrence", is_error=False)
        assert (ws / "f.txt").read_bytes() == b"a done b\r\n"
    else:
        assert out.is_error
        assert f"found {found} times" in out.output
        assert (ws / "f.txt").read_bytes() == text.encode() + b"\r\n"


def test_list_files(ws):
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref")
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "m.py").write_text("")
    (ws / "src" / "a.py").write_text("")
    (ws / "README").write_text("")
    (ws / ".env").write_text("")
    out = list_files.run({}, make_ctx(ws))
    assert out == ToolOutcome(".env\nREADME\nsrc/\nsrc/a.py\nsrc/pkg/\nsrc/pkg/m.py", is_error=False)
    out = list_files.run({"path": "src/pkg"}, make_ctx(ws))
    assert out.output == "src/pkg/m.py"
    assert list_files.run({"path": "README"}, make_ctx(ws)).is_error


def test_list_files_caps_entries(ws):
    for i in range(2005):
        (ws / f"f{i:04d}").write_text("")
    out = list_files.run({"path": "."}, make_ctx(ws))
    lines = out.output.splitlines()
    assert len(lines) == 2001
    assert lines[0] == "f0000" and lines[1999] == "f1999"
    assert "truncated at 2000 entries" in lines[-1]


# --- shell ---------------------------------------------------------------------


def test_shell_output_and_exit_code(ws):
    out = shell.run({"command": "echo out; echo err >&2; pwd"}, make_ctx(ws))
    assert out == ToolOutcome(f"out\nerr\n{ws}\n[exit code 0]", is_error=False)
    out = shell.run({"command": "echo failing; exit 3"}, make_ctx(ws))
    assert out == ToolOutcome("failing\n[exit code 3]", is_error=True)


def test_shell_decodes_invalid_utf8(ws):
    out = shell.run({"command": r"printf 'a\377b'"}, make_ctx(ws))
    assert out.output == "a\ufffdb\n[exit code 0]"


def test_shell_stdin_is_devnull(ws):
    out = shell.run({"command": "cat; echo end"}, make_ctx(ws, timeout_s=10))
    assert out == ToolOutcome("end\n[exit code 0]", is_error=False)


def test_shell_runs_in_own_process_group(ws):
    cmd = f"{sys.executable} -c 'import os; print(os.getpgrp(), os.getsid(0))'; echo $$"
    out = shell.run({"command": cmd}, make_ctx(ws))
    pgrp, sid, sh_pid = out.output.split()[:3]
    assert pgrp == sid == sh_pid
    assert int(pgrp) != os.getpgrp()


def test_shell_output_cap(ws):
    cmd = "head -c 3000 /dev/zero | tr '\\0' a; head -c 2000 /dev/zero | tr '\\0' b"
    out = shell.run({"command": cmd}, make_ctx(ws, output_cap=1000))
    assert out.output == "a" * 500 + "\n[output truncated: 4000 bytes omitted]\n" + "b" * 500 + "\n[exit code 0]"
    assert not out.is_error


def test_shell_removes_secret_env(ws, monkeypatch):
    monkeypatch.setenv("KXEN_TEST_SECRET", "s3cr3t-value-xyz")
    monkeypatch.setenv("KXEN_TEST_VISIBLE", "visible-1")
    ctx = make_ctx(ws, secret_env_names=("KXEN_TEST_SECRET",))
    out = shell.run({"command": "env"}, ctx)
    assert "KXEN_TEST_VISIBLE=visible-1" in out.output
    assert "KXEN_TEST_SECRET" not in out.output
    # A secret that reaches the output another way is redacted.
    out = shell.run({"command": "echo s3cr3t-value-xyz"}, ctx)
    assert out.output == "[REDACTED]\n[exit code 0]"


def test_shell_drops_credential_looking_variables_unless_the_policy_keeps_them(ws, monkeypatch):
    for name, value in (("GITHUB_TOKEN", "ghp_" + "A1" * 18), ("MY_SERVICE_PASSWORD", "hunter2hunter2"),
                        ("aws_secret_access_key", "wJalrXUtnFEMIK7MDENGbPxRfiCY"), ("DEPLOY_PAT", "patpatpat99"),
                        ("SHORT_KEY", "abc"), ("KXEN_PLAIN", "plain-value-1")):
        monkeypatch.setenv(name, value)
    out = shell.run({"command": "env"}, make_ctx(ws, env_keep=()))
    assert "KXEN_PLAIN=plain-value-1" in out.output
    for name in ("GITHUB_TOKEN", "MY_SERVICE_PASSWORD", "aws_secret_access_key", "DEPLOY_PAT", "SHORT_KEY"):
        assert name not in out.output
    # Kept by name or by a * pattern: in the environment, but its value never in the output.
    out = shell.run({"command": "env; echo n=${#GITHUB_TOKEN}"}, make_ctx(ws, env_keep=("GITHUB_*", "SHORT_KEY")))
    assert "GITHUB_TOKEN=[REDACTED]" in out.output and "n=40" in out.output
    assert "SHORT_KEY=abc" in out.output  # under 8 characters: not redacted
    assert "MY_SERVICE_PASSWORD" not in out.output and "ghp_" not in out.output


def test_a_version_1_lock_keeps_every_variable_but_redacts_their_values(ws, monkeypatch):
    """env_keep None (a lock written before the rule): the environment is as it was, the output is redacted."""
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "hunter2hunter2")
    out = shell.run({"command": "env"}, make_ctx(ws, env_keep=None))
    assert "MY_SERVICE_PASSWORD=[REDACTED]" in out.output and "hunter2" not in out.output


def test_the_api_keys_variable_is_dropped_even_if_a_pattern_would_keep_it(ws, monkeypatch):
    monkeypatch.setenv("KXEN_TEST_API_KEY", "sk-provider-key-0123456789abcdef")
    out = shell.run({"command": "env"}, make_ctx(ws, secret_env_names=("KXEN_TEST_API_KEY",), env_keep=("*",)))
    assert "KXEN_TEST_API_KEY" not in out.output


def test_read_file_redacts_token_formats_and_url_userinfo(ws):
    (ws / "notes.txt").write_text("remote https://bob:ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/o/r\n"
                                  "aws AKIAIOSFODNN7EXAMPLE\n")
    out = read_file.run({"path": "notes.txt"}, make_ctx(ws))
    assert out.output == "remote https://***@github.com/o/r\naws [REDACTED]\n"


def test_shell_timeout_kills_the_group(ws):
    cmd = "sleep 60 & echo $! > bg.pid; echo $$ > sh.pid; echo started; sleep 60"
    t0 = time.monotonic()
    out = shell.run({"command": cmd}, make_ctx(ws, timeout_s=0.5, cancel_window_s=2))
    assert time.monotonic() - t0 < 10
    assert out.is_error
    assert out.output.startswith("started\n")
    assert "[timed out after 0.5s" in out.output and "partial effects" in out.output
    for name in ("bg.pid", "sh.pid"):
        assert not pid_alive(read_pid(ws / name)), name


def test_shell_timeout_escalates_to_sigkill(ws):
    cmd = "trap '' TERM INT; echo $$ > sh.pid; sleep 60"
    out = shell.run({"command": cmd}, make_ctx(ws, timeout_s=0.5, cancel_window_s=0.3))
    assert out.is_error and "SIGKILL" in out.output
    assert not pid_alive(read_pid(ws / "sh.pid"))


def test_shell_background_processes_do_not_outlive_the_call(ws):
    t0 = time.monotonic()
    out = shell.run({"command": "sleep 60 & echo $! > bg.pid; echo done"}, make_ctx(ws))
    assert time.monotonic() - t0 < 10
    assert out.output.startswith("done\n") and out.output.endswith("[exit code 0]")
    assert not pid_alive(read_pid(ws / "bg.pid"))


def cancel_when(path: Path, ctx: ToolContext) -> threading.Thread:
    """Set ctx.cancel once the command has written ``path`` (it is running)."""

    def go() -> None:
        wait_for(path.exists)
        ctx.cancel.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_cancel_cooperative_command(ws):
    ctx = make_ctx(ws, cancel_window_s=5)
    canceller = cancel_when(ws / "sh.pid", ctx)
    t0 = time.monotonic()
    out = shell.run({"command": "echo $$ > sh.pid; echo working; sleep 30"}, ctx)
    elapsed = time.monotonic() - t0
    canceller.join()
    assert elapsed < 5
    assert out.is_error
    assert out.output.startswith("working\n")
    assert "[canceled" in out.output
    assert not pid_alive(read_pid(ws / "sh.pid"))


def test_cancel_stubborn_command_is_outcome_unknown(ws):
    ctx = make_ctx(ws, cancel_window_s=0.5)
    canceller = cancel_when(ws / "sh.pid", ctx)
    cmd = "trap '' TERM INT; sleep 30 & echo $! > bg.pid; echo $$ > sh.pid; echo stubborn; wait"
    t0 = time.monotonic()
    with pytest.raises(ToolOutcomeUnknown) as info:
        shell.run({"command": cmd}, ctx)
    elapsed = time.monotonic() - t0
    canceller.join()
    assert 0.5 <= elapsed < 10
    assert "SIGKILL" in info.value.message
    assert "stubborn" in info.value.output
    assert not pid_alive(read_pid(ws / "sh.pid"))
    assert not pid_alive(read_pid(ws / "bg.pid"))


def test_shell_leaves_no_reader_threads(ws):
    before = {t.ident for t in threading.enumerate()}
    shell.run({"command": "echo hi"}, make_ctx(ws))
    shell.run({"command": "sleep 60"}, make_ctx(ws, timeout_s=0.2, cancel_window_s=1))
    leftover = [t for t in threading.enumerate() if t.ident not in before and t.name == "kxen-shell-reader"]
    assert leftover == []


def test_shell_stubborn_background_process_is_killed(ws):
    cmd = "(trap '' TERM INT; echo $$ > /dev/null; exec sleep 60) & echo $! > bg.pid; echo done"
    out = shell.run({"command": cmd}, make_ctx(ws, cancel_window_s=0.3))
    assert out.output.startswith("done\n") and "terminated" in out.output
    assert not pid_alive(read_pid(ws / "bg.pid"))
