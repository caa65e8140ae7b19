"""Agent definition TOML files parsed into lock bodies, with real files in tmp dirs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.session.agent_def import (
    DEFAULT_SYSTEM,
    KNOWN_TOOLS,
    PROVIDERS,
    AgentDefinitionError,
    default_agent_definition,
    load_agent_definition,
    parse_agent_definition,
    validate_script_steps,
)

STEPS = [
    {"tool_calls": [{"name": "shell", "arguments": {"command": "ls", "timeout": 1.5}}]},
    {"content": "done ✓"},
]
BASIC = 'name = "demo"\nprovider = "script"\nscript = "steps.json"\n'


def write(tmp_path: Path, toml: str, steps: Any = STEPS, *, raw_steps: str | None = None) -> str:
    if raw_steps is not None:
        (tmp_path / "steps.json").write_text(raw_steps, encoding="utf-8")
    elif steps is not None:
        (tmp_path / "steps.json").write_text(json.dumps(steps), encoding="utf-8")
    path = tmp_path / "agent.toml"
    path.write_text(toml, encoding="utf-8")
    return str(path)


def load_error(path: str) -> AgentDefinitionError:
    with pytest.raises(AgentDefinitionError) as err:
        load_agent_definition(path)
    assert err.value.exit_code == 2 and isinstance(err.value, UsageError)
    assert "\n" not in str(err.value)
    return err.value


def only_plain_values(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and only_plain_values(v) for k, v in value.items())
    if isinstance(value, list):
        return all(only_plain_values(v) for v in value)
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


# -- happy paths ------------------------------------------------------------------------------


def test_constants() -> None:
    assert KNOWN_TOOLS == ("shell", "read_file", "write_file", "edit_file", "list_files", "search")
    assert PROVIDERS == ("script", "openai", "anthropic")


def test_script_definition_with_defaults(tmp_path: Path) -> None:
    body = load_agent_definition(write(tmp_path, BASIC))
    assert body == {
        "version": 3,
        "name": "demo",
        "provider": "script",
        "model": "script",
        "base_url": None,
        "api_key_env": None,
        "system": DEFAULT_SYSTEM,
        "tools": list(KNOWN_TOOLS[:5]),  # "search" only when named (a version-6 lock)
        "policy": {"max_turns": 20, "tool_timeout_ms": 120_000, "cancel_window_ms": 5_000, "env_keep": [], "approve": [], "context_tokens": None},
        "script": json.dumps(STEPS, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
    }
    assert only_plain_values(body)
    assert json.loads(body["script"]) == STEPS
    assert "✓" in body["script"]  # ensure_ascii=False: the text, not an escape


def test_full_definition(tmp_path: Path) -> None:
    toml = BASIC + (
        'model = "replay-1"\n'
        'system = "Be brief."\n'
        'tools = ["read_file", "shell"]\n'
        "[policy]\nmax_turns = 3\ntool_timeout_s = 0.5\ncancel_window_s = 0\n"
    )
    body = load_agent_definition(write(tmp_path, toml))
    assert body["model"] == "replay-1" and body["system"] == "Be brief."
    assert body["tools"] == ["read_file", "shell"]  # order kept
    assert body["policy"] == {"max_turns": 3, "tool_timeout_ms": 500, "cancel_window_ms": 0, "env_keep": [], "approve": [], "context_tokens": None}
    assert only_plain_values(body)


@pytest.mark.parametrize(("seconds", "ms"), [("0.1", 100), ("2.25", 2250), ("7", 7000), ("0.001", 1), ("86400", 86_400_000)])
def test_float_seconds_become_exact_milliseconds(tmp_path: Path, seconds: str, ms: int) -> None:
    body = load_agent_definition(write(tmp_path, BASIC + f"[policy]\ntool_timeout_s = {seconds}\n"))
    assert body["policy"]["tool_timeout_ms"] == ms and type(body["policy"]["tool_timeout_ms"]) is int


def test_openai_definition(tmp_path: Path) -> None:
    toml = (
        'name = "gpt"\nprovider = "openai"\nmodel = "gpt-4.1-mini"\n'
        'base_url = "http://127.0.0.1:8000/v1"\napi_key_env = "OPENAI_API_KEY"\n'
    )
    body = load_agent_definition(write(tmp_path, toml, steps=None))
    assert body["provider"] == "openai" and body["model"] == "gpt-4.1-mini"
    assert body["base_url"] == "http://127.0.0.1:8000/v1"
    assert body["api_key_env"] == "OPENAI_API_KEY"
    assert body["script"] is None
    assert only_plain_values(body)


def test_api_key_value_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KXEN_SECRET_KEY", "sk-live-value")
    toml = 'name = "g"\nprovider = "openai"\nmodel = "m"\napi_key_env = "KXEN_SECRET_KEY"\n'
    body = load_agent_definition(write(tmp_path, toml, steps=None))
    assert "sk-live-value" not in json.dumps(body)


def test_loaded_body_does_not_change_when_steps_file_changes(tmp_path: Path) -> None:
    path = write(tmp_path, BASIC)
    body = load_agent_definition(path)
    snapshot = json.dumps(body, sort_keys=True)
    (tmp_path / "steps.json").write_text(json.dumps([{"content": "edited"}]))
    assert json.dumps(body, sort_keys=True) == snapshot
    assert json.loads(body["script"]) == STEPS
    assert json.loads(load_agent_definition(path)["script"]) == [{"content": "edited"}]


def test_script_path_is_relative_to_the_definition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "agents").mkdir()
    path = write(tmp_path / "agents", BASIC)
    monkeypatch.chdir(tmp_path)
    assert load_agent_definition(os.path.relpath(path))["name"] == "demo"


def test_same_steps_same_script_text(tmp_path: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pretty = json.dumps(STEPS, indent=4)
    reordered = '[{"tool_calls":[{"arguments":{"timeout":1.5,"command":"ls"},"name":"shell"}]},{"content":"done ✓"}]'
    first = load_agent_definition(write(a, BASIC, raw_steps=pretty))
    second = load_agent_definition(write(b, BASIC, raw_steps=reordered))
    assert first["script"] == second["script"]


def test_parse_agent_definition_uses_base_dir_and_source(tmp_path: Path) -> None:
    (tmp_path / "steps.json").write_text(json.dumps(STEPS))
    body = parse_agent_definition(BASIC, str(tmp_path), "inline")
    assert body["name"] == "demo"
    with pytest.raises(AgentDefinitionError, match=r"^inline: key 'provider'"):
        parse_agent_definition('name = "x"\nprovider = "nope"\n', str(tmp_path), "inline")


def test_default_agent_definition() -> None:
    body = default_agent_definition([{"content": "hello"}])
    assert body["provider"] == "script" and body["model"] == "script"
    assert body["tools"] == list(KNOWN_TOOLS[:5]) and body["system"] == DEFAULT_SYSTEM
    assert body["policy"] == {"max_turns": 20, "tool_timeout_ms": 120_000, "cancel_window_ms": 5_000, "env_keep": [], "approve": [], "context_tokens": None}
    assert body["script"] == '[{"content":"hello"}]'
    assert only_plain_values(body)
    with pytest.raises(AgentDefinitionError, match="non-empty"):
        default_agent_definition([])
    with pytest.raises(AgentDefinitionError, match="not JSON-serializable"):
        default_agent_definition([{"content": "x", "tool_calls": [{"name": "shell", "arguments": {"x": float("nan")}}]}])


def test_validate_script_steps_names_source() -> None:
    validate_script_steps([{"content": "x"}], KNOWN_TOOLS, source="lock")
    with pytest.raises(AgentDefinitionError, match=r"^lock: key 'script': steps\[0\]\.tool_calls\[0\]\.name"):
        validate_script_steps([{"tool_calls": [{"name": "shell", "arguments": {}}]}], [], source="lock")


# -- errors -----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    err = load_error(path)
    assert str(err).startswith(path + ": ") and "not found" in str(err)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert "is a directory" in str(load_error(str(tmp_path)))


def test_toml_syntax_error_has_line(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, BASIC + 'system = "unterminated\n'))
    assert "invalid TOML" in str(err) and "line 4" in str(err)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b'name = "\xff"\n')
    assert "not UTF-8" in str(load_error(str(path)))


# Each case: TOML text, expected key in the message (None for file-level), a phrase.
ERROR_CASES = [
    (BASIC + 'colour = "blue"\n', "colour", "unknown key (expected one of: name, provider"),
    ('name = "d"\nprovider = "foo"\n', "provider", "unknown provider 'foo' (expected one of: script, openai, anthropic)"),
    ('provider = "script"\nscript = "steps.json"\n', "name", "missing"),
    ('name = "d"\nscript = "steps.json"\n', "provider", "missing"),
    (BASIC + 'tools = ["shell", "browser"]\n', "tools", "unknown tool 'browser'"),
    (BASIC + 'tools = ["shell", "shell"]\n', "tools", "listed twice"),
    (BASIC + 'tools = "shell"\n', "tools", "expected an array"),
    (BASIC + "name2 = 1\n", "name2", "unknown key"),
    ('name = 7\nprovider = "script"\nscript = "steps.json"\n', "name", "expected a string, got integer"),
    ('name = ""\nprovider = "script"\nscript = "steps.json"\n', "name", "must not be empty"),
    (BASIC + '[policy]\nmax_turns = "x"\n', "policy.max_turns", "expected an integer, got string"),
    (BASIC + "[policy]\nmax_turns = -1\n", "policy.max_turns", "out of range"),
    (BASIC + "[policy]\nmax_turns = 0\n", "policy.max_turns", "out of range"),
    (BASIC + "[policy]\nmax_turns = true\n", "policy.max_turns", "got boolean"),
    (BASIC + "[policy]\nmax_turns = 2.0\n", "policy.max_turns", "got float"),
    (BASIC + "[policy]\ntool_timeout_s = -5\n", "policy.tool_timeout_s", "out of range"),
    (BASIC + "[policy]\ntool_timeout_s = 0\n", "policy.tool_timeout_s", "greater than 0"),
    (BASIC + "[policy]\ntool_timeout_s = inf\n", "policy.tool_timeout_s", "finite"),
    (BASIC + "[policy]\ntool_timeout_s = nan\n", "policy.tool_timeout_s", "finite"),
    (BASIC + "[policy]\ntool_timeout_s = 0.0005\n", "policy.tool_timeout_s", "finer than a millisecond"),
    (BASIC + '[policy]\ncancel_window_s = "5"\n', "policy.cancel_window_s", "got string"),
    (BASIC + "[policy]\ncancel_window_s = -0.5\n", "policy.cancel_window_s", "out of range"),
    (BASIC + "[policy]\nretries = 3\n", "policy.retries", "unknown key"),
    (BASIC + "policy = 3\n", "policy", "expected a table"),
    ('name = "d"\nprovider = "openai"\n', "model", "required for provider 'openai'"),
    ('name = "d"\nprovider = "openai"\nmodel = "m"\nscript = "steps.json"\n', "script", "only valid with provider"),
    ('name = "d"\nprovider = "openai"\nmodel = "m"\napi_key_env = "sk-abc123"\n', "api_key_env", "variable NAME"),
    ('name = "d"\nprovider = "openai"\nmodel = "m"\nbase_url = "ftp://x"\n', "base_url", "http:// or https://"),
    ('name = "d"\nprovider = "openai"\nmodel = "m"\nbase_url = "https://u:sk-zz@h/v1"\n', "base_url", "credentials"),
    ('name = "d"\nprovider = "script"\n', "script", "missing"),
]


@pytest.mark.parametrize(("toml", "key", "phrase"), ERROR_CASES)
def test_definition_errors(tmp_path: Path, toml: str, key: str, phrase: str) -> None:
    path = write(tmp_path, toml)
    err = load_error(path)
    assert str(err).startswith(f"{path}: key '{key}': "), str(err)
    assert phrase in str(err)
    assert err.key == key and err.source == path


@pytest.mark.parametrize("key", ["api_key", "openai_api_key", "apikey", "token", "API_KEY", "client_secret"])
def test_inline_secret_refused_without_echoing_it(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, BASIC + f'{key} = "sk-live-9f8e7d"\n')
    err = load_error(path)
    assert f"key '{key}'" in str(err) and "api_key_env" in str(err)
    assert "sk-live-9f8e7d" not in str(err)


def test_missing_script_file(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, BASIC, steps=None))
    assert "key 'script'" in str(err) and "steps.json" in str(err) and "not found" in str(err)


@pytest.mark.parametrize(
    ("raw", "phrase"),
    [
        ("[{\"content\": \"x\"},\n oops]", "not valid JSON: Expecting value (at line 2, column 2)"),
        ('[{"content": "x", "content": "y"}]', "duplicate key 'content'"),
        ('[{"tool_calls": [{"name": "shell", "arguments": {"n": NaN}}]}]', "NaN is not JSON"),
        ('[{"tool_calls": [{"name": "shell", "arguments": {"n": 1e400}}]}]', "out of range"),
    ],
)
def test_script_not_valid_json(tmp_path: Path, raw: str, phrase: str) -> None:
    err = load_error(write(tmp_path, BASIC, raw_steps=raw))
    assert "key 'script'" in str(err) and phrase in str(err)


def test_script_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, BASIC, steps=None)
    (tmp_path / "steps.json").write_bytes(b'[{"content": "\xff"}]')
    assert "is not UTF-8" in str(load_error(path))


@pytest.mark.parametrize(
    ("steps", "phrase"),
    [
        ([], "non-empty JSON array, got an empty array"),
        ({"content": "x"}, "non-empty JSON array, got object"),
        (["hello"], "steps[0] must be an object, got string"),
        ([{}], 'steps[0] needs "tool_calls" or "content"'),
        ([{"content": 3}], "steps[0].content must be a string, got number"),
        ([{"content": "x"}, {"tool_calls": []}], "steps[1].tool_calls must be a non-empty array"),
        ([{"tool_calls": ["shell"]}], "steps[0].tool_calls[0] must be an object, got string"),
        ([{"tool_calls": [{"arguments": {}}]}], "steps[0].tool_calls[0].name must be a string"),
        ([{"tool_calls": [{"name": "shell", "arguments": "ls"}]}], "steps[0].tool_calls[0].arguments must be an object"),
        ([{"tool_calls": [{"name": "shell"}]}], "steps[0].tool_calls[0].arguments must be an object"),
        ([{"tool_calls": [{"name": "shell", "arguments": {}, "id": 5}]}], "steps[0].tool_calls[0].id must be a string"),
        ([{"tool_calls": [{"name": "shell", "arguments": {}, "args": {}}]}], "unknown key 'args'"),
        ([{"content": "x", "tool_call": []}], "steps[0]: unknown key 'tool_call'"),
        ([{"tool_calls": [{"name": "browser", "arguments": {}}]}], "tool 'browser' is not in the definition's tools"),
    ],
)
def test_bad_step_shape(tmp_path: Path, steps: Any, phrase: str) -> None:
    err = load_error(write(tmp_path, BASIC, steps=steps))
    assert "key 'script'" in str(err) and phrase in str(err), str(err)


def test_step_tool_must_be_in_definition_tools(tmp_path: Path) -> None:
    toml = BASIC + 'tools = ["read_file"]\n'
    err = load_error(write(tmp_path, toml))  # STEPS call "shell"
    assert "tool 'shell' is not in the definition's tools (read_file)" in str(err)
    ok = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "x"}, "id": "c1"}], "content": "reading"}]
    assert json.loads(load_agent_definition(write(tmp_path, toml, steps=ok))["script"]) == ok


def test_loading_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, BASIC)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()}
    load_agent_definition(path)
    with pytest.raises(AgentDefinitionError):
        load_agent_definition(write(tmp_path, BASIC + "bad = 1\n", steps=None))
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert sorted(after) == sorted(before)
    assert after["steps.json"] == before["steps.json"][0]


def test_env_keep(tmp_path: Path) -> None:
    """[policy] env_keep (§14.2): variable names or * patterns, each once; never the provider key's variable."""
    body = load_agent_definition(write(tmp_path, BASIC + '[policy]\nenv_keep = ["GITHUB_TOKEN", "AWS_*"]\n'))
    assert body["version"] == 3 and body["policy"]["env_keep"] == ["GITHUB_TOKEN", "AWS_*"]
    for value, why in (('"GITHUB_TOKEN"', "expected an array"), ('["A B"]', "is not a variable name"),
                       ('["X", "X"]', "listed twice"), ("[1]", "expected variable names")):
        with pytest.raises(AgentDefinitionError, match=rf"key 'policy.env_keep': .*{why}"):
            load_agent_definition(write(tmp_path, BASIC + f"[policy]\nenv_keep = {value}\n"))
    with pytest.raises(AgentDefinitionError, match="keeps OPENAI_API_KEY, the provider key's variable"):
        load_agent_definition(write(tmp_path, BASIC + 'api_key_env = "OPENAI_API_KEY"\n[policy]\nenv_keep = ["OPENAI_*"]\n'))


def test_env_keep_of_a_version_1_lock_is_none() -> None:
    from kxen_agent.session.agent_def import env_keep_of

    lock = default_agent_definition([{"content": "hi"}])
    assert env_keep_of(lock) == ()
    old = {k: v for k, v in lock.items() if k != "version"}
    assert env_keep_of(old) is None
