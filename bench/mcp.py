"""100 calls of one cheap MCP tool: through ``kxen-agent run`` against a script using the SDK's client alone.

::

    .venv/bin/python -m bench.mcp [--calls 100] [--repeats 3] [--json FILE]

The MCP server is the same tiny stdio server for both (the SDK's own
``MCPServer`` with one ``echo`` tool, started as a subprocess). Both sides
are whole processes, started fresh each repeat:

- ``kxen-agent run``: a script-provider agent whose steps make ``--calls``
  turns of one ``mcp__bench__echo`` call each (declared read_only), then a
  final answer. Every call is journaled (``Started``, ``OutcomeKnown``, the
  turn's tool message, ``Settled``: four durable steps). This includes
  making the lock (the server started once to record its tool listing) and
  the run starting it again at its first call.
- the SDK script: ``stdio_client`` + ``ClientSession``, ``initialize``, then
  ``--calls`` ``call_tool("echo")``, then exit.

The figure is the ratio of CPU time (user + system, the process and every
child it waited for, so the servers too) medians; wall time is context only
on a shared machine. Target (issue #31): at most 1.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

KXEN = str(Path(sys.executable).with_name("kxen-agent"))

SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    app = MCPServer("bench")

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def echo(text: str) -> str:
        """Say it back."""
        return text

    app.run()
''')

CLIENT = textwrap.dedent('''
    import sys
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def main():
        params = StdioServerParameters(command=sys.executable, args=[sys.argv[1]])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for i in range(int(sys.argv[2])):
                    result = await session.call_tool("echo", {"text": f"call {i}"})
                    assert not result.is_error

    anyio.run(main)
''')


def _measure(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(CPU seconds of the process and its waited-for children, wall seconds) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kxen-bench-mcp-"))
    (tmp / "server.py").write_text(SERVER)
    (tmp / "client.py").write_text(CLIENT)
    steps = [{"content": "call", "tool_calls": [{"name": "mcp__bench__echo", "arguments": {"text": f"call {i}"}}]}
             for i in range(args.calls)] + [{"content": "done"}]
    (tmp / "steps.json").write_text(json.dumps(steps))
    (tmp / "agent.toml").write_text(textwrap.dedent(f"""\
        name = "bench-mcp"
        provider = "script"
        script = "steps.json"
        tools = []
        [policy]
        max_turns = {args.calls + 10}
        [mcp.servers.bench]
        command = {json.dumps(sys.executable)}
        args = [{json.dumps(str(tmp / "server.py"))}]
        tools = ["echo"]
        read_only = ["echo"]
        """))
    ws = tmp / "ws"
    ws.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    kx_cpu, kx_wall, sdk_cpu, sdk_wall = [], [], [], []
    for r in range(args.repeats + 1):  # the first round warms the bytecode caches and is not counted
        env["KXEN_AGENT_STATE_DIR"] = str(tmp / f"state{r}")
        cpu, wall = _measure([KXEN, "run", "--agent", str(tmp / "agent.toml"), "--task", "bench", "--quiet"],
                             env, str(ws))
        c2, w2 = _measure([sys.executable, str(tmp / "client.py"), str(tmp / "server.py"), str(args.calls)],
                          env, str(ws))
        if r:
            kx_cpu.append(cpu), kx_wall.append(wall), sdk_cpu.append(c2), sdk_wall.append(w2)
    med = statistics.median
    out = {"calls": args.calls, "repeats": args.repeats,
           "kxen_cpu_s": round(med(kx_cpu), 3), "sdk_cpu_s": round(med(sdk_cpu), 3),
           "kxen_wall_s": round(med(kx_wall), 3), "sdk_wall_s": round(med(sdk_wall), 3),
           "ratio_cpu": round(med(kx_cpu) / med(sdk_cpu), 2), "ratio_wall": round(med(kx_wall) / med(sdk_wall), 2)}
    print(f"{args.calls} calls of one MCP tool, median of {args.repeats}:")
    print(f"  kxen-agent run   cpu {out['kxen_cpu_s']:.2f} s   wall {out['kxen_wall_s']:.2f} s")
    print(f"  SDK client       cpu {out['sdk_cpu_s']:.2f} s   wall {out['sdk_wall_s']:.2f} s")
    print(f"  ratio            cpu {out['ratio_cpu']:.2f}x   wall {out['ratio_wall']:.2f}x   (target <= 1.5x)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
