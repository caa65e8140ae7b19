"""``[model] max_tokens`` and ``temperature`` (agent lock version 6, §14.2): locked only when set, sent to
the server, and the Anthropic stop reason named as the server said it, with the setting that raises it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
from kxen_agent.store.objects import encode_object
from tests.helpers import Cli

from .fake_anthropic import FakeAnthropic, Reply
from .fake_openai import FakeOpenAI

KEY_ENV = "KXEN_TEST_MODEL_KEY"


def _lock(text: str) -> dict:
    return parse_agent_definition(text, ".", "agent.toml")


def test_model_settings_are_locked_only_when_set() -> None:
    plain = _lock('name = "a"\nprovider = "anthropic"\nmodel = "claude-x"\n')
    table = _lock('name = "a"\nprovider = "anthropic"\n[model]\nname = "claude-x"\n')
    assert encode_object("agent", table).id == encode_object("agent", plain).id and plain["version"] == 3
    set_ = _lock('name = "a"\nprovider = "anthropic"\n[model]\nname = "claude-x"\nmax_tokens = 16000\n'
                 'temperature = 0.25\n')
    assert (set_["version"], set_["model"], set_["max_tokens"], set_["temperature"]) == (6, "claude-x", 16000, "0.25")
    for bad, why in [("max_tokens = 0", "out of range"), ("temperature = 2.5", "from 0 to 2"),
                     ("temperature = 0.12345", "three decimals"), ("top_p = 1", "unknown key")]:
        with pytest.raises(AgentDefinitionError, match=why):
            _lock(f'name = "a"\nprovider = "openai"\n[model]\nname = "m"\n{bad}\n')
    with pytest.raises(AgentDefinitionError, match="script provider"):
        _lock('name = "a"\nprovider = "script"\nscript = "s.json"\n[model]\nmax_tokens = 5\n')


def _agent(tmp_path: Path, provider: str, url: str, extra: str = "") -> Path:
    path = tmp_path / f"{provider}.toml"
    path.write_text(f'name = "a"\nprovider = "{provider}"\nbase_url = "{url}"\napi_key_env = "{KEY_ENV}"\n'
                    f'[model]\nname = "m-test"\n{extra}')
    return path


def test_settings_reach_the_server_and_a_cut_answer_names_them(state_dir: Path, workspace: Path,
                                                              tmp_path: Path) -> None:
    cli = Cli(state_dir, env={KEY_ENV: "sk-test-123456"})
    with FakeAnthropic() as server:
        server.reply(Reply(content="half an ans", stop_reason="max_tokens"))
        agent = _agent(tmp_path, "anthropic", server.base_url, "max_tokens = 300\ntemperature = 0.5\n")
        res = cli.run_json(workspace, "write a novel", agent, expect=1).json()
        [req] = server.message_requests()
        assert (req["max_tokens"], req["temperature"]) == (300, 0.5)
        assert "stop_reason 'max_tokens'" in res["error"] and "finish_reason" not in res["error"], res["error"]
        assert "raise max_tokens in the agent definition's [model] table (now 300 tokens)" in res["error"]
    with FakeOpenAI() as server:
        server.reply_content("fine")
        cli.run_json(workspace, "hi", _agent(tmp_path, "openai", server.base_url, "temperature = 0\n"), expect=0)
        [req] = server.chat_requests()
        assert req["temperature"] == 0 and "max_tokens" not in req


def test_the_spec_lock_v6_vector_is_what_the_definition_makes_and_passes_the_schema() -> None:
    import ast
    import re

    from kxen_agent.session.schema import check

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text(encoding="utf-8")
    block = re.search(r"^vector: agent-lock-v6\nkind: agent\nvalue: (.*)$", spec, re.M)
    assert block, "objects_spec.md §14.9 has the agent-lock-v6 vector"
    value = ast.literal_eval(block.group(1))
    check("agent", value)
    made = _lock('name = "ci"\nprovider = "anthropic"\n[model]\nname = "claude-x"\nmax_tokens = 16000\n'
                 'temperature = 0.2\n[policy]\napprove = ["shell"]\nno_terminal = "refuse"\n')
    assert made == value
    from kxen_agent.store.objects import SchemaViolation

    for bad in ({"temperature": 0.2}, {"temperature": "3"}, {"max_tokens": 0}):
        with pytest.raises(SchemaViolation):
            check("agent", {**value, **bad})
    with pytest.raises(SchemaViolation, match="no_terminal"):
        check("agent", {**value, "policy": {**value["policy"], "no_terminal": "ask"}})
