"""The ``kxen-agent`` command line: parse, call the library, render.

No command here decides anything about state: each one calls the library
and renders its answer as text or ``--json``. Every :class:`KxenError` is
printed as one line on stderr and mapped to its exit code; see the exit-code
table in docs/commands.md.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Optional

import typer

from kxen_agent.errors import KxenError, UsageError

from ._errors import os_error_line
from ._render import err, term_text

# click's exceptions, wherever this typer takes click from (it vendors click
# as typer._click in some versions and imports it in others).
_click_exceptions = importlib.import_module(typer.BadParameter.__module__)
ClickException = _click_exceptions.ClickException
ClickAbort = typer.Abort  # what typer's runner raises on EOF at a prompt (click's own Abort, or typer's)
_TyperGroup = importlib.import_module(typer.Typer.__module__.replace(".main", ".core")).TyperGroup

#: The commands, in the order ``kxen-agent --help`` lists them: the daily
#: ones first, then the plumbing. Each is imported only when it is run (or
#: its own ``--help`` is asked for): the start-up of ``kxen-agent --help``
#: and of a read command is mostly Python's own (bench/startup.py). The
#: one-line purpose shown here is the command's docstring's first line
#: (tests/session/test_cli_daily.py holds them equal).
COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, attribute: a Typer app or a command function, one-line purpose)
    "run": ("kxen_agent.cli.run_cmds", "run_app",
            "Create a Session bound to a workspace and run its first task to a terminal state."),
    "session": ("kxen_agent.cli.session_cmds", "session_app",
                "List, inspect, fork, delete, export and import sessions."),
    "chat": ("kxen_agent.cli.chat", "chat_cmd", "Talk with the agent at the terminal: each message a new run of one session."),
    "fsck": ("kxen_agent.cli.store_cmds", "fsck_cmd", "Verify every object, ref and reflog, and the closure between them."),
    "gc": ("kxen_agent.cli.store_cmds", "gc_cmd",
           "Pack reachable objects; prune unreachable ones and deleted sessions past the grace period."),
    "repair": ("kxen_agent.cli.repair_cmds", "repair_cmd",
               "Mend what fsck names: good copies from bundles or a remote, the rest kept in lost-found/."),
    "cat-object": ("kxen_agent.cli.store_cmds", "cat_object_cmd", "Print one object (plumbing, like git cat-file -p)."),
    "bundle": ("kxen_agent.cli.store_cmds", "bundle_app", "Check bundles (session export/import files)."),
    "demo": ("kxen_agent.cli.demo", "demo_cmd",
             "Run the guided offline demo: a session run, forked, exported, imported and resumed."),
}
DAILY = ("run", "session", "chat")


def _plain_help(cmd: Any) -> None:
    """One help formatter for every command: click's plain text (no rich: its import alone costs more
    than the rest of ``--help``, and the plain text is what a pipe or a pager wants)."""
    if hasattr(cmd, "rich_markup_mode"):
        cmd.rich_markup_mode = None
    for sub in getattr(cmd, "commands", {}).values():
        _plain_help(sub)


class LazyGroup(_TyperGroup):  # type: ignore[misc, valid-type]
    """A command group (``session``, ``bundle``) whose subcommands are built from their functions when used.

    typer builds a group by inspecting every subcommand's signature; the
    ``session`` group has 19, and ``kxen-agent session list`` needs one
    (bench/startup.py). The group keeps typer's ``CommandInfo`` of each and
    builds a subcommand the first time it is asked for: the same click
    command typer would have built, in the same order, with the same help.
    """

    pending: dict[str, Any]

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.pending)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.pending:
            cmd = typer.main.get_command_from_info(self.pending[cmd_name], pretty_exceptions_short=True,
                                                   rich_markup_mode=None)
            _plain_help(cmd)
            self.commands[cmd_name] = cmd
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.pending:
            # Not a subcommand (a typo, or an option): typer's "Did you mean"
            # looks among the built commands, so build them all, as typer would have.
            for name in self.pending:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


def _lazy_group(app: Any, name: str) -> Any:
    """``app`` (a Typer with commands and no sub-groups) as a :class:`LazyGroup` named ``name``."""
    infos = list(app.registered_commands)
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    one.add_typer(app, name=name, cls=LazyGroup)
    app.registered_commands = []  # the group is built without them: LazyGroup builds each when used
    try:
        group = typer.main.get_command(one).get_command(None, name)
    finally:
        app.registered_commands = infos
    group.pending = {i.name or typer.main.get_command_name(i.callback.__name__): i for i in infos}
    return group


def load_command(name: str) -> Any:
    """The click command ``name`` of :data:`COMMANDS`, imported and built now."""
    module, attr, _purpose = COMMANDS[name]
    obj = getattr(importlib.import_module(module), attr)
    # Built as a subcommand of an app of its own, as add_typer/command on the
    # root would build it (no completion options, the same help).
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    if isinstance(obj, typer.Typer) and not obj.registered_groups and len(obj.registered_commands) > 1:
        cmd = _lazy_group(obj, name)
    elif isinstance(obj, typer.Typer):
        one.add_typer(obj, name=name)
        cmd = typer.main.get_command(one).get_command(None, name)
    else:
        one.command(name)(obj)
        cmd = typer.main.get_command(one)  # a single command: typer returns it as is
    cmd.name = name
    _plain_help(cmd)
    return cmd


class RootGroup(_TyperGroup):  # type: ignore[misc, valid-type]
    """The top-level group: its commands are loaded when used; ``--help`` lists them from :data:`COMMANDS`."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        for title, names in (("Daily commands", DAILY), ("Plumbing", [n for n in COMMANDS if n not in DAILY])):
            with formatter.section(title):
                formatter.write_dl([(n, COMMANDS[n][2]) for n in names])


