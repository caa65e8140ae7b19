"""Compaction (``[policy] context_tokens``, §14.4 ``compaction`` messages): the
installed CLI against a local Chat Completions server (``fake_openai``): a
view over the budget is summarized by a provider step, the next request starts
from the summary, the full history stays (log, fork before the compaction),
the reported usage counts, crashes in the middle of a compaction, and
``session compact [--at MSG]``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kxen_agent.runtime.compaction import SUMMARY_PREFIX, SUMMARY_REQUEST, held_view, provider_view, view_tokens
from kxen_agent.runtime.history import RunHistory
from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import CorruptObject
from kxen_agent.store.memory import MemoryStore
from tests.helpers import Cli, write_agent

from .fake_openai import FakeOpenAI, Reply

BIG = "python3 -c \"print('x' * 6000)\""


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def agent(tmp_path: Path, server: FakeOpenAI, context_tokens: int | None = 1000) -> Path:
    policy = {} if context_tokens is None else {"context_tokens": context_tokens}
    return write_agent(tmp_path / "agent", None, provider="openai", model="gpt-test", base_url=server.base_url,
                       tools=["shell"], policy=policy)


def roles(body: dict) -> list[str]:
    return [m["role"] for m in body["messages"]]


def run(cli: Cli, workspace: Path, agent_path: Path, **kw) -> dict:
    return cli.run_json(workspace, "make a big output", agent_path, **kw).json()


def test_a_view_over_the_budget_is_compacted_and_the_full_history_stays(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                                          tmp_path: Path) -> None:
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": BIG}))])
    server.reply_content("SUMMARY: printed 6000 x; nothing left but to answer")
    server.reply_content("done")
    res = run(cli, workspace, agent(tmp_path, server), expect=0)
    assert (res["status"], res["result"], res["turn"]) == ("completed", "done", 2)

    first, summary, second = server.chat_requests()
    assert roles(first) == ["system", "user"]
    assert roles(summary) == ["system", "user", "assistant", "tool", "user"]
    assert summary["messages"][-1]["content"] == SUMMARY_REQUEST
    assert roles(second) == ["system", "user"], "the view starts from the compaction"
    assert second["messages"][1]["content"] == SUMMARY_PREFIX + "SUMMARY: printed 6000 x; nothing left but to answer"

    log = cli.log(res["session"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "compaction", "assistant"]
    assert log[3]["through"] == log[2]["id"] and log[3]["run"] == res["run"]
    assert len(log[2]["content"]) > 6000, "the summarized tool output is still in the session"
    text = cli("session", "log", res["session"], expect=0).out
    assert f"summarizes the history through {log[2]['id'][:16]}" in text
    cli.fsck_clean()

    # A fork before the compaction has the full view.
    fork = cli("session", "fork", res["session"], "--at", log[2]["id"], "--json", expect=0).json()
    server.clear()
    server.reply_content("SUMMARY: the fork's")
    server.reply_content("seen everything")
    before = len(server.chat_requests())
    cli.resume(fork["id"], "--task", "and now?", expect=0)
    asked, answered = server.chat_requests()[before:]
    # Over the budget again, so it compacts: from the full history, not from the parent's summary.
    assert roles(asked) == ["system", "user", "assistant", "tool", "user", "user"]
    assert "x" * 6000 in asked["messages"][3]["content"] and asked["messages"][-1]["content"] == SUMMARY_REQUEST
    assert roles(answered) == ["system", "user"]


def test_reported_usage_counts_even_when_the_text_is_short(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                           tmp_path: Path) -> None:
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": "echo hi"}))],
                            usage={"prompt_tokens": 1500, "completion_tokens": 20, "total_tokens": 1520})
    server.reply_content("SUMMARY: said hi")
    server.reply_content("done")
    res = run(cli, workspace, agent(tmp_path, server), expect=0)
    assert res["status"] == "completed"
    assert [m["role"] for m in cli.log(res["session"])] == ["user", "assistant", "tool", "compaction", "assistant"]
    show = cli.run_show(res["session"], res["run"])
    assert show["usage"]["turns"] == 3, "the summary's tokens are counted with the run's"


@pytest.mark.parametrize("point", ["compaction:after-response", "compaction:after-message"])
def test_a_crash_in_the_middle_of_a_compaction(cli: Cli, server: FakeOpenAI, workspace: Path, tmp_path: Path,
                                               point: str) -> None:
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": BIG}))])
    server.reply_content("SUMMARY: one")
    if point == "compaction:after-response":
        server.reply_content("SUMMARY: two")  # asked again after the crash: the first was never durable
    server.reply_content("done")
    crashed = cli.run_json(workspace, "make a big output", agent(tmp_path, server), env={"KXEN_AGENT_FAULT": point})
    assert crashed.killed, str(crashed)
    [s] = cli.sessions()
    res = cli.resume(s["id"], expect=0).json()
    assert res["result"] == "done"
    log = cli.log(s["id"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "compaction", "assistant"]
    summaries = [b for b in server.chat_requests() if b["messages"][-1]["content"] == SUMMARY_REQUEST]
    if point == "compaction:after-response":
        assert len(summaries) == 2 and log[3]["content"] == "SUMMARY: two"
    else:
        assert len(summaries) == 1 and log[3]["content"] == "SUMMARY: one"
    assert len(server.chat_requests()) == 3 + len(summaries) - 1
    cli.fsck_clean()


def test_no_budget_no_compaction_then_session_compact_on_demand_and_at_a_message(
        cli: Cli, server: FakeOpenAI, workspace: Path, tmp_path: Path) -> None:
    # Without a budget a view far over any budget is sent whole, never summarized.
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": BIG}))])
    server.reply_content("first answer")
    res = run(cli, workspace, agent(tmp_path, server, context_tokens=None), expect=0)
    log = cli.log(res["session"])
    assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]
    assert len(server.chat_requests()) == 2 and "x" * 6000 in server.chat_requests()[1]["messages"][3]["content"]
    # Through the assistant message that asked for the call: its result would lose its call.
    p = cli("session", "compact", res["session"], "--at", log[1]["id"])
    assert p.rc == 2 and "part them from their calls" in p.err and len(p.err.strip().splitlines()) == 1, str(p)

    server.clear()
    server.reply_content("SUMMARY: the first task")
    server.reply_content("second answer")
    out = cli("session", "compact", res["session"], "--at", log[2]["id"], "--json", expect=0).json()
    assert out["through"] == log[2]["id"] and out["summarized"] == 3
    req = server.chat_requests()[-1]
    assert roles(req) == ["system", "user", "assistant", "tool", "user"] and req["messages"][-1]["content"] == SUMMARY_REQUEST
    nxt = cli.resume(res["session"], "--task", "second task", expect=0).json()
    assert nxt["result"] == "second answer"
    body = server.chat_requests()[-1]
    # The summary, the message after --at (kept whole), the new task.
    assert [(m["role"], m["content"]) for m in body["messages"][1:]] == [
        ("user", SUMMARY_PREFIX + "SUMMARY: the first task"), ("assistant", "first answer"), ("user", "second task")]
    roles_kept = ["user", "assistant", "tool", "assistant", "compaction", "user", "assistant"]
    assert [m["role"] for m in cli.log(res["session"])] == roles_kept
    cli.fsck_clean()
    # Export and import carry the whole history, the compaction message included.
    bundle = tmp_path / "s.bundle"
    cli("session", "export", res["session"], "--output", str(bundle), expect=0)
    cli("bundle", "verify", str(bundle), expect=0)
    other = Cli(tmp_path / "state2")
    other("session", "import", str(bundle), "--workspace", str(workspace), expect=0)
    assert [m["role"] for m in other.log(res["session"])] == roles_kept


def test_session_compact_refuses_the_script_provider(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    script = write_agent(tmp_path / "s", [{"content": "hi"}])
    res = cli.run_json(workspace, "hi", script, expect=0).json()
    p = cli("session", "compact", res["session"])
    assert p.rc == 2 and "script provider" in p.err and "Traceback" not in p.err, str(p)


def test_provider_view_and_estimate_in_process() -> None:
    store = MemoryStore("view")
    sessions = SessionStore(store)
    head = sessions.append_messages(None, [{"role": "user", "content": "task"},
                                           {"role": "assistant", "content": "a1"},
                                           {"role": "user", "content": "more"}])
    first = sessions.history(head)
    head = sessions.append_messages(head, [{"role": "compaction", "content": "S", "through": first[1].oid},
                                           {"role": "assistant", "content": "a2"}])
    view = provider_view(sessions.history(head))
    assert view == [{"role": "user", "content": SUMMARY_PREFIX + "S"}, {"role": "user", "content": "more"},
                    {"role": "assistant", "content": "a2"}]
    assert provider_view(first) == [m.to_provider() for m in first]
    # The run's in-memory view is the same rule, after the system message.
    system = {"role": "system", "content": "sys"}
    assert held_view(RunHistory(sessions), head, [system]) == [system, *view]
    assert held_view(RunHistory(sessions), first[-1].oid) == provider_view(first)
    # A compaction whose 'through' is not an earlier message of its history is refused by both.
    stray = sessions.append_messages(None, [{"role": "user", "content": "other"}])
    bad = sessions.append_messages(first[-1].oid, [{"role": "compaction", "content": "S", "through": stray}])
    with pytest.raises(CorruptObject, match="not an earlier message"):
        provider_view(sessions.history(bad))
    with pytest.raises(CorruptObject, match="not an earlier message"):
        held_view(RunHistory(sessions), bad, [system])
    assert view_tokens("", [{"role": "user", "content": "x" * 400}], []) == (400 + 2) // 4 + 4
    assert view_tokens("", [], [], reported=5000) == 5000


@pytest.mark.parametrize(("policy", "why"), [
    ("context_tokens = 10", "out of range"),
    ("context_tokens = \"big\"", "expected an integer"),
])
def test_bad_context_tokens_are_refused(policy: str, why: str) -> None:
    with pytest.raises(AgentDefinitionError, match=why):
        parse_agent_definition(f'name = "a"\nprovider = "openai"\nmodel = "m"\n[policy]\n{policy}\n', ".", "a.toml")


def test_context_tokens_with_the_script_provider_is_refused(tmp_path: Path) -> None:
    (tmp_path / "steps.json").write_text('[{"content": "hi"}]')
    with pytest.raises(AgentDefinitionError, match="script provider replays its steps"):
        parse_agent_definition('name = "a"\nprovider = "script"\nscript = "steps.json"\n[policy]\n'
                               'context_tokens = 5000\n', str(tmp_path), "a.toml")


class _LongModel:
    """An in-process model: reads a 3 KB file turn after turn, summarizes when asked, answers at the end."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.requests: list[tuple[bool, list[dict], list[dict]]] = []  # (a summary request?, messages, tools)
        self.model, self.base_url = "long", None

    def complete(self, messages, tools, *, cancel=None, on_text=None):
        from kxen_agent.runtime.providers import AssistantTurn, ToolCall, Usage

        summary = messages[-1]["content"] == SUMMARY_REQUEST
        self.requests.append((summary, list(messages), tools))  # lent for the call only
        if summary:
            return AssistantTurn("SUMMARY: reading big.txt again and again", (), "long", "stop", Usage(10, 5))
        done = sum(1 for s, _, _ in self.requests if not s)
        if done > self.turns:
            return AssistantTurn("finished", (), "long", "stop", Usage(10, 1))
        return AssistantTurn(None, (ToolCall(f"c{done}", "read_file", '{"path": "big.txt"}'),), "long",
                             "tool_calls", Usage(10, 1))

    def close(self) -> None:
        pass


