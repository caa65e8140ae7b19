"""MCP calls through the journal (§14.15), against an MCP server written here with the SDK's own MCPServer
(FastMCP): it can crash mid-call, hang, write garbage, change its tool list and report its environment.

Real processes throughout: the installed CLI, the server as a stdio subprocess, kill -9 and SIGINT."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import Cli, git_workspace, wait_for_file

SERVER = textwrap.dedent('''
    import json, os, subprocess, sys
    import anyio
    from mcp.server.mcpserver import Context, MCPServer
    from mcp_types import ToolAnnotations

    D = sys.argv[1]
    open(os.path.join(D, f"server.{os.getpid()}"), "w").close()  # each start of the server, counted
    variant = open(os.path.join(D, "variant")).read().strip() if os.path.exists(os.path.join(D, "variant")) else "1"
    app = MCPServer("fx")
    WIRE = os.dup(1)

    def mark(name, text=""):
        with open(os.path.join(D, name), "a") as f:
            f.write(text or str(os.getpid()))

    if variant == "1":
        @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
        def echo(text: str) -> str:
            """Say it back."""
            return "echo: " + text
    else:
        @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
        def echo(text: str, loud: bool = False) -> str:
            """Say it back."""
            return "echo: " + text

    @app.tool()
    def env_names() -> str:
        return " ".join(sorted(os.environ))

    @app.tool()
    def env_value(name: str) -> str:
        return "value: " + os.environ.get(name, "-")

    @app.tool()
    def crash_read() -> str:
        os._exit(3)

    @app.tool()
    def crash_write() -> str:
        mark("crash_write.started")
        os._exit(4)

    @app.tool()
    def noisy(ctx: Context) -> str:
        # A helper outside the server's process group holds the wire and, once the server is gone, writes a
        # well-formed answer to this very request: nothing after the bad line may be read.
        r, w = os.pipe()
        forged = json.dumps({"jsonrpc": "2.0", "id": ctx.request_id,
                             "result": {"content": [{"type": "text", "text": "forged"}],
                                        "structuredContent": {"result": "forged"}}})
        subprocess.Popen([sys.executable, "-c", "import os, sys; os.read(int(sys.argv[1]), 1); "
                          "os.write(int(sys.argv[2]), sys.argv[3].encode() + bytes([10]))",
                          str(r), str(WIRE), forged], pass_fds=(r, WIRE), start_new_session=True)
        os.close(r)
        os.write(WIRE, b"this is not JSON-RPC\\n")  # the SDK diverts fd 1 from the wire: write to the pipe itself
        return "noise"

    async def hold(name: str) -> str:
        if os.path.exists(os.path.join(D, name + ".started")):
            return "again: " + name  # the call run again after a crash returns at once
        child = subprocess.Popen(["sleep", "300"])  # a member of the server's process group
        mark(name + ".child", str(child.pid))
        mark(name + ".started")
        try:
            await anyio.sleep(3600)
        except anyio.get_cancelled_exc_class():
            mark(name + ".cancelled")
            child.kill()
            raise
        return "held"

    @app.tool()
    async def peek(name: str) -> str:
        return await hold(name)

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))  # a claim: the definition decides, not this
    async def poke(name: str) -> str:
        return await hold(name)

    @app.tool()
    def big() -> str:
        return "head " + "x" * 200_000 + " tail"

    if sys.argv[2:3] == ["http"]:
        app.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        app.run()
''')

TOOLS = ["echo", "env_names", "env_value", "crash_read", "crash_write", "noisy", "peek", "poke", "big"]
READ_ONLY = ["echo", "env_names", "env_value", "crash_read", "noisy", "peek", "big"]


def call(tool: str, **arguments: object) -> dict:
    return {"content": tool, "tool_calls": [{"name": f"mcp__fx__{tool}", "arguments": arguments}]}


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mcpfx")
    (base / "server.py").write_text(SERVER)
    return base


def setup(fx: Path, tmp_path: Path, steps: list[dict], *, timeout_s: float = 60, extra: str = "") -> tuple[Cli, Path, Path, Path]:
    """(cli, workspace, agent file, the server's marker dir) for one test."""
    marks = tmp_path / "marks"
    marks.mkdir()
    ws = git_workspace(tmp_path / "ws", {"README": "x\n"})
    agent = tmp_path / "agent.toml"
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    agent.write_text(textwrap.dedent(f"""\
        name = "mcp-test"
        provider = "script"
        script = "steps.json"
        tools = ["read_file"]
        [policy]
        tool_timeout_s = {timeout_s}
        cancel_window_s = 1
        env_keep = ["POLICY_TOKEN"]
        {extra}
        [mcp.servers.fx]
        command = {json.dumps(sys.executable)}
        args = [{json.dumps(str(fx / "server.py"))}, {json.dumps(str(marks))}]
        env_keep = ["KEEP_TOKEN"]
        tools = {json.dumps(TOOLS)}
        read_only = {json.dumps(READ_ONLY)}
        """))
    env = {"KEEP_TOKEN": "keep-3f9a1c77e2d04b6a", "SECRET_TOKEN": "drop-8b2e4d1f9c3a7e55", "POLICY_TOKEN": "p-1"}
    return Cli(tmp_path / "state", env, strict=True), ws, agent, marks


def outputs(cli: Cli, ses: str) -> list[dict]:
    """The journal of the session's latest run as ``run show --json`` gives it, output and isError lifted."""
    ops = cli("run", "show", ses, "--json", expect=0).json()["journal"]
    return [dict(o, **(o.get("outcome") or {})) for o in ops]


def test_failures_each_have_their_outcome_and_one_line(fx: Path, tmp_path: Path) -> None:
    """Env scrubbing and redaction, a read-only crash, a protocol error and a timeout are error outcomes the
    run reads on; a crash during a write call leaves it UNKNOWN and the run waiting."""
    steps = [call("echo", text="hi"), call("env_names"), call("env_value", name="KEEP_TOKEN"), call("big"),
             call("crash_read"), call("noisy"), call("peek", name="slow"), call("crash_write"), {"content": "done"}]
    cli, ws, agent, marks = setup(fx, tmp_path, steps, timeout_s=2)
    p = cli("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent), "--json")
    res = p.json()
    assert p.rc != 0 and res["status"] == "input_required" and len(res["unknownOps"]) == 1, p
    ops = outputs(cli, res["session"])
    out = {o["tool"].removeprefix("mcp__fx__"): o for o in ops}
    assert out["echo"]["output"] == "echo: hi" and out["echo"]["state"] == "Settled"
    names = out["env_names"]["output"].split()
    assert "KEEP_TOKEN" in names and "POLICY_TOKEN" in names and "SECRET_TOKEN" not in names
    assert "keep-3f9a1c77e2d04b6a" not in out["env_value"]["output"]  # the kept value is still redacted
    big = out["big"]["output"]
    assert big.startswith("head ") and big.endswith(" tail") and "bytes left out" in big and len(big) < 70_000
    assert "exited with status 3" in out["crash_read"]["output"] and out["crash_read"]["isError"]
    assert "not a JSON-RPC message" in out["noisy"]["output"] and out["noisy"]["isError"]
    assert "forged" not in out["noisy"]["output"]  # the answer written after the bad line was never read
    assert "did not answer within 2 s" in out["peek"]["output"]
    assert (marks / "slow.cancelled").exists()  # the timeout sent notifications/cancelled for the request
    assert out["crash_write"]["state"] == "OutcomeUnknown"
    assert "exited with status 4" in out["crash_write"]["note"]
    assert len(list(marks.glob("server.*"))) >= 3 and not servers_alive(marks)  # each start, each ended
    for o in ops:
        assert "\n" not in (o.get("note") or "")


def test_kill9_reruns_a_read_only_call_and_leaves_a_write_unknown(fx: Path, tmp_path: Path) -> None:
    """kill -9 of the CLI mid-call: the next run reaps the server's process group it left; the read-only
    call is run again on resume, the write call is UNKNOWN."""
    steps = [call("peek", name="r"), call("poke", name="w"), {"content": "done"}]
    cli, ws, agent, marks = setup(fx, tmp_path, steps)
    a = cli.spawn("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent))
    wait_for_file(marks / "r.started", a)
    os.kill(a.pid, signal.SIGKILL)
    _, err = a.communicate()
    assert "note: MCP tool mcp__fx__poke says readOnlyHint=true; if its calls change nothing, list it in read_only" in err
    child = int((marks / "r.child").read_text())
    (mcp_dir,) = [tmp_path / "state" / "mcp"]
    assert list(mcp_dir.glob("*.json")), "the server's process group is recorded"
    ses = cli("session", "list", "--json", expect=0).json()["sessions"][0]["id"]
    b = cli.spawn("--resume", ses, "--json")
    wait_for_file(marks / "w.started", b)
    assert not _alive(child), "the group the killed run left was reaped"
    os.kill(b.pid, signal.SIGKILL)
    b.communicate()
    p = cli("--resume", ses, "--json")
    res = p.json()
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1, p
    out = {o["tool"].removeprefix("mcp__fx__"): o for o in outputs(cli, ses)}
    assert out["peek"]["output"] == "again: r" and out["peek"]["state"] == "Settled"
    assert out["poke"]["state"] == "OutcomeUnknown"  # whatever its readOnlyHint says
    assert not list(mcp_dir.glob("*.json"))
    assert not _alive(int((marks / "w.child").read_text()))


def test_ctrl_c_sends_the_cancellation_and_a_write_becomes_unknown(fx: Path, tmp_path: Path) -> None:
    cli, ws, agent, marks = setup(fx, tmp_path, [call("poke", name="c"), {"content": "done"}])
    a = cli.spawn("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent), "--json")
    wait_for_file(marks / "c.started", a)
    os.kill(a.pid, signal.SIGINT)
    out, err = a.communicate(timeout=60)
    assert json.loads(out)["status"] == "input_required", err
    wait_for_file(marks / "c.cancelled", a)  # the server got notifications/cancelled for the call
    (op,) = outputs(cli, json.loads(out)["session"])
    assert op["state"] == "OutcomeUnknown" and "notifications/cancelled" in op["note"]
    assert not servers_alive(marks) and not list((tmp_path / "state" / "mcp").glob("*.json"))


def test_a_changed_tool_list_is_refused_until_a_new_agent_revision(fx: Path, tmp_path: Path) -> None:
    steps = [call("echo", text="one"), {"content": "done"}, call("echo", text="two"), {"content": "done"}]
    cli, ws, agent, marks = setup(fx, tmp_path, steps)
    ses = cli("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent), "--json", expect=0).json()["session"]
    (marks / "variant").write_text("2")
    p = cli("--resume", ses, "--task", "again", expect=2)
    line = p.err.strip().splitlines()[-1]
    assert line.startswith("kxen-agent: error: ") and "Traceback" not in p.err
    assert "MCP server 'fx' now offers a different tool list" in line and "tool 'echo' has a different inputSchema" in line
    assert f"kxen-agent --resume {ses} --agent FILE" in line
    # Refused before the call's Started: the run waits, and goes on under a new agent revision.
    assert [o["state"] for o in outputs(cli, ses)] == []
    res = cli("--resume", ses, "--agent", str(agent), "--json", expect=0).json()
    assert res["status"] == "completed" and [o["output"] for o in outputs(cli, ses)] == ["echo: two"]


def test_a_server_that_cannot_start_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    cli, ws, agent, _ = setup(Path("/nonexistent"), tmp_path, [call("echo", text="x")])
    agent.write_text(agent.read_text().replace(json.dumps(sys.executable), '"/nonexistent/mcp-server"'))
    line = cli.refused("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent))
    assert "MCP server 'fx' (/nonexistent/mcp-server) could not be started" in line
    assert cli("session", "list", "--json", expect=0).json()["sessions"] == []
    script = "import sys; sys.stderr.write('no config file here'); sys.exit(2)"
    agent.write_text(agent.read_text().replace('"/nonexistent/mcp-server"', json.dumps(sys.executable))
                     .replace(f'args = [{json.dumps("/nonexistent/server.py")}', f'args = ["-c", {json.dumps(script)}'))
    line = cli.refused("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent))
    assert "exited with status 2 before answering initialize" in line and "no config file here" in line, line
    assert cli("session", "list", "--json", expect=0).json()["sessions"] == []


def servers_alive(marks: Path) -> list[int]:
    """The pids of the fixture server's starts that are still running."""
    return [pid for pid in (int(p.name.split(".")[1]) for p in marks.glob("server.*")) if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_an_imported_sessions_servers_wait_for_session_trust(fx: Path, tmp_path: Path) -> None:
    """Its MCP servers are commands from elsewhere: shown by `session trust`, never started before it."""
    steps = [call("echo", text="one"), {"content": "done"}, call("echo", text="two"), {"content": "done"}]
    a, ws, agent, marks = setup(fx, tmp_path, steps)
    ses = a("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent), "--json", expect=0).json()["session"]
    a("session", "export", ses, "--output", str(tmp_path / "s.bundle"), expect=0)
    b = Cli(tmp_path / "state-b", {k: v for k, v in a.env.items() if k.endswith("_TOKEN")}, strict=True)
    b("session", "import", str(tmp_path / "s.bundle"), "--workspace", str(ws), expect=0)
    starts = len(list(marks.glob("server.*")))
    res = b("--resume", ses, "--task", "again", "--json").json()
    assert res["status"] == "input_required" and len(list(marks.glob("server.*"))) == starts
    shown = b("session", "trust", ses).out
    assert "MCP servers (commands this machine would run)" in shown
    assert f"MCP server fx: {sys.executable} {fx / 'server.py'}" in shown
    assert "mcp__fx__echo: server hints (not trusted): readOnlyHint=true" in shown
    b("session", "trust", ses, "--yes", expect=0)
    assert b("--resume", ses, "--json", expect=0).json()["status"] == "completed"
    assert [o["output"] for o in outputs(b, ses)] == ["echo: two"]


def test_a_streamable_http_server(fx: Path, tmp_path: Path) -> None:
    import socket
    import subprocess
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cli, ws, agent, marks = setup(fx, tmp_path, [call("echo", text="over http"), {"content": "done"}])
    server = subprocess.Popen([sys.executable, str(fx / "server.py"), str(marks), "http", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens (synchronization on the event the test needs)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.05)
        text = agent.read_text()
        head, _, _ = text.partition("command = ")
        agent.write_text(head + f'url = "http://127.0.0.1:{port}/mcp"\ntools = {json.dumps(TOOLS)}\n'
                         f'read_only = {json.dumps(READ_ONLY)}\n')
        res = cli("run", "--workspace", str(ws), "--task", "t", "--agent", str(agent), "--json", expect=0).json()
        assert [o["output"] for o in outputs(cli, res["session"])] == ["echo: over http"]
    finally:
        server.kill()
        server.wait()
