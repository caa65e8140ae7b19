"""The ``kxen-agent`` command line: parse, call the library, render.

No command here decides anything about state: each one calls the library
and renders its answer as text or ``--json``. Every :class:`KxenError` is
printed as one line on stderr and mapped to its exit code; see the README's
exit-code table.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import Store, decode_body, fsck as run_fsck

from ._render import Progress, emit_json, err, out, to_jsonable

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
) -> None:
    """A coding agent whose sessions are durable, forkable and portable."""
    if ctx.invoked_subcommand is not None:
        if resume is not None:
            raise UsageError("--resume takes no subcommand")
        return
    if resume is None:
        if any([task, task_file, workspace, rebind_workspace]):
            raise UsageError("--task/--workspace at the top level need --resume SES (or use `kxen-agent run`)")
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    resume_cmd(resume, task, task_file, workspace, rebind_workspace, json_out)


def open_store() -> Store:
    return Store.open()


@app.command("fsck")
def fsck_cmd(json_out: bool = typer.Option(False, "--json", help="Print a JSON report.")) -> None:
    """Verify every object, ref and reflog, and the closure between them."""
    store = open_store()
    prog = Progress("fsck", enabled=not json_out)
    rep = run_fsck(store, progress=prog)
    prog.done()
    if json_out:
        emit_json(rep.to_json())
    else:
        for p in rep.problems:
            err(p.line())
        for d in rep.dangling:
            out(f"dangling object {d}")
        for f in rep.stray_files:
            out(f"stray file {f} (left by an interrupted write; gc removes it)")
        status = "clean" if rep.clean else f"{len(rep.problems)} problem(s)"
        out(
            f"fsck {store.root}: {rep.objects} objects ({rep.loose} loose, {rep.packed} packed), "
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
        import json

        out(f"{obj.kind} {obj.hex}")
        out(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, render errors as one line, return the exit code.

    Typer handles usage errors itself (exit 2); library errors arrive here
    as :class:`KxenError` and become one line on stderr.
    """
    try:
        app(args=argv, prog_name="kxen-agent")
        return 0
    except SystemExit as e:
        code = e.code
        if _stdout_pipe_closed():
            return 141  # as git does: the reader (`| head`) went away, nothing failed
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KxenError as e:
        err(f"kxen-agent: error: {e}")
        return e.exit_code
    except KeyboardInterrupt:
        err("kxen-agent: interrupted")
        return 130
    except BrokenPipeError:
        return 141
    except OSError as e:
        # A failing disk (ENOSPC, EIO, EROFS...) reaches here as the OSError
        # the store's FileIO raised. Every store write is atomic and its
        # commit point comes last, so what was acknowledged before is intact.
        err(f"kxen-agent: error: {os_error_line(e)}")
        return 1


def _stdout_pipe_closed() -> bool:
    """Whether typer caught EPIPE on stdout: it then swaps in click's PacifyFlushWrapper and exits 1.

    By name: typer vendors click in some versions and imports it in others.
    """
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


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
