"""Start-up of the ``kxen-agent`` command, as a ratio to ``python -c pass`` in the same run.

::

    .venv/bin/python -m bench.startup [--repeats 41] [--sessions 10] [--json FILE]

What a user waits for before anything happens: the console script run as a
new process, timed from spawn to exit (``kxen-agent --help``,
``kxen-agent --version``, ``kxen-agent session list`` on a state dir holding
``--sessions`` finished sessions, and ``kxen-agent session list`` on an
empty one), each against ``python -c pass`` of the same interpreter. The
commands are interleaved round-robin, so a noisy machine slows all of them
alike; each figure is the median of ``--repeats`` runs, and the ratio of
medians is the figure (issue #16: at most 4x). The absolute times are
context only.

The interpreter's own start-up (site, the editable install's import hook
when the package is installed with ``pip install -e``) is in the baseline
and in every command alike. The commands run with bytecode caches (the
warm-up run writes them), as an installed package has them:
``PYTHONDONTWRITEBYTECODE`` is dropped from their environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KXEN = str(Path(sys.executable).with_name("kxen-agent"))


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
    return dt


def _populate(state: Path, ws: Path, n: int) -> None:
    """``n`` finished sessions made in-process (the scripted demo agent), as ``run`` makes them."""
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.agent_def import load_agent_definition
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    ws.mkdir(parents=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b.invalid", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@b.invalid")
    subprocess.run(["git", "init", "-q", "-b", "main", str(ws)], check=True, env=env)
    subprocess.run(["git", "-C", str(ws), "commit", "-q", "--allow-empty", "-m", "init"], check=True, env=env)
    runner = Runner(Store.open(str(state), namespaces=(NS,)))
    lock = load_agent_definition(str(Path(__file__).resolve().parent.parent / "kxen_agent" / "examples"
                                     / "demo-agent" / "agent.toml"))
    for i in range(n):
        runner.start(str(ws), f"task {i}: review the project", lock)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="kxen-startup-"))
    try:
        full, empty = tmp / "state", tmp / "empty-state"
        _populate(full, tmp / "ws", args.sessions)
        # With bytecode caches, as a user has them (pip writes them at install):
        # PYTHONDONTWRITEBYTECODE would recompile every module on every start.
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("KXEN_AGENT_") and k != "PYTHONDONTWRITEBYTECODE"}
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], base),
            "kxen-agent --help": ([KXEN, "--help"], dict(base, KXEN_AGENT_STATE_DIR=str(empty))),
            "kxen-agent --version": ([KXEN, "--version"], dict(base, KXEN_AGENT_STATE_DIR=str(empty))),
            f"kxen-agent session list ({args.sessions} sessions)": (
                [KXEN, "session", "list"], dict(base, KXEN_AGENT_STATE_DIR=str(full))),
            "kxen-agent session list (empty state dir)": (
                [KXEN, "session", "list"], dict(base, KXEN_AGENT_STATE_DIR=str(empty))),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for name, (cmd, env) in cases.items():
            _time(cmd, env)  # warm the page cache and the .pyc files
        for _ in range(args.repeats):
            for name, (cmd, env) in cases.items():
                times[name].append(_time(cmd, env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {name: statistics.median(v) for name, v in times.items()}
    floor = med["python -c pass"]
    rows = []
    print(f"start-up, median of {args.repeats} interleaved runs (python {sys.version.split()[0]})")
    print(f"{'command':<44} {'median':>9} {'ratio':>7}  target")
    for name, m in med.items():
        ratio = m / floor
        target = "" if name == "python -c pass" or "version" in name else ("<= 4x " + ("met" if ratio <= 4 else "MISSED"))
        rows.append({"command": name, "medianMs": round(m * 1000, 1), "ratio": round(ratio, 2)})
        print(f"{name:<44} {m * 1000:7.1f}ms {ratio:6.2f}x  {target}")
    if args.json:
        Path(args.json).write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
