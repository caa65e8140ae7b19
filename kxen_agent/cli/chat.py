"""``kxen-agent chat`` (and ``kxen-agent`` alone on a terminal): the interactive session.

A prompt (prompt_toolkit: multi-line input, history) where each message
typed is a new consecutive run of one session — exactly what ``kxen-agent
--resume SES --task TEXT`` does, through the same runner and the same live
view (:mod:`._live`), so every guarantee of a run holds unchanged: a kill
leaves a session that ``kxen-agent chat -c`` (or ``--resume``) continues.
The first message of a new session is ``kxen-agent run --task TEXT``.

While a run works, Esc or Ctrl-C cancels it (the cooperative cancel
contract of :mod:`kxen_agent.runtime.cancel`) and the prompt comes back;
Ctrl-D at the prompt leaves. Slash commands call the same code as their
command (``/fork`` is ``session fork``, ``/show`` is ``session show``...).
The terminal has one reader at a time (:mod:`._prompt`).

Off a terminal this command refuses: ``run --task`` and ``--resume SES
--task`` are the way there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import typer

from kxen_agent.errors import KxenError, UsageError

from ._ready import check_provider
from ._render import err, out, term_text as t

__all__ = ["chat_cmd", "open_chat"]

#: The slash commands, in the order /help lists them: (arguments, what it does, the command it is).
SLASH: dict[str, tuple[str, str, str]] = {
    "/sessions": ("", "pick a session to continue (name, last task, status, age)", "session list"),
    "/resume": ("[SES]", "continue an unfinished run (of SES: switch to it first)", "kxen-agent --resume SES"),
    "/fork": ("[MSG]", "fork this session (at MSG) and continue in the fork", "session fork SES --at MSG"),
    "/compact": ("", "summarize the history for the model from now on", "session compact SES"),
    "/model": ("[NAME]", "the model of the next runs (alone: which one)", "--resume SES --model NAME"),
    "/show": ("[RUN]", "the session (with RUN: that run and its tool journal)", "session show / run show"),
    "/diff": ("[--run RUN|--op OP|--at MSG] [--stat]", "what the agent changed in the workspace (checkpoints)",
              "session diff SES"),
    "/rewind": ("MSG [--code|--conversation] [--force] | --undo",
                "back to MSG: the workspace files and the conversation (a fork you continue in)",
                "session rewind SES --at MSG"),
    "/help": ("", "this list", ""),
    "/quit": ("", "leave (as Ctrl-D)", ""),
}


#: The runner's notes the interactive session does not repeat: a run started, a run ended (the prompt's
#: coming back says the first, :func:`_ended` the second, with its error once).
_ROUTINE = re.compile(r"run run_\w+ (started in session ses_\w+(, retrying run run_\w+)?|"
                      r"(completed|canceled|failed|input_required)(: .*)?)", re.DOTALL)


@dataclass
class Chat:
    """What the interactive session is on: its session (None until the first message), agent and model."""

    workspace: str
    agent: Optional[str]  # --agent FILE: the definition of a new session (default: the configured one)
    lock: Optional[dict]  # that definition, loaded (None: the session's own lock)
    ses: Optional[str] = None
    model: Optional[str] = None  # /model, --model: the next runs' model
    yes: bool = False
    store: Any = None

    def label(self) -> str:
        return self.ses or "new session"


def chat_cmd(
    continue_: bool = typer.Option(
        False, "--continue", "-c", help="Continue the most recent session bound to this directory (or --workspace DIR)."),
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="SES", help="Continue session SES (an id or a unique prefix)."),
    workspace: Optional[str] = typer.Option(
        None, "--workspace", "-w", metavar="DIR", help="The workspace of a new session (default: this directory)."),
    agent: Optional[str] = typer.Option(
        None, "--agent", metavar="FILE",
        help="Agent definition (TOML) of a new session; default: $KXEN_AGENT_AGENT, else the XDG config file."),
    model: Optional[str] = typer.Option(None, "--model", metavar="MODEL", help="The model of the runs (default: the agent's)."),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Approve every call the agent's [policy] approve lists, without asking."),
) -> None:
    """Talk with the agent at the terminal: each message a new run of one session.

    Esc or Ctrl-C cancels the model call or tool in progress; Ctrl-D
    leaves; /help lists the slash commands. `kxen-agent` alone on a
    terminal opens one on a new session (docs/interactive.md).

    \b
    Examples:
      kxen-agent chat
      kxen-agent chat -c
      kxen-agent chat --resume ses_6508
    """
    if resume is not None and continue_:
        raise UsageError("give either --resume SES or --continue, not both")
    open_chat(resume=resume, continue_=continue_, workspace=workspace, agent=agent, model=model, yes=yes)


def open_chat(*, resume: Optional[str] = None, continue_: bool = False, workspace: Optional[str] = None,
              agent: Optional[str] = None, model: Optional[str] = None, yes: bool = False) -> None:
    """Check everything a first run needs, then hold the prompt until Ctrl-D or /quit."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the interactive session needs a terminal (standard input and output); off one, use "
                         "`kxen-agent run --task TEXT` or `kxen-agent --resume SES --task TEXT`")
    from kxen_agent.session.sessions import NS, SessionStore
    from kxen_agent.store import Store

    store = Store.open(namespaces=(NS,))
    here = os.path.realpath(workspace if workspace is not None else os.getcwd())
    chat = Chat(workspace=here, agent=agent, lock=None, model=model, yes=yes, store=store)
    sessions = SessionStore(store)
    if continue_:
        chat.ses = _latest_here(store, sessions, here)
    elif resume is not None:
        chat.ses = sessions.resolve_id(resume)
    if chat.ses is not None:
        info = sessions.get(chat.ses)
        if workspace is None:
            chat.workspace = info.workspace.root
        lock = sessions.agent(info)
        if agent is not None:
            raise UsageError("--agent names the agent of a new session; a session continued keeps its own "
                             "(`kxen-agent --resume SES --agent FILE --task TEXT` re-binds it)")
    else:
        from ._ready import default_agent

        chat.agent = agent or default_agent()
        lock = _load_lock(chat.agent)
        chat.lock = lock
    if model is not None:
        _check_model(model)
    # Before the prompt: what the first run needs (its SDK is imported by the run, not here: start-up time).
    check_provider(lock, None, import_sdk=False)
    _loop(chat, lock)


