"""The run lease across real processes: exclusion, exit 75, takeover, fencing; and its two backends.

Every test drives the installed ``kxen-agent`` console script (or the
library, for the in-process rules) against a state dir of its own, sends
real signals with ``os.kill`` and waits on conditions (files, holder
records, exit codes) with deadlines, never on blind sleeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime import lease as lease_mod
from kxen_agent.runtime.lease import (
    DiskLeaseBackend,
    Lease,
    LeaseBusy,
    LeaseLost,
    MemoryLeaseBackend,
    RenewedHold,
    blocking_reason,
    lease_backend,
    lease_ttl_s,
    start_renewer,
)
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.sessions import NS, SessionStore, UnknownSession
from kxen_agent.session.workspace import inspect_workspace
from kxen_agent.store import LockBusy, RefUpdate, StaleFence, Store, file_lock
from kxen_agent.store.fsio import TracingIO
from kxen_agent.store.memory import MemoryStore
from tests.helpers import Proc as CliProc
from tests.helpers import cli_env, depth, run_kxen, spawn_kxen



# ---------------------------------------------------------------- helpers


def wait_for(cond, what: str, timeout: float = 20.0, step: float = 0.02):
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class Spawned:
    """A spawned kxen-agent with stdout/stderr in files (no pipe to fill up)."""

    def __init__(self, args: list[str], env: dict, cwd: Path, name: str) -> None:
        self.out_path = cwd / f"{name}.out"
        self.err_path = cwd / f"{name}.err"
        with open(self.out_path, "wb") as o, open(self.err_path, "wb") as e:
            self.p = spawn_kxen(args, env=env, cwd=cwd, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        self.pid = self.p.pid

    def wait(self, timeout: float = 30.0) -> int:
        return self.p.wait(timeout)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


class Bench:
    """A state dir, a workspace and a scripted agent in ``tmp_path``."""

    def __init__(self, tmp: Path, steps: list, **policy) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.agent = tmp / "agent.toml"
        (tmp / "steps.json").write_text(json.dumps(steps))
        pol = {"cancel_window_s": 0.5, **policy}
        lines = ['name = "t"', 'provider = "script"', 'script = "steps.json"', 'tools = ["shell"]', "[policy]"]
        lines += [f"{k} = {v}" for k, v in pol.items()]
        self.agent.write_text("\n".join(lines) + "\n")
        self.procs: list[Spawned] = []
        self._n = 0

    def env(self, **extra: str) -> dict:
        return cli_env(self.state, extra)

    def cli(self, *args: str, timeout: float = 60, **env: str) -> CliProc:
        return run_kxen(args, env=self.env(**env), cwd=self.tmp, timeout=timeout, stdin=subprocess.DEVNULL)

    def spawn(self, *args: str, **env: str) -> Spawned:
        self._n += 1
        p = Spawned(list(args), self.env(**env), self.tmp, f"p{self._n}")
        self.procs.append(p)
        return p

    def setup_session(self) -> str:
        r = self.cli("run", "--workspace", str(self.ws), "--task", "setup", "--agent", str(self.agent), "--json")
        assert r.rc == 0, r.err
        return json.loads(r.out)["session"]

    def store(self) -> Store:
        return Store.open(str(self.state))

    def show_run(self, ses: str, run: str) -> dict:
        r = self.cli("run", "show", ses, run, "--json")
        assert r.rc == 0, r.err
        return json.loads(r.out)

    def latest_run(self, ses: str) -> dict:
        r = self.cli("session", "show", ses, "--json")
        assert r.rc == 0, r.err
        return json.loads(r.out)["runs"][-1]

    def holder(self, ses: str) -> dict | None:
        return Lease.holder(self.store(), ses)

    def close(self) -> None:
        for p in self.procs:
            p.kill()


@pytest.fixture
def bench_factory(tmp_path):
    made: list[Bench] = []

    def make(steps: list, **policy) -> Bench:
        b = Bench(tmp_path, steps, **policy)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
    # A SIGKILLed or SIGSTOPped agent leaves its tool's group behind.
    for f in tmp_path.glob("*.pid"):
        try:
            os.killpg(int(f.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def long_tool(tmp: Path, seconds: float, name: str = "tool") -> dict:
    """A shell call that records its pid (= its process group) and sleeps."""
    return {"tool_calls": [{"name": "shell", "arguments": {
        "command": f"echo $$ > {tmp}/{name}.pid; exec sleep {seconds}"}}]}


def tool_pid(tmp: Path, name: str = "tool") -> int:
    def read():
        try:
            text = (tmp / f"{name}.pid").read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text else None

    return wait_for(read, f"{name}.pid to be written by the tool")


def group_files(store: Store, ses: str) -> tuple[bytes | None, ...]:
    """Every file a group's state is read from: ref file, step log, reflog (None: absent)."""
    group = f"sessions/{ses}"
    paths = (store.refs.ref_path(group), store.refs.steps_path(group), store.refs.log_path(group))
    return tuple(Path(p).read_bytes() if Path(p).exists() else None for p in paths)


