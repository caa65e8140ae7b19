"""Kill torture and lease torture: real ``kxen-agent`` processes, killed, paused and resumed.

Two harnesses from issue 7 (items 1 and 4), shared by the normal test suite
(a fast, time-bounded subset) and a long mode run by hand::

    python -m tests.reliability.torture --trials 3000 [--seed S] [--workers 2] [--lease-rounds 20]

**Kill torture** (:class:`KillTrial`). Each trial writes a scripted agent
whose turns make several side-effecting calls — ``shell`` calls that append a
token unique to the call (``k<seed>-r0-t<turn>-c<n>``) to an effects file
outside the workspace, ``write_file`` calls that create a file holding their
token — and some ``read_file`` calls. It starts the run, SIGKILLs it after a
delay drawn from the trial's seeded RNG (a few ms up to the run's measured
typical duration) or lets a random ``KXEN_AGENT_FAULT`` point kill it, and
resumes (``--resume SES``, also killed at random) until the run is terminal.
An UNKNOWN operation is resolved the way a human would: read ``run show
--json``, wait until no process of the killed tool is still running, look the
call's token up in the effects file (or the written file) and ``run resolve``
it "verified: present", or ``--is-error`` "verified: not run". After every
trial :func:`check_run` checks the invariants: fsck clean; every run state
and op any earlier ``run show`` reported is still there (the state ids are
ancestors of the final one, no op went backwards), every history seen is a
prefix of the final one; each token appears at most once, exactly once for
each op that is OutcomeKnown/Settled from the tool, and as the human said for
a resolved op; each tool result is in the history exactly once per call id,
equal to the journal's outcome; every exit is ``completed`` (settled) or
``input_required`` with an UNKNOWN op.

**Lease torture** (:class:`LeaseTorture`). Eight or more processes keep
trying to resume one session's run, round after round, with a small
``KXEN_AGENT_LEASE_TTL_S``; meanwhile the harness SIGSTOPs the holder past
its expiry (outside the group lock) until another process has taken the
lease over, then SIGCONTs it, or SIGKILLs the holder. Checked: the reflog's
fences never go down and every grant raises it by one (so each lease's
writes are contiguous and no two leases overlap), a refused process never
got a grant, a fenced-out holder exits 75 (StaleFence/LeaseLost) or had
already made its last write, and no write under its fence appears after the
takeover; every round's run completes with each side effect at most once;
fsck is clean.

**How processes are started.** The CLI takes ~0.5 s of CPU just to import,
which on two cores would leave a minute for a dozen trials and make most
short kill delays land in the import. So a worker imports
``kxen_agent.cli.main`` once and *forks* a child per command that calls
``main(argv)`` with its own environment, working directory and output files
— a real process that receives real signals and leaves nothing in the
parent (the parent never opens a store before forking: every read is a
child too). A seeded fraction of trials (``--exec-fraction``) runs the
installed console script instead, so the interpreter start path stays
covered. Children are waited for with pidfds: a kill delay is exact and no
loop sleeps blind.

Randomness is seeded (trial seeds derive from ``--seed``; a failing trial
prints its seed and keeps its directory; ``--trial-seed`` replays one
trial's script, kills and fault points — the kill moments still depend on
timing).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # run as a script from elsewhere
    sys.path.insert(0, _ROOT)

from tests.helpers import cli_env, git_workspace, read_lines, spawn_kxen, tool_result_counts, write_agent  # noqa: E402

__all__ = [
    "KillFigures",
    "KillTrial",
    "LeaseTorture",
    "Launcher",
    "check_run",
    "reflog_violations",
    "kill_torture",
    "lease_torture",
    "main",
]

FINAL = "all done"
VERDICT_PRESENT = "verified: present"
VERDICT_ABSENT = "verified: not run"
#: A call's side-effect token: trial seed, round, turn, call.
TOKEN_RE = re.compile(r"\bk\d+-r\d+-t\d+-c\d+\b")
FAULT_POINTS = (
    "provider:after-response",
    "tool:after-started",
    "tool:after-effect",
    "tool:after-outcome",
    "tool:after-turn",
    "run:after-result",
    "run:after-final-message",
)
RANK = {"Started": 0, "OutcomeUnknown": 1, "OutcomeKnown": 2, "Settled": 3}
#: No CLI command of these workloads takes anywhere near this; past it the process hung.
HANG_S = 60.0


# ====================================================================== processes


@dataclass(frozen=True)
class Done:
    """A finished CLI process."""

    args: tuple[str, ...]
    rc: int
    out: str
    err: str
    killed: bool  # we sent it SIGKILL while it was running

    def json(self) -> Any:
        return json.loads(self.out)

    def jsonl(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __str__(self) -> str:
        return f"kxen-agent {' '.join(self.args)} -> rc {self.rc}; stdout {self.out[-400:]!r}; stderr {self.err[-600:]!r}"


class Child:
    """A started CLI process (forked or exec'd); reaped only by :meth:`poll`/:meth:`wait`.

    Until it is reaped its pid cannot be reused, so signalling it is always
    safe — the reason the launcher does its own reaping.
    """

    def __init__(self, pid: int, popen: subprocess.Popen | None, args: Sequence[str], out: Path, err: Path) -> None:
        self.pid = pid
        self.args = tuple(args)
        self._popen = popen
        self._out = out
        self._err = err
        self.rc: int | None = None
        self.killed = False
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # pragma: no cover - old kernel: fall back to polling
            self._pidfd = None

    def poll(self) -> int | None:
        if self.rc is None:
            if self._popen is not None:
                self.rc = self._popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.rc = os.waitstatus_to_exitcode(status)
            if self.rc is not None and self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.rc

    def wait_until(self, deadline: float) -> int | None:
        """The exit code, or None if still running at ``deadline`` (monotonic)."""
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self._pidfd is not None:
                p = select.poll()
                p.register(self._pidfd, select.POLLIN)
                p.poll(max(1, int(left * 1000)))
            else:  # pragma: no cover
                time.sleep(min(left, 0.002))
        return self.rc

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if it is still running (unreaped); True if sent."""
        if self.poll() is not None:
            return False
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.killed = True
        return True

    def finish(self, timeout: float = HANG_S) -> Done:
        """Wait (killing it if it hangs past ``timeout``) and collect its output."""
        rc = self.wait_until(time.monotonic() + timeout)
        hung = rc is None
        if hung:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            rc = self.wait_until(time.monotonic() + 10)
        out = self._out.read_text(errors="replace") if self._out.exists() else ""
        err = self._err.read_text(errors="replace") if self._err.exists() else ""
        for p in (self._out, self._err):
            p.unlink(missing_ok=True)
        if hung:
            err += f"\n[harness: hung for {timeout:.0f}s, killed]"
            rc = -999
        return Done(self.args, rc if rc is not None else -999, out, err, self.killed)


def _fork_child(args: Sequence[str], env: Mapping[str, str], cwd: str, out: Path, err: Path) -> None:
    """In the forked child: become ``kxen-agent ARGS`` (minus the interpreter start) and exit."""
    code = 70
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        os.close(null)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
        os.environ.clear()
        os.environ.update(env)
        from kxen_agent.cli.main import main as cli_main

        code = cli_main(list(args))
    except SystemExit as e:  # pragma: no cover - main() maps these itself
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # pragma: no cover - a harness bug, shown in stderr
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Launcher:
    """Starts CLI processes for one state dir's worth of commands; see the module docstring."""

    def __init__(self, scratch: Path) -> None:
        import kxen_agent.cli.main  # noqa: F401  (preloaded once; every fork starts warm)

        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self._n = 0
        # pid -> how many CLI processes got it: pids are reused, so a check
        # that names a process by pid judges only those started once.
        self.started: Counter = Counter()
        self.base_env = cli_env()

    def spawn(self, args: Sequence[str], env: Mapping[str, str], cwd: Path, *, exec_: bool = False) -> Child:
        self._n += 1
        out = self.scratch / f"c{os.getpid()}-{self._n}.out"
        err = self.scratch / f"c{os.getpid()}-{self._n}.err"
        full = dict(self.base_env)
        full.update(env)
        if exec_:
            with open(out, "wb") as o, open(err, "wb") as e:
                p = spawn_kxen(args, env=full, cwd=cwd, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
            self.started[p.pid] += 1
            return Child(p.pid, p, args, out, err)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            _fork_child(args, full, str(cwd), out, err)
        self.started[pid] += 1
        return Child(pid, None, args, out, err)

    def run(self, args: Sequence[str], env: Mapping[str, str], cwd: Path, *, exec_: bool = False,
            kill_after: float | None = None) -> Done:
        """Run to the end, or SIGKILL it ``kill_after`` seconds after the start if still running."""
        child = self.spawn(args, env, cwd, exec_=exec_)
        if kill_after is not None and child.wait_until(time.monotonic() + kill_after) is None:
            child.signal(signal.SIGKILL)
        return child.finish()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a forked child (so the parent never opens a store); its JSON result."""
        self._n += 1
        res = self.scratch / f"f{os.getpid()}-{self._n}.json"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            code = 0
            try:
                res.write_text(json.dumps({"ok": fn(*args)}))
            except BaseException:
                res.write_text(json.dumps({"error": traceback.format_exc()}))
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        doc = json.loads(res.read_text()) if res.exists() else {"error": f"child status {status}"}
        res.unlink(missing_ok=True)
        if "error" in doc:
            raise RuntimeError(doc["error"])
        return doc["ok"]


def _run_state_chain(state_dir: str, head_hex: str) -> list[str]:
    """Every run state id from ``head_hex`` back through ``previous`` (in a forked child)."""
    from kxen_agent.store import Store

    store = Store.open(state_dir)
    out: list[str] = []
    cur: bytes | None = bytes.fromhex(head_hex)
    while cur is not None:
        out.append(cur.hex())
        cur = store.get(cur, "run").get("previous")
    return out


def tool_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line mentions ``marker`` (a killed run's orphaned tools)."""
    pids = []
    needle = marker.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(d))
        except OSError:
            continue
    return pids


def wait_tools_gone(marker: str, timeout: float = 30.0) -> bool:
    """Wait until no tool of a killed run is still running: only then is its effect final.

    A shell tool runs in its own session, so SIGKILLing kxen-agent leaves it
    running; a human checking the effect before it ends could see "not run"
    for a call that then takes effect. A zombie has an empty command line, so
    an exited tool no longer counts.
    """
    deadline = time.monotonic() + timeout
    while tool_processes(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# ====================================================================== the human and the checks


def verify_effect(tool: str, arguments: str, effects: Path, ws: Path) -> bool:
    """What a human establishes for an UNKNOWN op: did its side effect happen?"""
    args = json.loads(arguments)
    if tool == "shell":
        m = TOKEN_RE.search(args["command"])
        assert m, args
        return m.group(0) in read_lines(effects)
    if tool == "write_file":
        p = ws / args["path"]
        return p.is_file() and p.read_text() == args["content"]
    raise AssertionError(f"no side effect to verify for {tool}")


def resolve_args(ses: str, run: str, op: str, present: bool) -> list[str]:
    if present:
        return ["run", "resolve", ses, run, op, "--output", VERDICT_PRESENT]
    return ["run", "resolve", ses, run, op, "--output", VERDICT_ABSENT, "--is-error"]


@dataclass
class Seen:
    """What the CLI reported during a trial: each of it must still be there at the end."""

    ops: dict[str, list[dict]] = field(default_factory=dict)  # op -> entries seen, in order
    states: list[str] = field(default_factory=list)  # run state ids shown
    logs: list[list[tuple[str, int]]] = field(default_factory=list)  # (message id, seq) lists
    unknown_reported: set[str] = field(default_factory=set)  # ops an exit-3 result named
    resolved: set[str] = field(default_factory=set)  # ops a `run resolve` acknowledged (exit 0)

    def show(self, doc: dict) -> None:
        if not self.states or self.states[-1] != doc["state"]:
            self.states.append(doc["state"])
        for j in doc["journal"]:
            seen = self.ops.setdefault(j["op"], [])
            if not seen or seen[-1] != j:
                seen.append(j)

    def log(self, log: list[dict]) -> None:
        ids = [(m["id"], m["seq"]) for m in log]
        if not self.logs or self.logs[-1] != ids:
            self.logs.append(ids)


def check_run(show: dict, log: list[dict], *, seen: Seen, chain: list[str] | None, verdicts: Mapping[str, bool],
              effects: Path, ws: Path, calls: Sequence[dict], run: str) -> list[str]:
    """The invariants of one finished run (its final ``run show``, the session history); [] if all hold.

    ``calls`` are the tool calls the script made in this run, in order; ``verdicts`` the
    human's finding per resolved op; ``chain`` the run state ids back from the final one.
    """
    bad: list[str] = []

    def want(cond: bool, what: str) -> None:
        if not cond:
            bad.append(what)

    want(show["status"] == "completed" and show["settled"] and show["result"] == FINAL,
         f"run ended {show['status']} settled={show['settled']} result={show['result']!r}")
    journal = {j["op"]: j for j in show["journal"]}

    # Every acknowledged record is still there and never went backwards.
    if chain is not None:
        missing = [s for s in seen.states if s not in set(chain)]
        want(not missing, f"run states shown earlier are not ancestors of the final state: {missing}")
    for op, entries in seen.ops.items():
        final = journal.get(op)
        if final is None:
            bad.append(f"op {op} seen earlier ({entries[-1]['state']}) is gone from the journal")
            continue
        history = entries + [final]
        for a, b in zip(history, history[1:]):
            if RANK[b["state"]] < RANK[a["state"]]:
                bad.append(f"op {op} went back from {a['state']} to {b['state']}")
            if (a["tool"], a["arguments"], a["callId"]) != (b["tool"], b["arguments"], b["callId"]):
                bad.append(f"op {op} changed its call: {a} -> {b}")
            if a["state"] in ("OutcomeKnown", "Settled") and (a["source"], a["outcome"]) != (b["source"], b["outcome"]):
                bad.append(f"op {op}'s known outcome changed: {a} -> {b}")
        if any(e["state"] == "OutcomeUnknown" for e in entries) and final["source"] != "human":
            bad.append(f"op {op} was UNKNOWN but ended with source {final['source']}, not a human's resolution")
    for op in seen.unknown_reported | seen.resolved:
        want(op in journal and journal[op]["source"] == "human", f"op {op} reported UNKNOWN or resolved is not a human's")

    # One op per call, each call of the script journaled once.
    by_call = Counter(j["callId"] for j in journal.values())
    want(all(n == 1 for n in by_call.values()), f"a call has several ops: {dict(by_call)}")

    def canon(tool: str, args: Any) -> tuple[str, str]:
        return tool, json.dumps(json.loads(args) if isinstance(args, str) else args, sort_keys=True)

    want(sorted(canon(j["tool"], j["arguments"]) for j in journal.values())
         == sorted(canon(c["name"], c["arguments"]) for c in calls),
         f"journaled calls differ from the script's: {[(j['tool'], j['arguments']) for j in journal.values()]}")
    want(len(journal) == len(calls), f"{len(journal)} ops journaled for {len(calls)} calls")

    # Side effects: at most once; exactly once when the tool's outcome is known; as the human found.
    lines = Counter(read_lines(effects))
    mine = {m.group(0) for c in calls if c["name"] == "shell" for m in [TOKEN_RE.search(c["arguments"]["command"])]}
    for tok, n in lines.items():
        if tok in mine:
            want(n == 1, f"side effect {tok} ran {n} times")
    shell_tokens = set()
    for op, j in journal.items():
        if j["tool"] not in ("shell", "write_file"):
            continue
        args = json.loads(j["arguments"])
        if j["tool"] == "shell":
            tok = TOKEN_RE.search(args["command"]).group(0)
            shell_tokens.add(tok)
            happened = lines[tok] >= 1
        else:
            p = ws / args["path"]
            happened = p.is_file() and p.read_text() == args["content"]
        if j["source"] == "tool" and j["state"] in ("OutcomeKnown", "Settled"):
            want(happened, f"op {op} ({j['tool']}) is {j['state']} from the tool but its effect is missing")
            want(j["outcome"] is not None and not j["outcome"]["isError"], f"op {op} failed: {j['outcome']}")
        elif j["source"] == "human":
            found = verdicts.get(op)
            want(found is not None, f"op {op} resolved by a human the harness does not know of")
            if found is not None:
                want(happened == found, f"op {op}: the human found effect={found}, at the end effect={happened}")
                want(j["outcome"] == {"output": VERDICT_PRESENT if found else VERDICT_ABSENT, "isError": not found},
                     f"op {op}: resolved outcome {j['outcome']} is not the human's")
    want(mine == shell_tokens, f"calls never journaled: {sorted(mine - shell_tokens)}")

    # The history: each tool result exactly once per call id, equal to the journal's outcome.
    run_log = [m for m in log if m["run"] == run]
    asked, results = tool_result_counts(run_log)
    want(len(asked) == len(set(asked)) == len(calls), f"calls asked in the history: {asked}")
    want({c: results[c] for c in asked} == {c: 1 for c in asked} and set(results) == set(asked),
         f"tool results per call id: {dict(results)} for {asked}")
    outcome = {j["callId"]: (j["outcome"] or {}).get("output") for j in journal.values()}
    for m in run_log:
        if m["role"] == "tool":
            want(m["content"] == outcome.get(m["toolCallId"]),
                 f"history result of {m['toolCallId']} {m['content'][:80]!r} != journal {str(outcome.get(m['toolCallId']))[:80]!r}")
    want([m["seq"] for m in log] == list(range(len(log))), "history seq numbers are not 0..n-1")
    finals = [m for m in run_log if m["role"] == "assistant" and not m["toolCalls"] and m["content"] == FINAL]
    want(len(finals) == 1 and run_log and run_log[-1] is finals[0], f"{len(finals)} final messages")
    contents = [(m["content"], tuple(c["id"] for c in m["toolCalls"])) for m in run_log if m["role"] == "assistant"]
    want(len(contents) == len(set(contents)), "an assistant turn was recorded twice")
    ids = [(m["id"], m["seq"]) for m in log]
    for earlier in seen.logs:
        if ids[: len(earlier)] != earlier:
            bad.append(f"a history shown earlier ({len(earlier)} messages) is not a prefix of the final one")
            break
    return bad


# ====================================================================== kill torture


def make_script(rng: random.Random, seed: int, effects: Path, rnd: int = 0, *,
                turns: tuple[int, int] = (2, 4), first_shell: bool = False) -> tuple[list[dict], list[dict]]:
    """(steps, calls): a random script of side-effecting turns ending in ``FINAL``."""
    steps: list[dict] = []
    calls: list[dict] = []
    written: list[str] = []
    for t in range(rng.randint(*turns)):
        turn_calls = []
        for n in range(rng.choice((1, 1, 2, 2, 3))):
            tok = f"k{seed}-r{rnd}-t{t}-c{n}"
            kind = rng.choices(("shell", "write_file", "read_file"), (6, 2, 2))[0]
            if first_shell and not calls and not turn_calls:
                kind = "shell"
            if kind == "shell":
                cmd = f"echo {tok} >> '{effects}'"
                r = rng.random()
                if r < 0.2:  # still running when the agent dies: an orphan finishes it
                    cmd = f"sleep 0.0{rng.randint(1, 6)}; {cmd}"
                elif r < 0.35:  # an outcome kept in a blob (> 1 KiB)
                    cmd += "; head -c 1500 /dev/zero | tr '\\0' x; echo"
                args: dict = {"command": cmd}
            elif kind == "write_file":
                args = {"path": f"out/{tok}.txt", "content": f"{tok}\n"}
            else:
                args = {"path": rng.choice(written) if written and rng.random() < 0.7 else "README.md"}
            turn_calls.append({"name": kind, "arguments": args})
        written += [c["arguments"]["path"] for c in turn_calls if c["name"] == "write_file"]
        step: dict = {"tool_calls": turn_calls}
        if rng.random() < 0.5:
            step["content"] = f"turn {t}"
        steps.append(step)
        calls += turn_calls
    steps.append({"content": FINAL})
    return steps, calls


@dataclass
class TrialReport:
    seed: int
    mode: str
    seconds: float = 0.0
    commands: int = 0
    kills: int = 0  # SIGKILLs the harness sent to a running process
    faults: int = 0  # processes killed by a KXEN_AGENT_FAULT point
    resumes: int = 0
    unknowns: int = 0  # UNKNOWN ops resolved by the human
    ops: int = 0
    failures: list[str] = field(default_factory=list)
    dir: str = ""


#: Chaos (kills, fault points) for the first attempts only, so every trial ends.
CHAOS_ATTEMPTS = 8
MAX_ATTEMPTS = 30
P_KILL = (0.8, 0.5)  # first command, later ones
P_FAULT = 0.35
#: The points that leave an UNKNOWN op weigh double: they are what the human path needs.
FAULT_WEIGHTS = tuple(2 if p in ("tool:after-started", "tool:after-effect") else 1 for p in FAULT_POINTS)
P_KILL_RESOLVE = 0.15
MIN_DELAY_S = 0.002


class KillTrial:
    """One kill-torture trial in ``root``; :meth:`run` returns its report (never raises for a violation)."""

    def __init__(self, launcher: Launcher, root: Path, seed: int, typical: Mapping[str, float], exec_fraction: float,
                 *, forced: str | None = None, early_kill: bool = False) -> None:
        """``forced``: a fault point for the first command (no SIGKILL), on a script that starts with a
        shell call — ``tool:after-started`` and ``tool:after-effect`` give an UNKNOWN op for sure.
        ``early_kill``: the first command is SIGKILLed within its first quarter (a short run of
        trials still kills at a random moment)."""
        self.forced = forced
        self.early_kill = early_kill
        self.launcher = launcher
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.exec_ = self.rng.random() < exec_fraction
        self.typical = typical["exec" if self.exec_ else "fork"]
        self.rep = TrialReport(seed, "exec" if self.exec_ else "fork", dir=str(root))
        self.state = root / "state"
        self.effects = root / "effects.log"
        self.ws = root / "ws"
        self.env = {"KXEN_AGENT_STATE_DIR": str(self.state)}
        self.seen = Seen()
        self.verdicts: dict[str, bool] = {}
        self.ses: str | None = None
        self.run_id: str | None = None

    def fail(self, what: str) -> None:
        self.rep.failures.append(what)

    def cli(self, *args: str, env: Mapping[str, str] | None = None, kill_after: float | None = None) -> Done:
        self.rep.commands += 1
        return self.launcher.run(args, {**self.env, **(env or {})}, self.root, exec_=self.exec_, kill_after=kill_after)

    def read(self, *args: str) -> Done | None:
        d = self.cli(*args)
        if d.rc != 0:
            self.fail(f"read command failed: {d}")
            return None
        return d

    def run(self) -> TrialReport:
        t0 = time.monotonic()
        try:
            self._run()
        except Exception:
            self.fail("harness error: " + traceback.format_exc())
        self.rep.seconds = time.monotonic() - t0
        return self.rep

    def _setup(self) -> None:
        git_workspace(self.ws)
        steps, self.calls = make_script(self.rng, self.seed, self.effects, first_shell=self.forced is not None)
        self.agent = write_agent(self.root / "agent", steps, tools=("shell", "read_file", "write_file"))

    def _command(self) -> list[str]:
        if self.ses is None:
            return ["run", "--workspace", str(self.ws), "--task", "torture", "--agent", str(self.agent), "--json"]
        if self.run_id is None:  # killed between creating the session and starting its run
            return ["--resume", self.ses, "--task", "torture", "--json"]
        return ["--resume", self.ses, "--json"]

    def _run(self) -> None:
        self._setup()
        rng = self.rng
        for attempt in range(MAX_ATTEMPTS):
            chaos = attempt < CHAOS_ATTEMPTS
            env: dict[str, str] = {}
            if chaos and rng.random() < P_FAULT:
                point = rng.choices(FAULT_POINTS, FAULT_WEIGHTS)[0]
                env["KXEN_AGENT_FAULT"] = f"{point}@{rng.choice((1, 1, 1, 2, 3))}"
            p_kill = P_KILL[0] if attempt == 0 else P_KILL[1]
            kill_after = rng.uniform(MIN_DELAY_S, self.typical) if chaos and rng.random() < p_kill else None
            if attempt == 0 and self.forced:
                env, kill_after = {"KXEN_AGENT_FAULT": self.forced}, None
            elif attempt == 0 and self.early_kill:
                env, kill_after = {}, rng.uniform(MIN_DELAY_S, self.typical / 4)
            args = self._command()
            if args[0] == "--resume":
                self.rep.resumes += 1
            d = self.cli(*args, env=env, kill_after=kill_after)
            self._check_exit(d, env)
            if d.rc == 0:
                # Completed and settled (checked above); the final checks read it all again.
                res = d.json()
                if (self.ses or res["session"], self.run_id or res["run"]) != (res["session"], res["run"]):
                    self.fail(f"completed another session or run than the one started: {d}")
                self.ses, self.run_id = res["session"], res["run"]
                break
            # What the CLI shows now is acknowledged: it must all be there at the end. The
            # history is read after a kill, where a torn turn would show.
            show = self._observe(log=d.rc < 0)
            if d.rc == 3:
                got = set(d.json()["unknownOps"])
                self.seen.unknown_reported |= got
                shown = {j["op"] for j in (show or {"journal": []})["journal"] if j["state"] == "OutcomeUnknown"}
                if not got or not got <= shown:
                    self.fail(f"exit 3 named UNKNOWN ops {sorted(got)}, run show has {sorted(shown)}")
            if show is None:
                continue
            if show["status"] == "completed" and show["settled"]:
                break
            if any(j["state"] == "OutcomeUnknown" for j in show["journal"]):
                self._resolve(show)
        else:
            self.fail(f"the run did not finish in {MAX_ATTEMPTS} commands")
            return
        self._final_checks()

    def _check_exit(self, d: Done, env: Mapping[str, str]) -> None:
        if d.rc == -signal.SIGKILL:
            if d.killed:
                self.rep.kills += 1
            elif "KXEN_AGENT_FAULT" in env:
                self.rep.faults += 1
            else:
                self.fail(f"killed by nobody: {d}")
            return
        if d.rc == 0:
            res = d.json()
            if not (res["status"] == "completed" and res["settled"] and res["result"] == FINAL and not res["unknownOps"]):
                self.fail(f"exit 0 but not completed and settled: {d}")
        elif d.rc == 3:
            res = d.json()
            if res["status"] != "input_required" or not res["unknownOps"]:
                self.fail(f"exit 3 without an UNKNOWN op: {d}")
        elif d.rc == 2 and "has no run to resume" in d.err and self.run_id is None:
            pass  # the session was created, its run not started: next, --task
        else:
            self.fail(f"unexpected exit: {d}")

    def _observe(self, *, log: bool) -> dict | None:
        if self.ses is None:
            d = self.read("session", "list", "--json")
            sessions = d.json()["sessions"] if d else []
            if len(sessions) > 1:
                self.fail(f"{len(sessions)} sessions for one `run`: {[s['id'] for s in sessions]}")
            if not sessions:
                return None
            self.ses = sessions[0]["id"]
        if self.run_id is None:
            d = self.read("session", "show", self.ses, "--json")
            runs = d.json()["runs"] if d else []
            if len(runs) > 1:
                self.fail(f"{len(runs)} runs started: {runs}")
            if not runs:
                return None
            self.run_id = runs[0]["id"]
        d = self.read("run", "show", self.ses, self.run_id, "--json")
        if d is None:
            return None
        show = d.json()
        self.seen.show(show)
        if log:
            lg = self.read("session", "log", self.ses, "--json")
            if lg is not None:
                self.seen.log(lg.jsonl())
        return show

    def _resolve(self, show: dict) -> None:
        assert self.ses and self.run_id
        if not wait_tools_gone(str(self.effects)):
            self.fail(f"tool processes still running after 30 s: {tool_processes(str(self.effects))}")
        for j in show["journal"]:
            if j["state"] != "OutcomeUnknown":
                continue
            present = verify_effect(j["tool"], j["arguments"], self.effects, self.ws)
            if self.verdicts.setdefault(j["op"], present) != present:
                self.fail(f"op {j['op']}: its effect changed between two looks ({not present} -> {present})")
            kill_after = self.rng.uniform(MIN_DELAY_S, 0.3) if self.rng.random() < P_KILL_RESOLVE else None
            d = self.cli(*resolve_args(self.ses, self.run_id, j["op"], present), kill_after=kill_after)
            if d.rc == -signal.SIGKILL and d.killed:
                self.rep.kills += 1
            elif d.rc == 0:
                self.seen.resolved.add(j["op"])
            else:
                self.fail(f"resolve failed: {d}")

    def _final_checks(self) -> None:
        assert self.ses and self.run_id
        if not wait_tools_gone(str(self.effects)):
            self.fail("tool processes still running at the end")
        d = self.cli("fsck", "--json")
        if d.rc != 0 or not d.json()["clean"] or d.json()["problems"]:
            self.fail(f"fsck: {d}")
        show_d = self.read("run", "show", self.ses, self.run_id, "--json")
        log_d = self.read("session", "log", self.ses, "--json")
        if show_d is None or log_d is None:
            return
        show = show_d.json()
        try:
            chain = self.launcher.call(_run_state_chain, str(self.state), show["state"])
        except RuntimeError as e:
            self.fail(f"run state chain unreadable: {e}")
            chain = None
        self.rep.ops = len(show["journal"])
        self.rep.unknowns = sum(1 for j in show["journal"] if j["source"] == "human")
        log = log_d.jsonl()
        self.rep.failures += check_run(show, log, seen=self.seen, chain=chain, verdicts=self.verdicts,
                                       effects=self.effects, ws=self.ws, calls=self.calls, run=self.run_id)
        # What the checks saw, for a human reading a failure (and for the checker's own tests).
        (self.root / "final.json").write_text(json.dumps({
            "show": show, "log": log, "chain": chain, "calls": self.calls, "run": self.run_id,
            "verdicts": self.verdicts, "seen": {"ops": self.seen.ops, "states": self.seen.states,
                                                "logs": self.seen.logs, "unknown_reported": sorted(self.seen.unknown_reported),
                                                "resolved": sorted(self.seen.resolved)},
        }, indent=1))


def calibrate(launcher: Launcher, root: Path, exec_: bool) -> float:
    """The wall time of one uninterrupted run of a typical script: the upper kill delay."""
    d = root / ("cal-exec" if exec_ else "cal-fork")
    ws = git_workspace(d / "ws")
    steps, _ = make_script(random.Random(1), 0, d / "effects.log", turns=(3, 3))
    agent = write_agent(d / "agent", steps, tools=("shell", "read_file", "write_file"))
    t0 = time.monotonic()
    done = launcher.run(["run", "--workspace", str(ws), "--task", "calibrate", "--agent", str(agent), "--json"],
                        {"KXEN_AGENT_STATE_DIR": str(d / "state")}, d, exec_=exec_)
    took = time.monotonic() - t0
    if done.rc != 0:
        raise RuntimeError(f"calibration run failed: {done}")
    shutil.rmtree(d, ignore_errors=True)
    return took


def _kill_worker(root: Path, seeds: list[tuple[int, str | None]], deadline: float, exec_fraction: float,
                 keep: bool) -> None:
    """Run trials until done or past ``deadline`` (wall clock); one JSON line per trial on stdout."""
    launcher = Launcher(root / "scratch")
    fork = calibrate(launcher, root, False)
    # The console script adds the interpreter's start (imports) to every command.
    t0 = time.monotonic()
    launcher.run(["--help"], {}, root, exec_=True)
    typical = {"fork": fork, "exec": fork + time.monotonic() - t0}
    print(json.dumps({"calibration": typical}), flush=True)
    randoms = 0
    for seed, forced in seeds:
        # Forced trials always run, and so does each worker's first random one (killed
        # early for sure): on a loaded machine the budget may be gone before it, and
        # forced trials alone never kill at a random moment.
        if time.time() > deadline and forced is None and randoms > 0:
            break
        tdir = root / f"trial-{seed}"
        rep = KillTrial(launcher, tdir, seed, typical, exec_fraction, forced=forced,
                        early_kill=forced is None and randoms == 0).run()
        randoms += forced is None
        # Forced trials are few: kept, with the evidence their checks saw (final.json).
        if not rep.failures and not keep and forced is None:
            shutil.rmtree(tdir, ignore_errors=True)
        print(json.dumps(asdict(rep)), flush=True)


@dataclass
class KillFigures:
    seed: int
    trials: int = 0
    exec_trials: int = 0
    commands: int = 0
    kills: int = 0
    faults: int = 0
    resumes: int = 0
    unknowns: int = 0
    ops: int = 0
    seconds: float = 0.0
    calibration: list[dict] = field(default_factory=list)
    failed: list[TrialReport] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"kill torture (seed {self.seed}): {self.trials} trials ({self.exec_trials} via the console script) "
            f"in {self.seconds:.1f}s; {self.commands} CLI commands, {self.kills} SIGKILLs, {self.faults} fault-point "
            f"kills, {self.resumes} resumes, {self.unknowns} UNKNOWN ops resolved, {self.ops} ops checked; "
            f"{len(self.failed)} failed trial(s)",
        ]
        for c in self.calibration:
            lines.append(f"  typical run: fork {c['fork']:.2f}s, exec {c['exec']:.2f}s")
        for rep in self.failed:
            lines.append(f"  FAILED trial seed {rep.seed} ({rep.mode}, dir {rep.dir}):")
            lines += [f"    - {f}" for f in rep.failures[:8]]
        return "\n".join(lines)


def trial_seeds(seed: int, trials: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 10**9) for _ in range(trials)]


