"""The Anthropic provider against a real HTTP server speaking the Messages API
(``fake_anthropic``): conversion of the history, tool use, stop reasons,
usage, errors (``overloaded_error``, ``retry-after``), streaming, a stream cut
off or ended by an error event, cancellation that closes the connection, and
the key (never the SDK's own variables, never in an error)."""

from __future__ import annotations

import threading
import time

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime.providers import (
    DEFAULT_ANTHROPIC_URL,
    AnthropicProvider,
    AssistantTurn,
    ModelEndpoint,
    ProviderCanceled,
    ProviderError,
    ToolCall,
    Usage,
    make_provider,
    model_endpoint,
)
from kxen_agent.runtime.providers.anthropic import to_messages

from .fake_anthropic import FakeAnthropic, Reply
from .test_providers import _complete_in_thread, _wait

KEY_ENV = "KXEN_TEST_ANTHROPIC_KEY"
KEY = "sk-ant-test-0123456789abcdef"

SPEC = {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}}
HI = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.fixture
def server():
    with FakeAnthropic() as s:
        yield s


@pytest.fixture
def opened():
    made: list[AnthropicProvider] = []
    yield made
    for p in made:
        p.close()


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def provider(server: FakeAnthropic, opened: list, **kw) -> AnthropicProvider:
    p = AnthropicProvider(base_url=server.base_url, model="claude-test", api_key_env=KEY_ENV, timeout_s=10, **kw)
    opened.append(p)
    return p


def sent_key(headers: dict[str, str]) -> str | None:
    """The key a request carried: ``x-api-key`` or a bearer token (SDK versions differ)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def test_history_becomes_messages_api_form():
    history = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look at a.txt"},
        {"role": "assistant", "content": "Reading.", "tool_calls": [
            {"id": "toolu_1", "name": "read_file", "arguments": '{"path":"a.txt"}'},
            {"id": "toolu_2", "name": "shell", "arguments": "not json"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "hello"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "invalid arguments"},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": "", "tool_calls": None},
        {"role": "user", "content": "well?"},
    ]
    system, messages = to_messages(history)
    assert system == "be brief"
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "look at a.txt"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
            {"type": "tool_use", "id": "toolu_2", "name": "shell", "input": {"invalid_arguments": "not json"}}]},
        # Tool results and the next task are one user turn (the API wants the roles to alternate).
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "invalid arguments"},
            {"type": "text", "text": "and now?"},
            {"type": "text", "text": "well?"}]},
    ]
    with pytest.raises(ProviderError, match="role 'robot'"):
        to_messages([{"role": "robot", "content": "x"}])


def test_text_answer_with_usage_and_the_request_sent(server, keyed, opened):
    server.reply(Reply(content="hi there", model="claude-test-2026",
                       usage={"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 100,
                              "cache_creation_input_tokens": 5}))
    turn = provider(server, opened).complete(HI, [SPEC])
    assert turn == AssistantTurn(content="hi there", tool_calls=(), model="claude-test-2026", finish_reason="stop",
                                 usage=Usage(125, 7, 100))
    (req,) = server.requests
    assert req.path == "/v1/messages"
    assert sent_key(req.headers) == KEY
    assert req.body["model"] == "claude-test" and req.body["max_tokens"] == 8192
    assert req.body["system"] == "be brief"
    assert req.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert req.body["tools"] == [{"name": "read_file", "description": "Read a file.",
                                  "input_schema": SPEC["function"]["parameters"]}]


def test_tool_use_answer(server, keyed, opened):
    server.reply_tool_uses([("toolu_a", "read_file", {"path": "a.txt"}), ("toolu_b", "shell", {"command": "ls"})],
                           content="Let me look.")
    turn = provider(server, opened).complete(HI, [SPEC])
    assert turn.finish_reason == "tool_calls" and turn.content == "Let me look."
    assert turn.tool_calls == (ToolCall("toolu_a", "read_file", '{"path": "a.txt"}'),
                               ToolCall("toolu_b", "shell", '{"command": "ls"}'))


@pytest.mark.parametrize(("stop", "reported"), [("max_tokens", "length"), ("refusal", "content_filter"),
                                                ("stop_sequence", "stop"), ("pause_turn", "pause_turn")])
def test_stop_reasons_in_the_runners_words(server, keyed, opened, stop, reported):
    server.reply(Reply(content="partial", stop_reason=stop))
    assert provider(server, opened).complete(HI, []).finish_reason == reported


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_overloaded_is_transient_with_retry_after_and_the_sdk_does_not_retry(server, keyed, opened, streamed):
    server.reply_error(529, "overloaded_error", "Overloaded", headers={"retry-after": "3"})
    p = provider(server, opened)
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [], **({"on_text": lambda s: None} if streamed else {}))
    e = info.value
    assert e.transient is True and e.status == 529 and e.retry_after == 3.0
    assert "overloaded_error" in str(e) and server.base_url in str(e)
    assert len(server.requests) == 1, "one retry policy: the runtime's"


def test_rate_limit_and_bad_request(server, keyed, opened):
    p = provider(server, opened)
    server.reply_error(429, "rate_limit_error", "slow down", headers={"retry-after": "7"})
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is True and info.value.retry_after == 7.0
    server.requests.clear()
    server.clear()
    server.reply_error(400, "invalid_request_error", "messages: roles must alternate")
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is False and info.value.status == 400
    assert "roles must alternate" in str(info.value) and "\n" not in str(info.value)


def test_error_event_mid_stream_is_transient(server, keyed, opened):
    server.reply(Reply(content="one two three four five", error_after=5))
    pieces: list[str] = []
    with pytest.raises(ProviderError) as info:
        provider(server, opened).complete(HI, [], on_text=pieces.append)
    assert info.value.transient is True and "overloaded_error" in str(info.value)
    assert "error event in the streamed answer" in str(info.value)
    assert "".join(pieces) == "one two "


def test_streamed_answer_is_the_same_turn_as_unstreamed(server, keyed, opened):
    p = provider(server, opened)
    for _ in range(2):
        server.reply(Reply(content="Let me look at it.", tool_uses=[("toolu_s", "shell", {"command": "ls -la"})],
                           usage={"input_tokens": 40, "output_tokens": 9}))
    pieces: list[str] = []
    streamed = p.complete(HI, [SPEC], on_text=pieces.append)
    plain = p.complete(HI, [SPEC])
    assert streamed == plain == AssistantTurn(
        content="Let me look at it.", model="claude-fake", finish_reason="tool_calls", usage=Usage(40, 9, None),
        tool_calls=(ToolCall("toolu_s", "shell", '{"command": "ls -la"}'),))
    assert "".join(pieces) == "Let me look at it." and len(pieces) == 5
    assert server.requests[0].streamed and not server.requests[1].streamed


def test_stream_dropped_or_ended_mid_answer_is_transient(server, keyed, opened):
    p = provider(server, opened)
    server.reply(Reply(content="a long answer that never finishes", drop_after=5))
    pieces: list[str] = []
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [], on_text=pieces.append)
    assert info.value.transient is True and "middle of the streamed answer" in str(info.value)
    assert "".join(pieces) == "a long "
    server.clear()
    server.reply(Reply(content="cut short cleanly", end_after=5))
    with pytest.raises(ProviderError, match="ended before it was complete") as info:
        p.complete(HI, [], on_text=pieces.append)
    assert info.value.transient is True


def test_dropped_connection_is_transient(server, keyed, opened):
    server.drop_connection()
    with pytest.raises(ProviderError) as info:
        provider(server, opened).complete(HI, [])
    assert info.value.transient is True and len(server.requests) == 1


def test_key_echoed_by_the_server_is_redacted(server, keyed, opened):
    server.reply_error(401, "authentication_error", f"invalid x-api-key: {KEY}")
    with pytest.raises(ProviderError) as info:
        provider(server, opened).complete(HI, [])
    assert KEY not in str(info.value) and "[REDACTED]" in str(info.value) and KEY_ENV in str(info.value)
    assert info.value.transient is False


def test_missing_key_sends_nothing(server, monkeypatch, opened):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ProviderError, match=KEY_ENV) as info:
        provider(server, opened).complete(HI, [])
    assert info.value.transient is False and server.requests == []


def test_the_sdks_own_variables_are_never_used(server, monkeypatch, opened):
    """A key goes only from the variable the agent names, and only to the URL the lock or run names."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-ambient-000000000000")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "ambient-token-000000000000")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/never")
    p = AnthropicProvider(base_url=server.base_url, model="local", api_key_env=None)
    opened.append(p)
    assert p.complete(HI, []).content == "hello"
    assert sent_key(server.requests[0].headers) == "not-needed"
    assert AnthropicProvider(None, "m", None).base_url == DEFAULT_ANTHROPIC_URL


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_cancel_aborts_the_request_and_closes_the_connection(server, keyed, opened, streamed):
    server.reply(Reply(content="too late", delay_s=30))
    p = provider(server, opened)
    cancel = threading.Event()
    box = _complete_in_thread(p, cancel, **({"on_text": lambda s: None} if streamed else {}))
    _wait(lambda: server.requests, "the request to arrive")
    t0 = time.monotonic()
    cancel.set()
    box["thread"].join(5)
    assert isinstance(box.get("error"), ProviderCanceled), box
    assert box["at"] - t0 < 1.0
    _wait(lambda: server.abandoned, "the server to see the connection close", timeout=2)
    assert server.abandoned[0] - t0 < 1.0