def library_session(tmp: Path) -> tuple[Store, str]:
    ws = tmp / "libws"
    ws.mkdir()
    store = Store.open(str(tmp / "libstate"))
    info = SessionStore(store).create(default_agent_definition([{"content": "x"}]), inspect_workspace(str(ws)))
    return store, info.id


# ---------------------------------------------------------------- across processes


def test_busy_session_refuses_runs_resolve_rebind_with_75_but_readers_work(bench_factory, tmp_path):
    # The holder's tool outlives the test (SIGTERM ends it): however slow the machine, the
    # readers below run while it holds the lease, and a writer that waited for the lease
    # instead of refusing would hang into run_kxen's timeout (no timed assertion needed).
    b = bench_factory([{"content": "ready"}, long_tool(tmp_path, 3600), {"content": "done"}])
    ses = b.setup_session()
    a = b.spawn("--resume", ses, "--task", "long")
    tool_pid(tmp_path)
    run = b.latest_run(ses)["id"]
    op = b.show_run(ses, run)["journal"][0]["op"]

    busy = [
        ("--resume", ses),
        ("--resume", ses, "--task", "another"),
        ("run", "resolve", ses, run, op, "--output", "x"),
        ("--resume", ses, "--workspace", str(b.ws), "--rebind-workspace"),
    ]
    for args in busy:
        r = b.cli(*args)
        assert r.rc == 75, (args, r.rc, r.err)
        assert f"session {ses} is busy" in r.err
        # The error names the holder: pid, host, run id, since when.
        for part in (f"pid {a.pid}", socket.gethostname(), run, "since "):
            assert part in r.err, (part, r.err)
        assert "\n" not in r.err.strip()

    # Forking, listing, showing and fsck never need the lease. (The fork is
    # taken before the turn in flight: a fork never splits a tool turn.)
    log = b.cli("session", "log", ses, "--json")
    assert log.rc == 0, log.err
    ready = [m["id"] for m in map(json.loads, log.out.splitlines()) if m["content"] == "ready"][0]
    readers = [
        ("session", "show", ses, "--json"),
        ("session", "list", "--json"),
        ("session", "tree", ses),
        ("run", "show", ses, run, "--json"),
        ("session", "fork", ses, "--at", ready, "--json"),
        ("fsck",),
    ]
    if b.cli("session", "export", "--help").rc == 0:
        readers.append(("session", "export", ses, "--output", str(tmp_path / "export.bundle")))
    for args in readers:
        r = b.cli(*args)
        assert r.rc == 0, (args, r.err)
    assert a.p.poll() is None, "the run was disturbed by the readers"
    assert b.show_run(ses, run)["journal"][0]["state"] == "Started"

    os.kill(a.pid, signal.SIGTERM)
    assert a.wait() == 130, a.stderr


def test_holder_sigkilled_mid_tool_frees_session_at_once_and_op_is_unknown(bench_factory, tmp_path):
    b = bench_factory([{"content": "ready"}, long_tool(tmp_path, 3600), {"content": "done"}])
    ses = b.setup_session()
    # A TTL longer than any test: only the holder's death (same host), never the
    # record's expiry, can free the lease for the resume below.
    a = b.spawn("--resume", ses, "--task", "long", KXEN_AGENT_LEASE_TTL_S="3600")
    tool_pid(tmp_path)
    assert b.holder(ses)["pid"] == a.pid
    os.kill(a.pid, signal.SIGKILL)
    a.wait()

    r = b.cli("--resume", ses, "--json")
    assert r.rc == 3, r.err
    res = json.loads(r.out)
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1
    shown = b.show_run(ses, res["run"])
    [entry] = shown["journal"]
    assert (entry["op"], entry["state"], entry["source"]) == (res["unknownOps"][0], "OutcomeUnknown", "recovery")
    assert b.holder(ses) is None
    assert b.cli("fsck").rc == 0


