"""``kxen_agent.runtime.cancel`` in-process, with real signals sent to this process.

Every test that sends a cancel signal first installs recording Python
handlers for SIGINT and SIGTERM (the ``previous`` fixture), so a handler that
was not installed, or not restored, shows up as a failed assertion instead of
a KeyboardInterrupt or a killed test run. The tests also hold the public
surfaces of the runtime and CLI packages (their ``__all__``) and the rule that
neither imports a private name of another package.
"""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

import kxen_agent
import kxen_agent.cli as cli_pkg
import kxen_agent.runtime as runtime_pkg
from kxen_agent.runtime.cancel import CANCEL_SIGNALS, CancelSetupError, cancel_on_signals


def wait_until(cond: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll ``cond``: a signal's Python handler and the watcher thread run
    asynchronously to the ``os.kill`` that sent it."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


class Recorder:
    """A Python signal handler that records what it was called with."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.got.append(signum)


@pytest.fixture
def previous() -> Iterator[Recorder]:
    """Recording handlers for SIGINT/SIGTERM (and no wake-up fd) before each
    test; the process's own handlers and wake-up fd are put back after it."""
    rec = Recorder()
    old = {s: signal.signal(s, rec) for s in CANCEL_SIGNALS}
    old_wakeup = signal.set_wakeup_fd(-1)
    try:
        yield rec
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)


