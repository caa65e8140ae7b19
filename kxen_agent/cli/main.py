"""The ``kxen-agent`` command line: parse, call the library, render.

No command here decides anything about state: each one calls the library
and renders its answer as text or ``--json``. Every :class:`KxenError` is
printed as one line on stderr and mapped to its exit code; see the README's
exit-code table.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Optional

import typer

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.session.schema import SESSION_SCHEMA
from kxen_agent.session.sessions import NS
from kxen_agent.store import Store, decode_body, fsck as run_fsck

from ._render import Progress, dumps_json, emit_json, err, out, term_text, to_jsonable

# click's exceptions, wherever this typer takes click from (it vendors click
# as typer._click in some versions and imports it in others).
_click_exceptions = importlib.import_module(typer.BadParameter.__module__)
ClickException = _click_exceptions.ClickException
ClickAbort = typer.Abort  # what typer's runner raises on EOF at a prompt (click's own Abort, or typer's)

app = typer.Typer(
    name="kxen-agent",
    help="A coding agent whose sessions are durable, forkable and portable.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


from .run_cmds import resume_cmd, run_app  # noqa: E402
from .session_cmds import session_app  # noqa: E402

from . import demo  # noqa: E402

app.add_typer(run_app, name="run")
demo.register(app)
from .store_cmds import register as _register_store_cmds  # noqa: E402

_register_store_cmds(app)
from .remote_cmds import register as _register_remote_cmds  # noqa: E402

_register_remote_cmds(session_app)
app.add_typer(session_app, name="session")


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    resume: Optional[str] = typer.Option(None, "--resume", metavar="SES", help="Continue SES's unfinished run, or start a new one with --task."),
    task: Optional[str] = typer.Option(None, "--task", help="With --resume: a new consecutive task."),
    task_file: Optional[str] = typer.Option(None, "--task-file", help="With --resume: the new task from a file."),
    workspace: Optional[str] = typer.Option(None, "--workspace", "-w", help="With --resume: the workspace path to check (or rebind)."),
    rebind_workspace: bool = typer.Option(False, "--rebind-workspace", help="Re-point the binding to --workspace if its identity checks out."),
    json_out: bool = typer.Option(False, "--json", help="Print the run result as JSON."),
    retry: bool = typer.Option(False, "--retry", help="With --resume: a new run that re-attempts the last failed or canceled run's task."),
    model: Optional[str] = typer.Option(None, "--model", help="With --resume: the model for this run (default: the run's recorded one, or the agent's)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="With --resume: the endpoint for this run (openai provider)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="With --resume: no live output or progress, only the result."),
    events: bool = typer.Option(False, "--events", help="With --resume: JSON Lines events on stdout (not with --json)."),
    remote_lease: bool = typer.Option(False, "--remote-lease", help="With --resume: hold the session's lease on its Git remote and push every durable step."),
    remote: Optional[str] = typer.Option(None, "--remote", metavar="NAME_OR_URL", help="With --remote-lease: the remote (default: the workspace's origin)."),
) -> None:
    """A coding agent whose sessions are durable, forkable and portable."""
    if ctx.invoked_subcommand is not None:
        if resume is not None:
            raise UsageError("--resume takes no subcommand")
        return
    if resume is None:
        if any([task, task_file, workspace, rebind_workspace, retry, model, base_url, quiet, events, remote_lease,
                remote]):
            raise UsageError("--task/--workspace/--retry/--model/--base-url/--quiet/--events/--remote-lease at the top "
                             "level need --resume SES (or use `kxen-agent run`)")
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    resume_cmd(resume, task, task_file, workspace, rebind_workspace, json_out, retry=retry, model=model,
               base_url=base_url, quiet=quiet, events=events, remote_lease=remote_lease, remote=remote)


def open_store() -> Store:
    return Store.open(namespaces=(NS,))


@app.command("fsck")
def fsck_cmd(json_out: bool = typer.Option(False, "--json", help="Print a JSON report.")) -> None:
    """Verify every object, ref and reflog, and the closure between them."""
    store = open_store()
    prog = Progress("fsck", enabled=not json_out)
    rep = run_fsck(store, progress=prog, schema=SESSION_SCHEMA)
    prog.done()
    if json_out:
        emit_json(rep.to_json())
    else:
        # A problem line can quote what a damaged or hostile state dir holds (ref names, file names).
        for p in rep.problems:
            err(term_text(p.line(), quote=False))
        for d in rep.dangling:
            out(f"dangling object {d}")
        for f in rep.stray_files:
            # Temp files (an interrupted write's; gc removes those under objects/) and names no
            # writer makes (objects_spec.md §11 steps 1, 6, 7): nothing reads either.
            out(f"stray file {term_text(f)} (nothing reads it: the temp file of an interrupted or running "
                "write, or a name no writer makes)")
        status = "clean" if rep.clean else f"{len(rep.problems)} problem(s)"
        out(
            f"fsck {term_text(store.root)}: {rep.objects} objects ({rep.loose} loose, {rep.packed} packed), "
            f"{rep.refs} ref{'' if rep.refs == 1 else 's'} in {rep.groups} group{'' if rep.groups == 1 else 's'}, "
            f"{rep.reachable} reachable, "
            f"{len(rep.dangling)} dangling: {status}"
        )
    if not rep.clean:
        raise typer.Exit(1)


@app.command("cat-object")
def cat_object_cmd(
    oid: str = typer.Argument(..., metavar="ID", help="Object id or unique prefix (8+ hex digits)."),
    json_out: bool = typer.Option(False, "--json", help="Print id, kind, size and value as JSON."),
) -> None:
    """Print one object (plumbing, like git cat-file -p)."""
    store = open_store()
    obj = store.read_raw(store.resolve(oid))
    value = decode_body(obj)
    if json_out:
        body = value.decode("utf-8", "replace") if obj.kind == "blob" else to_jsonable(value)
        emit_json({"id": obj.hex, "kind": obj.kind, "size": len(obj.body), "value": body})
    elif obj.kind == "blob":
        sys.stdout.buffer.write(value)
    else:
        out(f"{obj.kind} {obj.hex}")
        out(dumps_json(to_jsonable(value), indent=2))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, render errors as one line, return the exit code.

    The app runs with click's standalone mode off, so a usage error (a
    missing argument, an unknown option or command) comes back here as a
    click exception and is printed as one line like every other error,
    instead of click's boxed usage text; ``--help`` still prints the help
    and exits 0 (click's ``Exit(0)``, returned as the code). Library errors
    arrive as :class:`KxenError`.
    """
    stdout_was = _stdout_identity()
    try:
        _check_io_fault_spec()
        code = app(args=argv, prog_name="kxen-agent", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except SystemExit as e:
        code = e.code
        if _stdout_pipe_closed() or _stdout_swapped_for_devnull(stdout_was):
            return 141  # as git does: the reader (`| head`) went away, nothing failed
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KxenError as e:
        # The message may quote stored text (an imported session's values) or argv.
        err(f"kxen-agent: error: {term_text(str(e), quote=False)}")
        return e.exit_code
    except ClickException as e:
        err(f"kxen-agent: error: {term_text(click_error_line(e, sys.argv[1:] if argv is None else argv), quote=False)}")
        return e.exit_code
    except ClickAbort:
        err("kxen-agent: aborted")
        return 1
    except KeyboardInterrupt:
        err("kxen-agent: interrupted")
        return 130
    except BrokenPipeError:
        return 141
    except OSError as e:
        # A failing disk (ENOSPC, EIO, EROFS...) reaches here as the OSError
        # the store's FileIO raised. Every store write is atomic and its
        # commit point comes last, so what was acknowledged before is intact.
        err(f"kxen-agent: error: {term_text(os_error_line(e), quote=False)}")
        return 1


def click_error_line(e: ClickException, argv: list[str]) -> str:
    """One line for a click usage error, pointing at the command's --help.

    ``kxen-agent session show`` without SES gives "missing argument 'SES'
    (see kxen-agent session show --help)". A group named without a command
    (``kxen-agent session``) lists its commands. (The groups do not set
    ``no_args_is_help``: typer's rich help printer writes the whole help
    while that error is being made, before it could be turned into one line.)
    """
    ctx = getattr(e, "ctx", None)
    msg = " ".join(e.format_message().split()).rstrip(".")
    if ctx is not None and hasattr(ctx.command, "list_commands") and msg == "Missing command":
        names = ctx.command.list_commands(ctx)
        msg = f"{ctx.command_path} needs a command" + (f": {', '.join(names)}" if names else "")
    elif len(msg) > 1 and msg[0].isupper() and msg[1].islower():
        msg = msg[0].lower() + msg[1:]  # "Missing argument" -> "missing argument", as our own errors read
    # click's parser raises some errors ("option '--prune' requires an argument") without a context.
    msg += f" (see {ctx.command_path if ctx is not None else _command_path(argv)} --help)"
    return msg


def _command_path(argv: list[str]) -> str:
    """``kxen-agent session show`` for ``argv`` = ``session show ...``: the (sub)commands it names, best effort."""
    cmd = typer.main.get_command(app)
    words = ["kxen-agent"]
    for tok in argv:
        if tok.startswith("-"):
            continue
        sub = getattr(cmd, "commands", {}).get(tok)
        if sub is None:
            break
        cmd = sub
        words.append(tok)
    return " ".join(words)


def _check_io_fault_spec() -> None:
    """A misspelt ``KXEN_AGENT_IO_FAULT`` is a usage error for every command, read-only ones too."""
    from kxen_agent.store.fsio import IO_FAULT_ENV, IOFaultSpecError, parse_fault_spec

    spec = os.environ.get(IO_FAULT_ENV, "")
    if spec:
        try:
            parse_fault_spec(spec)
        except IOFaultSpecError as e:
            raise UsageError(str(e)) from None


def _stdout_pipe_closed() -> bool:
    """Whether typer caught EPIPE on stdout: it then swaps in click's PacifyFlushWrapper and exits 1.

    By name: typer vendors click in some versions and imports it in others.
    """
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _stdout_identity() -> tuple[int, int] | None:
    try:
        st = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_dev, st.st_ino


def _stdout_swapped_for_devnull(before: tuple[int, int] | None) -> bool:
    """Whether rich caught EPIPE (``--help | head``): it dup2s /dev/null over stdout and exits 1.

    Only a change of stdout to /dev/null counts, so a real exit 1 with
    stdout already on /dev/null stays 1.
    """
    if before is None:
        return False
    now = _stdout_identity()
    if now is None or now == before:
        return False
    try:
        dn = os.stat(os.devnull)
    except OSError:
        return False
    return now == (dn.st_dev, dn.st_ino)


def os_error_line(e: OSError) -> str:
    """One line for an OSError: what failed, on which path, and what to do."""
    import errno as _errno

    name = _errno.errorcode.get(e.errno or 0, "")
    what = e.strerror or str(e)
    where = f" on {e.filename}" if e.filename else ""
    hint = "free some space" if e.errno in (_errno.ENOSPC, _errno.EDQUOT) else "check the disk"
    return " ".join(
        f"I/O error{where}: {what}{f' ({name})' if name else ''}; nothing acknowledged was lost — "
        f"{hint}, then retry (`kxen-agent fsck` verifies the state dir, `kxen-agent --resume SES` continues a run)".split()
    )


def entry() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