def test_fencing_paused_holder_is_taken_over_and_its_writes_refused(bench_factory, tmp_path):
    b = bench_factory([{"content": "ready"}, long_tool(tmp_path, 2), {"content": "done"}])
    ses = b.setup_session()
    group = f"sessions/{ses}"
    a = b.spawn("--resume", ses, "--task", "long", KXEN_AGENT_LEASE_TTL_S="1")
    tool_pid(tmp_path)
    first = b.holder(ses)
    assert first["pid"] == a.pid and first["locked"] is True

    # Stop A outside the group lock (its renewer takes that lock for an
    # instant three times a second; a holder paused inside it blocks grants).
    store = b.store()
    for _ in range(50):
        os.kill(a.pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{a.pid}/stat").read_text().split(") ")[1][0] == "T", "A to stop")
        try:
            with file_lock(store.refs.lock_path(group), timeout=0.3):
                break
        except LockBusy:
            os.kill(a.pid, signal.SIGCONT)
    else:  # pragma: no cover
        pytest.fail("could not stop A outside the group lock")

    # Wait for the holder record to expire (A cannot renew while stopped).
    wait_for(lambda: b.holder(ses)["expiresNs"] < time.time_ns(), "A's lease to expire", timeout=10)
    assert b.holder(ses)["fence"] == first["fence"]

    # B takes the lease although A still has the fcntl lock, sees the op
    # Started and makes it UNKNOWN.
    r = b.cli("--resume", ses, "--json")
    assert r.rc == 3, r.err
    res = json.loads(r.out)
    assert res["status"] == "input_required" and len(res["unknownOps"]) == 1
    assert store.refs.read(group).fence == first["fence"] + 1
    after_b = group_files(store, ses)
    shown_b = b.show_run(ses, res["run"])
    holder_b = b.holder(ses)

    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=30) == 75, a.stderr
    assert "stale" in a.stderr and "taken over" in a.stderr, a.stderr

    # Nothing A wrote is visible: refs, reflog, run state and holder record
    # are exactly what B left.
    assert group_files(store, ses) == after_b
    assert b.show_run(ses, res["run"]) == shown_b
    assert b.holder(ses) == holder_b
    assert shown_b["journal"][0]["state"] == "OutcomeUnknown"
    assert [e.fence for e in store.refs.reflog(group)][-1] == first["fence"] + 1
    r = b.cli("fsck")
    assert r.rc == 0, r.out + r.err


def _check_no_overlap(store: Store, ses: str) -> list[str]:
    """Each grant's writes are contiguous and belong to one run; fences only rise."""
    log = store.refs.reflog(f"sessions/{ses}")
    fences = [e.fence for e in log]
    assert fences == sorted(fences), f"fences went down in the reflog: {fences}"
    runs_of_fence: dict[int, set[str]] = {}
    seq: list[str] = []
    for e in log:
        if not e.reason.startswith("run "):
            continue
        run = e.reason.split()[1].rstrip(":")
        runs_of_fence.setdefault(e.fence, set()).add(run)
        if not seq or seq[-1] != run:
            seq.append(run)
    assert all(len(v) == 1 for v in runs_of_fence.values()), f"one grant wrote for two runs: {runs_of_fence}"
    assert len(seq) == len(set(seq)), f"runs interleaved in the reflog: {seq}"
    return seq


N_PROCS = 8


def _race_round(b: Bench, args: list[str], go: Path, label: str) -> Spawned:
    procs = [b.spawn(*args) for _ in range(N_PROCS)]
    # Exactly one can hold the lease; it waits on `go` inside its tool, so
    # every other process must have been refused before it can finish.
    wait_for(lambda: sum(p.p.poll() is not None for p in procs) >= N_PROCS - 1,
             f"{label}: {N_PROCS - 1} processes to be refused", timeout=60)
    running = [p for p in procs if p.p.poll() is None]
    assert len(running) == 1, f"{label}: {len(running)} processes still running"
    winner = running[0]
    for p in procs:
        if p is not winner:
            assert p.p.returncode == 75, (label, p.p.returncode, p.stderr)
            assert f"pid {winner.pid}" in p.stderr, (label, p.stderr)
    go.touch()
    assert winner.wait(timeout=30) == 0, (label, winner.stderr)
    return winner


