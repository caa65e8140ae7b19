"""RunState and JournalEntry round-trip byte for byte: the spec's vectors and what real runs write."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.records import ABSENT, JournalEntry, RunState
from kxen_agent.session.schema import check
from kxen_agent.session.sessions import SessionStore
from kxen_agent.session.status import OpSource, OpState, RunStatus
from kxen_agent.store.memory import MemoryStore
from kxen_agent.store.objects import SchemaViolation, encode_object

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"
RECORDS = {"run": RunState, "journal": JournalEntry}


def spec_vectors() -> list[tuple[str, str, dict]]:
    out = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```[ \t]*$", SPEC.read_text(encoding="utf-8"), re.S | re.M):
        f = dict(line.partition(": ")[::2] for line in block.splitlines())
        if "vector" in f and f.get("kind") in RECORDS:
            value = ast.literal_eval(f["value"])
            try:
                check(f["kind"], value)  # the store's own vectors of these kinds are not session objects
            except SchemaViolation:
                continue
            out.append((f["vector"], f["kind"], value))
    return out


def same_bytes(kind: str, value: dict) -> None:
    rec = RECORDS[kind].from_cbor(value)
    again = rec.to_cbor()
    assert encode_object(kind, again).raw == encode_object(kind, value).raw
    assert RECORDS[kind].from_cbor(again) == rec
    # The words come back as exact strings (what the strict encoder takes), not as enum members.
    assert all(type(v) is str for k, v in again.items() if k in ("status", "state", "source", "approver"))


def test_the_spec_has_run_and_journal_vectors() -> None:
    kinds = [k for _, k, _ in spec_vectors()]
    assert kinds.count("run") >= 1 and kinds.count("journal") >= 3


@pytest.mark.parametrize("name,kind,value", spec_vectors(), ids=[v[0] for v in spec_vectors()])
def test_a_spec_vector_round_trips_byte_for_byte(name: str, kind: str, value: dict) -> None:
    same_bytes(kind, value)


def test_fields_are_typed_and_absent_is_not_null() -> None:
    [(_, _, run)] = [v for v in spec_vectors() if v[0] == "run-state-retry"]
    st = RunState.from_cbor(run)
    assert st.status is RunStatus.RUNNING and not st.terminal
    assert st.retry_of == "run_5f0c2e9a41b7d3680c1e" and st.compacted_turn is ABSENT and st.journal is ABSENT
    no_url = RunState.from_cbor(dict(run, baseUrl=None))
    assert no_url.base_url is None and "baseUrl" in no_url.to_cbor()
    decided = next(JournalEntry.from_cbor(v) for n, k, v in spec_vectors() if n == "journal-decided")
    assert (decided.state, decided.source, decided.approver) == (OpState.DECIDED, OpSource.HUMAN, "user")
    assert decided.output is ABSENT and "output" not in decided.to_cbor()


def test_a_key_this_version_does_not_know_is_kept() -> None:
    [(_, _, run)] = [v for v in spec_vectors() if v[0] == "run-state-retry"]
    newer = dict(run, someFutureKey=[1, 2])
    st = RunState.from_cbor(newer)
    assert st.extra == (("someFutureKey", [1, 2]),)
    assert encode_object("run", st.to_cbor()).raw == encode_object("run", newer).raw


def test_a_missing_required_key_is_refused() -> None:
    [(_, _, run)] = [v for v in spec_vectors() if v[0] == "run-state-retry"]
    with pytest.raises(KeyError):
        RunState.from_cbor({k: v for k, v in run.items() if k != "status"})


def test_every_state_and_entry_a_real_run_writes_round_trips(tmp_path: Path) -> None:
    """A run with a small and a large (blob) output, an error outcome and a final answer: every run state
    and journal entry in the store, from the first state on, encodes back to its own bytes."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text("line\n" * 600)
    (ws / "small.txt").write_text("hi\n")
    store = MemoryStore("records")
    steps = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "small.txt"}},
                        {"name": "read_file", "arguments": {"path": "big.txt"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}]},
        {"content": "done"},
    ]
    res = Runner(store).start(str(ws), "read", default_agent_definition(steps))
    assert res.status == RunStatus.COMPLETED
    info = SessionStore(store).get(res.session)
    seen = {"run": 0, "journal": 0}
    cur = info.runs[res.run]
    journal = None
    while cur is not None:
        value = store.get(cur, "run")
        check("run", value)
        same_bytes("run", value)
        assert encode_object("run", RunState.from_cbor(value).to_cbor()).id == cur
        seen["run"] += 1
        journal = journal or value.get("journal")
        cur = value.get("previous")
    while journal is not None:
        value = store.get(journal, "journal")
        same_bytes("journal", value)
        assert encode_object("journal", JournalEntry.from_cbor(value).to_cbor()).id == journal
        seen["journal"] += 1
        journal = value.get("previous")
    # 3 ops x (Started, OutcomeKnown, Settled); states: start, 3 turns, 9 journal steps, settled.
    assert seen["journal"] == 9 and seen["run"] >= 10
