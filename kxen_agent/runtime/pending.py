"""Calls that wait for a person (``objects_spec.md`` §14.6 ``PendingApproval``): the pause, its words, the decision.

A call that ``[policy] approve`` lists and that nobody at a terminal can
answer (standard input is not a terminal, no ``--yes``) is not refused in
the user's name: it gets a ``PendingApproval`` entry and the run waits in
``input_required`` (exit 3), its ``error`` naming the calls and the commands
that decide them. Nothing after the first waiting call of a turn runs (the
model asked for its calls in order); the later calls of the turn that need a
decision wait with it, so one look decides them all.

A person decides with ``run approve`` / ``run deny`` (:func:`decide`), from
any terminal, on the state dir that will run the call: the decision is a
``Decided`` entry (``approver`` ``user-command``, ``source`` ``human``)
committed in a step of its own whose reason names the operation, so this
state dir's reflog proves it made it (§14.6: a decision recorded in another
state dir is never acted on; such a call can be decided here again). Then
``--resume`` runs the approved calls, gives the denied ones their refusal
(with the person's reason, which the model is shown), and goes on; a resume
while a call still waits pauses again, listing what waits
(:func:`still_waiting`). ``run resolve`` settles UNKNOWN outcomes, not
approvals (:func:`not_resolvable`).

Everything here writes through the run context's one writer
(``runner._RunCtx.journal_write``, i.e. :meth:`~.runner.Runner.commit`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kxen_agent.session.status import Approval, ApproverName, OpSource, OpState, RunStatus

from .results import RunError

if TYPE_CHECKING:
    from .runner import _RunCtx

__all__ = ["approve_commands", "decide", "not_resolvable", "pause", "still_waiting", "waiting_text"]

#: Keys of a call's entry that a new decision does not copy (they belong to the entry or to the old decision).
_NOT_COPIED = ("previous", "output", "outputBlob", "timeNs", "state", "source", "note", "approval", "approver",
               "origin", "reason", "isError")


def _summary(arguments: str, limit: int = 120) -> str:
    try:
        text = json.dumps(json.loads(arguments), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        text = arguments
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def approve_commands(ses: str, op: str) -> tuple[str, str]:
    """The two commands that decide operation ``op`` of session ``ses`` (its run is found from ``op``)."""
    return f"kxen-agent run approve {ses} {op}", f"kxen-agent run deny {ses} {op} --reason TEXT"


def waiting_text(ses: str, entries: list[dict]) -> str:
    """The run's ``error`` while ``entries`` (``PendingApproval``) wait: what they are and how to decide them."""
    calls = "; ".join(f"{e['op']} {e['tool']} {_summary(e['arguments'])}" for e in entries)
    if len(entries) == 1:
        yes, no = approve_commands(ses, entries[0]["op"])
        how = f"approve it with `{yes}` or deny it with `{no}`"
    else:
        yes, no = approve_commands(ses, "OP")
        how = f"decide each with `{yes}` or `{no}`"
    return (f"{len(entries)} tool call(s) wait for approval (nobody at a terminal to ask): {calls}; {how} "
            f"(`kxen-agent run show {ses}` shows the arguments), then `kxen-agent --resume {ses}`")


def pause(ctx: _RunCtx, new: list[dict], waiting: list[dict]) -> None:
    """Journal the ``PendingApproval`` entries ``new`` and move the run to ``input_required`` in one step;
    ``waiting``: every call of the turn that waits (``new`` among them). The caller then ends the pass."""
    text = ctx.stored(waiting_text(ctx.ses, waiting))
    if new or ctx.st["status"] != RunStatus.INPUT_REQUIRED or ctx.st.get("error") != text:
        ctx.journal_write(new, reason=f"run {ctx.run}: {len(new)} call(s) wait for approval",
                          changes={"status": RunStatus.INPUT_REQUIRED, "error": text})
    for e in new:  # what waits is said once, in the run's result (its error)
        ctx.r.on_event(f"{e['op']}: {e['tool']} waits for approval (nobody at a terminal to ask)")


def _waiting(ctx: _RunCtx) -> list[dict]:
    return [e for e in ctx.r.journal_view(ctx.st).latest.values() if e["state"] == OpState.PENDING_APPROVAL]


def still_waiting(ctx: _RunCtx) -> None:
    """A resume that finds calls still waiting: it pauses again, listing them (the ``error`` kept current)."""
    pause(ctx, [], _waiting(ctx))


def not_resolvable(e: dict, ses: str, run: str) -> str | None:
    """Why ``run resolve`` refuses the op whose newest entry is ``e`` when it waits for approval, else None."""
    if e["state"] != OpState.PENDING_APPROVAL:
        return None
    yes, no = approve_commands(ses, e["op"])
    return (f"operation {e['op']} of run {run} waits for approval, its outcome is not unknown (it never ran): "
            f"`run resolve` settles UNKNOWN outcomes; decide it with `{yes}` or `{no}`")


def decide(ctx: _RunCtx, op: str, *, yes: bool, reason: str | None = None) -> dict:
    """Record this state dir's decision on operation ``op``, which waits for approval (or was decided on
    another state dir): a ``Decided`` entry in a step of its own (§14.6). The caller holds the lease."""
    ses, run = ctx.ses, ctx.run
    e = ctx.r.journal_view(ctx.st).latest.get(op)
    verb = "approve" if yes else "deny"
    if e is None:
        raise RunError(f"operation {op} is not in run {run}; `kxen-agent run show {ses} {run}` lists them")
    elsewhere = e["state"] == OpState.DECIDED and not ctx.gate.decided_here(op)
    if e["state"] != OpState.PENDING_APPROVAL and not elsewhere:
        if e["state"] == OpState.DECIDED:
            said = "approved" if e.get("approval") == Approval.YES else "refused"
            raise RunError(f"operation {op} of run {run} was {said} here already ({e.get('approver')}); a decision "
                           f"is made once: `kxen-agent --resume {ses}` carries it out")
        raise RunError(f"operation {op} of run {run} is {e['state']}, not waiting for approval: only a call in "
                       f"PendingApproval can be approved or denied (`kxen-agent run show {ses} {run}`)")
    if yes and reason:
        raise RunError("--reason goes with `run deny` (what the model is told); `run approve` takes none")
    base = {k: v for k, v in e.items() if k not in _NOT_COPIED}
    entry = dict(base, state=OpState.DECIDED, source=OpSource.HUMAN, approval=Approval.YES if yes else Approval.NO,
                 approver=ApproverName.USER_COMMAND, origin=ctx.origin())
    if reason:
        entry["reason"] = ctx.stored(reason)
    left = [w for w in _waiting(ctx) if w["op"] != op]
    # One entry in the step, its reason naming the op: this state dir's reflog then proves the decision its own.
    ctx.journal_write([entry], reason=f"run {run}: {op} {'approved' if yes else 'refused'} (run {verb})",
                      changes={"error": ctx.stored(waiting_text(ses, left))} if left else {})
    ctx.decided_here.add(op)
    return {"session": ses, "run": run, "op": op, "tool": e["tool"], "approval": entry["approval"],
            "approver": entry["approver"], "reason": entry.get("reason"), "waiting": [w["op"] for w in left]}