@pytest.mark.slow
def test_eight_processes_racing_to_resume_exactly_one_runs_each_round(bench_factory, tmp_path):
    # Each round is one fresh race of 8 processes; 2 show the rule holds round after round
    # (the next run's lease after a settled one; a third round cost 3 s of CPU for the same
    # race again). KXEN_TEST_LONG=1: 10 rounds.
    rounds = depth(fast=2, long=10)
    steps: list = [{"content": "ready"}]
    for r in range(rounds):
        steps.append({"tool_calls": [{"name": "shell", "arguments": {
            "command": f"while [ ! -e {tmp_path}/go{r} ]; do sleep 0.02; done; echo round {r}"}}]})
        steps.append({"content": f"done {r}"})
    b = bench_factory(steps)
    ses = b.setup_session()
    for r in range(rounds):
        # A run that crashed right after its model call leaves it `running`:
        # something to resume.
        crash = b.cli("--resume", ses, "--task", f"round {r}", KXEN_AGENT_FAULT="provider:after-response")
        assert crash.rc == -signal.SIGKILL, crash.err
        winner = _race_round(b, ["--resume", ses, "--json"], tmp_path / f"go{r}", f"round {r}")
        assert json.loads(winner.stdout)["result"] == f"done {r}"

    store = b.store()
    seq = _check_no_overlap(store, ses)
    assert len(seq) == rounds + 1
    info = SessionStore(store).get(ses)
    states = [store.get(oid, "run") for oid in info.runs.values()]
    assert sorted(s["index"] for s in states) == list(range(rounds + 1))
    assert all(s["status"] == "completed" and s["settled"] for s in states)
    assert b.holder(ses) is None
    assert b.cli("fsck").rc == 0


@pytest.mark.slow
def test_eight_processes_racing_to_start_a_new_task_exactly_one_runs(bench_factory, tmp_path):
    rounds = 2
    steps: list = [{"content": "ready"}]
    for r in range(rounds):
        steps.append({"tool_calls": [{"name": "shell", "arguments": {
            "command": f"while [ ! -e {tmp_path}/go{r} ]; do sleep 0.02; done"}}]})
        steps.append({"content": f"done {r}"})
    b = bench_factory(steps)
    ses = b.setup_session()
    for r in range(rounds):
        winner = _race_round(b, ["--resume", ses, "--task", f"task {r}", "--json"], tmp_path / f"go{r}", f"round {r}")
        assert json.loads(winner.stdout)["result"] == f"done {r}"
    seq = _check_no_overlap(b.store(), ses)
    assert len(seq) == rounds + 1


# ---------------------------------------------------------------- the library


def test_threads_of_one_process_cannot_both_hold_a_session(tmp_path):
    store, ses = library_session(tmp_path)
    for round_ in range(20):
        barrier = threading.Barrier(2)
        got: list[Lease] = []
        refused: list[LeaseBusy] = []

        def take() -> None:
            barrier.wait()
            try:
                got.append(Lease.acquire(store, ses))
            except LeaseBusy as e:
                refused.append(e)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 1 and len(refused) == 1
        assert f"pid {os.getpid()}" in str(refused[0])
        lease = got[0]
        with pytest.raises(LeaseBusy):
            Lease.acquire(store, ses)  # nor can a third thread (this one)
        if round_ < 3:
            # The refused thread closed nothing: another process is still shut out.
            _probe_busy(store, ses)
        lease.release()
    with Lease.acquire(store, ses) as lease:
        assert lease.record.locked


def _probe_busy(store: Store, ses: str) -> None:
    """Another process trying the lease is refused."""
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from kxen_agent.store import Store; from kxen_agent.runtime.lease import Lease, LeaseBusy\n"
         "try: Lease.acquire(Store.open(sys.argv[1]), sys.argv[2])\n"
         "except LeaseBusy: sys.exit(75)\n",
         store.root, ses], capture_output=True, text=True, timeout=30)
    assert probe.returncode == 75, probe.stderr