def _load_lock(path: str) -> dict:
    from kxen_agent.session.agent_def import load_agent_definition

    return load_agent_definition(path)


def _check_model(model: str) -> None:
    if not model.strip() or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in model):
        raise UsageError(f"--model {model!r} is not a model name (one line of text, not empty)")


def _latest_here(store: Any, sessions: Any, here: str) -> str:
    """The session ``--continue`` picks: the last active one this state dir created or ran, bound here."""
    from kxen_agent.session.trust import ours_now

    info = sessions.latest_for_workspace(here, keep=lambda i: ours_now(store, i))
    if info is None:
        raise KxenError(f"no session this state dir created or has run is bound to workspace {here} in state dir "
                        f"{store.root}; start one with `kxen-agent chat`, or open another with "
                        "`kxen-agent chat --resume SES` (`kxen-agent session list` shows what there is)")
    return info.id


# ====================================================================== the loop


def _secrets(lock: dict) -> list[str]:
    """What every persisted text is redacted of (as a run's, §14.11): the API key and credential variables."""
    from kxen_agent.runtime.redaction import credential_env_values

    name = lock.get("api_key_env")
    val = os.environ.get(name) if name else None
    return ([val] if val else []) + credential_env_values(os.environ)


def _loop(chat: Chat, lock: dict) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings

    from ._prompt import PromptHistory

    history = PromptHistory(chat.store, chat.workspace, _secrets(lock))
    keys = KeyBindings()

    @keys.add("enter")
    def _submit(event: Any) -> None:
        buf = event.current_buffer
        if buf.document.text_before_cursor.endswith("\\"):  # a backslash at the end: a new line, as in a shell
            buf.delete_before_cursor(1)
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    # Alt-Enter (Esc then Enter): a new line. Not Ctrl-J: an Enter typed ahead while a run worked reaches
    # the prompt as a line feed (the terminal was in cooked mode), and must still send.
    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    session: Any = PromptSession(history=history, multiline=True, key_bindings=keys,
                                 prompt_continuation=lambda width, n, soft: "." * (width - 1) + " ")
    _greet(chat)
    warned = False
    while True:
        try:
            text = session.prompt(f"{_short(chat.label())}> ")
        except KeyboardInterrupt:  # Ctrl-C at the prompt: the line is dropped, as a shell does
            continue
        except EOFError:  # Ctrl-D
            break
        if history.problem:
            if not warned:  # once: a state dir that refuses one write refuses the next
                _tell(f"kxen-agent: warning: {t(history.problem, quote=False)}")
            warned, history.problem = True, None
        if not text.strip():
            continue
        try:
            # A message that must begin with "/" (a path) is sent with a space before it.
            if text.startswith("/"):
                if "\n" in text.strip():
                    raise UsageError("a slash command is one line; to send a message that begins with /, "
                                     "put a space before it")
                if _slash(chat, text.strip()) == "quit":
                    break
            else:
                _message(chat, text)
        except KeyboardInterrupt:
            _tell("kxen-agent: interrupted")
        except typer.Exit:
            pass
        except KxenError as e:
            _tell(f"kxen-agent: error: {t(str(e), quote=False)}")
        except OSError as e:  # a failing disk, a read-only one: every write is atomic, what was acknowledged is intact
            from ._errors import os_error_line

            _tell(f"kxen-agent: error: {t(os_error_line(e), quote=False)}")
    if chat.ses is not None:
        out(f"session {chat.ses}: `kxen-agent chat -c` continues it here")


