"""The tools an agent run executes in a workspace.

This module owns the tool set (``shell``, ``read_file``, ``write_file``,
``edit_file``, ``list_files``), their JSON-schema specs for OpenAI function
calling, workspace confinement of paths, and the process-group discipline of
``shell``: timeouts, cancellation and the :class:`ToolOutcomeUnknown` verdict.

It must never journal, retry or decide what a run does next: a tool reports
one :class:`ToolOutcome` (or raises :class:`ToolOutcomeUnknown`) and the
runtime decides. Bad arguments and refused paths are outcomes the model can
read and correct, never exceptions.

Limitations:

- Confinement resolves a path once, then uses it; a process that swaps a
  directory for a symlink between the check and the use (e.g. a background
  ``shell`` command) can win that race. Tools run one at a time and ``shell``
  leaves no process of its group behind, which keeps that window closed in
  practice, not in principle.
- A process that leaves the group on purpose (``setsid``, a double fork into a
  new session) escapes the kill; if it holds the output pipe open, ``shell``
  stops reading and says so.
- Process liveness uses ``/proc`` when present to tell zombies (dead, waiting
  for a reaper) from live processes; elsewhere a zombie counts as alive.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kxen_agent.errors import UsageError

__all__ = [
    "TOOLS",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolOutcomeUnknown",
    "redact",
    "tool_specs",
]

REDACTED = "[REDACTED]"
LIST_FILES_MAX_ENTRIES = 2000
# How often shell checks cancel/timeout while the command runs: short enough
# that Ctrl-C feels immediate, long enough not to burn a core.
_POLL_S = 0.02
# After SIGKILL the kernel tears the group down promptly; longer than this
# means something (an uninterruptible sleep) holds a process, and we cannot
# claim to know the outcome.
_KILL_GRACE_S = 5.0
# How long the output reader keeps draining a still-busy pipe once told to stop.
_DRAIN_S = 1.0


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool reports back to the model; ``is_error`` marks a failure."""

    output: str
    is_error: bool


class ToolOutcomeUnknown(Exception):
    """A tool had to be killed after the cancellation window and its effect
    cannot be proven; the runtime must record the call as outcome-unknown.

    ``output`` is whatever the tool produced before it was killed.
    """

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.output = output


@dataclass
class ToolContext:
    """Where and under which limits a tool runs.

    ``workspace`` is the realpath of the workspace root; ``cancel`` is set by
    the runtime on Ctrl-C/SIGTERM; ``secret_env_names`` are removed from the
    shell's environment and their values redacted from tool output.
    """

    workspace: str
    timeout_s: float
    cancel_window_s: float
    cancel: threading.Event
    secret_env_names: tuple[str, ...]
    output_cap: int = 64 * 1024

    def secret_values(self) -> list[str]:
        """The current values of the secret env vars (for redaction)."""
        return [os.environ[n] for n in self.secret_env_names if os.environ.get(n)]


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call; ``side_effects`` says whether running it can
    change the workspace (the journal must treat those calls as effects)."""

    name: str
    side_effects: bool
    description: str
    parameters: dict[str, Any]

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome: ...


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret of 4+ characters with ``[REDACTED]``.

    Shorter secrets are left alone: replacing "ab" everywhere would shred the
    output and reveal the secret by its gaps anyway.
    """
    # Longest first, so a secret containing another is replaced whole.
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def tool_specs(names: Iterable[str]) -> list[dict[str, Any]]:
    """The OpenAI function-calling specs of the named tools, in the given order."""
    specs: list[dict[str, Any]] = []
    for name in names:
        tool = TOOLS.get(name)
        if tool is None:
            known = ", ".join(sorted(TOOLS))
            raise UsageError(f"unknown tool '{name}'; known tools: {known}")
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
        )
    return specs


# --- arguments and paths ---------------------------------------------------