class Calls:
    """An ``on_signal`` that records (signal, count) from the watcher thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[signal.Signals, int]] = []
        self.threads: set[str] = set()

    def __call__(self, sig: signal.Signals, seen: int) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append((sig, seen))

    def wait(self, n: int) -> None:
        wait_until(lambda: len(self.calls) >= n, f"{n} on_signal call(s); got {self.calls}")


def kill_self(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)


@pytest.mark.parametrize("sig", CANCEL_SIGNALS, ids=lambda s: s.name)
def test_a_cancel_signal_sets_the_event_and_calls_on_signal_off_the_main_thread(previous, sig):
    calls = Calls()
    with cancel_on_signals(on_signal=calls) as cancel:
        assert not cancel.is_set()
        kill_self(sig)
        assert cancel.wait(5), "the event was not set by the signal"
        calls.wait(1)
    assert calls.calls == [(sig, 1)]
    assert calls.threads == {"kxen-cancel"}, "on_signal must run on the watcher thread, not in the handler"
    assert previous.got == [], "the previous handler must not see a signal sent inside the context"
    assert cancel.is_set(), "the event keeps its state after the context"


def test_second_and_later_signals_only_reach_on_signal_and_never_interrupt_the_body(previous):
    calls = Calls()
    reached_end = False
    with cancel_on_signals(on_signal=calls) as cancel:
        kill_self(signal.SIGINT)
        calls.wait(1)
        kill_self(signal.SIGTERM)
        calls.wait(2)
        kill_self(signal.SIGINT)
        calls.wait(3)
        # The body goes on: what the runner does here is finish the journaling.
        reached_end = True
    assert reached_end
    assert calls.calls == [(signal.SIGINT, 1), (signal.SIGTERM, 2), (signal.SIGINT, 3)]
    assert cancel.is_set() and previous.got == []


def test_with_the_default_sigint_handler_a_signal_raises_no_keyboard_interrupt():
    # The CLI's situation: Python's default SIGINT handler is in place.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with cancel_on_signals() as cancel:
            kill_self(signal.SIGINT)
            assert cancel.wait(5)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            kill_self(signal.SIGINT)
            wait_until(lambda: False, "the restored default handler to raise KeyboardInterrupt")
    finally:
        signal.signal(signal.SIGINT, old)


def test_previous_handlers_and_wakeup_fd_are_restored_on_exit(previous):
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    try:
        signal.set_wakeup_fd(wfd)
        with cancel_on_signals() as cancel:
            assert all(signal.getsignal(s) is not previous for s in CANCEL_SIGNALS)
        assert all(signal.getsignal(s) is previous for s in CANCEL_SIGNALS)
        assert signal.set_wakeup_fd(-1) == wfd, "the previous wake-up fd was not restored"
        assert not cancel.is_set()
        # And they work again: the restored handler sees the next signal.
        kill_self(signal.SIGTERM)
        wait_until(lambda: previous.got, "the restored SIGTERM handler")
        assert previous.got == [signal.SIGTERM]
    finally:
        os.close(rfd)
        os.close(wfd)


def test_handlers_are_restored_when_the_body_raises(previous):
    with pytest.raises(RuntimeError, match="boom"):
        with cancel_on_signals():
            raise RuntimeError("boom")
    assert all(signal.getsignal(s) is previous for s in CANCEL_SIGNALS)
    assert signal.set_wakeup_fd(-1) == -1


def test_the_watcher_thread_ends_with_the_context(previous):
    with cancel_on_signals():
        assert any(t.name == "kxen-cancel" and t.is_alive() for t in threading.enumerate())
    assert not any(t.name == "kxen-cancel" for t in threading.enumerate())


def test_other_signals_on_the_wakeup_fd_are_not_cancellation(previous):
    # The wake-up fd receives every signal that has a Python handler.
    usr1 = Recorder()
    old = signal.signal(signal.SIGUSR1, usr1)
    try:
        calls = Calls()
        with cancel_on_signals(on_signal=calls) as cancel:
            kill_self(signal.SIGUSR1)
            wait_until(lambda: usr1.got, "the SIGUSR1 handler")
            # The watcher reads the pipe in order: by the time it reports this
            # SIGINT it has seen (and must have skipped) the SIGUSR1 byte.
            kill_self(signal.SIGINT)
            calls.wait(1)
        assert calls.calls == [(signal.SIGINT, 1)]
        assert usr1.got == [signal.SIGUSR1] and cancel.is_set()
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_the_signals_to_cancel_on_can_be_chosen(previous):
    old = signal.getsignal(signal.SIGUSR1)
    calls = Calls()
    with cancel_on_signals(on_signal=calls, signals=[signal.SIGUSR1]) as cancel:
        kill_self(signal.SIGINT)  # not chosen: the previous handler has it
        wait_until(lambda: previous.got, "the previous SIGINT handler")
        assert not cancel.is_set()
        kill_self(signal.SIGUSR1)
        assert cancel.wait(5)
        calls.wait(1)
    assert calls.calls == [(signal.SIGUSR1, 1)] and previous.got == [signal.SIGINT]
    assert signal.getsignal(signal.SIGUSR1) is old


def test_refused_outside_the_main_thread_and_changes_nothing(previous):
    caught: list[BaseException] = []

    def enter() -> None:
        try:
            with cancel_on_signals():
                pass
        except BaseException as e:  # noqa: BLE001 - handed to the main thread's assertions
            caught.append(e)

    t = threading.Thread(target=enter)
    t.start()
    t.join(10)
    [e] = caught
    assert isinstance(e, CancelSetupError) and "main thread" in str(e)
    assert all(signal.getsignal(s) is previous for s in CANCEL_SIGNALS)
    assert signal.set_wakeup_fd(-1) == -1


# --- public surfaces ---------------------------------------------------------

RUNTIME_API = {
    "AssistantTurn", "CANCEL_SIGNALS", "CancelSetupError", "FaultSpecError", "Hit", "Lease", "LeaseBusy",
    "LeaseLost", "OnSignal", "OpenAIProvider", "Provider", "ProviderError", "RunError", "RunResult",
    "Runner", "ScriptProvider", "TERMINAL", "TOOLS", "Tool", "ToolCall", "ToolContext", "ToolOutcome",
    "ToolOutcomeUnknown", "cancel_on_signals", "find_secrets", "lease_ttl_s", "make_provider", "redact", "tool_specs",
}


@pytest.mark.parametrize(
    ("package", "expected"), [(runtime_pkg, RUNTIME_API), (cli_pkg, {"entry"})], ids=["runtime", "cli"]
)
def test_package_all_is_sorted_public_and_resolves(package, expected):
    names = package.__all__
    assert names == sorted(names), f"{package.__name__}.__all__ is not sorted"
    assert set(names) == expected
    assert not [n for n in names if n.startswith("_")]
    ns: dict[str, object] = {}
    exec(f"from {package.__name__} import *", ns)
    assert set(ns) - {"__builtins__"} == set(names)
    assert package.__doc__ and package.__doc__.strip()


def test_runtime_reexports_are_the_defining_modules_objects():
    from kxen_agent.runtime import cancel, lease, runner, tools

    assert runtime_pkg.Runner is runner.Runner and runtime_pkg.Lease is lease.Lease
    assert runtime_pkg.TOOLS is tools.TOOLS and runtime_pkg.cancel_on_signals is cancel.cancel_on_signals


def test_runtime_and_cli_import_no_private_name_of_another_package():
    """``from kxen_agent.X import _name`` across packages is what issue #12
    forbids; an alias (``import public as _local``) is fine."""
    root = Path(kxen_agent.__file__).parent
    found = []
    for layer in ("runtime", "cli"):
        for path in sorted((root / layer).rglob("*.py")):
            package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                    continue
                if node.level:  # relative: resolve against this module's package
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                same_package = module == package or module.startswith(package + ".")
                for alias in node.names:
                    if alias.name.startswith("_") and not same_package:
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {module}.{alias.name}")
    assert found == []
