"""``kxen-agent run``, ``--resume`` and ``run show/resolve``: render the runtime.

Which agent a new session gets (``--agent``, else the configured default:
``KXEN_AGENT_AGENT``, else ``$XDG_CONFIG_HOME/kxen-agent/agent.toml``; never
the bundled demo agent silently) is :mod:`._ready`'s, shared with the
interactive session. What a run shows while it works is :mod:`._live`'s.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Optional

import typer

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.runtime.cancel import cancel_on_signals
from kxen_agent.runtime.lease import lease_ttl_s
from kxen_agent.runtime.remote_lease import RemoteLeaseScope, remote_lease_scope
from kxen_agent.runtime.runner import Runner, RunResult
from kxen_agent.session.agent_def import load_agent_definition
from kxen_agent.session.sessions import NS
from kxen_agent.session.status import ApproverName, OpSource, OpState, RunStatus
from kxen_agent.store import Store
from kxen_agent.store.objects import MAX_OBJECT_SIZE

from ._live import View, cancel_note, make_view
from ._ready import AGENT_ENV, check_provider, default_agent
from ._render import emit_json, out, out_text, term_text as t, usage_line

#: The bundled scripted agent: `kxen-agent demo` runs it; `run` only with an explicit --agent naming it.
DEMO_AGENT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "demo-agent", "agent.toml")

# Its help is run_cmd's docstring (a new session), which names show/resolve.
run_app = typer.Typer(no_args_is_help=False, rich_markup_mode=None, add_completion=False)


#: The longest task (UTF-8 bytes) `run` and `--resume --task` accept. The task
#: is stored inline in the run's state object (objects are at most
#: MAX_OBJECT_SIZE, 64 MiB) and in the first message; a quarter of the object
#: limit leaves room for the run state's other fields even after redaction,
#: which can grow a text 2.5-fold ("[REDACTED]" for a 4-character secret).
MAX_TASK_BYTES = MAX_OBJECT_SIZE // 4
_TOO_LONG_HINT = "shorten it (or put the bulk in a file in the workspace and name that file in the task)"


def check_text(text: str, what: str, *, limit: int = MAX_TASK_BYTES, hint: str = "shorten it") -> bytes:
    """The UTF-8 bytes of ``text`` from the command line; UsageError if it is not UTF-8 or too long.

    Undecodable argv bytes reach Python as lone surrogates (surrogateescape);
    they cannot be stored as text, so they are refused here, before any
    session or object exists.
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        byte = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"code point U+{ch:04X}"
        raise UsageError(f"{what} is not valid UTF-8 text ({byte} at character {e.start}); "
                         "give it as UTF-8 text") from None
    if len(data) > limit:
        raise UsageError(f"{what} is {len(data)} bytes, over the {limit}-byte limit; {hint}")
    return data


def read_task(task: Optional[str], task_file: Optional[str]) -> Optional[str]:
    """The task from --task or --task-file, checked (UTF-8, not blank, at most MAX_TASK_BYTES) or None.

    All of it is checked here, in the CLI, so a bad task is refused before
    a session, a run or any object is created.
    """
    if task is not None and task_file is not None:
        raise UsageError("give either --task or --task-file, not both")
    if task_file is not None:
        text = _read_task_file(task_file)
        if not text.strip():
            raise UsageError(f"task file {task_file} is empty (or only whitespace); write the task in it")
        return text
    if task is not None:
        check_text(task, "--task", hint=_TOO_LONG_HINT)
        if not task.strip():
            raise UsageError("--task is empty (or only whitespace); say what the agent should do")
    return task


