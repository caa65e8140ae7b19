"""A private event loop that lets a blocking caller abandon an async request at once.

This module owns one thing: running a provider's coroutine on an asyncio
loop in a daemon thread of its own while the calling thread waits, so that
the caller can cancel the request the moment a threading event is set.
Cancelling the asyncio task makes the HTTP client close the connection
(the server sees it go) instead of waiting for an answer; a blocking
socket read in the calling thread could not be interrupted like that.

Text pieces the coroutine produces are queued and handed to the caller's
callback on the calling thread, so callbacks (live output, fault points)
never run on the loop's thread. It knows nothing of models or HTTP.

Limitations: one loop thread per :class:`LoopThread`, started on first use
and stopped by :meth:`LoopThread.close`; a daemon, so a process that never
closes it still exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["CANCEL_POLL_S", "Canceled", "DeadlineExceeded", "LoopThread"]

T = TypeVar("T")

#: How often the waiting caller looks at the cancel event. A request is
#: abandoned at most this long after the event is set.
CANCEL_POLL_S = 0.05
# How long the caller waits for a cancelled request to unwind (the
# connection to close) before it returns anyway.
_UNWIND_S = 2.0


class Canceled(Exception):
    """The cancel event was set: the request was cancelled and has unwound."""


class DeadlineExceeded(Exception):
    """The call's overall deadline passed: the request was cancelled and has unwound."""


class LoopThread:
    """An asyncio loop in a daemon thread, and the blocking call that drives it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def call(self, make: Callable[[Callable[[str], None]], Coroutine[Any, Any, T]], *,
             cancel: threading.Event | None, on_text: Callable[[str], None] | None,
             deadline_s: float | None = None) -> T:
        """Run ``make(emit)`` on the loop and wait for its result.

        ``deadline_s`` bounds the whole call (not each read: a server that
        sends a byte now and then never trips a read timeout): past it, the
        task is cancelled as for ``cancel`` and :class:`DeadlineExceeded` is raised.

        ``emit(text)`` (called on the loop) queues text for ``on_text``,
        which runs here, on the calling thread. If ``cancel`` is set first,
        the task is cancelled, given up to 2 s to close its connection, and
        :class:`Canceled` is raised. An exception from ``on_text`` cancels
        the task the same way and propagates.
        """
        loop = self._ensure()
        pieces: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(pieces.put), loop)
        fut.add_done_callback(lambda _: pieces.put(None))  # wakes the wait below at once
        finished = False
        ends = None if deadline_s is None else time.monotonic() + deadline_s
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    raise Canceled()
                if ends is not None and time.monotonic() >= ends:
                    raise DeadlineExceeded()
                try:
                    piece = pieces.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    continue
                if piece is None:
                    break
                if on_text is not None:
                    on_text(piece)
            # Text queued before the result came is delivered before it.
            while True:
                try:
                    piece = pieces.get_nowait()
                except queue.Empty:
                    break
                if piece is not None and on_text is not None:
                    on_text(piece)
            finished = True
            return fut.result()
        finally:
            if not finished and not fut.done():
                fut.cancel()
                try:
                    fut.result(timeout=_UNWIND_S)
                except BaseException:  # noqa: BLE001 - cancelled or failed: either way it has unwound
                    pass

    def run(self, aw: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> None:
        """Run ``aw()`` on the loop and wait (for cleanup such as closing a client); errors are ignored."""
        if self._loop is None:
            return

        async def wrapped() -> None:
            await aw()

        try:
            asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(timeout)
        except Exception:  # noqa: BLE001 - cleanup must not fail the run that is ending
            pass

    def close(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()
