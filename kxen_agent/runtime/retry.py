"""The one retry policy for model calls.

This module owns when a failed model call is tried again and how long the
run waits before it does: at most :attr:`RetryPolicy.max_attempts` attempts
(5) per model call and at most :attr:`RetryPolicy.max_wait_s` (120 s) of
waiting in all; a server's ``retry-after-ms`` / ``Retry-After`` is honoured,
capped at :attr:`RetryPolicy.retry_after_cap_s` (60 s); otherwise the wait
is exponential backoff with jitter. Only errors the provider calls
transient are retried. The SDK's own retries are off (providers never
retry), so these numbers are the true ones, and the error of a call that
gives up states how many attempts were made.

Every wait is on the run's cancel event: Ctrl-C during a wait ends it at
once, and a call that fails after Ctrl-C is canceled, not retried or
failed. It never sleeps in any other way and never touches the store.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kxen_agent.errors import KxenError

from .providers import ProviderCanceled, ProviderError

__all__ = ["ProviderGaveUp", "RetryNote", "RetryPolicy", "call_with_retries"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a model call is retried.

    The n-th retry (n = 1, 2, ...) waits what the server asked for, capped
    at ``retry_after_cap_s``, or else ``d/2 + U(0, d/2)`` seconds with
    ``d = min(backoff_cap_s, backoff_base_s * 2**(n-1))`` ("equal jitter":
    never less than half the backoff, so a crowd of clients spreads out
    without any of them hammering the server).
    """

    max_attempts: int = 5
    max_wait_s: float = 120.0
    retry_after_cap_s: float = 60.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0

    def wait_s(self, retry: int, error: ProviderError, rand: float) -> float:
        """The wait before retry number ``retry`` after ``error``; ``rand`` is uniform in [0, 1)."""
        if error.retry_after is not None:
            return min(max(error.retry_after, 0.0), self.retry_after_cap_s)
        full = min(self.backoff_cap_s, self.backoff_base_s * 2 ** (retry - 1))
        return full / 2 + rand * full / 2


@dataclass(frozen=True)
class RetryNote:
    """A failed attempt that will be retried after ``wait_s`` seconds."""

    attempt: int
    max_attempts: int
    wait_s: float
    error: ProviderError


class ProviderGaveUp(KxenError):
    """A model call failed for good: not transient, or out of attempts or waiting time.

    ``attempts`` is how many requests were made, ``waited_s`` how long the
    run waited between them, ``error`` the last failure.
    """

    def __init__(self, error: ProviderError, attempts: int, waited_s: float, why: str) -> None:
        self.error = error
        self.attempts = attempts
        self.waited_s = waited_s
        super().__init__(f"{error} ({why})")


def _attempts(n: int) -> str:
    return f"{n} attempt{'' if n == 1 else 's'}"


def call_with_retries(call: Callable[[int], T], *, policy: RetryPolicy, cancel: threading.Event,
                      on_retry: Callable[[RetryNote], None],
                      wait: Callable[[float], bool] | None = None,
                      rand: Callable[[], float] = random.random) -> T:
    """``call(attempt)`` (attempt = 1, 2, ...) until it returns, under ``policy``.

    Raises :class:`ProviderGaveUp` when it will not be retried, and
    :class:`~.providers.ProviderCanceled` when ``cancel`` is set — during a
    call, during a wait, or before a failure could be retried (a failure
    after Ctrl-C is a cancellation). ``wait(seconds)`` returns True if it
    was cut short by cancellation (default: ``cancel.wait``).
    """
    waiter = wait or cancel.wait
    waited = 0.0
    attempt = 0
    while True:
        attempt += 1
        try:
            return call(attempt)
        except ProviderCanceled:
            raise
        except ProviderError as e:
            if cancel.is_set():
                raise ProviderCanceled(f"the run was canceled while the model call was failing ({e})") from None
            if not e.transient:
                raise ProviderGaveUp(e, attempt, waited, f"not retried: the error is not transient; "
                                     f"{_attempts(attempt)}") from None
            if attempt >= policy.max_attempts:
                raise ProviderGaveUp(e, attempt, waited, f"gave up after {_attempts(attempt)} and "
                                     f"{waited:.1f}s of waiting") from None
            delay = policy.wait_s(attempt, e, rand())
            if waited + delay > policy.max_wait_s:
                raise ProviderGaveUp(
                    e, attempt, waited,
                    f"gave up after {_attempts(attempt)}: the next wait ({delay:.1f}s) would take the "
                    f"{waited:.1f}s waited so far past the {policy.max_wait_s:g}s retry budget") from None
            on_retry(RetryNote(attempt, policy.max_attempts, delay, e))
            if waiter(delay):
                raise ProviderCanceled(f"the run was canceled while waiting to retry the model call ({e})") from None
            waited += delay
