"""The openai provider end to end: the installed CLI against a local HTTP
server speaking Chat Completions (``fake_openai.FakeOpenAI``), with real
tool calls in a real Git workspace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kxen_agent.runtime.retry import RetryPolicy
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import load_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store.memory import MemoryStore
from tests.helpers import Cli, read_lines, tool_result_counts, write_agent

from .fake_openai import FakeOpenAI

KEY_ENV = "KXEN_TEST_OPENAI_KEY"
KEY = "sk-openai-test-5f0c1d2e3a4b"


SequencedOpenAI = FakeOpenAI  # every FakeOpenAI answers with its queued replies in order


@pytest.fixture
def server():
    with SequencedOpenAI() as s:
        yield s


@pytest.fixture
def okey(state_dir: Path) -> Cli:
    """The CLI with the provider key in its environment."""
    return Cli(state_dir, env={KEY_ENV: KEY})


def openai_agent(tmp_path: Path, server: FakeOpenAI, **kw) -> Path:
    return write_agent(tmp_path / "agent", None, provider="openai", model="gpt-test", base_url=server.base_url,
                       api_key_env=KEY_ENV, **kw)


def test_tool_call_then_final_answer_after_a_dropped_connection(okey: Cli, server: SequencedOpenAI,
                                                                 workspace: Path, tmp_path: Path) -> None:
    # The first request's connection is dropped: retried, the same request, its answer recorded once.
    server.drop_connection()
    server.reply_tool_calls([("call_w1", "shell", json.dumps({"command": "echo built > out.txt"}))], content="on it")
    server.reply_content("the file is written", model="gpt-test-0613")
    agent = openai_agent(tmp_path, server)

    res = okey.run_json(workspace, "write out.txt", agent, expect=0).json()
    assert (res["status"], res["result"], res["model"], res["turn"]) == ("completed", "the file is written", "gpt-test-0613", 2)
    assert (workspace / "out.txt").read_text() == "built\n"

    reqs = server.chat_requests()
    assert len(reqs) == 3 and reqs[0] == reqs[1], "the dropped request is sent again as it was"
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    first, second = reqs[1:]
    assert first["model"] == "gpt-test"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in first["tools"]} == {"shell", "read_file", "write_file", "edit_file", "list_files"}
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assistant, tool = second["messages"][2:]
    assert assistant["tool_calls"] == [{"id": "call_w1", "type": "function",
                                        "function": {"name": "shell", "arguments": '{"command": "echo built > out.txt"}'}}]
    assert tool == {"role": "tool", "content": "[exit code 0]", "tool_call_id": "call_w1"}

    log = okey.log(res["session"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    show = okey.run_show(res["session"], res["run"])
    assert [(j["tool"], j["state"], j["callId"]) for j in show["journal"]] == [("shell", "Settled", "call_w1")]
    okey.fsck_clean()


def test_http_400_fails_the_run_and_keeps_the_history(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    server.reply_tool_calls([("call_a", "shell", json.dumps({"command": "echo once >> effects.log"}))])
    server.reply_error(400, "context_length_exceeded: too many tokens")
    agent = openai_agent(tmp_path, server)

    p = okey.run_json(workspace, "do a thing", agent, expect=1)
    res = p.json()
    assert res["status"] == "failed" and res["settled"] is True
    assert "HTTP 400" in res["error"] and "context_length_exceeded" in res["error"] and server.base_url in res["error"]
    assert len(server.chat_requests()) == 2, "a 400 is not retried"

    log = okey.log(res["session"])
    assert [(m["role"], m["content"]) for m in log][:1] == [("user", "do a thing")]
    assert [m["role"] for m in log] == ["user", "assistant", "tool"]
    assert read_lines(workspace / "effects.log") == ["once"]
    show = okey.run_show(res["session"], res["run"])
    assert [j["state"] for j in show["journal"]] == ["Settled"]

    # The history carries on: a new task sends all of it to the (now healthy) server.
    server.clear()
    server.reply_content("recovered")
    nxt = okey.resume(res["session"], "--task", "try again", expect=0).json()
    assert nxt["result"] == "recovered"
    last = server.chat_requests()[-1]
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert read_lines(workspace / "effects.log") == ["once"]


def test_missing_key_fails_clearly(cli: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    # Refused before a session exists (exit 2, one line): no failed run to --retry.
    agent = openai_agent(tmp_path, server)
    p = cli.run_json(workspace, "anything", agent, expect=2)
    assert p.out == "" and len(p.err.strip().splitlines()) == 1 and f"{KEY_ENV} is not set or empty" in p.err
    assert server.requests == [] and not cli.state_dir.exists()


def test_connection_always_dropped_fails_after_five_attempts_without_losing_history(
        server: SequencedOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (the retry policy's backoff shortened, not its counts): five attempts, then failed, history kept."""
    monkeypatch.setenv(KEY_ENV, KEY)
    server.reply_tool_calls([("call_r", "read_file", json.dumps({"path": "README.md"}))])
    server.drop_connection()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# test workspace\n")
    lock = load_agent_definition(str(openai_agent(tmp_path, server)))
    store = MemoryStore("dropped")
    res = Runner(store, retry_policy=RetryPolicy(backoff_base_s=0.01)).start(str(ws), "read the readme", lock)
    assert res.status == "failed"
    assert "cannot reach model provider" in res.error and server.base_url in res.error, res.error
    assert "gave up after 5 attempts" in res.error and f"--resume {res.session} --retry" in res.error, res.error
    assert len(server.chat_requests()) == 1 + 5, "the first turn, then five attempts at the second"
    log = SessionStore(store).history(SessionStore(store).get(res.session).head)
    assert [m.role for m in log] == ["user", "assistant", "tool"]
    assert log[2].content == "# test workspace\n"


