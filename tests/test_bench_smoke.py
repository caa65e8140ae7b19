"""The benchmark runs: ``python -m bench.run --quick`` exits 0 and prints its table.

Only that it runs, on tiny sizes; the figures themselves are a benchmark's
business (bench/README.md), not a test's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("KXEN_AGENT_IO_FAULT", None)
    env.pop("KXEN_AGENT_FAULT", None)
    return subprocess.run([sys.executable, "-m", "bench.run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_quick_run_prints_the_table(tmp_path: Path) -> None:
    p = _run("--quick", "--dir", str(tmp_path / "work"), "--json", str(tmp_path / "out.json"), tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "| workload | figure | kxen | peer | ratio | target | met |" in out
    for workload in ("1 fork", "2 durable", "3 export", "3 size", "4 load", "5 fsck", "6 scaling", "7 remote", "8 turns", "8 files"):
        assert f"| {workload} |" in out, f"no {workload} row in:\n{out}"
    assert "targets met" in out
    assert (tmp_path / "out.json").stat().st_size > 0


def test_unknown_workload_is_a_usage_error(tmp_path: Path) -> None:
    p = _run("--quick", "--only", "nope", tmp_path=tmp_path)
    assert p.returncode == 2
    assert "unknown workload" in p.stderr


def test_the_compaction_workload_keeps_every_request_within_the_budget() -> None:
    from bench.compaction import measure

    m = measure(turns=30, budget=2000, result_bytes=2000)
    assert m["requests"] == 31 and m["compactions"] >= 3, m
    assert m["largestRequest"] <= m["budget"] < m["uncompactedTokens"], m
    assert m["messagesKept"] >= 2 * 30 + 1, m  # every call and result stays in the session
