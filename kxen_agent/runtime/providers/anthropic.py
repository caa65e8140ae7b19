"""The Anthropic provider: the Messages API with tool use, through the official SDK.

This module owns talking to an Anthropic Messages endpoint: converting the
run's Chat Completions style history (:mod:`.base`) into Messages API form
(the system prompt as ``system``, tool calls as ``tool_use`` blocks, tool
results as ``tool_result`` blocks of a user turn, consecutive turns of one
role merged), asking for an answer (streamed when someone watches it),
putting a streamed answer back together from its events, reading a whole
answer's body itself (never through the SDK's parser, which recurses once
per level: a tool input 1,500 deep must become that call's refusal by the
door, not a failed run), and mapping every
failure — HTTP errors, an ``error`` event in the stream (``overloaded_error``),
a stream cut off — to a :class:`~.base.ProviderError` with a ``transient``
verdict and the server's ``Retry-After``.

The answer's ``stop_reason`` is reported in the runner's vocabulary (the
Chat Completions one): ``end_turn`` and ``stop_sequence`` are ``stop``,
``tool_use`` is ``tool_calls``, ``max_tokens`` and
``model_context_window_exceeded`` are ``length`` (cut off), ``refusal`` is
``content_filter`` (withheld); any other is passed on as it is.

It must never log, store or print an API key: the key is read from the
variable the agent names, at call time, passed to the SDK explicitly (so
the SDK never looks at ``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN`` or a
profile on disk), and scrubbed from every error message; ``base_url`` is
always passed too, so ``ANTHROPIC_BASE_URL`` never redirects a key. It
never retries — the SDK's retries are off and the runtime's retry policy
decides — and it returns within a poll interval of the run's cancel event,
closing the connection (the request runs on :class:`~.bridge.LoopThread`).

``anthropic`` is imported lazily so everything else works without it.

Limitations: every request asks for at most :data:`MAX_TOKENS` output
tokens (an answer longer than that ends ``length`` and fails the run);
text and tool use are the only content blocks read (``thinking`` and
server-tool blocks are ignored, and named in ``dropped_calls`` when they
are tool calls of the server's).
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Awaitable, Mapping
from typing import Any

from kxen_agent.runtime.answer_check import (MAX_DEPTH, AnswerLimits, BadArguments, clean_text, parse_arguments,
                                              refused_arguments)

from .base import AssistantTurn, ProviderError, ToolCall, Usage, one_line
from .http_base import HttpProvider, retry_after_s, should_retry

__all__ = ["DEFAULT_ANTHROPIC_URL", "MAX_TOKENS", "AnthropicProvider", "to_messages"]

#: Where a lock without ``base_url`` sends its requests (the SDK's default, named
#: here so it is recorded in the run, and so ``ANTHROPIC_BASE_URL`` never redirects a key).
DEFAULT_ANTHROPIC_URL = "https://api.anthropic.com"
#: The output-token limit of every request (the Messages API requires one).
MAX_TOKENS = 8192
# HTTP statuses worth retrying later (529 is Anthropic's "overloaded").
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
# Error types of an ``error`` event in a stream (its HTTP status was 200) that a later request may not meet.
_TRANSIENT_TYPES = frozenset({"overloaded_error", "rate_limit_error", "api_error", "timeout_error"})
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                 "model_context_window_exceeded": "length", "refusal": "content_filter"}


def _tool_input(arguments: str) -> dict[str, Any]:
    """A stored call's JSON arguments as the ``input`` object a ``tool_use`` block needs.

    Arguments that are not a JSON object (the model wrote bad JSON; the run
    refused the call) are sent back as they were, under one key, so the
    model sees what it wrote: as text, which no SDK recurses into, made
    valid Unicode (:mod:`~kxen_agent.runtime.answer_check`).
    """
    try:
        return parse_arguments(arguments or "{}")
    except BadArguments:
        return {"invalid_arguments": clean_text(arguments) if isinstance(arguments, str) else str(arguments)}


def to_messages(messages: list[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, Messages API ``messages``) of a Chat Completions style history.

    Tool results become ``tool_result`` blocks of a user turn; turns of one
    role in a row are merged into one (the API wants user and assistant to
    alternate); empty text is left out (the API refuses empty text blocks).
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ProviderError(f"message {i} has non-text content", transient=False)
        blocks: list[dict[str, Any]] = []
        if role == "system":
            if content:
                system.append(content)
            continue
        if role == "user":
            if content:
                blocks.append({"type": "text", "text": content})
        elif role == "assistant":
            if content and content.strip():
                blocks.append({"type": "text", "text": content})
            for c in m.get("tool_calls") or ():
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["name"],
                               "input": _tool_input(c["arguments"])})
        elif role == "tool":
            role = "user"
            blocks.append({"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": content or ""})
        else:
            raise ProviderError(f"message {i} has role {role!r}; expected one of system, user, assistant, tool",
                                transient=False)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _tools(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions function specs as Messages API tool definitions."""
    out = []
    for spec in specs:
        fn = spec.get("function", spec)
        out.append({"name": fn["name"], "description": fn.get("description", ""),
                    "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out


def _int(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _usage(raw: Any, output: Any = None) -> Usage | None:
    """Usage from a Messages API ``usage`` (input counts all of the prompt, cache reads and writes included)."""
    if raw is None:
        return None
    inp = _int(getattr(raw, "input_tokens", None))
    out = _int(output if output is not None else getattr(raw, "output_tokens", None))
    if inp is None or out is None:
        return None  # a server that reports nonsense reports nothing
    read = _int(getattr(raw, "cache_read_input_tokens", None))
    written = _int(getattr(raw, "cache_creation_input_tokens", None)) or 0
    return Usage(inp + (read or 0) + written, out, read)

# How deep a whole answer is read: message (1), content (2), block (3), then a tool input of up to
# MAX_DEPTH levels and one more, so that an input past the door's limit is seen to be past it.
_KEEP_DEPTH = 3 + MAX_DEPTH + 1
_WS = re.compile(r"[ \t\n\r]*")
_CLOSE = {"{": "}", "[": "]"}


class _TooDeep:
    """What stands, in an answer read by :func:`_load_answer`, for a container nested past what is kept."""


_TOO_DEEP = _TooDeep()


def _load_answer(body: bytes) -> Any:
    """The JSON value of a whole (unstreamed) answer's body, read by us rather than by the SDK.

    ``json.loads`` first (the common case, at C speed); for a body nested past what it
    takes (RecursionError: a tool input 1,500 deep), a loop without recursion that keeps
    containers down to :data:`_KEEP_DEPTH` and puts :data:`_TOO_DEEP` in place of any
    deeper one (skipped with its brackets matched; past :data:`_SKIP_STEPS`, RecursionError,
    which the provider reports as an answer too deep to read). Strings are decoded as
    ``json.loads`` decodes them (``surrogatepass``: a lone surrogate is left for the door
    to refuse, in the one call holding it). :class:`ValueError` when the body is not JSON.
    """
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    del body
    try:
        return json.loads(text)
    except RecursionError:
        return _load_bounded(text, _KEEP_DEPTH)


def _load_bounded(text: str, keep: int) -> Any:
    """``json.loads(text)`` with no recursion, containers deeper than ``keep`` replaced by :data:`_TOO_DEEP`.

    A replaced container is skipped by :func:`_skip_container`: its brackets matched and its
    strings delimited, in memory of one byte per level.
    """
    scan = json.scanner.make_scanner(json.JSONDecoder())  # for leaves only: it recurses into containers
    frames: list[list[Any]] = []  # [container, its opening bracket, the pending key]
    budget = [_SKIP_STEPS]

    def key_at(pos: int) -> tuple[str, int]:
        if text[pos:pos + 1] != '"':
            raise ValueError(f"expected a key at character {pos}")
        key, pos = _scanstring(text, pos + 1)
        pos = _WS.match(text, pos).end()
        if text[pos:pos + 1] != ":":
            raise ValueError(f"expected ':' at character {pos}")
        return key, _WS.match(text, pos + 1).end()

    pos = _WS.match(text, 0).end()
    while True:
        char = text[pos:pos + 1]
        if char in _CLOSE and len(frames) >= keep:
            value: Any = _TOO_DEEP
            pos = _skip_container(text, pos, budget)
        elif char in _CLOSE:  # a container opens
            frame = [{} if char == "{" else [], char, None]
            frames.append(frame)
            pos = _WS.match(text, pos + 1).end()
            if text[pos:pos + 1] != _CLOSE[char]:
                if char == "{":
                    frame[2], pos = key_at(pos)
                continue  # the first value in it
            frames.pop()
            value = frame[0]
            pos += 1
        else:
            try:
                value, pos = scan(text, pos)
            except StopIteration:
                raise ValueError(f"expected a value at character {pos}") from None
        while True:  # ``value`` ends at ``pos``: into its container, then what follows
            if not frames:
                if _WS.match(text, pos).end() != len(text):
                    raise ValueError(f"extra data at character {pos}")
                return value
            frame = frames[-1]
            container = frame[0]
            if isinstance(container, dict):
                container[frame[2]] = value
            else:
                container.append(value)
            pos = _WS.match(text, pos).end()
            char = text[pos:pos + 1]
            if char == ",":
                pos = _WS.match(text, pos + 1).end()
                if frame[1] == "{":
                    frame[2], pos = key_at(pos)
                break  # the next value in it
            if char != _CLOSE[frame[1]]:
                raise ValueError(f"expected ',' or {_CLOSE[frame[1]]!r} at character {pos}")
            frames.pop()
            value = container
            pos += 1


_scanstring = json.decoder.scanstring
_OPENING = re.compile(r"[\[{]+")
_CLOSING = re.compile(r"[\]}]+")
# What leaves no bracket open: other characters, strings, flat containers (matched at C speed, no backtracking).
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_FLAT = r'(?:[^"\[\]{}]|' + _STRING + r')*+'
_OTHER = re.compile(r'(?:[^"\[\]{}]++|' + _STRING + r'|\[' + _FLAT + r'\]|\{' + _FLAT + r'\})++')
#: Steps (runs of brackets, flat stretches) that skipping the over-deep parts of one answer may take: about a
#: second of CPU. An answer past it (millions of nested containers) is not read at all.
_SKIP_STEPS = 2_000_000
_TO_CLOSE = bytes.maketrans(b"[{", b"]}")


def _skip_container(text: str, pos: int, budget: list[int]) -> int:
    """Where the container opening at ``pos`` ends: brackets matched (runs of them at once), strings jumped
    over whole; what else it holds is not checked (it is refused as too deep, whatever it is). ValueError if
    unmatched; RecursionError once the answer's ``budget`` of steps is spent."""
    opened = bytearray()
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            raise RecursionError("too many nested containers to skip")
        char = text[pos:pos + 1]
        if char == "[" or char == "{":
            run = _OPENING.match(text, pos).group()
            opened += run.encode()
            pos += len(run)
        elif char == "]" or char == "}":
            run = _CLOSING.match(text, pos).group()[:len(opened)]
            if bytes(opened[-len(run):][::-1].translate(_TO_CLOSE)) != run.encode():
                raise ValueError(f"unmatched {run[0]!r} near character {pos}")
            del opened[-len(run):]
            pos += len(run)
            if not opened:
                return pos
        elif char:
            match = _OTHER.match(text, pos)
            if match is None:  # a string left open
                raise ValueError(f"unterminated string at character {pos}")
            pos = match.end()
        else:
            raise ValueError(f"a container left open at the end (character {pos})")


def _input_text(raw: Any, max_chars: int) -> str | None:
    """A tool_use block's ``input`` as the JSON text of the call's arguments (None: not an object).

    An input nested past :data:`~kxen_agent.runtime.answer_check.MAX_DEPTH` (or past what
    was kept of it), or whose strings alone hold more than ``max_chars`` characters, is
    the door's refusal at once: never written out as text (a copy as large as the answer).
    """
    if not isinstance(raw, dict):
        return None
    size = 0
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            size += len(value)
        elif value is _TOO_DEEP or depth > MAX_DEPTH and isinstance(value, (dict, list)):
            return refused_arguments(f"arguments nested more than {MAX_DEPTH} levels deep; send a flatter object")
        elif isinstance(value, dict):
            size += sum(len(k) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    if size > max_chars:
        return refused_arguments(f"arguments of more than {size:,} characters, over the limit of {max_chars:,} "
                                 "bytes ([policy] max_argument_bytes); send less at a time")
    return json.dumps(raw, ensure_ascii=False)


class _Whole:
    """The body of a whole answer, handed over once (so that it is freed as soon as it is read)."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    def take(self) -> bytes:
        body, self._body = self._body, None
        return body if body is not None else b""


class _Streamed:
    """A streamed answer put back together from its events."""

    def __init__(self, max_argument_bytes: int | None = None) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        # Input past this many characters is counted, not kept (see the OpenAI provider's).
        self.max_argument_chars = max_argument_bytes
        self.model: str | None = None
        self.stop_reason: str | None = None
        self.start_usage: Any = None
        self.output_tokens: Any = None
        self.stopped = False

    def add(self, event: Any) -> str | None:
        """Take one event; the text it adds, if any."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = getattr(event, "message", None)
            self.model = getattr(message, "model", None)
            self.start_usage = getattr(message, "usage", None)
        elif kind == "content_block_start":
            block = event.content_block
            btype = getattr(block, "type", None)
            slot: dict[str, Any] = {"type": btype, "text": [], "json": [], "size": 0}
            if btype == "text":
                text = getattr(block, "text", "") or ""
                slot["text"].append(text)
            elif btype == "tool_use":
                slot["id"] = getattr(block, "id", None)
                slot["name"] = getattr(block, "name", None)
            self.blocks[event.index] = slot
            return slot["text"][0] if btype == "text" and slot["text"][0] else None
        elif kind == "content_block_delta":
            slot = self.blocks.get(event.index)
            delta = event.delta
            dtype = getattr(delta, "type", None)
            if slot is None:
                return None
            if dtype == "text_delta":
                slot["text"].append(delta.text)
                return delta.text or None
            if dtype == "input_json_delta":
                piece = delta.partial_json
                slot["size"] += len(piece) if isinstance(piece, str) else 0
                if self.max_argument_chars is None or slot["size"] <= self.max_argument_chars:
                    slot["json"].append(piece)
                elif slot["json"]:
                    slot["json"] = []
        elif kind == "message_delta":
            reason = getattr(getattr(event, "delta", None), "stop_reason", None)
            if reason is not None:
                self.stop_reason = reason
            self.output_tokens = getattr(getattr(event, "usage", None), "output_tokens", None)
        elif kind == "message_stop":
            self.stopped = True
        return None

    def parts(self) -> tuple[list[str], list[tuple[Any, str, Any, str]]]:
        """(the text pieces, the tool calls as (id, type, name, arguments JSON text))."""
        text: list[str] = []
        calls: list[tuple[Any, str, Any, str]] = []
        for _, b in sorted(self.blocks.items()):
            if b["type"] == "text":
                text.extend(b["text"])
            elif b["type"] == "tool_use":
                limit = self.max_argument_chars
                if limit is not None and b["size"] > limit:
                    args = refused_arguments(f"arguments of {b['size']:,} characters, over the limit of {limit:,} "
                                             "bytes ([policy] max_argument_bytes); send less at a time")
                else:
                    args = "".join(p for p in b["json"] if isinstance(p, str)) or "{}"
                calls.append((b.get("id"), "tool_use", b.get("name"), args))
            elif b["type"] == "server_tool_use":
                calls.append((None, "server_tool_use", None, ""))
        return text, calls


class AnthropicProvider(HttpProvider):
    """An Anthropic Messages API endpoint.

    The API key is read from ``api_key_env`` on every call (never stored in
    a lock or a session); with ``api_key_env=None`` (a custom ``base_url``
    that names no variable) a placeholder is sent, for local servers that
    need none. ``timeout_s`` bounds connecting and each wait for data.
    """

    def __init__(self, base_url: str | None, model: str, api_key_env: str | None, timeout_s: float = 120,
                 max_tokens: int = MAX_TOKENS, deadline_s: float | None = None,
                 limits: AnswerLimits | None = None, temperature: float | None = None) -> None:
        super().__init__(base_url or DEFAULT_ANTHROPIC_URL, model, api_key_env, timeout_s, deadline_s, limits)
        self.max_tokens = max_tokens
        self.temperature = temperature  # the lock's [model] temperature (None: the server's default)

    # ------------------------------------------------------------ the SDK and the request

    def _sdk(self) -> Any:
        return _sdk()

    def _new_client(self, sdk: Any, options: dict[str, Any]) -> Any:
        return sdk.AsyncAnthropic(**options)

    def _sdk_error(self, sdk: Any) -> type[Exception]:
        return sdk.AnthropicError

    def _request_body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                      stream: bool) -> dict[str, Any]:
        system, converted = to_messages(messages)
        request: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": converted}
        if self.temperature is not None:
            # In the body as the API takes it (not every SDK version names it as a parameter).
            request["extra_body"] = {"temperature": self.temperature}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = _tools(tools)
        if stream:
            request["stream"] = True
        return request

    def _send(self, client: Any, request: dict[str, Any]) -> Awaitable[Any]:
        if request.get("stream"):
            return client.messages.create(**request)
        return self._send_whole(client, request)

    async def _send_whole(self, client: Any, request: dict[str, Any]) -> _Whole:
        # The body as it came: the SDK would parse it itself (recursing once per level, so an
        # answer 1,500 deep fails whole); _parse reads it within the door's limits instead.
        raw = await client.messages.with_raw_response.create(**request)
        return _Whole(await raw.read())

    def _new_stream(self) -> _Streamed:
        return _Streamed(self.limits.max_argument_bytes)

    def _streamed_turn(self, streamed: _Streamed, key: str) -> AssistantTurn:
        if streamed.stop_reason is None or not streamed.stopped:
            # A stream that ends without message_stop (or a stop reason) was cut short.
            raise ProviderError(f"the streamed answer from the model provider at {self.base_url} ended before "
                                "it was complete (no stop_reason or message_stop)", transient=True)
        text, calls = streamed.parts()
        return self._turn("".join(text) if text else None, calls, streamed.stop_reason,
                          _usage(streamed.start_usage, streamed.output_tokens), streamed.model, key)

    # ------------------------------------------------------------ errors

    def _status_error(self, sdk: Any, exc: Any) -> ProviderError:
        status = exc.status_code
        kind = getattr(exc, "type", None)
        body = exc.body
        error = body.get("error") if isinstance(body, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        detail = one_line(str(detail if detail is not None else exc.message))
        headers = getattr(getattr(exc, "response", None), "headers", None)
        transient = status in _TRANSIENT_STATUSES or status >= 500 or (status < 400 and kind in _TRANSIENT_TYPES)
        should = should_retry(headers)
        if should is not None and status >= 400:
            transient = should
        hint = self._status_hint(status, transient)
        what = f"HTTP {status}" if status >= 400 else "an error event in the streamed answer"
        return ProviderError(f"model provider at {self.base_url} returned {what}: {kind or 'error'}: {detail}; {hint}",
                             transient=transient, status=status if status >= 400 else None,
                             retry_after=retry_after_s(headers) if status >= 400 else None)

    # ------------------------------------------------------------ answers

    def _parse(self, response: Any, key: str) -> AssistantTurn:
        try:
            message = _load_answer(response.take())
        except ValueError as e:
            raise self._scrub(ProviderError(
                f"model provider at {self.base_url} returned an answer that is not JSON ({one_line(str(e))}); "
                "check the base URL", transient=False), key) from None
        if not isinstance(message, dict):
            raise ProviderError(f"model provider at {self.base_url} returned an answer that is not a JSON object; "
                                "check the base URL", transient=False)
        text: list[str] = []
        calls: list[tuple[Any, str, Any, str | None]] = []
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            btype = block.get("type") if isinstance(block, dict) else None
            if btype == "text":
                piece = block.get("text")
                text.append(piece if isinstance(piece, str) else "")
            elif btype == "tool_use":
                calls.append((block.get("id"), "tool_use", block.get("name"), _input_text(block.get("input"),
                                                                                self.limits.max_argument_bytes)))
            elif btype == "server_tool_use":
                calls.append((None, "server_tool_use", None, ""))
        usage = message.get("usage")
        return self._turn("".join(text) if text else None, calls, message.get("stop_reason"),
                          _usage(_Fields(usage) if isinstance(usage, dict) else None), message.get("model"), key)

    def _turn(self, content: str | None, calls: list[tuple[Any, str, Any, Any]], stop_reason: Any,
              usage: Usage | None, model: Any, key: str) -> AssistantTurn:
        usable: list[ToolCall] = []
        dropped: list[str] = []
        for cid, kind, name, arguments in calls:
            if kind != "tool_use":
                dropped.append(kind)  # the server's own tools: not ours to run
                continue
            if not (isinstance(name, str) and name and isinstance(arguments, str)):
                raise self._scrub(ProviderError(
                    f"model provider at {self.base_url} returned a tool_use block without a name or with an input "
                    "that is not an object; check the model's tool-use support", transient=False), key)
            usable.append(ToolCall(id=cid if isinstance(cid, str) and cid else None, name=name, arguments=arguments))
        reason = _STOP_REASONS.get(stop_reason, stop_reason) if isinstance(stop_reason, str) else None
        return AssistantTurn(content=content, tool_calls=tuple(usable),
                             model=model if isinstance(model, str) and model else self.model,
                             finish_reason=reason, usage=usage, dropped_calls=tuple(dropped),
                             # Named as the server said it where the runner reports it: a cut-short answer.
                             stop_reason=stop_reason if reason in ("length", "content_filter") else None)


class _Fields:
    """A JSON object read as attributes (what :func:`_usage` reads of the SDK's objects)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        return self._fields.get(name)


def _sdk() -> Any:
    try:
        import anthropic  # lazy: the package is an optional extra
    except ImportError:
        from .sdk import missing_sdk_error

        raise missing_sdk_error("anthropic") from None
    return anthropic
