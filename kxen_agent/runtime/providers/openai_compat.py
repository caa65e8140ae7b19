"""The OpenAI-compatible provider: any Chat Completions endpoint with tool calling.

This module owns talking to such an endpoint through the official SDK
(OpenAI, vLLM, Ollama, llama.cpp server): converting messages, asking for
an answer (streamed when someone watches it), reading the answer, its
finish reason and usage, and mapping every failure to a
:class:`~.base.ProviderError` with a ``transient`` verdict and the server's
``Retry-After``.

It must never log, store or print an API key: the key is read from the
environment variable the agent names, at call time, and scrubbed from
every error message. It never reads ``OPENAI_API_KEY`` or
``OPENAI_BASE_URL`` (the SDK's defaults): a key goes only to the endpoint
the agent, or the run's ``--base-url``, names. It never retries — the SDK's
retries are off and the runtime's retry policy decides — and it returns
within a poll interval of the run's cancel event, closing the connection
(the request runs as an asyncio task on :class:`~.bridge.LoopThread`).

``openai`` is imported lazily so everything else works without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from kxen_agent.runtime.answer_check import AnswerLimits, refused_arguments

from .base import AssistantTurn, ProviderError, ToolCall, Usage, one_line
from .http_base import HttpProvider, retry_after_s, should_retry

__all__ = ["DEFAULT_BASE_URL", "OpenAIProvider"]

#: Where a lock without ``base_url`` sends its requests (the SDK's default,
#: named here so it is recorded, and so ``OPENAI_BASE_URL`` never redirects a key).
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_ROLES = ("system", "user", "assistant", "tool")
# HTTP statuses worth retrying later: the same set the OpenAI SDK retries.
_TRANSIENT_STATUSES = frozenset({408, 409, 429})


def _to_openai(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    role = message.get("role")
    if role not in _ROLES:
        raise ProviderError(
            f"message {index} has role {role!r}; expected one of {', '.join(_ROLES)}", transient=False
        )
    out: dict[str, Any] = {"role": role, "content": message.get("content")}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in message["tool_calls"]
        ]
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    prompt = getattr(raw, "prompt_tokens", None)
    completion = getattr(raw, "completion_tokens", None)
    if not (type(prompt) is int and type(completion) is int and prompt >= 0 and completion >= 0):
        return None  # a server that reports nonsense reports nothing
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return Usage(prompt, completion, cached if type(cached) is int and cached >= 0 else None)


class _Streamed:
    """A streamed answer put back together from its chunks."""

    def __init__(self, max_argument_bytes: int | None = None) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        # Arguments past this many characters are counted, not kept: a 50 MB argument the
        # door refuses anyway must not be held (its pieces cost far more than their text).
        self.max_argument_chars = max_argument_bytes
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None

    def add(self, chunk: Any) -> str | None:
        """Take one chunk; the text it adds, if any."""
        self.model = getattr(chunk, "model", None) or self.model
        usage = _usage(getattr(chunk, "usage", None))
        if usage is not None:
            self.usage = usage
        piece = None
        for choice in getattr(chunk, "choices", None) or ():
            if getattr(choice, "index", 0) != 0:
                continue
            delta = getattr(choice, "delta", None)
            text = getattr(delta, "content", None)
            if isinstance(text, str) and text:
                self.text.append(text)
                piece = text
            for tc in getattr(delta, "tool_calls", None) or ():
                index = getattr(tc, "index", None)
                slot = self.calls.setdefault(index if isinstance(index, int) else len(self.calls),
                                             {"id": None, "type": None, "name": None, "arguments": [],
                                              "size": 0})
                if getattr(tc, "id", None) is not None:
                    slot["id"] = tc.id
                if getattr(tc, "type", None) is not None:
                    slot["type"] = tc.type
                fn = getattr(tc, "function", None)
                name = getattr(fn, "name", None)
                if isinstance(name, str) and name and not slot["name"]:
                    slot["name"] = name  # sent once, in the call's first chunk
                args = getattr(fn, "arguments", None)
                if isinstance(args, str):
                    slot["size"] += len(args)
                    if self.max_argument_chars is None or slot["size"] <= self.max_argument_chars:
                        slot["arguments"].append(args)
                    elif slot["arguments"]:
                        slot["arguments"] = []
            reason = getattr(choice, "finish_reason", None)
            if reason is not None:
                self.finish_reason = reason
        return piece


class OpenAIProvider(HttpProvider):
    """Any OpenAI-compatible Chat Completions endpoint.

    The API key is read from ``api_key_env`` on every call (never stored in a
    lock or a session); with ``api_key_env=None`` a placeholder key is sent,
    for local servers that need none. ``timeout_s`` bounds connecting and
    each wait for data (with streaming: for the next piece of the answer).
    """

    def __init__(self, base_url: str | None, model: str, api_key_env: str | None, timeout_s: float = 120,
                 deadline_s: float | None = None, limits: AnswerLimits | None = None,
                 max_tokens: int | None = None, temperature: float | None = None) -> None:
        super().__init__(base_url or DEFAULT_BASE_URL, model, api_key_env, timeout_s, deadline_s, limits)
        # The lock's [model] settings (None: not sent, the server's default).
        self.max_tokens, self.temperature = max_tokens, temperature

    # ------------------------------------------------------------ the SDK and the request

    def _sdk(self) -> Any:
        return _sdk()

    def _new_client(self, sdk: Any, options: dict[str, Any]) -> Any:
        return sdk.AsyncOpenAI(**options)

    def _sdk_error(self, sdk: Any) -> type[Exception]:
        return sdk.OpenAIError

    def _request_body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                      stream: bool) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai(m, i) for i, m in enumerate(messages)],
        }
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if tools:
            request["tools"] = tools
        if stream:
            request["stream"] = True
            # The usage of a streamed answer comes in a last chunk, only when asked for.
            request["stream_options"] = {"include_usage": True}
        return request

    def _send(self, client: Any, request: dict[str, Any]) -> Awaitable[Any]:
        return client.chat.completions.create(**request)

    def _new_stream(self) -> _Streamed:
        return _Streamed(self.limits.max_argument_bytes)

    def _streamed_turn(self, streamed: _Streamed, key: str) -> AssistantTurn:
        if streamed.finish_reason is None:
            # A stream that ends without saying why was cut short: the answer is incomplete.
            raise ProviderError(f"the streamed answer from the model provider at {self.base_url} ended before "
                                "it was complete (no finish_reason)", transient=True)
        limit = streamed.max_argument_chars
        calls = [(c["id"], c["type"] or "function", c["name"],
                  "".join(c["arguments"]) if limit is None or c["size"] <= limit else refused_arguments(
                      f"arguments of {c['size']:,} characters, over the limit of {limit:,} bytes "
                      "([policy] max_argument_bytes); send less at a time"))
                 for _, c in sorted(streamed.calls.items())]
        return self._turn("".join(streamed.text) if streamed.text else None, calls, streamed.finish_reason,
                          streamed.usage, streamed.model, key)

    # ------------------------------------------------------------ errors

    def _status_error(self, sdk: Any, exc: Any) -> ProviderError:
        status = exc.status_code
        body = exc.body
        detail = body.get("message") if isinstance(body, Mapping) else None
        detail = one_line(str(detail if detail is not None else exc.message))
        headers = getattr(getattr(exc, "response", None), "headers", None)
        transient = status in _TRANSIENT_STATUSES or status >= 500
        # The server may say outright whether a retry can help (OpenAI does).
        should = should_retry(headers)
        if should is not None:
            transient = should
        hint = self._status_hint(status, transient)
        return ProviderError(f"model provider at {self.base_url} returned HTTP {status}: {detail}; {hint}",
                             transient=transient, status=status, retry_after=retry_after_s(headers))

    # ------------------------------------------------------------ answers

    def _parse(self, response: Any, key: str) -> AssistantTurn:
        choices = getattr(response, "choices", None)
        if not choices:
            raise self._scrub(
                ProviderError(f"model provider at {self.base_url} returned no choices; check the model", transient=False),
                key,
            )
        choice = choices[0]
        message = choice.message
        calls = [(c.id, getattr(c, "type", None) or "function", getattr(getattr(c, "function", None), "name", None),
                  getattr(getattr(c, "function", None), "arguments", None))
                 for c in (message.tool_calls or ())]
        return self._turn(message.content, calls, getattr(choice, "finish_reason", None),
                          _usage(getattr(response, "usage", None)), getattr(response, "model", None), key)

    def _turn(self, content: Any, calls: list[tuple[Any, Any, Any, Any]], finish_reason: Any,
              usage: Usage | None, model: Any, key: str) -> AssistantTurn:
        """The turn from an answer's parts (streamed or not), refusing what nothing could use."""
        if content is not None and not isinstance(content, str):
            raise self._scrub(ProviderError(f"model provider at {self.base_url} returned non-text content",
                                            transient=False), key)
        usable: list[ToolCall] = []
        dropped: list[str] = []
        for cid, kind, name, arguments in calls:
            if kind != "function":
                # Only function calls exist in our protocol; other kinds are not ours to run.
                dropped.append(str(kind))
                continue
            if not (isinstance(name, str) and name and isinstance(arguments or "", str)):
                # Nothing could run it or pair a result with it: the answer is unusable, not the run.
                raise self._scrub(ProviderError(
                    f"model provider at {self.base_url} returned a tool call without a function name or with "
                    "non-text arguments; check the model's tool-calling support", transient=False), key)
            # A missing or non-text id is replaced by the runner's own (§14.1).
            usable.append(ToolCall(id=cid if isinstance(cid, str) else None, name=name, arguments=arguments or "{}"))
        return AssistantTurn(content=content, tool_calls=tuple(usable),
                             model=model if isinstance(model, str) and model else self.model,
                             finish_reason=finish_reason if isinstance(finish_reason, str) else None,
                             usage=usage, dropped_calls=tuple(dropped))


def _sdk() -> Any:
    try:
        import openai  # lazy: the package is an optional extra
    except ImportError:
        from .sdk import missing_sdk_error

        raise missing_sdk_error() from None
    return openai
