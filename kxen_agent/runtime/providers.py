"""Model providers: the one seam between a run and a language model.

This module owns the :class:`Provider` protocol, the message format that
crosses it, and two providers: :class:`ScriptProvider` (a deterministic,
offline model for tests and demos) and :class:`OpenAIProvider` (any Chat
Completions endpoint). It also maps provider failures to
:class:`ProviderError` with a ``transient`` verdict the runtime can act on.

It must never log, store or print an API key: keys are read from the
environment at call time and scrubbed from every error message. It never
retries on its own beyond the SDK's ``max_retries``; retry policy belongs to
the runtime.

Messages in and out are Chat Completions style plain dicts::

    {"role": "system" | "user" | "assistant" | "tool",
     "content": str | None,
     "tool_calls": [{"id": str, "name": str, "arguments": str}],  # assistant only, optional
     "tool_call_id": str}                                          # tool only

Internal tool calls are flat ``{"id", "name", "arguments"}``; only the OpenAI
provider knows OpenAI's nested ``{"id", "type": "function", "function": {...}}``.
``openai`` is imported lazily so everything else works without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kxen_agent.errors import KxenError, UsageError

__all__ = [
    "AssistantTurn",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ScriptProvider",
    "ToolCall",
    "make_provider",
]

SCRIPT_FINISHED = "script finished"
_ROLES = ("system", "user", "assistant", "tool")
# HTTP statuses worth retrying later: the same set the OpenAI SDK retries.
_TRANSIENT_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``arguments`` is JSON text."""

    id: str | None  # None: the server gave none (the runner makes one)
    name: str
    arguments: str


