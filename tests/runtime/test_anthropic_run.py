"""The anthropic provider end to end: the installed CLI against a local HTTP
server speaking the Messages API (``fake_anthropic.FakeAnthropic``), with real
tool calls in a real Git workspace: tool use, the key kept out of tools and
out of the store, ``max_tokens``, ``overloaded_error`` with ``retry-after``, a
stream dropped mid-answer, a crash after the response, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from kxen_agent.session.agent_def import load_agent_definition
from tests.helpers import Cli, write_agent

from .fake_anthropic import FakeAnthropic, Reply
from .test_lease import bench_factory, wait_for  # noqa: F401 (fixture)

KEY_ENV = "KXEN_TEST_ANTHROPIC_KEY"
KEY = "sk-ant-api03-test-5f0c1d2e3a4b9c8d"


@pytest.fixture
def server():
    with FakeAnthropic() as s:
        yield s


@pytest.fixture
def akey(state_dir: Path) -> Cli:
    return Cli(state_dir, env={KEY_ENV: KEY})


def anthropic_agent(tmp_path: Path, server: FakeAnthropic, **kw) -> Path:
    return write_agent(tmp_path / "agent", None, provider="anthropic", model="claude-test", base_url=server.base_url,
                       api_key_env=KEY_ENV, **kw)


def test_the_lock_records_the_default_key_variable_only_for_the_providers_own_endpoint(tmp_path: Path) -> None:
    own = tmp_path / "own.toml"
    own.write_text('name = "c"\nprovider = "anthropic"\nmodel = "claude-x"\n')
    lock = load_agent_definition(str(own))
    assert (lock["version"], lock["api_key_env"], lock["base_url"]) == (3, "ANTHROPIC_API_KEY", None)
    local = tmp_path / "local.toml"
    local.write_text('name = "c"\nprovider = "anthropic"\nmodel = "claude-x"\nbase_url = "http://127.0.0.1:1"\n')
    assert load_agent_definition(str(local))["api_key_env"] is None, "a custom endpoint gets only a key named"
    openai = tmp_path / "openai.toml"
    openai.write_text('name = "o"\nprovider = "openai"\nmodel = "gpt-x"\n')
    assert load_agent_definition(str(openai))["api_key_env"] == "OPENAI_API_KEY"


def test_tool_use_then_final_answer_key_out_of_tools_and_store(akey: Cli, server: FakeAnthropic, workspace: Path,
                                                                tmp_path: Path) -> None:
    server.reply_tool_uses([("toolu_1", "shell", {"command": f"printenv {KEY_ENV}; echo rc=$? > out.txt"})],
                           content="on it")
    server.reply_content(f"done; by the way the key is {KEY}", model="claude-test-2026")
    agent = anthropic_agent(tmp_path, server)

    res = akey.run_json(workspace, "write out.txt", agent, expect=0).json()
    assert (res["status"], res["model"], res["turn"]) == ("completed", "claude-test-2026", 2)
    assert KEY not in res["result"] and "[REDACTED]" in res["result"]
    assert (workspace / "out.txt").read_text() == "rc=1\n", "the key's variable is not in the tool's environment"

    first, second = server.message_requests()
    assert first["model"] == "claude-test" and first["system"]
    assert {t["name"] for t in first["tools"]} == {"shell", "read_file", "write_file", "edit_file", "list_files"}
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assistant, results = second["messages"][1:]
    assert assistant["content"] == [
        {"type": "text", "text": "on it"},
        {"type": "tool_use", "id": "toolu_1", "name": "shell",
         "input": {"command": f"printenv {KEY_ENV}; echo rc=$? > out.txt"}}]
    assert results["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[exit code 0]"}]

    log = akey.log(res["session"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    bundle = tmp_path / "s.json"
    akey("session", "export", res["session"], "--output", str(bundle), expect=0)
    assert KEY not in json.dumps(log) and KEY not in bundle.read_text()
    akey.fsck_clean()


def test_max_tokens_fails_the_run_and_records_nothing_of_the_answer(akey: Cli, server: FakeAnthropic,
                                                                     workspace: Path, tmp_path: Path) -> None:
    server.reply(Reply(content="a half-written ans", stop_reason="max_tokens"))
    res = akey.run_json(workspace, "write a novel", anthropic_agent(tmp_path, server), expect=1).json()
    assert res["status"] == "failed" and "stop_reason 'max_tokens'" in res["error"]  # its own word
    assert [m["role"] for m in akey.log(res["session"])] == ["user"]


# Every run or resume of the anthropic provider imports its SDK (~2 s CPU): one run checks both
# retried failures (an overload, then a dropped stream), one session both crashes (after a tool-use
# turn, then after the final response).


def test_overloaded_with_retry_after_and_a_stream_dropped_mid_answer_are_retried_and_recorded_once(
        akey: Cli, server: FakeAnthropic, workspace: Path, tmp_path: Path) -> None:
    server.reply_error(529, "overloaded_error", "Overloaded", headers={"retry-after": "0.3"})
    server.reply(Reply(content="a long answer cut in the middle", drop_after=5))
    server.reply(Reply(content="the whole answer"))
    res = akey("run", "--workspace", str(workspace), "--task", "hello", "--agent",
               str(anthropic_agent(tmp_path, server)), "--events", expect=0)
    events = res.jsonl()
    overload, dropped = [e for e in events if e["event"] == "provider_retry"]
    assert overload["waitS"] == 0.3 and "overloaded_error" in overload["error"], overload
    assert "middle of the streamed answer" in dropped["error"], dropped
    first, second, third = server.requests
    assert second.at - first.at >= 0.3, "the server's retry-after is honoured"
    assert all(r.streamed for r in server.requests)
    [s] = akey.sessions()
    assert [m["content"] for m in akey.log(s["id"])] == ["hello", "the whole answer"]


def test_a_crash_after_a_tool_use_turn_or_after_the_response_asks_the_model_once_more_only_for_the_answer(
        akey: Cli, server: FakeAnthropic, workspace: Path, tmp_path: Path) -> None:
    server.reply_tool_uses([("toolu_r", "read_file", {"path": "README.md"})])
    server.reply_content("read it")
    crashed = akey.run_json(workspace, "read", anthropic_agent(tmp_path, server),
                            env={"KXEN_AGENT_FAULT": "tool:after-started"})
    assert crashed.killed, str(crashed)
    [s] = akey.sessions()
    # The resume runs the tool and asks for the answer, then dies after the response, before its message.
    crashed = akey.resume(s["id"], env={"KXEN_AGENT_FAULT": "provider:after-response"})
    assert crashed.killed, str(crashed)
    assert len(server.message_requests()) == 2, "the turn that asked for the tool was durable: asked once"
    assert [m["role"] for m in akey.log(s["id"])] == ["user", "assistant", "tool"]
    res = akey.resume(s["id"], expect=0).json()
    assert res["result"] == "read it"
    asked = server.message_requests()
    assert len(asked) == 3 and asked[2]["messages"] == asked[1]["messages"], "the lost answer is asked for again, once"
    assert [m["role"] for m in akey.log(s["id"])] == ["user", "assistant", "tool", "assistant"]


def test_missing_key_fails_clearly(cli: Cli, server: FakeAnthropic, workspace: Path, tmp_path: Path) -> None:
    # Refused before a session exists (exit 2, one line): no failed run to --retry.
    p = cli.run_json(workspace, "anything", anthropic_agent(tmp_path, server), expect=2)
    assert p.out == "" and len(p.err.strip().splitlines()) == 1 and f"{KEY_ENV} is not set or empty" in p.err
    assert not cli.state_dir.exists() and server.requests == []


def test_ctrl_c_during_a_slow_model_call_aborts_it(bench_factory, tmp_path):  # noqa: F811 (fixture)
    b = bench_factory([{"content": "unused"}])
    with FakeAnthropic() as server:
        agent = tmp_path / "claude.toml"
        agent.write_text('name = "c"\nprovider = "anthropic"\nmodel = "claude-test"\n'
                         f'base_url = "{server.base_url}"\ntools = ["shell"]\n')
        server.reply(Reply(content="too late", delay_s=30))
        a = b.spawn("run", "--workspace", str(b.ws), "--task", "t", "--agent", str(agent), "--events")
        wait_for(lambda: server.requests, "the model call to arrive")
        t0 = time.monotonic()
        os.kill(a.pid, signal.SIGINT)
        assert a.wait(timeout=20) == 130, a.stderr
        wait_for(lambda: server.abandoned, "the server to see the connection close", timeout=5)
        assert server.abandoned[0] - t0 < 1.0, "the request is aborted (its connection closed) within 1 s"
        assert len(server.requests) == 1, "a canceled call is not retried"


def test_a_missing_sdk_is_reported_before_a_session_exists(cli: Cli, state_dir: Path, server: FakeAnthropic,
                                                            workspace: Path, tmp_path: Path) -> None:
    shadow = tmp_path / "no-anthropic" / "anthropic"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'anthropic'\", name='anthropic')\n")
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(anthropic_agent(tmp_path, server)),
            env={"PYTHONPATH": str(shadow.parent), KEY_ENV: KEY}, expect=2)  # the key is there: the SDK is what fails
    lines = p.err.strip().splitlines()
    assert len(lines) == 1 and "the anthropic provider needs the anthropic package, which is not installed" in lines[0]
    assert "[anthropic]" in lines[0].split("install it with: ", 1)[1], lines[0]
    assert not state_dir.exists() and server.requests == []
