"""The one door to the ``git`` executable: what every ``git`` process of kxen-agent is told and how it is run.

A workspace's Git configuration is not this machine's word: an agent's
``shell`` tool, a checked-out script or whoever prepared the repository may
have written ``.git/config``. Git runs commands that configuration names
(``core.fsmonitor``, hooks, ``ext::`` URLs, filters, credential helpers,
``core.sshCommand``...), so every ``git`` process kxen-agent starts gets,
whatever the repository says:

- :data:`SAFE_CONFIG` on its command line (``-c`` wins over every file):
  no fsmonitor, no hooks, no ``ext::`` transport, no editor, pager or
  signing program, no automatic gc or maintenance;
- for the commands that can run filters, fetch or prompt
  (:data:`CONFIG_RUNNERS`: ``worktree``, ``submodule``, ``status``...),
  the command-running keys the *repository's own* files set
  (:func:`repository_overrides`: filters, credential helpers,
  ``core.sshCommand``, ``core.askPass``, ``submodule.*.update = !cmd``...)
  replaced by the user's global/system values, or made inert where the user
  sets none — so Git LFS, installed in the global config, keeps working;
- an environment without the variables that would point ``git`` at another
  repository, and a fixed locale (so its messages can be read).

Every process runs with a timeout (:data:`LOCAL_TIMEOUT_S`,
:func:`remote_timeout_s` for commands that talk to a remote); on a timeout,
an exception (Ctrl-C) or SIGTERM (see :func:`terminable`) it is killed with
every process it started (:func:`kill_tree`) and reaped before the error
goes on, so ``git`` and its helpers (``ssh``, ``git-remote-http``,
``pack-objects``, a local ``receive-pack``) never outlive the command that
started them. It stays in kxen-agent's process group, so that whatever
kills that group (a supervisor, Ctrl-C on the terminal) kills it too: in a
group of its own, a push would go on after its kxen-agent was killed with
its group, and ``ssh`` could not ask for a passphrase.

It must never decide what a ``git`` command means (``workspace``,
``gitio`` do); it only starts, bounds and ends them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence

from kxen_agent.errors import KxenError

__all__ = [
    "CONFIG_RUNNERS",
    "GitTimeout",
    "LOCAL_TIMEOUT_S",
    "REMOTE_TIMEOUT_ENV",
    "SAFE_CONFIG",
    "Terminated",
    "git_argv",
    "git_env",
    "kill_tree",
    "remote_timeout_s",
    "repository_overrides",
    "run",
    "spawn",
    "terminable",
]

#: Given to every git process: settings that would make git run a program the
#: repository names, or act on its own, turned off (``git help config``).
SAFE_CONFIG: tuple[str, ...] = (
    "core.fsmonitor=false",          # a path here is a program run by every status/add/checkout
    "core.hooksPath=/dev/null",      # hooks: post-checkout, reference-transaction, pre-push...
    "protocol.ext.allow=never",      # ext::CMD URLs run CMD
    "core.editor=false", "sequence.editor=false",
    "core.pager=cat",
    "commit.gpgSign=false", "tag.gpgSign=false", "push.gpgSign=false",
    "log.showSignature=false", "merge.verifySignatures=false",
    "gc.auto=0", "maintenance.auto=false",
)
#: Subcommands that may run a filter (checkout, status's clean filter), fetch
#: (submodules) or ask for credentials: they also get :func:`repository_overrides`.
# Plumbing that writes or refreshes an index re-hashes "racily clean" entries through the clean filter, so it
# is listed too (a checkpoint's write-tree was caught running a repository's filter).
CONFIG_RUNNERS = frozenset({"worktree", "submodule", "status", "checkout", "switch", "reset", "fetch", "clone",
                            "pull", "push", "ls-remote", "add", "stash", "diff", "write-tree", "ls-files",
                            "update-index", "read-tree", "checkout-index", "diff-files", "diff-index"})
#: A git command that does not talk to a remote is given this long (seconds).
LOCAL_TIMEOUT_S = 300.0
#: The environment variable that sets how long a command talking to a remote may take (seconds; default 900).
REMOTE_TIMEOUT_ENV = "KXEN_AGENT_GIT_TIMEOUT_S"
_REMOTE_TIMEOUT_DEFAULT_S = 900.0

# Variables that point git at another repository than the one we name (git
# clears the same set when it switches repositories), or that carry -c config.
_GIT_LOCAL_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_CONFIG", "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS", "GIT_DIR", "GIT_GRAFT_FILE", "GIT_IMPLICIT_WORK_TREE", "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS", "GIT_OBJECT_DIRECTORY", "GIT_PREFIX", "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE", "GIT_WORK_TREE", "GIT_QUARANTINE_PATH",
)

# Keys (as `git config -l` prints them: section and name lowercased) whose
# value is a command git may run. The multi-valued ones are reset and refilled.
_COMMAND_KEY = re.compile(
    r"(core\.(sshcommand|askpass|gitproxy|pager|editor|alternaterefscommand)"
    r"|credential\.(.+\.)?helper"
    r"|filter\..+\.(clean|smudge|process)"
    r"|submodule\..+\.update"
    r"|diff\..+\.(command|textconv)|diff\.external|merge\..+\.driver"
    r"|gpg\.(.+\.)?program"
    r"|remote\..+\.(uploadpack|receivepack|vcs)"
    r"|pager\..+|sequence\.editor)", re.DOTALL)
_MULTI = re.compile(r"credential\.(.+\.)?helper", re.DOTALL)
_TRUSTED_SCOPES = ("system", "global")


class GitTimeout(KxenError):
    """A git process ran past its timeout and was killed (with every process it started)."""


class Terminated(KxenError):
    """SIGTERM arrived while git commands ran; they were stopped and their scratch files removed."""

    exit_code = 143


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git process: ours without repository-redirecting variables, locale C."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCAL_ENV}
    env["LC_ALL"] = "C"
    env.pop("LANGUAGE", None)
    env["GIT_PAGER"] = "cat"
    if extra:
        env.update(extra)
    return env


def git_argv(args: Sequence[str], *, git_dir: str | None = None, cwd_flag: str | None = None,
             config: Sequence[str] = ()) -> list[str]:
    """``git [-C D] [--git-dir=G] -c SAFE... -c CONFIG... ARGS``."""
    cmd = ["git"]
    if cwd_flag is not None:
        cmd += ["-C", cwd_flag]
    if git_dir is not None:
        cmd.append(f"--git-dir={git_dir}")
    for c in (*SAFE_CONFIG, *config):
        cmd += ["-c", c]
    return cmd + list(args)


def remote_timeout_s() -> float:
    """How long a command talking to a remote may take (:data:`REMOTE_TIMEOUT_ENV`, default 900 s)."""
    raw = os.environ.get(REMOTE_TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else _REMOTE_TIMEOUT_DEFAULT_S
    except ValueError:
        value = _REMOTE_TIMEOUT_DEFAULT_S
    return value if value > 0 else _REMOTE_TIMEOUT_DEFAULT_S


# ---------------------------------------------------------------- the repository's own command keys


def repository_overrides(cwd: str | None = None, *, git_dir: str | None = None,
                         chdir: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``(-c values, environment)`` undoing the command-running keys the repository's own files set.

    A key set by the repository (scope ``local`` or ``worktree``, includes
    of those files too) gets the last value the user's global/system
    configuration gives it, else an inert one (an empty filter that is not
    required, ``ssh``, no askpass...). Keys only the user sets are left alone.
    """
    p = _communicate(git_argv(["config", "--show-scope", "--null", "--list"], git_dir=git_dir, cwd_flag=chdir),
                     cwd=cwd, input=None, env=git_env(), timeout=LOCAL_TIMEOUT_S)
    if p.returncode != 0:
        return [], {}
    trusted: dict[str, list[str]] = {}
    untrusted: list[str] = []
    # --show-scope --null prints "scope\0key\nvalue\0" per entry ("key" alone for a bare boolean).
    it = iter(p.stdout.split(b"\0"))
    for scope_b in it:
        entry_b = next(it, None)
        if entry_b is None:
            break
        scope = scope_b.decode("utf-8", "surrogateescape")
        key_b, _, value_b = entry_b.partition(b"\n")
        key = key_b.decode("utf-8", "surrogateescape")
        if not _COMMAND_KEY.fullmatch(key):
            continue
        value = value_b.decode("utf-8", "surrogateescape")
        if scope in _TRUSTED_SCOPES:
            trusted.setdefault(key, []).append(value)
        elif scope in ("local", "worktree") and key not in untrusted:  # "command": our own -c
            untrusted.append(key)
    config: list[str] = []
    env: dict[str, str] = {}
    for key in untrusted:
        good = trusted.get(key, [])
        if _MULTI.fullmatch(key):
            config += [f"{key}\0", *(f"{key}\0{v}" for v in good if v)]
        elif key == "core.gitproxy":
            # First match wins, so a -c cannot override it; the variable can.
            env["GIT_PROXY_COMMAND"] = good[-1] if good else ""
        elif good:
            config.append(f"{key}\0{good[-1]}")
        elif key.startswith("filter."):
            config += [f"{key}\0", f"{key.rsplit('.', 1)[0]}.required\0false"]
        elif key.startswith("submodule."):
            config.append(f"{key}\0checkout")
        elif key == "core.sshcommand":
            config.append(f"{key}\0ssh")
        elif key.startswith("remote.") and not key.endswith(".vcs"):
            config.append(f"{key}\0git-{key.rsplit('.', 1)[1].replace('pack', '-pack')}")
        elif key in ("core.pager",) or key.startswith("pager."):
            config.append(f"{key}\0cat")
        elif key in ("core.editor", "sequence.editor"):
            config.append(f"{key}\0false")
        else:
            # askpass, diff drivers, merge drivers, gpg programs, vcs helpers: empty is "none".
            config.append(f"{key}\0")
    return _via_env_if_needed(config, env)


