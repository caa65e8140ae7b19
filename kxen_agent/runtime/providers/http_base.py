"""What every provider behind an HTTP SDK shares: the key, the client, the request, cancellation, errors.

This module owns :class:`HttpProvider`, the base of the OpenAI and
Anthropic providers: the API key read from the variable the agent names at
call time (a placeholder when it names none), one async SDK client per key
made (never with the SDK's own retries, URL or credentials) and used on the
provider's own :class:`~.bridge.LoopThread`, the request and its streamed
answer read piece by piece, a request abandoned the moment the run's cancel
event is set (:class:`~.base.ProviderCanceled`), the mapping of a timeout,
an unreachable server or a stream cut off to an error, the hint an HTTP
status earns, the server's ``Retry-After`` and ``x-should-retry``, and the
key scrubbed from every error text. It relies only on what both official
SDKs share (``APIStatusError``, ``APIConnectionError``,
``APITimeoutError``, a closable response); the wire format and the SDK's
names are the subclasses'.
"""
from __future__ import annotations

import abc
import asyncio
import email.utils
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from kxen_agent.runtime.answer_check import AnswerLimits, check_turn

from .base import AssistantTurn, OnText, ProviderCanceled, ProviderError, one_line
from .bridge import Canceled, DeadlineExceeded, LoopThread

__all__ = ["DEFAULT_MODEL_DEADLINE_S", "HttpProvider", "StreamedAnswer", "retry_after_s", "should_retry"]

#: The overall deadline of one model call by default (``[policy] model_timeout_s``): long enough
#: for an 8,192-token answer at under 30 tokens a second, short enough that a server trickling
#: a token now and then cannot hold a run (the read timeout alone never fires on it).
DEFAULT_MODEL_DEADLINE_S = 300.0

T = TypeVar("T")