@pytest.mark.parametrize("backend", ["disk", "memory"])
def test_takeover_after_expiry_fences_out_the_old_holder_in_process(tmp_path, backend):
    store, ses = (library_session if backend == "disk" else memory_session)(tmp_path)
    group = f"sessions/{ses}"
    old = Lease.acquire(store, ses, ttl=0.3)
    assert old.record.locked
    old._stop.set()  # a paused holder: it stops renewing
    old._renewer.join()
    wait_for(lambda: Lease.holder(store, ses)["expiresNs"] < time.time_ns(), "the old lease to expire")

    lost: list[bool] = []
    new = Lease.acquire(store, ses, ttl=0.6, on_lost=lambda: lost.append(True))
    assert new.fence == old.fence + 1
    assert not new.record.locked  # the old holder still has the fcntl lock
    with pytest.raises(StaleFence):
        store.refs.transaction(group, [RefUpdate("x", None, b"\x01" * 32)], reason="stale", fence=old.fence)
    with pytest.raises(LeaseLost):
        old.renew()
    with pytest.raises(LeaseLost):
        old.check()
    new.check()
    # The new holder is alive (pid check), though the holder lock is free now.
    old.release()
    assert Lease.holder(store, ses)["fence"] == new.fence, "the old holder removed the new holder's record"
    with pytest.raises(LeaseBusy):
        Lease.acquire(store, ses)
    # Its renewer picks the fcntl lock up once the old holder let go of it.
    wait_for(lambda: Lease.holder(store, ses)["locked"], "the new holder to take the fcntl lock")
    store.refs.transaction(group, [RefUpdate("x", None, b"\x01" * 32)], reason="ok", fence=new.fence)
    new.release()
    assert Lease.holder(store, ses) is None and not lost
    assert "x" in store.refs.read(group).refs and store.refs.reflog(group)[-1].reason == "ok"


def test_leftovers_of_crashed_holders_never_block(tmp_path):
    store, ses = library_session(tmp_path)
    group = f"sessions/{ses}"
    # A holder process SIGKILLed with the lease: its lock file, its record
    # and a half-written temp record stay behind.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from kxen_agent.store import Store; from kxen_agent.runtime.lease import Lease\n"
         "Lease.acquire(Store.open(sys.argv[1]), sys.argv[2]); print('held', flush=True); time.sleep(60)\n",
         store.root, ses], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LeaseBusy):
        Lease.acquire(store, ses)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    (Path(Lease.record_path(store, ses)).parent / "tmp_0123456789abcdef").write_text("{half")
    assert Lease.holder(store, ses)["pid"] == holder.pid
    with Lease.acquire(store, ses) as lease:  # at once: same host, fcntl lock gone
        assert lease.record.locked

    def forge(**fields) -> None:
        now = time.time_ns()
        rec = {"pid": 1, "host": lease_mod._HOST, "boot": lease_mod._BOOT, "pidns": lease_mod._PIDNS, "pidStart": None,
               "run": "run_forged", "purpose": "run", "sinceNs": now, "fence": store.refs.read(group).fence,
               "expiresNs": now + 60 * 10**9, "ttlMs": 60000, "locked": False}
        rec.update(fields)
        store.io.write_durable(Lease.record_path(store, ses), json.dumps(rec).encode())

    # A taker (no fcntl lock) that died: its pid is gone.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    forge(pid=int(dead.stdout))
    Lease.acquire(store, ses).release()
    # A record whose grant never completed (fence behind the group's).
    forge(pid=os.getppid(), fence=store.refs.read(group).fence - 1)
    Lease.acquire(store, ses).release()
    # A corrupt record.
    store.io.write_durable(Lease.record_path(store, ses), b"{not json")
    Lease.acquire(store, ses).release()
    # A live holder on another host blocks until its expiry, then not.
    forge(host="elsewhere.example", boot="other-boot", expiresNs=time.time_ns() + 60 * 10**9)
    with pytest.raises(LeaseBusy, match="elsewhere.example.*another host"):
        Lease.acquire(store, ses)
    forge(host="elsewhere.example", boot="other-boot", expiresNs=time.time_ns() - 1)
    Lease.acquire(store, ses).release()
    assert Lease.holder(store, ses) is None


