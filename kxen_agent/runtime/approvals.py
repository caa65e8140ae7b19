"""Approvals: a person says yes or no to a tool call before it can change anything.

This module owns the decision that ``[policy] approve`` (§14.2) asks for:
which calls need one (:func:`needs_approval`: a tool the lock lists, which
has side effects, called as the agent may call it), who decides
(:class:`Approver`: :class:`TerminalApprover` asks on the controlling
terminal; with ``--yes`` the flag decides; with nobody to ask the call
waits), and the durable step that records it (:func:`plan_approval`, an
:class:`ApprovalPlan` the runner commits): a ``Decided`` journal entry
(§14.6) written *before* ``Started``, so a crash after the answer never
asks twice and a crash before it asks again. A refusal becomes the call's
error outcome (``refused by the user``, with the person's reason when they
gave one) and the run goes on; "always" holds for the rest of the run, read
back from the journal (a resumed run remembers).

When nobody can be asked (standard input is not a terminal, no ``--yes``)
the call is not refused in the user's name: it gets a ``PendingApproval``
entry and the run waits in ``input_required`` for ``run approve`` / ``run
deny`` (:mod:`.pending`), unless the lock's ``[policy] no_terminal`` is
``"refuse"``: then it is refused as ``refused: no terminal to ask``.

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
    "NO_TERMINAL_REFUSED",
    "TerminalApprover",
    "nobody_to_ask",
    "refusal_output",
    "shown_arguments",
    "plan_approval",
    "needs_approval",
    "refuse_without_terminal",
]

#: The output of a call the user refused (its outcome: an error); their reason, when given, follows it.
REFUSED = "refused by the user"
#: The output of a call refused because nobody could be asked (``[policy] no_terminal = "refuse"``): not the user's.
NO_TERMINAL_REFUSED = "refused: no terminal to ask"
#: ``[policy] no_terminal`` (§14.2): what a call needing approval does when nobody can be asked.
NO_TERMINAL_CHOICES = ("pause", "refuse")
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
    """``approval`` ``yes`` or ``no``; ``approver`` one of :data:`APPROVERS`; ``reason``: why a person
    said no (what the model is shown), or empty."""

    approval: str
    approver: str
    reason: str = ""

    @property
    def source(self) -> str:
        """The journal's ``source``: ``human`` when a person answered, ``policy`` when the flags decided."""
        return OpSource.HUMAN if ApproverName(self.approver).human else OpSource.POLICY


class Approver(Protocol):
    """Decides one call; None when ``cancel`` was set while it waited (nothing is decided)."""

    def __call__(self, request: ApprovalRequest, cancel: threading.Event) -> Decision | None: ...


def nobody_to_ask(request: ApprovalRequest, cancel: threading.Event) -> Decision:
    """The default: nobody can be asked (:func:`plan_approval` makes the call wait, or refuses it by policy)."""
    return Decision(Approval.NO, ApproverName.NO_TERMINAL)


refuse_without_terminal = nobody_to_ask  # its name before calls waited (the runner's default approver)


def refusal_output(decided: Mapping[str, Any]) -> str:
    """The error outcome of a call refused by the decision ``decided`` (a ``Decided`` entry's fields):
    never the user's when nobody was asked."""
    if decided.get("approver") == ApproverName.NO_TERMINAL:
        return NO_TERMINAL_REFUSED
    reason = decided.get("reason")
    return f"{REFUSED}: {reason}" if reason else REFUSED


def needs_approval(agent: dict, tool: str, side_effects: bool) -> bool:
    """Whether a call of ``tool`` waits for a decision under the lock ``agent`` (read-only tools never do)."""
    return side_effects and tool in agent.get("policy", {}).get("approve", ())


_TERMINAL_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown_arguments(arguments: str, limit: int = 4000) -> str:
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
    """Asks on the controlling terminal: ``y`` (yes), ``n`` (no), ``a`` (always for this run's calls of the
    tool), ``r`` (no, and a reason the model is shown: "no, do X instead").

    With ``assume_yes`` (``--yes``) it asks nobody and approves. When
    ``fd`` (standard input) is not a terminal nobody can be asked
    (:func:`nobody_to_ask`). Else the question is written to, and the
    answer read from, ``/dev/tty`` — never a redirected standard error
    (``2>log``) — or ``fd`` itself when the process has no controlling
    terminal; ``write`` (the interactive session's) overrides where the
    question goes. The answer is read a line at a time, looking at
    ``cancel`` between polls, so Ctrl-C while it waits leaves the call
    undecided. End of input is "no".
    """

    def __init__(self, *, assume_yes: bool = False, fd: int = 0,
                 write: Callable[[str], Any] | None = None) -> None:
        self.assume_yes = assume_yes
        self.fd = fd
        self.write = write

    def __call__(self, request: ApprovalRequest, cancel: threading.Event) -> Decision | None:
        if self.assume_yes:
            return Decision(Approval.YES, ApproverName.YES_FLAG)
        if not os.isatty(self.fd):
            return nobody_to_ask(request, cancel)
        tty = None if self.write is not None else _open_tty()
        fd = self.fd if tty is None else tty
        write = self.write or (lambda text: _write_fd(fd, text))
        try:
            return self._ask(request, cancel, fd, write)
        finally:
            if tty is not None:
                os.close(tty)

    def _ask(self, request: ApprovalRequest, cancel: threading.Event, fd: int,
             write: Callable[[str], Any]) -> Decision | None:
        write(f"\nkxen-agent: run {request.run} wants to call {request.tool} ({request.op}) with:\n"
              f"{shown_arguments(request.arguments)}\n")
        while True:
            write(f"allow {request.tool}? [y]es / [n]o / [a]lways for this run / [r]efuse with a reason: ")
            line = _read_line(fd, cancel)
            if line is None:
                write("\n")
                return None
            answer = line.strip().lower()
            if answer in ("y", "yes"):
                return Decision(Approval.YES, ApproverName.USER)
            if answer in ("a", "always"):
                return Decision(Approval.YES, ApproverName.USER_ALWAYS)
            if answer in ("n", "no") or line == "":  # "" is end of input
                return Decision(Approval.NO, ApproverName.USER)
            if answer in ("r", "reason"):
                write("the reason (the model is told it, e.g. \"no, do X instead\"): ")
                why = _read_line(fd, cancel)
                if why is None:
                    write("\n")
                    return None
                return Decision(Approval.NO, ApproverName.USER, why.strip())
            write(f"please answer y, n, a or r (got {answer[:20]!r})\n")


