"""What a reader is shown of a stored run (:mod:`kxen_agent.runtime.run_status`), without a Runner.

``session list`` applies these rules without building a :class:`Runner`
(which imports the loop, its providers and tools); the runner's own
``read_run`` and ``shown_status`` delegate here, so both say the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kxen_agent.runtime.lease import Lease
from kxen_agent.runtime.run_status import read_run, shown_status
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import CorruptObject, Store
from kxen_agent.store.memory import MemoryStore


def _two_runs(tmp_path: Path) -> tuple[MemoryStore, SessionStore]:
    store = MemoryStore("run-status")
    ws = tmp_path / "ws"
    ws.mkdir()
    runner = Runner(store)
    for task in ("one", "two"):
        runner.start(str(ws), task, default_agent_definition([{"content": "done"}]))
    return store, SessionStore(store)


def test_read_run_checks_the_state_is_the_runs_that_names_it(tmp_path: Path) -> None:
    store, sessions = _two_runs(tmp_path)
    a, b = sessions.list()
    [(run_a, oid_a)] = a.runs.items()
    [(run_b, oid_b)] = b.runs.items()
    st = read_run(store, a, run_a, oid_a)
    assert (st["id"], st["session"], st["status"]) == (run_a, a.id, "completed")
    assert Runner(store).read_run(a, run_a, oid_a) == st
    with pytest.raises(CorruptObject, match=f"names the state of run {run_b} of session {b.id}"):
        read_run(store, a, run_a, oid_b)  # another session's run state under this run's name


def test_shown_status_is_interrupted_only_when_no_live_process_holds_the_lease(tmp_path: Path) -> None:
    store, sessions = _two_runs(tmp_path)
    ses = sessions.list()[0].id
    running = {"status": "running"}
    assert shown_status(store, ses, running) == "interrupted"
    assert shown_status(store, ses, {"status": "completed"}) == "interrupted"  # before its final message
    assert shown_status(store, ses, {"status": "completed", "settled": True}) == "completed"
    assert shown_status(store, ses, {"status": "input_required"}) == "input_required"  # waits for resolve
    with Lease.acquire(store, ses, run="run_x", ttl=3600):
        assert shown_status(store, ses, running) == "running"
        assert Runner(store).shown_status(ses, running) == "running"
    assert Runner(store).shown_status(ses, running) == "interrupted"


def test_session_list_does_not_import_the_run_loop(tmp_path: Path) -> None:
    # The start-up of `session list` (bench/startup.py): its runs' statuses need no Runner.
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    ws.mkdir()
    Runner(Store(str(state), namespaces=(NS,))).start(str(ws), "a task", default_agent_definition([{"content": "ok"}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")}
    code = ("import sys\n"
            "from kxen_agent.cli.main import main\n"
            "sys.argv = ['kxen-agent', 'session', 'list']\n"
            "try:\n    main()\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('kxen_agent.runtime')))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(env, KXEN_AGENT_STATE_DIR=str(state)))
    assert p.returncode == 0 and "completed" in p.stdout, p.stdout + p.stderr
    loaded = p.stdout.strip().splitlines()[-1]
    assert "kxen_agent.runtime.run_status" in loaded, loaded
    assert "kxen_agent.runtime.runner" not in loaded and "kxen_agent.runtime.providers" not in loaded, loaded
