"""Approvals: a person says yes or no to a tool call before it can change anything.

This module owns the decision that ``[policy] approve`` (§14.2) asks for:
which calls need one (:func:`needs_approval`: a tool the lock lists, which
has side effects, called as the agent may call it), who decides
(:class:`Approver`: :class:`TerminalApprover` asks on the terminal; without
one, or with ``--yes``, the policy decides), and the durable step that
records it (:func:`plan_approval`, an :class:`ApprovalPlan` the runner
commits): a ``Decided`` journal entry (§14.6)
written *before* ``Started``, so a crash after the answer never asks twice
and a crash before it asks again. A refusal becomes the call's error
outcome (``refused by the user``) and the run goes on; "always" holds for
the rest of the run, read back from the journal (a resumed run remembers).

It never runs a tool and never writes anything: it returns the steps, the
runner commits them.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# Who decided (§14.6 ``approver``): a person at the terminal (once, or "always" for the tool in this run),
# the run's ``--yes``, or no terminal to ask at (refused).
from kxen_agent.session.schema import APPROVERS
from kxen_agent.session.status import Approval, ApproverName, OpSource, OpState

from .trust import TRUST_APPROVER  # the approver of a decision `session trust` made (§14.6)

__all__ = [
    "APPROVERS",
    "REFUSED",
    "TRUST_APPROVER",
    "ApprovalRequest",
    "Approver",
    "Decision",
    "ApprovalPlan",
    "TerminalApprover",
    "plan_approval",
    "needs_approval",
    "refuse_without_terminal",
]

#: The output of a call the user refused (its outcome: an error).
REFUSED = "refused by the user"
_POLL_S = 0.05


@dataclass(frozen=True)
class ApprovalRequest:
    """One call waiting for a decision."""

    session: str
    run: str
    op: str
    tool: str
    arguments: str  # JSON text, as stored


@dataclass(frozen=True)
class Decision:
    """``approval`` ``yes`` or ``no``; ``approver`` one of :data:`APPROVERS`."""

    approval: str
    approver: str

    @property
    def source(self) -> str:
        """The journal's ``source``: ``human`` when a person answered, ``policy`` when the flags decided."""
        return OpSource.HUMAN if ApproverName(self.approver).human else OpSource.POLICY


class Approver(Protocol):
    """Decides one call; None when ``cancel`` was set while it waited (nothing is decided)."""

    def __call__(self, request: ApprovalRequest, cancel: threading.Event) -> Decision | None: ...


def refuse_without_terminal(request: ApprovalRequest, cancel: threading.Event) -> Decision:
    """The default: nobody can be asked, so the call is refused."""
    return Decision(Approval.NO, ApproverName.NO_TERMINAL)


def needs_approval(agent: dict, tool: str, side_effects: bool) -> bool:
    """Whether a call of ``tool`` waits for a decision under the lock ``agent`` (read-only tools never do)."""
    return side_effects and tool in agent.get("policy", {}).get("approve", ())


_TERMINAL_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown(arguments: str, limit: int = 4000) -> str:
    """The arguments as a person reads them: indented JSON, C1 controls masked (no escape reaches the terminal)."""
    try:
        text = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        text = json.dumps(arguments, ensure_ascii=False)
    # Inside JSON strings only (json.dumps writes nothing else raw), so a \u escape is the same character:
    # no C1 control, bidi override or isolate, line separator or lone surrogate reaches the terminal.
    text = _TERMINAL_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


