"""The checkpoint policy's path under power loss and I/O errors (issue #32, item 3; objects_spec.md §6.8.2).

The policy's pass (:class:`CheckpointWorkload`): a session whose step log
is past the bound and a state dir holding small packs one short of
``MERGE_PACKS``; the pass packs the log's objects (one small pack),
checkpoints the group (reflog, ref file, the log's new generation), then
merges the small packs into one and removes them (each index first). Every
crash state of that trace, under every policy of :mod:`.crashsim`, opens,
is fsck-clean, is old or new, loses no object and moves no ref; running the
pass again finishes it. Every operation failing (ENOSPC, EIO; once and from
then on) leaves a consistent store that finishes the job.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from kxen_agent.runtime.runner import Runner
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import Store
from kxen_agent.store.autopack import MERGE_PACKS, AutoPacker
from kxen_agent.store.fold import pack_objects

from kxen_agent.store.fsio import TracingIO

from .crashsim import FastIO, Workload, explore, long_mode, open_store
from .workloads import _completed_session, inject_faults

#: The bound this workload's packer is given: the setup's log is past it.
BOUND = 8


class CheckpointWorkload(Workload):
    """One pass of the checkpoint policy: a log past the bound folded, then the small packs merged."""

    name = "checkpoint"

    def setup(self, top: str, aux: str) -> None:
        ws = os.path.join(aux, "ws")
        os.makedirs(ws, exist_ok=True)
        store = open_store(os.path.join(top, "state"), io=FastIO())
        self.live = _completed_session(store, ws)
        res = Runner(store).resume(self.live, task="more work: the log past the bound")
        assert res.status == "completed", res
        # Small packs one short of a merge: the pass's own pack makes MERGE_PACKS of them.
        for i in range(MERGE_PACKS - 1):
            oid = store.put("blob", b"small pack %d" % i)
            pack_objects(store, [oid], store.loose.read_raw)
        self.group = f"sessions/{self.live}"
        state, log = store.refs.read_with_log(self.group)
        assert log is not None and len(log.records) >= BOUND
        self.refs = dict(state.refs)
        store.steps.scan_all()
        self.before = set(store.steps.iter_ids()) | {o for p in store.packs for o in p.iter_ids()} | set(
            store.loose.iter_ids())

    def _pass(self, store: Store) -> Any:
        store.refs.read(self.group)  # the run's store has read its session's log: the policy counts from memory
        packer = AutoPacker(store, 1_000_000, background=False, checkpoint_records=BOUND)
        assert packer.over_bound() == [self.group]
        return packer.between_turns()

    def run(self, store: Store) -> Any:
        rep = self._pass(store)
        assert rep is not None and rep.checkpoint and rep.folded == 1 and rep.merged == MERGE_PACKS, rep
        return rep

    def recover(self, store: Store) -> None:
        self.verify_objects(store)  # nothing is lost at any crash point, before the pass runs again
        packer = AutoPacker(store, 1_000_000, background=False, checkpoint_records=BOUND)
        store.refs.read(self.group)
        if packer.over_bound():
            packer.between_turns()
        self.verify(store)

    def verify_objects(self, store: Store) -> None:
        ss = SessionStore(store)
        info = ss.get(self.live)
        assert store.refs.read(self.group).refs == self.refs, "the pass moved a ref"
        ss.history(info.head)
        for oid in self.before:
            store.read_raw(oid)  # MissingObject if the pass lost it

    def verify(self, store: Store) -> None:
        self.verify_objects(store)
        _, log = store.refs.read_with_log(self.group)
        assert log is None or len(log.records) < BOUND, "the log is still past the bound"


@pytest.mark.slow
def test_every_crash_state_of_a_checkpoint_pass_opens_is_clean_and_is_old_or_new() -> None:
    rep = explore(CheckpointWorkload())
    print(rep.line())
    assert rep.ops > 10 and rep.crash_points + rep.skipped == rep.ops + 1
    assert rep.by_policy.get("sync") == rep.crash_points
    assert rep.by_policy.get("kill", 0) > 0 and rep.by_policy.get("meta", 0) > 0 and rep.recovered > 0
    assert rep.failures == [], "\n".join(rep.failures[:20])


@pytest.mark.slow
def test_every_operation_of_a_checkpoint_pass_failing_leaves_a_store_that_finishes_it() -> None:
    rotate = not long_mode()
    rep = inject_faults(CheckpointWorkload(), rotate=rotate)
    print(rep.line())
    assert rep.total_ops > 10
    assert rep.trials == rep.total_ops * (1 if rotate else 4)
    assert rep.faults >= rep.trials - rep.unfired and rep.unfired <= rep.trials // 20
    assert rep.failures == [], "\n".join(rep.failures[:20])


class RemovesPackBeforeIndex(TracingIO):
    """A store whose merge removes a small pack's ``.pack`` before its ``.idx`` (§11: the index is the
    pack's commit point, so it goes first): a crash between leaves an index naming a missing pack."""

    def unlink(self, path: str) -> None:
        if path.endswith(".idx") and os.path.basename(os.path.dirname(path)) == "pack":
            try:
                super().unlink(path[: -len(".idx")] + ".pack")
            except FileNotFoundError:
                pass
        super().unlink(path)


@pytest.mark.slow
def test_the_simulator_catches_a_merge_that_removes_a_pack_before_its_index() -> None:
    rep = explore(CheckpointWorkload(), io_factory=RemovesPackBeforeIndex, policies=("kill",), subsets=False)
    assert rep.failures, "a merge removing packs before their indexes went unseen"