app = typer.Typer(
    name="kxen-agent",
    cls=RootGroup,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        import kxen_agent

        typer.echo(f"kxen-agent {kxen_agent.__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="SES",
        help="Continue SES's unfinished run, or start a new one with --task (SES: an id or a unique prefix)."),
    continue_: bool = typer.Option(
        False, "--continue", "-c",
        help="Resume the most recent session bound to this directory (or --workspace DIR)."),
    task: Optional[str] = typer.Option(None, "--task", metavar="TEXT", help="With --resume/--continue: a new consecutive task."),
    task_file: Optional[str] = typer.Option(
        None, "--task-file", metavar="FILE", help="With --resume/--continue: the new task from FILE ('-': standard input)."),
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR",
        help="With --resume: the workspace to check (or rebind); with --continue: where to look (default: here)."),
    rebind_workspace: bool = typer.Option(
        False, "--rebind-workspace", help="Re-point the binding to --workspace DIR if its identity checks out."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the run result as one JSON object (session, run, status, turn, result...)."),
    retry: bool = typer.Option(
        False, "--retry", help="With --resume/--continue: a new run that re-attempts the last failed or canceled run's task."),
    model: Optional[str] = typer.Option(
        None, "--model", metavar="MODEL",
        help="With --resume/--continue: the model for this run (default: the run's recorded one, or the agent's)."),
    base_url: Optional[str] = typer.Option(
        None, "--base-url", metavar="URL", help="With --resume/--continue: the endpoint for this run (openai and anthropic providers)."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="With --resume/--continue: no live output or progress, only the result."),
    events: bool = typer.Option(
        False, "--events", help="With --resume/--continue: JSON Lines events on stdout (not with --json)."),
    remote_lease: bool = typer.Option(
        False, "--remote-lease",
        help="With --resume/--continue: hold the session's lease on its Git remote and push every durable step."),
    remote: Optional[str] = typer.Option(
        None, "--remote", metavar="NAME_OR_URL", help="With --remote-lease: the remote (default: the workspace's origin)."),
    yes: bool = typer.Option(
        False, "--yes", "-y",
        help="With --resume/--continue: approve every call the agent's [policy] approve lists, without asking."),
    agent: Optional[str] = typer.Option(
        None, "--agent", metavar="FILE",
        help="With --resume/--continue: re-bind the session to this agent definition of yours (TOML)."),
    api_key_env: Optional[str] = typer.Option(
        None, "--api-key-env", metavar="NAME",
        help="With --resume/--continue: the variable holding the API key (with --base-url: a pair you accept)."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."),
) -> None:
    """A coding agent whose sessions are durable, forkable and portable.

    \b
    Examples:
      kxen-agent                                        # at a terminal: an interactive session here
      kxen-agent run --task "fix the failing test"      # a new session bound to this directory
      kxen-agent --continue --task "now the docs"       # the latest session here, a new task
      kxen-agent --resume ses_6508                      # continue an unfinished run (id or prefix)
      kxen-agent session list                           # what is there, newest activity last
      kxen-agent run show ses_6508                      # the latest run and its tool journal

    Exit codes: 0 done, 1 error or run failed, 2 usage, 3 input required
    (an UNKNOWN operation: run show, then run resolve; a tool call waits
    for approval: `run approve` or `run deny`; or a session from elsewhere
    waits for this machine's decision: session trust), 75 session busy,
    130 canceled.
    """
    if ctx.invoked_subcommand is not None:
        if resume is not None or continue_:
            raise UsageError("--resume/--continue take no command after them")
        return
    if resume is not None and continue_:
        raise UsageError("give either --resume SES or --continue, not both")
    if resume is None and not continue_:
        if any([task, task_file, workspace, rebind_workspace, retry, model, base_url, quiet, events, remote_lease,
                remote, yes, agent, api_key_env]):
            raise UsageError("--task/--workspace/--retry/--model/--base-url/--quiet/--events/--remote-lease/--yes/--agent/"
                             "--api-key-env at the top level need --resume SES or --continue (or use `kxen-agent run` "
                             "for a new session)")
        if sys.stdin.isatty() and sys.stdout.isatty():  # `kxen-agent` alone at a terminal: the interactive session
            from .chat import open_chat

            open_chat()
            return
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    from .run_cmds import resume_cmd

    more = dict(retry=retry, model=model, base_url=base_url, quiet=quiet, events=events,
                remote_lease=remote_lease, remote=remote, yes=yes, agent=agent, api_key_env=api_key_env)

    if continue_:
        from kxen_agent.session.sessions import NS, SessionStore
        from kxen_agent.store import Store

        here = os.path.realpath(workspace if workspace is not None else os.getcwd())
        store = Store.open(namespaces=(NS,))
        from kxen_agent.session.trust import ours_now

        # Only a session this state dir created or has run, and none dated in the future (§14.13):
        # an imported session's times are whatever its bundle says.
        info = SessionStore(store).latest_for_workspace(here, keep=lambda i: ours_now(store, i))
        if info is None:
            raise KxenError(f"no session this state dir created or has run is bound to workspace {here} in state dir "
                            f"{store.root}; start one with `kxen-agent run --task TEXT`, or resume an imported one "
                            "with `kxen-agent --resume SES` (`kxen-agent session list` shows what there is)")
        # The directory is always checked: found by identity at another
        # path, the resume names the rebind to run.
        resume_cmd(info.id, task, task_file, here, rebind_workspace, json_out, **more)
        return
    assert resume is not None
    resume_cmd(resume, task, task_file, workspace, rebind_workspace, json_out, **more)


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
    args = sys.argv[1:] if argv is None else argv
    try:
        _check_io_fault_spec()
        _check_resume_value(args)
        code = app(args=args, prog_name="kxen-agent", standalone_mode=False)
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
        err(f"kxen-agent: error: {term_text(click_error_line(e, args), quote=False)}")
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


#: Words people type as commands that are options or subcommands here, and what they meant.
_MEANT = {
    "resume": "kxen-agent --resume SES (or --continue for the latest session here)",
    "continue": "kxen-agent --continue",
    "list": "kxen-agent session list", "ls": "kxen-agent session list",
    "show": "kxen-agent session show SES (or kxen-agent run show SES)",
    "log": "kxen-agent session log SES", "tree": "kxen-agent session tree SES",
    "fork": "kxen-agent session fork SES", "delete": "kxen-agent session delete SES",
    "undelete": "kxen-agent session undelete SES",
    "export": "kxen-agent session export SES -o FILE", "import": "kxen-agent session import FILE",
    "resolve": "kxen-agent run resolve SES OP --output TEXT", "verify": "kxen-agent bundle verify FILE",
    "version": "kxen-agent --version",
}


def _check_resume_value(args: list[str]) -> None:
    """``kxen-agent --resume --task hi``: the session id is missing, say so (click would take
    ``--task`` as the id and ``hi`` as a command)."""
    for i, tok in enumerate(args):
        if tok == "--":
            return
        if tok == "--resume" and i + 1 < len(args) and args[i + 1].startswith("-"):
            rest = " ".join(args[i + 1:])
            raise UsageError(f"--resume needs a session id before the other options: kxen-agent --resume SES {rest} "
                             f"(or kxen-agent --continue {rest} for the latest session in this directory; "
                             "`kxen-agent session list` shows the ids)")
        if not tok.startswith("-") and tok in COMMANDS:
            return  # options after a command are that command's


def click_error_line(e: ClickException, argv: list[str]) -> str:
    """One line for a click usage error, pointing at the command's --help.

    ``kxen-agent session show`` without SES gives "missing argument 'SES'
    (see kxen-agent session show --help)". A group named without a command
    (``kxen-agent session``) lists its commands. A word that is an option or
    a subcommand here (``kxen-agent resume``) gets what was meant.
    (The groups do not set ``no_args_is_help``: typer's help printer would
    write the whole help while that error is being made.)
    """
    ctx = getattr(e, "ctx", None)
    msg = " ".join(e.format_message().split()).rstrip(".")
    if ctx is not None and hasattr(ctx.command, "list_commands") and msg == "Missing command":
        names = ctx.command.list_commands(ctx)
        msg = f"{ctx.command_path} needs a command" + (f": {', '.join(names)}" if names else "")
    elif len(msg) > 1 and msg[0].isupper() and msg[1].islower():
        msg = msg[0].lower() + msg[1:]  # "Missing argument" -> "missing argument", as our own errors read
    if msg.startswith("no such command"):
        word = msg.split("'")[1] if msg.count("'") >= 2 else ""
        if word in _MEANT:
            msg = f"no such command '{word}'; did you mean `{_MEANT[word]}`?"
    # click's parser raises some errors ("option '--prune' requires an argument") without a context.
    msg += f" (see {ctx.command_path if ctx is not None else _command_path(argv)} --help)"
    return msg


def _command_path(argv: list[str]) -> str:
    """``kxen-agent session show`` for ``argv`` = ``session show ...``: the (sub)commands it names, best effort."""
    cmd: Any = typer.main.get_command(app)
    words = ["kxen-agent"]
    for tok in argv:
        if tok.startswith("-"):
            continue
        sub = cmd.get_command(None, tok) if hasattr(cmd, "get_command") else None
        if sub is None:
            break
        cmd = sub
        words.append(tok)
    return " ".join(words)


def _check_io_fault_spec() -> None:
    """A misspelt ``KXEN_AGENT_IO_FAULT`` is a usage error for every command, read-only ones too."""
    spec = os.environ.get("KXEN_AGENT_IO_FAULT", "")  # fsio.IO_FAULT_ENV, read without importing the store
    if spec:
        from kxen_agent.store.fsio import IOFaultSpecError, parse_fault_spec

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


def entry() -> None:  # pragma: no cover - console script shim
    # The console script is start.entry (no typer before a command line is read); a script installed before
    # it still gives `session grep` its lean way, without the command groups.
    from .grep_lean import main as lean

    code = lean(sys.argv[1:])
    sys.exit(main() if code is None else code)