def test_tool_not_in_the_agent_is_refused_not_run(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    server.reply_tool_calls([
        ("call_x", "shell", json.dumps({"command": f"touch '{marker}'"})),
        ("call_y", "delete_everything", "{}"),
        ("call_z", "read_file", "not json"),
    ])
    server.reply_content("ok")
    agent = openai_agent(tmp_path, server, tools=["read_file"])
    res = okey.run_json(workspace, "try it", agent, expect=0).json()
    assert not marker.exists()
    assert [t["function"]["name"] for t in server.chat_requests()[0]["tools"]] == ["read_file"]
    log = okey.log(res["session"])
    tools = {m["toolCallId"]: m["content"] for m in log if m["role"] == "tool"}
    assert "'shell' is not allowed" in tools["call_x"] and "read_file" in tools["call_x"]
    assert "'delete_everything' is not allowed" in tools["call_y"]
    assert "invalid arguments for read_file" in tools["call_z"]
    show = okey.run_show(res["session"], res["run"])
    assert [(j["state"], j["outcome"]["isError"]) for j in show["journal"]] == [("Settled", True)] * 3


def test_crash_before_a_disallowed_call_is_not_unknown(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    """A call the agent may not make never runs, so a crash after its Started cannot leave an UNKNOWN."""
    marker = tmp_path / "ran.txt"
    server.reply_tool_calls([("call_x", "shell", json.dumps({"command": f"touch '{marker}'"}))])
    server.reply_content("ok")
    agent = openai_agent(tmp_path, server, tools=["read_file"])
    crashed = okey.run_json(workspace, "try it", agent, env={"KXEN_AGENT_FAULT": "tool:after-started"})
    assert crashed.killed, str(crashed)
    [s] = okey.sessions()
    res = okey.resume(s["id"], expect=0).json()
    assert res["unknownOps"] == [] and not marker.exists()
    log = okey.log(s["id"])
    assert [m["content"] for m in log if m["role"] == "tool"][0].startswith("tool 'shell' is not allowed")


def test_duplicate_call_ids_from_the_server_each_get_one_result(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    """Some OpenAI-compatible servers reuse or omit tool call ids; every call must still run once."""
    effects = tmp_path / "effects.log"
    server.reply_tool_calls([
        ("call_0", "shell", json.dumps({"command": f"echo a >> '{effects}'"})),
        ("call_0", "shell", json.dumps({"command": f"echo b >> '{effects}'"})),
    ])
    server.reply_content("ok")
    agent = openai_agent(tmp_path, server)
    res = okey.run_json(workspace, "two calls", agent, expect=0).json()
    assert read_lines(effects) == ["a", "b"]
    log = okey.log(res["session"])
    asked, results = tool_result_counts(log)
    assert len(asked) == 2 and len(set(asked)) == 2, asked
    assert {c: results[c] for c in asked} == {c: 1 for c in asked}
    # What the server gets back pairs each result with its call.
    msgs = server.chat_requests()[-1]["messages"]
    sent_ids = [c["id"] for c in msgs[2]["tool_calls"]]
    assert [m["tool_call_id"] for m in msgs[3:]] == sent_ids


def test_crash_after_response_calls_the_provider_again_once(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    """provider:after-response: the answer was not durable, so resume asks again — and records it once."""
    server.reply_content("final words")
    agent = openai_agent(tmp_path, server)
    crashed = okey.run_json(workspace, "say it", agent, env={"KXEN_AGENT_FAULT": "provider:after-response"})
    assert crashed.killed, str(crashed)
    [s] = okey.sessions()
    assert [m["role"] for m in okey.log(s["id"])] == ["user"]
    res = okey.resume(s["id"], expect=0).json()
    assert res["result"] == "final words"
    assert len(server.chat_requests()) == 2
    assert [m["role"] for m in okey.log(s["id"])] == ["user", "assistant"]


def test_a_call_without_id_gets_ours_and_one_without_name_fails_the_run(okey: Cli, server: SequencedOpenAI, workspace: Path, tmp_path: Path) -> None:
    """What an OpenAI-compatible server leaves out never reaches the store as a malformed object:
    a missing call id is replaced by ours (§14.1); a call with no function name fails the run in one
    line, and the session still reads."""
    effects = tmp_path / "effects.log"
    server.reply_tool_calls([(None, "shell", json.dumps({"command": f"echo a >> '{effects}'"})),  # type: ignore[list-item]
                             (7, "shell", json.dumps({"command": f"echo b >> '{effects}'"}))])  # type: ignore[list-item]
    server.reply_content("ok")
    agent = openai_agent(tmp_path, server)
    res = okey.run_json(workspace, "no id", agent, expect=0).json()
    assert read_lines(effects) == ["a", "b"]
    asked, results = tool_result_counts(okey.log(res["session"]))
    assert asked == ["call_1_0", "call_1_1"] and results == {"call_1_0": 1, "call_1_1": 1}, (asked, results)

    server.clear()
    server.reply_tool_calls([("call_x", None, "{}")])  # type: ignore[list-item]
    p = okey.resume(res["session"], "--task", "no name")
    assert p.rc == 1 and "Traceback" not in p.err, str(p)
    out = p.json()
    assert out["status"] == "failed" and "without a function name" in out["error"], out
    okey("session", "log", res["session"], expect=0)
    okey.fsck_clean()