def kill_torture(trials: int, *, seed: int, root: Path, workers: int = 2, time_budget_s: float | None = None,
                 exec_fraction: float = 0.2, keep: bool = False, seeds: list[int] | None = None,
                 forced: Sequence[str] = (), progress: Callable[[KillFigures], None] | None = None) -> KillFigures:
    """Run ``trials`` kill-torture trials on ``workers`` worker processes; stop starting trials after the budget.

    ``forced``: fault points for the first trials (see :class:`KillTrial`), run whatever the budget.
    """
    plain = seeds if seeds is not None else trial_seeds(seed, trials)
    tagged = [f"{s}:{forced[i]}" if i < len(forced) else str(s) for i, s in enumerate(plain)]
    figs = KillFigures(seed)
    t0 = time.monotonic()
    deadline = time.time() + (time_budget_s if time_budget_s is not None else 10**9)
    procs = []
    for w in range(min(workers, len(tagged))):
        wroot = root / f"w{w}"
        wroot.mkdir(parents=True, exist_ok=True)
        mine = tagged[w::workers]
        cmd = [sys.executable, "-m", "tests.reliability.torture", "--worker", "kill", "--root", str(wroot),
               "--seeds", ",".join(mine), "--deadline", repr(deadline), "--exec-fraction", str(exec_fraction)]
        if keep:
            cmd.append("--keep")
        procs.append(subprocess.Popen(cmd, cwd=_ROOT, stdout=subprocess.PIPE, text=True,
                                      env={k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")}))
    # Read the workers' lines as they come (a line per trial); one reader per pipe via select.
    open_ = {p.stdout.fileno(): p for p in procs if p.stdout}
    bufs = {fd: "" for fd in open_}
    while open_:
        ready, _, _ = select.select(list(open_), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                open_.pop(fd).wait()
                continue
            bufs[fd] += chunk
            *lines, bufs[fd] = bufs[fd].split("\n")
            for line in lines:
                if not line.strip():
                    continue
                doc = json.loads(line)
                if "calibration" in doc:
                    figs.calibration.append(doc["calibration"])
                    continue
                rep = TrialReport(**doc)
                figs.trials += 1
                figs.exec_trials += rep.mode == "exec"
                for k in ("commands", "kills", "faults", "resumes", "unknowns", "ops"):
                    setattr(figs, k, getattr(figs, k) + getattr(rep, k))
                if rep.failures:
                    figs.failed.append(rep)
                if progress:
                    figs.seconds = time.monotonic() - t0
                    progress(figs)
    for p in procs:
        if p.returncode != 0:
            figs.failed.append(TrialReport(-1, "worker", failures=[f"worker exited {p.returncode}"]))
    figs.seconds = time.monotonic() - t0
    return figs


# ====================================================================== lease torture


@dataclass
class StopRecord:
    pid: int
    fence: int
    entries_at_takeover: int | None = None
    continued: bool = False
    rc: int | None = None


@dataclass
class LeaseFigures:
    seed: int
    rounds: int = 0
    procs: int = 0
    spawned: int = 0
    refused_busy: int = 0
    grants: int = 0  # fence raises: every lease granted, to a run or a resolve
    stops: int = 0
    takeovers: int = 0
    stale_refused: int = 0  # fenced-out holders that exited 75 on their next write
    stopped_after_last_write: int = 0
    spontaneous_takeovers: int = 0  # a holder starved past its expiry by load
    lock_busy: int = 0
    kills: int = 0
    unknowns: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        s = (f"lease torture (seed {self.seed}): {self.rounds} rounds x {self.procs} processes in {self.seconds:.1f}s; "
             f"{self.spawned} started, {self.refused_busy} refused busy (75), {self.grants} lease grants, "
             f"{self.stops} SIGSTOPs past expiry -> {self.takeovers} takeovers, {self.stale_refused} stale holders "
             f"refused (75), {self.stopped_after_last_write} stopped after their last write, "
             f"{self.spontaneous_takeovers} load-induced takeovers, {self.lock_busy} group-lock timeouts, "
             f"{self.kills} holders SIGKILLed, {self.unknowns} UNKNOWN ops resolved; {len(self.failures)} failure(s)")
        return "\n".join([s] + [f"  - {f}" for f in self.failures[:20]])


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


class LeaseTorture:
    """Processes contending for one session's lease over several rounds; see the module docstring."""

    def __init__(self, launcher: Launcher, root: Path, seed: int, *, procs: int = 8, rounds: int = 5,
                 ttl: float = 1.0, round_timeout: float = 90.0) -> None:
        self.launcher = launcher
        self.root = root
        self.rng = random.Random(seed)
        self.seed = seed
        self.procs = procs
        self.rounds = rounds
        self.ttl = ttl
        self.round_timeout = round_timeout
        self.state = root / "state"
        self.effects = root / "effects.log"
        self.ws = root / "ws"
        self.env = {"KXEN_AGENT_STATE_DIR": str(self.state), "KXEN_AGENT_LEASE_TTL_S": str(ttl)}
        self.figs = LeaseFigures(seed, rounds=rounds, procs=procs)
        self.stops: list[StopRecord] = []
        self.verdicts: dict[str, bool] = {}
        self.refused_pids: set[int] = set()
        self.round_calls: list[list[dict]] = []
        self.holders_seen: dict[int, set[int]] = {}
        self.first_fence = 0

    def fail(self, what: str) -> None:
        self.figs.failures.append(what)

    # ------------------------------------------------------------ reading the state dir (no locks, no store)

    def fence(self) -> int:
        """The group's current fence: its ref file and step log as a fresh reader reads them (§6.8; no lock)."""
        from kxen_agent.store import Store

        return Store(str(self.state)).refs.read(f"sessions/{self.ses}").fence

    def holder(self) -> dict | None:
        try:
            return json.loads((self.state / "leases" / "sessions" / self.ses).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def group_lock_free(self) -> bool:
        """Whether nobody holds the session's ref-group lock (a POSIX lock, as fasteners takes it)."""
        path = self.state / "locks" / "sessions" / f"{self.ses}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return True
        finally:
            os.close(fd)  # we held nothing else on this file, so closing drops nothing of ours

    def reflog_entries(self) -> list:
        from kxen_agent.store import Store

        return Store.open(str(self.state)).refs.reflog(f"sessions/{self.ses}")

    # ------------------------------------------------------------ setup

    def setup(self) -> None:
        git_workspace(self.ws)
        steps: list[dict] = [{"content": FINAL}]
        for r in range(1, self.rounds + 1):
            turns = []
            for t in range(self.rng.randint(2, 3)):
                tok = f"k{self.seed}-r{r}-t{t}-c0"
                pause = f"sleep 0.{self.rng.randint(1, 3)}"
                echo = f"echo {tok} >> '{self.effects}'"
                cmd = f"{pause}; {echo}" if self.rng.random() < 0.5 else f"{echo}; {pause}"
                turns.append({"tool_calls": [{"name": "shell", "arguments": {"command": cmd}}]})
            steps += turns + [{"content": FINAL}]
            self.round_calls.append([s["tool_calls"][0] for s in turns])
        self.agent = write_agent(self.root / "agent", steps, tools=("shell",))
        d = self.launcher.run(["run", "--workspace", str(self.ws), "--task", "setup", "--agent", str(self.agent), "--json"],
                              self.env, self.root)
        if d.rc != 0:
            raise RuntimeError(f"setup run failed: {d}")
        self.ses = d.json()["session"]
        self.first_fence = self.fence()

    # ------------------------------------------------------------ one round

    def run(self) -> LeaseFigures:
        t0 = time.monotonic()
        try:
            self.setup()
            for r in range(1, self.rounds + 1):
                self.round(r)
                if len(self.figs.failures) > 20:
                    break
            self.final_checks()
        except Exception:
            self.fail("harness error: " + traceback.format_exc())
        self.figs.seconds = time.monotonic() - t0
        return self.figs

    def round(self, r: int) -> None:
        rng = self.rng
        # A run that died right after its model call is left `running`: something to resume.
        d = self.launcher.run(["--resume", self.ses, "--task", f"round {r}", "--json"],
                              {**self.env, "KXEN_AGENT_FAULT": "provider:after-response"}, self.root)
        if d.rc != -signal.SIGKILL:
            self.fail(f"round {r}: could not prepare the run: {d}")
            return
        slots: list[Child | None] = [None] * self.procs
        next_spawn = [time.monotonic() + rng.uniform(0, 0.05) for _ in range(self.procs)]
        start = time.monotonic()
        # Chaos events: (not before, stop or kill, only while the holder's tool runs?). A
        # holder caught in its tool leaves an op Started: the taker makes it UNKNOWN.
        events = sorted((start + rng.uniform(0.05, 1.0), "stop" if rng.random() < 0.7 else "kill", rng.random() < 0.5)
                        for _ in range(rng.choice((1, 2, 2, 3))))
        killed: set[int] = set()
        stop: StopRecord | None = None
        stop_deadline = 0.0
        continued: dict[int, StopRecord] = {}
        pending_unknown = False
        done = False
        while True:
            now = time.monotonic()
            if now - start > self.round_timeout:
                self.fail(f"round {r}: not finished after {self.round_timeout:.0f}s")
                for c in slots:
                    if c is not None:
                        c.signal(signal.SIGCONT)
                        c.signal(signal.SIGKILL)
                        c.finish()
                return
            # Collect exits.
            for i, c in enumerate(slots):
                if c is None or c.poll() is None:
                    continue
                slots[i] = None
                res = c.finish()
                next_spawn[i] = now + rng.uniform(0.05, 0.3)  # pacing: contenders also eat the holder's CPU
                if c.pid in continued:
                    self._stopped_exit(continued.pop(c.pid), res)
                    if res.rc == 3:
                        pending_unknown = True
                    elif res.rc == 0:
                        done = True
                elif res.rc == -signal.SIGKILL:
                    if c.pid not in killed:
                        self.fail(f"round {r}: killed by nobody: {res}")
                elif res.rc == 75 and "is busy" in res.err:
                    self.figs.refused_busy += 1
                    self.refused_pids.add(c.pid)
                elif res.rc == 75 and ("stale" in res.err or "taken over" in res.err):
                    self.figs.spontaneous_takeovers += 1
                elif res.rc == 75 and "lock " in res.err and "held by another process" in res.err:
                    self.figs.lock_busy += 1
                elif res.rc == 3:
                    pending_unknown = True
                elif res.rc == 0:
                    out = res.json()
                    if not (out["status"] == "completed" and out["settled"] and out["result"] == FINAL):
                        self.fail(f"round {r}: exit 0 but {out}")
                    done = True
                elif res.rc == 2 and "nothing to resume" in res.err:
                    done = True
                else:
                    self.fail(f"round {r}: unexpected exit {res}")
            live = [c for c in slots if c is not None]
            h = self.holder()
            if h is not None and isinstance(h.get("fence"), int):
                self.holders_seen.setdefault(h["fence"], set()).add(h.get("pid"))
            if done and not live and stop is None:
                break
            # The stopped holder: once another process has taken the lease over, let it continue.
            if stop is not None:
                if not any(c is not None and c.pid == stop.pid for c in slots):
                    self.fail(f"round {r}: the stopped holder pid {stop.pid} exited while stopped")
                    stop = None
                elif self.fence() > stop.fence:
                    stop.entries_at_takeover = sum(1 for e in self.reflog_entries() if e.fence == stop.fence)
                    self.figs.takeovers += 1
                    holder_child = next(c for c in slots if c is not None and c.pid == stop.pid)
                    holder_child.signal(signal.SIGCONT)
                    stop.continued = True
                    continued[stop.pid] = stop
                    stop = None
                elif now > stop_deadline:
                    self.fail(f"round {r}: nobody took over the lease of stopped pid {stop.pid} "
                              f"within {10 * self.ttl + 15:.0f}s ({len(live)} contenders live, "
                              f"holder record {self.holder()}, group lock free: {self.group_lock_free()})")
                    holder_child = next(c for c in slots if c is not None and c.pid == stop.pid)
                    holder_child.signal(signal.SIGCONT)
                    continued[stop.pid] = stop
                    stop = None
            # The human resolves UNKNOWN ops once no fenced-out holder or its tool can still act.
            if pending_unknown and stop is None and not continued and not live:
                if wait_tools_gone(str(self.effects)):
                    pending_unknown = self._resolve(r)
                else:
                    self.fail(f"round {r}: tool processes still running after 30 s")
                    pending_unknown = False
            # Chaos: stop or kill the current holder.
            if events and now >= events[0][0] and stop is None and not done:
                _, action, in_tool = events[0]
                h = self.holder()
                target = next((c for c in slots if c is not None and h is not None and c.pid == h.get("pid")), None)
                if (target is not None and h is not None and h.get("fence") == self.fence() and target.poll() is None
                        and (not in_tool or tool_processes(str(self.effects)))):
                    if action == "stop":
                        stop = self._stop(target, h["fence"])
                        if stop is not None:
                            events.pop(0)
                            # Expiry, then contenders need a try or two each.
                            stop_deadline = time.monotonic() + 10 * self.ttl + 15
                    else:
                        target.signal(signal.SIGKILL)
                        killed.add(target.pid)
                        self.figs.kills += 1
                        events.pop(0)
            # Contenders. While ops wait for the human nobody new starts, except
            # while a holder is stopped: only a contender can take its lease over
            # (the holder may be one that found the run waiting and was about to
            # exit 3 when the stop caught it).
            if stop is not None or (not done and not pending_unknown):
                for i in range(self.procs):
                    if slots[i] is None and now >= next_spawn[i]:
                        c = self.launcher.spawn(["--resume", self.ses, "--json"], self.env, self.root)
                        slots[i] = c
                        self.figs.spawned += 1
            time.sleep(0.005)
        show = self._show_run(r)
        if show is not None and not (show["status"] == "completed" and show["settled"]):
            self.fail(f"round {r}: run ended {show['status']} settled={show['settled']}")

    def _stop(self, target: Child, fence: int) -> StopRecord | None:
        """SIGSTOP the holder outside the group lock (paused inside it, it would block every grant)."""
        target.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while _proc_state(target.pid) not in ("T", "t"):
            if target.poll() is not None or _proc_state(target.pid) in ("Z", "?"):
                return None  # it was exiting: nothing to stop
            if time.monotonic() > deadline:
                target.signal(signal.SIGCONT)
                return None
            time.sleep(0.001)
        t_end = time.monotonic() + 0.3
        while time.monotonic() < t_end:
            if self.group_lock_free():
                self.figs.stops += 1
                rec = StopRecord(target.pid, fence)
                self.stops.append(rec)
                return rec
            time.sleep(0.005)
        target.signal(signal.SIGCONT)
        return None

    def _stopped_exit(self, rec: StopRecord, res: Done) -> None:
        rec.rc = res.rc
        if res.rc == 75 and ("stale" in res.err or "taken over" in res.err):
            self.figs.stale_refused += 1
        elif res.rc in (0, 3):
            self.figs.stopped_after_last_write += 1
        elif res.rc == 2 and "nothing to resume" in res.err:
            self.figs.stopped_after_last_write += 1
        else:
            self.fail(f"a holder continued after the takeover exited {res}")
        h = self.holder()
        if h is not None and h.get("fence") == rec.fence:
            self.fail(f"the fenced-out holder pid {rec.pid} (fence {rec.fence}) left its record over the new holder's")

    def _resolve(self, r: int) -> bool:
        """Resolve this round's UNKNOWN ops; True if some are left (the lease was busy: try again)."""
        run = self._latest_run()
        d = self.launcher.run(["run", "show", self.ses, run, "--json"], self.env, self.root)
        if d.rc != 0:
            self.fail(f"round {r}: run show failed: {d}")
            return False
        left = False
        for j in d.json()["journal"]:
            if j["state"] != "OutcomeUnknown":
                continue
            present = verify_effect(j["tool"], j["arguments"], self.effects, self.ws)
            if self.verdicts.setdefault(j["op"], present) != present:
                self.fail(f"op {j['op']}: its effect changed between two looks")
            res = self.launcher.run(resolve_args(self.ses, run, j["op"], present), self.env, self.root)
            if res.rc == 0:
                self.figs.unknowns += 1
            elif res.rc == 75:
                left = True
            else:
                self.fail(f"round {r}: resolve failed: {res}")
        return left

    def _latest_run(self) -> str:
        d = self.launcher.run(["session", "show", self.ses, "--json"], self.env, self.root)
        return max(d.json()["runs"], key=lambda x: x["index"])["id"]

    def _show_run(self, r: int) -> dict | None:
        d = self.launcher.run(["run", "show", self.ses, self._latest_run(), "--json"], self.env, self.root)
        if d.rc != 0:
            self.fail(f"round {r}: run show failed: {d}")
            return None
        return d.json()

    # ------------------------------------------------------------ after all rounds

    def final_checks(self) -> None:
        if not wait_tools_gone(str(self.effects)):
            self.fail("tool processes still running at the end")
        d = self.launcher.run(["fsck", "--json"], self.env, self.root)
        if d.rc != 0 or not d.json()["clean"]:
            self.fail(f"fsck: {d}")
        sess = self.launcher.run(["session", "show", self.ses, "--json"], self.env, self.root).json()
        log = self.launcher.run(["session", "log", self.ses, "--json"], self.env, self.root).jsonl()
        runs = sorted(sess["runs"], key=lambda x: x["index"])
        for run in runs[1:]:
            show = self.launcher.run(["run", "show", self.ses, run["id"], "--json"], self.env, self.root).json()
            calls = self.round_calls[run["index"] - 1]
            for f in check_run(show, log, seen=Seen(), chain=None, verdicts=self.verdicts, effects=self.effects,
                               ws=self.ws, calls=calls, run=run["id"]):
                self.fail(f"run #{run['index']}: {f}")
        self.check_reflog()

    def check_reflog(self) -> None:
        current = self.fence()
        self.figs.grants = current - self.first_fence
        self.figs.failures += reflog_violations(self.reflog_entries(), current, self.stops, self.holders_seen,
                                                # every CLI process counts: a round's setup run or a
                                                # resolve may get the pid of an earlier refused contender
                                                self.refused_pids, self.launcher.started)


def reflog_violations(log: Sequence[Any], current_fence: int, stops: Sequence[StopRecord],
                      holders_seen: Mapping[int, set[int]], refused: set[int], spawned: Mapping[int, int]) -> list[str]:
    """Zero overlapping leases, from a group's reflog; [] if none.

    Each reflog entry carries the fence of the lease that wrote it. Fences
    never go down (so each lease's writes are contiguous: nothing written
    under an older lease lands after a newer one's), no entry carries a fence
    above the group's, one lease writes for one run, and a fenced-out holder
    wrote nothing after its takeover. ``holders_seen`` (fence -> pids seen in
    the holder record) must name one process per fence, never one that was
    refused as busy (pids are reused: only those started once are judged).
    """
    bad: list[str] = []
    fences = [e.fence for e in log]
    drops = [(i, a, b) for i, (a, b) in enumerate(zip(fences, fences[1:])) if b < a]
    if drops:
        bad.append(f"the fence went down in the reflog (writes of two leases interleaved): {drops[:5]}")
    if fences and max(fences) > current_fence:
        bad.append(f"a reflog entry carries fence {max(fences)} above the group's {current_fence}")
    runs_of: dict[int, set[str]] = {}
    for e in log:
        if e.reason.startswith("run "):
            runs_of.setdefault(e.fence, set()).add(e.reason.split()[1].rstrip(":"))
    shared = {f: r for f, r in runs_of.items() if len(r) > 1}
    if shared:
        bad.append(f"one lease wrote for several runs: {shared}")
    for rec in stops:
        if rec.entries_at_takeover is None:
            continue
        n = sum(1 for e in log if e.fence == rec.fence)
        if n != rec.entries_at_takeover:
            bad.append(f"the fenced-out holder pid {rec.pid} wrote {n - rec.entries_at_takeover} reflog "
                       f"entries under fence {rec.fence} after the takeover")
    for fence, pids in holders_seen.items():
        if len(pids) > 1:
            bad.append(f"fence {fence} was held by several processes: {sorted(pids)}")
        for pid in pids:
            if pid in refused and spawned.get(pid) == 1:
                bad.append(f"pid {pid} was refused as busy, yet held fence {fence}")
    return bad


def lease_torture(root: Path, *, seed: int, procs: int = 8, rounds: int = 5, ttl: float = 1.0) -> LeaseFigures:
    """Run the lease torture in a worker process (the caller never forks); its figures."""
    root.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tests.reliability.torture", "--worker", "lease", "--root", str(root),
           "--seed", str(seed), "--procs", str(procs), "--lease-rounds", str(rounds), "--ttl", str(ttl)]
    p = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KXEN_AGENT_")})
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        figs = LeaseFigures(seed)
        figs.failures.append(f"lease worker exited {p.returncode}: {p.stdout[-2000:]} {p.stderr[-2000:]}")
        return figs
    return LeaseFigures(**json.loads(lines[-1]))


def _lease_worker(root: Path, seed: int, procs: int, rounds: int, ttl: float) -> None:
    launcher = Launcher(root / "scratch")
    figs = LeaseTorture(launcher, root / "lease", seed, procs=procs, rounds=rounds, ttl=ttl).run()
    print(json.dumps(asdict(figs)), flush=True)


# ====================================================================== the long mode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.reliability.torture", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=300, help="kill-torture trials (0: none)")
    ap.add_argument("--seed", type=int, default=None, help="master seed (default: random, printed)")
    ap.add_argument("--trial-seed", type=int, action="append", help="replay this trial seed (repeatable)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--exec-fraction", type=float, default=0.2, help="share of trials run via the console script")
    ap.add_argument("--lease-rounds", type=int, default=0, help="lease-torture rounds (0: skip)")
    ap.add_argument("--procs", type=int, default=8, help="lease-torture contending processes")
    ap.add_argument("--ttl", type=float, default=1.0, help="lease-torture KXEN_AGENT_LEASE_TTL_S")
    ap.add_argument("--root", type=Path, default=None, help="work directory (default: a temp dir, kept on failure)")
    ap.add_argument("--keep", action="store_true", help="keep every trial's directory")
    # Internal: the worker processes.
    ap.add_argument("--worker", choices=("kill", "lease"), help=argparse.SUPPRESS)
    ap.add_argument("--seeds", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=10**12, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker == "kill":
        seeds = [(int(s.partition(":")[0]), s.partition(":")[2] or None) for s in a.seeds.split(",") if s]
        _kill_worker(a.root, seeds, a.deadline, a.exec_fraction, a.keep)
        return 0
    if a.worker == "lease":
        _lease_worker(a.root, a.seed, a.procs, a.lease_rounds, a.ttl)
        return 0

    seed = a.seed if a.seed is not None else random.randrange(10**6)
    root = a.root or Path(tempfile.mkdtemp(prefix="kxen-torture-"))
    print(f"torture: seed {seed}, work dir {root}", flush=True)
    failed = False
    if a.trials or a.trial_seed:
        last = [0.0]

        def progress(f: KillFigures) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                print(f"  ... {f.trials} trials, {f.kills} kills, {f.unknowns} UNKNOWNs, {len(f.failed)} failed, "
                      f"{f.seconds:.0f}s", flush=True)

        figs = kill_torture(a.trials, seed=seed, root=root / "kill", workers=a.workers, exec_fraction=a.exec_fraction,
                            keep=a.keep, seeds=a.trial_seed, progress=progress)
        print(figs.summary(), flush=True)
        failed |= bool(figs.failed)
    if a.lease_rounds:
        lf = lease_torture(root / "lease", seed=seed, procs=a.procs, rounds=a.lease_rounds, ttl=a.ttl)
        print(lf.summary(), flush=True)
        failed |= bool(lf.failures)
    if not failed and not a.keep and a.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
