"""The cross-machine run lease: a run that may continue on another machine holds the session's lease on the remote.

``kxen-agent run|--resume … --remote-lease [--remote NAME_OR_URL]``. The
local run lease (:mod:`.lease`) keeps two processes of one state dir apart;
this one keeps machines apart that share only the Git remote, through one
more ref there, ``refs/kxen/leases/<ses>`` (``objects_spec.md`` §16.6):

- **claim**, before the run executes anything: the session must exist in
  this state dir (a session id is not a remote locator), and the remote must
  hold what this state dir last saw of it, else the claim is refused in one
  line saying to pull first. A lease ref whose holder has not expired
  refuses with exit 75, naming the holder's host and run (a lease ref past
  its expiry is taken over). The claim is one atomic push, a
  compare-and-swap of both refs: the session ref moves to a commit of the
  local state carrying the new **fence** (one more than any before: it
  only grows), the lease ref to a commit of the holder record (host, pid,
  run, fence, expiry). Of two machines claiming at once exactly one push
  lands.
- **every durable step** of the run (every store step carrying the
  local lease's fence on the session's group) is pushed at once, in one
  atomic push with a renewal of the lease ref, each a compare-and-swap on
  what this holder pushed last: the machine that takes over continues from
  the last durable step, and an operation ``Started`` here is ``UNKNOWN``
  there. A holder that was paused past its expiry and taken over finds
  both refs moved: its next push is refused (the **fence**), it stops with
  exit 75, and nothing it did after losing the lease reaches the remote.
- **renewal** every TTL/3 (``KXEN_AGENT_LEASE_TTL_S``, as the local lease)
  from a background thread; a renewal refused because the lease was taken
  over cancels the run (``on_lost``).
- **release**, when the run returns: one atomic push of the final state and
  the deletion of the lease ref.

Expiry is judged by the claimant's wall clock, so machines must keep their
clocks within TTL/3 of each other (NTP), as hosts sharing a state dir must.
A network failure while pushing a step is retried until the lease would
expire, then stops the run (exit 1): what was durable here stays here.

The runner is unchanged: it is given a store whose fenced steps of the
session call this module around their commit (:class:`RemoteLeaseScope.runner`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from kxen_agent.errors import KxenError
from kxen_agent.session.gitio import Mirror, PushRejected, PushUpdate, RemoteUnreachable, Workbench, resolve_remote
from kxen_agent.session.remote import (
    GroupPlan,
    RemoteHolder,
    RemoteSession,
    lease_ref,
    pull_first,
    read_holder,
    session_ref,
)
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store import Store
from kxen_agent.store.gitmap import lease_commit

from .lease import Lease, RenewedHold, lease_backend, lease_ttl_s, start_renewer
from .runner import Runner

__all__ = ["RemoteLease", "RemoteLeaseBusy", "RemoteLeaseLost", "RemoteLeaseScope", "remote_lease_scope"]

_HOST = socket.gethostname()


class RemoteLeaseBusy(KxenError):
    """Another machine holds the session's remote lease and it has not expired (exit 75, nothing written)."""

    exit_code = 75


class RemoteLeaseLost(KxenError):
    """The remote lease was taken over (this holder paused past its expiry): the fence refused its push (exit 75)."""

    exit_code = 75


