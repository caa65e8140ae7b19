"""The runtime's side of the trust boundary (``objects_spec.md`` §14.13, §14.6): the gate a run passes.

:mod:`kxen_agent.session.trust` says what this state dir wrote itself and
which pairs and locks it accepts; this module applies that to one run —
whether its provider may be called (:meth:`TrustGate.lock_gate`), which
pending calls came from elsewhere undecided (:meth:`TrustGate.foreign_calls`),
the words of the pause (:meth:`TrustGate.problem`) and this machine's own
decision on such a call (:meth:`TrustGate.decide_here`) — and records what
this machine chose itself (:func:`register`, :func:`rebind_agent`). It
never calls a model or a tool.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any, Callable

from kxen_agent.errors import UsageError
from kxen_agent.session.schema import read
from kxen_agent.session.sessions import SessionInfo, new_id
from kxen_agent.session.status import ApproverName, OpSource, OpState
from kxen_agent.session.trust import (LocalRecords, TrustRecord, TrustStore, lock_pair, lock_problem, normal_url,
                                      official_pair)
from kxen_agent.store.objects import encode_object
from kxen_agent.store.protocols import Repository

from .mcp_tools import mcp_doc
from .plan import StepPlan
from .providers import ModelEndpoint

if TYPE_CHECKING:
    from .lease import Lease

__all__ = ["TRUST_APPROVER", "TrustGate", "check_key_env", "lock_doc", "lock_verdict", "rebind_agent", "register", "trust_doc"]

#: §14.6 ``approver`` of a decision ``session trust`` made on a call another state dir asked for or decided.
TRUST_APPROVER = ApproverName.TRUST


def check_key_env(lock: dict, key_env: str | None) -> None:
    """A bad ``--api-key-env`` is refused before anything is written."""
    if key_env is None:
        return
    if lock.get("provider") not in ("openai", "anthropic"):
        raise UsageError(f"--api-key-env applies to the openai and anthropic providers; agent {lock.get('name')!r} "
                         f"uses the {lock.get('provider')} provider, which sends no key; leave --api-key-env out")
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key_env):
        raise UsageError(f"--api-key-env {key_env!r} is not an environment variable name ([A-Z_][A-Z0-9_]*); "
                         "give the variable's name, never its value")


def lock_doc(lock: dict) -> dict:
    """What ``session trust`` shows of an agent lock: everything that decides what it can make this machine do."""
    policy = lock.get("policy", {})
    steps = None
    if lock.get("script") is not None:
        try:
            steps = json.loads(lock["script"])
        except ValueError:
            steps = lock["script"]
    return {"name": lock.get("name"), "provider": lock.get("provider"), "model": lock.get("model"),
            "baseUrl": lock.get("base_url"), "apiKeyEnv": lock.get("api_key_env"), "tools": lock.get("tools", []),
            "approve": policy.get("approve", []), "envKeep": policy.get("env_keep", []), "script": steps,
            **({"mcp": mcp_doc(lock)} if lock.get("mcp") else {})}


def lock_verdict(store: Repository, ses: str, lock_oid: bytes, lock: dict, endpoint: str | None,
                 key_env: str | None, *, locality: bool = False, own: list[dict] | None = None) -> str | None:
    """:func:`~kxen_agent.session.trust.lock_problem` with this state dir's records read (only when needed).

    ``own``: this machine's configured agent locks. ``locality``: only whether the lock is this machine's
    (a definition it ran the session with, registered, or configured): None if it is.
    """
    if not locality and lock.get("provider") != "script" and not lock.get("mcp") and official_pair(endpoint, key_env):
        return None
    own = own or []
    trust = TrustStore(store)
    own_ids = {encode_object("agent", o).id for o in own}
    local_lock = (lock_oid in own_ids or any(r.lock == lock_oid and r.how == "local" for r in trust.records())
                  or lock_oid in LocalRecords.read(store, ses).local_agents(store))
    if locality:
        return None if local_lock else "not local"
    own_pairs = {(normal_url(u), v) for u, v in map(lock_pair, own)}
    return lock_problem(lock, lock_oid, endpoint, key_env, lock_local=local_lock, trusted_locks=trust.locks(),
                        trusted_pairs=trust.pairs() | own_pairs)


def register(store: Repository, ses: str, lock: dict, lock_oid: bytes, endpoint: ModelEndpoint, key_env: str | None, *,
             given_url: bool, own: bool = True, var_chosen: bool = False, rebound: bool = False) -> None:
    """Record as accepted what this machine chose itself: the pair of a definition it was given (``own``)
    unless official, and an endpoint given on the command line with a key variable it chose (given too, or
    its own definition's). Nothing is written when it is there already, or official."""
    trust = TrustStore(store)
    # A script lock is registered only when named to re-bind a session (--agent): the sessions it
    # creates are this state dir's anyway (their reflog says so), and a session nobody asked
    # about keeps a state dir free of trust records.
    if own and (lock.get("provider") != "script" or rebound):
        url, var = lock_pair(lock)
        if lock.get("provider") == "script" or not official_pair(url, var):
            trust.add(TrustRecord("lock", url if lock.get("provider") != "script" else None, var, "local",
                                  lock_oid, ses), reason=f"trust: local agent {lock.get('name')} of {ses}")
    if given_url and (key_env is not None or own or var_chosen):
        var = key_env if key_env is not None else lock.get("api_key_env")
        if not official_pair(endpoint.base_url, var):
            trust.add(TrustRecord("pair", endpoint.base_url, var, "command-line", None, ses),
                      reason=f"trust: --base-url of {ses}")


def rebind_agent(runner: Any, info: SessionInfo, lock: dict, lease: Lease) -> SessionInfo:
    """Bind session ``info`` to agent lock ``lock`` (``--agent FILE``): new metadata (reason ``agent``), under the lease."""
    oid = runner.sessions.put_agent(lock)
    if oid == info.agent_oid:
        return info
    meta = dict(info.meta, agent=oid, reason="agent", previous=info.meta_oid, revisedNs=time.time_ns())
    runner.commit(StepPlan(info.group, f"session: agent {lock.get('name')}", lease.fence, info.head,
                           meta=(info.meta_oid, meta)))
    runner.on_event(f"session {info.id} now uses agent {lock.get('name')}")
    return runner.sessions.get(info.id)


def _summary(text: str, limit: int) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class TrustGate:
    """The trust checks of one pass of the loop over one run (``ctx``: the runner's run context)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self._local: LocalRecords | None = None
        self._verdict: tuple[str | None] | None = None

    def forget(self) -> None:
        """The run's lock or key variable changed: judge them again."""
        self._verdict = None

    def local(self) -> LocalRecords:
        """What this state dir's reflog says it wrote of the session (read once, only when needed)."""
        if self._local is None:
            self._local = LocalRecords.read(self.ctx.store, self.ctx.ses)
        return self._local

    def lock_gate(self) -> str | None:
        """Why this run may not call its endpoint with its key variable (or run its script) here, or None."""
        c = self.ctx
        if self._verdict is None:
            self._verdict = (lock_verdict(c.store, c.ses, c.info.agent_oid, c.agent, c.endpoint.base_url,
                                          c.agent.get("api_key_env"), own=c.r.own_locks),)
        return self._verdict[0]

    def foreign_calls(self) -> list[tuple[dict, dict | None]]:
        """The calls of the run's pending tool turn that wait for a decision another state dir made, or that
        another state dir asked for and nobody here decided: (call, its newest journal entry or None)."""
        c = self.ctx
        if c.info.head is None:
            return []
        last = c.sessions.read_message(c.info.head)
        if not (last.role == "assistant" and last.tool_calls and last.run == c.run):
            return []
        by_call = c.r.journal_view(c.st).by_message.get(last.oid, {})
        out = []
        for call in last.tool_calls:
            e = by_call.get(call["id"])
            if e is None:
                if last.oid not in c.asked_here and last.oid not in self.local().heads:
                    out.append((call, None))
            elif e["state"] == OpState.DECIDED and e.get("approval") == "yes" and e["op"] not in c.decided_here:
                if not self.local().committed_journal(c.store, c.run, self._entry_oid(e["op"]), f"run {c.run}: {e['op']} "):
                    out.append((call, e))
        return out

    def decided_here(self, op: str) -> bool:
        """Whether this state dir made the decision (``Decided`` entry) of operation ``op`` of the run."""
        c = self.ctx
        return op in c.decided_here or self.local().committed_journal(
            c.store, c.run, self._entry_oid(op, OpState.DECIDED), f"run {c.run}: {op} ")

    def _entry_oid(self, op: str, state: str | None = None) -> bytes | None:
        """The id of the newest journal entry of ``op`` (in ``state``, if given), walking back from the run state."""
        cur = self.ctx.st.get("journal")
        while cur is not None:
            e = read(self.ctx.store, cur, "journal")
            if e["op"] == op and (state is None or e["state"] == state):
                return cur
            cur = e.get("previous")
        return None

    def problem(self) -> str | None:
        """Why the run must wait for this machine's decision before its next step, or None (§14.13)."""
        c = self.ctx
        problem = self.lock_gate()
        if problem is not None:
            pair = "" if c.agent.get("provider") == "script" else ", or `--base-url URL --api-key-env NAME` names a pair"
            return (f"{problem}; `kxen-agent session trust {c.ses}` shows the agent lock and accepts it (or "
                    f"`kxen-agent --resume {c.ses} --agent FILE` re-binds the session to a definition of yours{pair}), "
                    f"then `kxen-agent --resume {c.ses}`")
        pending = self.foreign_calls()
        if not pending:
            return None
        shown = "; ".join(f"{call['name']} {_summary(call['arguments'], 200)}"
                          + (" (decided on another machine)" if e is not None else "") for call, e in pending)
        return (f"{len(pending)} tool call(s) recorded on another machine wait for this machine's decision: {shown}; "
                f"`kxen-agent session trust {c.ses}` shows them and accepts (or --refuse-calls refuses) them, "
                f"then `kxen-agent --resume {c.ses}`")

    def decide_here(self, call: dict, e: dict | None, *, yes: bool) -> None:
        """Record this machine's decision on a call another state dir asked for or decided (``session trust``):
        a ``Decided`` entry of its own, in a step of its own (its reason names the op, §14.6)."""
        c = self.ctx
        if e is not None:
            base = {k: v for k, v in e.items() if k not in ("previous", "output", "outputBlob", "timeNs")}
        else:
            tool = c.run_tools().get(call["name"])  # an MCP tool too (nothing is started)
            base = {"op": new_id("op"), "run": c.run, "turn": c.st["turn"], "callId": call["id"],
                    "tool": call["name"], "arguments": call["arguments"], "message": c.info.head,
                    "sideEffects": bool(tool.side_effects) if tool else False}
        entry = dict(base, state=OpState.DECIDED, source=OpSource.HUMAN, approval="yes" if yes else "no",
                     approver=TRUST_APPROVER, origin=c.origin())
        c.journal_write([entry], reason=f"run {c.run}: {base['op']} {'accepted' if yes else 'refused'} here "
                                        "(session trust)")
        c.decided_here.add(base["op"])


def trust_doc(runner: Any, ses: str, make_ctx: Callable[[str], Any], *, accept: bool | None) -> dict:
    """What session ``ses`` asks of this machine that it has not accepted (``session trust``), and with
    ``accept`` (not None) its acceptance: a trust record for the lock, a decision of this machine's on each
    pending call (``accept`` False: refused). ``make_ctx(run)`` is the runner's context of a run."""
    from .results import TERMINAL
    from .providers import model_endpoint

    info = runner.sessions.get(ses)
    lock = runner.sessions.agent(info)
    latest = runner.latest_run(info)
    doc: dict = {"session": ses, "lockId": info.agent_oid.hex(), "lock": lock_doc(lock), "run": None,
                 "lockProblem": None, "calls": [], "accepted": False}
    if latest is None or (latest[2]["status"] in TERMINAL and latest[2].get("settled")):
        # No unfinished run: the next one uses the lock as it is (its endpoint, no override).
        ep = model_endpoint(lock)
        doc["endpoint"], doc["keyEnv"] = ep.base_url, lock.get("api_key_env")
        ctx = None
        problem = lock_verdict(runner.store, ses, info.agent_oid, lock, ep.base_url, lock.get("api_key_env"),
                               own=runner.own_locks)
    else:
        ctx = make_ctx(latest[0])
        doc["run"] = latest[0]
        doc["endpoint"], doc["keyEnv"] = ctx.endpoint.base_url, ctx.agent.get("api_key_env")
        problem = ctx.gate.lock_gate()
    doc["lockProblem"] = problem
    pending = ctx.gate.foreign_calls() if ctx is not None else []
    doc["calls"] = [{"op": e["op"] if e else None, "callId": c["id"], "tool": c["name"],
                     "arguments": c["arguments"], "state": e["state"] if e else None,
                     "decidedBy": e.get("approver") if e else None, "origin": e.get("origin") if e else None}
                    for c, e in pending]
    if accept is None or (problem is None and not pending):
        return doc
    if problem is not None:
        script = lock.get("provider") == "script"
        TrustStore(runner.store).add(
            TrustRecord("lock", None if script else doc["endpoint"], None if script else doc["keyEnv"], "accepted",
                        info.agent_oid, ses), reason=f"trust: accepted the agent lock of {ses}")
    if ctx is not None:
        for call, e in pending:
            ctx.gate.decide_here(call, e, yes=accept)
    doc["accepted"] = True
    return doc
