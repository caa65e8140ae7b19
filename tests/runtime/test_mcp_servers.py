"""Real MCP servers from PyPI through kxen-agent (§14.15): ``mcp-server-git`` confined with ``--repository``
(its read tool declared read_only, its write tools approved or refused) and ``mcp-server-time``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tests.helpers import Cli, git, git_workspace


def call(tool: str, **arguments: object) -> dict:
    return {"content": tool, "tool_calls": [{"name": tool, "arguments": arguments}]}


def test_git_and_time_servers_with_approvals_and_their_hints_shown(tmp_path: Path) -> None:
    ws = git_workspace(tmp_path / "ws")
    git(ws, "config", "user.name", "kxen test")
    git(ws, "config", "user.email", "test@kxen.invalid")
    (ws / "a.txt").write_text("a\n")
    steps = [call("mcp__git__git_status", repo_path=str(ws)),
             call("mcp__git__git_add", repo_path=str(ws), files=["a.txt"]),
             call("mcp__git__git_commit", repo_path=str(ws), message="from the refused call"),
             call("mcp__time__get_current_time", timezone="UTC"),
             {"content": "done"},
             call("mcp__git__git_commit", repo_path=str(ws), message="from the approved call"),
             {"content": "done"}]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    agent = tmp_path / "agent.toml"
    agent.write_text(textwrap.dedent(f"""\
        name = "real-servers"
        provider = "script"
        script = "steps.json"
        tools = []
        [policy]
        approve = ["mcp__git__git_commit"]
        [mcp.servers.git]
        command = {json.dumps(sys.executable)}
        args = ["-m", "mcp_server_git", "--repository", {json.dumps(str(ws))}]
        tools = ["git_status", "git_add", "git_commit"]
        read_only = ["git_status"]
        [mcp.servers.time]
        command = {json.dumps(sys.executable)}
        args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
        tools = ["get_current_time"]
        read_only = ["get_current_time"]
        """))
    cli = Cli(tmp_path / "state", strict=True)
    # Standard input is not a terminal: the approved-only write is refused, the others run.
    res = cli("run", "--workspace", str(ws), "--task", "commit a.txt", "--agent", str(agent), "--json",
              expect=0).json()
    ses = res["session"]
    ops = cli("run", "show", ses, "--json", expect=0).json()["journal"]
    by_tool = {o["tool"]: o for o in ops}
    assert "a.txt" in by_tool["mcp__git__git_status"]["outcome"]["output"]
    assert by_tool["mcp__git__git_status"]["sideEffects"] is False
    assert by_tool["mcp__git__git_add"]["state"] == "Settled" and by_tool["mcp__git__git_add"]["sideEffects"]
    assert by_tool["mcp__git__git_commit"]["approval"]["answer"] == "no"
    assert '"timezone": "UTC"' in by_tool["mcp__time__get_current_time"]["outcome"]["output"]
    assert git(ws, "log", "--format=%s") == "initial\n"
    assert git(ws, "diff", "--cached", "--name-only") == "a.txt\n"  # git_add took effect

    res = cli("--resume", ses, "--task", "commit it", "--yes", "--json", expect=0).json()
    assert res["status"] == "completed"
    assert git(ws, "log", "--format=%s") == "from the approved call\ninitial\n"

    # The lock recorded each server's launch spec and tool listing; session trust shows them with the hints.
    doc = cli("session", "trust", ses, "--json", expect=0).json()["lock"]["mcp"]
    assert doc["servers"]["git"]["args"][-2:] == ["--repository", str(ws)]
    assert doc["servers"]["git"]["listingHash"].startswith("sha256:")
    hints = {t["tool"]: t for t in doc["tools"]}
    assert hints["mcp__git__git_status"]["readOnlyHint"] and hints["mcp__git__git_status"]["onRecovery"] == "run again"
    # mcp-server-git says git_commit is not destructive; the definition did not declare it read_only: UNKNOWN.
    assert hints["mcp__git__git_commit"]["destructiveHint"] is False
    assert hints["mcp__git__git_commit"]["onRecovery"] == "UNKNOWN"


def test_the_model_sees_the_servers_tools_under_legal_names(tmp_path: Path) -> None:
    """An openai-provider agent: the request carries mcp__time__get_current_time with the server's own schema,
    and the next request carries the call's result."""
    from .fake_openai import FakeOpenAI

    ws = git_workspace(tmp_path / "ws")
    agent = tmp_path / "agent.toml"
    with FakeOpenAI() as server:
        agent.write_text(textwrap.dedent(f"""\
            name = "real-time"
            provider = "openai"
            model = "gpt-test"
            base_url = "{server.base_url}"
            api_key_env = "KXEN_TEST_OPENAI_KEY"
            tools = ["read_file"]
            [mcp.servers.time]
            command = {json.dumps(sys.executable)}
            args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
            tools = ["get_current_time"]
            read_only = ["get_current_time"]
            """))
        server.reply_tool_calls([("call_t1", "mcp__time__get_current_time", json.dumps({"timezone": "UTC"}))])
        server.reply_content("it is now")
        cli = Cli(tmp_path / "state", {"KXEN_TEST_OPENAI_KEY": "sk-test-0123456789abcdef"}, strict=True)
        res = cli("run", "--workspace", str(ws), "--task", "what time is it", "--agent", str(agent), "--json",
                  expect=0).json()
        first, second = server.chat_requests()
    assert res["status"] == "completed"
    specs = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert set(specs) == {"read_file", "mcp__time__get_current_time"}
    assert "timezone" in specs["mcp__time__get_current_time"]["parameters"]["properties"]
    assert '"timezone": "UTC"' in second["messages"][-1]["content"]