class RemoteLease(RenewedHold):
    """A held remote lease of one session: push steps, renew, release (see the module docstring)."""

    def __init__(self, rs: RemoteSession, holder: RemoteHolder, lease_oid: bytes, session_oid: bytes,
                 ttl: float, on_lost: Callable[[], None] | None) -> None:
        self.rs = rs
        self.holder = holder
        self.lease_oid = lease_oid
        self.session_oid = session_oid
        self.ttl = ttl
        self.lost = threading.Event()
        self._on_lost = on_lost
        super().__init__()

    @property
    def ses(self) -> str:
        return self.rs.ses

    # ------------------------------------------------------------ claim

    @classmethod
    def claim(cls, store: Store, ses: str, *, run: str | None, remote: str | None = None,
              ttl: float | None = None, on_lost: Callable[[], None] | None = None) -> "RemoteLease":
        """Claim the lease of ``ses`` on its remote now, or raise (:class:`RemoteLeaseBusy`, ``RemoteRefused``)."""
        ttl = lease_ttl_s() if ttl is None else ttl
        info = SessionStore(store).get(ses)  # UnknownSession: the session must be here
        r = resolve_remote(info.workspace.repo_root, remote, what=f"session {ses}'s workspace {info.workspace.root}")
        bench = Workbench(r, mirror=Mirror(store.root))
        try:
            rs = RemoteSession(store, ses, r, bench)
            lease = cls._claim(rs, run, ttl, on_lost)
        except BaseException:
            bench.close()
            raise
        lease._start_renewer()
        return lease

    @classmethod
    def precheck(cls, store: Store, ses: str, *, remote: str | None = None) -> None:
        """Refuse now, writing nothing, what a claim of ``ses`` would refuse (a live holder, a remote not seen).

        For a claim made later (a new task's, at its first step): the same
        checks are made again then, atomically with the claim.
        """
        info = SessionStore(store).get(ses)
        r = resolve_remote(info.workspace.repo_root, remote, what=f"session {ses}'s workspace {info.workspace.root}")
        with Workbench(r, mirror=Mirror(store.root)) as bench:
            cls._claimable(RemoteSession(store, ses, r, bench))

    @classmethod
    def _claimable(cls, rs: RemoteSession) -> tuple[dict[str, bytes], RemoteHolder | None, bytes | None]:
        """(the remote's refs, its live holder's record if expired, what this state dir last saw), or refuse."""
        r, ses = rs.remote, rs.ses
        live = rs.bench.ls_remote([session_ref(ses), lease_ref(ses)], what="claimed")
        holder = cls._holder(rs, live.get(lease_ref(ses)))
        now = time.time_ns()
        if holder is not None and not holder.expired(now):
            raise _busy(ses, r.display, holder, now)
        there, seen = live.get(session_ref(ses)), rs.seen()
        if there != seen:
            raise pull_first(ses, r, there, seen, "remote lease claim")
        return live, holder, seen

    @classmethod
    def _claim(cls, rs: RemoteSession, run: str | None, ttl: float, on_lost) -> "RemoteLease":
        r, ses = rs.remote, rs.ses
        live, holder, seen = cls._claimable(rs)
        old_lease, there = live.get(lease_ref(ses)), live.get(session_ref(ses))
        now = time.time_ns()
        fence = max(rs.image(there).fence if there else 0, holder.fence if holder else 0) + 1
        plan = rs.plan(seen, fence=fence)
        assert plan is not None
        mine = RemoteHolder(ses, _HOST, os.getpid(), run, fence, now, now + int(ttl * 1e9), int(ttl * 1000))
        lobjs = lease_commit(f"{NS}/{ses}", mine.to_bytes(), old_lease, int(time.time()))
        rs.bench.write(plan.objects + lobjs)
        try:
            rs.bench.push([PushUpdate(session_ref(ses), plan.commit, seen),
                           PushUpdate(lease_ref(ses), lobjs[-1].oid, old_lease)], what="claimed")
        except PushRejected:
            # Another machine's claim (or push) landed between our look and our push.
            live = rs.bench.ls_remote([session_ref(ses), lease_ref(ses)], what="claimed")
            holder = cls._holder(rs, live.get(lease_ref(ses)))
            if holder is not None and not holder.expired(time.time_ns()):
                raise _busy(ses, r.display, holder, time.time_ns()) from None
            raise pull_first(ses, r, live.get(session_ref(ses)), seen, "remote lease claim") from None
        rs.record([plan])
        return cls(rs, mine, lobjs[-1].oid, plan.commit, ttl, on_lost)

    @staticmethod
    def _holder(rs: RemoteSession, commit: bytes | None) -> RemoteHolder | None:
        if commit is None:
            return None
        ref = lease_ref(rs.ses)
        rs.bench.fetch([f"+{ref}:{ref}"], what="claimed")
        return read_holder(rs.bench, commit, rs.ses, f"{rs.remote.display} {ref}")

    # ------------------------------------------------------------ steps and renewals

    def push_state(self, run: str | None = None) -> None:
        """Push the session's refs as they are now, with a renewal of the lease, atomically (after a durable step)."""
        with self._mu:
            self._check()
            plan = self.rs.plan(self.session_oid, fence=self.holder.fence)
            self._push(plan, run=run, deadline=self.holder.expiresNs)

    def renew(self) -> None:
        """Push the lease forward (a new expiry); :class:`RemoteLeaseLost` if it was taken over."""
        with self._mu:
            if self.released:
                return
            self._check()
            self._push(None, run=None, deadline=None)

    def _check(self) -> None:
        if self.lost.is_set():
            raise RemoteLeaseLost(self._lost_line())

    def _lost_line(self) -> str:
        return (f"remote lease of session {self.ses} on {self.rs.remote.display} was taken over by another machine "
                f"(fence {self.holder.fence} is no longer the remote's); this process stopped writing to the remote, "
                f"and what it did after losing the lease is only in this state dir")

    def _push(self, plan: GroupPlan | None, *, run: str | None, deadline: int | None) -> None:
        """One atomic push of ``plan`` (if any) and a renewed lease, compare-and-swap on both; retried on network errors."""
        delay = 0.2
        while True:
            now = time.time_ns()
            h = self.holder
            renewed = RemoteHolder(h.session, h.host, h.pid, run or h.run, h.fence, h.sinceNs,
                                   now + int(self.ttl * 1e9), h.ttlMs)
            lobjs = lease_commit(f"{NS}/{self.ses}", renewed.to_bytes(), self.lease_oid, int(time.time()))
            updates = [PushUpdate(lease_ref(self.ses), lobjs[-1].oid, self.lease_oid)]
            if plan is not None:
                updates.insert(0, PushUpdate(session_ref(self.ses), plan.commit, self.session_oid))
            self.rs.bench.write((plan.objects if plan is not None else []) + lobjs)
            try:
                self.rs.bench.push(updates, what="pushed")
            except PushRejected:
                self.lost.set()
                if self._on_lost is not None:
                    self._on_lost()
                raise RemoteLeaseLost(self._lost_line()) from None
            except RemoteUnreachable:
                # A blip: try again while the lease still holds; past that, stop.
                if deadline is None or time.time_ns() + int(delay * 1e9) >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            break
        self.rs.record([plan] if plan is not None else [])  # the lease commits go to the mirror too
        if plan is not None:
            self.session_oid = plan.commit
        self.lease_oid = lobjs[-1].oid
        self.holder = renewed

    def _start_renewer(self) -> None:
        # A refused renewal has set ``lost`` and called ``on_lost`` already (``_push``).
        self._renewer = start_renewer(f"kxen-remote-lease-{self.ses}", self.ttl, self._stop, self.renew,
                                      RemoteLeaseLost, lambda: None)

    # ------------------------------------------------------------ release

    def release(self) -> None:
        """Push the final state and delete the lease ref, atomically; idempotent, never raises a lost lease."""
        if not self._end_renewal():
            return
        try:
            if self.lost.is_set():
                return
            with self._mu:
                plan = self.rs.plan(self.session_oid, fence=self.holder.fence)
                updates = [PushUpdate(lease_ref(self.ses), None, self.lease_oid)]
                if plan is not None:
                    updates.insert(0, PushUpdate(session_ref(self.ses), plan.commit, self.session_oid))
                    self.rs.bench.write(plan.objects)
                try:
                    self.rs.bench.push(updates, what="released")
                except PushRejected:
                    return  # taken over meanwhile: the new holder's refs stay
                if plan is not None:
                    self.rs.record([plan])
        finally:
            self.rs.bench.close()


