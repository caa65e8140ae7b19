"""Workspace identity, workspace binding checks and kxen Git worktrees.

This module owns the answer to "is this the same workspace the session was
bound to?" and the creation/removal of the Git worktrees that forks run in.
It talks to Git only through the ``git`` CLI (never by reading ``.git``), and
it never commits, resets, checks out or otherwise touches the user's files:
the only Git state it changes is a ``kxen/NAME`` branch and its worktree,
both created by :func:`create_worktree` and undone by :func:`remove_worktree`
(or :func:`rollback_worktree` after a failure; :mod:`.worktrees` finds them
again for ``session delete --worktree`` and ``undelete``). A mismatch names
the part of the identity that differs (:func:`identity_difference`).

Workspace identity (v1)
-----------------------
``identity = blake3(b"kxen-ws-v1\\0" + TAG + b"\\0" + KEY + b"\\0" + REL)``
as 64 lowercase hex digits, where REL is the workspace directory relative to
the repository's top level (POSIX separators, ``"."`` at the top level) and
TAG/KEY depend on what the workspace is:

- ``git-remote``: a Git work tree whose ``remote.origin.url`` is set.
  KEY = :func:`normalize_remote_url` of that URL, so clones and copies of
  the same remote share an identity wherever they live, and credentials in
  the URL never matter. ``remote_hash = blake3(b"kxen-remote-v1\\0" + KEY)``.
- ``git-roots``: a Git work tree without ``origin`` but with commits.
  KEY = the root commit ids (``git rev-list --max-parents=0 HEAD``), sorted
  and joined by ``"\\n"``. Copies of the repository keep the identity.
- ``git-unborn``: a Git work tree with no commit yet. KEY = the realpath of
  the repository's top level, so such a workspace cannot be moved: make a
  first commit (or add ``origin``) before relying on portability.
- ``dir``: not inside a Git work tree. KEY = the realpath of the workspace,
  REL = ``"."``; a plain directory can never be rebound to another path.

Text is encoded as UTF-8 (paths with ``surrogateescape``).
Limitations: the identity changes if ``origin`` is re-pointed, if unrelated
histories are merged into a remote-less repository (new root commits), or if
a remote-less repository is a shallow clone (its roots are the shallow
boundary). Local-path remotes are compared as written (``file:`` + path,
symlinks not resolved).
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from kxen_agent.errors import KxenError, UsageError

if TYPE_CHECKING:
    import subprocess

# subprocess, shutil, urllib.parse and blake3 are imported where they are
# used: reading a session's binding (every read command) needs none of them.

__all__ = [
    "InvalidWorkspace",
    "InvalidWorktreeName",
    "WORKTREE_BRANCH_PREFIX",
    "WorkspaceError",
    "WorkspaceIdentity",
    "WorkspaceMismatch",
    "WorkspaceNotFound",
    "branch_exists",
    "check_binding",
    "check_fork_binding",
    "create_worktree",
    "git",
    "git_error_line",
    "git_failed",
    "highest_missing_dir",
    "identity_difference",
    "inspect_workspace",
    "normalize_remote_url",
    "remove_worktree",
    "rollback_worktree",
    "strip_credentials",
    "superproject_top",
    "validate_worktree_name",
    "worktree_location",
    "worktree_path",
]

WORKTREE_BRANCH_PREFIX = "kxen/"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_COMMIT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256 object names
_WORKTREE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git+ssh": 22, "ssh+git": 22, "git": 9418}

class WorkspaceError(KxenError):
    """The workspace could not be inspected, or a worktree could not be made or removed."""


class WorkspaceNotFound(WorkspaceError, UsageError):
    """The workspace path given does not exist or is not a directory."""


class InvalidWorkspace(WorkspaceError, UsageError):
    """The directory given cannot be a workspace (say, it lies outside its repository's work tree)."""


class InvalidWorktreeName(WorkspaceError, UsageError):
    """A worktree name was refused, or the worktree cannot be created where asked."""


class WorkspaceMismatch(WorkspaceError):
    """The current workspace is not the one the session was bound to.

    ``field`` is what differs (``identity``, ``branch``, ``head`` or ``root``);
    ``recorded`` and ``current`` are the two values; ``part`` says which part
    of an identity differs.
    """

    def __init__(self, message: str, *, field: str, recorded: str | None, current: str | None,
                 part: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.recorded = recorded
        self.current = current
        #: For ``field == "identity"``: which part of the identity differs
        #: (``kind``, ``remote``, ``root-commits``, ``subdirectory``, ``path``), see :func:`identity_difference`.
        self.part = part


@dataclass(frozen=True)
class WorkspaceIdentity:
    """What a session records about the directory it works in.

    ``root`` is the realpath of the workspace directory (possibly a
    subdirectory of ``repo_root``); ``identity`` is defined in the module
    docstring; ``branch`` is None when HEAD is detached or outside Git;
    ``head`` is None when there is no commit yet or outside Git.
    """

    root: str
    identity: str
    repo_root: str | None
    remote_hash: str | None
    branch: str | None
    head: str | None

    def to_record(self) -> dict[str, str | None]:
        """The identity as a storable mapping (str keys, str or None values)."""
        return {
            "root": self.root,
            "identity": self.identity,
            "repo_root": self.repo_root,
            "remote_hash": self.remote_hash,
            "branch": self.branch,
            "head": self.head,
        }

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> WorkspaceIdentity:
        """Rebuild from :meth:`to_record` output; a malformed record raises WorkspaceError."""
        if not isinstance(d, Mapping):
            raise WorkspaceError(f"workspace record: expected a map, got {type(d).__name__}; the session object is corrupt")
        expected = ("root", "identity", "repo_root", "remote_hash", "branch", "head")
        unknown = sorted(str(k) for k in d if k not in expected)
        if unknown:
            raise WorkspaceError(
                f"workspace record: unknown key(s) {', '.join(unknown)}; written by a newer kxen-agent? upgrade it"
            )
        values: dict[str, str | None] = {}
        for key in expected:
            if key not in d:
                raise WorkspaceError(f"workspace record: key '{key}' missing; the session object is corrupt")
            value = d[key]
            if value is not None and not isinstance(value, str):
                raise WorkspaceError(
                    f"workspace record: key '{key}' must be a string or null, got {type(value).__name__}; "
                    "the session object is corrupt"
                )
            values[key] = value
        for key in ("root", "identity"):
            if values[key] is None:
                raise WorkspaceError(f"workspace record: key '{key}' is null; the session object is corrupt")
        for key in ("identity", "remote_hash"):
            if values[key] is not None and not _HEX64.fullmatch(values[key] or ""):
                raise WorkspaceError(f"workspace record: key '{key}' is not 64 lowercase hex digits; the session object is corrupt")
        # head reaches git's command line, so it must not be able to look like an option.
        if values["head"] is not None and not _COMMIT_ID.fullmatch(values["head"] or ""):
            raise WorkspaceError("workspace record: key 'head' is not a Git commit id; the session object is corrupt")
        return cls(**values)  # type: ignore[arg-type]


# -- git plumbing ---------------------------------------------------------------------------


def git(cwd: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``git -C cwd ARGS`` through :mod:`.gitproc` (its safe configuration, timeout and process group), text out.

    Inspection must not take ``index.lock`` behind the user's back (``GIT_OPTIONAL_LOCKS=0``), nor wait on
    a prompt (``GIT_TERMINAL_PROMPT=0``: a submodule that needs credentials fails the fork instead).
    """
    import subprocess

    from . import gitproc

    try:
        p = gitproc.run(list(args), chdir=cwd, env={"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"})
    except gitproc.GitTimeout as e:
        raise WorkspaceError(str(e)) from None
    except FileNotFoundError:
        raise WorkspaceError("git executable not found on PATH; install Git to use workspaces") from None
    text = [x.decode("utf-8", "surrogateescape") for x in (p.stdout, p.stderr)]
    return subprocess.CompletedProcess(p.args, p.returncode, text[0], text[1])


def git_error_line(text: str) -> str:
    """The line of git's stderr that says what went wrong.

    Git prints progress first ("Preparing worktree (new branch ...)",
    "Cloning into ...") and then the reason as ``fatal: ...`` or
    ``error: ...``, sometimes followed by consequences ("fatal: clone of
    ... failed" after "fatal: transport 'file' not allowed"): the first
    such line is the cause, else the last line at all.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[-1] if lines else "(no output)"


def git_failed(what: str, proc: subprocess.CompletedProcess[str]) -> WorkspaceError:
    return WorkspaceError(f"{what} failed (git exit {proc.returncode}): {git_error_line(proc.stderr)}")


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _identity(tag: str, key: str, rel: str) -> str:
    import blake3

    return blake3.blake3(b"kxen-ws-v1\0" + _enc(tag) + b"\0" + _enc(key) + b"\0" + _enc(rel)).hexdigest()


def _remote_hash(normalized_url: str) -> str:
    import blake3

    return blake3.blake3(b"kxen-remote-v1\0" + _enc(normalized_url)).hexdigest()


# -- remote URLs ----------------------------------------------------------------------------


def _split_scp(url: str) -> tuple[str, str] | None:
    """``(authority, path)`` of a scp-like ``[user@]host:path`` URL, else None.

    Git's rule (connect.c): a colon before any slash; a bracketed part
    (``[::1]`` or ``[user@host:port]``) may hold colons of its own.
    """
    search_from = 0
    close = url.find("]")
    if url.find("[") != -1 and close != -1 and url.find("[") < close:
        search_from = close
    colon = url.find(":", search_from)
    if colon <= 0:
        return None
    slash = url.find("/")
    if slash != -1 and slash < colon:
        return None
    return url[:colon], url[colon + 1:]


def _scp_host(authority: str) -> str:
    """The lowercased ``host[:port]`` of a scp-like authority, user-info dropped."""
    bracketed = authority.startswith("[") and authority.endswith("]")
    inner = authority[1:-1] if bracketed else authority
    host = inner.rpartition("@")[2].lower()
    if host.startswith("[") and host.endswith("]"):  # user@[::1]
        host = host[1:-1]
    if host.count(":") > 1:  # IPv6 literal: bracketed as in the URL form
        return f"[{host}]"
    name, _, port = host.partition(":")
    return name if port in ("", "22") else host


def _strip_git_suffix(path: str) -> str:
    path = path.rstrip("/")
    if path.endswith(".git"):
        path = path[: -len(".git")].rstrip("/")
    return path


def normalize_remote_url(url: str) -> str:
    """The comparable form of a Git remote URL: ``host[:port]/path``, or ``file:PATH``.

    User-info (``user:token@``), the scheme, default ports, a trailing ``/``
    and a ``.git`` suffix are dropped; scheme and host are lowercased; the
    scp-like ``git@host:org/repo.git`` becomes ``host/org/repo``. Local paths
    and ``file://`` URLs become ``file:`` + the normalized path as written.
    """
    import urllib.parse

    url = url.strip()
    scheme_match = _URL_SCHEME.match(url)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
        parts = urllib.parse.urlsplit(url)
        if scheme == "file":
            return "file:" + posixpath.normpath(urllib.parse.unquote(parts.path) or "/")
        host_port = parts.netloc.rpartition("@")[2]
        host = (parts.hostname or "").lower()
        if not host:
            raise WorkspaceError(f"remote URL {strip_credentials(url)!r} has no host; fix remote.origin.url")
        try:
            port = parts.port
        except ValueError:
            raise WorkspaceError(
                f"remote URL {strip_credentials(url)!r} has an invalid port {host_port!r}; fix remote.origin.url"
            ) from None
        if ":" in host:  # IPv6 literal keeps its brackets so the port stays unambiguous
            host = f"[{host}]"
        if port is not None and port != _DEFAULT_PORTS.get(scheme):
            host = f"{host}:{port}"
        path = _strip_git_suffix(parts.path)
        if path and not path.startswith("/"):
            path = "/" + path
        return host + path
    scp = _split_scp(url)
    if scp is not None:
        authority, path = scp
        host = _scp_host(authority)
        path = _strip_git_suffix(path)
        if path and not path.startswith("/"):
            path = "/" + path
        return host + path
    return "file:" + posixpath.normpath(url) if url else "file:"


def strip_credentials(url: str) -> str:
    """``url`` with any user-info (``user:token@``) removed, for display."""
    url = url.strip()
    scheme_match = _URL_SCHEME.match(url)
    if scheme_match:
        start = scheme_match.end()
        # The authority ends at the first / ? or #, as git's credential parser has it.
        end = len(url)
        for sep in "/?#":
            pos = url.find(sep, start)
            if pos != -1:
                end = min(end, pos)
        authority = url[start:end].rpartition("@")[2]
        return url[:start] + authority + url[end:]
    scp = _split_scp(url)
    if scp is not None:
        authority, path = scp
        if authority.startswith("[") and authority.endswith("]"):
            return "[" + authority[1:-1].rpartition("@")[2] + "]:" + path
        return authority.rpartition("@")[2] + ":" + path
    return url


# -- inspection -----------------------------------------------------------------------------


def inspect_workspace(path: str) -> WorkspaceIdentity:
    """Identify the workspace directory ``path`` (see the module docstring)."""
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.lexists(path) else "is not a directory"
        raise WorkspaceNotFound(f"workspace {path} {what}; pass an existing directory with --workspace")
    root = os.path.realpath(path)
    try:
        root.encode("utf-8")
    except UnicodeEncodeError:
        # The binding is stored as text (§14.7); a path of other bytes cannot be.
        shown = root.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise WorkspaceError(f"workspace {shown} is not a UTF-8 path, which a session cannot record; "
                             "rename the directory (or the parent) whose name is not UTF-8") from None
    top = git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        if "not a git repository" in top.stderr:
            return WorkspaceIdentity(root, _identity("dir", root, "."), None, None, None, None)
        if git(root, "rev-parse", "--git-dir").returncode == 0:
            raise WorkspaceError(
                f"workspace {root} is inside a Git directory or a bare repository, not a work tree; "
                "pass a checked-out directory"
            )
        raise git_failed(f"inspecting workspace {root}: git rev-parse --show-toplevel", top)
    repo_root = os.path.realpath(top.stdout.rstrip("\n"))
    rel = os.path.relpath(root, repo_root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        # core.worktree (or GIT_WORK_TREE in the repository's config) puts
        # the work tree elsewhere: the files git tracks are not under root,
        # so the session's tools would not see them, and a worktree fork
        # could not place the subdirectory.
        raise InvalidWorkspace(
            f"workspace {root} is outside its repository's work tree {repo_root} (core.worktree of its "
            f"repository points there); run in {repo_root} (or a directory in it) instead"
        )
    rel = "." if rel == "." else rel.replace(os.sep, "/")

    head_proc = git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    head = head_proc.stdout.strip() if head_proc.returncode == 0 else None
    branch_proc = git(root, "symbolic-ref", "--short", "-q", "HEAD")
    branch = branch_proc.stdout.strip() if branch_proc.returncode == 0 else None
    if branch_proc.returncode not in (0, 1):
        raise git_failed(f"reading the branch of {root}", branch_proc)

    remote_proc = git(root, "config", "--get", "remote.origin.url")
    if remote_proc.returncode not in (0, 1):
        raise git_failed(f"reading remote.origin.url of {root}", remote_proc)
    remote_url = remote_proc.stdout.strip() if remote_proc.returncode == 0 else ""

    if remote_url:
        key = normalize_remote_url(remote_url)
        return WorkspaceIdentity(root, _identity("git-remote", key, rel), repo_root, _remote_hash(key), branch, head)
    if head is not None:
        roots_proc = git(root, "rev-list", "--max-parents=0", "HEAD")
        if roots_proc.returncode != 0:
            raise git_failed(f"listing the root commits of {root}", roots_proc)
        key = "\n".join(sorted(roots_proc.stdout.split()))
        return WorkspaceIdentity(root, _identity("git-roots", key, rel), repo_root, None, branch, head)
    return WorkspaceIdentity(root, _identity("git-unborn", repo_root, rel), repo_root, None, branch, head)


# -- binding --------------------------------------------------------------------------------


def _kind(ws: WorkspaceIdentity) -> str:
    """The identity's TAG (module docstring), as far as a record tells it."""
    if ws.repo_root is None:
        return "dir"
    if ws.remote_hash is not None:
        return "git-remote"
    return "git-roots" if ws.head is not None else "git-unborn"


def _rel(ws: WorkspaceIdentity) -> str:
    if ws.repo_root is None:
        return "."
    rel = os.path.relpath(ws.root, ws.repo_root)
    return "." if rel == "." else rel.replace(os.sep, "/")


def identity_difference(recorded: WorkspaceIdentity, current: WorkspaceIdentity) -> tuple[str, str]:
    """``(part, words)``: which part of two different identities differs, and how to say it.

    ``part`` is ``kind`` (a Git repository against a plain directory),
    ``remote`` (the origin remote, or that only one has one),
    ``subdirectory`` (same repository, another directory in it),
    ``root-commits`` (remote-less repositories with different histories) or
    ``path`` (a plain directory, or a repository without commits, which are
    identified by their path). Only the record's fields are used, so it
    works for a record read back from a session.
    """
    rk, ck = _kind(recorded), _kind(current)
    if (rk == "dir") != (ck == "dir"):
        what = ("the session's workspace was a plain directory, this one is in a Git repository" if rk == "dir"
                else "this directory is not in a Git repository, the session's workspace was")
        return "kind", what
    if rk == "dir":
        return "path", "a plain directory (not in Git) is identified by its path, and this is another one"
    if recorded.remote_hash and current.remote_hash and recorded.remote_hash != current.remote_hash:
        return "remote", (f"its origin remote differs (remote hash {recorded.remote_hash[:12]} -> "
                          f"{current.remote_hash[:12]})")
    if bool(recorded.remote_hash) != bool(current.remote_hash):
        if recorded.remote_hash:
            return "remote", ("the session's repository has an origin remote and this one has none; "
                              f"add the same origin (git -C {current.repo_root} remote add origin URL)")
        return "remote", ("this repository has an origin remote and the session's had none (a clone of a "
                          "repository without a remote gets its source's path as origin; "
                          f"git -C {current.repo_root} remote remove origin makes it match)")
    if _rel(recorded) != _rel(current):
        return "subdirectory", (f"the subdirectory differs: the session works in '{_rel(recorded)}' of its "
                                f"repository, this is '{_rel(current)}'")
    if "git-unborn" in (rk, ck):
        return "path", ("a repository without commits is identified by its path; commit once (or add an origin "
                        "remote) before moving it")
    if rk == "git-roots":
        return "root-commits", "its root commits differ (not the same history)"
    return "identity", f"its identity differs ({recorded.identity[:12]} -> {current.identity[:12]})"


def check_binding(recorded: WorkspaceIdentity, current: WorkspaceIdentity, *, rebind: bool,
                  session: str | None = None) -> None:
    """Refuse (WorkspaceMismatch) unless ``current`` may continue a session bound to ``recorded``.

    Identity must match (``rebind`` cannot change it); the branch must match
    when one was recorded; the recorded HEAD must be the current HEAD or one
    of its ancestors; a different root is accepted only with ``rebind``.
    ``session`` (its id) goes into the hints, so they name a command to run.
    """
    ses = session or "SES"
    fork_hint = (f"fork the session onto it (kxen-agent session fork {ses} --workspace {current.root})"
                 if session else f"fork the session onto it (session fork --workspace {current.root})")
    if recorded.identity != current.identity:
        part, what = identity_difference(recorded, current)
        raise WorkspaceMismatch(
            f"workspace {current.root} is not the session's workspace {recorded.root}: {what}; "
            "--rebind-workspace cannot change that, run from a checkout of the same repository and subdirectory",
            field="identity", recorded=recorded.identity, current=current.identity, part=part,
        )
    if recorded.branch is not None and current.branch != recorded.branch:
        now = f"branch '{current.branch}'" if current.branch is not None else "a detached HEAD"
        raise WorkspaceMismatch(
            f"workspace {current.root} is on {now} but the session is bound to branch '{recorded.branch}'; "
            f"switch back (git -C {current.root} switch {recorded.branch}) or {fork_hint}",
            field="branch", recorded=recorded.branch, current=current.branch,
        )
    if recorded.head is not None and current.head != recorded.head:
        if current.head is None:
            raise WorkspaceMismatch(
                f"workspace {current.root} has no commits but the session is bound to HEAD {recorded.head}; "
                "fetch or check out that history first",
                field="head", recorded=recorded.head, current=None,
            )
        proc = git(current.root, "merge-base", "--is-ancestor", recorded.head, current.head)
        if proc.returncode == 1:
            raise WorkspaceMismatch(
                f"workspace {current.root}: HEAD {current.head[:12]} does not descend from the session's HEAD "
                f"{recorded.head[:12]} (history rewound or rewritten); check out a descendant of "
                f"{recorded.head[:12]} or {fork_hint}",
                field="head", recorded=recorded.head, current=current.head,
            )
        if proc.returncode != 0:
            raise WorkspaceMismatch(
                f"workspace {current.root}: the session's HEAD {recorded.head[:12]} is unknown to this repository; "
                "fetch it (git fetch) or run from a clone that has it",
                field="head", recorded=recorded.head, current=current.head,
            )
    if recorded.root != current.root and not rebind:
        how = (f"kxen-agent --resume {session} --workspace {current.root} --rebind-workspace" if session
               else f"pass --workspace {current.root} --rebind-workspace")
        raise WorkspaceMismatch(
            f"workspace moved: the session is bound to {recorded.root}, not {current.root}; "
            f"to bind it to the new path: {how}",
            field="root", recorded=recorded.root, current=current.root,
        )


def check_fork_binding(parent: WorkspaceIdentity, current: WorkspaceIdentity) -> None:
    """Refuse (WorkspaceMismatch) binding a fork of a session bound to ``parent`` to ``current``.

    The fork may live on another branch of the same repository (that is
    what it is for: ``git switch -c feature-x``, then fork the session onto
    it), at another HEAD, or in another checkout of it; but the identity
    (repository and subdirectory) must be the parent's, as for a rebind.
    """
    if parent.identity != current.identity:
        part, what = identity_difference(parent, current)
        raise WorkspaceMismatch(
            f"workspace {current.root} is not in the session's repository {parent.repo_root or parent.root}: "
            f"{what}; a fork binds to another branch or checkout of the same repository and subdirectory only",
            field="identity", recorded=parent.identity, current=current.identity, part=part,
        )


# -- worktrees ------------------------------------------------------------------------------


def worktree_path(repo_root: str, name: str) -> str:
    """Where worktree ``name`` lives: ``<dirname(repo_root)>/<basename(repo_root)>.worktrees/<name>``."""
    repo_root = os.path.normpath(repo_root)
    base = os.path.basename(repo_root)
    if not base:
        raise WorkspaceError(f"repository root {repo_root} has no parent directory to hold worktrees")
    return os.path.join(os.path.dirname(repo_root), base + ".worktrees", name)


def validate_worktree_name(name: str) -> None:
    """Refuse (InvalidWorktreeName) a name unfit for a directory and for branch ``kxen/NAME``."""
    rule = "use 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
    if not isinstance(name, str) or not _WORKTREE_NAME.fullmatch(name):
        raise InvalidWorktreeName(f"worktree name {name!r} is invalid; {rule}")
    if ".." in name or name.endswith(".lock") or name.endswith("."):
        raise InvalidWorktreeName(f"worktree name {name!r} is invalid: no '..', no trailing '.' or '.lock'; {rule}")
    proc = git(None, "check-ref-format", "--branch", WORKTREE_BRANCH_PREFIX + name)
    if proc.returncode != 0:
        raise InvalidWorktreeName(f"worktree name {name!r} is not a valid Git branch name component; {rule}")


def branch_exists(repo_root: str, branch: str) -> bool:
    proc = git(repo_root, "rev-parse", "--verify", "-q", "refs/heads/" + branch)
    return proc.returncode == 0


def _registered_worktrees(repo_root: str) -> set[str]:
    proc = git(repo_root, "worktree", "list", "--porcelain")
    if proc.returncode != 0:
        raise git_failed(f"listing the worktrees of {repo_root}", proc)
    return {
        os.path.realpath(line[len("worktree "):])
        for line in proc.stdout.splitlines()
        if line.startswith("worktree ")
    }


def superproject_top(repo_root: str) -> str | None:
    """The work tree of the outermost superproject when ``repo_root`` is a submodule's, else None."""
    top = None
    cur = repo_root
    for _ in range(64):  # submodules nest; a loop here would be a broken repository
        proc = git(cur, "rev-parse", "--show-superproject-working-tree")
        sup = proc.stdout.strip() if proc.returncode == 0 else ""
        if not sup:
            return top
        top = cur = os.path.realpath(sup)
    return top


def worktree_location(repo_root: str, name: str) -> str:
    """Where :func:`create_worktree` puts worktree ``name`` of the repository at ``repo_root``.

    :func:`worktree_path` of the repository, unless it is a submodule: then
    beside the outermost superproject, at the submodule's place in what
    would be that superproject's worktree ``name``
    (``<super>.worktrees/<name>/<path of the submodule>``), so nothing is
    created inside the superproject's work tree (where it would show as
    untracked files).
    """
    top = superproject_top(repo_root)
    if top is None:
        return worktree_path(repo_root, name)
    return os.path.join(worktree_path(top, name), os.path.relpath(repo_root, top))


def highest_missing_dir(path: str) -> str:
    """The highest of ``path`` and its ancestors that does not exist: what creating ``path`` creates."""
    created = path
    while not os.path.lexists(os.path.dirname(created)):
        created = os.path.dirname(created)
    return created


def create_worktree(workspace: WorkspaceIdentity, name: str) -> WorkspaceIdentity:
    """Check out ``workspace.head`` on a new branch ``kxen/NAME`` in :func:`worktree_location`.

    Returns the identity of the new worktree, bound to the same subdirectory
    as ``workspace``. A repository with submodules gets them initialised in
    the worktree (``git submodule update --init --recursive``, with the
    user's Git configuration: a submodule URL Git may not fetch fails the
    fork). On any failure nothing is left behind: no worktree, no branch, no
    directory.
    """
    validate_worktree_name(name)
    if workspace.repo_root is None:
        raise InvalidWorktreeName(f"workspace {workspace.root} is not a Git repository; worktrees need one (git init)")
    if workspace.head is None:
        raise InvalidWorktreeName(f"workspace {workspace.root} has no commits; commit once before creating a worktree")
    repo_root = workspace.repo_root
    branch = WORKTREE_BRANCH_PREFIX + name
    path = worktree_location(repo_root, name)
    if branch_exists(repo_root, branch):
        raise InvalidWorktreeName(
            f"branch {branch} already exists in {repo_root}; choose another worktree name or delete the branch"
        )
    if os.path.lexists(path):
        raise InvalidWorktreeName(f"worktree path {path} already exists; choose another name or remove it")
    # The highest directory this call creates (git creates the leading ones):
    # the rollback removes up to it, and nothing that was there before.
    created = highest_missing_dir(path)
    rel = os.path.relpath(workspace.root, repo_root)
    if rel == ".." or rel.startswith(".." + os.sep) or not _COMMIT_ID.fullmatch(workspace.head):
        raise WorkspaceError(f"workspace record for {workspace.root} is inconsistent (root outside repo_root or bad head); re-inspect it")
    target = path if rel == "." else os.path.join(path, rel)
    try:
        proc = git(repo_root, "worktree", "add", "-b", branch, path, workspace.head)
        if proc.returncode != 0:
            raise git_failed(f"creating worktree {path}: git worktree add", proc)
        if os.path.exists(os.path.join(path, ".gitmodules")):
            proc = git(path, "submodule", "update", "--init", "--recursive")
            if proc.returncode != 0:
                raise WorkspaceError(
                    f"initialising the submodules of worktree {path} failed (git exit {proc.returncode}): "
                    f"{git_error_line(proc.stderr)}; nothing was created — make the submodules' URLs fetchable "
                    "here (a local path needs Git's protocol.file.allow), then retry"
                )
        if not os.path.isdir(target):
            raise WorkspaceError(
                f"workspace subdirectory {rel} is not tracked at {workspace.head[:12]}, so worktree {name} "
                "has no such directory; commit it first"
            )
        return inspect_workspace(target)
    except BaseException:
        # Everything below was created by this call (both checked absent above).
        rollback_worktree(repo_root, path, branch, created)
        raise


def rollback_worktree(repo_root: str, path: str, branch: str, created: str | None = None) -> None:
    """Undo :func:`create_worktree` as far as it got, best effort, never raising a WorkspaceError.

    ``repo_root`` is the repository the worktree was added to (never the
    worktree itself: git cannot remove the worktree it runs in, nor delete
    the branch checked out there); ``path`` the worktree's top directory;
    ``created`` the highest directory the creation made (removed if empty).
    """
    try:
        remove_worktree(repo_root, path, branch)
    except WorkspaceError:
        pass  # the steps below are the fallback; the original error is the one to report
    if os.path.lexists(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        git(repo_root, "worktree", "prune")
    if branch_exists(repo_root, branch):
        git(repo_root, "branch", "-D", branch)
    if created is not None and created != path:
        d = os.path.dirname(path)
        while True:
            try:
                os.rmdir(d)
            except OSError:
                break  # not empty: other worktrees appeared meanwhile, keep it
            if d == created:
                break
            d = os.path.dirname(d)


def remove_worktree(repo_root: str, path: str, branch: str) -> None:
    """Remove worktree ``path`` (even with local changes) and delete ``branch``.

    Undoes :func:`create_worktree`; what is already gone is skipped. Raises
    WorkspaceError naming what could not be removed.
    """
    if os.path.realpath(path) in _registered_worktrees(repo_root):
        proc = git(repo_root, "worktree", "remove", "--force", path)
        if proc.returncode != 0:
            raise git_failed(f"removing worktree {path}", proc)
    git(repo_root, "worktree", "prune")
    if branch_exists(repo_root, branch):
        proc = git(repo_root, "branch", "-D", branch)
        if proc.returncode != 0:
            raise git_failed(f"deleting branch {branch} in {repo_root}", proc)
