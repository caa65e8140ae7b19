"""``kxen-agent run``, ``--resume`` and ``run show/resolve``: render the runtime."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import AbstractContextManager
from typing import Optional

import typer

from kxen_agent.errors import UsageError
from kxen_agent.runtime.cancel import cancel_on_signals
from kxen_agent.runtime.lease import lease_ttl_s
from kxen_agent.runtime.runner import Runner, RunResult
from kxen_agent.session.agent_def import load_agent_definition
from kxen_agent.session.sessions import NS
from kxen_agent.store import Store
from kxen_agent.store.objects import MAX_OBJECT_SIZE

from ._render import emit_json, err, out, out_text, term_text as t

DEFAULT_AGENT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "demo-agent", "agent.toml")

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


def cancellation(json_out: bool) -> AbstractContextManager[threading.Event]:
    """SIGINT/SIGTERM set the yielded event: the runner cancels cooperatively.

    :func:`~kxen_agent.runtime.cancel.cancel_on_signals` does the signal
    work; the CLI adds only the notes on stderr (none with ``--json``): one
    for the first signal, one saying a second changes nothing, then silence.
    """

    def note(sig: signal.Signals, seen: int) -> None:
        if seen == 1:
            err(f"kxen-agent: {sig.name}: canceling the run cooperatively; a running tool gets its "
                "cancellation window to stop, then its outcome is journaled...")
        elif seen == 2:
            err(f"kxen-agent: {sig.name} again: still canceling — the journal is being written and "
                "will not be skipped; the process ends on its own within the tool's cancellation window")

    return cancel_on_signals(on_signal=None if json_out else note)


def render_result(res: RunResult, json_out: bool) -> None:
    if json_out:
        emit_json(res.to_json())
    else:
        out(f"session {res.session} run {res.run}: {t(res.status)} after {res.turn} turn(s) (model {t(res.model)})")
        if res.result:
            out_text("result", res.result)
        if res.error:
            out_text("error", res.error)
        for op in map(t, res.unknown_ops):
            out(
                f"UNKNOWN: operation {op} may or may not have taken effect; check the workspace, then "
                f"`kxen-agent run resolve {res.session} {res.run} {op} --output TEXT [--is-error]` "
                f"and `kxen-agent --resume {res.session}`"
            )
    raise typer.Exit(res.exit_code)


def make_runner(cancel: threading.Event, json_out: bool) -> Runner:
    def note(line: str) -> None:  # progress notes name paths and stored values
        err(f"kxen-agent: {t(line, quote=False)}")

    return Runner(Store.open(namespaces=(NS,)), cancel=cancel, on_event=(lambda line: None) if json_out else note)


@run_app.callback(invoke_without_command=True)
def run_cmd(
    ctx: typer.Context,
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR", help="The workspace directory to bind the new session to (default: this directory)."),
    task: Optional[str] = typer.Option(None, "--task", metavar="TEXT", help="The task text."),
    task_file: Optional[str] = typer.Option(
        None, "--task-file", metavar="FILE", help="A file holding the task ('-': standard input)."),
    agent: Optional[str] = typer.Option(
        None, "--agent", metavar="FILE", help="Agent definition (TOML); default: the bundled demo agent."),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object: {session, run, status, turn, model, result, error, unknownOps, settled}."),
) -> None:
    """Create a Session bound to a workspace and run its first task to a terminal state.

    With no --task or --task-file, a task piped on standard input is read.
    `run show` and `run resolve` inspect and settle a session's runs.

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
    lock = load_agent_definition(agent or DEFAULT_AGENT)
    lease_ttl_s()  # a bad KXEN_AGENT_LEASE_TTL_S is refused before the session is created, not after
    with cancellation(json_out) as cancel:
        res = make_runner(cancel, json_out).start(workspace, text, lock)
    render_result(res, json_out)


