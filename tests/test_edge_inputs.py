"""Bad and hostile inputs at the edges of the CLI, end to end.

Each case found by an audit: the installed ``kxen-agent`` as a subprocess,
real files (a FIFO from ``os.mkfifo``, symlinks, oversized and deeply
nested definitions), real Git workspaces. The rule checked everywhere: bad
input gets ONE line on stderr starting ``kxen-agent: error:``, a non-zero
exit, no traceback, and changes nothing — no half-written file, no new
state dir, no orphan session.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kxen_agent.session.agent_def import MAX_DEFINITION_BYTES, MAX_STEPS_BYTES, AgentDefinitionError, parse_agent_definition
from kxen_agent.store.objects import MAX_OBJECT_SIZE
from tests.helpers import Cli, Proc, git_workspace, spawn_kxen, write_agent

STEPS = [{"content": "done"}]
ESC = "\x1b"


def refused(p: Proc, rc: int) -> str:
    """The one error line of a refused command (exit ``rc``, nothing on stdout)."""
    assert p.rc == rc, str(p)
    assert "Traceback" not in p.err, str(p)
    lines = p.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kxen-agent: error: "), str(p)
    assert p.out == "", str(p)
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: file contents, or the kind of anything else."""
    snap: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        mode = p.lstat().st_mode
        snap[str(p.relative_to(root))] = p.read_bytes() if stat.S_ISREG(mode) else stat.filemode(mode)[0]
    return snap


def new_session(cli: Cli, workspace: Path, agent: Path, task: str = "first task") -> tuple[str, str]:
    res = cli.run_json(workspace, task, agent, expect=0).json()
    assert res["status"] == "completed", res
    return res["session"], res["run"]


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    return write_agent(tmp_path / "agent", steps=STEPS)


# ------------------------------------------------------------ 1. export to a non-regular path


def test_export_refuses_a_fifo_and_a_symlink_to_one_and_leaves_them_alone(cli: Cli, workspace: Path, agent: Path,
                                                                          tmp_path: Path) -> None:
    ses, _ = new_session(cli, workspace, agent)
    out = tmp_path / "out"
    out.mkdir()
    fifo = out / "bundle.fifo"
    os.mkfifo(fifo)
    link = out / "link.kxb"
    link.symlink_to(fifo)
    state_before = snapshot(cli.state_dir)
    for target, named in ((fifo, "it is a FIFO"), (link, f"{fifo} is a FIFO (the target of symlink {link})")):
        line = refused(cli("session", "export", ses, "-o", str(target)), 1)
        assert named in line and "not a regular file" in line and "nothing was written" in line, line
        assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO was replaced"
        assert link.is_symlink() and os.readlink(link) == str(fifo)
        assert sorted(x.name for x in out.iterdir()) == ["bundle.fifo", "link.kxb"], "a temp file was left"
    assert snapshot(cli.state_dir) == state_before


def test_export_refuses_a_directory(cli: Cli, workspace: Path, agent: Path, tmp_path: Path) -> None:
    ses, _ = new_session(cli, workspace, agent)
    d = tmp_path / "a-dir"
    d.mkdir()
    line = refused(cli("session", "export", ses, "-o", str(d)), 1)
    assert "is a directory" in line
    assert d.is_dir() and list(d.iterdir()) == []
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".kxen-bundle-tmp-")] == []


def test_export_through_a_symlink_replaces_its_target_and_keeps_the_link(cli: Cli, workspace: Path, agent: Path,
                                                                        tmp_path: Path) -> None:
    # As `git bundle create` does: the symlink is followed, the regular file it names replaced.
    ses, _ = new_session(cli, workspace, agent)
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "bundle.kxb"
    target.write_bytes(b"old contents")
    link = tmp_path / "link.kxb"
    link.symlink_to(target)
    cli("session", "export", ses, "-o", str(link), expect=0)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes().startswith(b"KXBUNDLE")
    info = cli("bundle", "verify", str(target), "--json", expect=0).json()
    assert info["refs"] and info["objects"] > 0
    assert sorted(x.name for x in real_dir.iterdir()) == ["bundle.kxb"]


# ------------------------------------------------------------ 2. agent definitions


def _definition(tmp_path: Path, text: str, steps: str | None = None) -> Path:
    d = tmp_path / "def"
    d.mkdir(exist_ok=True)
    if steps is not None:
        (d / "steps.json").write_text(steps)
    path = d / "agent.toml"
    path.write_text(text)
    return path


def _run_refused(cli: Cli, workspace: Path, agent: Path) -> str:
    line = refused(cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent)), 2)
    assert str(agent) in line, line
    assert not cli.state_dir.exists(), "a refused definition created the state dir"
    return line


