"""DCPRuns: the agent loop, the durable tool journal, recovery and resolution.

Every state change of a run is a new immutable ``run`` object (and, for tool
calls, a ``journal`` entry) named by the session's ``runs/<run_id>`` ref,
moved by compare-and-swap with the run lease's fence. Each durable step is a
:class:`~.plan.StepPlan` value (the messages it appends, the journal entries
and the run state it writes) that :meth:`Runner.commit` makes durable, the one
place a run makes a ``Store.step`` and moves refs; it checks the §14.5 and
§14.6 transition tables (:mod:`kxen_agent.session.status`) first. The journal
is held per run (:class:`~.run_reader.JournalView`) and extended by what
commit writes, so a step costs O(new entries). The order of durable steps is
the seed's:

1. the assistant message that asks for tool calls is in the Session before
   any of them starts (a crash never calls the provider twice for a turn);
2. per call (:mod:`.tool_call`): a decision (``Decided``, :mod:`.approvals`)
   when the lock's ``approve`` lists the tool, then ``Started`` is durable
   before the side effect; when the tool returns, ``OutcomeKnown`` (with the
   outcome) is durable;
3. then the turn's tool messages are written into the Session, then every
   op of the turn is ``Settled``;
4. the final answer: the terminal result is saved in the run, then the
   final message is written into the Session idempotently, then the run is
   marked settled.

Before each step that calls the model or a tool, the run passes the trust
gate (:mod:`.trust`, §14.13): a lock whose endpoint and key variable this
machine has not accepted, a script lock from elsewhere, or a pending call
another state dir asked for or decided, makes the run wait in
``input_required`` until this machine decides (``session trust``).

Recovery is a pure function of (Session history, journal): a call that is
``Started`` with no outcome becomes ``OutcomeUnknown`` (or, for a tool
without side effects, simply runs again), the run waits in
``input_required``, and only :meth:`Runner.resolve` moves it on. A call
whose outcome is known is never run again.

Model calls go through one retry policy (:mod:`.retry`) and are abandoned
the moment the run's cancel event is set; an answer that was cut off
(``finish_reason`` ``length``), withheld (``content_filter``) or holds
nothing usable fails the run instead of completing it. Each run records the
model and endpoint it calls and the tokens each turn cost (§14.5). Every
text a run stores passes through :func:`_stored_text` (the redaction of
§14.11: the agent's key, the runner's credential-looking variables, token
formats, URL user-info, private keys), in this one place.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

from kxen_agent.errors import UsageError
from kxen_agent.session.schema import put, text_blob
from kxen_agent.session.sessions import SessionInfo, SessionStore, msg_id, new_id
from kxen_agent.session.status import OpSource, OpState, RunStatus, check_op_move, check_run_move, plain
from kxen_agent.session.trust import TrustStore
from kxen_agent.store import RefUpdate
from kxen_agent.store.autopack import AutoPacker
from kxen_agent.store.protocols import ObjectStore, Repository

from .approvals import Approver, refuse_without_terminal
from .answer_end import unusable_answer
from .compaction import ask_summary, held_view, over_budget, plan_compaction, summary_interrupted
from .events import Activity, Listener, ProviderRetry, RunEvent, RunStarted, TextDelta, TurnFinished, TurnStarted
from .faults import check_spec as check_fault_spec, fault
from .history import RunHistory
from .instructions import model_preamble, read_for_run
from .pending import decide, not_resolvable, still_waiting
from .recovery import (WAITS_FOR_APPROVAL, AskModel, FinishSettlement, LastMessage, ResumeAfterResolution, RunTools,
                       SettleThenAsk, Stop, next_step)
from .lease import Lease, LeaseBackend, lease_backend, lease_ttl_s
from .mcp_tools import mcp_specs, record_listings
from .providers import (AssistantTurn, ModelEndpoint, Provider, ProviderCanceled, Usage, make_provider,
                        model_endpoint, require_sdk)
from .redaction import credential_env_values, redact
from .retry import ProviderGaveUp, RetryNote, RetryPolicy, call_with_retries
from .plan import KEEP_OUTPUT, Committed, JournalWrite, StepPlan
from .run_reader import JournalView, check_tip, turn_usage
from .run_status import read_run, shown_status
from .tool_call import StopRun as _Stop, ToolTurn
from .tools import TOOLS, tool_specs
from .tools.files import GitInternalsWatch
from .task_note import task_message_text
from .trust import TrustGate, check_key_env, lock_verdict, rebind_agent, register, trust_doc

__all__ = [
    "NothingToRetry",
    "RunError",
    "RunResult",
    "Runner",
    "TERMINAL",
    "sum_usage",
]

from .results import (CUT_SHORT, OUTPUT_BLOB_THRESHOLD, TERMINAL, NothingToResume, NothingToRetry, RunError,
                      RunResult, _usage_json, retryable, sum_usage)

#: Makes the provider of a run: (agent lock, model and endpoint) -> Provider.
ProviderFactory = Callable[[dict, ModelEndpoint], Provider]
#: ``_loop``'s ``key_env``: keep the key variable the run recorded.
_KEEP = object()


def _stored_text(text: str, secrets: list[str]) -> str:
    """A text as a run stores (and reports) it: redacted (§14.11, :mod:`.redaction`)."""
    return redact(text, secrets)


class Runner:
    """Runs, resumes and resolves DCPRuns of the sessions in one store.

    ``store`` is any :class:`~kxen_agent.store.protocols.Repository`: the
    state dir on disk, or a :class:`~kxen_agent.store.memory.MemoryStore`
    (in-process tests). ``leases`` is where the run lease lives
    (default: :func:`~kxen_agent.runtime.lease.lease_backend` of the store).
    ``fault`` is called with the name of each fault point the loop passes
    (:data:`~kxen_agent.runtime.faults.POINTS`); the default,
    :func:`~kxen_agent.runtime.faults.fault`, kills the process where
    ``KXEN_AGENT_FAULT`` says. A hook that raises stops the run there, with
    what is durable left as a crash would leave it.

    ``on_event`` gets progress notes in words; ``listener`` gets the
    structured :data:`~kxen_agent.runtime.events.RunEvent` records, with the
    model's text piece by piece when ``stream`` is true (the provider then
    streams its answer). :attr:`activity` says what the run waits for now.
    ``retry_policy`` governs model calls; ``providers`` makes a run's
    provider (default :func:`~kxen_agent.runtime.providers.make_provider`;
    tests pass fakes).
    """

    def __init__(self, store: Repository, *, cancel: threading.Event | None = None,
                 on_event: Callable[[str], None] | None = None, leases: LeaseBackend | None = None,
                 fault: Callable[[str], None] | None = None, listener: Listener | None = None,
                 stream: bool = False, retry_policy: RetryPolicy | None = None,
                 providers: ProviderFactory | None = None) -> None:
        self.store = store
        self.sessions = SessionStore(store)
        self.cancel = cancel or threading.Event()
        self.on_event = on_event or (lambda line: None)
        self.listener = listener or (lambda event: None)
        self.stream = stream
        self.retry_policy = retry_policy or RetryPolicy()
        self.providers: ProviderFactory = providers or make_provider
        self.leases = leases if leases is not None else lease_backend(store)
        self.fault = fault
        #: What the run is doing now (read from other threads: a signal's note).
        self.activity = Activity("step")
        #: Decides calls that ``[policy] approve`` lists (the CLI sets a terminal's; default: refuse them).
        self.approver: Approver = refuse_without_terminal
        #: The journal of each run this runner read or wrote, held and extended (:class:`.run_reader.JournalView`).
        self._journals: dict[str, JournalView] = {}
        #: The history the model is sent, held in memory and extended turn by turn (read once per process).
        self.history = RunHistory(self.sessions)
        #: Packs loose objects between turns and after a run when there are too many (None: never).
        self.autopack = AutoPacker.for_store(store)
        #: This machine's own agent definitions (the CLI's configured default agent): a session whose lock is
        #: one of them, or names the same endpoint and key variable, runs here without asking (§14.13).
        self.own_locks: list[dict] = []

    def emit(self, event: RunEvent) -> None:
        self.listener(event)

    def _lease(self, ses: str, *, run: str | None = None, purpose: str = "run") -> Lease:
        return Lease.acquire(self.store, ses, run=run, purpose=purpose, backend=self.leases)

    # ================================================================ reading

    def run_state(self, info: SessionInfo, run: str) -> tuple[bytes, dict]:
        oid = info.runs.get(run)
        if oid is None:
            raise RunError(f"run {run} is not in session {info.id}; `kxen-agent session show {info.id}` lists its runs")
        return oid, self.read_run(info, run, oid)

    def read_run(self, info: SessionInfo, run: str, oid: bytes) -> dict:
        """The run state ``runs/<run>`` names, checked (§14.5) and checked to be that run's."""
        return read_run(self.store, info, run, oid)

    def latest_run(self, info: SessionInfo) -> tuple[str, bytes, dict] | None:
        best = None
        for run, oid in info.runs.items():
            st = self.read_run(info, run, oid)
            if best is None or st["index"] > best[2]["index"]:
                best = (run, oid, st)
        return best

    def journal_view(self, state: dict) -> JournalView:
        """The journal of run state ``state``, held from the last call and extended by the entries that are new
        since: a step costs O(new entries), not O(journal) (:class:`.run_reader.JournalView`)."""
        view = self._journals.get(state["id"])
        if view is None:
            view = self._journals[state["id"]] = JournalView(state["id"])
        view.sync(self.store, state.get("journal"))
        return view

    def journal(self, state: dict) -> list[dict]:
        """Every journal entry of a run, oldest first (callers must not mutate the entries)."""
        return list(self.journal_view(state).entries)

    def ops(self, state: dict) -> dict[str, dict]:
        """The latest entry of each op, in order of first appearance."""
        return dict(self.journal_view(state).latest)

    def commit(self, plan: StepPlan) -> Committed:
        """Make ``plan`` durable: its messages, journal entries and run state written, then its refs moved in one
        transaction under its fence (§14.6) — the one place a run writes. A move the §14.5/§14.6 tables forbid
        raises :class:`~kxen_agent.session.status.IllegalTransition` (a bug) before anything is written."""
        cur_oid, cur = plan.current if plan.current is not None else (None, None)
        view = None
        if plan.entries:
            assert cur is not None, "journal entries need the run's state"
            view = self.journal_view(cur)
            moved: dict[str, str] = {}
            for w in plan.entries:
                op = w.entry["op"]
                old = moved.get(op) or (view.latest[op]["state"] if op in view.latest else None)
                moved[op] = check_op_move(old, w.entry["state"])
        if plan.changes is not None:
            check_run_move(None if cur is None else cur["status"], plan.changes.get("status", (cur or {}).get("status")))
        written: list[tuple[bytes, dict, str | None]] = []
        # One step of the session's group under the run's fence: its objects and
        # ref change are one step-log record (§6.8), or nothing is written.
        with self.store.step(plan.group, fence=plan.fence) as step:
            head = plan.head
            if plan.messages:
                head = SessionStore(step).append_messages(plan.head, [dict(m) for m in plan.messages])
            journal = None if cur is None else cur.get("journal")
            for blob in plan.blobs:
                step.put("blob", blob)
            for w in plan.entries:
                e, text = _journal_entry(step, w, journal)
                journal = put(step, "journal", e)
                written.append((journal, e, text))
            updates = [RefUpdate("head", plan.head, head)] if head != plan.head else []
            state = None
            if plan.changes is not None:
                if cur is None:  # a run's first state: its startHead is the head this step makes
                    st = plain(dict(plan.changes, startHead=head))
                    updates.append(RefUpdate(f"runs/{plan.run}", None, oid := put(step, "run", st)))
                else:
                    st = dict(cur)
                    st.update(plan.changes)
                    st["previous"] = cur_oid
                    st["updatedNs"] = time.time_ns()
                    if written:
                        st["journal"] = journal
                    st = plain(st)  # the words as exact strings: what the encoder takes and a reader decodes
                    # The run's ref first, then head (the order of the steps' records since they exist).
                    updates.insert(0, RefUpdate(f"runs/{plan.run}", cur_oid, oid := put(step, "run", st)))
                state = (oid, st)
            if plan.meta is not None:
                updates.append(RefUpdate("meta", plan.meta[0], put(step, "session", dict(plan.meta[1]))))
            for u in updates:
                step.update(u.name, u.old, u.new)
            step.commit(plan.reason)
        if view is not None:
            for oid, e, text in written:
                view.add(oid, e, output=text)
        return Committed(head, state)

    def entry_output(self, e: dict) -> str | None:
        if "outputBlob" in e:
            return text_blob(self.store, e["outputBlob"])
        return e.get("output")

    def shown_status(self, ses: str, st: dict) -> str:
        """The status to show of run state ``st`` of session ``ses`` (:func:`~.run_status.shown_status`)."""
        return shown_status(self.store, ses, st, backend=self.leases)

    def result_of(self, info: SessionInfo, run: str, oid: bytes, st: dict) -> RunResult:
        unknown = [op for op, e in self.ops(st).items() if e["state"] == OpState.OUTCOME_UNKNOWN]
        ep = self.endpoint_of(info, st)
        return RunResult(info.id, run, st["status"], st["turn"], st["model"], st.get("result"), st.get("error"),
                         unknown, st.get("settled", False), ep.model, ep.base_url, st.get("retryOf"), st.get("usage"))

    def endpoint_of(self, info: SessionInfo, st: dict) -> ModelEndpoint:
        """The model and endpoint run state ``st`` uses (recorded, or the lock's for runs from before §14.5 had them)."""
        return model_endpoint(self.sessions.agent(info), recorded=st)

    def turn_usage(self, st: dict) -> list[dict]:
        """The usage of each turn of the run, oldest first, from its chain of states (§14.5 ``turnUsage``)."""
        return turn_usage(self.store, st)

    # ================================================================ entry points

    def start(self, workspace_path: str, task: str, agent_lock: dict, *, model: str | None = None,
              base_url: str | None = None, api_key_env: str | None = None) -> RunResult:
        """Create a Session bound to ``workspace_path`` and run its first task.

        ``model`` / ``base_url`` / ``api_key_env`` override the lock's for this run (recorded in it).
        The lock is this machine's (a definition it was given): its endpoint and key variable, and an
        overriding pair given here, are recorded as accepted (§14.13).
        """
        from kxen_agent.session.workspace import inspect_workspace

        check_fault_spec()  # a misspelt fault point is refused before anything is written
        lease_ttl_s()  # so is a bad KXEN_AGENT_LEASE_TTL_S (the lease is taken after the session exists)
        self._check_tools(agent_lock)
        endpoint = model_endpoint(agent_lock, model=model, base_url=base_url)
        check_key_env(agent_lock, api_key_env)
        self.providers(agent_lock, endpoint).close()  # and a lock no provider can be made from
        require_sdk(agent_lock)  # and a provider whose SDK is missing: before a session exists
        ws = inspect_workspace(workspace_path)
        info = self.sessions.create(agent_lock, ws)
        self.on_event(f"session {info.id} created, bound to {ws.root}")
        register(self.store, info.id, agent_lock, info.agent_oid, endpoint, api_key_env, given_url=base_url is not None)
        run = new_id("run")
        with self._lease(info.id, run=run) as lease:
            return self._new_run(info.id, run, task, lease, endpoint, key_env=api_key_env)

    def resume(self, ses: str, *, task: str | None = None, workspace: str | None = None,
               rebind: bool = False, retry: bool = False, model: str | None = None,
               base_url: str | None = None, api_key_env: str | None = None,
               agent_lock: dict | None = None) -> RunResult:
        """Continue the unfinished run of ``ses``, start a new one with ``task``, or retry the last one.

        ``retry``: a new run re-attempting the task of the latest run, which
        must be ``failed`` or ``canceled`` (else :class:`NothingToRetry`),
        from the current history, without a second copy of its task message.
        ``model`` / ``base_url`` override the model and endpoint: of the new
        run, or of the unfinished run resumed (which otherwise keeps those it
        recorded); a new run without them uses the lock's. ``api_key_env``
        names the key variable instead of the lock's (with ``base_url``: a
        pair the user accepts here, §14.13). ``agent_lock`` (``--agent
        FILE``) re-binds the session to a definition of this machine's: its
        model and endpoint replace those an unfinished run recorded.
        """
        check_fault_spec()
        url_given = base_url is not None  # on the command line (an --agent's endpoint is registered with its lock)
        if retry and task is not None:
            raise UsageError("--retry re-attempts the last run's task; give either --retry or --task, not both")
        info = self.sessions.get(ses)
        lock = self.sessions.agent(info) if agent_lock is None else agent_lock
        if agent_lock is not None:
            self._check_tools(agent_lock)
        if model is not None or base_url is not None:
            model_endpoint(lock, model=model, base_url=base_url)  # a bad override changes nothing
        check_key_env(lock, api_key_env)
        require_sdk(lock, find_only=True)  # imported when a provider is made: a refusal below needs no SDK
        if rebind:
            if workspace is None:
                raise UsageError("--rebind-workspace needs --workspace NEW_PATH")
            with self._lease(ses, purpose="rebind") as lease:
                info = self.sessions.rebind(ses, workspace, fence=lease.fence)
            self.on_event(f"session {ses} bound to {info.workspace.root}")
        else:
            self.sessions.check_workspace(info, workspace, rebind=False)
        new_run = new_id("run") if task is not None or retry else None
        snapshot = self.latest_run(info)  # names the run in the lease record; decided below
        with self._lease(ses, run=new_run or (snapshot[0] if snapshot else None)) as lease:
            # Decide under the lease, never from the snapshot: another process
            # may have started or finished a run since (two `--task` racing
            # must not both start one; a busy session is LeaseBusy, not "still running").
            info = self.sessions.get(ses)
            if agent_lock is not None:
                info = rebind_agent(self, info, agent_lock, lease)
                if model is None and base_url is None:  # the definition's, not what a run recorded
                    own = model_endpoint(agent_lock)
                    model, base_url = own.model, own.base_url
            latest = self.latest_run(info)
            # What the command line chose is this machine's choice (§14.13): an --agent definition, and an
            # endpoint given with a key variable given too or this machine's own lock's.
            if agent_lock is not None or (url_given and (
                    api_key_env is not None or lock_verdict(self.store, ses, info.agent_oid, lock, None, None,
                                                            locality=True, own=self.own_locks) is None)):
                register(self.store, ses, lock, info.agent_oid, model_endpoint(lock, model=model, base_url=base_url),
                         api_key_env, given_url=url_given, own=agent_lock is not None, var_chosen=True,
                         rebound=agent_lock is not None)
            if retry:
                assert new_run is not None
                retried = retryable(ses, latest)
                endpoint = model_endpoint(lock, model=model, base_url=base_url)
                return self._new_run(ses, new_run, retried[2]["task"], lease, endpoint, retry_of=retried[0],
                                     key_env=api_key_env)
            if new_run is not None:
                assert task is not None
                if latest is not None:
                    run, oid, st = latest
                    if st["status"] in TERMINAL and not st.get("settled"):
                        raise RunError(
                            f"run {run} of session {ses} is {st['status']} but its settlement was interrupted; "
                            f"finish it with `kxen-agent --resume {ses}` (no model or tool is called) before giving a new task"
                        )
                    if st["status"] not in TERMINAL:
                        raise RunError(
                            f"run {run} of session {ses} is still {st['status']}; finish it first with "
                            f"`kxen-agent --resume {ses}` (or resolve its UNKNOWN operations) before giving a new task"
                        )
                endpoint = model_endpoint(lock, model=model, base_url=base_url)
                return self._new_run(ses, new_run, task, lease, endpoint, key_env=api_key_env)
            if latest is None:
                raise NothingToResume(f"session {ses} has no run to resume; give a task with --task or --task-file")
            run, oid, st = latest
            if st["status"] in TERMINAL and st.get("settled"):
                raise NothingToResume(
                    f"nothing to resume: run {run} of session {ses} is {st['status']}; "
                    f"start a new run with `kxen-agent --resume {ses} --task TEXT`"
                    f"{'' if st['status'] == RunStatus.COMPLETED else f' or try it again with `kxen-agent --resume {ses} --retry`'}"
                )
            override = None
            if model is not None or base_url is not None:
                override = model_endpoint(lock, model=model, base_url=base_url, recorded=st)
            key = api_key_env if api_key_env is not None else (None if agent_lock is not None else _KEEP)
            require_sdk(lock)  # imported now: the refusals above need none
            return self._loop(ses, run, lease, override=override, key_env=key)

    # ================================================================ a new run

    def _new_run(self, ses: str, run: str, task: str, lease: Lease, endpoint: ModelEndpoint, *,
                 retry_of: str | None = None, key_env: str | None = None) -> RunResult:
        """Start run ``run`` of ``ses`` with ``task`` (the caller holds the lease) and run it.

        With ``retry_of`` the task is that run's (already stored, so already
        redacted) and no task message is added: the new run takes the
        history as it is.
        """
        info = self.sessions.get(ses)
        agent = self.sessions.agent(info)
        secrets = self._secrets(agent if key_env is None else dict(agent, api_key_env=key_env))
        latest = self.latest_run(info)
        index = 0 if latest is None else latest[2]["index"] + 1
        # What the loop needs first is read (and checked) before the start is
        # committed: a lock no provider can be made from, or a head message
        # that does not read, must refuse the task, not leave a run `running`
        # that every resume fails on.
        self.providers(agent, endpoint).close()
        require_sdk(agent)  # imported now, not before a refusal that needs none (exit 2, nothing written)
        if info.head is not None:
            self.sessions.read_message(info.head)
        now = time.time_ns()
        stored_task = task if retry_of is not None else _stored_text(task, secrets)
        st = {
            "id": run, "session": ses, "index": index, "task": stored_task,
            "model": endpoint.model, "agent": info.agent_oid,
            "status": RunStatus.RUNNING, "turn": 0, "result": None, "error": None, "settled": False,
            "startedNs": now, "updatedNs": now,
            "requestedModel": endpoint.model, "baseUrl": endpoint.base_url,
        }
        if retry_of is not None:
            st["retryOf"] = retry_of
        if key_env is not None:
            st["apiKeyEnv"] = key_env
        # AGENTS.md, recorded in the run (§14.5); its warnings (a file cut at the bound) told now.
        found = read_for_run(info.workspace.root, agent, secrets, lambda w: self.on_event(f"warning: run {run}: {w}"))
        # The task message (none for a retry: the retried run's is in the history) and the first state.
        assert retry_of is None or info.head is not None  # the retried run's task message at least
        task_msg = () if retry_of is not None else ({"role": "user", "run": run, "content": task_message_text(
            stored_task, None if latest is None else latest[2]["status"])},)
        self.commit(StepPlan(info.group, f"run {run}: start", lease.fence, info.head, task_msg, run, None,
                             {**st, **found.state}, blobs=found.blobs))
        self.on_event(f"run {run} started in session {ses}" + (f", retrying run {retry_of}" if retry_of else ""))
        return self._loop(ses, run, lease, new=True)

    # ================================================================ the loop

    def _loop(self, ses: str, run: str, lease: Lease, *, new: bool = False,
              override: ModelEndpoint | None = None, key_env: object = _KEEP) -> RunResult:
        """Run ``run`` on; ``override`` its model and endpoint from now on, ``key_env`` its key variable
        (a name, None for the lock's, :data:`_KEEP` for what the run recorded)."""
        ctx = _RunCtx(self, ses, run, lease)
        git_watch = GitInternalsWatch(ctx.info.workspace.root)  # .git/config, hooks/: Git runs what they name
        self.history.start(ses)  # a process's first run of a long session starts from its history index
        try:
            if override is not None and ctx.st["status"] not in TERMINAL and override != ctx.endpoint:
                ctx.update({"requestedModel": override.model, "baseUrl": override.base_url},
                           reason=f"run {run}: model {override.model} at {override.base_url or '-'} from now on")
                ctx.endpoint = override
                self.on_event(f"run {run} now uses model {override.model}"
                              + (f" at {override.base_url}" if override.base_url else ""))
            if (key_env is not _KEEP and ctx.st["status"] not in TERMINAL
                    and key_env != ctx.st.get("apiKeyEnv")):
                ctx.update({"apiKeyEnv": key_env}, reason=f"run {run}: key variable {key_env or '-'} from now on")
                ctx.refresh()
            self.emit(RunStarted(ses, run, ctx.st["index"], ctx.endpoint.model, ctx.endpoint.base_url,
                                 ctx.st.get("retryOf"), not new))
            ctx.loop()
        except _Stop:
            pass
        finally:
            ctx.close()
            self.activity = Activity("step")
            for changed in git_watch.changes():
                self.on_event(f"warning: run {run}: {changed} changed during the run; Git runs the programs it names "
                              "(core.fsmonitor, hooks): check it before running git there")
        if not self.cancel.is_set():  # a canceled run ends now; its background pass dies with the process, safely
            for line in filter(None, [self.history.finish(ses, self.sessions.get(ses).head)]):
                self.on_event(line)
            self.pack_loose(after_run=True)
        info = self.sessions.get(ses)
        oid, st = self.run_state(info, run)
        return self.result_of(info, run, oid, st)

    # ================================================================ resolve

    def resolve(self, ses: str, run: str, op: str, output: str, *, is_error: bool = False) -> dict:
        """Record a human-established outcome for exactly one UNKNOWN op.

        Never re-executes the operation; refuses an op that is not UNKNOWN.
        """
        with self._lease(ses, run=run, purpose="resolve") as lease:
            info = self.sessions.get(ses)
            oid, st = self.run_state(info, run)
            ops = self.ops(st)
            if op not in ops:
                raise RunError(f"operation {op} is not in run {run}; `kxen-agent run show {ses} {run}` lists them")
            e = ops[op]
            if not_resolvable(e, ses, run):
                raise RunError(not_resolvable(e, ses, run))
            if e["state"] != OpState.OUTCOME_UNKNOWN:
                raise RunError(
                    f"operation {op} is {e['state']}, not OutcomeUnknown: only an UNKNOWN operation can be resolved"
                )
            secrets = self._secrets(self.sessions.agent(info))
            ctx = _RunCtx(self, ses, run, lease)
            ctx.journal_write(
                [dict(e, state=OpState.OUTCOME_KNOWN, source=OpSource.HUMAN, isError=bool(is_error))],
                outputs=[_stored_text(output, secrets)],
                reason=f"run {run}: {op} resolved by a human",
            )
            return {"session": ses, "run": run, "op": op, "state": OpState.OUTCOME_KNOWN, "source": OpSource.HUMAN,
                    "isError": bool(is_error)}

    def decide(self, ses: str, run: str, op: str, *, yes: bool, reason: str | None = None) -> dict:
        """``run approve`` / ``run deny``: this state dir's decision on a call that waits (:func:`.pending.decide`)."""
        with self._lease(ses, run=run, purpose="approve" if yes else "deny") as lease:
            return decide(_RunCtx(self, ses, run, lease), op, yes=yes, reason=reason)

    # ================================================================ trust (§14.13)

    def trust_report(self, ses: str) -> dict:
        """What session ``ses`` would make this machine do that it has not accepted (``session trust``)."""
        return self._trust(ses, None, accept=None)  # reads only: no lease taken, nothing written

    def accept_trust(self, ses: str, *, refuse_calls: bool = False) -> dict:
        """Accept what ``trust_report`` shows: the lock (a trust record) and each pending call (a ``Decided``
        entry made here; ``refuse_calls``: refused instead, so they never run)."""
        info = self.sessions.get(ses)
        latest = self.latest_run(info)
        with self._lease(ses, run=latest[0] if latest else None, purpose="trust") as lease:
            return self._trust(ses, lease, accept=not refuse_calls)

    def _trust(self, ses: str, lease: Lease | None, *, accept: bool | None) -> dict:
        return trust_doc(self, ses, lambda run: _RunCtx(self, ses, run, lease), accept=accept)  # type: ignore[arg-type]

    # ================================================================ helpers

    def pack_loose(self, *, after_run: bool = False) -> None:
        """Pack loose objects if there are too many (:meth:`AutoPacker.step`: between turns in a background
        thread, after a run all of them); what it did is told, a failure (a full disk) is never the run's."""
        for line in self.autopack.step(after_run=after_run) if self.autopack is not None else ():
            self.on_event(line)

    def _check_tools(self, agent_lock: dict) -> None:
        for t in agent_lock.get("tools", []):
            if t not in TOOLS:
                raise UsageError(f"agent lock names unknown tool {t!r}")
        for note in record_listings(self.store, agent_lock, os.getcwd()):  # MCP servers' tool lists, into the lock
            self.on_event(note)

    @staticmethod
    def _secrets(agent: dict) -> list[str]:
        """The values every persisted text is redacted of (§14.11): the API key, and every
        credential-looking variable's of this process, whatever the agent's ``env_keep``."""
        name = agent.get("api_key_env")
        val = os.environ.get(name) if name else None
        return ([val] if val else []) + credential_env_values(os.environ)