def test_rule_and_settings(tmp_path, monkeypatch):
    now = time.time_ns()
    mine = {"pid": os.getpid(), "host": lease_mod._HOST, "boot": lease_mod._BOOT, "pidns": lease_mod._PIDNS,
            "fence": 4, "expiresNs": now + 10**9, "locked": True}
    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True).stdout)
    assert blocking_reason(None, 4, have_fcntl=False, now_ns=now) is None
    assert blocking_reason(mine, 4, have_fcntl=False, now_ns=now) == "it is alive"
    assert blocking_reason(mine, 4, have_fcntl=True, now_ns=now) is None  # fcntl free: dead
    assert blocking_reason(mine, 5, have_fcntl=False, now_ns=now) is None  # superseded
    assert blocking_reason(dict(mine, expiresNs=now - 1), 4, have_fcntl=False, now_ns=now) is None
    assert blocking_reason(dict(mine, locked=False), 4, have_fcntl=True, now_ns=now) == "it is alive"
    # A dead pid frees it even while some other process is mid-grant with the fcntl lock.
    assert blocking_reason(dict(mine, pid=dead_pid), 4, have_fcntl=False, now_ns=now) is None
    assert blocking_reason(dict(mine, pid=dead_pid, locked=False), 4, have_fcntl=False, now_ns=now) is None
    # A pid from another pid namespace proves nothing: alive until expiry.
    other_ns = dict(mine, pid=dead_pid, pidns="pid:[1]")
    assert blocking_reason(other_ns, 4, have_fcntl=False, now_ns=now) == "it is alive"
    assert blocking_reason(dict(other_ns, locked=False), 4, have_fcntl=True, now_ns=now) == "it is alive"
    assert blocking_reason(dict(other_ns, host="h2"), 4, have_fcntl=True, now_ns=now).startswith("it is on another host")

    monkeypatch.delenv("KXEN_AGENT_LEASE_TTL_S", raising=False)
    assert lease_ttl_s() == 30.0
    monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", "2.5")
    assert lease_ttl_s() == 2.5
    for bad in ("abc", "0", "-1"):
        monkeypatch.setenv("KXEN_AGENT_LEASE_TTL_S", bad)
        with pytest.raises(UsageError, match="KXEN_AGENT_LEASE_TTL_S"):
            lease_ttl_s()

    store = Store.open(str(tmp_path / "st"))
    monkeypatch.delenv("KXEN_AGENT_LEASE_TTL_S")
    with pytest.raises(UnknownSession):
        Lease.acquire(store, "ses_0000000000000000")
    assert not os.path.exists(store.refs.ref_path("sessions/ses_0000000000000000"))


# ---------------------------------------------------------------- the backends


def memory_session(tmp: Path) -> tuple[MemoryStore, str]:
    ws = tmp / "memws"
    ws.mkdir()
    store = MemoryStore("lease")
    info = SessionStore(store).create(default_agent_definition([{"content": "x"}]), inspect_workspace(str(ws)))
    return store, info.id


