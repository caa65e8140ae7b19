"""Model output checked at the door (issue 25, reproduction 4): the installed CLI against the fake
model servers, answers no session must record as they came — arguments 1,500 deep, a lone surrogate
in a ``read_file`` path, 65 calls in one answer — and a session the old code recorded such an answer
in, which must resume. Also the model-call deadline against a server that trickles its answer."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from kxen_agent.runtime.answer_check import (AnswerLimits, BadArguments, check_turn, parse_arguments,
                                              safe_provider_message)
from kxen_agent.runtime.events import TurnFinished
from kxen_agent.runtime.providers import AssistantTurn, ToolCall
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import load_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import Store
from tests.helpers import Cli, tool_result_counts, write_agent

from .fake_anthropic import FakeAnthropic
from .fake_openai import FakeOpenAI

KEY_ENV = "KXEN_TEST_DOOR_KEY"
DEEP = '{"path": ' + "[" * 1500 + "]" * 1500 + "}"
ESCAPED_SURROGATE = '{"path": "\\ud800"}'  # the JSON escape of a lone surrogate, inside the arguments
RAW_SURROGATE = '{"path": "\ud800"}'  # the character itself (the server's JSON escaped it once)


@pytest.fixture
def okey(state_dir: Path) -> Cli:
    return Cli(state_dir, env={KEY_ENV: "sk-door-test-0123456789"})


def agent(tmp_path: Path, base_url: str, provider: str = "openai", **policy) -> Path:
    return write_agent(tmp_path / "agent", None, provider=provider, model="m", base_url=base_url,
                       api_key_env=KEY_ENV, tools=["read_file", "list_files"], policy=policy)


def tool_results(cli: Cli, ses: str) -> dict[str, str]:
    return {m["toolCallId"]: m["content"] for m in cli.log(ses) if m["role"] == "tool"}


def no_traceback(*procs) -> None:
    for p in procs:
        assert "Traceback" not in p.err and "Error:" not in p.err.replace("error:", ""), str(p)


# ==================================================================== the rules, as a pure module

def test_parse_arguments_refuses_what_would_crash_and_never_recurses() -> None:
    assert parse_arguments('{"path": "a.txt"}') == {"path": "a.txt"}
    assert parse_arguments('{"s": "\\ud83d\\ude00"}') == {"s": "\U0001F600"}, "a surrogate pair is one character"
    for text, why in [(DEEP, "nested more than 64 levels"), (ESCAPED_SURROGATE, "lone surrogate"),
                      (RAW_SURROGATE, "lone surrogate"), ("[1]", "must be a JSON object"),
                      ('{"a": NaN}', "NaN is not JSON"), ("{oops", "not valid JSON"),
                      ('{"k": "' + "x" * 5000 + '"}', "over the limit of 4,096 bytes")]:
        with pytest.raises(BadArguments, match=why):
            parse_arguments(text, max_bytes=4096)
    # Brackets inside strings do not count as nesting; 64 levels pass, 65 do not.
    assert parse_arguments('{"a": "' + "[" * 500 + '"}')["a"] == "[" * 500
    parse_arguments('{"a": ' + "[" * 63 + "]" * 63 + "}")
    with pytest.raises(BadArguments, match="64"):
        parse_arguments('{"a": ' + "[" * 64 + "]" * 64 + "}")


def test_check_turn_refuses_calls_and_cleans_texts() -> None:
    turn = AssistantTurn("bad \ud800 text", (ToolCall("c1", "read_file", DEEP), ToolCall("c\udc00", "read_file", "{}")),
                         "model\ud800", "tool_calls")
    checked = check_turn(turn, AnswerLimits())
    assert checked.content == "bad \ufffd text" and checked.model == "model\ufffd"
    first, second = checked.tool_calls
    with pytest.raises(BadArguments, match="nested more than 64 levels"):
        parse_arguments(first.arguments)
    assert (second.id, second.arguments) == (None, "{}"), "a non-Unicode id is replaced by the runner's own"
    fine = AssistantTurn("ok", (ToolCall("c1", "read_file", '{"path": "a"}'),), "m", "tool_calls")
    assert check_turn(fine, AnswerLimits()) is fine
    many = AssistantTurn(None, tuple(ToolCall(f"c{i}", "list_files", "{}") for i in range(3)), "m", "tool_calls")
    two = check_turn(many, AnswerLimits(max_tool_calls=2))
    assert len(two.tool_calls) == 2
    for c in two.tool_calls:
        with pytest.raises(BadArguments, match="asked for 3 tool calls, over the limit of 2"):
            parse_arguments(c.arguments)


def test_the_loader_shows_a_pre_door_value_as_refused() -> None:
    msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "name": "read_file", "arguments": DEEP},
                                                                  {"id": "b", "name": "read_file", "arguments": "{}"}]}
    safe = safe_provider_message(msg)
    assert safe["tool_calls"][1] is msg["tool_calls"][1] and msg["tool_calls"][0]["arguments"] == DEEP
    assert "nested more than 64" in json.loads(safe["tool_calls"][0]["arguments"])
    plain = {"role": "assistant", "content": "x", "tool_calls": [{"id": "a", "name": "n", "arguments": "{bad"}]}
    assert safe_provider_message(plain) is plain, "bad JSON that crashes nothing is left as recorded"


# ==================================================================== end to end, OpenAI-compatible

#: The malformed arguments of one answer, each with the word its tool error gives.
MALFORMED = {"c_deep": (DEEP, "nested more than 64 levels"), "c_escaped": (ESCAPED_SURROGATE, "lone surrogate"),
             "c_raw": (RAW_SURROGATE, "lone surrogate")}


def test_malformed_answers_become_tool_errors_and_the_session_resumes(okey: Cli, workspace: Path,
                                                                      tmp_path: Path) -> None:
    # The three malformed kinds in one answer beside a good call (each was its own run and resume:
    # three times the CPU, each process importing the SDK): each bad call is refused on its own.
    with FakeOpenAI() as server:
        server.reply_tool_calls([(cid, "read_file", arguments) for cid, (arguments, _) in MALFORMED.items()]
                                + [("c_ok", "list_files", "{}")])
        server.reply_content("went on")
        first = okey.run_json(workspace, "read it", agent(tmp_path, server.base_url), expect=0)
        res = first.json()
        assert (res["status"], res["result"]) == ("completed", "went on")
        results = tool_results(okey, res["session"])
        for cid, (_, why) in MALFORMED.items():
            assert results[cid].startswith("invalid arguments for read_file: ") and why in results[cid], results
        assert "README" in results["c_ok"] or results["c_ok"], "the good call of the same answer ran"
        # The model was told on the next request, with arguments no SDK chokes on.
        sent = server.chat_requests()[1]["messages"]
        calls = {c["id"]: c for c in next(m for m in sent if m["role"] == "assistant")["tool_calls"]}
        for cid, (_, why) in MALFORMED.items():
            assert why in json.loads(calls[cid]["function"]["arguments"]), calls[cid]
        server.clear()
        server.reply_content("again")
        later = okey.resume(res["session"], "--task", "once more", expect=0)
        assert later.json()["result"] == "again"
        no_traceback(first, later)
    okey.fsck_clean()


def test_65_calls_in_one_answer_run_none(okey: Cli, workspace: Path, tmp_path: Path) -> None:
    (workspace / "marker").write_text("x")
    with FakeOpenAI() as server:
        server.reply_tool_calls([(f"c{i}", "read_file", '{"path": "marker"}') for i in range(65)])
        server.reply_content("fewer next time")
        res = okey.run_json(workspace, "read a lot", agent(tmp_path, server.base_url), expect=0).json()
    assert res["status"] == "completed"
    log = okey.log(res["session"])
    asked, counts = tool_result_counts(log)
    assert len(asked) == 64 and all(counts[c] == 1 for c in asked), "64 kept, each with its one result"
    for text in tool_results(okey, res["session"]).values():
        assert "asked for 65 tool calls, over the limit of 64" in text and "none was run" in text


def test_max_tool_calls_and_argument_bytes_come_from_the_policy(okey: Cli, workspace: Path, tmp_path: Path) -> None:
    path = agent(tmp_path, "http://127.0.0.1:9/v1", max_tool_calls=2, max_argument_bytes=2048, model_timeout_s=7)
    lock = load_agent_definition(str(path))
    assert lock["version"] == 4
    assert {k: lock["policy"][k] for k in ("max_tool_calls", "max_argument_bytes", "model_timeout_ms")} == \
        {"max_tool_calls": 2, "max_argument_bytes": 2048, "model_timeout_ms": 7000}
    plain = load_agent_definition(str(agent(tmp_path / "plain", "http://127.0.0.1:9/v1")))
    assert plain["version"] == 3 and "max_tool_calls" not in plain["policy"], "unset: the version-3 lock as before"
    with FakeOpenAI() as server:
        path = agent(tmp_path, server.base_url, max_tool_calls=2, max_argument_bytes=2048)
        server.reply_tool_calls([("a", "list_files", "{}"), ("b", "read_file", json.dumps({"path": "x" * 3000}))])
        server.reply_tool_calls([("c", "list_files", "{}"), ("d", "list_files", "{}"), ("e", "list_files", "{}")])
        server.reply_content("done")
        res = okey.run_json(workspace, "t", path, expect=0).json()
    results = tool_results(okey, res["session"])
    assert not results["a"].startswith("invalid arguments"), "two calls are allowed: the first ran"
    assert "over the limit of 2,048 bytes" in results["b"]
    assert all("asked for 3 tool calls, over the limit of 2" in results[c] for c in "cd") and "e" not in results


# ==================================================================== end to end, Anthropic

def test_anthropic_answers_nested_past_the_sdk_are_refused_and_a_surrogate_is_refused(
        okey: Cli, workspace: Path, tmp_path: Path) -> None:
    deep: object = []
    for _ in range(1499):
        deep = [deep]
    hundred: object = []
    for _ in range(100):  # past the door's 64, within what the SDK parses
        hundred = [hundred]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # the fake server's json.dumps of the deep input, in this process
    try:
        with FakeAnthropic() as server:
            path = agent(tmp_path, server.base_url, provider="anthropic")
            server.reply_tool_uses([("t1", "read_file", {"path": deep})])
            server.reply_content("went on")  # the SDK no longer parses the answer: the call is refused, the run goes on
            failed = okey.run_json(workspace, "t", path, expect=0)
            res = failed.json()
            assert res["result"] == "went on" and "nested more than 64 levels" in tool_results(okey, res["session"])["t1"]
            server.clear()
            server.reply_tool_uses([("t2", "read_file", {"path": "\ud800"}), ("t3", "read_file", {"path": hundred})])
            server.reply_content("fine")
            retried = okey.resume(res["session"], "--task", "again", expect=0)
            assert retried.json()["result"] == "fine"
            results = tool_results(okey, res["session"])
            assert "lone surrogate" in results["t2"] and "nested more than 64 levels" in results["t3"]
            # What went back to the model: the refusal, as text under one key (never the deep value).
            blocks = [b for m in server.message_requests()[-1]["messages"] for b in m["content"]
                      if b["type"] == "tool_use"]
            assert all(set(b["input"]) == {"invalid_arguments"} for b in blocks)
            no_traceback(failed, retried)
    finally:
        sys.setrecursionlimit(old)


# ==================================================================== a session the old code bricked

class _Crash(Exception):
    pass


class _Unchecked:
    """A provider that hands the runner the answer raw, as every provider did before the door."""

    base_url = None

    def __init__(self, turn: AssistantTurn) -> None:
        self.turn, self.model = turn, "m"

    def complete(self, messages, tools, *, cancel=None, on_text=None) -> AssistantTurn:
        return self.turn

    def close(self) -> None:
        pass


@pytest.mark.parametrize("arguments, started", [(DEEP, False), (ESCAPED_SURROGATE, True)],
                         ids=["1500-deep", "surrogate"])
def test_a_session_bricked_by_the_old_code_resumes(okey: Cli, workspace: Path, tmp_path: Path, arguments: str,
                                                   started: bool) -> None:
    with FakeOpenAI() as server:
        lock = load_agent_definition(str(agent(tmp_path, server.base_url)))
        bad = AssistantTurn(None, (ToolCall("c_bad", "read_file", arguments),), "m", "tool_calls")

        # Where the old code raised: for the depth, parsing the arguments before anything was journaled
        # (right after the answer was durable); for the surrogate, in the tool, after Started.
        def crash(point: str) -> None:
            if started and point == "tool:after-started":
                raise _Crash(point)

        def listener(event: object) -> None:
            if not started and isinstance(event, TurnFinished):
                raise _Crash("turn recorded")

        store = Store.open(str(okey.state_dir))
        runner = Runner(store, providers=lambda lock, endpoint: _Unchecked(bad), fault=crash, listener=listener)
        with pytest.raises(_Crash):
            runner.start(str(workspace), "read it", lock)
        [ses] = [s["id"] for s in okey.sessions()]
        recorded = [m for m in okey.log(ses) if m["role"] == "assistant"][0]["toolCalls"][0]["arguments"]
        assert recorded == arguments, "the bad value is recorded, as the old code did"
        [run] = SessionStore(store).get(ses).runs
        journal = okey.run_show(ses, run)["journal"]
        assert [j["state"] for j in journal] == (["Started"] if started else [])
        server.reply_content("recovered")
        resumed = okey.resume(ses, expect=0)
        assert resumed.json()["result"] == "recovered"
        text = tool_results(okey, ses)["c_bad"]
        assert text.startswith("invalid arguments for read_file:")
        # The model is shown the refusal, not the value that crashed SDKs.
        call = next(m for m in server.chat_requests()[0]["messages"] if m["role"] == "assistant")["tool_calls"][0]
        assert call["function"]["arguments"] != arguments and "kxen-agent refused" in call["function"]["arguments"]
        server.clear()
        server.reply_content("and on")
        assert okey.resume(ses, "--task", "more", expect=0).json()["result"] == "and on"
        no_traceback(resumed)


# ==================================================================== the model-call deadline

class Trickle:
    """An HTTP server that answers every request with a status line and headers, then one byte of its
    body every ``every_s`` seconds, never finishing: no read timeout ever fires on it."""

    def __init__(self, every_s: float = 0.3) -> None:
        self.every_s = every_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.stop = threading.Event()
        self.asked = threading.Event()  # a request arrived
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.sock.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.asked.set()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
                while not self.stop.wait(self.every_s):
                    conn.sendall(b" ")
            except OSError:
                return


def test_a_trickling_server_hits_the_model_call_deadline(okey: Cli, workspace: Path, tmp_path: Path) -> None:
    with Trickle() as server:
        path = agent(tmp_path, server.base_url, model_timeout_s=2)
        t0 = time.monotonic()
        proc = okey.run_json(workspace, "t", path, expect=1)
        took = time.monotonic() - t0
    res = proc.json()
    assert res["status"] == "failed" and "within 2s, the model-call deadline" in res["error"], str(proc)
    assert took < 30, f"the call was held {took:.1f}s past a 2 s deadline"  # (start-up on a busy machine included)
    no_traceback(proc)


def test_sigterm_ends_a_trickling_model_call_at_once(okey: Cli, workspace: Path, tmp_path: Path) -> None:
    with Trickle() as server:
        path = agent(tmp_path, server.base_url)  # the default deadline: 300 s
        proc = okey.spawn("run", "--workspace", str(workspace), "--task", "t", "--agent", str(path), "--json")
        try:
            assert server.asked.wait(30), "the request never came"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    res = json.loads(out)
    assert res["status"] == "canceled" and "aborted" in res["error"], out + err
    assert took < 10, f"SIGTERM took {took:.1f}s to end the call"


# ==================================================================== streamed answers, provider by provider

def test_streamed_answers_pass_the_door_too() -> None:
    from kxen_agent.runtime.providers import AnthropicProvider, OpenAIProvider

    hundred: object = []
    for _ in range(100):
        hundred = [hundred]
    with FakeOpenAI() as server:
        server.reply_tool_calls([("a", "read_file", DEEP), ("b", "read_file", RAW_SURROGATE)], content="x\ud800y")
        provider = OpenAIProvider(server.base_url, "m", None)
        try:
            turn = provider.complete([{"role": "user", "content": "t"}], [], on_text=lambda piece: None)
        finally:
            provider.close()
        assert server.chat_requests()[0]["stream"] is True
    assert turn.content == "x\ufffdy"
    assert [("nested more than 64" in c.arguments, "lone surrogate" in c.arguments) for c in turn.tool_calls] == \
        [(True, False), (False, True)]
    with FakeAnthropic() as server:
        server.reply_tool_uses([("t1", "read_file", {"path": hundred}), ("t2", "read_file", {"path": "\ud800"})])
        provider = AnthropicProvider(server.base_url, "m", None)
        try:
            turn = provider.complete([{"role": "user", "content": "t"}], [], on_text=lambda piece: None)
        finally:
            provider.close()
    assert [("nested more than 64" in c.arguments, "lone surrogate" in c.arguments) for c in turn.tool_calls] == \
        [(True, False), (False, True)]
