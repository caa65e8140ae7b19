"""The run as users live in it, through the installed CLI against a local fake model server.

Which agent ``run`` uses without ``--agent`` (never the demo silently), a
provider SDK missing before anything is written, Retry-After honoured,
answers cut off or empty failing the run, ``--retry``, ``--model`` and
``--base-url`` per run, and usage in ``run show`` / ``session show``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kxen_agent.cli.run_cmds import DEMO_AGENT
from tests.helpers import Cli, write_agent

from .fake_openai import FakeOpenAI, Reply

KEY_ENV = "KXEN_TEST_OPENAI_KEY"
KEY = "sk-run-cli-test-7a6b5c4d3e2f"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


@pytest.fixture
def okey(state_dir: Path) -> Cli:
    return Cli(state_dir, env={KEY_ENV: KEY})


def openai_agent(tmp_path: Path, server: FakeOpenAI, name: str = "agent", **kw) -> Path:
    kw.setdefault("api_key_env", KEY_ENV)
    kw = {k: v for k, v in kw.items() if v is not None}  # None: the key is left out of the definition
    return write_agent(tmp_path / name, None, provider="openai", model="gpt-test", base_url=server.base_url, **kw)


def one_error_line(p) -> str:
    lines = p.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kxen-agent: error: ") and "Traceback" not in p.err, str(p)
    return lines[0]


# ==================================================================== no silent demo


def test_run_without_agent_refuses_and_names_both_defaults_and_the_demo(cli: Cli, state_dir: Path, workspace: Path) -> None:
    p = cli("run", "--workspace", str(workspace), "--task", "fix the bug", expect=2)
    line = one_error_line(p)
    xdg = state_dir.parent / "xdg-config" / "kxen-agent" / "agent.toml"
    assert "KXEN_AGENT_AGENT" in line and str(xdg) in line and "`kxen-agent demo`" in line and "--agent" in line
    assert not state_dir.exists(), "nothing is written"
    assert sorted(f.name for f in workspace.iterdir()) == [".git", "README.md"], "the demo did not run"

    p = cli("run", "--workspace", str(workspace), "--task", "t", env={"KXEN_AGENT_AGENT": str(workspace / "nope.toml")},
            expect=2)
    assert "KXEN_AGENT_AGENT" in one_error_line(p) and "nope.toml" in p.err
    assert not state_dir.exists()


def test_a_configured_default_agent_runs_the_seed_command_verbatim(cli: Cli, state_dir: Path, workspace: Path,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "task.md").write_text("say hi\n")
    configured = write_agent(state_dir.parent / "xdg-config" / "kxen-agent", [{"content": "from the config file"}])
    assert configured == state_dir.parent / "xdg-config" / "kxen-agent" / "agent.toml"
    res = cli("run", "--workspace", str(workspace), "--task-file", str(tmp_path / "task.md"), "--json", expect=0).json()
    assert res["result"] == "from the config file"

    env_agent = write_agent(tmp_path / "env-agent", [{"content": "from KXEN_AGENT_AGENT"}])
    res = cli("run", "--workspace", str(workspace), "--task", "t", "--json",
              env={"KXEN_AGENT_AGENT": str(env_agent)}, expect=0).json()
    assert res["result"] == "from KXEN_AGENT_AGENT", "the variable comes before the config file"

    # The demo agent runs only when named.
    res = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", DEMO_AGENT, "--json", expect=0).json()
    assert res["status"] == "completed" and (workspace / "NOTES.md").exists()


def test_a_missing_provider_sdk_is_reported_before_a_session_exists(cli: Cli, state_dir: Path, workspace: Path,
                                                                    tmp_path: Path, server: FakeOpenAI) -> None:
    # An `openai` that is not there: importing it fails exactly as for an uninstalled package.
    shadow = tmp_path / "no-openai" / "openai"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'openai'\", name='openai')\n")
    env = {"PYTHONPATH": str(shadow.parent), KEY_ENV: KEY}  # the key is there: the SDK is what fails
    agent = openai_agent(tmp_path, server)
    p = cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), env=env, expect=2)
    line = one_error_line(p)
    # This checkout is an editable install: the command installs the extra into it, with this Python.
    assert "the openai provider needs the openai package, which is not installed" in line
    command = line.split("install it with: ", 1)[1].split()
    assert Path(command[0]).parent == Path(sys.executable).parent, "the Python running kxen-agent"
    assert command[1:5] == ["-m", "pip", "install", "-e"] and command[5].strip("'") == f"{ROOT}[openai]", line
    assert not state_dir.exists() and server.requests == []

    ses = cli.run_json(workspace, "t", write_agent(tmp_path / "script", [{"content": "x"}]), expect=0).json()["session"]
    # A session of an openai agent, resumed where the SDK is missing: refused before the lease.
    with FakeOpenAI() as s2:
        s2.reply_content("fine")
        ok = cli.run_json(workspace, "t", openai_agent(tmp_path, s2, name="a2", api_key_env=None), expect=0).json()
        p = cli("--resume", ok["session"], "--task", "again", env=env, expect=2)
        assert "install it with:" in one_error_line(p)
        assert len(cli.session_show(ok["session"])["runs"]) == 1
    assert ses


# ==================================================================== answers that fail, retries


def test_cut_off_and_empty_answers_fail_and_retry_re_attempts_the_task(okey: Cli, server: FakeOpenAI, workspace: Path,
                                                                       tmp_path: Path) -> None:
    agent = openai_agent(tmp_path, server)
    server.reply(Reply(content="The answer is cut o", finish_reason="length"))
    res = okey.run_json(workspace, "explain it", agent, expect=1).json()
    assert (res["status"], res["result"]) == ("failed", None)
    assert "finish_reason 'length'" in res["error"] and f"--resume {res['session']} --retry" in res["error"]
    assert [m["role"] for m in okey.log(res["session"])] == ["user"]

    server.clear()
    server.reply(Reply(content=None, tool_calls=[]))
    p = okey.resume(res["session"], "--retry", expect=1)
    again = p.json()
    assert again["retryOf"] == res["run"] and "no text and no tool call" in again["error"]

    server.clear()
    server.reply_content("The answer is complete.")
    done = okey.resume(res["session"], "--retry", expect=0).json()
    assert (done["status"], done["result"], done["retryOf"]) == ("completed", "The answer is complete.", again["run"])
    log = okey.log(res["session"])
    assert [(m["role"], m["content"]) for m in log] == [("user", "explain it"), ("assistant", "The answer is complete.")]
    assert server.chat_requests()[-1]["messages"][1:] == [{"role": "user", "content": "explain it"}]

    show = okey("run", "show", res["session"], done["run"], expect=0).out
    assert f"retry of: {again['run']}" in show
    assert okey.run_show(res["session"], done["run"])["retryOf"] == again["run"]
    assert [r["index"] for r in okey.session_show(res["session"])["runs"]] == [0, 1, 2]

    # Nothing left to retry: exit 2 and what to do instead.
    p = okey("--resume", res["session"], "--retry", expect=2)
    assert f"kxen-agent --resume {res['session']} --task TEXT" in one_error_line(p)
    p = okey("--resume", res["session"], "--retry", "--task", "x", expect=2)
    assert "--retry" in one_error_line(p)
    okey.fsck_clean()


def test_429_with_retry_after_is_waited_out_as_the_server_asks(okey: Cli, server: FakeOpenAI, workspace: Path,
                                                               tmp_path: Path) -> None:
    server.reply_error(429, "rate limited", headers={"Retry-After": "1"})
    server.reply_error(429, "rate limited", headers={"retry-after-ms": "300", "Retry-After": "30"})
    server.reply_content("after waiting")
    p = okey("run", "--workspace", str(workspace), "--task", "t", "--agent", str(openai_agent(tmp_path, server)),
             expect=0)
    assert "result: after waiting" in p.out
    times = [r.at for r in server.requests]
    assert len(times) == 3, "the SDK does not retry on its own: three requests, all the runner's"
    assert times[1] - times[0] >= 1.0, "Retry-After: 1 is honoured"
    assert 0.3 <= times[2] - times[1] < 20, "retry-after-ms is preferred to Retry-After"
    assert "provider error (transient; attempt 1 of at most 5, retrying in 1.0s): model provider at" in p.err, p.err
    assert "attempt 2 of at most 5, retrying in 0.3s" in p.err, p.err


def test_a_server_that_keeps_failing_is_given_five_attempts_and_the_error_says_so(okey: Cli, server: FakeOpenAI,
                                                                                  workspace: Path, tmp_path: Path) -> None:
    server.reply_error(503, "overloaded", headers={"Retry-After": "0"})
    res = okey.run_json(workspace, "t", openai_agent(tmp_path, server), expect=1).json()
    assert len(server.chat_requests()) == 5
    assert "HTTP 503" in res["error"] and "gave up after 5 attempts" in res["error"], res["error"]


# ==================================================================== model and endpoint per run


def test_model_and_base_url_per_run_recorded_and_shown(okey: Cli, server: FakeOpenAI, workspace: Path,
                                                       tmp_path: Path) -> None:
    agent = openai_agent(tmp_path, server)
    with FakeOpenAI() as other:
        other.reply_content("from the other endpoint")
        res = okey("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), "--model", "gpt-other",
                   "--base-url", other.base_url, "--json", expect=0).json()
        assert (res["requestedModel"], res["baseUrl"], res["result"]) == ("gpt-other", other.base_url,
                                                                         "from the other endpoint")
        [req] = other.requests
        assert req.body["model"] == "gpt-other"
        assert req.headers["authorization"] == f"Bearer {KEY}", "the key from the variable the agent names"
    assert server.requests == [], "the lock's endpoint was not called"
    show = okey.run_show(res["session"], res["run"])
    assert (show["requestedModel"], show["baseUrl"], show["model"]) == ("gpt-other", other.base_url, "fake-model")
    text = okey("run", "show", res["session"], res["run"], expect=0).out
    assert f"model: gpt-other (answered as fake-model)   endpoint: {other.base_url}" in text
    ses = okey.session_show(res["session"])
    assert (ses["agent"]["model"]) == "gpt-test", "the lock is unchanged"

    # The next run uses the lock's model and endpoint again.
    server.reply_content("back home")
    nxt = okey.resume(res["session"], "--task", "next", expect=0).json()
    assert (nxt["requestedModel"], nxt["baseUrl"]) == ("gpt-test", server.base_url)
    assert server.chat_requests()[-1]["model"] == "gpt-test"

    p = okey("--resume", res["session"], "--task", "x", "--base-url", "ftp://nope", expect=2)
    assert "--base-url" in one_error_line(p)
    script = write_agent(tmp_path / "script", [{"content": "x"}])
    p = okey("run", "--workspace", str(workspace), "--task", "t", "--agent", str(script), "--base-url",
             server.base_url, expect=2)
    assert "applies to the openai and anthropic providers" in one_error_line(p)


def test_an_overridden_endpoint_never_gets_a_default_key(cli: Cli, server: FakeOpenAI, workspace: Path,
                                                         tmp_path: Path) -> None:
    agent = openai_agent(tmp_path, server, api_key_env=None)
    with FakeOpenAI() as other:
        cli("run", "--workspace", str(workspace), "--task", "t", "--agent", str(agent), "--base-url", other.base_url,
            env={"OPENAI_API_KEY": "sk-ambient-key-0000", "OPENAI_BASE_URL": server.base_url}, expect=0)
        assert [r.headers["authorization"] for r in other.requests] == ["Bearer not-needed"]
    assert server.requests == [], "OPENAI_BASE_URL redirects nothing"


# ==================================================================== usage


def test_usage_per_turn_in_run_show_and_summed_in_session_show(okey: Cli, server: FakeOpenAI, workspace: Path,
                                                               tmp_path: Path) -> None:
    server.reply_tool_calls([("call_1", "read_file", json.dumps({"path": "README.md"}))],
                            usage={"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                                   "prompt_tokens_details": {"cached_tokens": 60}})
    server.reply_content("read it", usage={"prompt_tokens": 150, "completion_tokens": 30, "total_tokens": 180})
    res = okey.run_json(workspace, "read the readme", openai_agent(tmp_path, server), expect=0).json()
    assert res["usage"] == {"inputTokens": 250, "outputTokens": 50, "cachedTokens": 60, "turns": 2}
    show = okey.run_show(res["session"], res["run"])
    assert show["usage"] == res["usage"]
    assert show["turnUsage"] == [{"turn": 1, "inputTokens": 100, "outputTokens": 20, "cachedTokens": 60},
                                 {"turn": 2, "inputTokens": 150, "outputTokens": 30}]
    text = okey("run", "show", res["session"], res["run"], expect=0).out
    assert "usage: 250 input tokens (60 cached), 50 output tokens over 2 turns" in text
    assert "  turn 1: 100 input tokens (60 cached), 20 output tokens" in text

    server.clear()
    server.reply_content("again", usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
    okey.resume(res["session"], "--task", "more", expect=0)
    ses = okey.session_show(res["session"])
    assert ses["usage"] == {"inputTokens": 257, "outputTokens": 53, "cachedTokens": 60, "turns": 3}
    assert [r["usage"]["inputTokens"] for r in ses["runs"]] == [250, 7]
    assert "usage:        257 input tokens (60 cached), 53 output tokens over 3 turns" in okey(
        "session", "show", res["session"], expect=0).out
    okey.fsck_clean()


def test_the_demo_agent_is_what_kxen_agent_demo_runs(tmp_path: Path) -> None:
    assert os.path.exists(DEMO_AGENT) and DEMO_AGENT.endswith(os.path.join("demo-agent", "agent.toml"))