def _open_tty() -> int | None:
    """The controlling terminal, read and written (None: the process has none, e.g. a new session's child)."""
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None


def _write_fd(fd: int, text: str) -> None:
    """``text`` on the terminal ``fd``; when ``fd`` was opened read-only, on standard error (still a terminal:
    :class:`TerminalApprover` reads from a terminal only)."""
    data = text.encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        sys.stderr.write(text)
        sys.stderr.flush()


def _read_line(fd: int, cancel: threading.Event) -> str | None:
    """One line from ``fd`` ('' at end of input), or None if ``cancel`` is set first."""
    buf = b""
    while not buf.endswith(b"\n"):
        if cancel.is_set():
            return None
        ready, _, _ = select.select([fd], [], [], _POLL_S)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 1)
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
    outcome (``OutcomeKnown``, output ``refused_output``) of a call refused, journaled next (None: it may
    run). ``pending``: the ``PendingApproval`` entry of a call nobody could be asked about (the run waits;
    nothing else is set).
    """

    fields: Mapping[str, str]
    decided: dict | None = None
    decided_reason: str = ""
    refused: dict | None = None
    refused_reason: str = ""
    refused_output: str = REFUSED
    pending: dict | None = None

    @property
    def runs(self) -> bool:
        return self.refused is None and self.pending is None


def plan_approval(base: Mapping[str, Any], decided: Mapping[str, Any] | None, *, latest: Mapping[str, dict],
                  decided_here: Callable[[str], bool], ask: Callable[[ApprovalRequest], Decision | None],
                  session: str, origin: Callable[[], str], no_terminal: str = "pause",
                  stored: Callable[[str], str] = lambda text: text) -> ApprovalPlan | None:
    """The approval step of the call whose journal fields are ``base``, before its ``Started`` (§14.6).

    ``decided`` is its ``Decided`` entry when a resume finds one (the answer is not asked again). Else
    "always" is read back from ``latest`` (the newest entry of each op of the run), when that decision
    was made here (``decided_here``); else ``ask`` decides. When nobody could be asked, the call waits
    (``pending``), or with ``no_terminal`` ``"refuse"`` it is refused (not in the user's name). None when
    Ctrl-C came while asking (nothing is to be written). ``stored`` redacts a person's reason. Reads and
    writes nothing itself.
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
        if decision.approver == ApproverName.NO_TERMINAL and no_terminal != "refuse":
            # Nobody to ask is nobody's "no": the call waits for a person (`run approve` / `run deny`).
            return ApprovalPlan({}, pending=dict(base, state=OpState.PENDING_APPROVAL, source=OpSource.POLICY))
        fields = {"approval": decision.approval, "approver": decision.approver}
        why = {"reason": stored(decision.reason)} if decision.reason and decision.approval == Approval.NO else {}
        # Where the decision was made (§14.6 ``origin``: informative; the reflog is what a reader trusts).
        # Only the Decided entry carries it when the decision is made in this pass (the entries after it
        # have always been written so; a resume from Decided copies it on).
        step = {"decided": dict(base, state=OpState.DECIDED, source=decision.source, **fields, **why, origin=origin()),
                "decided_reason": f"run {run}: {op} {'approved' if decision.approval == Approval.YES else 'refused'}"
                                  f" ({decision.approver})"}
        output = refusal_output(dict(fields, **why))
    else:
        fields = {k: decided[k] for k in ("approval", "approver", "origin") if k in decided}
        output = refusal_output(decided)
    if fields["approval"] == Approval.YES:
        return ApprovalPlan(fields, **step)
    return ApprovalPlan(fields, **step, refused=dict(base, **fields, state=OpState.OUTCOME_KNOWN, source=OpSource.TOOL,
                                                     isError=True),
                        refused_reason=f"run {run}: {op} refused, not run", refused_output=output)