def test_the_disk_lease_makes_the_same_file_operations_and_record(tmp_path):
    """The disk backend's file operations, in order (what fault injection and crash points count), and its record."""
    io = TracingIO(sync=False)
    store = Store(str(tmp_path / "state"), io=io, namespaces=(NS,))  # as the CLI opens it
    (tmp_path / "ws").mkdir()
    ses = SessionStore(store).create(default_agent_definition([{"content": "x"}]), inspect_workspace(str(tmp_path / "ws"))).id
    ops: list[str] = []
    io.hook = lambda op, p: ops.append(f"{op} {p}")
    # Reads of files count; the existence checks (stat) that the seam now
    # sees were made before it too, unseen, so they are left out.
    io.read_hook = lambda op, p: op != "stat" and ops.append(f"r:{op} {p}")
    lease = Lease.acquire(store, ses, run="run_x", ttl=3600)
    record = Path(Lease.record_path(store, ses)).read_bytes()
    ops.append("-- renew")
    lease.renew()
    ops.append("-- busy")
    t = threading.Thread(target=lambda: pytest.raises(LeaseBusy, Lease.acquire, store, ses))
    t.start()
    t.join()
    ops.append("-- release")
    lease.release()
    refs, leases = f"{store.root}/refs/sessions", f"{store.root}/leases/sessions"
    steps = f"{store.root}/steps/sessions"
    # A group's state is its ref file and its step log (§6.8); raising the
    # fence is one record appended to the log, one fsync (the log's name is
    # durable: this store made it when the session was created). The store
    # keeps the log it appended to open, so reading it again is a stat (left out).
    state = [f"r:read {refs}/{ses}"]
    grant = [*state, f"r:read {leases}/{ses}", *state, f"append {steps}/{ses}", f"fsync {steps}/{ses}",
             f"create {leases}/tmp", f"write {leases}/tmp", f"fsync {leases}/tmp", f"rename {leases}/{ses}",
             f"fsync_dir {leases}"]
    renew = [f"create {leases}/tmp", f"write {leases}/tmp", f"fsync {leases}/tmp", *state,
             f"rename {leases}/{ses}", f"fsync_dir {leases}"]
    busy = [f"r:read {leases}/{ses}", *state]
    release = [f"r:read {leases}/{ses}", f"unlink {leases}/{ses}", f"fsync_dir {leases}"]
    assert [re.sub(r"/tmp_[0-9a-f]{16}$", "/tmp", o) for o in ops] == (
        grant + ["-- renew"] + renew + ["-- busy"] + busy + ["-- release"] + release)
    # The record: sorted keys, json's default separators, nothing else.
    rec = json.loads(record)
    assert record == json.dumps(rec, sort_keys=True).encode()
    assert list(rec) == ["boot", "expiresNs", "fence", "host", "locked", "pid", "pidStart", "pidns", "purpose",
                         "run", "sinceNs", "ttlMs"]
    assert (rec["pid"], rec["run"], rec["purpose"], rec["fence"], rec["locked"], rec["ttlMs"]) == (
        os.getpid(), "run_x", "run", 1, True, 3600000)


def test_lease_backends_are_chosen_by_the_store(tmp_path):
    disk = Store(str(tmp_path / "state"))
    mem = MemoryStore()
    assert isinstance(lease_backend(disk), DiskLeaseBackend)
    assert isinstance(lease_backend(mem), MemoryLeaseBackend)
    assert lease_backend(mem) is lease_backend(mem), "every runner over one memory store shares its leases"
    assert lease_backend(MemoryStore()) is not lease_backend(mem)
    with pytest.raises(TypeError, match="no lease backend is known for object"):
        lease_backend(object())  # type: ignore[arg-type]


def test_threads_cannot_both_hold_a_memory_session(tmp_path):
    store, ses = memory_session(tmp_path)
    for _ in range(20):
        barrier = threading.Barrier(2)
        got: list[Lease] = []
        refused: list[LeaseBusy] = []

        def take() -> None:
            barrier.wait()
            try:
                got.append(Lease.acquire(store, ses, run="run_x"))
            except LeaseBusy as e:
                refused.append(e)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 1 and len(refused) == 1
        assert f"pid {os.getpid()}" in str(refused[0]) and "run run_x" in str(refused[0])
        assert refused[0].holder["fence"] == got[0].fence
        with pytest.raises(LeaseBusy):
            Lease.acquire(store, ses)  # nor this thread
        got[0].release()
        assert Lease.holder(store, ses) is None
    with Lease.acquire(store, ses) as lease:
        assert lease.record.locked and lease.fence == 21
        assert store.refs.read(f"sessions/{ses}").fence == 21  # one raise per grant
    with pytest.raises(UnknownSession, match="memory:"):
        Lease.acquire(store, "ses_0000000000000000")




def test_a_hold_ends_its_renewal_once_and_its_renewer_never_waits_for_itself():
    # Both leases (local and remote) release through RenewedHold._end_renewal.
    hold = RenewedHold()
    hold._renewer = start_renewer("kxen-test-hold", 0.03, hold._stop, lambda: None, LeaseLost, lambda: None)
    assert hold._end_renewal() is True
    assert hold.released and hold._stop.is_set() and not hold._renewer.is_alive()  # joined: no renewal after
    assert hold._end_renewal() is False  # idempotent

    # A lost lease released from its own renewer (``on_lost``) must not join itself.
    lost = RenewedHold()
    ended: list[bool] = []

    def renew() -> None:
        raise LeaseLost("ses_test", 1, 2)

    lost._renewer = start_renewer("kxen-test-lost", 0.03, lost._stop, renew, LeaseLost,
                                  lambda: ended.append(lost._end_renewal()))
    lost._renewer.join(10)
    assert ended == [True] and lost.released and not lost._renewer.is_alive()
