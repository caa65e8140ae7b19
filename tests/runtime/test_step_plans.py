"""Durable steps as values (StepPlan) committed in one place, and what one tool call costs.

Measured here, per tool call (before this change: 2 refusal checks, 3 on a
crash re-run; 3 argument parses; 2 outputs read back from the store to be
written again): one refusal check, one parse, no read-back. The journal is
held by the runner and extended by what it commits: a run of n calls reads
no journal entry back, a resume reads each entry once.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

import kxen_agent.runtime.run_reader as run_reader
import kxen_agent.runtime.tool_call as tool_call
from kxen_agent.runtime.approvals import REFUSED, ApprovalRequest, Decision, plan_approval
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.session.status import Approval, ApproverName, OpSource, OpState, RunStatus
from kxen_agent.store.memory import MemoryStore

RUNTIME = Path(tool_call.__file__).parent
N = 12


class Crash(BaseException):
    pass


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter:
    c: Counter = Counter()

    def count(name: str, fn):
        def wrapped(*a, **k):
            c[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(tool_call, "judge", count("refusal", tool_call.judge))
    monkeypatch.setattr(tool_call, "parse_arguments", count("parse", tool_call.parse_arguments))
    monkeypatch.setattr(Runner, "entry_output", count("read back", Runner.entry_output))
    real_read = run_reader.read
    monkeypatch.setattr(run_reader, "read", lambda store, oid, kind: (c.update([f"read {kind}"]),
                                                                      real_read(store, oid, kind))[1])
    return c


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text("line\n" * 600)  # an output over the blob threshold
    return ws


def reads(n: int) -> list[dict]:
    return [{"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]} for _ in range(n)] + [
        {"content": "done"}]


def test_one_refusal_check_one_parse_no_read_back_per_call(tmp_path: Path, counted: Counter) -> None:
    res = Runner(MemoryStore("plans")).start(str(workspace(tmp_path)), "read", default_agent_definition(reads(N)))
    assert res.status == RunStatus.COMPLETED
    assert (counted["refusal"], counted["parse"], counted["read back"]) == (N, N, 0)
    assert counted["read journal"] == 0  # every entry was added by the commit that wrote it


def test_a_resume_reads_each_journal_entry_once_and_judges_a_rerun_once(tmp_path: Path, counted: Counter) -> None:
    store = MemoryStore("plans")
    seen: Counter = Counter()

    def crash_at_third_start(point: str) -> None:
        seen[point] += 1
        if point == "tool:after-started" and seen[point] == 3:
            raise Crash

    with pytest.raises(Crash):
        Runner(store, fault=crash_at_third_start).start(str(workspace(tmp_path)), "read",
                                                          default_agent_definition(reads(N)))
    counted.clear()
    [info] = SessionStore(store).list()
    res = Runner(store).resume(info.id)
    assert res.status == RunStatus.COMPLETED
    # 2 calls settled + the third Started = 7 entries read once; the third (no side effects) re-run, judged once.
    assert counted["read journal"] == 7
    assert (counted["refusal"], counted["parse"]) == (N - 2, N - 2)
    assert counted["read back"] == 0


def commit_owners(tree: ast.AST) -> list[tuple[str, int]]:
    """(enclosing function, line) of each ``X.store.step(...)`` or ``X.refs.transaction(...)`` call."""
    out = []

    def walk(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                f = child.func
                on = f.value.attr if isinstance(f.value, ast.Attribute) else getattr(f.value, "id", None)
                if (f.attr == "step" and on == "store") or (f.attr == "transaction" and isinstance(f.value, ast.Attribute)
                                           and f.value.attr == "refs"):
                    out.append((fn, child.lineno))
            walk(child, name)

    walk(tree, "<module>")
    return out


def test_runner_commit_is_the_one_place_the_runtime_writes_a_step() -> None:
    # lease.py, remote_lease.py and history_index.py keep their own files (leases, caches), not steps.
    found = {p.name: commit_owners(ast.parse(p.read_text())) for p in RUNTIME.glob("*.py")
             if p.name not in ("lease.py", "remote_lease.py", "history_index.py")}
    found = {k: v for k, v in found.items() if v}
    assert {k: [fn for fn, _ in v] for k, v in found.items()} == {"runner.py": ["commit"]}, found


def test_an_approval_is_a_plan_and_writes_nothing() -> None:
    base = {"op": "op_1", "run": "run_12345678", "turn": 1, "callId": "c", "tool": "shell", "arguments": "{}",
            "message": b"m" * 32, "sideEffects": True}
    asked: list[ApprovalRequest] = []

    def ask(req: ApprovalRequest) -> Decision:
        asked.append(req)
        return Decision(Approval.NO, ApproverName.USER)

    plan = plan_approval(base, None, latest={}, decided_here=lambda op: True, ask=ask, session="ses_12345678",
                         origin=lambda: "sd_x")
    assert plan is not None and not plan.runs and [r.op for r in asked] == ["op_1"]
    assert plan.decided == dict(base, state=OpState.DECIDED, source=OpSource.HUMAN, approval="no", approver="user",
                                origin="sd_x")
    assert plan.refused == dict(base, state=OpState.OUTCOME_KNOWN, source=OpSource.TOOL, isError=True,
                                approval="no", approver="user")
    assert REFUSED == "refused by the user"
    # "Always" said here for the tool decides without asking; said elsewhere, it does not.
    always = {"op_0": dict(base, op="op_0", approval="yes", approver="user-always")}
    yes = plan_approval(base, None, latest=always, decided_here=lambda op: True, ask=ask, session="s",
                        origin=lambda: "sd_x")
    assert yes is not None and yes.runs and yes.fields["approver"] == ApproverName.USER_ALWAYS and len(asked) == 1
    plan_approval(base, None, latest=always, decided_here=lambda op: False, ask=ask, session="s", origin=lambda: "x")
    assert len(asked) == 2
    # Ctrl-C while asking: nothing to write.
    assert plan_approval(base, None, latest={}, decided_here=lambda op: True, ask=lambda r: None, session="s",
                         origin=lambda: "x") is None
