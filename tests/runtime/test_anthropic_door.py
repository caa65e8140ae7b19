"""The door on the Anthropic provider's whole (unstreamed) answers (issue 25, item 5): the answer's body
is read by the provider, not the SDK, so a tool input nested 1,500 deep is refused as that one call's
error result for the model while the run goes on, as on the OpenAI and streamed paths; and the reader
itself, which must agree with ``json.loads`` on every document, never recurse, and skip what is too deep
in bounded memory and time; and what a 50 MB argument in a whole answer costs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kxen_agent.runtime.answer_check import AnswerLimits
from kxen_agent.runtime.providers.anthropic import _TOO_DEEP, AnthropicProvider, _load_answer, _load_bounded
from tests.helpers import Cli, write_agent

from .fake_anthropic import FakeAnthropic, Reply

KEY_ENV = "KXEN_TEST_ANTHROPIC_DOOR_KEY"


def nested(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def deep_ok():
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # the fake server's json.dumps of a deep input, in this process
    yield
    sys.setrecursionlimit(old)


# ==================================================================== end to end: the installed CLI

def test_a_whole_answer_1500_deep_refuses_that_call_and_the_run_goes_on(state_dir: Path, workspace: Path,
                                                                        tmp_path: Path, deep_ok) -> None:
    cli = Cli(state_dir, env={KEY_ENV: "sk-ant-door-0123456789"})
    (workspace / "notes.txt").write_text("the notes\n")
    with FakeAnthropic() as server:
        agent = write_agent(tmp_path / "agent", None, provider="anthropic", model="claude-test",
                            base_url=server.base_url, api_key_env=KEY_ENV, tools=["read_file", "list_files"])
        server.reply_tool_uses([("t_deep", "read_file", {"path": nested(1500)}),
                                ("t_ok", "read_file", {"path": "notes.txt"})], content="reading")
        server.reply_content("went on")
        proc = cli.run_json(workspace, "read the notes", agent, expect=0)
        res = proc.json()
        assert (res["status"], res["result"]) == ("completed", "went on"), str(proc)
        assert "Traceback" not in proc.err
        assert not any(r.streamed for r in server.requests), "the whole-answer path is the one under test"

        log = cli.log(res["session"])
        results = {m["toolCallId"]: m["content"] for m in log if m["role"] == "tool"}
        assert "nested more than 64 levels deep" in results["t_deep"], results
        assert "the notes" in results["t_ok"], "the other call of the same answer ran"
        [call] = [c for m in log if m["role"] == "assistant" for c in m.get("toolCalls") or ()
                  if c["id"] == "t_deep"]
        assert "kxen-agent refused these arguments" in call["arguments"] and len(call["arguments"]) < 300

        # What went back to the model: the refusal, as text under one key (never the deep value).
        second = server.message_requests()[1]
        [refused] = [b for m in second["messages"] for b in m["content"]
                     if b["type"] == "tool_use" and b["id"] == "t_deep"]
        assert set(refused["input"]) == {"invalid_arguments"}

        server.clear()
        server.reply_content("and later")
        later = cli.resume(res["session"], "--task", "anything else?", expect=0)
        assert later.json()["result"] == "and later" and "Traceback" not in later.err
        blocks = [b for m in server.message_requests()[-1]["messages"] for b in m["content"]
                  if b["type"] == "tool_use"]
        assert {b["id"] for b in blocks} == {"t_deep", "t_ok"}
        assert [b["input"] for b in blocks if b["id"] == "t_ok"] == [{"path": "notes.txt"}]
    cli.fsck_clean()


# ==================================================================== the provider, in this process

@pytest.fixture
def provider(monkeypatch):
    with FakeAnthropic() as server:
        monkeypatch.setenv(KEY_ENV, "sk-ant-door-0123456789")
        p = AnthropicProvider(server.base_url, "claude-test", KEY_ENV, timeout_s=10,
                              limits=AnswerLimits(max_argument_bytes=4096))
        try:
            yield server, p
        finally:
            p.close()


def ask(p: AnthropicProvider):
    return p.complete([{"role": "user", "content": "go"}], [])


def test_the_provider_refuses_only_the_bad_calls_of_a_whole_answer(provider, deep_ok) -> None:
    server, p = provider
    server.reply_tool_uses([("a", "read_file", {"path": nested(1500)}), ("b", "read_file", {"path": nested(65)}),
                            ("c", "read_file", {"path": nested(63)}), ("d", "write_file", {"text": "y" * 5000}),
                            ("e", "read_file", {"path": "\ud800"}), ("f", "read_file", {"path": "é.txt"})],
                           content="text", usage={"input_tokens": 7, "output_tokens": 5, "cache_read_input_tokens": 2})
    turn = ask(p)
    args = {c.id: c.arguments for c in turn.tool_calls}
    assert "nested more than 64 levels" in args["a"] and "nested more than 64 levels" in args["b"]
    assert json.loads(args["c"]) == {"path": nested(63)}, "64 levels (the object and 63 lists) are allowed"
    assert "over the limit of 4,096 bytes" in args["d"]
    assert "lone surrogate" in args["e"]
    assert json.loads(args["f"]) == {"path": "é.txt"}
    assert (turn.content, turn.finish_reason, turn.model) == ("text", "tool_calls", "claude-fake")
    assert (turn.usage.input_tokens, turn.usage.output_tokens, turn.usage.cached_tokens) == (9, 5, 2)


def test_an_answer_that_is_not_json_fails_in_one_line(provider) -> None:
    from kxen_agent.runtime.providers import ProviderError

    server, p = provider
    server.reply(Reply(payload="not a message"))  # a JSON string: not an object
    with pytest.raises(ProviderError, match="not a JSON object") as e:
        ask(p)
    assert not e.value.transient


# ==================================================================== the reader

DOCS = ['{}', '[]', '"x"', '1', '-2.5e3', 'true', 'null', ' {"a" : [1, {"b": null}, "c\\u00e9\\n"], "d": {}} ',
        '{"a": 1, "a": 2}', '[[[[]]], [], {"k": [true, false]}]', '"\\ud800"', '{"n": NaN}']


@pytest.mark.parametrize("doc", DOCS)
def test_the_reader_agrees_with_json_loads(doc: str) -> None:
    expected = json.loads(doc)
    got = _load_bounded(doc, 100)
    assert json.dumps(got) == json.dumps(expected)
    assert json.dumps(_load_answer(doc.encode("utf-16"))) == json.dumps(expected)


@pytest.mark.parametrize("doc", ['', '[', '{"a" 1}', '{"a": 1,}', '[1,]', '[1 2]', '{"a": [1}', '[] x', '{1: 2}',
                                 '"open', '[' * 3000 + ']' * 2999, '[' * 3000 + ']' * 3000 + ']'])
def test_the_reader_refuses_what_is_not_json(doc: str) -> None:
    with pytest.raises(ValueError):
        _load_bounded(doc, 100)
    with pytest.raises(ValueError):
        _load_answer(doc.encode())


def test_the_reader_keeps_what_is_shallow_and_marks_what_is_deeper_without_recursing() -> None:
    depth = 200_000  # far past any recursion limit
    doc = '{"content": [{"input": {"p": ' + "[" * depth + '"leaf"' + "]" * depth + '}, "id": "z"}], "more": 1}'
    got = _load_answer(doc.encode())
    block = got["content"][0]
    assert got["more"] == 1 and block["id"] == "z"
    deepest = block["input"]["p"]
    for _ in range(68 - 4):  # message, content, block, input; then lists down to the 68th level
        assert isinstance(deepest, list) and len(deepest) == 1
        deepest = deepest[0]
    assert deepest is _TOO_DEEP
    assert _load_bounded("[[1], [[2]], 3]", 2) == [[1], [_TOO_DEEP], 3]


# ==================================================================== memory

def test_a_50_mb_argument_in_a_whole_answer_costs_no_more_than_the_sdk_took(state_dir: Path, workspace: Path,
                                                                           tmp_path: Path) -> None:
    from .test_answer_memory import MB, _peak_rss

    cli = Cli(state_dir, env={KEY_ENV: "x"})
    peaks = []
    for size in (10, 50 * MB):
        with FakeAnthropic() as server:
            server.reply_tool_uses([("c1", "read_file", {"path": "README.md", "pad": "y" * size})])
            server.reply_content("done")
            agent = write_agent(tmp_path / f"agent{size}", None, provider="anthropic", model="claude-test",
                                base_url=server.base_url, api_key_env=KEY_ENV, tools=["read_file"])
            peak, out = _peak_rss(cli, workspace, agent)
        peaks.append(peak)
    extra = peaks[1] - peaks[0]
    # Measured: 150 MB more when the SDK read the answer (3x), 112 MB now (2.2x: the body, its text, the parse).
    assert extra < 2.6 * 50 * MB, f"a 50 MB argument cost {extra / MB:.0f} MB more than a small one"
    [result] = [m["content"] for m in cli.log(json.loads(out)["session"]) if m["role"] == "tool"]
    assert "over the limit of 1,048,576 bytes" in result


def test_skipping_an_over_deep_part_is_bounded_in_time() -> None:
    # 2,000 deep, then ~1.7 million small nested lists (3 steps of the skip each): past its budget of steps.
    doc = ('{"content": [{"input": {"p": ' + "[" * 2000 + "[[1]]," * 1_700_000 + "1" + "]" * 2000 + "}}]}").encode()
    with pytest.raises(RecursionError):  # the provider's "nested too deeply to read", nothing recorded
        _load_answer(doc)
    few = ('{"content": [{"input": {"p": ' + "[" * 2000 + '[[1], "]"],' * 1000 + "1" + "]" * 2000 + "}}]}").encode()
    assert _load_answer(few)["content"][0]["input"]["p"] is not None
