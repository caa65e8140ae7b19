"""The interactive session's terminal: the prompt's history file, and the key watcher of a run.

Two readers take turns on the terminal, never both at once: the prompt
(prompt_toolkit, between runs) and :class:`KeyWatch` (while a run works:
Esc cancels it, every other key is dropped). An approval question borrows
the terminal from the watcher (:meth:`KeyWatch.paused`) and gives it back.

The prompt history is the user's own typing, kept per workspace in
``<state dir>/prompts/<id>`` (§1.3): redacted as every persisted text is
(:mod:`kxen_agent.runtime.redaction`, §14.11), mode 0600 like every file of
the state dir, replaced durably (temp file, fsync, rename, directory fsync).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import termios
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prompt_toolkit.history import History

__all__ = ["HISTORY_DIR", "KeyWatch", "PromptHistory", "history_path"]

#: The state dir's directory of prompt histories, one file per workspace (§1.3).
HISTORY_DIR = "prompts"
#: How many entries a history keeps (the oldest go first).
HISTORY_KEPT = 1000
#: How long after an Esc byte the next byte must come to make it a key's sequence (an arrow: ESC [ A).
_ESC_SEQUENCE_S = 0.05


def history_path(state_root: str, workspace_root: str) -> str:
    """The history file of the workspace at ``workspace_root`` (its realpath, hashed: a path is no file name)."""
    digest = hashlib.sha256(os.path.realpath(workspace_root).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(state_root, HISTORY_DIR, digest[:32])


class PromptHistory(History):
    """prompt_toolkit's history, kept in one file: a JSON string a line, oldest first.

    ``store`` is the :class:`~kxen_agent.store.Store` whose state dir holds it (made on the first
    entry, as any first write makes it); ``secrets`` the values taken out of every entry. A file that
    does not read (damaged by hand) is read as far as it does; an entry that cannot be written is
    kept for this process only — the prompt never fails on its history.
    """

    def __init__(self, store: Any, workspace_root: str, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.store = store
        self.path = history_path(store.root, workspace_root)
        self.secrets = list(secrets)
        self.problem: str | None = None  # the last write that failed, said once by the caller

    def _read(self) -> list[str]:
        try:  # through the store's file seam, as every state dir read (tracing, fault injection)
            lines = self.store.io.read(self.path).decode("utf-8", "replace").splitlines()
        except Exception:  # noqa: BLE001 - none yet, or unreadable: the prompt works without a history
            return []
        entries = []
        for line in lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, str):
                entries.append(value)
        return entries

    def load_history_strings(self) -> Iterable[str]:
        return list(reversed(self._read()))  # newest first, as prompt_toolkit wants

    def store_string(self, string: str) -> None:
        from kxen_agent.runtime.redaction import redact

        entry = redact(string, self.secrets)
        # Read again: another session in the same workspace may have added entries since.
        entries = (self._read() + [entry])[-HISTORY_KEPT:]
        data = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries).encode("utf-8", "surrogatepass")
        try:
            self.store.ensure_initialized()
            io = self.store.io
            io.makedirs(os.path.dirname(self.path))
            io.write_durable(self.path, data)
        except Exception as e:  # noqa: BLE001 - a history is never worth failing the session for
            self.problem = f"the prompt history was not saved to {self.path}: {e}"


class KeyWatch:
    """While a run works, the one reader of the terminal ``fd``: Esc calls ``on_esc``; other keys are dropped.

    The terminal is put in cbreak mode without echo (Ctrl-C still sends SIGINT, which the run's
    cancel contract handles) and restored on exit. A key's escape sequence (an arrow) is not an Esc.
    """

    def __init__(self, fd: int, on_esc: Callable[[], None]) -> None:
        self.fd = fd
        self.on_esc = on_esc
        self._saved: list[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stop_w = -1

    def __enter__(self) -> KeyWatch:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The terminal as it was (cooked, echoing), and nobody reading it: for a question asked meanwhile."""
        was = self._thread is not None
        self._stop()
        try:
            yield
        finally:
            if was:
                self._start()

    def _start(self) -> None:
        try:
            self._saved = termios.tcgetattr(self.fd)
            mode = termios.tcgetattr(self.fd)
            # Each key as it comes, not echoed; ISIG kept: Ctrl-C still sends SIGINT (the run's cancel).
            mode[3] &= ~(termios.ECHO | termios.ICANON)  # lflag
            mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
            termios.tcsetattr(self.fd, termios.TCSANOW, mode)
        except (termios.error, OSError):
            self._saved = None
            return  # not a terminal after all: nothing to watch
        stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._watch, args=(stop_r,), name="kxen-keys", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join()
            os.close(self._stop_w)
            self._thread = None
        if self._saved is not None:
            # TCSANOW, not TCSADRAIN: only local modes change (no output processing), so nothing needs the
            # output drained first; a rare hang after Ctrl-C on a pseudo-terminal was suspected in that wait.
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSANOW, self._saved)
            self._saved = None

    def _watch(self, stop_r: int) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd, stop_r], [], [])
                if stop_r in ready:
                    return
                try:
                    data = os.read(self.fd, 64)
                except OSError:
                    return
                if not data:
                    return  # the terminal went away
                if data == b"\x1b":
                    more, _, _ = select.select([self.fd, stop_r], [], [], _ESC_SEQUENCE_S)
                    if self.fd in more:
                        os.read(self.fd, 64)  # the rest of a key's sequence: dropped with it
                        continue
                    self.on_esc()
        finally:
            os.close(stop_r)