def _read_task_file(path: str) -> str:
    if path == "-":  # standard input, as `git commit -F -` takes it
        return read_stdin_task()
    try:
        with open(path, "rb") as f:
            # One byte past the limit tells "too long" without reading a huge file whole.
            data = f.read(MAX_TASK_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read task file {path}: {e.strerror}") from None
    if len(data) > MAX_TASK_BYTES:
        raise UsageError(f"task file {path} is over the {MAX_TASK_BYTES}-byte task limit; {_TOO_LONG_HINT}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"task file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def configured_locks() -> list[dict]:
    """The lock of this machine's configured default agent (``KXEN_AGENT_AGENT`` or the XDG file), if any:
    an imported session made with the same definition runs here without asking (§14.13). A missing or
    broken default is not this command's business: it then counts for nothing."""
    try:
        return [load_agent_definition(default_agent())]
    except KxenError:
        return []


def read_stdin_task() -> str:
    """The task from standard input (``--task-file -``, or a piped ``run`` with no task), checked."""
    data = sys.stdin.buffer.read(MAX_TASK_BYTES + 1)
    if len(data) > MAX_TASK_BYTES:
        raise UsageError(f"the task on standard input is over the {MAX_TASK_BYTES}-byte task limit; {_TOO_LONG_HINT}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"the task on standard input is not UTF-8 text (byte {e.start}); give it as UTF-8") from None
    if not text.strip():
        raise UsageError("no task: give --task TEXT or --task-file FILE, or pipe it on standard input "
                         "(the task on standard input is empty, or only whitespace)")
    return text


def cancellation(view: View, activity: Callable[[], object] = lambda: None) -> AbstractContextManager[threading.Event]:
    """SIGINT/SIGTERM set the yielded event: the runner cancels cooperatively.

    :func:`~kxen_agent.runtime.cancel.cancel_on_signals` does the signal
    work; the CLI adds only the notes (through ``view``: none with
    ``--json``): one for the first signal, saying what will be waited for
    (``activity()``: the run's :class:`~kxen_agent.runtime.events.Activity`),
    one for the second saying what is still waited for, then silence.
    """
    first_at = [0.0]

    def note(sig: signal.Signals, seen: int) -> None:
        if seen == 1:
            first_at[0] = time.monotonic()
        text = cancel_note(sig.name, seen, activity(), first_at[0])  # type: ignore[arg-type]
        if text is not None:
            view.signal_note(text)

    return cancel_on_signals(on_signal=note)


def execute(call: Callable[[Runner], RunResult], *, json_out: bool, events: bool, quiet: bool,
            remote: Callable[[threading.Event], AbstractContextManager[RemoteLeaseScope | None]] | None = None,
            yes: bool = False) -> None:
    """Run ``call`` with a runner wired to the signals and the view these flags choose, then render its result.

    ``remote(cancel)``: the ``--remote-lease`` scope (None: not asked for) that makes the runner.
    ``yes``: calls that ``[policy] approve`` lists are approved without asking (``--yes``); else asked
    on the terminal, or refused when standard input is not one.
    """
    from kxen_agent.runtime.approvals import TerminalApprover

    if events and json_out:
        raise UsageError("--events and --json both write stdout; give one (--events ends with a run_finished "
                         "event carrying the --json result document)")
    view = make_view(json_out=json_out, events=events, quiet=quiet)
    runners: list[Runner] = []
    note = view.note
    if not events:  # a JSON Lines reader gets every note; a person gets an ended run's error once, in the result
        view.note = lambda line: None if _ENDED.fullmatch(line) else note(line)  # type: ignore[method-assign]
    with (cancellation(view, lambda: runners[0].activity if runners else None) as cancel,
          (remote or (lambda c: nullcontext()))(cancel) as rl):
        kw = dict(cancel=cancel, on_event=view.note, listener=view.event, stream=view.wants_text)
        store = Store.open(namespaces=(NS,))
        if rl is not None:
            rl.on_event = view.note
        runner = rl.runner(store, **kw) if rl is not None else Runner(store, **kw)  # type: ignore[arg-type]
        runner.approver = TerminalApprover(assume_yes=yes)
        runner.own_locks = configured_locks()
        runners.append(runner)
        try:
            res = call(runner)
        except KxenError as e:
            view.failed(e)
            raise
    view.finished(res)
    render_result(res, json_out, events=events)


#: The runner's note that a run ended failed or canceled, with its error: the result says it (once).
_ENDED = re.compile(r"run run_\w+ (failed|canceled)(: .*)?", re.DOTALL)


def render_result(res: RunResult, json_out: bool, *, events: bool = False) -> None:
    if events:
        pass  # the run_finished event carried the result document
    elif json_out:
        emit_json(res.to_json())
    else:
        out(f"session {res.session} run {res.run}: {t(res.status)} after {res.turn} turn(s) (model {t(res.model)})")
        if res.result:
            out_text("result", res.result)
        if res.error:
            # A run that waits for this machine's decision (§14.13) says what, and the next command.
            out_text("waits" if res.status == RunStatus.INPUT_REQUIRED else "error", res.error)
        if res.status == RunStatus.CANCELED:
            # What comes next: the run is over (nothing is left to resume), its task is not.
            out(f"next: `kxen-agent --resume {res.session} --retry` tries its task again; "
                f"`kxen-agent --resume {res.session} --task TEXT` gives a new one")
        for op in map(t, res.unknown_ops):
            out(
                f"UNKNOWN: operation {op} may or may not have taken effect; check the workspace "
                f"(`kxen-agent run show {res.session} {res.run}` shows what changed since it started), then "
                f"`kxen-agent run resolve {res.session} {res.run} {op} --output TEXT [--is-error]` "
                f"and `kxen-agent --resume {res.session}`"
            )
    raise typer.Exit(res.exit_code)


@run_app.callback(invoke_without_command=True)
def run_cmd(
    ctx: typer.Context,
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR", help="The workspace directory to bind the new session to (default: this directory)."),
    task: Optional[str] = typer.Option(None, "--task", metavar="TEXT", help="The task text."),
    task_file: Optional[str] = typer.Option(
        None, "--task-file", metavar="FILE", help="A file holding the task ('-': standard input)."),
    agent: Optional[str] = typer.Option(
        None, "--agent", metavar="FILE",
        help=f"Agent definition (TOML); default: ${AGENT_ENV}, else $XDG_CONFIG_HOME/kxen-agent/agent.toml."),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object: {session, run, status, turn, model, result, error, unknownOps, settled}."),
    model: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help="The model for this run (default: the agent's)."),
    base_url: Optional[str] = typer.Option(
        None, "--base-url", metavar="URL", help="The endpoint for this run (openai and anthropic providers; default: the agent's)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Show no live output or progress, only the result."),
    events: bool = typer.Option(False, "--events", help="Write JSON Lines events to stdout as the run goes (not with --json)."),
    remote_lease: bool = typer.Option(
        False, "--remote-lease", help="Hold the session's lease on its Git remote and push every durable step."),
    remote: Optional[str] = typer.Option(
        None, "--remote", metavar="NAME_OR_URL", help="With --remote-lease: the remote (default: the workspace's origin)."),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Approve every call the agent's [policy] approve lists, without asking."),
    api_key_env: Optional[str] = typer.Option(
        None, "--api-key-env", metavar="NAME", help="The variable holding the API key for this run (default: the agent's)."),
    name: Optional[str] = typer.Option(
        None, "--name", "-n", metavar="NAME", help="Name the new session (unique here; then usable wherever its id is)."),
) -> None:
    """Create a Session bound to a workspace and run its first task to a terminal state.

    With no --task or --task-file, a task piped on standard input is read.
    `run show` and `run resolve` inspect and settle a session's runs;
    `run approve` / `run deny` decide a call that waits for approval.

    \b
    Examples:
      kxen-agent run --task "fix the failing test"
      kxen-agent run --workspace /workspace/repo --task-file task.md --agent agent.toml
      git diff | kxen-agent run
      kxen-agent run show ses_6508
    """
    if ctx.invoked_subcommand is not None:
        return
    if workspace is None:
        workspace = os.getcwd()  # the directory itself: a subdirectory binding stays what the user means
    text = read_task(task, task_file)
    if text is None and not sys.stdin.isatty():
        text = read_stdin_task()
    if text is None:
        raise UsageError("run needs a task: --task TEXT, --task-file FILE, or the task piped on standard input")
    lock = load_agent_definition(agent or default_agent())
    check_provider(lock, api_key_env)  # its SDK and key: before the session is created (exit 2, nothing written)
    lease_ttl_s()  # a bad KXEN_AGENT_LEASE_TTL_S is refused before the session is created, not after
    if name is not None:
        name_new_session(name)  # a bad or taken name is refused before anything is written
    execute(lambda runner: _named(runner, name).start(workspace, text, lock, model=model, base_url=base_url, api_key_env=api_key_env),
            json_out=json_out, events=events, quiet=quiet, yes=yes,
            remote=lambda cancel: remote_lease_scope(remote_lease, remote, ses=None, cancel=cancel, workspace=workspace))


def name_new_session(name: str) -> None:
    """Refuse ``run -n NAME`` before anything is written: NAME is no name, or another session has it."""
    from kxen_agent.session.names import check_name, claim
    from kxen_agent.session.sessions import SessionStore

    check_name(name)
    store = Store.open(namespaces=(NS,))
    if store.exists:
        claim(SessionStore(store), name)  # checked again, under the names lock, when the session is made


def _named(runner: Runner, name: Optional[str]) -> Runner:
    runner.sessions.new_name = name  # the runner's create names the session (§14.16)
    return runner


def resume_cmd(ses: str, task: Optional[str], task_file: Optional[str], workspace: Optional[str],
               rebind: bool, json_out: bool, *, retry: bool = False, model: Optional[str] = None,
               base_url: Optional[str] = None, quiet: bool = False, events: bool = False,
               remote_lease: bool = False, remote: Optional[str] = None, yes: bool = False,
               agent: Optional[str] = None, api_key_env: Optional[str] = None) -> None:
    text = read_task(task, task_file)
    lock = load_agent_definition(agent) if agent is not None else None  # refused before anything is written
    if retry and text is not None:
        raise UsageError("--retry re-attempts the last run's task; give either --retry or --task/--task-file")
    lease_ttl_s()
    runner = Runner(Store.open(namespaces=(NS,)))
    ses = runner.sessions.resolve_id(ses)
    ready_to_run(runner, ses, lock, api_key_env, new_run=text is not None or retry)
    if rebind and text is None and not retry and rebind_only(runner, ses, workspace, json_out):
        return
    # A new run (a task, a retry) is named at its start: the remote lease is claimed then, with the name; else now.
    execute(lambda runner: runner.resume(ses, task=text, workspace=workspace, rebind=rebind, retry=retry,
                                         model=model, base_url=base_url, api_key_env=api_key_env,
                                         agent_lock=lock),
            json_out=json_out, events=events, quiet=quiet, yes=yes,
            remote=lambda cancel: remote_lease_scope(remote_lease, remote, ses=ses, cancel=cancel,
                                                     claim_now=text is None and not retry))


def ready_to_run(runner: Runner, ses: str, lock: Optional[dict], api_key_env: Optional[str], *, new_run: bool) -> None:
    """The provider's SDK and key, checked before a run is created or continued (exit 2, nothing written).

    ``lock``: the ``--agent`` definition (None: the session's own). A session with nothing to continue
    is not checked: the runner refuses it without calling a model.
    """
    from kxen_agent.runtime.runner import TERMINAL

    info = runner.sessions.get(ses)
    recorded = None
    if not new_run:
        latest = runner.latest_run(info)
        if latest is None or (latest[2]["status"] in TERMINAL and latest[2].get("settled")):
            return
        recorded = None if lock is not None else latest[2].get("apiKeyEnv")
    # Looked for, not imported: the runner imports it when it makes the provider, before a run is created.
    check_provider(lock if lock is not None else runner.sessions.agent(info), api_key_env or recorded,
                   import_sdk=False)


def rebind_only(runner: Runner, ses: str, workspace: Optional[str], json_out: bool) -> bool:
    """``--resume SES --workspace NEW --rebind-workspace`` with nothing to run: rebind, say so, exit 0.

    Returns False (nothing done) when the session has a run to continue:
    the runner then rebinds and resumes it as one step.
    """
    from kxen_agent.runtime.lease import Lease
    from kxen_agent.runtime.runner import TERMINAL

    if workspace is None:
        raise UsageError("--rebind-workspace needs --workspace NEW_PATH")
    latest = runner.latest_run(runner.sessions.get(ses))
    if latest is not None and not (latest[2]["status"] in TERMINAL and latest[2].get("settled")):
        return False
    with Lease.acquire(runner.store, ses, purpose="rebind", backend=runner.leases) as lease:
        info = runner.sessions.rebind(ses, workspace, fence=lease.fence)
    if json_out:
        emit_json({"session": ses, "rebound": True, "workspace": info.workspace.root,
                   "run": latest[0] if latest else None, "status": latest[2]["status"] if latest else None})
    else:
        done = f"its last run {latest[0]} is {latest[2]['status']}" if latest else "it has no runs yet"
        out(f"session {ses} bound to {t(info.workspace.root)}; nothing to resume ({done}): "
            f"start a new run with `kxen-agent --resume {ses} --task TEXT`")
    return True


@run_app.command("show")
def show_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    run: Optional[str] = typer.Argument(None, metavar="[RUN]", help="A run id or unique prefix (default: the latest run)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the run and its journal as JSON (docs/commands.md: JSON output)."),
    full_diff: bool = typer.Option(
        False, "--diff", help="For an UNKNOWN operation, the whole diff since its before checkpoint (default: --stat)."),
) -> None:
    """The run's status, model, turns, result and its tool journal.

    An UNKNOWN operation shows what changed in the workspace since the
    checkpoint taken before it started (docs/checkpoints.md).

    \b
    Examples:
      kxen-agent run show ses_6508
      kxen-agent run show ses_6508 run_91c2 --json
    """
    from kxen_agent.runtime.approvals import shown_arguments
    from kxen_agent.runtime.pending import approve_commands

    from ._ids import resolve_run

    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(runner.sessions.resolve_id(ses))
    ses = info.id
    run = resolve_run(runner, info, run)
    oid, st = runner.run_state(info, run)
    status = runner.shown_status(ses, st)  # "interrupted": running, but no live process holds the lease
    ops = runner.ops(st)
    journal = []
    for op, e in ops.items():
        journal.append({
            "op": op, "tool": e["tool"], "arguments": e["arguments"], "state": e["state"],
            "source": e.get("source"), "turn": e.get("turn"), "callId": e.get("callId"),
            "sideEffects": e.get("sideEffects"),
            "outcome": None if (e["state"] in (OpState.PENDING_APPROVAL, OpState.DECIDED) or (
                e["state"] in (OpState.STARTED, OpState.OUTCOME_UNKNOWN) and e.get("source") != OpSource.HUMAN))
            else {"output": runner.entry_output(e), "isError": e.get("isError", False)},
            "note": e.get("note"),
            "approval": ({"answer": e["approval"], "by": e["approver"], **({"reason": e["reason"]} if "reason" in e else {})}
                         if "approval" in e else None),
            "checkpointBefore": e.get("checkpointBefore"), "checkpointAfter": e.get("checkpointAfter"),
        })
    if any(j["tool"].startswith("mcp__") for j in journal):  # §14.15: each MCP tool's hints, never obeyed
        from kxen_agent.runtime.mcp_tools import annotations_doc

        hints = {h["tool"]: h for h in annotations_doc(runner.sessions.agent(info))}
        for j in journal:
            if j["tool"] in hints:
                j["mcp"] = hints[j["tool"]]
    evidence: dict[str, list[str]] = {}
    if any(j["state"] == OpState.OUTCOME_UNKNOWN for j in journal):
        from .checkpoint_cmds import unknown_op_evidence

        for j in journal:
            if j["state"] == OpState.OUTCOME_UNKNOWN:
                evidence[j["op"]] = unknown_op_evidence(runner.sessions, info, ops[j["op"]], full=full_diff)
                j["workspaceChanges"] = evidence[j["op"]]
    endpoint = runner.endpoint_of(info, st)
    doc = {
        "session": ses, "run": run, "index": st["index"], "status": status, "settled": st.get("settled", False),
        "model": st["model"], "requestedModel": endpoint.model, "baseUrl": endpoint.base_url,
        "retryOf": st.get("retryOf"), "turn": st["turn"], "task": st["task"], "result": st.get("result"),
        "error": st.get("error"), "usage": st.get("usage"), "turnUsage": runner.turn_usage(st),
        "state": oid.hex(), "journal": journal,
        "instructions": [{"path": i["path"], "object": i["blob"].hex(), "size": i["size"], "truncated": i["truncated"]}
                         for i in st.get("instructions") or ()],
        # The calls that wait for a person (§14.6 PendingApproval) and the commands that decide them.
        "waitingForApproval": [{"op": j["op"], "tool": j["tool"], "arguments": j["arguments"],
                                "approve": approve_commands(ses, j["op"])[0], "deny": approve_commands(ses, j["op"])[1]}
                               for j in journal if j["state"] == OpState.PENDING_APPROVAL],
    }
    if json_out:
        emit_json(doc)
        return
    # Stored text goes through t()/out_text(): an imported run's values are someone else's bytes.
    out(f"run {t(run)} (session {t(ses)}, #{st['index']}): {t(status)}{'' if st.get('settled') else ' (not settled)'}")
    if st.get("retryOf"):
        out(f"retry of: {t(st['retryOf'])}")
    out(f"model: {t(endpoint.model)}" + (f" (answered as {t(st['model'])})" if st["model"] != endpoint.model else "")
        + f"   endpoint: {t(endpoint.base_url or '-')}   turns: {st['turn']}")
    out(f"usage: {usage_line(st.get('usage'))}")
    for tu in doc["turnUsage"]:
        out(f"  turn {tu['turn']}: {usage_line(tu)}")
    if doc["instructions"]:
        out("instructions: " + ", ".join(f"{t(i['path'])} ({i['object'][:12]}{', truncated' if i['truncated'] else ''})"
                                          for i in doc["instructions"]))
    out_text("task", st["task"])
    if st.get("result") is not None:
        out_text("result", st["result"])
    if st.get("error"):
        out_text("error", st["error"])
    out(f"journal ({len(journal)} operation(s)):")
    for j in journal:
        out(f"  {t(j['op'])}  {t(j['state']):<14} {t(j['tool'])} {t(str(j['arguments']))}")
        if j["approval"] is not None:
            out(f"      {approval_line(j['approval'])}")
        if j.get("mcp"):
            from kxen_agent.runtime.mcp_tools import hint_line

            out(f"      {hint_line(j['mcp'])}")
        if j["outcome"] is not None:
            first = (j["outcome"]["output"] or "").strip().splitlines()
            tail = f" ({len(first)} lines)" if len(first) > 1 else ""
            out(f"      {'error' if j['outcome']['isError'] else 'output'}: {t(first[0]) if first else ''}{tail}")
        elif j["state"] == OpState.PENDING_APPROVAL:
            yes, no = approve_commands(ses, j["op"])
            out(f"      waits for approval (nobody at a terminal to ask): `{t(yes, quote=False)}` or "
                f"`{t(no, quote=False)}`, then `kxen-agent --resume {t(ses)}`")
            for line in shown_arguments(j["arguments"]).splitlines():
                out(f"      | {t(line, quote=False)}")
        elif j["state"] == OpState.OUTCOME_UNKNOWN:
            out(f"      outcome UNKNOWN: check, then `kxen-agent run resolve {t(ses)} {t(run)} {t(j['op'])} --output TEXT`")
            for line in evidence.get(j["op"], []):
                out(f"      {t(line, quote=False)}")


def approval_line(approval: dict) -> str:
    """``approved by the user`` ... for a §14.6 approval (who decided a call that needed a yes)."""
    by = {ApproverName.USER: "by the user", ApproverName.USER_ALWAYS: "by the user (always, for this run)",
          ApproverName.YES_FLAG: "by --yes",
          ApproverName.NO_TERMINAL: "without asking: no terminal to ask at (give --yes to approve)",
          ApproverName.USER_COMMAND: f"by the user with `run {'approve' if approval['answer'] == 'yes' else 'deny'}`",
          ApproverName.TRUST: "on this machine with `session trust` (the call came from another state dir)"}.get(approval["by"],
                                                                                        t(approval["by"]))
    why = f": {t(approval['reason'])}" if approval.get("reason") else ""
    return f"{'approved' if approval['answer'] == 'yes' else 'refused'} {by}{why}"


@run_app.command("resolve")
def resolve_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    ids: list[str] = typer.Argument(
        ..., metavar="[RUN] OP", help="The operation, after its run (optional: found from OP); ids or unique prefixes."),
    output: str = typer.Option(
        ..., "--output", metavar="TEXT", help="The outcome you established (what the tool's output would have said)."),
    is_error: bool = typer.Option(False, "--is-error", help="The operation failed."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, run, op, state, source, isError} as JSON."),
) -> None:
    """Record a human-established outcome for one UNKNOWN operation (never re-runs it).

    \b
    Examples:
      kxen-agent run resolve ses_6508 op_5d1e --output "verified: branch already pushed"
      kxen-agent run resolve ses_6508 run_91c2 op_5d1e --output "it failed" --is-error
    """
    check_text(output, "--output")  # before the lease is taken: a bad value changes nothing
    runner, ses, run, op = _op_of("resolve", ses, ids)
    res = runner.resolve(ses, run, op, output, is_error=is_error)
    if json_out:
        emit_json(res)
    else:
        out(f"{t(op)} resolved ({'error' if is_error else 'ok'}); continue with `kxen-agent --resume {t(ses)}`")