@pytest.mark.parametrize("url, why", [("http://[::1", "Invalid IPv6 URL"), ("http://h:99999/v1", "Port out of range")])
def test_invalid_base_url_is_one_line_naming_the_file_and_key(cli: Cli, workspace: Path, tmp_path: Path,
                                                              url: str, why: str) -> None:
    agent = _definition(tmp_path, f'name = "x"\nprovider = "openai"\nmodel = "m"\nbase_url = "{url}"\n')
    line = _run_refused(cli, workspace, agent)
    assert "key 'base_url'" in line and why in line, line


def test_toml_nested_too_deeply(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = _definition(tmp_path, 'name = "x"\nprovider = "openai"\nmodel = "m"\ntools = ' + "[" * 2000 + "]" * 2000 + "\n")
    assert "nested too deeply" in _run_refused(cli, workspace, agent)


def test_steps_json_nested_too_deeply(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = _definition(tmp_path, 'name = "x"\nprovider = "script"\nscript = "steps.json"\n',
                        steps="[" * 100_000 + "]" * 100_000)
    line = _run_refused(cli, workspace, agent)
    assert "key 'script'" in line and "nested too deeply" in line, line


def test_steps_json_with_a_huge_integer_says_so_plainly(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = _definition(tmp_path, 'name = "x"\nprovider = "script"\nscript = "steps.json"\n',
                        steps='[{"content": "x", "tool_calls": [{"name": "shell", "arguments": {"n": ' + "9" * 5000 + "}}]}]")
    line = _run_refused(cli, workspace, agent)
    assert "integer of 5000 digits is too long" in line and "set_int_max_str_digits" not in line, line


def test_model_with_control_characters_is_refused(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    agent = _definition(tmp_path, 'name = "x"\nprovider = "openai"\nmodel = "a\\nb"\n')
    assert "key 'model'" in _run_refused(cli, workspace, agent)


def test_oversized_definition_is_refused_before_any_state_dir(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    head = 'name = "x"\nprovider = "script"\nscript = "steps.json"\nsystem = "'
    big = _definition(tmp_path, head + "a" * MAX_DEFINITION_BYTES + '"\n', steps=json.dumps(STEPS))
    line = _run_refused(cli, workspace, big)
    assert f"larger than the {MAX_DEFINITION_BYTES}-byte limit" in line, line
    # Just under the limit is a definition like any other.
    ok = _definition(tmp_path, head + "a" * (MAX_DEFINITION_BYTES - len(head) - 2) + '"\n')
    assert ok.stat().st_size == MAX_DEFINITION_BYTES
    res = cli.run_json(workspace, "t", ok, expect=0).json()
    assert res["status"] == "completed"
    assert len(cli.session_show(res["session"])["agentLock"]) == 64


def test_oversized_steps_file_is_refused_before_any_state_dir(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = json.dumps([{"content": "a" * MAX_STEPS_BYTES}])
    agent = _definition(tmp_path, 'name = "x"\nprovider = "script"\nscript = "steps.json"\n', steps=steps)
    line = _run_refused(cli, workspace, agent)
    assert f"larger than the {MAX_STEPS_BYTES}-byte limit" in line and "key 'script'" in line, line


def test_a_lock_over_the_object_limit_is_a_definition_error() -> None:
    # The file limits keep the CLI far from this; parse_agent_definition takes any text. A literal
    # string ('...'): tomllib reads a basic one ("...") a character at a time (34 s CPU for 64 MiB).
    text = 'name = "x"\nprovider = "openai"\nmodel = "m"\nsystem = \'' + "a" * MAX_OBJECT_SIZE + '\'\n'
    with pytest.raises(AgentDefinitionError) as e:
        parse_agent_definition(text, "/nonexistent", "big.toml")
    assert str(e.value).startswith("big.toml: ") and "object limit" in str(e.value)
    assert e.value.exit_code == 2


# ------------------------------------------------------------ 3. usage errors


@pytest.mark.parametrize("args, message, see", [
    (("session", "show"), "missing argument 'SES'", "kxen-agent session show"),
    (("session", "list", "--bogus"), "no such option: --bogus", "kxen-agent session list"),
    (("sesion", "list"), "no such command 'sesion'", "kxen-agent"),
    (("session",), "kxen-agent session needs a command: list, show", "kxen-agent session"),
    (("bundle",), "kxen-agent bundle needs a command: verify", "kxen-agent bundle"),
    (("gc", "--prune"), "option '--prune' requires an argument", "kxen-agent gc"),
    (("run", "resolve", "ses_00000000000000000000"), "missing argument '[RUN] OP'", "kxen-agent run resolve"),
])
def test_usage_errors_are_one_line(cli: Cli, args: tuple[str, ...], message: str, see: str) -> None:
    line = refused(cli(*args), 2)
    assert line.startswith(f"kxen-agent: error: {message}") and line.endswith(f" (see {see} --help)"), line
    assert "Usage:" not in line and "╭" not in line
    assert not cli.state_dir.exists()


def test_help_still_prints_and_exits_0(cli: Cli) -> None:
    for args in (("--help",), ("session", "--help"), ("session", "show", "-h"), ()):
        p = cli(*args, expect=0)
        assert "Usage" in p.out and p.err == "", str(p)


def test_log_into_a_closed_pipe_exits_141_silently(cli: Cli, workspace: Path, agent: Path, tmp_path: Path) -> None:
    task = tmp_path / "task.txt"
    task.write_text("".join(f"line {i}\n" for i in range(200_000)))  # far more than a pipe buffer
    res = cli("run", "--workspace", str(workspace), "--task-file", str(task), "--agent", str(agent), "--json",
              expect=0).json()
    proc = spawn_kxen(["session", "log", res["session"]], env=cli.env, text=False)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100)  # the log started...
    proc.stdout.close()  # ...and the reader went away, as `| head` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b"", err


# ------------------------------------------------------------ 4. lease TTL


@pytest.mark.parametrize("ttl", ["1e-300", "0.09", "0", "nan", "86401"])
def test_lease_ttl_out_of_range_is_refused_before_anything_is_created(cli: Cli, workspace: Path, agent: Path,
                                                                      ttl: str) -> None:
    p = cli.run_json(workspace, "t", agent, env={"KXEN_AGENT_LEASE_TTL_S": ttl})
    line = refused(p, 2)
    assert f"KXEN_AGENT_LEASE_TTL_S={ttl!r}" in line and "from 0.1 to 86400" in line, line
    assert not cli.state_dir.exists(), "a session was created before the TTL was checked"


def test_lease_ttl_in_range_runs(cli: Cli, workspace: Path, agent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run at the upper bound (a short TTL would make the test race the renewer on a loaded machine)...
    res = cli.run_json(workspace, "t", agent, env={"KXEN_AGENT_LEASE_TTL_S": "86400"}, expect=0).json()
    assert res["status"] == "completed"
    # ...and both bounds accepted as values.
    from kxen_agent.runtime.lease import lease_ttl_s

    for edge in ("0.1", "86400"):
        monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", edge)
        assert lease_ttl_s() == float(edge)


# ------------------------------------------------------------ 5. task and --output text


@pytest.mark.parametrize("task, why", [
    ("", "--task is empty"),
    (" \n\t ", "--task is empty"),
    ("fix \udcffit", "--task is not valid UTF-8 text (byte 0xff at character 4)"),
])
def test_bad_task_text_is_refused_before_any_session(cli: Cli, workspace: Path, agent: Path, task: str,
                                                     why: str) -> None:
    line = refused(cli.run_json(workspace, task, agent), 2)
    assert why in line, line
    assert not cli.state_dir.exists()


@pytest.mark.parametrize("content, why", [
    (b"", "is empty"),
    (b"   \n\n", "is empty"),
    (b"caf\xe9\n", "is not UTF-8 text (byte 3)"),
    (b"a" * (MAX_OBJECT_SIZE // 4 + 1), f"is over the {MAX_OBJECT_SIZE // 4}-byte task limit"),
    (b"a" * (MAX_OBJECT_SIZE + 1), f"is over the {MAX_OBJECT_SIZE // 4}-byte task limit"),
])
def test_bad_task_file_is_refused_before_any_session(cli: Cli, workspace: Path, agent: Path, tmp_path: Path,
                                                     content: bytes, why: str) -> None:
    task = tmp_path / "task.md"
    task.write_bytes(content)
    p = cli("run", "--workspace", str(workspace), "--task-file", str(task), "--agent", str(agent))
    line = refused(p, 2)
    assert f"task file {task} {why}" in line, line
    assert not cli.state_dir.exists()


def test_bad_task_on_resume_changes_nothing(cli: Cli, workspace: Path, agent: Path) -> None:
    ses, _ = new_session(cli, workspace, agent)
    before = snapshot(cli.state_dir)
    for task in ("", "  ", "\udcfe"):
        refused(cli("--resume", ses, "--task", task), 2)
    assert snapshot(cli.state_dir) == before


def test_resolve_output_that_is_not_utf8_changes_nothing(cli: Cli, workspace: Path, agent: Path) -> None:
    ses, run = new_session(cli, workspace, agent)
    before = snapshot(cli.state_dir)
    line = refused(cli("run", "resolve", ses, run, "op_0000", "--output", "a\udcffb"), 2)
    assert "--output is not valid UTF-8 text (byte 0xff at character 1)" in line, line
    assert snapshot(cli.state_dir) == before


# ------------------------------------------------------------ 6. stored text on the terminal

HOSTILE = f"{ESC}]0;pwned\a{ESC}[2J\u009b31m\u202etxt.exe"


def _no_terminal_controls(text: str) -> None:
    for ch in (ESC, "\a", "\r", "\u009b", "\u202e"):
        assert ch not in text, f"{ch!r} reached the terminal in:\n{text}"


def test_stored_text_is_escaped_in_human_output_and_exact_in_json(cli: Cli, tmp_path: Path, agent: Path) -> None:
    # A workspace path and a task holding escape sequences, a C1 CSI and a
    # right-to-left override: all stored as given, none printed raw.
    workspace = git_workspace(tmp_path / f"ws{HOSTILE}")
    task = f"first line {HOSTILE}\n\tsecond\rline"
    ses, run = new_session(cli, workspace, agent, task)
    escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202etxt.exe"

    outputs = {
        "session list": cli("session", "list", expect=0),
        "session show": cli("session", "show", ses, expect=0),
        "session tree": cli("session", "tree", ses, expect=0),
        "session log": cli("session", "log", ses, expect=0),
        "run show": cli("run", "show", ses, run, expect=0),
    }
    for name, p in outputs.items():
        _no_terminal_controls(p.out + p.err)
        assert escaped in p.out, f"{name}: {p.out}"
    # One line each, quoted as git quotes a path.
    assert f'  workspace:    "{workspace.parent}/ws{escaped}"' in outputs["session show"].out.splitlines()
    # A message is a block: its newline and tab stay, the carriage return is escaped.
    log = outputs["session log"].out.splitlines()
    assert f"    first line {escaped}" in log and "    \tsecond\\rline" in log, log
    # run show prints the multi-line task as a block too.
    assert "task:" in outputs["run show"].out.splitlines()

    # JSON is exact: the same strings, with escapes a JSON reader undoes.
    show = cli("session", "show", ses, "--json", expect=0)
    _no_terminal_controls(show.out)
    assert show.json()["workspace"]["root"] == str(workspace)
    assert show.json()["runs"][0]["task"] == task
    log_json = cli("session", "log", ses, "--json", expect=0)
    _no_terminal_controls(log_json.out)
    assert log_json.jsonl()[0]["content"] == task


def test_error_lines_escape_what_they_quote(cli: Cli, agent: Path, tmp_path: Path) -> None:
    missing = tmp_path / f"no{HOSTILE}"
    line = refused(cli("run", "--workspace", str(missing), "--task", "t", "--agent", str(agent)), 2)
    _no_terminal_controls(line)
    assert "\\x1b]0;pwned" in line, line
    line = refused(cli("session", "show", f"ses_{ESC}[31m"), 2)
    _no_terminal_controls(line)


def test_fsck_escapes_stray_file_names(cli: Cli, workspace: Path, agent: Path) -> None:
    new_session(cli, workspace, agent)
    stray = cli.state_dir / "refs" / f"tmp_{ESC}[31mred"
    stray.write_bytes(b"")
    p = cli("fsck")
    _no_terminal_controls(p.out + p.err)
    assert f"stray file \"{stray.parent}/tmp_\\x1b[31mred\"" in p.out, str(p)


# ------------------------------------------------------------ 7. gc --prune bounds


@pytest.mark.parametrize("prune", ["99999999999999999999w", "5218w", "9" * 400 + "s", "9" * 5000 + "d"])
def test_gc_prune_past_100_years_is_refused(cli: Cli, prune: str) -> None:
    line = refused(cli("gc", f"--prune={prune}"), 2)
    assert "longer than 100 years" in line and "--prune=never" in line, line
    assert len(line) < 300
    assert not cli.state_dir.exists()


def test_gc_prune_up_to_100_years_is_accepted(cli: Cli, workspace: Path, agent: Path) -> None:
    new_session(cli, workspace, agent)
    rep = cli("gc", "--prune=5217w", "--json", expect=0).json()
    assert rep["prune"] == "5217w" and rep["pruned"] == 0


# ------------------------------------------------------------ I/O errors name their file


def test_a_directory_where_the_lease_record_belongs_is_named(cli: Cli, workspace: Path, agent: Path) -> None:
    ses, _ = new_session(cli, workspace, agent)
    record = cli.state_dir / "leases" / "sessions" / ses
    if record.exists():
        record.unlink()
    record.mkdir()
    line = refused(cli("--resume", ses, "--task", "again"), 1)
    assert str(record) in line and "Is a directory" in line, line


def test_a_workspace_path_that_is_not_utf8_is_named(cli: Cli, agent: Path, tmp_path: Path) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"ws-\xff")
    os.mkdir(odd)
    p = cli("run", "--workspace", os.fsdecode(odd), "--task", "t", "--agent", str(agent))
    line = refused(p, 1)
    assert "ws-\\xff" in line and "not a UTF-8 path" in line, line
    assert not cli.state_dir.exists()
