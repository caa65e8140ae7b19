"""Providers: the script provider's determinism and the OpenAI provider
against a real HTTP server speaking Chat Completions (``fake_openai``):
answers, errors and their Retry-After, finish reasons and usage, streaming,
a stream cut off, and cancellation that closes the connection."""

from __future__ import annotations

import email.utils
import json
import threading
import time

import pytest

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.runtime.providers import (
    DEFAULT_BASE_URL,
    AssistantTurn,
    ModelEndpoint,
    OpenAIProvider,
    ProviderCanceled,
    ProviderError,
    ScriptProvider,
    ToolCall,
    Usage,
    make_provider,
    model_endpoint,
)
from kxen_agent.runtime.providers.http_base import retry_after_s

from .fake_openai import FakeOpenAI, Reply

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
def opened():
    """Providers made by a test, closed after it (their loop threads and connections)."""
    made: list[OpenAIProvider] = []
    yield made
    for p in made:
        p.close()


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def provider(server: FakeOpenAI, **kw) -> OpenAIProvider:
    return OpenAIProvider(base_url=server.base_url, model="gpt-test", api_key_env=KEY_ENV, timeout_s=10, **kw)


HI = [{"role": "user", "content": "hi"}]


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


def test_script_streams_its_text_in_pieces_and_honours_cancel():
    pieces: list[str] = []
    turn = ScriptProvider(STEPS).complete([{"role": "user", "content": "go"}], [], on_text=pieces.append)
    assert "".join(pieces) == "reading" == turn.content and pieces
    long = ScriptProvider([{"content": "one two three four"}])
    got: list[str] = []
    assert long.complete([], [], on_text=got.append).content == "".join(got) == "one two three four"
    assert got == ["one ", "two ", "three ", "four"]
    cancel = threading.Event()

    def cancel_after_first(piece: str) -> None:
        got.append(piece)
        cancel.set()

    got.clear()
    with pytest.raises(ProviderCanceled):
        long.complete([], [], cancel=cancel, on_text=cancel_after_first)
    assert got == ["one "], "no piece after the cancel"


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


LOCK = {"name": "a", "provider": "openai", "model": "gpt-x", "base_url": "http://h/v1", "api_key_env": "K", "script": None}


def test_model_endpoint_overrides_recorded_and_lock(monkeypatch):
    """--model/--base-url beat what a run recorded, which beats the lock; the key variable is the lock's always."""
    assert model_endpoint(LOCK) == ModelEndpoint("gpt-x", "http://h/v1")
    rec = {"requestedModel": "gpt-rec", "baseUrl": "http://rec/v1"}
    assert model_endpoint(LOCK, recorded=rec) == ModelEndpoint("gpt-rec", "http://rec/v1")
    assert model_endpoint(LOCK, recorded={}) == ModelEndpoint("gpt-x", "http://h/v1"), "a run from before §14.5's keys"
    assert model_endpoint(LOCK, model="m2", recorded=rec) == ModelEndpoint("m2", "http://rec/v1")
    assert model_endpoint(LOCK, base_url="https://other/v1", recorded=rec) == ModelEndpoint("gpt-rec", "https://other/v1")
    # A lock without base_url calls the SDK's default, named, so OPENAI_BASE_URL never redirects it.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere.invalid/v1")
    assert model_endpoint(dict(LOCK, base_url=None)).base_url == DEFAULT_BASE_URL
    assert OpenAIProvider(None, "m", None).base_url == DEFAULT_BASE_URL
    o = make_provider(LOCK, ModelEndpoint("m3", "https://other/v1"))
    assert (o.model, o.base_url, o.api_key_env) == ("m3", "https://other/v1", "K")
    for bad, why in [({"base_url": "ftp://x"}, "http:// or https://"), ({"base_url": "https://u:k@h/v1"}, "credentials"),
                     ({"model": " "}, "not a model name"), ({"model": "a\nb"}, "not a model name")]:
        with pytest.raises(UsageError, match=why):
            model_endpoint(LOCK, **bad)
    script = {"name": "s", "provider": "script", "model": "script", "base_url": None}
    with pytest.raises(UsageError, match="--base-url applies to the openai and anthropic providers"):
        model_endpoint(script, base_url="http://h/v1")
    assert model_endpoint(script, model="named") == ModelEndpoint("named", None)


# --- OpenAI provider ---------------------------------------------------------


