"""Compaction: the model's view of a long history kept under a budget, with nothing lost.

This module owns three things. The *provider view* (:func:`provider_view`):
what the model is shown of a history — everything, or, from the latest
``compaction`` message on (§14.4), that message's summary followed by the
messages after the last one it summarizes (``through``). Its *size*
(:func:`view_tokens`): the larger of a text-length estimate
(:data:`CHARS_PER_TOKEN` characters a token) and, when the provider reported
it, the previous answer's input plus output tokens (that request was a prefix
of this one). And the *compaction step*: when the view is over the lock's
``policy.context_tokens`` before a model call, (:func:`over_budget`) the run asks the
model for a summary (a provider call under the one retry policy, like any
turn), and :func:`plan_compaction` makes the :class:`CompactionPlan` the
runner commits: the ``compaction`` message and its run state in one durable
step, or the end of the run (this module never writes a run's state);
``session compact`` does the same on demand
(:func:`compact_session`).

The full history always stays in the session: ``session log``, ``fork --at``
any message, export and import see every message, and a fork before a
compaction message has the full, uncompacted view. A crash in the middle of
a compaction leaves nothing of it: the resume finds the view over the budget
again and asks again, as for any provider step whose answer was not durable.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kxen_agent.errors import UsageError
from kxen_agent.session.sessions import Message, msg_id
from kxen_agent.session.status import RunStatus
from kxen_agent.store import CorruptObject

from .events import Activity
from .history import RunHistory
from .lease import Lease
from .mcp_tools import mcp_specs
from .plan import StepPlan
from .providers import AssistantTurn, Provider, model_endpoint, require_sdk
from .redaction import redact
from .results import CUT_SHORT, TERMINAL, RunError, _usage_json, sum_usage
from .retry import RetryNote, RetryPolicy, call_with_retries
from .tools import tool_specs

if TYPE_CHECKING:
    from .runner import Runner

__all__ = ["CHARS_PER_TOKEN", "CompactionPlan", "Overflow", "SUMMARY_PREFIX", "SUMMARY_REQUEST", "ask_summary",
           "compact_session", "held_view", "over_budget", "plan_compaction", "provider_view", "summary_interrupted",
           "view_tokens"]

#: The text-length estimate's rate (a common rule of thumb for English text and code).
CHARS_PER_TOKEN = 4
#: What the model is shown in place of the messages a compaction summarizes.
SUMMARY_PREFIX = "[Earlier messages of this conversation were compacted into this summary.]\n\n"
#: The request that asks for the summary (after the view it summarizes).
SUMMARY_REQUEST = (
    "The conversation is getting too long for your context window. Write a summary of it for yourself to "
    "continue from: the task as the user gave it, what has been done so far (files read and changed, commands "
    "run and their results), what you learned, and what remains to do next. Answer with the summary only, as "
    "plain text; do not call any tool.")


def provider_view(history: list[Message]) -> list[dict]:
    """The messages the provider is shown of ``history`` (oldest first), in the provider seam's form."""
    start = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == "compaction"), None)
    latest = None if start is None else (
        start, next((i for i in range(start - 1, -1, -1) if history[i].oid == history[start].through), None))
    return _view([m.to_provider() for m in history], latest, lambda i: history[i].oid)


def held_view(history: RunHistory, head: bytes | None, before: Sequence[dict] = ()) -> list[dict]:
    """``before``, then :func:`provider_view` of the history ending at ``head``, from the run's in-memory
    history (read from the store only for the messages it does not hold yet). Without a compaction it is
    the list :meth:`RunHistory.messages` hands out (not to be modified)."""
    return _view(history.messages(head, before), history.latest_compaction(), history.oid_at, skip=len(before))


def _view(messages: list[dict], latest: tuple[int, int | None] | None, oid_at: Callable[[int], bytes],
          skip: int = 0) -> list[dict]:
    """The rule of both views: ``messages[:skip]`` (the system message), then of the history
    ``messages[skip:]`` (provider form) everything, or, with ``latest`` (the position in that history of the
    newest compaction message and of the message it summarizes through, None if that is not an earlier
    message), the summary and the messages after ``through`` but compaction messages. Without a
    compaction it is ``messages`` itself, not a copy."""
    if latest is None:
        return messages
    at, through = latest
    if through is None:
        raise CorruptObject(oid_at(at).hex(), "compaction message whose 'through' is not an earlier "
                            "message of its history (§14.4); `kxen-agent fsck` lists every damaged object")
    view = [*messages[:skip], {"role": "user", "content": SUMMARY_PREFIX + (messages[skip + at].get("content") or "")}]
    return view + [m for m in messages[skip + through + 1:] if m["role"] != "compaction"]