def _busy(ses: str, display: str, holder: RemoteHolder, now: int) -> RemoteLeaseBusy:
    return RemoteLeaseBusy(
        f"session {ses} is busy on {display}: its remote lease is held by {holder.line(now)}; nothing was "
        "written — wait for that run to end, or for its lease to expire if its machine died, then pull and retry"
    )


# ---------------------------------------------------------------- the runner's side


class _PushedStep:
    """A step of the leased session, pushed once committed (:meth:`_StepRepository.step`).

    The network calls happen outside the group's lock: on entry before it
    is taken, and after the block has released it; a step used without
    ``with`` makes them around its commit.
    """

    def __init__(self, inner: Any, scope: "RemoteLeaseScope", ses: str) -> None:
        self._inner = inner
        self._scope = scope
        self._ses = ses
        self._entered = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> "_PushedStep":
        self._scope.before_step(self._ses)
        self._inner.__enter__()
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered = False
        self._inner.__exit__(*exc)
        if exc[0] is None and self._inner.state is not None:
            self._scope.after_step(self._ses)

    def commit(self, reason: str) -> Any:
        if self._entered:
            return self._inner.commit(reason)
        self._scope.before_step(self._ses)
        state = self._inner.commit(reason)
        self._scope.after_step(self._ses)
        return state