def retry_after_s(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """The delay a response asks for: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date).

    None when neither is there or readable; never negative.
    """
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if math.isnan(value):
            continue
        return max(value, 0.0)
    raw = headers.get("retry-after")
    if raw:
        try:
            when = email.utils.parsedate_to_datetime(raw).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        return max(when - (time.time() if now is None else now), 0.0)
    return None


def should_retry(headers: Mapping[str, str] | None) -> bool | None:
    """The server's own word on whether a retry can help (``x-should-retry``), or None when it says nothing."""
    should = (headers.get("x-should-retry") or "").strip().lower() if headers is not None else ""
    return should == "true" if should in ("true", "false") else None


class StreamedAnswer(Protocol):
    """A streamed answer being put back together (each provider's own wire format)."""

    def add(self, event: Any) -> str | None:
        """Take one event of the stream; the text it adds, if any (shown as it comes)."""


class HttpProvider(abc.ABC):
    """The shared part of a provider that calls an endpoint through an async SDK client.

    ``base_url`` is where requests go (never an SDK's environment default);
    ``api_key_env`` the variable holding the key (None: a placeholder key
    is sent, for local servers that need none); ``timeout_s`` bounds
    connecting and each wait for data; ``deadline_s`` the whole call
    (:class:`ProviderError`, not transient, when it passes); ``limits`` the
    answer (:func:`~kxen_agent.runtime.answer_check.check_turn`, applied to
    every turn before it is returned).

    A subclass supplies its SDK and wire format through the methods under
    "what a provider supplies"; :meth:`complete` and the request are here.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None, timeout_s: float,
                 deadline_s: float | None = None, limits: AnswerLimits | None = None) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.deadline_s = DEFAULT_MODEL_DEADLINE_S if deadline_s is None else deadline_s
        self.limits = limits or AnswerLimits()
        self._loop = LoopThread("kxen-provider")
        self._client: Any = None  # created and used on the loop's thread only
        self._client_key: str | None = None

    # ------------------------------------------------------------ what a provider supplies

    @abc.abstractmethod
    def _sdk(self) -> Any:
        """The SDK module (imported on first use: it is an optional extra)."""
        ...

    @abc.abstractmethod
    def _new_client(self, sdk: Any, options: dict[str, Any]) -> Any:
        """The SDK's async client made with ``options`` (:meth:`_client_options`)."""
        ...

    @abc.abstractmethod
    def _sdk_error(self, sdk: Any) -> type[Exception]:
        """The base class of every error the SDK raises for a request."""
        ...

    @abc.abstractmethod
    def _request_body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                      stream: bool) -> dict[str, Any]:
        """The request for ``messages`` and ``tools`` in the endpoint's wire format (streamed if ``stream``)."""
        ...

    @abc.abstractmethod
    def _send(self, client: Any, request: dict[str, Any]) -> Awaitable[Any]:
        """Send ``request`` with ``client``: the answer, or the stream of its events."""
        ...

    @abc.abstractmethod
    def _parse(self, response: Any, key: str) -> AssistantTurn:
        """The turn of a whole (unstreamed) answer."""
        ...

    @abc.abstractmethod
    def _new_stream(self) -> StreamedAnswer:
        """An empty streamed answer, fed the stream's events one by one."""
        ...

    @abc.abstractmethod
    def _streamed_turn(self, streamed: Any, key: str) -> AssistantTurn:
        """The turn of a stream read to its end; a :class:`ProviderError` if it was cut short."""
        ...

    @abc.abstractmethod
    def _status_error(self, sdk: Any, exc: Any) -> ProviderError:
        """The error for the SDK's ``APIStatusError`` ``exc`` (an HTTP status, or an error event in a stream)."""
        ...

    # ------------------------------------------------------------ the call

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                 cancel: threading.Event | None = None, on_text: OnText | None = None) -> AssistantTurn:
        key = self._api_key()
        sdk = self._sdk()
        request = self._request_body(messages, tools, stream=on_text is not None)

        def make(emit: Callable[[str], None]) -> Any:
            return self._request(sdk, key, request, emit if on_text is not None else None)

        # The door (answer_check): nothing a model sends reaches the runner's records unchecked.
        return check_turn(self._call(make, cancel=cancel, on_text=on_text), self.limits)

    def _client_options(self, key: str) -> dict[str, Any]:
        # api_key and base_url explicit: the SDK then reads no credential or
        # URL of its own; no retries of its own: one retry policy, the runtime's.
        return {"base_url": self.base_url, "api_key": key, "timeout": self.timeout_s, "max_retries": 0}

    async def _request(self, sdk: Any, key: str, request: dict[str, Any],
                       emit: Callable[[str], None] | None) -> AssistantTurn:
        """One request on the loop thread: the turn, its text passed to ``emit`` as it streams (if given)."""
        client = await self._client_for(key, lambda k: self._new_client(sdk, self._client_options(k)))
        try:
            response = await self._send(client, request)
            if emit is None:
                return self._parse(response, key)
        except self._sdk_error(sdk) as e:
            raise self._map_error(sdk, e, key) from None
        except RecursionError:
            # An answer nested past what the SDK's parser (or ours) can read: nothing of it exists to record.
            raise ProviderError(f"the answer from the model provider at {self.base_url} is nested too deeply to "
                                "read; nothing of it was recorded", transient=False) from None
        streamed = self._new_stream()
        try:
            async for event in response:
                piece = streamed.add(event)
                if piece:
                    emit(piece)
        except asyncio.CancelledError:
            raise
        except sdk.APIStatusError as e:  # an error event in the stream
            raise self._map_error(sdk, e, key) from None
        except Exception as e:  # noqa: BLE001 - the transport's, raw or wrapped by the SDK (versions differ)
            cause = e.__cause__ if isinstance(e, sdk.APIConnectionError) and e.__cause__ is not None else e
            raise self._stream_broke(cause, key) from None
        finally:
            await response.close()
        return self._streamed_turn(streamed, key)

    def _call(self, make: Callable[[Callable[[str], None]], Coroutine[Any, Any, T]], *,
              cancel: threading.Event | None, on_text: OnText | None) -> T:
        """Run ``make(emit)`` on the loop thread; :class:`ProviderCanceled` if ``cancel`` is set first."""
        try:
            return self._loop.call(make, cancel=cancel, on_text=on_text, deadline_s=self.deadline_s)
        except DeadlineExceeded:
            raise ProviderError(f"the model provider at {self.base_url} did not complete its answer within "
                                f"{self.deadline_s:g}s, the model-call deadline ([policy] model_timeout_s); the "
                                "request was aborted and nothing of its answer was recorded", transient=False) from None
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

    # ------------------------------------------------------------ errors

    def _map_error(self, sdk: Any, exc: Exception, key: str) -> ProviderError:
        """The :class:`ProviderError` for an error of the SDK's, the key scrubbed from it."""
        where = self.base_url
        if isinstance(exc, sdk.APITimeoutError):
            err = ProviderError(f"model provider at {where} timed out after {self.timeout_s:g}s", transient=True)
        elif isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__ or exc
            detail = one_line(f"{type(cause).__name__}: {cause}")
            err = ProviderError(f"cannot reach model provider at {where} ({detail}); check the URL", transient=True)
        elif isinstance(exc, sdk.APIStatusError):
            err = self._status_error(sdk, exc)
        else:
            err = ProviderError(f"model provider at {where} failed: {one_line(str(exc))}; check the base URL and model",
                                transient=False)
        return self._scrub(err, key)

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
