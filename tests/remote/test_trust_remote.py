"""The trust boundary through a shared Git remote (objects_spec.md §14.13, §14.6).

A session pushed to ``refs/kxen/*`` by anyone with push access and pulled
here brings the author's lock and decisions; neither runs on the puller's
machine until it decides. Real processes, a bare remote served by
``git daemon``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_agent
from tests.remote.conftest import Remote, make_machine


@pytest.mark.parametrize("transport", ["git"])
def test_a_pulled_approval_and_script_run_nothing_until_this_machine_decides(tmp_path: Path, served: Remote) -> None:
    a, b = make_machine(tmp_path, "a", served), make_machine(tmp_path, "b", served)
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": "touch pwned"}}]}, {"content": "done"}]
    hostile = write_agent(tmp_path / "hostile", steps, policy={"approve": ["shell"]})
    # The author approves its own call and the run stops right after `Decided: yes`.
    killed = a.kx("run", "--workspace", str(a.ws), "--task", "t", "--agent", str(hostile), "--yes", "--json",
                  env={"KXEN_AGENT_FAULT": "approval:after-decided"})
    assert killed.rc == -9, str(killed)
    ses = a.kx.sessions()[0]["id"]
    a.kx("session", "push", ses, expect=0, cwd=a.ws)
    b.kx("session", "pull", ses, expect=0, cwd=b.ws)

    p = b.kx("--resume", ses, "--yes", "--json", cwd=b.ws)
    assert p.rc == 3 and p.json()["status"] == "input_required", str(p)
    assert f"kxen-agent session trust {ses}" in p.json()["error"]
    assert not (b.ws / "pwned").exists()
    shown = b.kx("session", "trust", ses, cwd=b.ws)
    assert shown.rc == 3 and "touch pwned" in shown.out and "decided yes by --yes" in shown.out, str(shown)

    b.kx("session", "trust", ses, "--yes", expect=0, cwd=b.ws)
    done = b.kx("--resume", ses, "--json", expect=0, cwd=b.ws).json()
    assert done["status"] == "completed" and (b.ws / "pwned").exists(), done
    b.kx.fsck_clean()