class _StepRepository:
    """The store as the runner sees it: everything passes through, but the leased session's fenced steps."""

    def __init__(self, store: Store, scope: "RemoteLeaseScope") -> None:
        self._store = store
        self._scope = scope

    def step(self, group: str, *, fence: int | None = None, **kw: Any) -> Any:
        """The store's step; one of the leased session that carries the lease's fence is pushed once committed."""
        inner = self._store.step(group, fence=fence, **kw)
        if fence is None or not group.startswith(f"{NS}/"):
            return inner  # a lease grant (no fence) or another group: nothing to push
        return _PushedStep(inner, self._scope, group[len(NS) + 1:])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class RemoteLeaseScope:
    """The remote lease around one ``run`` or ``--resume``: claimed before anything runs, released at the end."""

    def __init__(self, remote: str | None, ses: str | None, cancel: threading.Event,
                 on_event: Callable[[str], None] = lambda line: None, *, claim_now: bool = True) -> None:
        self.remote = remote
        self.ses = ses
        self.claim_now = claim_now
        self.cancel = cancel
        self.on_event = on_event
        self.store: Store | None = None
        self.lease: RemoteLease | None = None

    def runner(self, store: Store, **kw: Any) -> Runner:
        """A :class:`Runner` over ``store`` whose durable steps reach the remote.

        With ``ses`` and ``claim_now`` (a resume that continues a run: it may
        call the model before it writes anything) the lease is claimed now;
        otherwise at the run's first durable step, before it is written
        (``run`` and a new task: nothing has run yet, and the run has its
        name) — after a check now, for a session that exists, that refuses
        what the claim would, before anything is written.
        """
        self.store = store
        if self.ses is not None and self.lease is None:
            if self.claim_now:
                self._claim(self.ses)
            else:
                RemoteLease.precheck(store, self.ses, remote=self.remote)
        return Runner(_StepRepository(store, self), leases=lease_backend(store), **kw)  # type: ignore[arg-type]

    def _claim(self, ses: str) -> None:
        assert self.store is not None
        # The run the local lease was granted for (a new task's, named at its
        # start), else the one a resume continues: the holder record names it.
        rec = Lease.holder(self.store, ses, backend=lease_backend(self.store))
        run = rec.get("run") if rec and rec.get("run") else _local_run(self.store, ses)
        self.lease = RemoteLease.claim(self.store, ses, run=run, remote=self.remote, on_lost=self.cancel.set)
        self.on_event(f"remote lease of session {ses} claimed on {self.lease.rs.remote.display} "
                      f"(fence {self.lease.holder.fence})")

    def before_step(self, ses: str) -> None:
        if self.lease is None:
            self._claim(ses)  # `run`: the session was just created, nothing has run yet

    def after_step(self, ses: str) -> None:
        if self.lease is not None and ses == self.lease.ses:
            assert self.store is not None
            rec = Lease.holder(self.store, ses, backend=lease_backend(self.store))
            self.lease.push_state(run=rec.get("run") if rec else None)

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()


def _local_run(store: Store, ses: str) -> str | None:
    """The run a resume of ``ses`` continues, for the holder record (None: a new task's run is named later)."""
    best = None
    info = SessionStore(store).get(ses)
    for run, oid in info.runs.items():
        st = store.get(oid, "run")
        if best is None or st["index"] > best[1]:
            best = (run, st["index"])
    return best[0] if best else None


@contextmanager
def remote_lease_scope(enabled: bool, remote: str | None, *, ses: str | None, cancel: threading.Event,
                       claim_now: bool = True, workspace: str | None = None,
                       on_event: Callable[[str], None] = lambda line: None) -> Iterator[RemoteLeaseScope | None]:
    """``--remote-lease``: a :class:`RemoteLeaseScope` for the block (None when not asked for), released after it.

    ``workspace`` (``run``): the directory the new session will be bound to,
    whose remote must resolve before anything is created.
    """
    if not enabled:
        if remote is not None:
            from kxen_agent.errors import UsageError

            raise UsageError("--remote names the remote of --remote-lease; add --remote-lease")
        yield None
        return
    if ses is None and workspace is not None:
        # `run`: a remote that is not there is refused before the session is created.
        resolve_remote(inspect_workspace(workspace).repo_root, remote, what=f"workspace {workspace}")
    scope = RemoteLeaseScope(remote, ses, cancel, on_event, claim_now=claim_now)
    try:
        yield scope
    finally:
        scope.close()
