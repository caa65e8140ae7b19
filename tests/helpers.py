"""Test helpers for end-to-end tests: real Git workspaces, agent definitions,
and the installed ``kxen-agent`` CLI run as a subprocess.

Everything here touches real files and real processes; nothing is mocked.
The CLI under test is the console script next to the interpreter running
the tests (the project's venv), so an editable install is tested as users
run it.

This is the one CLI driver of the suite: :func:`kxen_argv` (the argv),
:func:`cli_env` (an environment that lets nothing of this machine in),
:func:`run_kxen` (run to the end), :func:`spawn_kxen` (start, to signal or
race it) and :class:`Cli` (the three bound to one state dir). Other test
files wrap these rather than build their own ``subprocess`` calls.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "CLI_TIMEOUT_S",
    "KXEN_AGENT",
    "LONG_ENV",
    "REQUIRE_TOOLS_ENV",
    "Cli",
    "Proc",
    "agent_toml",
    "cli_env",
    "depth",
    "git",
    "git_workspace",
    "kxen_argv",
    "long_mode",
    "object_bytes",
    "read_lines",
    "require_tools",
    "run_kxen",
    "spawn_kxen",
    "tool_result_counts",
    "wait_for_file",
    "write_agent",
]

#: The installed console script, next to the interpreter running the tests.
KXEN_AGENT = str(Path(sys.executable).with_name("kxen-agent"))

#: No CLI call in these tests should take anywhere near this; a hang fails the test.
CLI_TIMEOUT_S = 60

_GIT_ID = ["-c", "user.name=kxen test", "-c", "user.email=test@kxen.invalid", "-c", "commit.gpgsign=false"]


#: Set to 1 (as ``.ci/run`` does), a missing standard tool fails the test instead of skipping it.
REQUIRE_TOOLS_ENV = "KXEN_AGENT_REQUIRE_TOOLS"


#: Set to 1, the tests that sample (torture trials, race rounds, fault variants, examples)
#: run at their full depth; unset, at a depth that keeps the whole suite within its budget.
LONG_ENV = "KXEN_TEST_LONG"


def long_mode() -> bool:
    """True under ``KXEN_TEST_LONG=1`` (or the older ``KXEN_RELIABILITY_LONG=1``, which it implies)."""
    return any(os.environ.get(k, "") not in ("", "0") for k in (LONG_ENV, "KXEN_RELIABILITY_LONG"))


def depth(*, fast: int, long: int) -> int:
    """How many trials, rounds or cases a sampling test runs: ``long`` in the long mode, else ``fast``."""
    return long if long_mode() else fast


def require_tools(*tools: str) -> None:
    """Skip the calling test unless every command in ``tools`` is on PATH.

    The tests that check objects with the standard tools (``zstd``, ``b3sum``)
    trust no code of the store, so they need the real commands. A fresh machine
    often lacks ``b3sum``: there the test is skipped and pytest's ``-rs``
    summary says which tool is missing. CI must not lose the check silently:
    with ``KXEN_AGENT_REQUIRE_TOOLS=1`` a missing tool fails the test.
    Call it first in the test, before any work; the ``tools`` marker
    (``@pytest.mark.tools("zstd", "b3sum")``) does the same at setup.
    """
    import pytest  # here, not at the top: the helpers are also imported by plain scripts (torture.py)

    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    what = f"{' and '.join(missing)} not on PATH (objects are checked with the standard tools; " \
           f"install {' '.join(missing)}, as .ci/run does)"
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(f"{what}; {REQUIRE_TOOLS_ENV}=1 requires them", pytrace=False)
    # Reported at the test's own line (as a skip marker is), so -rs lists each
    # skipped test rather than one line for this helper.
    raise pytest.skip.Exception(what, _use_item_location=True)


def git(cwd: Path | str, *args: str) -> str:
    """Run git with a fixed identity; return stdout (raises on failure)."""
    done = subprocess.run(["git", *_GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def git_workspace(path: Path, files: Mapping[str, str] | None = None) -> Path:
    """A Git repository at ``path`` with one commit holding ``files`` (default: a README)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "# test workspace\n"}).items():
        f = path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def _toml_value(v: Any) -> str:
    # json.dumps of str/int/float/bool/list is valid TOML for these values.
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def agent_toml(
    *,
    name: str = "test-agent",
    provider: str = "script",
    script: str | None = "steps.json",
    tools: Sequence[str] = ("shell", "read_file", "write_file", "edit_file", "list_files"),
    policy: Mapping[str, Any] | None = None,
    **keys: Any,
) -> str:
    """The text of an agent definition; ``keys`` are extra top-level keys (model, base_url, ...)."""
    lines = [f"name = {_toml_value(name)}", f"provider = {_toml_value(provider)}"]
    if script is not None:
        lines.append(f"script = {_toml_value(script)}")
    for k, v in keys.items():
        lines.append(f"{k} = {_toml_value(v)}")
    lines.append(f"tools = {_toml_value(list(tools))}")
    pol = {"max_turns": 10, "tool_timeout_s": 20, "cancel_window_s": 1, **(policy or {})}
    lines.append("[policy]")
    lines.extend(f"{k} = {_toml_value(v)}" for k, v in pol.items())
    return "\n".join(lines) + "\n"