def _op_of(command: str, ses: str, ids: list[str]) -> tuple[Runner, str, str, str]:
    """``(runner, session, run, op)`` for ``run COMMAND SES [RUN] OP`` (ids or unique prefixes)."""
    from ._ids import resolve_op, resolve_run

    if not ids and command in ("approve", "deny"):
        raise UsageError(f"run {command} needs the OP to decide (`kxen-agent run show SES` lists the waiting "
                         "calls), or --all for every call that waits")
    if not 1 <= len(ids) <= 2:
        raise UsageError(f"run {command} takes SES [RUN] OP, got {len(ids) + 1} ids (see kxen-agent run {command} --help)")
    lease_ttl_s()
    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(runner.sessions.resolve_id(ses))
    if len(ids) == 1:  # SES OP: the run is the one whose journal holds OP
        run, op = resolve_op(runner, info, None, ids[0])
    else:
        run, op = resolve_op(runner, info, resolve_run(runner, info, ids[0]), ids[1])
    return runner, info.id, run, op


def _decide(ses: str, ids: Optional[list[str]], *, yes: bool, reason: Optional[str], json_out: bool,
            every: bool = False) -> None:
    command = "approve" if yes else "deny"
    if reason is not None:
        check_text(reason, "--reason")
        if not reason.strip():
            raise UsageError("--reason is empty (or only whitespace); say what the model should do instead, "
                             "or leave --reason out")
    ids = ids or []
    if every:
        runner, ses, run, ops = _waiting_ops(command, ses, ids)
    else:
        runner, ses, run, op = _op_of(command, ses, ids)
        ops = [op]
    done = [runner.decide(ses, run, op, yes=yes, reason=reason) for op in ops]  # one step each: each is provably ours
    if json_out:
        emit_json(done[0] if not every else {"session": ses, "run": run, "decided": done})
        return
    for res in done:
        said = "approved" if yes else "denied" + (" (the model is told your reason)" if res["reason"] else "")
        out(f"{t(res['op'])} ({t(res['tool'])}) {said} on this state dir")
    left = done[-1]["waiting"]
    out(f"{len(left)} call(s) still wait ({', '.join(left)}): decide them, then `kxen-agent --resume {ses}`"
        if left else f"continue with `kxen-agent --resume {ses}`")