@dataclass(frozen=True)
class AssistantTurn:
    """The model's answer to one request: text, tool calls, or both."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    model: str


class ProviderError(KxenError):
    """The provider could not produce a turn.

    ``transient`` is True when the same request may succeed later (connection
    failure, timeout, 408/409/429, 5xx), False when it never will as is (bad
    request, bad key, missing key, unknown model). ``status`` is the HTTP
    status, when there was one.
    """

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


class Provider(Protocol):
    """A language model behind one call: history + tool specs -> next turn."""

    model: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> AssistantTurn: ...


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- script provider ---------------------------------------------------------


class ScriptProvider:
    """A deterministic provider that plays back a list of steps.

    Each step is ``{"content": str | None, "tool_calls": [{"name": str,
    "arguments": dict}]}`` (both keys optional). The step played is the number
    of assistant messages already in the history, so the answer is a pure
    function of the history: a resumed or forked session gets the same turn
    it would have got the first time. Tool call ids are ``call_<step>_<n>``
    and arguments are canonical JSON (sorted keys, no spaces).

    Past the last step it returns a final turn with content
    ``"script finished"`` and no tool calls, so a run always ends.
    """

    def __init__(self, steps: Sequence[Mapping[str, Any]], model: str = "script") -> None:
        self.model = model
        self._turns = tuple(self._compile(i, step) for i, step in enumerate(steps))

    def _compile(self, index: int, step: object) -> tuple[str | None, tuple[ToolCall, ...]]:
        where = f"script step {index}"
        if not isinstance(step, Mapping):
            raise UsageError(f"{where} must be an object, got {type(step).__name__}; fix the agent's script")
        unknown = sorted(set(step) - {"content", "tool_calls"})
        if unknown:
            raise UsageError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: content, tool_calls")
        content = step.get("content")
        if content is not None and not isinstance(content, str):
            raise UsageError(f"{where}: content must be a string or null; fix the agent's script")
        raw_calls = step.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise UsageError(f"{where}: tool_calls must be a list; fix the agent's script")
        calls: list[ToolCall] = []
        for n, call in enumerate(raw_calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise UsageError(f"{where}, tool call {n}: needs a string 'name'; fix the agent's script")
            args = call.get("arguments", {})
            if not isinstance(args, Mapping):
                raise UsageError(f"{where}, tool call {n}: arguments must be an object; fix the agent's script")
            calls.append(ToolCall(id=f"call_{index}_{n}", name=call["name"], arguments=_canonical(args)))
        return content, tuple(calls)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> AssistantTurn:
        step = sum(1 for m in messages if m.get("role") == "assistant")
        if step >= len(self._turns):
            return AssistantTurn(content=SCRIPT_FINISHED, tool_calls=(), model=self.model)
        content, calls = self._turns[step]
        return AssistantTurn(content=content, tool_calls=calls, model=self.model)


# --- OpenAI provider ---------------------------------------------------------


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


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class OpenAIProvider:
    """Any OpenAI-compatible Chat Completions endpoint.

    The API key is read from ``api_key_env`` on every call (never stored in a
    lock or a session); with ``api_key_env=None`` a placeholder key is sent,
    for local servers that need none. ``max_retries`` is the SDK's own retry
    count for transient failures, after which :class:`ProviderError` is raised.
    """

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key_env: str | None,
        timeout_s: float = 60,
        max_retries: int = 2,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._client: Any = None
        self._client_key: str | None = None

    def _where(self) -> str:
        if self._client is not None:
            return str(self._client.base_url).rstrip("/")
        return self.base_url or "the default OpenAI base URL"

    def _api_key(self) -> str:
        if self.api_key_env is None:
            return "not-needed"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ProviderError(
                f"environment variable {self.api_key_env} is not set or empty; export the API key for "
                f"{self.base_url or 'the OpenAI API'} in it",
                transient=False,
            )
        return key

    def _get_client(self, key: str) -> Any:
        try:
            import openai  # lazy: the package is an optional extra
        except ImportError:
            raise ProviderError(
                "the openai provider needs the openai package; install it with: pip install 'kxen-agent[openai]'",
                transient=False,
            ) from None
        if self._client is None or self._client_key != key:
            # A changed key (rotated in the environment) gets a fresh client.
            self._client = openai.OpenAI(
                base_url=self.base_url,
                api_key=key,
                timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
            self._client_key = key
        return self._client

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> AssistantTurn:
        key = self._api_key()
        client = self._get_client(key)
        import openai

        request: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai(m, i) for i, m in enumerate(messages)],
        }
        if tools:
            request["tools"] = tools
        try:
            response = client.chat.completions.create(**request)
        except openai.OpenAIError as e:
            raise self._map_error(e, key) from None
        return self._parse(response, key)

    def _map_error(self, exc: Exception, key: str) -> ProviderError:
        import openai

        where = self._where()
        tries = f"after {self.max_retries + 1} attempt(s)"
        if isinstance(exc, openai.APITimeoutError):
            msg = f"model provider at {where} timed out after {self.timeout_s:g}s {tries}; retry later"
            err = ProviderError(msg, transient=True)
        elif isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            detail = _one_line(f"{type(cause).__name__}: {cause}")
            msg = f"cannot reach model provider at {where} {tries} ({detail}); check the URL and retry later"
            err = ProviderError(msg, transient=True)
        elif isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = exc.body
            detail = body.get("message") if isinstance(body, Mapping) else None
            detail = _one_line(str(detail if detail is not None else exc.message))
            transient = status in _TRANSIENT_STATUSES or status >= 500
            if transient:
                hint = f"{tries}; retry later"
            elif status == 401 or status == 403:
                hint = f"check the API key in {self.api_key_env}" if self.api_key_env else "the server wants an API key; set api_key_env"
            elif status == 404:
                hint = f"check the model name '{self.model}' and the base URL"
            else:
                hint = "the request was rejected; check the model and the base URL"
            msg = f"model provider at {where} returned HTTP {status}: {detail}; {hint}"
            err = ProviderError(msg, transient=transient, status=status)
        else:
            msg = f"model provider at {where} failed: {_one_line(str(exc))}; check the base URL and model"
            err = ProviderError(msg, transient=False)
        return self._scrub(err, key)

    def _scrub(self, err: ProviderError, key: str) -> ProviderError:
        # A server may echo the key back in an error body; it never reaches a terminal or a log.
        text = str(err)
        if len(key) >= 4 and key in text:
            return ProviderError(text.replace(key, "[REDACTED]"), transient=err.transient, status=err.status)
        return err

    def _parse(self, response: Any, key: str) -> AssistantTurn:
        choices = getattr(response, "choices", None)
        if not choices:
            raise self._scrub(
                ProviderError(f"model provider at {self._where()} returned no choices; check the model", transient=False),
                key,
            )
        message = choices[0].message
        for c in message.tool_calls or ():
            fn = getattr(c, "function", None)
            if getattr(c, "type", "function") == "function" and not (
                    isinstance(getattr(fn, "name", None), str) and fn.name
                    and isinstance(getattr(fn, "arguments", None) or "", str)):
                # Nothing could run it or pair a result with it: the answer is unusable, not the run.
                raise self._scrub(ProviderError(
                    f"model provider at {self._where()} returned a tool call without a function name or with "
                    "non-text arguments; check the model's tool-calling support", transient=False), key)
        if message.content is not None and not isinstance(message.content, str):
            raise self._scrub(ProviderError(f"model provider at {self._where()} returned non-text content",
                                            transient=False), key)
        calls = tuple(
            # A missing or non-text id is replaced by the runner's own (§14.1).
            ToolCall(id=c.id if isinstance(c.id, str) else None, name=c.function.name,
                     arguments=c.function.arguments or "{}")
            for c in (message.tool_calls or ())
            # Only function calls exist in our protocol; other kinds are not ours to run.
            if getattr(c, "type", "function") == "function"
        )
        return AssistantTurn(content=message.content, tool_calls=calls, model=getattr(response, "model", None) or self.model)


# --- construction from a lock ------------------------------------------------


def make_provider(lock: Mapping[str, Any]) -> Provider:
    """The provider an agent lock body describes.

    Keys: ``provider`` ("script" | "openai"), ``model``, ``base_url``,
    ``api_key_env``, ``script`` (canonical JSON text of the steps, or None).
    """
    kind = lock.get("provider")
    model = lock.get("model")
    if kind == "script":
        text = lock.get("script")
        if not isinstance(text, str):
            raise UsageError("agent lock has provider 'script' but no script; add the steps to the agent")
        try:
            steps = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"agent lock script is not valid JSON ({e}); fix the agent's script") from None
        if not isinstance(steps, list):
            raise UsageError("agent lock script must be a JSON list of steps; fix the agent's script")
        return ScriptProvider(steps, model=model or "script")
    if kind == "openai":
        if not isinstance(model, str) or not model:
            raise UsageError("agent lock has provider 'openai' but no model; set the model name")
        return OpenAIProvider(base_url=lock.get("base_url"), model=model, api_key_env=lock.get("api_key_env"))
    raise UsageError(f"agent lock names unknown provider {kind!r}; use 'script' or 'openai'")
