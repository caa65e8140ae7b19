"""A fake Anthropic Messages API server for provider tests (the sibling of ``fake_openai``).

It listens on 127.0.0.1 (port chosen by the OS), serves ``POST /v1/messages``,
records every request (with the time it arrived), and answers each with the
next queued :class:`Reply` (the last one repeats; with none queued: ``"hello"``).

A reply is rendered the way the request asks: a JSON ``message``, or, for a
request with ``"stream": true``, Server-Sent Events as the real API sends
them (``message_start``, a ``ping``, per block ``content_block_start`` /
``content_block_delta`` (text in word-sized pieces, tool input as
``input_json_delta`` pieces) / ``content_block_stop``, ``message_delta``
with the stop reason and output tokens, ``message_stop``). What a server
can do wrong is a field of the reply:

- ``delay_s``: answer only after this long; a client that closes the
  connection meanwhile is recorded in :attr:`FakeAnthropic.abandoned`;
- ``drop``: close the connection without any response;
- ``drop_after``: streamed, reset the connection after this many events;
- ``end_after``: streamed, end the stream cleanly after this many events
  (no ``message_stop``);
- ``error_after``: streamed, send an ``error`` event of type ``error_type``
  (default ``overloaded_error``) after this many events, then end;
- ``hold_after``: streamed, wait for :attr:`FakeAnthropic.gate` after this many events;
- ``stop_reason``, ``usage``, ``headers`` (e.g. ``retry-after``), a raw
  ``payload`` (errors) sent with ``status``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from .fake_openai import FakeOpenAI, _pieces, reset

DEFAULT_USAGE = {"input_tokens": 3, "output_tokens": 2}


@dataclass(frozen=True)
class Reply:
    status: int = 200
    content: str | None = "hello"
    tool_uses: list[tuple[str, str, Any]] | None = None  # (id, name, input)
    stop_reason: str | None = None  # default: tool_use with tool uses, else end_turn
    usage: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_USAGE))
    model: str = "claude-fake"
    headers: dict[str, str] = field(default_factory=dict)
    payload: Any = None
    delay_s: float = 0.0
    drop: bool = False
    drop_after: int | None = None
    end_after: int | None = None
    error_after: int | None = None
    error_type: str = "overloaded_error"
    hold_after: int | None = None

    def reason(self) -> str:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if self.tool_uses else "end_turn"


class FakeAnthropic(FakeOpenAI):
    """Start with ``with FakeAnthropic() as server:``; ``server.base_url`` is the root (the SDK adds ``/v1``).

    The queue, the recorded requests, ``abandoned`` and ``gate`` are ``FakeOpenAI``'s.
    """

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                req = fake._record(self, self.rfile.read(length))
                reply: Any = fake._current()
                if reply.drop:
                    reset(self)
                    return
                if reply.delay_s and fake._client_gone(self.connection, reply.delay_s):
                    self.close_connection = True
                    return
                if req.streamed and reply.payload is None and reply.status == 200:
                    self._stream(reply)
                    return
                body = json.dumps(reply.payload if reply.payload is not None else _message(reply)).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for n, (name, data) in enumerate(_events(reply)):
                    if reply.drop_after is not None and n == reply.drop_after:
                        reset(self)
                        return
                    if reply.end_after is not None and n == reply.end_after:
                        break
                    if reply.error_after is not None and n == reply.error_after:
                        name, data = "error", {"type": "error", "error": {"type": reply.error_type,
                                                                          "message": "Overloaded"}}
                    if reply.hold_after is not None and n == reply.hold_after:
                        while not fake.gate.wait(0.02):
                            if fake._client_gone(self.connection, 0):
                                self.close_connection = True
                                return
                    chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    except OSError:
                        fake._gone()
                        self.close_connection = True
                        return
                    if name == "error":
                        break
                self.wfile.write(b"0\r\n\r\n")

        return Handler

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reply_tool_uses(self, uses: list[tuple[str, str, Any]], content: str | None = None, **kw: Any) -> None:
        self.reply(Reply(content=content, tool_uses=uses, **kw))  # type: ignore[arg-type]

    def reply_error(self, status: int, type_: str, message: str,  # type: ignore[override]
                    headers: dict[str, str] | None = None) -> None:
        payload = {"type": "error", "error": {"type": type_, "message": message}}
        self.reply(Reply(status=status, payload=payload, headers=headers or {}))  # type: ignore[arg-type]

    def reply_content(self, text: str | None, **kw: Any) -> None:  # type: ignore[override]
        self.reply(Reply(content=text, **kw))  # type: ignore[arg-type]

    def drop_connection(self) -> None:
        self.reply(Reply(drop=True))  # type: ignore[arg-type]

    def _current(self) -> Any:
        with self._lock:
            if len(self._queue) > 1:
                return self._queue.pop(0)
            return self._queue[0] if self._queue else Reply()

    def message_requests(self) -> list[Any]:
        return [r.body for r in self.requests if r.path.endswith("/v1/messages")]


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if reply.content:
        out.append({"type": "text", "text": reply.content})
    for cid, name, inp in reply.tool_uses or ():
        out.append({"type": "tool_use", "id": cid, "name": name, "input": inp})
    return out


def _events(reply: Reply) -> list[tuple[str, dict[str, Any]]]:
    usage = reply.usage
    start = {"id": "msg_fake", "type": "message", "role": "assistant", "content": [], "model": reply.model,
             "stop_reason": None, "stop_sequence": None,
             "usage": {**{k: v for k, v in usage.items() if k != "output_tokens"}, "output_tokens": 1}}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                             ("ping", {"type": "ping"})]
    for i, block in enumerate(_blocks(reply)):
        if block["type"] == "text":
            out.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": {"type": "text", "text": ""}}))
            for p in _pieces(block["text"]):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "text_delta", "text": p}}))
        else:
            out.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block":
                                                {"type": "tool_use", "id": block["id"], "name": block["name"],
                                                 "input": {}}}))
            args = json.dumps(block["input"])
            for k in range(0, len(args), 8):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "input_json_delta",
                                                              "partial_json": args[k:k + 8]}}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": reply.reason(),
                                                                     "stop_sequence": None},
                                  "usage": {"output_tokens": usage.get("output_tokens", 0)}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def _message(reply: Reply) -> dict[str, Any]:
    return {"id": "msg_fake", "type": "message", "role": "assistant", "content": _blocks(reply),
            "model": reply.model, "stop_reason": reply.reason(), "stop_sequence": None, "usage": reply.usage}