def _tell(line: str) -> None:
    """An error or warning line: on standard error, unless that is not the terminal (``2>log``): the person
    at the prompt is who must read it."""
    if sys.stderr.isatty():
        err(line)
    else:
        out(line)


def _short(ses: str) -> str:
    return ses[:12] if ses.startswith("ses_") else ses


def _greet(chat: Chat) -> None:
    out(f"kxen-agent: {('session ' + chat.ses) if chat.ses else 'a new session'} in {t(chat.workspace)}"
        " — Enter sends, Alt-Enter or \\ at the end adds a line, Esc or Ctrl-C cancels a run, Ctrl-D leaves, /help")
    if chat.ses is not None:
        waiting = _unfinished(chat)
        if waiting:
            out(waiting)


def _unfinished(chat: Chat) -> Optional[str]:
    """A line saying the session's latest run is unfinished and how to go on, or None."""
    from kxen_agent.runtime.run_status import read_run, shown_status
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.status import TERMINAL, RunStatus

    sessions = SessionStore(chat.store)
    info = sessions.get(chat.ses or "")
    if not info.runs:
        return None
    run, st = max(((r, read_run(chat.store, info, r, oid)) for r, oid in info.runs.items()),
                  key=lambda rs: rs[1]["index"])
    if st["status"] in TERMINAL and st.get("settled"):
        return None
    status = shown_status(chat.store, info.id, st)
    if st["status"] == RunStatus.INPUT_REQUIRED:
        # What it waits for and the commands that decide it (run approve / deny, run resolve, session trust).
        waits = f" — {t(st['error'], quote=False)}" if st.get("error") else ""
        return (f"run {run} is {status}{waits}; `kxen-agent run show {info.id}` says what it waits for; "
                "/resume continues it once that is done")
    return f"run {run} is {status}: /resume continues it (a new message waits until it is finished)"


# ====================================================================== a run


def _message(chat: Chat, text: str) -> None:
    """One message: a new run of the session (its first message creates it), driven as `run` drives one."""
    from .run_cmds import check_text

    check_text(text, "the message", hint="shorten it (or put the bulk in a file in the workspace and name it)")
    waiting = _unfinished(chat) if chat.ses is not None else None
    if waiting is not None:
        raise UsageError(waiting)
    _ready(chat)
    if chat.ses is None:
        lock = chat.lock or {}
        _drive(chat, lambda runner: runner.start(chat.workspace, text, lock, model=chat.model))
    else:
        ses = chat.ses
        _drive(chat, lambda runner: runner.resume(ses, task=text, model=chat.model))


def _ready(chat: Chat) -> None:
    """The provider of the session's agent, checked before a run is made (a session opened since the start
    may have another agent than the one checked then)."""
    if chat.ses is None:
        return  # the agent checked at the start
    from kxen_agent.session.sessions import SessionStore

    sessions = SessionStore(chat.store)
    check_provider(sessions.agent(sessions.get(chat.ses)), None, import_sdk=False)


def _continue(chat: Chat) -> None:
    _ready(chat)
    ses = chat.ses or ""
    _drive(chat, lambda runner: runner.resume(ses, model=chat.model))