def test_content_reply_with_finish_reason_and_usage(server, keyed, opened):
    server.reply(Reply(content="hi there", model="gpt-test-0001",
                       usage={"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127,
                              "prompt_tokens_details": {"cached_tokens": 100}}))
    opened.append(p := provider(server))
    turn = p.complete(HI, [])
    assert turn == AssistantTurn(content="hi there", tool_calls=(), model="gpt-test-0001", finish_reason="stop",
                                 usage=Usage(120, 7, 100))
    (req,) = server.requests
    assert "tools" not in req.body and not req.streamed  # omitted when empty; not streamed without on_text
    server.clear()
    server.reply(Reply(content="x", usage=None))
    server.reply(Reply(content="y", usage={"prompt_tokens": "many", "completion_tokens": 1}))
    assert p.complete(HI, []).usage is None, "no usage reported"
    assert p.complete(HI, []).usage is None, "nonsense usage is no usage"


def test_tool_calls_parsed_and_request_converted(server, keyed, opened):
    server.reply_tool_calls(
        [("call_a", "read_file", '{"path": "b.txt"}'), ("call_b", "shell", '{"command":"ls -l"}')]
    )
    opened.append(p := provider(server))
    turn = p.complete(HISTORY, [SPEC])
    assert turn.content is None and turn.finish_reason == "tool_calls"
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


