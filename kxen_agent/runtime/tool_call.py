"""The tool turn of a run: each call judged once, journaled, run, its outcome recorded; then the turn settled.

Order of durable steps (``objects_spec.md`` §14.6): per call, a decision
(``Decided``, :mod:`.approvals`) when the lock's ``approve`` lists the tool,
then ``Started`` before the side effect, then ``OutcomeKnown`` with the
output; then the turn's tool messages on ``head``; then every op of the turn
``Settled``. A call is judged once (:func:`judge`: the refusal of a tool the
agent may not use or of arguments that are not a JSON object, else the parsed
arguments), its arguments are parsed once, and an output is never read back
from the store to be written again: the tool messages take the outputs this
process wrote (:attr:`.run_reader.JournalView.outputs`) and a ``Settled`` entry
keeps its ``OutcomeKnown``'s output link (:data:`.plan.KEEP_OUTPUT`).

:class:`ToolTurn` is the part of the run context (``runner._RunCtx``) that
does this; every write goes through the context's ``journal_write`` /
``commit``, i.e. :meth:`~kxen_agent.runtime.runner.Runner.commit`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kxen_agent.session import checkpoints as ckpt
from kxen_agent.session.agent_def import env_keep_of
from kxen_agent.session.gitproc import GitTimeout
from kxen_agent.session.mcp_def import mcp_tools
from kxen_agent.session.sessions import Message, new_id
from kxen_agent.session.status import OpSource, OpState, RunStatus

from .answer_check import parse_arguments
from .approvals import needs_approval, plan_approval
from .commit_trailer import commit_trailer_for
from .events import Activity, ToolFinished, ToolStarted
from .mcp_procs import reap_orphans
from .mcp_tools import McpTool, RunMcp, pid_dir
from .plan import KEEP_OUTPUT
from .recovery import provable_file_outcome
from .run_reader import JournalView
from .tools import TOOLS, ToolContext, ToolOutcome, ToolOutcomeUnknown
from .tools.files import DEFAULT_MAX_FILE_BYTES

if TYPE_CHECKING:
    from .runner import _RunCtx

__all__ = ["NOT_RUN", "StopRun", "ToolTurn", "judge"]

#: The tool message of a call a cancellation kept from starting (§14.6).
NOT_RUN = "[not run: the run was canceled before this call started]"


class StopRun(Exception):
    """Internal to the loop: it ends here (the run state already says why)."""


def summary(text: str, limit: int = 160) -> str:
    """The first non-blank line of a tool's output, cut to ``limit`` characters (for live output)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def judge(call: dict, allowed: set[str], tools: dict[str, Any] = TOOLS) -> ToolOutcome | dict[str, Any]:
    """The error outcome of a call refused before it runs (a tool the agent may not use, arguments that
    are not a JSON object), or else its arguments, parsed (the one parse of a call)."""
    name = call["name"]
    if name not in tools or name not in allowed:
        return ToolOutcome(f"tool {name!r} is not allowed for this agent (allowed: {', '.join(sorted(allowed))})", True)
    try:
        return parse_arguments(call["arguments"] or "{}")  # never recurses or yields non-Unicode (answer_check)
    except ValueError as ex:
        return ToolOutcome(f"invalid arguments for {name}: {ex}", True)


