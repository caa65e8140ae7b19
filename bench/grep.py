"""``kxen-agent session grep`` against ``rg`` over the same messages exported as JSON Lines (issue #30).

    .venv/bin/python -m bench.grep [--messages 100000] [--sessions 10] [--repeats 7] [--dir DIR] [--keep]
                                   [--before SRC]

Builds a state dir of ``--sessions`` sessions holding ``--messages``
messages in all (``bench/_content.py``: a coding agent's conversations,
prose and tool outputs of a few KB), exports every message as one JSON
line (``session log --json``'s fields, one file), then times whole
processes, alternating, median of ``--repeats``: ``kxen-agent session grep``
(the search index up to date, as after a first search) against ``rg`` on
the JSONL file, for a rare literal, a common literal and a regular
expression, and ``-l``. CPU time (user + sys of the child) is the figure
that holds on a loaded machine; wall time is shown beside it. Also: the
first search of a state dir (it writes the index), the index's size, and
the start-up floor (``python -c pass``, ``kxen-agent --version``).

``--before SRC``: a source tree of an earlier kxen-agent (``git archive
COMMIT | tar -x -C SRC``), timed in the same rounds as a third process
(``PYTHONPATH=SRC``) on a copy of the state dir made of hard links (a
search writes only its cache, which each copy keeps for itself: the two
versions' index formats may differ). The commands run with bytecode
caches (a warm-up run writes them), as an installed package has them:
``PYTHONDONTWRITEBYTECODE`` is dropped from their environment.

Needs ``rg`` on PATH (``apt-get install ripgrep``). The target: CPU time
of the whole process <= 3x ``rg``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KXEN = [sys.executable, "-m", "kxen_agent"]
TARGET = 3.0


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(cpu s, wall s, stdout lines) of one run of ``cmd``."""
    c0, w0 = _child_cpu(), time.perf_counter()
    # Not run from the source tree: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tempfile.gettempdir())
    wall, cpu = time.perf_counter() - w0, _child_cpu() - c0
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} -> {p.returncode}: {p.stderr.decode()[-2000:]}")
    return cpu, wall, p.stdout.count(b"\n")


def build(state: Path, ws: Path, messages: int, sessions: int) -> None:
    """The state dir: ``sessions`` sessions of ``messages / sessions`` messages each (no fsync: setup)."""
    sys.path.insert(0, str(ROOT))
    from bench._content import conversation
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.workspace import inspect_workspace
    from kxen_agent.store import FileIO, RefUpdate, Store

    class NoSync(FileIO):
        def write_tmp(self, d, data, *, sync=True, prefix="tmp_"):  # type: ignore[override]
            return super().write_tmp(d, data, sync=False, prefix=prefix)

        def fsync_dir(self, d):  # type: ignore[override]
            pass

    s = SessionStore(Store(str(state), io=NoSync()))
    per = messages // sessions
    for k in range(sessions):
        info = s.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(str(ws)))
        msgs = conversation(per, seed=k + 1)
        head = s.append_messages(None, msgs)
        s.store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="bench: history")


def export_jsonl(state: Path, out: Path) -> int:
    """Every message of every session as one JSON line (``session log --json``'s fields); the bytes written."""
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store

    s = SessionStore(Store(str(state)))
    with open(out, "w", encoding="utf-8") as f:
        for info in s.list():
            for m in s.iter_forward(info.head):
                d = m.to_json()
                d["session"] = info.id
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return out.stat().st_size


