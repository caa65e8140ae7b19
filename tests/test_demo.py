"""``kxen-agent demo --dir D``: the README's main job, run as a user runs it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from tests.helpers import Cli, git


def test_demo_runs_the_main_job_and_refuses_a_non_empty_dir(tmp_path: Path) -> None:
    base = tmp_path / "demo"
    cli = Cli(tmp_path / "unused-state")  # every step of the demo names its own state dir
    p = cli("demo", "--dir", str(base))
    assert p.rc == 0 and "Traceback" not in p.err, str(p)
    assert not cli.state_dir.exists()

    commands = [shlex.split(line[2:]) for line in p.out.splitlines() if line.startswith("$ ")]
    kx = [c for c in commands if c[0].startswith("KXEN_AGENT_STATE_DIR=")]
    # Each step is printed before it runs: the whole main job, in order.
    assert all(c[1] == "kxen-agent" for c in kx), kx
    ran = iter(" ".join(c[2:]) for c in kx)
    for step in ("run --workspace", "session show", "session fork", "session export", "bundle verify",
                 "session import", "--resume ses_", "fsck", "fsck"):
        assert any(r.startswith(step) for r in ran), (step, kx)
    assert any(c[:2] == ["git", "-C"] and "init" in c for c in commands), commands
    assert any(c[:2] == ["git", "clone"] for c in commands)
    assert "Traceback" not in p.out

    # Both runners' state dirs (as printed) are fsck clean.
    states = sorted({c[0].split("=", 1)[1] for c in kx})
    assert len(states) == 2, states
    for state in states:
        Cli(Path(state)).fsck_clean()

    # The worktree fork exists, checked out on its branch.
    run = next(c for c in kx if c[2:4] == ["run", "--workspace"])
    repo = run[4]
    fork = next(c for c in kx if c[2:4] == ["session", "fork"])
    assert fork[-2:] == ["--worktree", "alternative_fix"]
    porcelain = git(repo, "worktree", "list", "--porcelain").split("\n\n")
    trees = {e.split("\n")[0].split(" ", 1)[1]: e for e in porcelain if e.strip()}
    wt = [path for path, e in trees.items() if "branch refs/heads/kxen/alternative_fix" in e]
    assert len(wt) == 1 and os.path.isdir(wt[0]), trees
    assert git(wt[0], "rev-parse", "--abbrev-ref", "HEAD").strip() == "kxen/alternative_fix"

    # A non-empty --dir is refused, in one line, and left as it was.
    before = sorted(str(q) for q in base.rglob("*"))
    again = cli("demo", "--dir", str(base))
    assert again.rc != 0 and "Traceback" not in again.err, str(again)
    lines = again.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kxen-agent: error: ") and str(base) in lines[0], again.err
    assert "not empty" in lines[0]
    assert sorted(str(q) for q in base.rglob("*")) == before