def _chars(view: list[dict]) -> int:
    n = 0
    for m in view:
        n += len(m.get("content") or "")
        for c in m.get("tool_calls") or ():
            n += len(c["name"]) + len(c["arguments"])
    return n


def view_tokens(system: str, view: list[dict], specs: list[dict], reported: int | None = None) -> int:
    """The size of a request in tokens: a text-length estimate, or ``reported`` when that is larger."""
    estimate = (len(system) + len(json.dumps(specs)) + _chars(view)) // CHARS_PER_TOKEN + 4 * len(view)
    return max(estimate, reported or 0)


def _ask_summary(provider: Provider, system: str, view: list[dict], specs: list[dict], *, cancel: threading.Event,
                 policy: RetryPolicy, on_retry: Callable[[RetryNote], None],
                 on_activity: Callable[[Activity], None]) -> AssistantTurn:
    """The model's summary of ``view`` (raises ProviderCanceled / ProviderGaveUp as a turn's call does)."""
    messages = [{"role": "system", "content": system}, *view, {"role": "user", "content": SUMMARY_REQUEST}]

    def attempt(n: int) -> AssistantTurn:
        on_activity(Activity("model", endpoint=provider.base_url))
        try:
            # The tools are described (a history holding tool calls needs them), but the request asks for none.
            return provider.complete(messages, specs, cancel=cancel)
        finally:
            on_activity(Activity("step"))

    return call_with_retries(attempt, policy=policy, cancel=cancel, on_retry=on_retry)


def _summary_problem(turn: AssistantTurn) -> str | None:
    if turn.finish_reason in CUT_SHORT:
        return f"the model's summary {CUT_SHORT[turn.finish_reason]} (finish_reason '{turn.finish_reason}')"
    if not (turn.content or "").strip():
        return "the model answered the request for a summary with no text"
    return None


# ---------------------------------------------------------------- in a run

@dataclass(frozen=True)
class Overflow:
    """A run's provider view over its lock's ``context_tokens``: what to summarize, and the figures."""

    view: list[dict]
    system: str
    specs: list[dict]
    size: int
    budget: int


def over_budget(held: RunHistory, head: bytes | None, before: Sequence[dict], agent: Mapping[str, Any],
                st: Mapping[str, Any]) -> tuple[list[dict], Overflow | None]:
    """``before`` (the system message), then the provider view of the run's history at ``head``; and, when
    that view is over the lock's budget, what to summarize (None: send the request as it is)."""
    request = held_view(held, head, before)
    budget = agent.get("policy", {}).get("context_tokens")
    if budget is None or not len(held) or held.last_role() == "compaction":
        return request, None  # no budget, or nothing new since the last compaction: compacting again would not help
    view = request[len(before):]  # a copy as long as the view, which compaction keeps within the budget
    system = agent.get("system", "")
    specs = tool_specs(agent.get("tools", [])) + mcp_specs(agent)  # what the model is sent, MCP tools too
    tu = st.get("turnUsage")
    reported = (tu["inputTokens"] + tu["outputTokens"]
                if tu is not None and tu["turn"] > st.get("compactedTurn", -1) else None)
    size = view_tokens(system, view, specs, reported)
    return request, (None if size <= budget else Overflow(view, system, specs, size, budget))


def ask_summary(provider: Provider, over: Overflow, **kw: Any) -> AssistantTurn:
    """The model's summary of ``over`` (``kw``: :func:`_ask_summary`'s; raises as a turn's call does)."""
    return _ask_summary(provider, over.system, over.view, over.specs, **kw)


@dataclass(frozen=True)
class CompactionPlan:
    """What a run commits after asking for a summary: the ``compaction`` message appended to head with the
    run-state ``changes`` (``compactedTurn``, ``usage``), in one step; or, with ``end`` (status, error),
    the end of the run (``changes``: the usage the answer cost, counted all the same)."""

    changes: Mapping[str, Any]
    reason: str = ""
    message: Mapping[str, Any] | None = None
    end: tuple[RunStatus, str] | None = None


