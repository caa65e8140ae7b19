"""What every provider behind an HTTP SDK shares: the key, the client, cancellation, scrubbing.

This module owns :class:`HttpProvider`, the base of the OpenAI and
Anthropic providers: the API key read from the variable the agent names at
call time (a placeholder when it names none), one async SDK client per key
made and used on the provider's own :class:`~.bridge.LoopThread`, a request
abandoned the moment the run's cancel event is set
(:class:`~.base.ProviderCanceled`), the hint an HTTP status earns in an
error, and the key scrubbed from every error text. It knows no SDK and no
wire format: the subclasses do.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .base import OnText, ProviderCanceled, ProviderError, one_line
from .bridge import Canceled, LoopThread

__all__ = ["HttpProvider"]

T = TypeVar("T")


class HttpProvider:
    """The shared part of a provider that calls an endpoint through an async SDK client.

    ``base_url`` is where requests go (never an SDK's environment default);
    ``api_key_env`` the variable holding the key (None: a placeholder key
    is sent, for local servers that need none); ``timeout_s`` bounds
    connecting and each wait for data.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None, timeout_s: float) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self._loop = LoopThread("kxen-provider")
        self._client: Any = None  # created and used on the loop's thread only
        self._client_key: str | None = None

    def _call(self, make: Callable[[Callable[[str], None]], Coroutine[Any, Any, T]], *,
              cancel: threading.Event | None, on_text: OnText | None) -> T:
        """Run ``make(emit)`` on the loop thread; :class:`ProviderCanceled` if ``cancel`` is set first."""
        try:
            return self._loop.call(make, cancel=cancel, on_text=on_text)
        except Canceled:
            raise ProviderCanceled(f"the request to the model provider at {self.base_url} was aborted "
                                   "(its connection closed) because the run was canceled") from None

    async def _client_for(self, key: str, new: Callable[[str], Any]) -> Any:
        """The client for ``key`` (``new(key)`` makes one): a changed key (rotated in the environment) gets a fresh one."""
        if self._client is None or self._client_key != key:
            if self._client is not None:
                await self._client.close()
            self._client = new(key)
            self._client_key = key
        return self._client

    def close(self) -> None:
        """Close the HTTP client and stop the loop thread."""
        if self._client is not None:
            client, self._client = self._client, None
            close: Callable[[], Awaitable[Any]] = client.close
            self._loop.run(close)
        self._loop.close()

    def _api_key(self) -> str:
        if self.api_key_env is None:
            return "not-needed"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ProviderError(
                f"environment variable {self.api_key_env} is not set or empty; export the API key for "
                f"{self.base_url} in it",
                transient=False,
            )
        return key

    def _status_hint(self, status: int, transient: bool) -> str:
        """What to do about an HTTP error status, for the error's text."""
        if transient:
            return "the server may accept it later"
        if status in (401, 403):
            return (f"check the API key in {self.api_key_env}" if self.api_key_env
                    else "the server wants an API key; set api_key_env")
        if status == 404:
            return f"check the model name '{self.model}' and the base URL"
        return "the request was rejected; check the model and the base URL"

    def _stream_broke(self, cause: BaseException, key: str) -> ProviderError:
        return self._scrub(ProviderError(
            f"the connection to the model provider at {self.base_url} broke in the middle of the streamed "
            f"answer ({one_line(f'{type(cause).__name__}: {cause}')})", transient=True), key)

    def _scrub(self, err: ProviderError, key: str) -> ProviderError:
        # A server may echo the key back in an error body; it never reaches a terminal or a log.
        text = str(err)
        if len(key) >= 4 and key in text:
            return ProviderError(text.replace(key, "[REDACTED]"), transient=err.transient, status=err.status,
                                 retry_after=err.retry_after)
        return err
