"""A fake Chat Completions server for provider tests.

It listens on 127.0.0.1 (port chosen by the OS), records every request it
receives, and answers with whatever behaviour it was last told to use: a
content reply, a tool-call reply, an OpenAI-style error, or a dropped
connection (the socket is closed without any response).
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON


@dataclass(frozen=True)
class _Behaviour:
    kind: str  # "json" | "drop"
    status: int = 200
    payload: Any = None


class FakeOpenAI:
    """Start with ``with FakeOpenAI() as server:``; ``server.base_url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._behaviour = _Behaviour("json", 200, _completion("hello", None, "fake-model"))
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                fake._record(self, raw)
                behaviour = fake._current()
                if behaviour.kind == "drop":
                    # No status line, no bytes: the client sees the connection die.
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.connection.close()
                    self.close_connection = True
                    return
                body = json.dumps(behaviour.payload).encode()
                self.send_response(behaviour.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- what to answer ---

    def reply_content(self, text: str, model: str = "fake-model") -> None:
        self._set(_Behaviour("json", 200, _completion(text, None, model)))

    def reply_tool_calls(self, calls: list[tuple[str, str, str]], content: str | None = None) -> None:
        """``calls`` are ``(id, name, arguments_json_text)``."""
        tool_calls = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
        self._set(_Behaviour("json", 200, _completion(content, tool_calls, "fake-model")))

    def reply_error(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        payload = {"error": {"message": message, "type": type_, "param": None, "code": None}}
        self._set(_Behaviour("json", status, payload))

    def drop_connection(self) -> None:
        self._set(_Behaviour("drop"))

    # --- internals ---

    def _set(self, behaviour: _Behaviour) -> None:
        with self._lock:
            self._behaviour = behaviour

    def _current(self) -> _Behaviour:
        with self._lock:
            return self._behaviour

    def _record(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", errors="replace")
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            self.requests.append(RecordedRequest(handler.command, handler.path, headers, body))


def _completion(content: str | None, tool_calls: list[dict[str, Any]] | None, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
