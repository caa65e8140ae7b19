"""What a run shows while it works: live output, progress notes, ``--events``, Ctrl-C notes.

This module owns turning the runtime's progress (notes in words and
:mod:`kxen_agent.runtime.events` records) into what the user or a driving
program sees, in one of four views chosen by :func:`make_view`:

- ``--events``: JSON Lines on stdout, one event per line, ending with
  ``run_finished`` (carrying the result document) or ``error``;
- on a terminal (stderr is a TTY, without ``--quiet``): the model's text
  streams as it arrives, each tool call and a short result line appear as
  they happen, notes between them;
- off a terminal: the progress notes on stderr as lines, nothing streamed
  (without ``--json``);
- ``--quiet`` or ``--json`` off a terminal: nothing but errors (and, with
  ``--quiet``, the Ctrl-C notes).

Streamed text is someone else's bytes (a model's): it reaches the terminal
only with its control characters escaped, newlines and tabs kept. A view
never raises into the run: a closed stdout or stderr stops that view's
output, never the run (whose state is durable either way). It never
decides anything about a run.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Any, TextIO

from kxen_agent.errors import KxenError
from kxen_agent.runtime.events import (Activity, ProviderRetry, RunEvent, TextDelta, ToolFinished, ToolStarted,
                                       TurnFinished)
from kxen_agent.runtime.runner import RunResult
from kxen_agent.session.status import OpState

from ._render import _UNSAFE, _escape, dumps_json, term_text as t

__all__ = ["View", "cancel_note", "make_view"]

# A streamed piece keeps its line breaks and tabs; every other control character is escaped.
_UNSAFE_IN_STREAM = re.compile(rf"(?![\n\t])[{_UNSAFE}]")
_ARGS_SHOWN = 120


def _stream_safe(text: str) -> str:
    return _UNSAFE_IN_STREAM.sub(_escape, text)


def _short(text: str, limit: int = _ARGS_SHOWN) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class View:
    """The silent view; the others override what they show.

    ``wants_text``: the runner should stream the model's answer (the
    provider then uses its streaming API).
    """

    wants_text = False

    def __init__(self, *, signal_notes: bool = False, stream: TextIO | None = None) -> None:
        self._signal_notes = signal_notes
        self._stream = stream
        self._lock = threading.Lock()  # a Ctrl-C note comes from the signal watcher's thread
        self._broken = False
        self._at_line_start = True

    # ------------------------------------------------------------ writing

    def _write(self, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        if self._broken or not text:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            self._broken = True  # the reader went away; the run goes on, durably
            return
        self._at_line_start = text.endswith("\n")

    def _line(self, text: str) -> None:
        with self._lock:
            self._write(("" if self._at_line_start else "\n") + text + "\n")

    # ------------------------------------------------------------ what the run reports

    def note(self, line: str) -> None:
        """A progress note from the runtime."""

    def event(self, event: RunEvent) -> None:
        """A structured event from the runtime."""

    def signal_note(self, text: str) -> None:
        """What a Ctrl-C / SIGTERM does now (see :func:`cancel_note`)."""
        if self._signal_notes:
            self._line(f"kxen-agent: {text}")

    def finished(self, result: RunResult) -> None:
        """The run ended with ``result`` (printed after this by the command)."""
        with self._lock:
            if not self._at_line_start:
                self._write("\n")

    def failed(self, error: KxenError) -> None:
        """The command ends with ``error`` (printed after this on stderr by the CLI)."""
        self.finished_line()

    def finished_line(self) -> None:
        with self._lock:
            if not self._at_line_start:
                self._write("\n")


class _Notes(View):
    """Off a terminal: each progress note as a line on stderr, as before live output existed."""

    def note(self, line: str) -> None:
        self._line(f"kxen-agent: {t(line, quote=False)}")

    def event(self, event: RunEvent) -> None:
        if isinstance(event, TurnFinished) and event.tools:
            self.note(f"turn {event.turn}: {', '.join(event.tools)}")
        elif isinstance(event, ToolStarted):
            self.note(f"{event.op}: {event.tool} {event.arguments}")
        elif isinstance(event, ProviderRetry):
            self.note(f"provider error (transient; attempt {event.attempt} of at most {event.max_attempts}, "
                      f"retrying in {event.wait_s:.1f}s): {event.error}")


class _Live(_Notes):
    """On a terminal: the model's text as it arrives, tool calls and results as they happen."""

    wants_text = True

    def event(self, event: RunEvent) -> None:
        if isinstance(event, TextDelta):
            with self._lock:
                self._write(_stream_safe(event.text))
        elif isinstance(event, TurnFinished):
            self.finished_line()
        elif isinstance(event, ToolStarted):
            self._line(f"  -> {t(event.tool, quote=False)} {t(_short(event.arguments), quote=False)}")
        elif isinstance(event, ToolFinished):
            if event.state == OpState.OUTCOME_UNKNOWN:
                head = "UNKNOWN"
            else:
                head = "error" if event.is_error else "ok"
            more = f" ({event.output_lines} lines)" if event.output_lines > 1 else ""
            summary = f": {t(_short(event.summary), quote=False)}" if event.summary else ""
            self._line(f"  <- {head}{summary}{more}")
        elif isinstance(event, ProviderRetry):
            self._line(f"kxen-agent: model call failed (attempt {event.attempt} of at most {event.max_attempts}); "
                       f"retrying in {event.wait_s:.1f}s: {t(event.error, quote=False)}")


