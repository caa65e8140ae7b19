"""The ``shell`` tool and the supervision of the process group it starts.

This module owns running one command line with ``/bin/sh -c`` in the
workspace: its own session (so its own process group, out of reach of the
terminal's Ctrl-C), an environment without the API key's variable nor, unless
the agent's policy keeps them (``env_keep``), any credential-looking one, the
output pipe drained to a head-and-tail cap, the timeout, the cancellation
window, the SIGTERM-then-SIGKILL escalation to the whole group, and the
:class:`~.protocol.ToolOutcomeUnknown` verdict when the group's end cannot be
proven.

It must never return while a process of the command's group is alive (its
effects would land after the journal recorded the outcome), never touch the
workspace itself (that is :mod:`.files`), and never journal or decide what a
run does next.

Limitations:

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
import subprocess
import threading
import time
from typing import Any

from .protocol import BadArguments, ToolContext, ToolOutcome, ToolOutcomeUnknown, check_arguments, redact

__all__ = ["Shell"]

# How often shell checks cancel/timeout while the command runs: short enough
# that Ctrl-C feels immediate, long enough not to burn a core.
_POLL_S = 0.02
# After SIGKILL the kernel tears the group down promptly; longer than this
# means something (an uninterruptible sleep) holds a process, and we cannot
# claim to know the outcome.
_KILL_GRACE_S = 5.0
# How long the output reader keeps draining a still-busy pipe once told to stop.
_DRAIN_S = 1.0


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
            args = check_arguments(self.name, arguments, self.parameters)
        except BadArguments as e:
            return ToolOutcome(str(e), is_error=True)
        secrets = ctx.secret_values()
        env = ctx.environment()  # credential-looking variables dropped unless the policy keeps them
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