def summary_interrupted(ses: str, canceled: bool, error: BaseException, stored: Callable[[str], str]) -> CompactionPlan:
    """The end of a run whose summary request was canceled (``canceled``) or given up on."""
    if canceled:
        return CompactionPlan({}, end=(RunStatus.CANCELED, "canceled by the user while the model was summarizing "
                                       "the history (compaction); nothing of it was recorded"))
    return CompactionPlan({}, end=(RunStatus.FAILED, stored(f"provider error while compacting the history: {error}; "
                                                            f"`kxen-agent --resume {ses} --retry` tries the task again")))


def plan_compaction(turn: AssistantTurn, *, st: Mapping[str, Any], through: bytes, run: str, ses: str,
                    stored: Callable[[str], str]) -> CompactionPlan:
    """The step that records the summary ``turn`` of the history through ``through`` (the session's head),
    or the end of the run if the answer is no summary."""
    usage = _usage_json(turn.usage) if turn.usage is not None else None
    counted = {} if usage is None else {"usage": sum_usage([st.get("usage"), usage])}
    problem = _summary_problem(turn)
    if problem is not None:
        return CompactionPlan(counted, end=(RunStatus.FAILED, f"{problem}; the history was not compacted; "
                                            f"`kxen-agent --resume {ses} --retry` asks again"))
    return CompactionPlan({"compactedTurn": st["turn"], **counted},
                          f"run {run}: compacted the history through {msg_id(through)}",
                          {"role": "compaction", "content": stored(turn.content), "through": through, "run": run})


# ---------------------------------------------------------------- on demand

def compact_session(runner: Runner, ses: str, at: str | None = None) -> dict:
    """``session compact SES [--at MSG]``: summarize the history through MSG (default: all of it).

    Takes the session's lease; refuses while its latest run is unfinished
    (the message would come between that run's steps), for the script
    provider, for an empty history, and for a point that would split a
    turn's tool calls from their results. The summary is asked of the
    lock's model and endpoint.
    """
    info = runner.sessions.get(ses)
    lock = runner.sessions.agent(info)
    if lock.get("provider") == "script":
        raise UsageError(f"session {ses} uses the script provider, which cannot summarize; compaction needs a model")
    require_sdk(lock)
    with Lease.acquire(runner.store, ses, purpose="compact", backend=runner.leases) as lease:
        info = runner.sessions.get(ses)
        latest = runner.latest_run(info)
        if latest is not None and not (latest[2]["status"] in TERMINAL and latest[2].get("settled")):
            raise RunError(f"run {latest[0]} of session {ses} is unfinished ({latest[2]['status']}); finish it with "
                           f"`kxen-agent --resume {ses}` before compacting")
        if info.head is None:
            raise UsageError(f"session {ses} has no messages to compact")
        history = runner.sessions.history(info.head)
        through = runner.sessions.resolve_message(info, at) if at is not None else info.head
        n = next(i for i, m in enumerate(history) if m.oid == through)
        if history[n].role == "compaction":
            raise UsageError(f"{msg_id(through)} is a compaction message; compact through a message after it")
        if n + 1 < len(history) and history[n + 1].role == "tool":
            raise UsageError(f"{msg_id(through)} is followed by tool results of the same turn; compacting through "
                             "it would part them from their calls; pick the turn's last tool message")
        view = provider_view(history[: n + 1])
        provider = runner.providers(lock, model_endpoint(lock))
        try:
            turn = _ask_summary(provider, lock.get("system", ""), view, tool_specs(lock.get("tools", [])) + mcp_specs(lock),
                                cancel=runner.cancel, policy=runner.retry_policy,
                                on_retry=lambda note: runner.on_event(
                                    f"retrying the summary in {note.wait_s:.1f}s: {note.error}"),
                                on_activity=lambda a: setattr(runner, "activity", a))
        finally:
            provider.close()
        problem = _summary_problem(turn)
        if problem is not None:
            raise RunError(f"{problem}; session {ses} was not compacted; try again")
        secrets = runner._secrets(lock)
        new_head = runner.commit(StepPlan(
            info.group, f"session: compact through {msg_id(through)}", lease.fence, info.head,
            ({"role": "compaction", "content": redact(turn.content or "", secrets), "through": through},))).head
    usage = _usage_json(turn.usage) if turn.usage is not None else None
    return {"session": ses, "message": msg_id(new_head), "through": msg_id(through), "summarized": n + 1,
            "usage": usage}