def _drive(chat: Chat, call: Callable[[Any], Any]) -> None:
    """Run ``call`` with a runner wired as ``run``'s (:func:`.run_cmds.execute`), Esc watched; show how it ended."""
    from kxen_agent.runtime.approvals import TerminalApprover
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    from ._live import _Live, cancel_note
    from ._prompt import KeyWatch
    from .run_cmds import cancellation, configured_locks

    # run --task's live view, on the terminal the prompt is on (standard error may be redirected: `2>log`).
    view = _Live(signal_notes=True, stream=sys.stdout)
    shown = view.note
    # Each message is a run: its start and end are what the prompt's coming back says already.
    view.note = lambda line: None if _ROUTINE.fullmatch(line) else shown(line)  # type: ignore[method-assign]
    runners: list[Any] = []
    escs = [0, 0.0]

    def activity() -> Any:
        return runners[0].activity if runners else None

    with cancellation(view, activity) as cancel:
        def on_esc() -> None:
            # Esc is Ctrl-C's twin: the same event, the same notes (named for the key pressed).
            escs[0] += 1
            if escs[0] == 1:
                escs[1] = time.monotonic()
            cancel.set()
            note = cancel_note("Esc", int(escs[0]), activity(), escs[1])
            if note is not None:
                view.signal_note(note)

        with KeyWatch(sys.stdin.fileno(), on_esc) as keys:
            store = Store.open(namespaces=(NS,))
            runner = Runner(store, cancel=cancel, on_event=view.note, listener=view.event, stream=view.wants_text)
            asker = TerminalApprover(assume_yes=chat.yes, write=lambda text: (sys.stdout.write(text), sys.stdout.flush()))

            def approver(request: Any, cancel_: Any) -> Any:
                with keys.paused():  # the question's reader owns the terminal while it asks
                    return asker(request, cancel_)

            runner.approver = approver
            runner.own_locks = configured_locks()
            runners.append(runner)
            try:
                res = call(runner)
            except KxenError:
                view.finished_line()
                raise
    view.finished(res)
    chat.ses = res.session
    _ended(res)


def _ended(res: Any) -> None:
    """What a run's end adds to what was streamed: nothing when it completed; else its status and what next."""
    from kxen_agent.session.status import RunStatus

    if res.status == RunStatus.COMPLETED:
        if not res.result:
            out(f"(run {res.run} completed after {res.turn} turn(s) with no answer text)")
        return
    line = f"run {res.run}: {t(res.status)} after {res.turn} turn(s)"
    if res.status == RunStatus.CANCELED:
        line += " — the next message starts a new run"
    out(line)
    if res.error:
        out(f"  {'waits' if res.status == RunStatus.INPUT_REQUIRED else 'error'}: {t(res.error, quote=False)}")
    for op in map(t, res.unknown_ops):
        out(f"  UNKNOWN: operation {op} may or may not have taken effect; check the workspace, then "
            f"`kxen-agent run resolve {res.session} {res.run} {op} --output TEXT [--is-error]`, then /resume")
    if res.status == RunStatus.FAILED:
        out(f"  `kxen-agent --resume {res.session} --retry` tries its task again")


# ====================================================================== slash commands


def _slash(chat: Chat, line: str) -> Optional[str]:
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"{line.split()[0]}: {e}; quote arguments as a shell does") from None
    name, args = words[0].lower(), words[1:]
    name = "/quit" if name == "/exit" else name
    if name not in SLASH:
        near = [n for n in SLASH if n.startswith(name)]
        if len(near) == 1:
            name = near[0]
        else:
            raise UsageError(f"no command {name}; /help lists them")
    if name in ("/quit", "/exit"):
        return "quit"
    if name == "/help":
        width = max(len(f"{n} {a[0]}") for n, a in SLASH.items())
        for n, (arg, what, cmd) in SLASH.items():
            out(f"  {(n + ' ' + arg).strip():<{width}}  {what}" + (f"  [{cmd}]" if cmd else ""))
        out("  A message that begins with / is sent with a space before it.")
        out("  Enter sends; Alt-Enter or \\ at the end adds a line; Esc or Ctrl-C cancels a run; Ctrl-D leaves")
        return None
    if name == "/sessions":
        _pick(chat)
        return None
    if name == "/model":
        if not args:
            out(f"model: {chat.model}" if chat.model else "model: the agent's (or what the last run recorded)")
            return None
        _check_model(args[0])
        chat.model = args[0]
        out(f"model {t(args[0])} from the next run on")
        return None
    if name == "/resume":
        if args:
            chat.ses = _sessions(chat).resolve_id(args[0])
            out(f"session {chat.ses}")
        _need_session(chat, name)
        if _unfinished(chat) is None:
            out(f"session {chat.ses}: nothing to resume, its last run is finished; type a message for a new run")
            return None
        _continue(chat)
        return None
    ses = _need_session(chat, name)
    if name == "/show":
        if args:
            from . import run_cmds

            run_cmds.show_cmd(ses=ses, run=args[0], json_out=False, full_diff=False)
        else:
            from . import session_cmds

            session_cmds.show_cmd(ses=ses, json_out=False)
    elif name == "/diff":
        from .checkpoint_cmds import diff_cmd

        opts = _options(name, args, values=("--run", "--op", "--at"), flags=("--stat",))
        # Its text, printed here: no pager between two prompts (the command pages on a terminal).
        sys.stdout.write(_captured(lambda: diff_cmd(ses=ses, run=opts.get("--run"), at=opts.get("--at"),
                                                    op=opts.get("--op"), stat=bool(opts.get("--stat")),
                                                    json_out=False)))
        sys.stdout.flush()
    elif name == "/rewind":
        _rewind(chat, ses, args)
    elif name == "/compact":
        from . import session_cmds

        session_cmds.compact_cmd(ses=ses, at=None, json_out=False)
    elif name == "/fork":
        from . import session_cmds

        said = _captured(lambda: session_cmds.fork_cmd(ses=ses, at=args[0] if args else None, worktree=None, with_code=False,
                                                        workspace=None, json_out=False, name=None))
        lines = said.splitlines()
        for extra in lines[1:2]:
            out(extra)
        chat.ses = lines[0].split()[0]  # the id; a named fork's line goes on with its name
        out(f"now in the fork {chat.ses}; /resume {ses} goes back")
    return None


