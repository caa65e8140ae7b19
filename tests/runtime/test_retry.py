"""The retry policy of model calls, as a pure function of the failures (no sleeping: a recording ``wait``)."""

from __future__ import annotations

import threading

import pytest

from kxen_agent.runtime.providers import ProviderCanceled, ProviderError
from kxen_agent.runtime.retry import ProviderGaveUp, RetryNote, RetryPolicy, call_with_retries


def transient(retry_after: float | None = None) -> ProviderError:
    return ProviderError("model provider at http://m/v1 returned HTTP 429: slow down", transient=True, status=429,
                         retry_after=retry_after)


class Script:
    """A model call that fails with ``errors`` in turn, then answers ``"ok"``; records what the policy did."""

    def __init__(self, errors: list[ProviderError], cancel_on_wait: bool = False) -> None:
        self.errors = list(errors)
        self.attempts: list[int] = []
        self.waits: list[float] = []
        self.notes: list[RetryNote] = []
        self.cancel = threading.Event()
        self.cancel_on_wait = cancel_on_wait

    def call(self, attempt: int) -> str:
        self.attempts.append(attempt)
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.cancel_on_wait:
            self.cancel.set()
        return self.cancel.is_set()

    def run(self, policy: RetryPolicy = RetryPolicy(), rand: float = 0.5) -> str:
        return call_with_retries(self.call, policy=policy, cancel=self.cancel, on_retry=self.notes.append,
                                 wait=self.wait, rand=lambda: rand)


def test_success_after_transient_failures_with_exponential_backoff_and_jitter() -> None:
    s = Script([transient()] * 3)
    assert s.run(rand=0.5) == "ok"
    assert s.attempts == [1, 2, 3, 4]
    # d = 1, 2, 4 s; equal jitter with rand 0.5 waits 3/4 of each.
    assert s.waits == [0.75, 1.5, 3.0]
    assert [(n.attempt, n.max_attempts, n.wait_s) for n in s.notes] == [(1, 5, 0.75), (2, 5, 1.5), (3, 5, 3.0)]
    lo, hi = Script([transient()] * 4), Script([transient()] * 4)
    lo.run(rand=0.0)
    hi.run(rand=0.999999)
    assert lo.waits == [0.5, 1.0, 2.0, 4.0], "never less than half the backoff"
    assert all(d < full for d, full in zip(hi.waits, [1, 2, 4, 8])) and hi.waits[-1] > 7.99


def test_at_most_five_attempts_and_the_error_says_how_many() -> None:
    s = Script([transient()] * 10)
    with pytest.raises(ProviderGaveUp) as info:
        s.run()
    assert s.attempts == [1, 2, 3, 4, 5] and len(s.waits) == 4
    assert info.value.attempts == 5 and "gave up after 5 attempts" in str(info.value)
    assert "HTTP 429" in str(info.value)
    assert info.value.waited_s == pytest.approx(sum(s.waits))


def test_a_non_transient_error_is_not_retried() -> None:
    s = Script([ProviderError("HTTP 400: bad", transient=False, status=400)])
    with pytest.raises(ProviderGaveUp) as info:
        s.run()
    assert s.attempts == [1] and s.waits == [] and info.value.attempts == 1
    assert "not retried" in str(info.value) and "1 attempt)" in str(info.value)


def test_retry_after_is_honoured_and_capped_at_60_seconds() -> None:
    s = Script([transient(3.0), transient(0.25), transient(3600.0)])
    assert s.run() == "ok"
    assert s.waits == [3.0, 0.25, 60.0]


def test_no_more_than_120_seconds_of_waiting_in_all() -> None:
    s = Script([transient(60.0)] * 5)
    with pytest.raises(ProviderGaveUp) as info:
        s.run()
    # 60 + 60 = 120 s fits the budget; a third 60 s wait would not.
    assert s.waits == [60.0, 60.0] and s.attempts == [1, 2, 3]
    assert info.value.attempts == 3 and "120s retry budget" in str(info.value) and "3 attempts" in str(info.value)
    assert sum(s.waits) <= RetryPolicy().max_wait_s


def test_cancel_during_a_wait_or_after_a_failure_is_a_cancellation() -> None:
    s = Script([transient()] * 3, cancel_on_wait=True)
    with pytest.raises(ProviderCanceled):
        s.run()
    assert s.attempts == [1] and len(s.waits) == 1

    s = Script([ProviderError("HTTP 400", transient=False)])
    s.cancel.set()
    with pytest.raises(ProviderCanceled):
        s.run()
    assert s.waits == [], "a failure after Ctrl-C is neither retried nor a failure"


def test_the_policy_holds_for_the_default_numbers() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.max_wait_s, p.retry_after_cap_s) == (5, 120.0, 60.0)
    # The longest the backoff alone can wait over five attempts is within the budget.
    assert sum(p.wait_s(n, transient(), 0.999999) for n in range(1, p.max_attempts)) < p.max_wait_s