class _BadArguments(Exception):
    """Internal: an argument problem to report as an error outcome."""


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "boolean": bool}


def _check_arguments(tool: str, arguments: object, schema: Mapping[str, Any]) -> dict[str, Any]:
    """Validate arguments against the tool's flat JSON schema; defaults filled in."""
    if not isinstance(arguments, dict):
        raise _BadArguments(
            f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}"
        )
    props: Mapping[str, Any] = schema["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise _BadArguments(
            f"{tool}: unknown argument(s) {', '.join(unknown)}; expected: {', '.join(props)}"
        )
    out: dict[str, Any] = {}
    for key, prop in props.items():
        if key not in arguments:
            if key in schema.get("required", ()):
                raise _BadArguments(f"{tool}: missing required argument '{key}'")
            if "default" in prop:
                out[key] = prop["default"]
            continue
        value = arguments[key]
        want = prop["type"]
        # bool is an int in Python; JSON says otherwise.
        if not isinstance(value, _JSON_TYPES[want]) or (want == "integer" and isinstance(value, bool)):
            raise _BadArguments(
                f"{tool}: argument '{key}' must be a {want}, got {type(value).__name__}"
            )
        out[key] = value
    return out


def _resolve(path: str, ctx: ToolContext) -> str:
    """The realpath of ``path`` (relative to the workspace), refused if outside it."""
    root = os.path.realpath(ctx.workspace)
    if "\x00" in path:
        raise _BadArguments(f"path {path!r} contains a NUL byte")
    joined = path if os.path.isabs(path) else os.path.join(root, path)
    # realpath follows symlinks, so a link inside pointing outside is caught too.
    real = os.path.realpath(joined)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise _BadArguments(
            f"path '{path}' escapes the workspace '{root}'; use a path inside it"
        )
    return real


def _path_arguments(tool: "Tool", arguments: object, ctx: ToolContext) -> tuple[dict[str, Any], str] | ToolOutcome:
    """The file tools' common first step: checked arguments and the confined
    real path of ``arguments["path"]``, or the error outcome to return."""
    try:
        args = _check_arguments(tool.name, arguments, tool.parameters)
        return args, _resolve(args["path"], ctx)
    except _BadArguments as e:
        return ToolOutcome(str(e), is_error=True)


def _display(real: str, ctx: ToolContext) -> str:
    rel = os.path.relpath(real, os.path.realpath(ctx.workspace))
    return "." if rel == os.curdir else rel


def _atomic_write(real: str, data: bytes) -> None:
    """Write ``data`` to ``real`` via a temp file in the same directory + os.replace,
    so a crash leaves either the old file or the new one, never half of one."""
    directory, base = os.path.split(real)
    tmp = os.path.join(directory, f".{base}.kxen-{uuid.uuid4().hex}.tmp")
    # 0o666 through the umask: a new file gets the mode any editor would give it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, os.stat(real).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _os_error(action: str, path: str, exc: OSError) -> ToolOutcome:
    return ToolOutcome(f"cannot {action} '{path}': {exc.strerror or exc}", is_error=True)


# --- file tools --------------------------------------------------------------


class ReadFile:
    name = "read_file"
    side_effects = False
    description = "Read a text file in the workspace. Output is capped; longer files are truncated with a note."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "File path, relative to the workspace root."}},
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        if os.path.isdir(real):
            return ToolOutcome(f"'{path}' is a directory; use list_files to see its entries", is_error=True)
        if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
            # A FIFO or device would block or never end.
            return ToolOutcome(f"'{path}' is not a regular file; read_file reads files only", is_error=True)
        try:
            with open(real, "rb") as f:
                # One byte past the cap is enough to know we truncated; the
                # size tells how much.
                data = f.read(ctx.output_cap + 1)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use list_files to see what exists", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
        text = data[: ctx.output_cap].decode("utf-8", errors="replace")
        if len(data) > ctx.output_cap:
            text += f"\n[output truncated: {max(size, len(data)) - ctx.output_cap} bytes omitted]"
        return ToolOutcome(redact(text, ctx.secret_values()), is_error=False)