def resume_cmd(ses: str, task: Optional[str], task_file: Optional[str], workspace: Optional[str],
               rebind: bool, json_out: bool) -> None:
    text = read_task(task, task_file)
    lease_ttl_s()
    with cancellation(json_out) as cancel:
        runner = make_runner(cancel, json_out)
        ses = runner.sessions.resolve_id(ses)
        if rebind and text is None and rebind_only(runner, ses, workspace, json_out):
            return
        res = runner.resume(ses, task=text, workspace=workspace, rebind=rebind)
    render_result(res, json_out)


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
        False, "--json", help="Print the run and its journal as JSON (README: JSON output)."),
) -> None:
    """The run's status, model, turns, result and its tool journal.

    \b
    Examples:
      kxen-agent run show ses_6508
      kxen-agent run show ses_6508 run_91c2 --json
    """
    from ._ids import resolve_run

    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(runner.sessions.resolve_id(ses))
    ses = info.id
    run = resolve_run(runner, info, run)
    oid, st = runner.run_state(info, run)
    ops = runner.ops(st)
    journal = []
    for op, e in ops.items():
        journal.append({
            "op": op, "tool": e["tool"], "arguments": e["arguments"], "state": e["state"],
            "source": e.get("source"), "turn": e.get("turn"), "callId": e.get("callId"),
            "sideEffects": e.get("sideEffects"),
            "outcome": None if e["state"] in ("Started", "OutcomeUnknown") and e.get("source") != "human"
            else {"output": runner.entry_output(e), "isError": e.get("isError", False)},
            "note": e.get("note"),
        })
    doc = {
        "session": ses, "run": run, "index": st["index"], "status": st["status"], "settled": st.get("settled", False),
        "model": st["model"], "turn": st["turn"], "task": st["task"], "result": st.get("result"),
        "error": st.get("error"), "state": oid.hex(), "journal": journal,
    }
    if json_out:
        emit_json(doc)
        return
    # Stored text goes through t()/out_text(): an imported run's values are someone else's bytes.
    out(f"run {t(run)} (session {t(ses)}, #{st['index']}): {t(st['status'])}{'' if st.get('settled') else ' (not settled)'}")
    out(f"model: {t(st['model'])}   turns: {st['turn']}")
    out_text("task", st["task"])
    if st.get("result") is not None:
        out_text("result", st["result"])
    if st.get("error"):
        out_text("error", st["error"])
    out(f"journal ({len(journal)} operation(s)):")
    for j in journal:
        out(f"  {t(j['op'])}  {t(j['state']):<14} {t(j['tool'])} {t(str(j['arguments']))}")
        if j["outcome"] is not None:
            first = (j["outcome"]["output"] or "").strip().splitlines()
            tail = f" ({len(first)} lines)" if len(first) > 1 else ""
            out(f"      {'error' if j['outcome']['isError'] else 'output'}: {t(first[0]) if first else ''}{tail}")
        elif j["state"] == "OutcomeUnknown":
            out(f"      outcome UNKNOWN: check, then `kxen-agent run resolve {t(ses)} {t(run)} {t(j['op'])} --output TEXT`")


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
    from ._ids import resolve_op, resolve_run

    if len(ids) > 2:
        raise UsageError(f"run resolve takes SES [RUN] OP, got {len(ids) + 1} ids (see kxen-agent run resolve --help)")
    check_text(output, "--output")  # before the lease is taken: a bad value changes nothing
    lease_ttl_s()
    runner = Runner(Store.open(namespaces=(NS,)))
    info = runner.sessions.get(runner.sessions.resolve_id(ses))
    ses = info.id
    if len(ids) == 1:  # SES OP: the run is the one whose journal holds OP
        run, op = resolve_op(runner, info, None, ids[0])
    elif len(ids) == 2:
        run, op = resolve_op(runner, info, resolve_run(runner, info, ids[0]), ids[1])
    else:
        raise UsageError(f"run resolve takes SES [RUN] OP, got {len(ids) + 1} ids (see kxen-agent run resolve --help)")
    res = runner.resolve(ses, run, op, output, is_error=is_error)
    if json_out:
        emit_json(res)
    else:
        out(f"{t(op)} resolved ({'error' if is_error else 'ok'}); continue with `kxen-agent --resume {t(ses)}`")