def write_agent(directory: Path, steps: list[dict] | None = None, **kw: Any) -> Path:
    """Write ``agent.toml`` (and ``steps.json`` for the script provider) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    if steps is not None:
        (directory / "steps.json").write_text(json.dumps(steps, indent=1))
    if kw.get("provider", "script") != "script":
        kw.setdefault("script", None)
    path = directory / "agent.toml"
    path.write_text(agent_toml(**kw))
    return path


@dataclass(frozen=True)
class Proc:
    """One finished CLI process."""

    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        try:
            return json.loads(self.out)
        except json.JSONDecodeError as e:
            raise AssertionError(f"not JSON ({e}) from {self}") from None

    def jsonl(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL

    def __str__(self) -> str:
        return f"kxen-agent {' '.join(self.args)} -> rc {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def kxen_argv(*args: str) -> list[str]:
    """The argv that runs ``kxen-agent ARGS`` as a user would: the installed console script."""
    return [KXEN_AGENT, *args]


def cli_env(state_dir: Path | str | None = None, extra: Mapping[str, str] | None = None, *,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI under test: nothing of the machine running the tests leaks in.

    No ``KXEN_AGENT_*`` variable of the caller (a fault point, a state dir, a
    key); no proxy (the fake model and Git servers listen on 127.0.0.1); no
    default agent from the machine (``XDG_CONFIG_HOME`` next to the state
    dir). ``extra`` comes last and wins.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("KXEN_AGENT_")}
    for k in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if state_dir is not None:
        env["KXEN_AGENT_STATE_DIR"] = str(state_dir)
        env["XDG_CONFIG_HOME"] = str(Path(state_dir).parent / "xdg-config")
    env.update(extra or {})
    return env


def run_kxen(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | str | None = None,
             expect: int | None = None, timeout: float = CLI_TIMEOUT_S, **run_kw: Any) -> Proc:
    """Run ``kxen-agent ARGS`` to the end (text output captured); with ``expect``, assert the exit code.

    ``run_kw`` goes to :func:`subprocess.run` (``input``, ``stdin``, ``umask``...).
    A hang past ``timeout`` fails the test.
    """
    done = subprocess.run(kxen_argv(*args), capture_output=True, text=True, env=dict(env), cwd=cwd,
                          timeout=timeout, **run_kw)
    p = Proc(tuple(args), done.returncode, done.stdout, done.stderr)
    if expect is not None:
        assert p.rc == expect, str(p)
    return p


def spawn_kxen(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | str | None = None,
               **popen_kw: Any) -> subprocess.Popen:
    """Start ``kxen-agent ARGS`` without waiting (to signal it, race it, feed it a terminal).

    Text pipes for stdout and stderr unless ``popen_kw`` says otherwise
    (files, a pty, ``start_new_session``...). The caller reaps it.
    """
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    if "text" not in popen_kw and "encoding" not in popen_kw and "universal_newlines" not in popen_kw:
        popen_kw["text"] = True
    return subprocess.Popen(kxen_argv(*args), env=dict(env), cwd=cwd, **popen_kw)


class Cli:
    """The installed CLI bound to one state dir and a base environment (:func:`cli_env`).

    ``strict``: every call fails the test if stderr shows a traceback (a
    user never sees one, whatever they type).
    """

    def __init__(self, state_dir: Path, env: Mapping[str, str] | None = None, *, strict: bool = False) -> None:
        self.state_dir = state_dir
        self.env = cli_env(state_dir, env)
        self.strict = strict
        self.spawned: list[subprocess.Popen[str]] = []

    def __call__(self, *args: str, env: Mapping[str, str] | None = None, expect: int | None = None,
                 cwd: Path | str | None = None, **run_kw: Any) -> Proc:
        """Run ``kxen-agent ARGS``; with ``expect``, assert the exit code (showing the output if not)."""
        p = run_kxen(args, env={**self.env, **(env or {})}, cwd=cwd, expect=expect, **run_kw)
        if self.strict:
            assert "Traceback" not in p.err, str(p)
        return p

    def refused(self, *args: str, code: int | None = None, cwd: Path | str | None = None,
                env: Mapping[str, str] | None = None) -> str:
        """Run a command that must be refused (exit ``code``, or any non-zero); return its one-line error."""
        p = self(*args, cwd=cwd, env=env)
        assert p.rc != 0 if code is None else p.rc == code, str(p)
        assert "Traceback" not in p.err, str(p)
        lines = p.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kxen-agent: error: "), str(p)
        return lines[0]

    def spawn(self, *args: str, env: Mapping[str, str] | None = None, **popen_kw: Any) -> subprocess.Popen[str]:
        """Start ``kxen-agent ARGS`` without waiting (to signal it); text pipes unless told otherwise."""
        proc = spawn_kxen(args, env={**self.env, **(env or {})}, **popen_kw)
        self.spawned.append(proc)
        return proc

    def kill_spawned(self) -> None:
        """SIGKILL whatever :meth:`spawn` started that is still running (a failed test's leftovers)."""
        for proc in self.spawned:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    # ------------------------------------------------------------ conveniences

    def run_json(self, workspace: Path, task: str, agent: Path, *, env: Mapping[str, str] | None = None,
                 expect: int | None = None) -> Proc:
        return self("run", "--workspace", str(workspace), "--task", task, "--agent", str(agent), "--json",
                    env=env, expect=expect)

    def resume(self, ses: str, *extra: str, env: Mapping[str, str] | None = None, expect: int | None = None) -> Proc:
        return self("--resume", ses, *extra, "--json", env=env, expect=expect)

    def run_show(self, ses: str, run: str) -> dict:
        return self("run", "show", ses, run, "--json", expect=0).json()

    def session_show(self, ses: str) -> dict:
        return self("session", "show", ses, "--json", expect=0).json()

    def log(self, ses: str) -> list[dict]:
        return self("session", "log", ses, "--json", expect=0).jsonl()

    def sessions(self) -> list[dict]:
        return self("session", "list", "--json", expect=0).json()["sessions"]

    def fsck_clean(self) -> None:
        p = self("fsck", "--json")
        assert p.rc == 0, str(p)
        rep = p.json()
        assert rep["clean"] and rep["problems"] == [], rep


def tool_result_counts(log: Iterable[dict]) -> tuple[list[str], Counter]:
    """(every tool call id asked for by an assistant message, tool messages per toolCallId)."""
    asked: list[str] = []
    results: Counter = Counter()
    for m in log:
        if m["role"] == "assistant":
            asked.extend(c["id"] for c in m["toolCalls"])
        elif m["role"] == "tool":
            results[m["toolCallId"]] += 1
    return asked, results


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout_s: float = 30) -> None:
    """Block until ``path`` exists (the process under test reached that point).

    This is synchronization on an event the test needs, not a sleep that
    hides a race: it fails if the process exits first or the deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited ({proc.returncode}) before {path} appeared\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s}s")
        time.sleep(0.01)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def object_bytes(state_dir: Path) -> Iterable[tuple[Path, bytes]]:
    """Every file in the state dir with its content; loose objects decompressed.

    Uses the ``zstd`` command line, not the store's own reader, so the check
    does not trust the code under test (without ``zstd`` the test is skipped,
    see :func:`require_tools`).
    """
    require_tools("zstd")
    for path in sorted(p for p in state_dir.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        if path.parent.parent.name == "objects" and len(path.name) == 62:
            raw = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
        elif path.parent.parent.name == "steps":
            raw += b"".join(step_log_frames(raw))
        yield path, raw


#: The first four bytes of every zstd frame (RFC 8878).
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def step_log_frames(raw: bytes) -> list[bytes]:
    """The decompressed objects of a step log's entries, found by the layout of objects_spec.md §6.8 alone.

    Each entry is a 32-byte id, a 4-byte big-endian frame length and the
    frame: every zstd magic preceded by a length that ends inside the file
    is tried with the ``zstd`` command line (a false match fails to
    decompress and is passed over), so no code of the store is trusted.
    """
    out = []
    at = raw.find(ZSTD_MAGIC)
    while at != -1:
        if at >= 36:
            n = int.from_bytes(raw[at - 4:at], "big")
            if at + n <= len(raw):
                p = subprocess.run(["zstd", "-dc"], input=raw[at:at + n], capture_output=True)
                if p.returncode == 0:
                    out.append(p.stdout)
        at = raw.find(ZSTD_MAGIC, at + 1)
    return out