class WriteFile:
    name = "write_file"
    side_effects = True
    description = "Create or overwrite a file in the workspace with the given content; parent directories are created."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        if os.path.isdir(real):
            return ToolOutcome(f"'{path}' is a directory; write_file needs a file path", is_error=True)
        data = args["content"].encode("utf-8")
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            _atomic_write(real, data)
        except OSError as e:
            return _os_error("write", path, e)
        return ToolOutcome(f"wrote {len(data)} bytes to '{_display(real, ctx)}'", is_error=False)


class EditFile:
    name = "edit_file"
    side_effects = True
    description = (
        "Replace exactly one occurrence of the string 'old' with 'new' in a workspace file. "
        "'old' must occur exactly once; include surrounding lines to make it unique."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "old": {"type": "string", "description": "The exact text to replace; must occur exactly once."},
            "new": {"type": "string", "description": "The replacement text."},
        },
        "required": ["path", "old", "new"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path, old, new = args["path"], args["old"], args["new"]
        if not old:
            return ToolOutcome("edit_file: 'old' must not be empty; use write_file to create a file", is_error=True)
        try:
            with open(real, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use write_file to create it", is_error=True)
        except IsADirectoryError:
            return ToolOutcome(f"'{path}' is a directory; edit_file needs a file path", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
        try:
            # Bytes in, bytes out: line endings stay exactly as they were.
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return ToolOutcome(f"'{path}' is not UTF-8 text; edit_file cannot edit it", is_error=True)
        count = text.count(old)
        if count != 1:
            hint = "check the exact text with read_file" if count == 0 else "include more surrounding text to make it unique"
            return ToolOutcome(
                f"edit_file: 'old' must occur exactly once in '{path}', found {count} times; {hint}",
                is_error=True,
            )
        try:
            _atomic_write(real, text.replace(old, new, 1).encode("utf-8"))
        except OSError as e:
            return _os_error("write", path, e)
        return ToolOutcome(f"edited '{_display(real, ctx)}': replaced 1 occurrence", is_error=False)


class ListFiles:
    name = "list_files"
    side_effects = False
    description = (
        "List files and directories under a workspace directory, recursively, sorted; "
        "directories end with '/', .git is skipped, symlinks are listed but not followed."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory, relative to the workspace root.", "default": "."}
        },
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        if not os.path.isdir(real):
            what = "not a directory" if os.path.exists(real) else "no such directory"
            return ToolOutcome(f"list_files: '{path}' is {what}; give a directory path", is_error=True)
        root = os.path.realpath(ctx.workspace)
        entries: list[str] = []
        truncated = False
        errors: list[str] = []
        # Entries are workspace-relative, so the model can pass them straight
        # to the other tools.
        for dirpath, dirnames, filenames in os.walk(real, onerror=lambda e: errors.append(str(e.filename))):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            rel_dir = os.path.relpath(dirpath, root)
            names = [(d, True) for d in dirnames] + [(f, False) for f in filenames if f != ".git"]
            for name, is_dir in sorted(names):
                rel = name if rel_dir == os.curdir else os.path.join(rel_dir, name)
                entries.append(rel + "/" if is_dir else rel)
            if len(entries) > LIST_FILES_MAX_ENTRIES:
                truncated = True
                break
        entries.sort()
        lines = entries[:LIST_FILES_MAX_ENTRIES]
        if truncated:
            lines.append(f"[listing truncated at {LIST_FILES_MAX_ENTRIES} entries; list a subdirectory]")
        if errors:
            lines.append(f"[could not read: {', '.join(os.path.relpath(e, root) for e in errors)}]")
        if not entries:
            lines.append("[empty directory]")
        return ToolOutcome("\n".join(lines), is_error=False)


# --- shell -------------------------------------------------------------------


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg also succeeds for zombies, and PID 1 in a container may never
    # reap the grandchildren it inherits; a zombie has no effects left.
    if not os.path.isdir("/proc/self"):
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parens; fields resume after the last ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, seconds: float) -> bool:
    """Reap the leader and wait up to ``seconds`` for the whole group to be gone."""
    deadline = time.monotonic() + seconds
    while True:
        proc.poll()
        if proc.returncode is not None and not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


class _OutputReader(threading.Thread):
    """Drains the command's pipe, keeping the first and last bytes up to a cap.

    Head and tail both matter: the head shows what started, the tail shows
    how it ended (the error at the bottom of a build log).
    """

    def __init__(self, fd: int, cap: int) -> None:
        super().__init__(name="kxen-shell-reader", daemon=True)
        self._fd = fd
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self.stop = threading.Event()
        self.eof = False

    def run(self) -> None:
        stop_deadline: float | None = None
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if self.stop.is_set():
                # Told to stop: drain what is ready, but a process outside the
                # group writing forever must not keep us here.
                if stop_deadline is None:
                    stop_deadline = time.monotonic() + _DRAIN_S
                if not ready or time.monotonic() >= stop_deadline:
                    return
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return
            if not chunk:
                self.eof = True
                return
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_cap > 0:
            self._tail += chunk
            del self._tail[: max(0, len(self._tail) - self._tail_cap)]

    def text(self) -> str:
        kept = len(self._head) + len(self._tail)
        omitted = self.total - kept
        if omitted <= 0:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        head = bytes(self._head).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        return f"{head}\n[output truncated: {omitted} bytes omitted]\n{tail}"


def _status_line(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"[killed by {name}]"
    return f"[exit code {returncode}]"


class Shell:
    name = "shell"
    side_effects = True
    description = (
        "Run a command with /bin/sh -c in the workspace directory. stdout and stderr are merged; "
        "output is capped; the command is killed on timeout or cancellation, along with any "
        "processes it started."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The shell command line to run."}},
        "required": ["command"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        try:
            args = _check_arguments(self.name, arguments, self.parameters)
        except _BadArguments as e:
            return ToolOutcome(str(e), is_error=True)
        secrets = ctx.secret_values()
        hidden = set(ctx.secret_env_names)
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", args["command"]],
                cwd=ctx.workspace,
                # Own session => own process group: one killpg reaches every
                # process the command started, and the terminal's Ctrl-C does
                # not; cancellation is ours to deliver.
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as e:
            return ToolOutcome(f"shell: cannot start /bin/sh in '{ctx.workspace}': {e.strerror or e}", is_error=True)
        assert proc.stdout is not None
        pgid = proc.pid
        reader = _OutputReader(proc.stdout.fileno(), ctx.output_cap)
        reader.start()
        try:
            # _supervise returns only once the group is gone.
            return self._supervise(proc, pgid, reader, ctx, secrets)
        except BaseException:
            # Whatever went wrong (KeyboardInterrupt included), leave no
            # process of the group behind.
            if proc.poll() is None or _group_alive(pgid):
                _signal_group(pgid, signal.SIGKILL)
                _wait_group_gone(proc, pgid, _KILL_GRACE_S)
            raise
        finally:
            self._finish_reader(reader)
            proc.stdout.close()

    @staticmethod
    def _finish_reader(reader: _OutputReader) -> None:
        reader.stop.set()
        reader.join()

    def _supervise(
        self,
        proc: subprocess.Popen[bytes],
        pgid: int,
        reader: _OutputReader,
        ctx: ToolContext,
        secrets: list[str],
    ) -> ToolOutcome:
        deadline = time.monotonic() + ctx.timeout_s
        while proc.poll() is None:
            if ctx.cancel.is_set():
                return self._cancel(proc, pgid, reader, ctx, secrets)
            if time.monotonic() >= deadline:
                return self._timeout(proc, pgid, reader, ctx, secrets)
            # An Event wait both paces the loop and wakes at once on cancel.
            ctx.cancel.wait(min(_POLL_S, max(0.0, deadline - time.monotonic())))

        notes: list[str] = []
        if _group_alive(pgid):
            # The shell exited but left background processes; they must not
            # outlive the call (their effects would land after the journal
            # recorded the outcome).
            _signal_group(pgid, signal.SIGTERM)
            if not _wait_group_gone(proc, pgid, ctx.cancel_window_s):
                _signal_group(pgid, signal.SIGKILL)
                if not _wait_group_gone(proc, pgid, _KILL_GRACE_S):
                    raise ToolOutcomeUnknown(
                        f"shell: background processes of group {pgid} survived SIGKILL; their effects are unknown",
                        redact(self._output(reader), secrets),
                    )
            notes.append("[background processes left by the command were terminated]")
        self._finish_reader(reader)
        if not reader.eof:
            notes.append("[stopped reading: a process outside the command's group holds its output open]")
        assert proc.returncode is not None
        text = self._output(reader, *notes, _status_line(proc.returncode))
        return ToolOutcome(redact(text, secrets), is_error=proc.returncode != 0)

    def _cancel(
        self,
        proc: subprocess.Popen[bytes],
        pgid: int,
        reader: _OutputReader,
        ctx: ToolContext,
        secrets: list[str],
    ) -> ToolOutcome:
        _signal_group(pgid, signal.SIGTERM)
        if _wait_group_gone(proc, pgid, ctx.cancel_window_s):
            self._finish_reader(reader)
            assert proc.returncode is not None
            text = self._output(
                reader,
                f"[canceled: the command was stopped with SIGTERM and exited within {ctx.cancel_window_s:g}s; "
                "it may have had partial effects]",
                _status_line(proc.returncode),
            )
            return ToolOutcome(redact(text, secrets), is_error=True)
        _signal_group(pgid, signal.SIGKILL)
        _wait_group_gone(proc, pgid, _KILL_GRACE_S)
        self._finish_reader(reader)
        raise ToolOutcomeUnknown(
            f"shell: canceled command did not exit within {ctx.cancel_window_s:g}s of SIGTERM and was killed "
            "with SIGKILL; its effects are unknown",
            redact(self._output(reader), secrets),
        )

    def _timeout(
        self,
        proc: subprocess.Popen[bytes],
        pgid: int,
        reader: _OutputReader,
        ctx: ToolContext,
        secrets: list[str],
    ) -> ToolOutcome:
        _signal_group(pgid, signal.SIGTERM)
        how = "SIGTERM"
        if not _wait_group_gone(proc, pgid, ctx.cancel_window_s):
            _signal_group(pgid, signal.SIGKILL)
            how = "SIGKILL"
            # A timeout is a known outcome only once nothing of the group can
            # still act.
            if not _wait_group_gone(proc, pgid, _KILL_GRACE_S):
                self._finish_reader(reader)
                raise ToolOutcomeUnknown(
                    f"shell: timed-out command (after {ctx.timeout_s:g}s) survived SIGKILL; its effects are unknown",
                    redact(self._output(reader), secrets),
                )
        self._finish_reader(reader)
        text = self._output(
            reader,
            f"[timed out after {ctx.timeout_s:g}s: the command and its processes were killed with {how}; "
            "it may have had partial effects]",
        )
        return ToolOutcome(redact(text, secrets), is_error=True)

    @staticmethod
    def _output(reader: _OutputReader, *notes: str) -> str:
        text = reader.text()
        if text and not text.endswith("\n") and notes:
            text += "\n"
        return text + "\n".join(notes)


TOOLS: dict[str, Tool] = {t.name: t for t in (Shell(), ReadFile(), WriteFile(), EditFile(), ListFiles())}
