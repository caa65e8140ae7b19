"""The checkpoint policy (issue #32, item 1): a run keeps its session's step log bounded, losing nothing.

Real state dirs and the real runner; record and pack counts, never times.
Automatic packing checkpoints a log this store has read once it holds
``checkpoint_records`` records (objects_spec.md §6.8.2): its objects go into
a small pack, its records into the ref file; small packs are merged once
there are ``MERGE_PACKS`` of them. Every object stays readable, every ref
where it was, fsck clean.
"""

from __future__ import annotations

from pathlib import Path

from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import Store, fsck
from kxen_agent.store.autopack import MERGE_PACKS, AutoPacker
from kxen_agent.store.fsio import FileIO
from tests.store.test_autopack import all_objects_read, outside_ids, run_calls


def records(store: Store, group: str) -> int:
    _, log = Store(store.root, io=FileIO(), namespaces=(NS,)).refs.read_with_log(group)
    return 0 if log is None else len(log.records)


def test_a_run_keeps_its_step_log_under_the_bound_and_loses_nothing(tmp_path: Path) -> None:
    # 60 calls (~240 records) with a bound of 24 and the threshold far away: only the policy folds.
    store, runner, ses, _ = run_calls(tmp_path, 60, 100_000, background=False, checkpoint_records=24)
    reps = runner.autopack.reports
    assert reps and all(r.checkpoint for r in reps), reps
    assert sum(r.folded for r in reps) >= 8  # ~240 records / 24
    # Small packs merged: never MERGE_PACKS of them left, and at least one merge happened.
    assert any(r.merged for r in reps)
    small = [p for p in Store(store.root, io=FileIO()).packs if p.count < 6700]
    assert len(small) < MERGE_PACKS
    # The session's log holds at most the bound plus one turn's records (the pass runs between turns).
    assert records(store, f"{NS}/{ses}") <= 24 + 8
    fresh = Store(store.root, io=FileIO(), namespaces=(NS,))
    rep = fsck(fresh)
    assert rep.clean, rep.problems
    sessions = SessionStore(fresh)
    info = sessions.get(ses)
    assert sessions.message_count(info) == len(sessions.history(info.head)) == 10 + 2 * 60 + 2
    all_objects_read(store, outside_ids(store) | {oid for p in fresh.packs for oid in p.iter_ids()})
    # The checkpoint passes are routine upkeep: they tell the user nothing.
    assert all(r.line() == "" for r in reps)


def test_in_the_background_the_policy_overlaps_the_turns(tmp_path: Path) -> None:
    store, runner, ses, _ = run_calls(tmp_path, 40, 100_000, checkpoint_records=16)
    reps = runner.autopack.reports
    assert reps and any(r.background and r.folded for r in reps), reps
    assert records(store, f"{NS}/{ses}") <= 16 + 8 * 3  # a pass may still run while the last turns commit
    assert fsck(Store(store.root, io=FileIO(), namespaces=(NS,))).clean


def test_the_policy_is_off_with_automatic_packing(tmp_path: Path) -> None:
    # KXEN_AGENT_AUTOPACK=0 (threshold 0) turns every pass off, the policy's too.
    packer = AutoPacker(Store(str(tmp_path / "s")), 0)
    assert packer.checkpoint_records == 0 and packer.over_bound() == []
    store, runner, ses, _ = run_calls(tmp_path, 20, 100_000, background=False, checkpoint_records=0)
    assert runner.autopack.reports == []
    assert records(store, f"{NS}/{ses}") > 60