def search_phase(state: Path, pattern: str, regex: bool, repeats: int, sessions_only: bool = False) -> float:
    """CPU seconds of the search alone, in this process (modules imported, the index up to date and stamped, as
    a ``session grep`` process finds it): median. The lean search (the stamp's, no ref read) when it answers."""
    from kxen_agent.cli.grep_lean import matcher
    from kxen_agent.session.grep_index import search
    from kxen_agent.session.grep_stamp import lean_search
    from kxen_agent.store import Store

    match = matcher(pattern, regex=regex, ignore_case=False)
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        if lean_search(str(state), match, sessions_only=sessions_only) is None:
            search(Store(str(state)), match, sessions_only=sessions_only)
        out.append(time.process_time() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--before", default=None, metavar="SRC", help="an earlier source tree, timed alongside")
    a = ap.parse_args(argv)
    rg = shutil.which("rg")
    if rg is None:
        print("rg is not on PATH (apt-get install ripgrep)", file=sys.stderr)
        return 2
    work = Path(a.dir or tempfile.mkdtemp(prefix="kxen-bench-grep-"))
    work.mkdir(parents=True, exist_ok=True)
    state, ws, jsonl = work / "state", work / "ws", work / "messages.jsonl"
    env = dict(os.environ, KXEN_AGENT_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before_state = work / "state-before"
    before_env = None
    if a.before:
        before_env = dict(env, KXEN_AGENT_STATE_DIR=str(before_state), PYTHONPATH=str(Path(a.before).resolve()))
    try:
        if not state.exists():
            ws.mkdir(exist_ok=True)
            t0 = time.perf_counter()
            build(state, ws, a.messages, a.sessions)
            print(f"built {a.messages:,} messages in {a.sessions} sessions: {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
        size = export_jsonl(state, jsonl)
        cache = state / "cache" / "grep"
        shutil.rmtree(cache, ignore_errors=True)
        _time([*KXEN, "--version"], env)  # bytecode of the CLI, written once (as an installed package has it)
        first = _time([*KXEN, "session", "grep", "-l", "zzz-not-there"], env)
        index_bytes = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
        if before_env is not None:
            # Hard links: a search writes only its own cache (left out); the objects, refs and logs are shared.
            shutil.rmtree(before_state, ignore_errors=True)
            shutil.copytree(state, before_state, copy_function=os.link,
                            ignore=lambda d, names: ["cache"] if Path(d) == state else [])
            _time([*KXEN, "session", "grep", "-l", "zzz-not-there"], before_env)  # its index, and bytecode
            # A hard link changes its file's change time: the stamp (§11a.2) is written again before the timing.
            _time([*KXEN, "session", "grep", "-l", "zzz-not-there"], env)
        cases = [
            ("rare literal", ["Traceback"], ["Traceback"]),
            ("common literal", ["assert"], ["assert"]),
            ("regex", ["-E", r"def test_\w+\("], [r"def test_\w+\("]),
            ("-l, common literal", ["-l", "import"], ["-l", "import"]),
        ]
        rows = []
        for title, kargs, rargs in cases:
            k_runs, r_runs, b_runs = [], [], []
            for _ in range(a.repeats):  # alternating, so load hits all alike
                k_runs.append(_time([*KXEN, "session", "grep", *kargs], env))
                r_runs.append(_time([rg, *rargs, str(jsonl)], env))
                if before_env is not None:
                    b_runs.append(_time([*KXEN, "session", "grep", *kargs], before_env))
            kc, kw = statistics.median(r[0] for r in k_runs), statistics.median(r[1] for r in k_runs)
            rc, rw = statistics.median(r[0] for r in r_runs), statistics.median(r[1] for r in r_runs)
            bc = statistics.median(r[0] for r in b_runs) if b_runs else None
            phase = search_phase(state, kargs[-1], kargs[0] == "-E", a.repeats, sessions_only=kargs[0] == "-l")
            rows.append((title, kc, kw, rc, rw, k_runs[0][2], r_runs[0][2], phase, bc))
        # Which way the timed searches went: the stamp's (§11a.2: no store imported, no ref read) or the long way.
        probe = subprocess.run([sys.executable, "-c", "import sys\nfrom kxen_agent.cli.start import run\n"
                                "run(['session', 'grep', '-l', 'zzz-not-there'])\nprint('store' if "
                                "'kxen_agent.store' in sys.modules else 'lean', file=sys.stderr)"],
                               env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
        way = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "?"
        floor = [_time([sys.executable, "-c", "pass"], env) for _ in range(a.repeats)]
        version = [_time([*KXEN, "--version"], env) for _ in range(a.repeats)]
        load = os.getloadavg()
        print(f"\n{a.messages:,} messages, {a.sessions} sessions; JSONL {size / 1e6:.1f} MB; index "
              f"{index_bytes / 1e6:.1f} MB; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"median of {a.repeats}; a warm search's start: {way}\n")
        had = before_env is not None
        print("| search | " + ("before CPU | before / rg | " if had else "") + "kxen CPU | rg CPU | ratio (CPU) | "
              "kxen wall | rg wall | search alone (CPU, in-process) | alone / rg | lines kxen / rg | target | met |")
        print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if had else ""))
        for title, kc, kw, rc, rw, kl, rl, phase, bc in rows:
            ratio = kc / rc if rc > 0 else float("inf")
            alone = phase / rc if rc > 0 else float("inf")
            was = f"{bc * 1000:.0f} ms | {bc / rc if rc > 0 else float('inf'):.1f}x | " if bc is not None else ""
            print(f"| {title} | {was}{kc * 1000:.0f} ms | {rc * 1000:.0f} ms | {ratio:.1f}x | {kw * 1000:.0f} ms | "
                  f"{rw * 1000:.0f} ms | {phase * 1000:.0f} ms | {alone:.1f}x | {kl} / {rl} | <= {TARGET:.0f}x | "
                  f"{'met' if ratio <= TARGET else '**MISSED**'} |")
        pre, blank = (" | |" if had else ""), "| | | | | | "  # the figure in the kxen CPU and wall columns
        for title, runs in (("first search (writes the index)", [first]), ("start-up floor: `python -c pass`", floor),
                            ("start-up: `kxen-agent --version`", version)):
            cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"| {title}{pre} | {cpu * 1000:.0f} ms | | | {wall * 1000:.0f} ms {blank}(context) | |")
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
