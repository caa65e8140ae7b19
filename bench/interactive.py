"""Start-up of the interactive session to its prompt, against ``kxen-agent session list`` in the same run.

::

    .venv/bin/python -m bench.interactive [--repeats 21] [--sessions 10] [--json FILE]

What a person waits for after typing ``kxen-agent chat -c``: the process
spawned on a pseudo-terminal until the prompt is drawn (issue #29: at most
300 ms on this machine, the order of ``session list``). Two cases: ``chat
-c`` on a state dir of ``--sessions`` finished sessions bound to the
workspace (it finds the latest one, and checks its run is finished), and
``chat --agent FILE`` for a new session on an empty state dir. The
baseline is ``kxen-agent session list`` on the same state dir, run to
its end.

Each figure is the median of ``--repeats`` rounds, the cases interleaved
round-robin so a noisy machine slows all alike. The target is read on CPU
time (user + system, from ``/proc/<pid>/stat`` at the moment the prompt
shows; ``session list``'s from ``wait4``): the wall time of a 2-core
machine shared with other jobs is noise, shown as context.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.startup import _populate

KXEN = str(Path(sys.executable).with_name("kxen-agent"))
DEMO = str(Path(__file__).resolve().parent.parent / "kxen_agent" / "examples" / "demo-agent" / "agent.toml")
PROMPT = re.compile(rb"(new session|ses_[0-9a-f]{8})>")
TARGET_MS = 300
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _to_prompt(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds from spawn until the prompt shows on the pseudo-terminal; then Ctrl-D."""
    master, slave = os.openpty()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        while not PROMPT.search(seen):
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                raise SystemExit(f"{' '.join(cmd)}: no prompt after 30 s; the terminal showed {seen[-300:]!r}")
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                raise SystemExit(f"{' '.join(cmd)} ended before its prompt: {seen[-300:]!r}")
            seen += chunk
        wall = time.perf_counter() - t0
        cpu = _cpu_of(p.pid)
        os.write(master, b"\x04")  # Ctrl-D: leave
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    os.read(master, 4096)
                except OSError:
                    pass
        if p.poll() is None:
            p.kill()
            raise SystemExit(f"{' '.join(cmd)} did not leave on Ctrl-D")
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
        p.wait()
    return wall, cpu


def _run_to_end(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.read().decode(errors='replace')[-300:]}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(repeats: int, sessions: int, tmp: Path) -> dict[str, dict[str, float]]:
    full, empty, ws = tmp / "state", tmp / "empty-state", tmp / "ws"
    _populate(full, ws, sessions)
    # With bytecode caches, as an installed package has them.
    base = {k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_") and k != "PYTHONDONTWRITEBYTECODE"}
    base.update(PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", XDG_CONFIG_HOME=str(tmp / "xdg"))
    cases = {
        f"session list ({sessions} sessions)": (_run_to_end, [KXEN, "session", "list"],
                                                 dict(base, KXEN_AGENT_STATE_DIR=str(full))),
        f"chat -c to the prompt ({sessions} sessions)": (_to_prompt, [KXEN, "chat", "-c"],
                                                          dict(base, KXEN_AGENT_STATE_DIR=str(full))),
        "chat --agent to the prompt (new session)": (_to_prompt, [KXEN, "chat", "--agent", DEMO],
                                                     dict(base, KXEN_AGENT_STATE_DIR=str(empty))),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for how, cmd, env in cases.values():
        how(cmd, env, ws)  # warm the page cache and the .pyc files
    for _ in range(repeats):
        for name, (how, cmd, env) in cases.items():
            samples[name].append(how(cmd, env, ws))
    return {name: {"wallMs": round(statistics.median(w for w, _ in s) * 1000, 1),
                   "cpuMs": round(statistics.median(c for _, c in s) * 1000, 1)} for name, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kxen-interactive-"))
    try:
        rows = measure(args.repeats, args.sessions, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    baseline = next(iter(rows.values()))
    print(f"interactive start-up, median of {args.repeats} interleaved rounds (python {sys.version.split()[0]})")
    print(f"{'case':<46} {'CPU':>9} {'wall':>9} {'CPU / session list':>19}  target (CPU)")
    for name, r in rows.items():
        target = "" if name.startswith("session list") else (
            f"<= {TARGET_MS} ms " + ("met" if r["cpuMs"] <= TARGET_MS else "MISSED"))
        print(f"{name:<46} {r['cpuMs']:7.1f}ms {r['wallMs']:7.1f}ms {r['cpuMs'] / baseline['cpuMs']:18.2f}x  {target}")
    if args.json:
        Path(args.json).write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