def test_odd_answers_are_reported_not_judged(server, keyed, opened):
    """length, an empty tool_calls list and calls of another type reach the runner as they are (it decides)."""
    opened.append(p := provider(server))
    server.reply(Reply(content="The answer is cut o", finish_reason="length"))
    assert (p.complete(HI, []).content, p.complete(HI, []).finish_reason) == ("The answer is cut o", "length")
    server.clear()
    server.reply(Reply(content=None, tool_calls=[]))
    turn = p.complete(HI, [])
    assert (turn.content, turn.tool_calls, turn.dropped_calls) == (None, (), ())
    server.clear()
    server.reply(Reply(content=None, tool_calls=[{"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}}]))
    turn = p.complete(HI, [])
    assert (turn.tool_calls, turn.dropped_calls) == ((), ("custom",))


def test_400_is_not_transient_and_not_retried(server, keyed, opened):
    server.reply_error(400, "Invalid 'messages': bad role")
    opened.append(p := provider(server))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    err = info.value
    assert err.transient is False and err.status == 400 and err.retry_after is None
    msg = str(err)
    assert "\n" not in msg
    assert server.base_url in msg and "400" in msg and "bad role" in msg
    assert KEY not in msg
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [500, 503, 429])
def test_5xx_and_429_are_transient_and_the_sdk_does_not_retry(server, keyed, opened, status):
    server.reply_error(status, "overloaded", type_="server_error")
    opened.append(p := provider(server))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is True and info.value.status == status
    assert str(status) in str(info.value) and server.base_url in str(info.value)
    assert KEY not in str(info.value)
    assert len(server.requests) == 1, "one retry policy: the runtime's; the SDK's retries are off"


def test_retry_after_headers_are_read_and_x_should_retry_obeyed(server, keyed, opened):
    opened.append(p := provider(server))
    cases = [({"Retry-After": "7"}, 7.0), ({"retry-after-ms": "1500", "Retry-After": "9"}, 1.5),
             ({"Retry-After": "soon"}, None), ({}, None)]
    for headers, want in cases:
        server.clear()
        server.reply_error(429, "slow down", headers=headers)
        with pytest.raises(ProviderError) as info:
            p.complete(HI, [])
        assert info.value.retry_after == want, headers
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after_s({"retry-after": when}) <= 31
    assert retry_after_s({"retry-after": "-3"}) == 0.0
    server.clear()
    server.reply_error(500, "do not bother", headers={"x-should-retry": "false"})
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is False
    server.clear()
    server.reply_error(400, "try me again", headers={"x-should-retry": "true"})
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is True


def test_dropped_connection_is_transient(server, keyed, opened):
    server.drop_connection()
    opened.append(p := provider(server))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is True and info.value.status is None
    assert server.base_url in str(info.value)
    assert len(server.requests) == 1


def test_connection_refused_is_transient(keyed, opened):
    with FakeOpenAI() as s:
        dead_url = s.base_url
    opened.append(p := OpenAIProvider(base_url=dead_url, model="m", api_key_env=KEY_ENV, timeout_s=5))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is True


def test_key_echoed_by_server_is_redacted(server, keyed, opened):
    server.reply_error(401, f"Incorrect API key provided: {KEY}")
    opened.append(p := provider(server))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert KEY not in str(info.value)
    assert "[REDACTED]" in str(info.value) and KEY_ENV in str(info.value)
    assert info.value.transient is False


def test_missing_key_env_sends_nothing(server, monkeypatch, opened):
    monkeypatch.delenv(KEY_ENV, raising=False)
    opened.append(p := provider(server))
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [])
    assert info.value.transient is False
    assert KEY_ENV in str(info.value)
    assert isinstance(info.value, KxenError) and info.value.exit_code == 1
    assert server.requests == []


def test_no_key_env_sends_a_placeholder_never_a_default_variable(server, monkeypatch, opened):
    """A key goes only from the variable the agent names: OPENAI_API_KEY is never picked up."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ambient-0000000000")
    opened.append(p := OpenAIProvider(base_url=server.base_url, model="local", api_key_env=None))
    assert p.complete(HI, []).content == "hello"
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"


def test_bad_role_rejected_before_sending(server, keyed, opened):
    opened.append(p := provider(server))
    with pytest.raises(ProviderError, match="role 'robot'"):
        p.complete([{"role": "robot", "content": "hi"}], [])
    assert server.requests == []


# --- streaming ---------------------------------------------------------------


def test_streamed_answer_is_the_same_turn_as_unstreamed(server, keyed, opened):
    opened.append(p := provider(server))
    usage = {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}
    for _ in range(2):
        server.reply(Reply(content="Let me look at it.", usage=usage,
                           tool_calls=[{"id": "call_s", "type": "function",
                                        "function": {"name": "shell", "arguments": '{"command": "ls -la /tmp"}'}}]))
    pieces: list[str] = []
    streamed = p.complete(HI, [SPEC], on_text=pieces.append)
    plain = p.complete(HI, [SPEC])
    assert streamed == plain == AssistantTurn(
        content="Let me look at it.", model="fake-model", finish_reason="tool_calls", usage=Usage(40, 9, None),
        tool_calls=(ToolCall("call_s", "shell", '{"command": "ls -la /tmp"}'),))
    assert "".join(pieces) == "Let me look at it." and len(pieces) == 5
    first, second = server.requests
    assert first.streamed and first.body["stream_options"] == {"include_usage": True}
    assert not second.streamed and "stream_options" not in second.body


def test_stream_cut_mid_answer_is_transient(server, keyed, opened):
    opened.append(p := provider(server))
    server.reply(Reply(content="a long answer that never finishes", drop_after=3))
    pieces: list[str] = []
    with pytest.raises(ProviderError) as info:
        p.complete(HI, [], on_text=pieces.append)
    assert info.value.transient is True and "middle of the streamed answer" in str(info.value)
    assert "".join(pieces) == "a long ", "the pieces before the cut arrived"
    server.clear()
    server.reply(Reply(content="an answer cut short cleanly", end_after=3))
    with pytest.raises(ProviderError, match="ended before it was complete") as info:
        p.complete(HI, [], on_text=pieces.append)
    assert info.value.transient is True


# --- cancellation ------------------------------------------------------------


def _complete_in_thread(p: OpenAIProvider, cancel: threading.Event, **kw) -> dict:
    box: dict = {}

    def go() -> None:
        try:
            box["turn"] = p.complete(HI, [], cancel=cancel, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test's assertions
            box["error"] = e
        box["at"] = time.monotonic()

    t = threading.Thread(target=go)
    t.start()
    box["thread"] = t
    return box


def _wait(cond, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_cancel_aborts_a_slow_request_and_closes_the_connection_within_a_second(server, keyed, opened, streamed):
    server.reply(Reply(content="too late", delay_s=30))
    opened.append(p := provider(server))
    cancel = threading.Event()
    box = _complete_in_thread(p, cancel, **({"on_text": lambda s: None} if streamed else {}))
    _wait(lambda: server.requests, "the request to arrive")
    t0 = time.monotonic()
    cancel.set()
    box["thread"].join(5)
    assert isinstance(box.get("error"), ProviderCanceled), box
    assert box["at"] - t0 < 1.0, "complete() must return within a second of the cancel"
    _wait(lambda: server.abandoned, "the server to see the connection close", timeout=2)
    assert server.abandoned[0] - t0 < 1.0, "the connection must close within a second"


def test_cancel_mid_stream_closes_the_connection(server, keyed, opened):
    server.reply(Reply(content="first second third fourth", hold_after=3))
    opened.append(p := provider(server))
    cancel = threading.Event()
    pieces: list[str] = []
    box = _complete_in_thread(p, cancel, on_text=pieces.append)
    _wait(lambda: "".join(pieces) == "first second ", "the first pieces")
    t0 = time.monotonic()
    cancel.set()
    box["thread"].join(5)
    assert isinstance(box.get("error"), ProviderCanceled) and box["at"] - t0 < 1.0, box
    _wait(lambda: server.abandoned, "the server to see the connection close", timeout=2)
    assert "".join(pieces) == "first second "