class ToolTurn:
    """The tool-turn steps of the run context (mixed into ``runner._RunCtx``)."""

    def tool_turn(self: _RunCtx, assistant: Message, view: JournalView) -> None:
        by_call = dict(view.by_message.get(assistant.oid, {}))
        policy = self.agent.get("policy", {})
        allowed = set(self.agent.get("tools", [])) | set(mcp_tools(self.agent))
        # Calls that wait for a person (§14.6 PendingApproval): nothing after the first runs now, the later
        # ones needing a decision wait with it (``new``: their entries, written with the pause).
        waiting: list[dict] = []
        new: list[dict] = []
        for call in assistant.tool_calls:
            e = by_call.get(call["id"])
            if waiting:
                tools = self.run_tools()
                if e is None and not isinstance(judge(call, allowed, tools), ToolOutcome) and needs_approval(
                        self.agent, call["name"], bool(getattr(tools.get(call["name"]), "side_effects", False))):
                    new.append(self.call_base(assistant, call, new_id("op"), state=OpState.PENDING_APPROVAL,
                                              source=OpSource.POLICY))
                    waiting.append(new[-1])
                elif e is not None and e["state"] == OpState.PENDING_APPROVAL:
                    waiting.append(e)
                continue
            if e is None:
                if self.r.cancel.is_set():
                    continue  # not started: reported as "not run" below
                pending = self.execute(assistant, call, allowed, policy)
                if pending is not None:
                    new.append(pending)
                    waiting.append(pending)
                continue
            state = e["state"]
            if state == OpState.PENDING_APPROVAL:
                waiting.append(e)
                continue
            if state == OpState.DECIDED:  # the answer is durable: never asked again
                if not self.r.cancel.is_set():
                    self.execute(assistant, call, allowed, policy, op=e["op"], decided=e)
                continue
            if state == OpState.STARTED:
                tool = self.run_tools().get(e["tool"])
                judged = judge(call, allowed, self.run_tools())
                if isinstance(judged, ToolOutcome):
                    # Refused before it could run: nothing can have happened.
                    self.r.on_event(f"{e['op']}: {e['tool']} was refused, not run; refusing it again after the crash")
                    self.execute(assistant, call, allowed, policy, op=e["op"], judged=judged)
                    continue
                if tool is not None and not tool.side_effects:
                    self.r.on_event(f"{e['op']}: {e['tool']} has no side effects; running it again after the crash")
                    self.execute(assistant, call, allowed, policy, op=e["op"], judged=judged)
                    continue
                proven = self.proven_outcome(e, judged)
                if proven is not None:
                    self.journal_write([dict(e, state=OpState.OUTCOME_KNOWN, source=OpSource.RECOVERY, isError=False)],
                                       outputs=[proven], reason=f"run {self.run}: {e['op']} outcome proven by the workspace")
                    self.r.on_event(f"{e['op']}: {e['tool']} was started before the crash and the workspace proves "
                                    "it took effect (its checkpoint differs, the file holds what it wrote)")
                    continue
                self.journal_write([dict(e, state=OpState.OUTCOME_UNKNOWN, source=OpSource.RECOVERY)],
                                   reason=f"run {self.run}: {e['op']} outcome unknown after a crash",
                                   changes={"status": RunStatus.INPUT_REQUIRED})
                self.r.on_event(f"{e['op']} ({e['tool']}) was started but its outcome is unknown; "
                                f"check it and use `kxen-agent run resolve {self.ses} {self.run} {e['op']} --output ...`")
                raise StopRun
            if state == OpState.OUTCOME_UNKNOWN:
                if self.st["status"] != RunStatus.INPUT_REQUIRED:
                    self.update({"status": RunStatus.INPUT_REQUIRED}, reason=f"run {self.run}: waits for resolution")
                raise StopRun
        if waiting:
            from .pending import pause  # pending imports nothing of this module

            pause(self, new, waiting)
            raise StopRun
        # Every call has a known outcome (or was never started because of a
        # cancellation): write the turn's tool messages, then settle.
        view = self.r.journal_view(self.st)
        by_call = view.by_message.get(assistant.oid, {})
        msgs = []
        for call in assistant.tool_calls:
            e = by_call.get(call["id"])
            if e is None or e["state"] == OpState.DECIDED:
                out = NOT_RUN
            else:
                # Written by this process: held; else (a resume after a crash) read from its entry.
                out = view.outputs[e["op"]] if e["op"] in view.outputs else (self.r.entry_output(e) or "")
            msgs.append({"role": "tool", "content": out, "tool_call_id": call["id"], "run": self.run})
        self.commit(self.step(f"run {self.run}: tool results of turn {self.st['turn']}", messages=msgs))
        self.fault("tool:after-turn")
        self.settle_turn(view)

    def settle_turn(self: _RunCtx, view: JournalView) -> None:
        pending = [e for e in view.open.values() if e["state"] == OpState.OUTCOME_KNOWN]
        canceled = self.r.cancel.is_set()
        if pending:
            # A Settled entry keeps its OutcomeKnown's output (inline or its blob link): nothing is read back.
            # A Settled entry names the checkpoint this process took after the op (§14.6 checkpointAfter).
            after = self.__dict__.get("_ckpt_after", {})
            self.journal_write([dict(e, state=OpState.SETTLED, **({ckpt.AFTER_KEY: after[e["op"]]}
                                                                  if e["op"] in after else {})) for e in pending],
                               outputs=[KEEP_OUTPUT] * len(pending),
                               reason=f"run {self.run}: {len(pending)} op(s) settled")
        if canceled:
            self.end(RunStatus.CANCELED, error="canceled by the user")

    def approve(self: _RunCtx, base: dict, decided: dict | None) -> bool | dict:
        """Commit the approval steps of a call (:func:`.approvals.plan_approval`); whether it may run
        (``base`` then carries its approval). False when refused, or when Ctrl-C came while asking; the
        ``PendingApproval`` entry to write (nothing is written yet) when nobody could be asked."""
        plan = plan_approval(base, decided, latest=self.r.journal_view(self.st).latest,
                             decided_here=self.gate.decided_here, ask=lambda req: self.r.approver(req, self.r.cancel),
                             session=self.ses, origin=self.origin, stored=self.stored,
                             no_terminal=self.agent.get("policy", {}).get("no_terminal", "pause"))
        if plan is None:
            return False
        if plan.pending is not None:
            return plan.pending
        if plan.decided is not None:
            self.journal_write([plan.decided], reason=plan.decided_reason)
            self.decided_here.add(base["op"])
            self.fault("approval:after-decided")
        base.update(plan.fields)
        if plan.refused is not None:
            self.journal_write([plan.refused], outputs=[plan.refused_output], reason=plan.refused_reason)
            self.r.emit(ToolFinished(self.ses, self.run, base["turn"], base["op"], base["tool"], OpState.OUTCOME_KNOWN,
                                     True, plan.refused_output, 1))
        return plan.runs

    def call_base(self: _RunCtx, assistant: Message, call: dict, op: str, **more: Any) -> dict:
        """The journal fields every entry of the operation ``op`` of ``call`` carries (§14.6), and ``more``."""
        tool = self.run_tools().get(call["name"])  # an MCP tool's side effects: not declared read_only
        return {"op": op, "run": self.run, "turn": self.st["turn"], "callId": call["id"], "tool": call["name"],
                "arguments": call["arguments"], "message": assistant.oid,
                "sideEffects": bool(tool.side_effects) if tool else False, **more}

    def execute(self: _RunCtx, assistant: Message, call: dict, allowed: set[str], policy: dict, op: str | None = None,
                decided: dict | None = None, judged: ToolOutcome | dict[str, Any] | None = None) -> dict | None:
        """Run one call; ``judged`` is its :func:`judge` when the caller has it already. Returns the
        ``PendingApproval`` entry (not written) of a call nobody could be asked about, else None."""
        name = call["name"]
        tool = self.run_tools().get(name)
        op = op or new_id("op")
        base = self.call_base(assistant, call, op)
        if judged is None:
            judged = judge(call, allowed, self.run_tools())
        # A call decided before (an approval, or this machine's `session trust`) goes by that decision.
        if (not isinstance(judged, ToolOutcome)
                and (needs_approval(self.agent, name, base["sideEffects"]) or decided is not None)):
            verdict = self.approve(base, decided)
            if verdict is not True:
                # It waits (its entry), was refused (its outcome is journaled), or Ctrl-C came while asking.
                return verdict or None
        if isinstance(tool, McpTool) and not isinstance(judged, ToolOutcome):
            tool.prepare()  # its server started (and its tool list checked) before Started: a refusal writes nothing
        runs_effect = tool is not None and tool.side_effects and not isinstance(judged, ToolOutcome)
        if runs_effect:
            # Durable in the workspace repository before Started names it (§14.14).
            before = self.checkpoint(f"{self.run} before {op}", before=True)
            if before is not None:
                base[ckpt.BEFORE_KEY] = before
        # Its hooks directory written (or checked) before Started: a failure there runs nothing.
        trailer = commit_trailer_for(self.store, policy, name, self.ses, assistant.oid) if runs_effect else None
        self.journal_write([dict(base, state=OpState.STARTED, source=OpSource.TOOL)],
                           reason=f"run {self.run}: {op} started")
        self.fault("tool:after-started")
        self.r.emit(ToolStarted(self.ses, self.run, base["turn"], op, call["id"], name, call["arguments"]))
        if isinstance(judged, ToolOutcome):
            outcome = judged
        else:
            assert tool is not None
            ctx = ToolContext(
                max_file_bytes=policy.get("max_file_bytes", DEFAULT_MAX_FILE_BYTES),
                workspace=self.info.workspace.root,
                timeout_s=policy.get("tool_timeout_ms", 120000) / 1000,
                cancel_window_s=policy.get("cancel_window_ms", 5000) / 1000,
                cancel=self.r.cancel,
                secret_env_names=tuple(n for n in [self.agent.get("api_key_env")] if n),
                env_keep=env_keep_of(self.agent),
                commit_trailer=trailer,
            )
            # A holder paused past its expiry between Started and here must not
            # run the effect: the new holder may already have called it UNKNOWN
            # and a human resolved it as not run.
            if tool.side_effects:
                self.lease.check()
            self.r.activity = Activity("tool", tool=name, op=op, window_s=ctx.cancel_window_s)
            try:
                outcome = tool.run(judged, ctx)
            except ToolOutcomeUnknown as ex:
                self.r.activity = Activity("step")
                self.fault("tool:after-effect")
                note = self.stored(ex.message)
                self.journal_write(
                    [dict(base, state=OpState.OUTCOME_UNKNOWN, source=OpSource.CANCEL, note=note)],
                    outputs=[self.stored(ex.output) if ex.output else None],
                    reason=f"run {self.run}: {op} killed after the cancellation window, outcome unknown",
                    changes={"status": RunStatus.INPUT_REQUIRED},
                )
                self.r.emit(ToolFinished(self.ses, self.run, base["turn"], op, name, OpState.OUTCOME_UNKNOWN, None,
                                         summary(note), 0))
                self.r.on_event(f"{op} did not stop within the cancellation window; its outcome is UNKNOWN"
                                if not isinstance(tool, McpTool) else f"{op}: {ex.message}; its outcome is UNKNOWN")
                raise StopRun
            finally:
                self.r.activity = Activity("step")
        self.fault("tool:after-effect")
        output = self.stored(outcome.output)
        self.journal_write([dict(base, state=OpState.OUTCOME_KNOWN, source=OpSource.TOOL, isError=outcome.is_error)],
                           outputs=[output], reason=f"run {self.run}: {op} outcome known")
        self.r.emit(ToolFinished(self.ses, self.run, base["turn"], op, name, OpState.OUTCOME_KNOWN, outcome.is_error,
                                 summary(output), len(output.splitlines())))
        if runs_effect:
            # After OutcomeKnown, not before it: the window in which a crash makes the op UNKNOWN stays as it was.
            after = self.checkpoint(f"{self.run} after {op}")
            if after is not None:
                self.__dict__.setdefault("_ckpt_after", {})[op] = after
        self.fault("tool:after-outcome")

    def run_tools(self: _RunCtx) -> dict[str, Any]:
        """The tools this pass can run: :data:`.tools.TOOLS` and the lock's MCP tools (:mod:`.mcp_tools`).

        First called at the pass's first tool turn, which also reaps the MCP servers a SIGKILLed run left."""
        if "_run_tools" not in self.__dict__:
            for line in reap_orphans(pid_dir(self.store)):
                self.r.on_event(f"reaped {line}")
            self._run_tools: dict[str, Any] = dict(TOOLS)
            if self.agent.get("mcp"):
                self._mcp = RunMcp(self.store, self.agent, self.info.workspace.root, self.ses)
                self._run_tools.update(self._mcp.tools())
        return self._run_tools

    def close_mcp(self: _RunCtx) -> None:
        """End the pass's MCP servers (their process groups), if it started any."""
        self.__dict__.pop("_run_tools", None)
        mcp = self.__dict__.pop("_mcp", None)
        if mcp is not None:
            mcp.close()

    def proven_outcome(self: _RunCtx, e: dict, args: dict[str, Any]) -> str | None:
        """The output of a ``write_file``/``edit_file`` op found Started whose effect the workspace proves
        (:func:`.recovery.provable_file_outcome`, §14.14), or None: it is UNKNOWN as before."""
        before = e.get(ckpt.BEFORE_KEY)
        if e["tool"] not in ("write_file", "edit_file") or not before or not isinstance(args.get("path"), str):
            return None
        from .tools import files as file_tools

        root = self.info.workspace.root
        limit = self.agent.get("policy", {}).get("max_file_bytes", DEFAULT_MAX_FILE_BYTES)
        ctx = ToolContext(max_file_bytes=limit, workspace=root, timeout_s=1, cancel_window_s=0, cancel=self.r.cancel,
                          secret_env_names=())
        try:
            repo = ckpt.open_repo(self.info.workspace, self.agent.get("policy", {}))
            if not repo.exists(before):
                return None
            real = file_tools._resolve(args["path"], ctx)  # as the tool resolves it: inside, no .git
            rel = os.path.relpath(real, os.path.realpath(root))
            if rel in ckpt.left_out_of(repo, before):
                return None  # the checkpoint holds an older version of it: nothing to compare
            try:
                now: bytes | None = file_tools._read_regular(real, ctx, args["path"], e["tool"], limit + 1)[0]
            except FileNotFoundError:
                now = None
            was = ckpt.file_at(repo, before, os.path.relpath(real, repo.top))
        except (ckpt.CheckpointError, ckpt.NoCheckpoints, GitTimeout, OSError, file_tools.BadArguments,
                file_tools._Refused):
            return None
        if not provable_file_outcome(e["tool"], args, was, now):
            return None
        assert now is not None
        return (f"wrote {len(now)} bytes to '{rel}'" if e["tool"] == "write_file"
                else f"edited '{rel}': replaced 1 occurrence")

    def checkpoint(self: _RunCtx, label: str, *, before: bool = False) -> str | None:
        """A checkpoint of the workspace now (``before``: the one taken after the previous op of this process
        if any), its commit id; None when the session records none (said once) or git failed (said)."""
        if "_ckpt" not in self.__dict__:
            try:
                self._ckpt, why = ckpt.for_session(self.store, self.sessions, self.info, self.agent.get("policy", {}))
            except (ckpt.CheckpointError, ckpt.NoCheckpoints, GitTimeout, OSError) as ex:
                self._ckpt, why = None, str(ex)
            if why is not None:
                self.r.on_event(f"run {self.run}: no workspace checkpoints: {why}")
        cp = self._ckpt
        if cp is None:
            return None
        try:
            taken = cp.before(label) if before else cp.take(label)
        except (ckpt.CheckpointError, GitTimeout, OSError) as ex:  # a read-only .git/objects, a full disk...
            self.r.on_event(f"warning: run {self.run}: no checkpoint {label}: {ex}")
            return None
        if taken.left_out and not taken.reused:
            self.r.on_event(f"run {self.run}: checkpoint {taken.commit[:12]} left out {len(taken.left_out)} file(s): "
                            + ", ".join(p for p, _ in taken.left_out[:5]) + (" ..." if len(taken.left_out) > 5 else ""))
        return taken.commit