def _rewind(chat: Chat, ses: str, args: list[str]) -> None:
    """``/rewind MSG``: `session rewind SES --at MSG` (its code, its words); a conversation rewound is a fork,
    and the chat goes on in it."""
    from .rewind_cmds import rewind_cmd

    at = args[0] if args and not args[0].startswith("-") else None
    opts = _options("/rewind", args[1:] if at is not None else args, values=(),
                    flags=("--code", "--conversation", "--force", "--undo"))
    said = _captured(lambda: rewind_cmd(ses=ses, at=at, code=bool(opts.get("--code")),
                                        conversation=bool(opts.get("--conversation")), both=False,
                                        undo=bool(opts.get("--undo")), force=bool(opts.get("--force")), json_out=False))
    fork = re.search(r"^conversation: new session (ses_[0-9a-z]+) ", said, re.M)
    for line in said.splitlines():
        if not line.startswith("continue it with `kxen-agent --resume"):  # here the next message continues it
            out(line)
    if fork is not None:
        chat.ses = fork.group(1)
        out(f"now in {chat.ses}; /resume {ses} goes back")


def _options(name: str, args: list[str], *, values: tuple[str, ...], flags: tuple[str, ...]) -> dict[str, Any]:
    """``--opt VALUE`` and ``--flag`` words of a slash command, as its command's options."""
    got: dict[str, Any] = {}
    words = iter(args)
    for w in words:
        if w in flags:
            got[w] = True
        elif w in values:
            value = next(words, None)
            if value is None:
                raise UsageError(f"{name} {w} needs a value")
            got[w] = value
        else:
            raise UsageError(f"{name} takes {' '.join(f'[{v} X]' for v in values)} {' '.join(f'[{f}]' for f in flags)}"
                             f", not {w!r}")
    return got


def _need_session(chat: Chat, name: str) -> str:
    if chat.ses is None:
        raise UsageError(f"{name} needs a session: type a message first (it creates one), or /sessions to pick one")
    return chat.ses


def _sessions(chat: Chat) -> Any:
    from kxen_agent.session.sessions import SessionStore

    return SessionStore(chat.store)


def _captured(fn: Callable[[], Any]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return buf.getvalue()


def _age(ns: int) -> str:
    s = max(0, time.time() - ns / 1e9)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def _pick(chat: Chat) -> None:
    """``/sessions``: `session list`'s sessions, newest first, numbered; a number switches to one."""
    from prompt_toolkit import prompt

    from . import session_cmds

    doc = json.loads(_captured(lambda: session_cmds.list_cmd(workspace=None, since=None, branch=None, json_out=True)))
    rows = list(reversed(doc["sessions"]))[:20]
    if not rows:
        out(f"no sessions in {t(doc['stateDir'])} yet")
        return
    for n, d in enumerate(rows, 1):
        from ._render import term_text

        mark = "*" if d["id"] == chat.ses else " "
        task = session_cmds._one_line(d["lastTask"], 50) if d.get("lastTask") else "-"
        out(f"{mark}{n:>3}  {term_text(d['id'])}  {term_text(d['status'] or 'no runs'):<12} "
            f"{_age(d['lastActivityNs']):>8}  {term_text(task)}")
    try:
        answer = prompt("open which? (number, Enter: stay) ").strip()
    except (EOFError, KeyboardInterrupt):
        return
    if not answer:
        return
    if not answer.isdigit() or not 1 <= int(answer) <= len(rows):
        raise UsageError(f"{answer!r} is not a number from the list (1-{len(rows)})")
    chat.ses = rows[int(answer) - 1]["id"]
    out(f"session {chat.ses}: {term_text(rows[int(answer) - 1]['workspace']['root'])}")
    waiting = _unfinished(chat)
    if waiting:
        out(waiting)