class _Events(View):
    """``--events``: JSON Lines on stdout for a program driving kxen-agent."""

    def _emit(self, doc: dict[str, Any]) -> None:
        with self._lock:
            self._write(dumps_json(doc) + "\n")

    def note(self, line: str) -> None:
        self._emit({"event": "note", "text": line})

    def event(self, event: RunEvent) -> None:
        self._emit(event.to_json())

    def signal_note(self, text: str) -> None:
        self._emit({"event": "note", "text": text})

    def finished(self, result: RunResult) -> None:
        self._emit({"event": "run_finished", "session": result.session, "run": result.run,
                    "result": result.to_json()})

    def failed(self, error: KxenError) -> None:
        self._emit({"event": "error", "message": str(error), "exitCode": error.exit_code})


class _EventsWithText(_Events):
    wants_text = True


def make_view(*, json_out: bool, events: bool, quiet: bool) -> View:
    """The view for these flags and where stdout/stderr go (``--events`` with ``--json`` is the caller's to refuse)."""
    if events:
        return _EventsWithText(stream=sys.stdout)
    if quiet:
        return View(signal_notes=True)
    if sys.stderr.isatty():
        return _Live(signal_notes=True)
    if json_out:
        return View()
    return _Notes(signal_notes=True)


def cancel_note(sig_name: str, seen: int, activity: Activity | None, first_at: float) -> str | None:
    """What the ``seen``-th cancel signal does, given what the run was doing; None after the second.

    It says exactly what is waited for: a tool in its cancellation window
    (how long at most), or nothing.
    """
    if seen == 1:
        if activity is not None and activity.what == "tool":
            return (f"{sig_name}: canceling the run: tool {activity.tool} ({activity.op}) was asked to stop and gets "
                    f"up to {activity.window_s:g}s (its cancellation window); then its outcome is journaled...")
        if activity is not None and activity.what == "model":
            return (f"{sig_name}: canceling the run: the model call to {activity.endpoint} is aborted now; "
                    "no tool is running, nothing else is waited for...")
        if activity is not None and activity.what == "retry-wait":
            return (f"{sig_name}: canceling the run: the wait to retry the model call is abandoned; "
                    "no tool is running, nothing else is waited for...")
        return (f"{sig_name}: canceling the run: no model call or tool is in flight; the run stops after the "
                "durable step in progress...")
    if seen == 2:
        if activity is not None and activity.what == "tool" and activity.window_s is not None:
            left = max(0.0, activity.window_s - (time.monotonic() - max(first_at, activity.since)))
            return (f"{sig_name} again: still canceling \u2014 waiting for tool {activity.tool} ({activity.op}) to stop: "
                    f"at most {left:.1f}s left of its {activity.window_s:g}s cancellation window, then its outcome is "
                    "journaled; this is not skipped")
        return (f"{sig_name} again: still canceling \u2014 nothing is running; the run's state is being written and "
                "the process ends in a moment")
    return None