class TerminalApprover:
    """Asks on the terminal: ``y`` (yes), ``n`` (no), ``a`` (always for this run's calls of the tool).

    With ``assume_yes`` (``--yes``) it asks nobody and approves. When
    ``fd`` (standard input) is not a terminal it asks nobody and refuses.
    The question goes to ``write`` (standard error); the answer is read
    from ``fd`` a line at a time, looking at ``cancel`` between polls, so
    Ctrl-C while it waits leaves the call undecided. End of input is "no".
    """

    def __init__(self, *, assume_yes: bool = False, fd: int = 0,
                 write: Callable[[str], Any] | None = None) -> None:
        self.assume_yes = assume_yes
        self.fd = fd
        self.write = write or (lambda s: (sys.stderr.write(s), sys.stderr.flush()))

    def __call__(self, request: ApprovalRequest, cancel: threading.Event) -> Decision | None:
        if self.assume_yes:
            return Decision(Approval.YES, ApproverName.YES_FLAG)
        if not os.isatty(self.fd):
            return Decision(Approval.NO, ApproverName.NO_TERMINAL)
        self.write(f"\nkxen-agent: run {request.run} wants to call {request.tool} ({request.op}) with:\n"
                   f"{_shown(request.arguments)}\n")
        while True:
            self.write(f"allow {request.tool}? [y]es / [n]o / [a]lways for this run: ")
            line = self._read_line(cancel)
            if line is None:
                self.write("\n")
                return None
            answer = line.strip().lower()
            if answer in ("y", "yes"):
                return Decision(Approval.YES, ApproverName.USER)
            if answer in ("a", "always"):
                return Decision(Approval.YES, ApproverName.USER_ALWAYS)
            if answer in ("n", "no") or line == "":  # "" is end of input
                return Decision(Approval.NO, ApproverName.USER)
            self.write(f"please answer y, n or a (got {answer[:20]!r})\n")

    def _read_line(self, cancel: threading.Event) -> str | None:
        """One line from ``fd`` ('' at end of input), or None if ``cancel`` is set first."""
        buf = b""
        while not buf.endswith(b"\n"):
            if cancel.is_set():
                return None
            ready, _, _ = select.select([self.fd], [], [], _POLL_S)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 1)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return buf.decode("utf-8", "replace") or ""
            buf += chunk
        return buf.decode("utf-8", "replace")


@dataclass(frozen=True)
class ApprovalPlan:
    """The approval steps of one call (§14.6), for the runner to commit in order.

    ``fields`` (``approval``, ``approver``, and ``origin`` when read from a durable ``Decided``) go into the
    call's later entries. ``decided``: the
    ``Decided`` entry to journal first (None: a resume found it durable already); ``refused``: the error
    outcome (``OutcomeKnown``, output :data:`REFUSED`) of a call refused, journaled next (None: it may run).
    """

    fields: Mapping[str, str]
    decided: dict | None = None
    decided_reason: str = ""
    refused: dict | None = None
    refused_reason: str = ""

    @property
    def runs(self) -> bool:
        return self.refused is None


def plan_approval(base: Mapping[str, Any], decided: Mapping[str, Any] | None, *, latest: Mapping[str, dict],
                  decided_here: Callable[[str], bool], ask: Callable[[ApprovalRequest], Decision | None],
                  session: str, origin: Callable[[], str]) -> ApprovalPlan | None:
    """The approval step of the call whose journal fields are ``base``, before its ``Started`` (§14.6).

    ``decided`` is its ``Decided`` entry when a resume finds one (the answer is not asked again). Else
    "always" is read back from ``latest`` (the newest entry of each op of the run), when that decision
    was made here (``decided_here``); else ``ask`` decides. None when Ctrl-C came while asking (nothing
    is to be written). Reads and writes nothing itself.
    """
    run, op = base["run"], base["op"]
    step: dict[str, Any] = {}
    if decided is None:
        # "Always" said on another machine is that machine's decision, not this one's (§14.6).
        if any(e.get("approver") == ApproverName.USER_ALWAYS and e["tool"] == base["tool"] and decided_here(e["op"])
               for e in latest.values()):
            decision: Decision | None = Decision(Approval.YES, ApproverName.USER_ALWAYS)
        else:
            decision = ask(ApprovalRequest(session, run, op, base["tool"], base["arguments"]))
            if decision is None:
                return None
        fields = {"approval": decision.approval, "approver": decision.approver}
        # Where the decision was made (§14.6 ``origin``: informative; the reflog is what a reader trusts).
        # Only the Decided entry carries it when the decision is made in this pass (the entries after it
        # have always been written so; a resume from Decided copies it on).
        step = {"decided": dict(base, state=OpState.DECIDED, source=decision.source, **fields, origin=origin()),
                "decided_reason": f"run {run}: {op} {'approved' if decision.approval == Approval.YES else 'refused'}"
                                  f" ({decision.approver})"}
    else:
        fields = {k: decided[k] for k in ("approval", "approver", "origin") if k in decided}
    if fields["approval"] == Approval.YES:
        return ApprovalPlan(fields, **step)
    return ApprovalPlan(fields, **step, refused=dict(base, **fields, state=OpState.OUTCOME_KNOWN, source=OpSource.TOOL,
                                                     isError=True),
                        refused_reason=f"run {run}: {op} refused, not run")
