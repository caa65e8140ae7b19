"""``[policy] commit_trailer``: a ``Kxen-Session: <ses>@<msg>`` trailer on every commit the shell tool makes.

This module owns the hooks directory that does it (``objects_spec.md``
§14.17) and the environment contract of the ``shell`` tool's child. The
child's Git reads ``core.hooksPath`` from the environment
(``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``, Git 2.31
on), appended after any entry the user's environment has, pointing at
``<state dir>/hooks/<BLAKE3 of its content>/``: one forwarder per hook
name Git knows (githooks(5)), each running the repository's own hook of
that name (its ``core.hooksPath`` as configured, else ``<common git
dir>/hooks``) with the same arguments and standard input, and exiting with
its status. The ``prepare-commit-msg`` forwarder adds the trailer when no
editor will change the message (Git says so with ``GIT_EDITOR=:``; the hook
runs under ``--no-verify`` too), ``commit-msg`` when one did.

It must never write to a repository (its config above all: the override
lives only in the child's environment), never disable a hook of the
repository, and never change what a commit of the user's own (outside the
agent's shell) looks like. The directory is named by its content, so two
kxen-agent versions never overwrite each other's, and a process that finds
it made checks its bytes before use.

Limitations (also in docs/configuration.md): MCP servers run in their own
process with their own environment, so commits they make carry no trailer
(``session which`` still finds them from the checkpoints); ``git -c
core.hooksPath=...`` or ``GIT_CONFIG_PARAMETERS`` naming it win over the
environment entry (that commit runs the hooks it names, without the
trailer); a commit whose message is edited in an editor *and* made with
``--no-verify`` gets none (commit-msg does not run); ``git am``, ``rebase
--apply``, ``stash``, ``notes`` and ``commit-tree`` run no
``prepare-commit-msg`` and get none.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import blake3

from kxen_agent.errors import KxenError
from kxen_agent.session.sessions import msg_id
from kxen_agent.store.fsio import OS_IO, FileIO

__all__ = [
    "HOOKS_DIR",
    "HOOK_NAMES",
    "MESSAGE_ENV",
    "SESSION_ENV",
    "TRAILER_KEY",
    "CommitTrailer",
    "HooksDirDamaged",
    "commit_trailer_for",
    "ensure_hooks_dir",
    "hooks_digest",
]

#: The state dir's top-level directory holding the hooks directories (§1.3).
HOOKS_DIR = "hooks"
#: The trailer's key: ``Kxen-Session: <ses>@<msg>``.
TRAILER_KEY = "Kxen-Session"
#: The variables that name the session and the assistant message in the shell tool's child.
SESSION_ENV = "KXEN_SESSION"
MESSAGE_ENV = "KXEN_MESSAGE"

#: Every hook name of githooks(5) (Git 2.39): a repository's hook of any of them still runs.
HOOK_NAMES = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
    "pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update",
    "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
    "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit",
    "post-index-change",
)

# The forwarder, the same bytes under every hook name (it reads its name from $0). POSIX sh: a hook
# costs one sh and one `git rev-parse` more than the repository's own (docs/configuration.md gives
# the figures). Comments here say why; the spec (§14.17) says what.
_FORWARDER = br"""#!/bin/sh
# kxen-agent [policy] commit_trailer: runs the repository's own hook of this name (objects_spec.md
# section 14.17); prepare-commit-msg and commit-msg add the Kxen-Session trailer.
hook=${0##*/}
here=${0%/*}
# Our core.hooksPath entry leaves the Git config environment first (the last one naming this
# directory; later entries move down), so that the repository's hooks directory reads as configured
# and its hook, and every git it runs, sees the user's environment.
n=${GIT_CONFIG_COUNT:-0}
i=$n
while [ "$i" -gt 0 ]; do
	i=$((i - 1))
	eval "k=\${GIT_CONFIG_KEY_$i-} v=\${GIT_CONFIG_VALUE_$i-}"
	if [ "$k" = core.hooksPath ] && { [ "$v" = "$here" ] || [ "$v" -ef "$here" ]; }; then
		j=$i
		while [ $((j + 1)) -lt "$n" ]; do
			eval "GIT_CONFIG_KEY_$j=\$GIT_CONFIG_KEY_$((j + 1)) GIT_CONFIG_VALUE_$j=\$GIT_CONFIG_VALUE_$((j + 1))"
			j=$((j + 1))
		done
		unset "GIT_CONFIG_KEY_$j" "GIT_CONFIG_VALUE_$j"
		n=$((n - 1))
		if [ "$n" -eq 0 ]; then unset GIT_CONFIG_COUNT; else export GIT_CONFIG_COUNT="$n"; fi
		break
	fi
done
# core.hooksPath as configured (a relative one is relative to where hooks run, here), else the
# common git dir's hooks/ (a linked worktree shares its main one's).
dir=$(git rev-parse --git-path hooks) || {
	echo "kxen-agent: $hook: cannot find the repository's hooks directory (git rev-parse failed)" >&2
	exit 1
}
own="$dir/$hook"
if [ "$dir" -ef "$here" ] || ! [ -f "$own" ] || ! [ -x "$own" ]; then own=; fi
trailer() {
	# A message Git will keep empty stays so (Git refuses the commit). After an editor, what
	# follows a scissors line is not the message (`git commit -v`'s diff).
	if [ "${GIT_EDITOR-}" = : ]; then
		[ -n "$(git stripspace --strip-comments <"$1")" ] || return 0
	else
		[ -n "$(sed '/^. -\{24\} >8 -\{24\}$/,$d' "$1" | git stripspace --strip-comments)" ] || return 0
	fi
	# A last line without its newline (a merge's message) would take the trailer into its paragraph.
	last=
	while IFS= read -r last; do :; done <"$1"
	[ -z "$last" ] || echo >>"$1"
	git interpret-trailers --in-place --where end --if-exists addIfDifferent --if-missing add \
		--trailer "Kxen-Session: $KXEN_SESSION@$KXEN_MESSAGE" "$1" && return
	echo "kxen-agent: cannot add the Kxen-Session trailer to $1 (git interpret-trailers failed)" >&2
	return 1
}
[ -n "${KXEN_SESSION-}" ] && [ -n "${KXEN_MESSAGE-}" ] || KXEN_SESSION=
# GIT_EDITOR=: says no editor will change the message: it is final in prepare-commit-msg, which runs
# under --no-verify too. With an editor, commit-msg adds the trailer to what the editor left.
case $hook in
prepare-commit-msg)
	# The repository's hook first: it sees the message Git made, and cannot drop the trailer.
	if [ -n "$own" ]; then "$own" "$@" || exit; fi
	if [ -n "$KXEN_SESSION" ] && [ "${GIT_EDITOR-}" = : ]; then trailer "$1" || exit; fi
	exit 0 ;;
commit-msg)
	if [ -n "$KXEN_SESSION" ] && [ "${GIT_EDITOR-}" != : ]; then trailer "$1" || exit; fi ;;
esac
if [ -n "$own" ]; then exec "$own" "$@"; fi
case $hook in
pre-push | pre-receive | post-receive | reference-transaction | post-rewrite)
	# Git writes to these hooks' input: read it all, as a hook that is not there never stops a write.
	while IFS= read -r _; do :; done ;;
push-to-checkout)
	# Git updates the work tree itself (receive.denyCurrentBranch=updateInstead) only when there is
	# no such hook; this one is there, so it does what Git does.
	git update-index -q --ignore-submodules --refresh || { echo "Up-to-date check failed" >&2; exit 1; }
	git diff-files --quiet --ignore-submodules -- || { echo "Working directory has unstaged changes" >&2; exit 1; }
	head=HEAD
	git rev-parse -q --verify HEAD >/dev/null || head=$(git hash-object -t tree /dev/null)
	git diff-index --quiet --cached --ignore-submodules "$head" -- ||
		{ echo "Working directory has staged changes" >&2; exit 1; }
	git read-tree -u -m "$1" || { echo "Could not update working tree to new HEAD" >&2; exit 1; } ;;
esac
exit 0
"""


class HooksDirDamaged(KxenError):
    """A hooks directory named by its content (§14.17) holds something else: a file changed or missing."""

    def __init__(self, path: str, name: str) -> None:
        super().__init__(f"{path}: the commit-trailer hooks directory does not hold what its name says "
                         f"({name!r} differs); remove that directory and run again (kxen-agent writes it anew)")
        self.path = path
        self.name = name


def _files() -> list[tuple[str, bytes]]:
    return [(name, _FORWARDER) for name in sorted(HOOK_NAMES)]


@functools.cache
def _digest() -> str:
    return hooks_digest(_files())


def hooks_digest(files: list[tuple[str, bytes]] | None = None) -> str:
    """The hooks directory's name: the BLAKE3 (hex) of, for each file in byte order of its name, the
    name, a 0x00 byte, the file's size in decimal ASCII, a 0x00 byte and its bytes (§14.17)."""
    h = blake3.blake3()
    for name, data in files if files is not None else _files():
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


# Directories whose bytes this process wrote or checked: a later call only looks that every hook is still there.
_READY: set[str] = set()


def _exec_mode(io: FileIO, path: str) -> int:
    return 0o770 if io.is_shared(path) else 0o700  # §10.4's modes, with the execute bits hooks need


def _check(io: FileIO, final: str, files: list[tuple[str, bytes]]) -> None:
    for name, data in files:
        path = os.path.join(final, name)
        try:
            ok = io.read(path) == data and os.access(path, os.X_OK)
        except OSError:
            ok = False
        if not ok:
            raise HooksDirDamaged(final, name)


def ensure_hooks_dir(root: str, io: FileIO = OS_IO) -> str:
    """The hooks directory of the state dir at ``root``, written durably if missing (§14.17, §9.1:
    each file fsynced, the directory renamed into place, its parent fsynced); an existing one's
    bytes are checked once per process (:class:`HooksDirDamaged`), its files' presence on every call."""
    files = _files()
    top = os.path.join(root, HOOKS_DIR)
    final = os.path.join(top, _digest())
    if final in _READY:
        # Removed since (by hand, in a long chat)? A hooksPath without its hooks would run none of the
        # repository's: written again below.
        if all(os.access(os.path.join(final, name), os.X_OK) for name, _ in files):
            return final
        _READY.discard(final)
    if not io.isdir(final):
        io.makedirs(top)
        tmp = os.path.join(top, f"tmp_{os.urandom(8).hex()}")
        io.mkdir(tmp)
        try:
            for name, data in files:
                path = io.write_tmp(tmp, data, sync=False)
                io.chmod(path, _exec_mode(io, path))
                io.fsync_path(path)  # the bytes and the mode
                io.rename(path, os.path.join(tmp, name))
            io.fsync_dir(tmp)
            try:
                io.rename(tmp, final)
            except OSError as e:
                # Another process put the same bytes there first (a rename onto a non-empty directory fails).
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not io.isdir(final):
                    raise
            else:
                io.fsync_dir(top)
        finally:
            _remove_tmp(io, tmp)
    _check(io, final, files)
    _READY.add(final)
    return final


def _remove_tmp(io: FileIO, tmp: str) -> None:
    """Best effort: what a failed or lost write left in its temp directory (after a rename, nothing)."""
    try:
        names = io.listdir(tmp)
    except OSError:
        return
    for name in names:
        try:
            io.unlink(os.path.join(tmp, name))
        except OSError:
            return
    try:
        os.rmdir(tmp)
    except OSError:
        pass


@dataclass(frozen=True)
class CommitTrailer:
    """What the shell tool's child gets so that its commits carry ``Kxen-Session: <session>@<message>``."""

    hooks_dir: str
    session: str
    message: str

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with ``core.hooksPath`` appended to its Git config entries, and the two ids.

        A ``GIT_CONFIG_COUNT`` that is not a count is left alone (every git would refuse it anyway):
        the child then runs without the override, so without the trailer.
        """
        out = dict(env)
        out[SESSION_ENV] = self.session
        out[MESSAGE_ENV] = self.message
        count = out.get("GIT_CONFIG_COUNT", "0") or "0"
        if not (count.isascii() and count.isdigit()):
            return out
        n = int(count)
        out[f"GIT_CONFIG_KEY_{n}"] = "core.hooksPath"
        out[f"GIT_CONFIG_VALUE_{n}"] = self.hooks_dir
        out["GIT_CONFIG_COUNT"] = str(n + 1)
        return out


def commit_trailer_for(store: Any, policy: Mapping[str, Any], tool: str, session: str,
                       message: bytes) -> CommitTrailer | None:
    """The trailer for a call of ``tool`` asked for by the assistant message ``message`` (an object id),
    when the lock's ``policy.commit_trailer`` is on and the tool is ``shell``; else None."""
    root = getattr(store, "root", None)
    if tool != "shell" or not policy.get("commit_trailer", False) or not isinstance(root, str):
        return None
    io = getattr(store, "io", OS_IO)
    return CommitTrailer(ensure_hooks_dir(root, io), session, msg_id(message))
