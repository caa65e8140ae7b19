"""Cooperative cancellation of a run from SIGINT/SIGTERM.

This module owns turning the process's cancel signals into a
:class:`threading.Event` the :class:`~kxen_agent.runtime.runner.Runner` polls
(``Runner(store, cancel=event)``): :func:`cancel_on_signals` installs the
handlers, yields the event, and restores what was there before on exit. An
embedding program uses it instead of copying the wake-up-fd dance::

    with cancel_on_signals(on_signal=lambda sig, n: log(f"{sig.name} #{n}")) as cancel:
        result = Runner(store, cancel=cancel).start(workspace, task, agent)

It must never print, exit or decide anything about a run: a signal only sets
the event (the runner finishes the journaling in progress and ends the run
``canceled`` or, if a tool had to be killed, ``input_required``), and what a
user is told is the caller's ``on_signal``. A second signal changes nothing
but what ``on_signal`` is told: the journaling in progress always completes,
so the state on disk is always one the seed names.

Limitations:

- Signal handlers and the wake-up fd belong to the whole process and can only
  be set from the main thread; :func:`cancel_on_signals` refuses to start
  anywhere else (:class:`CancelSetupError`).
- While the context is active the process's previous wake-up fd (e.g. an
  asyncio loop's) receives nothing; it is restored on exit.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

__all__ = ["CANCEL_SIGNALS", "CancelSetupError", "OnSignal", "cancel_on_signals"]

#: The signals that request cooperative cancellation of a run.
CANCEL_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

#: Called on the watcher thread for every cancel signal, after the event is
#: set, with the signal and how many cancel signals arrived so far (1, 2, ...).
#: It must not raise: an exception ends the watcher (the event stays set, but
#: later signals are no longer reported).
OnSignal = Callable[[signal.Signals, int], None]

# How long leaving the context waits for the watcher thread: it ends as soon
# as the write end is closed, unless ``on_signal`` is stuck (its problem, not
# a reason to hang the program on exit; the thread is a daemon).
_WATCHER_JOIN_S = 5.0


class CancelSetupError(RuntimeError):
    """:func:`cancel_on_signals` was entered outside the main thread, where
    Python cannot install signal handlers.

    A mistake of the embedding program, never something a user of the CLI
    meets, hence not a :class:`~kxen_agent.errors.KxenError`.
    """


def _ignore(signum: int, frame: object) -> None:
    """The Python-level handler: does nothing (see :func:`cancel_on_signals`)."""


@contextmanager
def cancel_on_signals(
    on_signal: OnSignal | None = None,
    signals: Iterable[signal.Signals] = CANCEL_SIGNALS,
) -> Iterator[threading.Event]:
    """Install handlers for ``signals`` and yield an event each of them sets.

    The Python-level handler does nothing; the interpreter's C handler writes
    the signal number to a wake-up pipe, and a watcher thread sets the event
    and calls ``on_signal``. Doing either inside the handler is unsafe: the
    handler runs in the main thread between any two bytecodes, possibly while
    that thread holds the very Event's internal lock (``set`` would deadlock)
    or stderr's buffer lock (a print raises "reentrant call" into the middle
    of a journal write). So a signal never raises in the main thread while
    the context is active, however many arrive.

    On exit, even by an exception, the previous handlers and wake-up fd are
    restored and the watcher thread is ended. The event stays as it was: a
    caller can still ask, after the ``with``, whether cancellation was asked
    for. Must be entered from the main thread (:class:`CancelSetupError`).
    """
    wanted = tuple(signal.Signals(s) for s in signals)
    if threading.current_thread() is not threading.main_thread():
        raise CancelSetupError(
            "cancel_on_signals must be entered from the main thread (Python installs signal handlers "
            "only there); enter it around the run in the main thread and pass the event to the runner"
        )
    event = threading.Event()
    rfd, wfd = os.pipe()
    # A full pipe must drop a byte, never block the C handler.
    os.set_blocking(wfd, False)

    def watch() -> None:
        seen = 0
        while True:
            try:
                data = os.read(rfd, 64)
            except OSError:
                return
            if not data:  # the write end was closed: the context is done
                return
            for signum in data:
                # The wake-up fd gets every signal with a Python handler, not
                # only ours.
                if signum not in wanted:
                    continue
                seen += 1
                event.set()
                if on_signal is not None:
                    on_signal(signal.Signals(signum), seen)

    watcher = threading.Thread(target=watch, name="kxen-cancel", daemon=True)
    watcher.start()
    old_handlers: dict[signal.Signals, object] = {}
    old_wakeup = -1
    try:
        old_wakeup = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        for s in wanted:
            old_handlers[s] = signal.signal(s, _ignore)
        yield event
    finally:
        for s, h in old_handlers.items():
            # None: a handler installed outside Python, which Python cannot
            # reinstall; the default action is the closest it can restore.
            signal.signal(s, signal.SIG_DFL if h is None else h)  # type: ignore[arg-type]
        signal.set_wakeup_fd(old_wakeup)
        os.close(wfd)
        watcher.join(timeout=_WATCHER_JOIN_S)
        os.close(rfd)
