"""Providers: the script provider's determinism and the OpenAI provider
against a real HTTP server speaking Chat Completions."""

from __future__ import annotations

import json

import pytest

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.runtime.providers import (
    AssistantTurn,
    OpenAIProvider,
    ProviderError,
    ScriptProvider,
    ToolCall,
    make_provider,
)

from .fake_openai import FakeOpenAI

KEY_ENV = "KXEN_TEST_OPENAI_KEY"
KEY = "sk-test-0123456789abcdef"

SPEC = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}

HISTORY = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "look at a.txt"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0_0", "name": "read_file", "arguments": '{"path":"a.txt"}'}],
    },
    {"role": "tool", "tool_call_id": "call_0_0", "content": "hello"},
]


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def provider(server: FakeOpenAI, **kw) -> OpenAIProvider:
    kw.setdefault("max_retries", 0)
    return OpenAIProvider(base_url=server.base_url, model="gpt-test", api_key_env=KEY_ENV, timeout_s=10, **kw)


# --- script provider ---------------------------------------------------------

STEPS = [
    {"content": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "b": 1}},
                                          {"name": "shell", "arguments": {"command": "ls"}}]},
    {"content": "done"},
]


def test_script_plays_step_by_assistant_count():
    p = ScriptProvider(STEPS)
    first = p.complete([{"role": "user", "content": "go"}], [])
    assert first == AssistantTurn(
        content="reading",
        tool_calls=(
            ToolCall(id="call_0_0", name="read_file", arguments='{"b":1,"path":"a.txt"}'),
            ToolCall(id="call_0_1", name="shell", arguments='{"command":"ls"}'),
        ),
        model="script",
    )
    second = p.complete([{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}], [])
    assert second == AssistantTurn(content="done", tool_calls=(), model="script")


def test_script_is_a_pure_function_of_history():
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "y", "tool_call_id": "c"}]
    a = ScriptProvider(STEPS).complete(list(history), [])
    b = ScriptProvider(STEPS).complete(list(history), [SPEC])
    p = ScriptProvider(STEPS)
    assert a == b == p.complete(history, []) == p.complete(history, [])
    assert a.content == "done"


def test_script_past_the_end_finishes():
    p = ScriptProvider(STEPS, model="m")
    history = [{"role": "assistant", "content": "x"}] * 2
    assert p.complete(history, []) == AssistantTurn(content="script finished", tool_calls=(), model="m")
    assert ScriptProvider([]).complete([], []).content == "script finished"


@pytest.mark.parametrize(
    "steps",
    [["nope"], [{"content": 3}], [{"tool_calls": [{"arguments": {}}]}], [{"tool_calls": [{"name": "x", "arguments": "[]"}]}], [{"bogus": 1}]],
)
def test_script_rejects_malformed_steps(steps):
    with pytest.raises(UsageError, match="script step 0"):
        ScriptProvider(steps)


def test_make_provider():
    script = json.dumps(STEPS, sort_keys=True, separators=(",", ":"))
    p = make_provider({"provider": "script", "model": "script", "base_url": None, "api_key_env": None, "script": script})
    assert isinstance(p, ScriptProvider)
    assert p.complete([], []).tool_calls[0].name == "read_file"
    o = make_provider({"provider": "openai", "model": "gpt-x", "base_url": "http://h/v1", "api_key_env": "K", "script": None})
    assert isinstance(o, OpenAIProvider)
    assert (o.model, o.base_url, o.api_key_env) == ("gpt-x", "http://h/v1", "K")
    with pytest.raises(UsageError, match="unknown provider 'nope'"):
        make_provider({"provider": "nope", "model": "m", "base_url": None, "api_key_env": None, "script": None})
    with pytest.raises(UsageError, match="not valid JSON"):
        make_provider({"provider": "script", "model": "m", "base_url": None, "api_key_env": None, "script": "[{"})


# --- OpenAI provider ---------------------------------------------------------


def test_content_reply(server, keyed):
    server.reply_content("hi there", model="gpt-test-0001")
    turn = provider(server).complete([{"role": "user", "content": "hi"}], [])
    assert turn == AssistantTurn(content="hi there", tool_calls=(), model="gpt-test-0001")
    (req,) = server.requests
    assert "tools" not in req.body  # omitted when empty


