"""Approvals: a person says yes or no to a tool call before it can change anything.

This module owns the decision that ``[policy] approve`` (§14.2) asks for:
which calls need one (:func:`needs_approval`: a tool the lock lists, which
has side effects, called as the agent may call it), who decides
(:class:`Approver`: :class:`TerminalApprover` asks on the terminal; without
one, or with ``--yes``, the policy decides), and the durable step that
records it (:func:`approve_call`): a ``Decided`` journal entry (§14.6)
written *before* ``Started``, so a crash after the answer never asks twice
and a crash before it asks again. A refusal becomes the call's error
outcome (``refused by the user``) and the run goes on; "always" holds for
the rest of the run, read back from the journal (a resumed run remembers).

It never runs a tool and never writes anything but through the run
context it is handed.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import threading
from collections.abc import Callable
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
    "TerminalApprover",
    "approve_call",
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


def approve_call(ctx: Any, base: dict, decided: dict | None) -> bool | None:
    """The approval step of one call, before its ``Started`` (§14.6); ``ctx`` is the run's context.

    ``base`` is the operation's journal fields; ``decided`` its ``Decided``
    entry when a resume finds one (the answer is not asked again). Returns
    True when the call may run (``base`` now carries ``approval`` and
    ``approver``), False when it was refused (its error outcome is
    journaled), None when Ctrl-C came while asking (nothing is written).
    """
    if decided is None:
        ops = ctx.r.ops(ctx.st)
        always = [e for e in ops.values()
                  if e.get("approver") == ApproverName.USER_ALWAYS and e["tool"] == base["tool"]]
        # "Always" said on another machine is that machine's decision, not this one's (§14.6).
        gate = getattr(ctx, "gate", None)
        if any(gate is None or gate.decided_here(e["op"]) for e in always):
            decision: Decision | None = Decision(Approval.YES, ApproverName.USER_ALWAYS)
        else:
            request = ApprovalRequest(ctx.ses, ctx.run, base["op"], base["tool"], base["arguments"])
            decision = ctx.r.approver(request, ctx.r.cancel)
            if decision is None:
                return None
        fields = {"approval": decision.approval, "approver": decision.approver}
        # Where the decision was made (§14.6 ``origin``: informative; the reflog is what a reader trusts).
        origin = {"origin": ctx.origin()} if hasattr(ctx, "origin") else {}
        ctx.journal_write([dict(base, state=OpState.DECIDED, source=decision.source, **fields, **origin)],
                          reason=f"run {ctx.run}: {base['op']} {'approved' if decision.approval == Approval.YES else 'refused'}"
                                 f" ({decision.approver})")
        if hasattr(ctx, "decided_here"):
            ctx.decided_here.add(base["op"])
        ctx.fault("approval:after-decided")
    else:
        fields = {k: decided[k] for k in ("approval", "approver", "origin") if k in decided}
    base.update(fields)
    if fields["approval"] == Approval.YES:
        return True
    ctx.journal_write([dict(base, state=OpState.OUTCOME_KNOWN, source=OpSource.TOOL, isError=True)],
                      outputs=[REFUSED], reason=f"run {ctx.run}: {base['op']} refused, not run")
    return False