def test_a_long_run_keeps_every_request_within_the_budget(tmp_path: Path) -> None:
    """The per-turn workload: 30 turns each adding a 3 KB tool result; every model request stays within
    context_tokens (a summary request exceeds it by at most the turn that crossed it), the history keeps all."""
    from kxen_agent.runtime.runner import Runner

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text("y" * 3000)
    budget = 4000
    lock = parse_agent_definition(f'name = "long"\nprovider = "openai"\nmodel = "long"\ntools = ["read_file"]\n'
                                  f'[policy]\nmax_turns = 100\ncontext_tokens = {budget}\n', str(tmp_path), "a.toml")
    model = _LongModel(30)
    store = MemoryStore("long")
    res = Runner(store, providers=lambda lock, endpoint: model).start(str(ws), "read big.txt 30 times", lock)
    assert res.status == "completed" and res.result == "finished"
    sizes = [(s, view_tokens(m[0]["content"], m[1:], t)) for s, m, t in model.requests]
    normal = [n for s, n in sizes if not s]
    summaries = [n for s, n in sizes if s]
    assert len(normal) == 31 and len(summaries) >= 5, (len(normal), len(summaries))
    assert max(normal) <= budget, sizes
    assert max(summaries) <= budget + 3000 // 4 + 100, sizes
    history = SessionStore(store).history(SessionStore(store).get(res.session).head)
    assert sum(1 for m in history if m.role == "tool") == 30, "every tool result is still in the session"
    assert sum(1 for m in history if m.role == "compaction") == len(summaries)