def test_tool_calls_parsed_and_request_converted(server, keyed):
    server.reply_tool_calls(
        [("call_a", "read_file", '{"path": "b.txt"}'), ("call_b", "shell", '{"command":"ls -l"}')]
    )
    turn = provider(server).complete(HISTORY, [SPEC])
    assert turn.content is None
    assert turn.tool_calls == (
        ToolCall(id="call_a", name="read_file", arguments='{"path": "b.txt"}'),
        ToolCall(id="call_b", name="shell", arguments='{"command":"ls -l"}'),
    )
    assert json.loads(turn.tool_calls[0].arguments) == {"path": "b.txt"}

    (req,) = server.requests
    assert req.method == "POST" and req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.body["model"] == "gpt-test"
    assert req.body["tools"] == [SPEC]
    assert req.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look at a.txt"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0_0", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a.txt"}'}}
            ],
        },
        {"role": "tool", "content": "hello", "tool_call_id": "call_0_0"},
    ]


def test_400_is_not_transient(server, keyed):
    server.reply_error(400, "Invalid 'messages': bad role")
    with pytest.raises(ProviderError) as info:
        provider(server, max_retries=2).complete([{"role": "user", "content": "hi"}], [])
    err = info.value
    assert err.transient is False and err.status == 400
    msg = str(err)
    assert "\n" not in msg
    assert server.base_url in msg and "400" in msg and "bad role" in msg
    assert KEY not in msg
    assert len(server.requests) == 1  # 4xx is never retried


@pytest.mark.parametrize("status", [500, 503, 429])
def test_5xx_and_429_are_transient(server, keyed, status):
    server.reply_error(status, "overloaded", type_="server_error")
    with pytest.raises(ProviderError) as info:
        provider(server, max_retries=1).complete([{"role": "user", "content": "hi"}], [])
    assert info.value.transient is True and info.value.status == status
    assert str(status) in str(info.value) and server.base_url in str(info.value)
    assert KEY not in str(info.value)
    assert len(server.requests) == 2  # the SDK's one retry happened first


def test_dropped_connection_is_transient(server, keyed):
    server.drop_connection()
    with pytest.raises(ProviderError) as info:
        provider(server).complete([{"role": "user", "content": "hi"}], [])
    assert info.value.transient is True and info.value.status is None
    assert server.base_url in str(info.value)
    assert len(server.requests) == 1


def test_connection_refused_is_transient(keyed):
    with FakeOpenAI() as s:
        dead_url = s.base_url
    p = OpenAIProvider(base_url=dead_url, model="m", api_key_env=KEY_ENV, timeout_s=5, max_retries=0)
    with pytest.raises(ProviderError) as info:
        p.complete([{"role": "user", "content": "hi"}], [])
    assert info.value.transient is True


def test_key_echoed_by_server_is_redacted(server, keyed):
    server.reply_error(401, f"Incorrect API key provided: {KEY}")
    with pytest.raises(ProviderError) as info:
        provider(server).complete([{"role": "user", "content": "hi"}], [])
    assert KEY not in str(info.value)
    assert "[REDACTED]" in str(info.value) and KEY_ENV in str(info.value)
    assert info.value.transient is False


def test_missing_key_env_sends_nothing(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ProviderError) as info:
        provider(server).complete([{"role": "user", "content": "hi"}], [])
    assert info.value.transient is False
    assert KEY_ENV in str(info.value)
    assert isinstance(info.value, KxenError) and info.value.exit_code == 1
    assert server.requests == []


def test_no_key_env_sends_placeholder(server, monkeypatch):
    p = OpenAIProvider(base_url=server.base_url, model="local", api_key_env=None, max_retries=0)
    assert p.complete([{"role": "user", "content": "hi"}], []).content == "hello"
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"


def test_bad_role_rejected_before_sending(server, keyed):
    with pytest.raises(ProviderError, match="role 'robot'"):
        provider(server).complete([{"role": "robot", "content": "hi"}], [])
    assert server.requests == []
