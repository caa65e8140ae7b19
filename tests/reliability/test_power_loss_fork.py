"""The two-fsync fork under power loss and I/O errors (issue 32 item 2; objects_spec.md §6.8 writing step 2,
§9.3 rules 3, 8 and 12, §10.3).

A fork now costs its own new log's two fsyncs and nothing more: what it names
in its parent's step log that no fsync of its store instance covers, it
carries in its own record (rather than fsync the parent's log and its
directory), and a store instance that finds the state dir's settled marker
skips the fsyncs of the state dir and its parent. The workload
(:class:`SettledForkAfterDeath`) is the hardest case of that path: the
parent's writer died between its append and the append's fsync, and the
state dir is settled, so the trace holds no fsync but the forks' own. Every
crash state opens, is fsck-clean, is old or new, and every fork's history
reads; a fork that neither carries nor syncs is caught; every operation
failing leaves a store that forks again. The fallback past the carry bound
(:class:`_PastTheCarryBound`: the parent's log fsynced instead) is
``test_power_loss.py``'s: its mutant that skips that fsync is caught, and
the real store's crash states are clean.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import Store
from kxen_agent.store import refs as refs_mod
from kxen_agent.store.fsio import TracingIO

from .crashsim import FastIO, explore, long_mode, open_store
from .workloads import ForkAfterDeathWorkload, inject_faults


class SettledForkAfterDeath(ForkAfterDeathWorkload):
    """fork-after-death in a settled state dir: the forks' fsyncs are their new logs' alone."""

    name = "fork-settled"

    def setup(self, top: str, aux: str) -> None:
        super().setup(top, aux)
        # A fork at a message once, so that the positions cache's directories exist (their first
        # making is the cache's, not the fork's); then settled as the state dir is now: a store
        # instance marks it after its first committed step (a throwaway fork).
        SessionStore(open_store(os.path.join(top, "state"), io=FastIO())).fork(self.parent, at=self.first)
        SessionStore(open_store(os.path.join(top, "state"), io=FastIO())).fork(self.parent)
        store = open_store(os.path.join(top, "state"), io=FastIO())
        assert os.path.exists(store._settled_marker())

    def run(self, store: Store) -> Any:
        out = super().run(store)
        if isinstance(store.io, TracingIO):
            # The trace's fsyncs (the dying writer died before its one): the forks', in order.
            self.fsyncs = [(op.kind, re.sub(r"tmp_[0-9a-f]{16}$", "tmp", os.path.relpath(op.path, store.root)))
                           for op in store.io.trace if op.kind in ("fsync", "fsync_dir")]
        return out


class _PastTheCarryBound(ForkAfterDeathWorkload):
    """fork-after-death with a carry bound of 0: the fork fsyncs the parent's log instead (the fallback)."""

    name = "fork-past-carry-bound"

    def run(self, store: Any) -> Any:
        saved = refs_mod.CARRY_MAX_OBJECTS
        refs_mod.CARRY_MAX_OBJECTS = 0
        try:
            return super().run(store)
        finally:
            refs_mod.CARRY_MAX_OBJECTS = saved


def test_every_crash_state_of_a_settled_fork_after_its_parents_writer_died_is_clean() -> None:
    w = SettledForkAfterDeath()
    rep = explore(w)
    print(rep.line())
    # The dying writer's (a log it found: steps/sessions once, then it died before its append's fsync);
    # then two forks (at the head, at the first message), each a new log: temp file, steps/sessions.
    assert w.fsyncs == [("fsync_dir", "steps/sessions")] + [("fsync", "steps/sessions/tmp"),
                                                             ("fsync_dir", "steps/sessions")] * 2, w.fsyncs
    assert rep.ops > 10 and rep.crash_points + rep.skipped == rep.ops + 1
    assert rep.by_policy.get("sync") == rep.crash_points
    assert rep.by_policy.get("kill", 0) > 0 and rep.by_policy.get("meta", 0) > 0 and rep.recovered > 0
    assert rep.failures == [], "\n".join(rep.failures[:20])


def test_a_fork_that_neither_carries_nor_syncs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The mutant: nothing carried, and nothing fsynced either (the copies "made").
    monkeypatch.setattr(refs_mod.RefStore, "_copies", lambda self, named, carried, own: [])
    rep = explore(SettledForkAfterDeath(), long=False, stop_when=lambda f: "missing-object" in f)
    assert any("missing-object" in f for f in rep.failures), rep.line()


def test_every_operation_of_a_settled_fork_failing_leaves_a_store_that_forks_again() -> None:
    rep = inject_faults(SettledForkAfterDeath(), rotate=not long_mode())
    print(rep.line())
    assert rep.total_ops > 5
    assert rep.faults >= rep.trials - rep.unfired and rep.unfired <= rep.trials // 10
    assert rep.failures == [], "\n".join(rep.failures[:20])