def test_cancel_mid_stream_closes_the_connection(server, keyed, opened):
    server.reply(Reply(content="first second third fourth", hold_after=5))
    p = provider(server, opened)
    cancel = threading.Event()
    pieces: list[str] = []
    box = _complete_in_thread(p, cancel, on_text=pieces.append)
    _wait(lambda: "".join(pieces) == "first second ", "the first pieces")
    t0 = time.monotonic()
    cancel.set()
    box["thread"].join(5)
    assert isinstance(box.get("error"), ProviderCanceled) and box["at"] - t0 < 1.0, box
    _wait(lambda: server.abandoned, "the server to see the connection close", timeout=2)


LOCK = {"name": "c", "provider": "anthropic", "model": "claude-x", "base_url": None,
        "api_key_env": "ANTHROPIC_API_KEY", "script": None}


def test_make_provider_and_endpoint(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://elsewhere.invalid")
    assert model_endpoint(LOCK) == ModelEndpoint("claude-x", DEFAULT_ANTHROPIC_URL)
    assert model_endpoint(LOCK, base_url="http://127.0.0.1:1") == ModelEndpoint("claude-x", "http://127.0.0.1:1")
    p = make_provider(LOCK, ModelEndpoint("claude-y", "http://h"))
    try:
        assert isinstance(p, AnthropicProvider)
        assert (p.model, p.base_url, p.api_key_env) == ("claude-y", "http://h", "ANTHROPIC_API_KEY")
    finally:
        p.close()
    with pytest.raises(UsageError, match="provider 'anthropic' but no model"):
        make_provider(dict(LOCK, model=""))
