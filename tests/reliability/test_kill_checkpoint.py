"""Kill torture of the checkpoint policy's path (issue #32, item 3; objects_spec.md §6.8.2).

Real ``kxen-agent run`` processes whose bound is set low
(``KXEN_AGENT_CHECKPOINT_RECORDS=4``: a checkpoint pass every tool call or
so, small packs merged every eighth) are SIGKILLed, then resumed until
the run is terminal: every other trial at a random moment (a checkpoint
pass may be at work), the others at a fault point of a random tool call
(``KXEN_AGENT_FAULT``), so a trial surely kills a run in the middle however
fast the machine finishes it. After every trial: fsck is clean,
the history is the script's whole conversation (every tool call answered
once, in order), and the session's step log is under the bound plus the
records of the turns a pass could not keep up with. The fast suite runs a
few trials; ``KXEN_TEST_LONG=1`` runs more.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from kxen_agent.runtime.history_index import CACHES
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import Store, fsck
from tests.helpers import cli_env, depth, git_workspace, run_kxen, spawn_kxen, write_agent

CALLS = 16
TRIALS = depth(fast=2, long=16)


@pytest.mark.slow
def test_killed_runs_under_a_low_bound_resume_to_a_whole_history_and_a_clean_store(tmp_path: Path) -> None:
    rng = random.Random(int(time.time()))
    seed = rng.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    steps = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]}] * CALLS
    steps.append({"content": "done"})
    agent = write_agent(tmp_path / "agent", steps, policy={"max_turns": CALLS + 5})
    killed = resumed = 0
    for trial in range(TRIALS):
        root = tmp_path / f"t{trial}"
        ws = git_workspace(root / "ws")
        env = cli_env(root / "state", {"KXEN_AGENT_CHECKPOINT_RECORDS": "4"})
        at_fault = trial % 2 == 0
        fault = {"KXEN_AGENT_FAULT": rng.choice(["tool:after-started", "tool:after-effect", "tool:after-outcome",
                                                 "tool:after-turn"]) + f"@{rng.randint(2, CALLS)}"}
        p = spawn_kxen(["run", "-q", "--json", "--task", "read it many times", "--agent", str(agent)],
                       env={**env, **fault} if at_fault else env, cwd=ws)
        if at_fault:
            p.communicate(timeout=120)
            assert p.returncode == -9, (trial, seed, fault, p.returncode)  # it killed itself mid-run
            killed += 1
        else:
            steps = root / "state" / "steps" / "sessions"
            deadline = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < deadline and not (steps.is_dir() and any(steps.iterdir())):
                time.sleep(0.05)  # until the session exists: the run's steps are what is under test
            time.sleep(rng.uniform(0.0, 2.0))  # then a random moment of the run (not a wait for a race)
            if p.poll() is None:
                killed += 1
            p.kill()
            p.communicate()
        store = Store(str(root / "state"), namespaces=(NS,), caches=CACHES)
        sessions = SessionStore(store)
        found = sessions.list() if store.exists else []
        if not found:  # killed before the session was made: nothing to resume
            continue
        ses = found[0].id
        resumed += 1
        task: list[str] = []
        for _ in range(5):
            r = run_kxen(["--resume", ses, "-q", "--json", *task], env=env, cwd=ws)
            if r.rc != 0 and "has no run to resume" in r.err:
                task = ["--task", "read it many times"]  # killed before the run's first step
                continue
            if r.rc == 0 and '"completed"' in r.out:
                break
            if r.rc != 0 and "nothing to resume" in r.err and "is completed" in r.err:
                break  # killed once the run had completed (packing after the run, the process's exit)
        else:
            pytest.fail(f"trial {trial} (seed {seed}): the run of {ses} did not complete: {r}")
        store = Store(str(root / "state"), namespaces=(NS,), caches=CACHES)
        rep = fsck(store)
        assert rep.clean, (trial, seed, rep.problems)
        sessions = SessionStore(store)
        hist = sessions.history(sessions.get(ses).head)
        calls = [c["id"] for m in hist if m.role == "assistant" for c in m.tool_calls]
        answered = [m.tool_call_id for m in hist if m.role == "tool"]
        assert len(calls) == CALLS and answered == calls, (trial, seed)
        _, log = store.refs.read_with_log(f"{NS}/{ses}")
        assert log is None or len(log.records) <= 4 + 4 * 6, (trial, seed, len(log.records))
    print(f"{TRIALS} trials: {killed} killed during the run, {resumed} resumed")
    assert killed >= 1 and resumed >= 1