def _via_env_if_needed(config: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Move entries whose key holds ``=`` (a URL in ``credential.<url>.helper``), which ``-c`` would split
    wrongly, to ``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n``, which Git reads as command-line configuration too."""
    keyed = [(c.partition("\0")[0], c.partition("\0")[2]) for c in config]
    plain = [f"{k}={v}" for k, v in keyed if "=" not in k]
    odd = [(k, v) for k, v in keyed if "=" in k]
    if odd:
        env = dict(env)
        env["GIT_CONFIG_COUNT"] = str(len(odd))
        for i, (k, v) in enumerate(odd):
            env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = k, v
    return plain, env


# ---------------------------------------------------------------- processes


def _children_of() -> dict[int, list[int]]:
    """Every live process's children, from ``/proc`` (empty where there is none)."""
    out: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children_of(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process it started (``ssh``, ``pack-objects``, a local ``receive-pack``), then reap it.

    Each is stopped first, so none can start another while the tree is
    read; a tree read from ``/proc`` (Linux), else ``proc`` alone.
    """
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGSTOP)
        stopped: list[int] = []
        for _ in range(8):  # a child forked just before its parent stopped: look again
            fresh = [p for p in _descendants(proc.pid) if p not in stopped]
            if not fresh:
                break
            for p in fresh:
                _signal(p, signal.SIGSTOP)
            stopped += fresh
        for p in [proc.pid, *stopped]:
            _signal(p, signal.SIGKILL)
    proc.wait()


def spawn(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str], stdin: int | None,
          stdout: int | None = subprocess.PIPE, stderr: int | None = subprocess.PIPE) -> subprocess.Popen:
    """Start ``argv`` in our process group (ended with its children by :func:`kill_tree`).

    Not a group of its own: whatever ends kxen-agent's group (Ctrl-C on the
    terminal, a supervisor's kill of the group) ends its ``git`` with it,
    and ``ssh`` can still ask for a passphrase on the terminal.
    """
    return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr)


def _communicate(argv: Sequence[str], *, cwd: str | None, input: bytes | None, env: Mapping[str, str],
                 timeout: float) -> subprocess.CompletedProcess[bytes]:
    proc = spawn(argv, cwd=cwd, env=env, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise GitTimeout(f"git {_subcommand(argv)} did not finish within {timeout:g} s and was stopped; "
                         "check the network and the remote (a remote command's limit is "
                         f"{REMOTE_TIMEOUT_ENV} seconds, default {_REMOTE_TIMEOUT_DEFAULT_S:g})") from None
    except BaseException:
        kill_tree(proc)  # Ctrl-C, SIGTERM (terminable): git and what it started end with us
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _subcommand(argv: Sequence[str]) -> str:
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-c", "-C"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a
    return "?"


def run(args: Sequence[str], *, cwd: str | None = None, chdir: str | None = None, git_dir: str | None = None,
        input: bytes | None = None, timeout: float | None = None, remote: bool = False, config: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        overrides: tuple[Sequence[str], Mapping[str, str]] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``git [-C chdir] ARGS`` in ``cwd`` (bytes out), bounded, killed with its children when it must end.

    ``remote``: it talks to a remote (timeout :func:`remote_timeout_s`);
    ``timeout`` overrides either default. A subcommand of
    :data:`CONFIG_RUNNERS` also gets :func:`repository_overrides`, or
    ``overrides`` when the caller computed them for this repository just
    before (a checkpoint's commands in a row: one ``git config`` for all).
    Raises :class:`GitTimeout` when the timeout passes.
    """
    limit = timeout if timeout is not None else (remote_timeout_s() if remote else LOCAL_TIMEOUT_S)
    extra_config = list(config)
    extra_env = dict(env or {})
    if args and args[0] in CONFIG_RUNNERS:
        c, e = overrides if overrides is not None else repository_overrides(cwd, git_dir=git_dir, chdir=chdir)
        extra_config = [*c, *extra_config]
        extra_env = {**e, **extra_env}
    argv = git_argv(args, git_dir=git_dir, cwd_flag=chdir, config=extra_config)
    return _communicate(argv, cwd=cwd, input=input, env=git_env(extra_env), timeout=limit)


# ---------------------------------------------------------------- SIGTERM


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated("terminated (SIGTERM): git was stopped and its scratch repository removed; run the "
                     "command again (a push the remote got but this state dir did not record asks for a pull first)")


@contextlib.contextmanager
def terminable() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Terminated` in the main thread, so ``finally`` blocks run.

    Only where SIGTERM has its default action (it would kill the process
    with nothing cleaned up); a program that handles SIGTERM itself (a run
    under :func:`~kxen_agent.runtime.cancel.cancel_on_signals`) keeps its
    handler. Nests; outside the main thread it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        current = signal.getsignal(signal.SIGTERM)
    except ValueError:
        yield
        return
    if current is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        # Unless someone installed a handler of their own meanwhile (a run's cancellation).
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