def _waiting_ops(command: str, ses: str, ids: list[str]) -> tuple[Runner, str, str, list[str]]:
    """``run COMMAND SES [RUN] --all``: the run (default: the latest) and every call of it that waits."""
    from ._ids import resolve_run

    if len(ids) > 1:
        raise UsageError(f"run {command} --all takes SES [RUN], not an operation (it decides every waiting call)")
    lease_ttl_s()
    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(runner.sessions.resolve_id(ses))
    run = resolve_run(runner, info, ids[0] if ids else None)
    ops = [op for op, e in runner.ops(runner.run_state(info, run)[1]).items() if e["state"] == OpState.PENDING_APPROVAL]
    if not ops:
        raise UsageError(f"no call of run {run} waits for approval; `kxen-agent run show {info.id} {run}` shows its "
                         "journal")
    return runner, info.id, run, ops


@run_app.command("approve")
def approve_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    ids: Optional[list[str]] = typer.Argument(
        None, metavar="[RUN] OP", help="The call that waits, after its run (optional: found from OP); ids or unique prefixes."),
    every: bool = typer.Option(False, "--all", help="Every call of the run (default: the latest) that waits."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, run, op, tool, approval, approver, reason, waiting} as JSON."),
) -> None:
    """Approve a tool call that waits for approval; `--resume` then runs it.

    A call that [policy] approve lists waits when nobody at a terminal could
    be asked (`run show` lists it). The decision is recorded on this state
    dir, the one that will run the call.

    \b
    Examples:
      kxen-agent run approve ses_6508 op_5d1e
      kxen-agent run approve ses_6508 run_91c2 op_5d1e
      kxen-agent run approve ses_6508 --all
    """
    _decide(ses, ids, yes=True, reason=None, json_out=json_out, every=every)


@run_app.command("deny")
def deny_cmd(
    ses: str = typer.Argument(..., metavar="SES", help="A session id or a unique prefix of one."),
    ids: Optional[list[str]] = typer.Argument(
        None, metavar="[RUN] OP", help="The call that waits, after its run (optional: found from OP); ids or unique prefixes."),
    every: bool = typer.Option(False, "--all", help="Every call of the run (default: the latest) that waits."),
    reason: Optional[str] = typer.Option(
        None, "--reason", metavar="TEXT", help="What the model is told instead of the call's output: \"no, do X instead\"."),
    json_out: bool = typer.Option(
        False, "--json", help="Print {session, run, op, tool, approval, approver, reason, waiting} as JSON."),
) -> None:
    """Deny a tool call that waits for approval; it never runs, and the model is told.

    The call's result is `refused by the user` (and your --reason);
    `--resume` then goes on with the run.

    \b
    Examples:
      kxen-agent run deny ses_6508 op_5d1e
      kxen-agent run deny ses_6508 op_5d1e --reason "no, run the tests first"
    """
    _decide(ses, ids, yes=False, reason=reason, json_out=json_out, every=every)