def _journal_entry(store: ObjectStore, w: JournalWrite, previous: bytes | None) -> tuple[dict, str | None]:
    """The journal entry ``w`` stands for, linked after ``previous``, with its output inline or in a blob by
    size (§14.6); and the output's text (None: none, or kept as the entry carries it)."""
    e = dict(w.entry)
    e.pop("previous", None)
    text = None
    if w.output is not KEEP_OUTPUT:
        e.pop("output", None)
        e.pop("outputBlob", None)
        text = w.output
        if text is not None:
            raw = text.encode("utf-8")
            if len(raw) > OUTPUT_BLOB_THRESHOLD:
                e["outputBlob"] = store.put("blob", raw)
            else:
                e["output"] = text
    if previous is not None:
        e["previous"] = previous
    e["timeNs"] = time.time_ns()
    return plain(e), text


class _RunCtx(ToolTurn):
    """One pass of the loop for one run under one lease (its tool turn: :class:`.tool_call.ToolTurn`)."""

    def __init__(self, runner: Runner, ses: str, run: str, lease: Lease) -> None:
        self.r = runner
        self.store = runner.store
        self.sessions = runner.sessions
        self.ses = ses
        self.run = run
        self.lease = lease
        self.info = self.sessions.get(ses)
        self.oid, self.st = runner.run_state(self.info, run)
        check_tip(self.store, self.oid, self.st)  # a state that breaks §14.5 is damage, not a run to go on with
        self.agent = self.sessions.agent(self.info)
        if self.st.get("apiKeyEnv") is not None:  # the run's --api-key-env (§14.5) instead of the lock's
            self.agent = dict(self.agent, api_key_env=self.st["apiKeyEnv"])
        self.secrets = Runner._secrets(self.agent)
        self.endpoint = runner.endpoint_of(self.info, self.st)
        self._provider: Provider | None = None
        # What this process wrote itself needs no reflog to be trusted (§14.13): the assistant
        # messages it put on head, the operations it decided.
        self.asked_here: set[bytes] = set()
        self.decided_here: set[str] = set()
        self.gate = TrustGate(self)
        # Looked up now, not at import: tests replace the module's ``fault``.
        # Called straight from the loop's methods (a hook may look at its caller's frame).
        self.fault = runner.fault if runner.fault is not None else fault

    def stored(self, text: str) -> str:
        """``text`` as the run stores it (see :func:`_stored_text`)."""
        return _stored_text(text, self.secrets)

    @property
    def provider(self) -> Provider:
        # One provider (one connection pool) for the whole pass, made when first needed.
        if self._provider is None:
            self._provider = self.r.providers(self.agent, self.endpoint)
        return self._provider

    def close(self) -> None:
        self.close_mcp()
        if self._provider is not None:
            self._provider.close()
            self._provider = None

    # ---------------------------------------------------------------- writes

    def refresh(self) -> None:
        self.info = self.sessions.get(self.ses)
        self.oid, self.st = self.r.run_state(self.info, self.run)
        if self.st.get("apiKeyEnv") is not None:
            self.agent = dict(self.sessions.agent(self.info), api_key_env=self.st["apiKeyEnv"])
        else:
            self.agent = self.sessions.agent(self.info)
        self.secrets = Runner._secrets(self.agent)
        self.gate.forget()

    # ---------------------------------------------------------------- trust (§14.13)

    def origin(self) -> str:
        """This state dir's id, recorded in the decisions made here (§14.6 ``origin``)."""
        return TrustStore(self.store).origin()

    def pause_for_trust(self, problem: str) -> None:
        """The run waits in ``input_required`` until this machine decides (written once, however often resumed)."""
        if self.st["status"] != RunStatus.INPUT_REQUIRED or self.st.get("error") != problem:
            self.update({"status": RunStatus.INPUT_REQUIRED, "error": problem},
                        reason=f"run {self.run}: waits for this machine's decision")
        self.r.on_event(f"run {self.run} waits: {problem}")
        raise _Stop

    def step(self, reason: str, changes: dict | None = None, *, messages: Sequence[dict] = (),
             entries: Sequence[JournalWrite] = ()) -> StepPlan:
        """The plan of this run's next durable step (:class:`.plan.StepPlan`), from where the run is now."""
        return StepPlan(self.info.group, reason, self.lease.fence, self.info.head, tuple(messages), self.run,
                        (self.oid, self.st), changes, tuple(entries))

    def commit(self, plan: StepPlan) -> Committed:
        """:meth:`Runner.commit` ``plan``, then hold what it made durable."""
        done = self.r.commit(plan)
        if done.state is not None:
            self.oid, self.st = done.state
        if plan.messages:
            self.info = self.sessions.get(self.ses)
        return done

    def update(self, changes: dict, *, reason: str, messages: Sequence[dict] = ()) -> Committed:
        """One durable step: a new run state (and the messages appended to head), atomically."""
        return self.commit(self.step(reason, changes, messages=messages))

    def journal_write(self, entries: list[dict], *, reason: str, outputs: list | None = None,
                      changes: dict | None = None) -> None:
        """Append journal entries with their outputs (None, text, or :data:`.plan.KEEP_OUTPUT`) and a new run
        state (one durable step)."""
        writes = [JournalWrite(e, outputs[i] if outputs else None) for i, e in enumerate(entries)]
        self.commit(self.step(reason, changes or {}, entries=writes))

    # ---------------------------------------------------------------- the loop

    def loop(self) -> None:
        # What to do next is recovery.next_step's (a pure function of what is
        # durable); this loop reads its inputs — only those it needs — and carries it out.
        while True:
            st = self.st
            status = RunStatus(st["status"])
            view = None if status.terminal else self.r.journal_view(st)
            last = None
            if not status.terminal and status is not RunStatus.INPUT_REQUIRED and self.info.head is not None:
                last = self.sessions.read_message(self.info.head)
            step = next_step(self.run, status, bool(st.get("settled")),
                             None if last is None else LastMessage(last.role, last.run, bool(last.tool_calls)),
                             () if view is None else view.unsettled_states())
            if isinstance(step, (ResumeAfterResolution, RunTools, SettleThenAsk, AskModel)):
                problem = self.gate.problem()
                if problem is not None:
                    self.pause_for_trust(problem)
            if isinstance(step, FinishSettlement):
                self.finish_settlement()
                raise _Stop
            if isinstance(step, Stop):
                if step.why == WAITS_FOR_APPROVAL:
                    still_waiting(self)  # pauses again, listing what waits
                elif status is RunStatus.INPUT_REQUIRED:
                    self.r.on_event(f"run {self.run} waits for `run resolve` of its UNKNOWN operation(s)")
                raise _Stop
            if isinstance(step, ResumeAfterResolution):
                self.update({"status": RunStatus.RUNNING, **({"error": None} if st.get("error") else {})},
                            reason=f"run {self.run}: resumed after resolution")
                continue
            if isinstance(step, RunTools):
                assert last is not None
                assert view is not None
                self.tool_turn(last, view)
                continue
            if isinstance(step, SettleThenAsk):
                assert view is not None
                self.settle_turn(view)
            self.provider_turn()

    # ---------------------------------------------------------------- provider

    def provider_turn(self) -> None:
        if self.r.cancel.is_set():
            self.end(RunStatus.CANCELED, error="canceled by the user before the next model call")
        max_turns = self.agent.get("policy", {}).get("max_turns", 20)
        if self.st["turn"] >= max_turns:
            self.end(RunStatus.FAILED, error=f"max_turns ({max_turns}) reached without a final answer")
        self.r.pack_loose()  # before the model call: a turn boundary, outside every store lock
        # Held in memory (only the messages added since the last turn are read), from the latest
        # compaction on; compacts first when over budget.
        messages = self.provider_history(model_preamble(self.store, self.agent, self.st))
        specs = tool_specs(self.agent.get("tools", [])) + mcp_specs(self.agent)
        number = self.st["turn"] + 1
        where = self.endpoint.base_url or f"the {self.agent.get('provider')} provider"

        def attempt(n: int) -> AssistantTurn:
            self.r.emit(TurnStarted(self.ses, self.run, number, n))
            self.r.activity = Activity("model", endpoint=where)
            first = True

            def on_text(piece: str) -> None:
                nonlocal first
                self.r.emit(TextDelta(self.ses, self.run, number, self.stored(piece)))
                if first:
                    first = False
                    self.fault("provider:mid-stream")

            try:
                return self.provider.complete(messages, specs, cancel=self.r.cancel,
                                              on_text=on_text if self.r.stream else None)
            finally:
                self.r.activity = Activity("step")

        def on_retry(note: RetryNote) -> None:
            self.r.activity = Activity("retry-wait", endpoint=where)
            self.r.emit(ProviderRetry(self.ses, self.run, number, note.attempt, note.max_attempts,
                                      round(note.wait_s, 3), self.stored(str(note.error))))

        try:
            turn = call_with_retries(attempt, policy=self.r.retry_policy, cancel=self.r.cancel, on_retry=on_retry)
            # Nobody holds the request any more (a provider does not keep it past the call): the history
            # may extend it for the next turn instead of copying it.
            self.r.history.give_back(messages)
        except ProviderCanceled:
            # Whatever the request was doing (sending, streaming, failing,
            # waiting to be retried): the user's Ctrl-C decides.
            self.end(RunStatus.CANCELED, error=f"canceled by the user during the model call to {where}; the request was "
                                       "aborted and nothing of its answer was recorded")
        except ProviderGaveUp as e:
            self.end(RunStatus.FAILED, error=self.stored(f"provider error: {e}; `kxen-agent --resume {self.ses} --retry` "
                                                 "tries the task again"))
        finally:
            self.r.activity = Activity("step")
        self.fault("provider:after-response")
        usage = _usage_json(turn.usage) if turn.usage is not None else None
        counted = {"usage": sum_usage([self.st.get("usage"), usage]),
                   "turnUsage": None if usage is None else {"turn": number, **usage}}
        if counted["usage"] is None:
            del counted["usage"]
        if self.r.cancel.is_set() and not turn.tool_calls:
            # A final answer that arrives after Ctrl-C does not complete the
            # run (tool calls are recorded, and reported "not run", below).
            self.end(RunStatus.CANCELED, error="canceled by the user while the model was answering; its answer was not recorded",
                     changes=counted)
        unusable = unusable_answer(turn, number, self.ses, self.agent)
        if unusable is not None:
            self.end(RunStatus.FAILED, error=unusable, changes=counted)
        content = self.stored(turn.content) if turn.content is not None else None
        finished = TurnFinished(self.ses, self.run, number, turn.finish_reason, tuple(c.name for c in turn.tool_calls), usage)
        if turn.tool_calls:
            calls = []
            seen: set[str] = set()
            for n, c in enumerate(turn.tool_calls):
                # The journal and the history pair a result with its call by
                # id; some OpenAI-compatible servers omit ids or repeat them
                # within a turn, so those calls get a unique id of ours.
                cid = c.id
                if not cid or cid in seen:
                    cid = f"call_{number}_{n}"
                    while cid in seen:
                        cid += "_"
                seen.add(cid)
                calls.append({"id": cid, "name": c.name, "arguments": self.stored(c.arguments)})
            # The message and the state that counts its turn in one step (gc cannot prune the new objects
            # before the head moves: Runner.commit writes them in one Store.step).
            new_head = self.update({"turn": number, "model": turn.model, **counted},
                                   reason=f"run {self.run}: turn {number} asks for {len(calls)} tool call(s)",
                                   messages=[{"role": "assistant", "content": content, "tool_calls": calls,
                                              "run": self.run}]).head
            assert new_head is not None
            self.asked_here.add(new_head)
            self.r.emit(finished)
            return
        # Final answer, settled in two phases (result, message, settled).
        self.update({"turn": number, "model": turn.model, "status": RunStatus.COMPLETED,
                     "result": content or "", "settled": False, **counted},
                    reason=f"run {self.run}: result saved")
        self.r.emit(finished)
        self.fault("run:after-result")
        self.finish_settlement()
        raise _Stop

    def provider_history(self, before: list[dict]) -> list[dict]:
        """``before``, then the provider view for the next model call, compacting first when it is over the
        budget (:mod:`.compaction` plans the step; a summary that fails or is canceled ends the run)."""
        request, over = over_budget(self.r.history, self.info.head, before, self.agent, self.st)
        if over is None:
            return request
        self.r.on_event(f"run {self.run}: the model's view is about {over.size} tokens, over context_tokens "
                        f"({over.budget}); asking the model to summarize it")
        number = self.st["turn"] + 1

        def on_retry(note: RetryNote) -> None:
            self.r.activity = Activity("retry-wait", endpoint=self.endpoint.base_url)
            self.r.emit(ProviderRetry(self.ses, self.run, number, note.attempt, note.max_attempts,
                                      round(note.wait_s, 3), self.stored(str(note.error))))

        try:
            turn = ask_summary(self.provider, over, cancel=self.r.cancel, policy=self.r.retry_policy,
                               on_retry=on_retry, on_activity=lambda a: setattr(self.r, "activity", a))
        except (ProviderCanceled, ProviderGaveUp) as e:
            turn, plan = None, summary_interrupted(self.ses, isinstance(e, ProviderCanceled), e, self.stored)
        finally:
            self.r.activity = Activity("step")
        if turn is not None:
            self.fault("compaction:after-response")
            plan = plan_compaction(turn, st=self.st, through=self.info.head, run=self.run, ses=self.ses,
                                   stored=self.stored)
        if plan.end is not None:
            self.end(*plan.end, changes=dict(plan.changes))
        assert plan.message is not None
        held = len(self.r.history)
        self.update(dict(plan.changes), reason=plan.reason, messages=[plan.message])
        self.r.on_event(f"run {self.run}: history compacted ({held} messages summarized in {msg_id(self.info.head)})")
        self.fault("compaction:after-message")
        return held_view(self.r.history, self.info.head, before)

    def finish_settlement(self) -> None:
        """Write the final message (idempotently) if the run completed, then mark settled."""
        if self.st["status"] == RunStatus.COMPLETED:
            content = self.st.get("result") or ""
            head = self.info.head
            # Idempotent: the message is a pure function of (parent, content),
            # so after a crash it is either the head already or written now.
            last = self.sessions.read_message(head) if head is not None else None
            if not (last is not None and last.run == self.run and last.role == "assistant"
                    and not last.tool_calls and last.content == content):
                self.commit(self.step(f"run {self.run}: final message",
                                      messages=[{"role": "assistant", "content": content, "run": self.run}]))
            self.fault("run:after-final-message")
        self.update({"settled": True}, reason=f"run {self.run}: settled")
        self.r.on_event(f"run {self.run} {self.st['status']}")

    def end(self, status: str, *, error: str | None = None, changes: dict | None = None) -> None:
        self.update({"status": status, "error": error, "settled": True, **(changes or {})},
                    reason=f"run {self.run}: {status}")
        self.r.on_event(f"run {self.run} {status}" + (f": {error}" if error else ""))
        raise _Stop
