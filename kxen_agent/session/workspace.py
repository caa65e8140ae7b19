"""Workspace identity, workspace binding checks and kxen Git worktrees.

This module owns the answer to "is this the same workspace the session was
bound to?" and the creation/removal of the Git worktrees that forks run in.
It talks to Git only through the ``git`` CLI (never by reading ``.git``), and
it never commits, resets, checks out or otherwise touches the user's files:
the only Git state it changes is a ``kxen/NAME`` branch and its worktree,
both created by :func:`create_worktree` and undone by :func:`remove_worktree`.

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
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping

import blake3

from kxen_agent.errors import KxenError, UsageError

__all__ = [
    "InvalidWorktreeName",
    "WorkspaceError",
    "WorkspaceIdentity",
    "WorkspaceMismatch",
    "WorkspaceNotFound",
    "check_binding",
    "create_worktree",
    "inspect_workspace",
    "normalize_remote_url",
    "remove_worktree",
    "strip_credentials",
    "validate_worktree_name",
    "worktree_path",
]

WORKTREE_BRANCH_PREFIX = "kxen/"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_COMMIT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256 object names
_WORKTREE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git+ssh": 22, "ssh+git": 22, "git": 9418}

# Variables git exports to hooks and aliases that would point our commands at
# some other repository than the one we pass with -C (git clears the same set
# when it switches repositories); the locale is pinned so stderr is parseable.
_GIT_LOCAL_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_CONFIG",
    "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS", "GIT_DIR", "GIT_GRAFT_FILE",
    "GIT_IMPLICIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS",
    "GIT_OBJECT_DIRECTORY", "GIT_PREFIX", "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE", "GIT_WORK_TREE",
)


class WorkspaceError(KxenError):
    """The workspace could not be inspected, or a worktree could not be made or removed."""


class WorkspaceNotFound(WorkspaceError, UsageError):
    """The workspace path given does not exist or is not a directory."""


class InvalidWorktreeName(WorkspaceError, UsageError):
    """A worktree name was refused, or the worktree cannot be created where asked."""


class WorkspaceMismatch(WorkspaceError):
    """The current workspace is not the one the session was bound to.

    ``field`` is what differs (``identity``, ``branch``, ``head`` or ``root``);
    ``recorded`` and ``current`` are the two values.
    """

    def __init__(self, message: str, *, field: str, recorded: str | None, current: str | None) -> None:
        super().__init__(message)
        self.field = field
        self.recorded = recorded
        self.current = current


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


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCAL_ENV}
    env["LC_ALL"] = "C"
    env.pop("LANGUAGE", None)
    env["GIT_TERMINAL_PROMPT"] = "0"
    # Inspection must not take index.lock behind the user's back.
    env["GIT_OPTIONAL_LOCKS"] = "0"
    return env


def _git(cwd: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["git"] + (["-C", cwd] if cwd is not None else []) + list(args)
    try:
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
            env=_git_env(),
            check=False,
        )
    except FileNotFoundError:
        raise WorkspaceError("git executable not found on PATH; install Git to use workspaces") from None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "(no output)"


def _git_failed(what: str, proc: subprocess.CompletedProcess[str]) -> WorkspaceError:
    return WorkspaceError(f"{what} failed (git exit {proc.returncode}): {_first_line(proc.stderr)}")


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _identity(tag: str, key: str, rel: str) -> str:
    return blake3.blake3(b"kxen-ws-v1\0" + _enc(tag) + b"\0" + _enc(key) + b"\0" + _enc(rel)).hexdigest()


def _remote_hash(normalized_url: str) -> str:
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
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        if "not a git repository" in top.stderr:
            return WorkspaceIdentity(root, _identity("dir", root, "."), None, None, None, None)
        if _git(root, "rev-parse", "--git-dir").returncode == 0:
            raise WorkspaceError(
                f"workspace {root} is inside a Git directory or a bare repository, not a work tree; "
                "pass a checked-out directory"
            )
        raise _git_failed(f"inspecting workspace {root}: git rev-parse --show-toplevel", top)
    repo_root = os.path.realpath(top.stdout.rstrip("\n"))
    rel = os.path.relpath(root, repo_root)
    rel = "." if rel == "." else rel.replace(os.sep, "/")

    head_proc = _git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    head = head_proc.stdout.strip() if head_proc.returncode == 0 else None
    branch_proc = _git(root, "symbolic-ref", "--short", "-q", "HEAD")
    branch = branch_proc.stdout.strip() if branch_proc.returncode == 0 else None
    if branch_proc.returncode not in (0, 1):
        raise _git_failed(f"reading the branch of {root}", branch_proc)

    remote_proc = _git(root, "config", "--get", "remote.origin.url")
    if remote_proc.returncode not in (0, 1):
        raise _git_failed(f"reading remote.origin.url of {root}", remote_proc)
    remote_url = remote_proc.stdout.strip() if remote_proc.returncode == 0 else ""

    if remote_url:
        key = normalize_remote_url(remote_url)
        return WorkspaceIdentity(root, _identity("git-remote", key, rel), repo_root, _remote_hash(key), branch, head)
    if head is not None:
        roots_proc = _git(root, "rev-list", "--max-parents=0", "HEAD")
        if roots_proc.returncode != 0:
            raise _git_failed(f"listing the root commits of {root}", roots_proc)
        key = "\n".join(sorted(roots_proc.stdout.split()))
        return WorkspaceIdentity(root, _identity("git-roots", key, rel), repo_root, None, branch, head)
    return WorkspaceIdentity(root, _identity("git-unborn", repo_root, rel), repo_root, None, branch, head)


# -- binding --------------------------------------------------------------------------------


def check_binding(recorded: WorkspaceIdentity, current: WorkspaceIdentity, *, rebind: bool) -> None:
    """Refuse (WorkspaceMismatch) unless ``current`` may continue a session bound to ``recorded``.

    Identity must match (``rebind`` cannot change it); the branch must match
    when one was recorded; the recorded HEAD must be the current HEAD or one
    of its ancestors; a different root is accepted only with ``rebind``.
    """
    if recorded.identity != current.identity:
        if recorded.remote_hash and current.remote_hash and recorded.remote_hash != current.remote_hash:
            what = f"its origin remote differs (remote hash {recorded.remote_hash[:12]} -> {current.remote_hash[:12]})"
        else:
            what = f"its identity differs ({recorded.identity[:12]} -> {current.identity[:12]})"
        raise WorkspaceMismatch(
            f"workspace {current.root} is not the session's workspace {recorded.root}: {what}; "
            "--rebind-workspace cannot change that, run from a checkout of the same repository and subdirectory",
            field="identity", recorded=recorded.identity, current=current.identity,
        )
    if recorded.branch is not None and current.branch != recorded.branch:
        now = f"branch '{current.branch}'" if current.branch is not None else "a detached HEAD"
        raise WorkspaceMismatch(
            f"workspace {current.root} is on {now} but the session is bound to branch '{recorded.branch}'; "
            f"switch back (git -C {current.root} switch {recorded.branch}) or fork the session",
            field="branch", recorded=recorded.branch, current=current.branch,
        )
    if recorded.head is not None and current.head != recorded.head:
        if current.head is None:
            raise WorkspaceMismatch(
                f"workspace {current.root} has no commits but the session is bound to HEAD {recorded.head}; "
                "fetch or check out that history first",
                field="head", recorded=recorded.head, current=None,
            )
        proc = _git(current.root, "merge-base", "--is-ancestor", recorded.head, current.head)
        if proc.returncode == 1:
            raise WorkspaceMismatch(
                f"workspace {current.root}: HEAD {current.head[:12]} does not descend from the session's HEAD "
                f"{recorded.head[:12]} (history rewound or rewritten); check out a descendant of "
                f"{recorded.head[:12]} or fork the session",
                field="head", recorded=recorded.head, current=current.head,
            )
        if proc.returncode != 0:
            raise WorkspaceMismatch(
                f"workspace {current.root}: the session's HEAD {recorded.head[:12]} is unknown to this repository; "
                "fetch it (git fetch) or run from a clone that has it",
                field="head", recorded=recorded.head, current=current.head,
            )
    if recorded.root != current.root and not rebind:
        raise WorkspaceMismatch(
            f"workspace moved: the session is bound to {recorded.root}, not {current.root}; "
            f"pass --workspace {current.root} --rebind-workspace to bind it to the new path",
            field="root", recorded=recorded.root, current=current.root,
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
    proc = _git(None, "check-ref-format", "--branch", WORKTREE_BRANCH_PREFIX + name)
    if proc.returncode != 0:
        raise InvalidWorktreeName(f"worktree name {name!r} is not a valid Git branch name component; {rule}")


def _branch_exists(repo_root: str, branch: str) -> bool:
    proc = _git(repo_root, "rev-parse", "--verify", "-q", "refs/heads/" + branch)
    return proc.returncode == 0


def _registered_worktrees(repo_root: str) -> set[str]:
    proc = _git(repo_root, "worktree", "list", "--porcelain")
    if proc.returncode != 0:
        raise _git_failed(f"listing the worktrees of {repo_root}", proc)
    return {
        os.path.realpath(line[len("worktree "):])
        for line in proc.stdout.splitlines()
        if line.startswith("worktree ")
    }


def create_worktree(workspace: WorkspaceIdentity, name: str) -> WorkspaceIdentity:
    """Check out ``workspace.head`` on a new branch ``kxen/NAME`` in :func:`worktree_path`.

    Returns the identity of the new worktree, bound to the same subdirectory
    as ``workspace``. On any failure nothing is left behind: no worktree, no
    branch, no directory.
    """
    validate_worktree_name(name)
    if workspace.repo_root is None:
        raise InvalidWorktreeName(f"workspace {workspace.root} is not a Git repository; worktrees need one (git init)")
    if workspace.head is None:
        raise InvalidWorktreeName(f"workspace {workspace.root} has no commits; commit once before creating a worktree")
    repo_root = workspace.repo_root
    branch = WORKTREE_BRANCH_PREFIX + name
    path = worktree_path(repo_root, name)
    if _branch_exists(repo_root, branch):
        raise InvalidWorktreeName(
            f"branch {branch} already exists in {repo_root}; choose another worktree name or delete the branch"
        )
    if os.path.lexists(path):
        raise InvalidWorktreeName(f"worktree path {path} already exists; choose another name or remove it")
    parent = os.path.dirname(path)
    parent_existed = os.path.lexists(parent)
    rel = os.path.relpath(workspace.root, repo_root)
    if rel == ".." or rel.startswith(".." + os.sep) or not _COMMIT_ID.fullmatch(workspace.head):
        raise WorkspaceError(f"workspace record for {workspace.root} is inconsistent (root outside repo_root or bad head); re-inspect it")
    target = path if rel == "." else os.path.join(path, rel)
    try:
        proc = _git(repo_root, "worktree", "add", "-b", branch, path, workspace.head)
        if proc.returncode != 0:
            raise _git_failed(f"creating worktree {path}: git worktree add", proc)
        if not os.path.isdir(target):
            raise WorkspaceError(
                f"workspace subdirectory {rel} is not tracked at {workspace.head[:12]}, so worktree {name} "
                "has no such directory; commit it first"
            )
        return inspect_workspace(target)
    except BaseException:
        # Everything below was created by this call (both checked absent above).
        _rollback_worktree(repo_root, path, branch, parent if not parent_existed else None)
        raise


def _rollback_worktree(repo_root: str, path: str, branch: str, created_parent: str | None) -> None:
    try:
        remove_worktree(repo_root, path, branch)
    except WorkspaceError:
        pass  # the steps below are the fallback; the original error is the one to report
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)
        _git(repo_root, "worktree", "prune")
    if _branch_exists(repo_root, branch):
        _git(repo_root, "branch", "-D", branch)
    if created_parent is not None:
        try:
            os.rmdir(created_parent)
        except OSError:
            pass  # not empty: other worktrees appeared meanwhile, keep it


def remove_worktree(repo_root: str, path: str, branch: str) -> None:
    """Remove worktree ``path`` (even with local changes) and delete ``branch``.

    Undoes :func:`create_worktree`; what is already gone is skipped. Raises
    WorkspaceError naming what could not be removed.
    """
    if os.path.realpath(path) in _registered_worktrees(repo_root):
        proc = _git(repo_root, "worktree", "remove", "--force", path)
        if proc.returncode != 0:
            raise _git_failed(f"removing worktree {path}", proc)
    _git(repo_root, "worktree", "prune")
    if _branch_exists(repo_root, branch):
        proc = _git(repo_root, "branch", "-D", branch)
        if proc.returncode != 0:
            raise _git_failed(f"deleting branch {branch} in {repo_root}", proc)
