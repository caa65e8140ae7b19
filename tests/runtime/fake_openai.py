"""A fake Chat Completions server for provider tests.

It listens on 127.0.0.1 (port chosen by the OS), records every request it
receives (with the time it arrived), and answers each with the next queued
:class:`Reply` (the last one repeats; with none queued: ``"hello"``).

A reply is rendered the way the request asks: a JSON document, or, for a
request with ``"stream": true``, Server-Sent Events over chunked transfer
encoding (the text in word-sized pieces, each tool call's arguments in
pieces, then the finish reason, then usage if ``stream_options`` asked for
it, then ``[DONE]``). What a server can do wrong is a field of the reply:

- ``delay_s``: answer only after this long (a slow model); a client that
  closes the connection meanwhile is noticed and its time recorded in
  :attr:`FakeOpenAI.abandoned`;
- ``drop``: close the connection without any response;
- ``drop_after``: streamed, cut the connection (a TCP reset, no final
  chunk) after this many events;
- ``hold_after``: streamed, wait for :attr:`FakeOpenAI.gate` after this many
  events (the test sees the first pieces arrive before the rest exist);
- ``end_after``: streamed, end the stream cleanly after this many events
  (no finish reason, no ``[DONE]``);
- ``finish_reason``, ``usage``, ``headers`` (e.g. ``Retry-After``), a raw
  ``payload`` for answers no helper makes (``tool_calls: []``, a call of
  another type).
"""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON
    at: float = 0.0  # time.monotonic() when it arrived

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


@dataclass(frozen=True)
class Reply:
    """What the server answers one request with (see the module docstring)."""

    status: int = 200
    content: str | None = "hello"
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None  # default: "tool_calls" with calls, else "stop"
    usage: dict[str, Any] | None = field(default_factory=lambda: dict(DEFAULT_USAGE))
    model: str = "fake-model"
    headers: dict[str, str] = field(default_factory=dict)
    payload: Any = None  # sent as is (errors, odd answers); not streamed
    delay_s: float = 0.0
    drop: bool = False
    drop_after: int | None = None
    hold_after: int | None = None
    end_after: int | None = None

    def reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


class FakeOpenAI:
    """Start with ``with FakeOpenAI() as server:``; ``server.base_url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        #: time.monotonic() of each client that went away while its answer was delayed or held.
        self.abandoned: list[float] = []
        #: Streamed replies with ``hold_after`` wait for this (set it to let them finish).
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self._queue: list[Reply] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class (a subclass of this server speaks another API by replacing it)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked streaming, and keep-alive as real servers do

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                req = fake._record(self, raw)
                reply = fake._current()
                if reply.drop:
                    # No status line, no bytes: the client sees the connection die.
                    self._reset()
                    return
                if reply.delay_s and fake._client_gone(self.connection, reply.delay_s):
                    self.close_connection = True
                    return
                if req.streamed and reply.payload is None and reply.status == 200:
                    self._stream(req, reply)
                    return
                payload = reply.payload if reply.payload is not None else _completion(reply)
                body = json.dumps(payload).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, req: RecordedRequest, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                opts = req.body.get("stream_options") or {}
                events = _chunks(reply, include_usage=bool(opts.get("include_usage")))
                for n, data in enumerate(events):
                    if reply.drop_after is not None and n == reply.drop_after:
                        self._reset()
                        return
                    if reply.end_after is not None and n == reply.end_after:
                        break  # a clean end of the stream, with the answer unfinished
                    if reply.hold_after is not None and n == reply.hold_after:
                        while not fake.gate.wait(0.02):
                            if fake._client_gone(self.connection, 0):
                                self.close_connection = True
                                return
                    chunk = f"data: {data}\n\n".encode()
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    except OSError:
                        fake._gone()
                        self.close_connection = True
                        return
                self.wfile.write(b"0\r\n\r\n")

            def _reset(self) -> None:
                reset(self)

        return Handler

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- what to answer (each call queues one reply) ---

    def reply(self, reply: Reply) -> None:
        with self._lock:
            self._queue.append(reply)

    def reply_content(self, text: str | None, model: str = "fake-model", **kw: Any) -> None:
        self.reply(Reply(content=text, model=model, **kw))

    def reply_tool_calls(self, calls: list[tuple[Any, Any, str]], content: str | None = None, **kw: Any) -> None:
        """``calls`` are ``(id, name, arguments_json_text)``."""
        tool_calls = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
        self.reply(Reply(content=content, tool_calls=tool_calls, **kw))

    def reply_error(self, status: int, message: str, type_: str = "invalid_request_error",
                    headers: dict[str, str] | None = None) -> None:
        payload = {"error": {"message": message, "type": type_, "param": None, "code": None}}
        self.reply(Reply(status=status, payload=payload, headers=headers or {}))

    def drop_connection(self) -> None:
        self.reply(Reply(drop=True))

    def clear(self) -> None:
        """Forget the queued replies (the next ``reply*`` is what it answers)."""
        with self._lock:
            self._queue.clear()

    def chat_requests(self) -> list[Any]:
        """The bodies of the chat requests, in order (``requests`` has the whole records)."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    # --- internals ---

    def _current(self) -> Reply:
        with self._lock:
            if len(self._queue) > 1:
                return self._queue.pop(0)
            return self._queue[0] if self._queue else Reply()

    def _record(self, handler: BaseHTTPRequestHandler, raw: bytes) -> RecordedRequest:
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", errors="replace")
        headers = {k.lower(): v for k, v in handler.headers.items()}
        req = RecordedRequest(handler.command, handler.path, headers, body, time.monotonic())
        with self._lock:
            self.requests.append(req)
        return req

    def _gone(self) -> None:
        with self._lock:
            self.abandoned.append(time.monotonic())

    def _client_gone(self, sock: socket.socket, seconds: float) -> bool:
        """Wait ``seconds`` (0: just look); True, recorded, if the client closed the connection meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            readable, _, _ = select.select([sock], [], [], max(0.0, min(deadline - time.monotonic(), 0.02)))
            if readable:
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    self._gone()
                    return True
            if time.monotonic() >= deadline:
                return False


def reset(handler: BaseHTTPRequestHandler) -> None:
    """Close the handler's connection with a reset (SO_LINGER 0), as a crashed server or a cut cable does."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()
    handler.close_connection = True


def _pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+\s*|\s+", text)


def _chunks(reply: Reply, *, include_usage: bool) -> list[str]:
    """The SSE data lines of a streamed reply, ``[DONE]`` last."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                           "model": reply.model,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in _pieces(reply.content or "")]
    for i, call in enumerate(reply.tool_calls or ()):
        fn = call.get("function") or {}
        out.append(chunk({"tool_calls": [{"index": i, "id": call.get("id"), "type": call.get("type"),
                                          "function": {"name": fn.get("name"), "arguments": ""}}]}))
        args = fn.get("arguments") or ""
        for k in range(0, len(args), 8):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[k:k + 8]}}]}))
    out.append(chunk({}, reply.reason()))
    if include_usage and reply.usage is not None:
        out.append(json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                               "model": reply.model, "choices": [], "usage": reply.usage}))
    out.append("[DONE]")
    return out


def _completion(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls is not None:
        message["tool_calls"] = reply.tool_calls
    doc: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.reason(), "logprobs": None}],
    }
    if reply.usage is not None:
        doc["usage"] = reply.usage
    return doc
