"""Finding and re-creating the Git worktrees of sessions: ``session delete --worktree`` and ``session undelete``.

Apart from :mod:`.workspace` (which makes worktrees for forks) because
only those two commands need it. It changes Git state only as asked: it
removes nothing itself (the caller uses
:func:`~.workspace.remove_worktree` after :func:`find_kxen_worktree` has
checked the worktree), and re-creates only a worktree and branch that
``delete --worktree`` removed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from .workspace import (
    WORKTREE_BRANCH_PREFIX,
    InvalidWorkspace,
    WorkspaceError,
    WorkspaceIdentity,
    branch_exists,
    git,
    git_failed,
)

__all__ = ["KxenWorktree", "checkpoint_for_fork", "find_kxen_worktree", "restore_worktree"]

COMMIT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256 object names


@dataclass(frozen=True)
class KxenWorktree:
    """A worktree that :func:`create_worktree` made, as found again from a session's binding.

    ``main`` is the repository's main work tree (where the worktree is
    registered), ``path`` the worktree's top directory, ``branch`` its
    ``kxen/NAME`` branch and ``commit`` the commit that branch is at
    (None once the worktree and branch are gone).
    """

    main: str
    path: str
    branch: str
    commit: str | None


def find_kxen_worktree(ws: WorkspaceIdentity) -> KxenWorktree:
    """The kxen worktree a session bound to ``ws`` works in, checked fit to remove.

    Refuses (WorkspaceError, exit 2) a binding that is not a ``kxen/NAME``
    worktree, a worktree now on another branch, and one with uncommitted
    changes (untracked files included: removing would lose them).
    """
    branch = ws.branch or ""
    if ws.repo_root is None or not branch.startswith(WORKTREE_BRANCH_PREFIX):
        raise InvalidWorkspace(
            f"workspace {ws.root} is not a worktree kxen-agent created (its branch is "
            f"{branch or 'none'}, not kxen/NAME); delete the session without --worktree"
        )
    path = ws.repo_root
    if not os.path.isdir(path):
        # Gone already: find the repository by where create_worktree puts worktrees.
        name = branch[len(WORKTREE_BRANCH_PREFIX):]
        suffix = os.sep + os.path.join("", name)
        base = os.path.dirname(path)
        main = base[: -len(".worktrees")] if base.endswith(".worktrees") and path.endswith(suffix) else None
        if main is None or not branch_exists(main, branch):
            raise InvalidWorkspace(
                f"worktree {path} no longer exists and its repository is not where kxen-agent would have put it; "
                f"delete its branch yourself (git branch -D {branch}) and the session without --worktree"
            )
        return KxenWorktree(main, path, branch, _rev(main, branch))
    listing = git(path, "worktree", "list", "--porcelain")
    if listing.returncode != 0:
        raise git_failed(f"listing the worktrees of {path}", listing)
    main = next((line[len("worktree "):] for line in listing.stdout.splitlines() if line.startswith("worktree ")), "")
    main = os.path.realpath(main) if main else ""
    if not main or main == os.path.realpath(path):
        raise InvalidWorkspace(f"workspace {ws.root} is in the repository's main work tree, not in a worktree; "
                               "delete the session without --worktree")
    now = git(path, "symbolic-ref", "--short", "-q", "HEAD").stdout.strip()
    if now != branch:
        raise InvalidWorkspace(
            f"worktree {path} is now on {('branch ' + now) if now else 'a detached HEAD'}, not {branch}; "
            "switch it back, or delete the session without --worktree"
        )
    status = git(path, "status", "--porcelain", "--ignore-submodules=none")
    if status.returncode != 0:
        raise git_failed(f"checking worktree {path} for changes", status)
    changed = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    if changed:
        raise InvalidWorkspace(
            f"worktree {path} has uncommitted changes ({len(changed)} path{'s' if len(changed) > 1 else ''}, "
            f"e.g. {changed[0]}); commit or stash them first, or delete the session without --worktree "
            "(which keeps the worktree)"
        )
    return KxenWorktree(main, path, branch, _rev(path, "HEAD"))


def _rev(repo: str, rev: str) -> str | None:
    proc = git(repo, "rev-parse", "--verify", "-q", rev + "^{commit}")
    return proc.stdout.strip() if proc.returncode == 0 else None


def restore_worktree(wt: KxenWorktree) -> None:
    """Re-create a worktree removed by ``session delete --worktree`` (``session undelete``).

    Its branch is made again at ``wt.commit`` if it is gone (Git keeps the
    commit for a while after the branch is deleted: ``gc.pruneExpire``,
    two weeks by default).
    """
    if wt.commit is None or not COMMIT_ID.fullmatch(wt.commit):
        raise WorkspaceError(f"no commit is known for branch {wt.branch}; re-create worktree {wt.path} yourself")
    if os.path.lexists(wt.path):
        raise WorkspaceError(f"{wt.path} exists; move it away to re-create the worktree there")
    if branch_exists(wt.main, wt.branch):
        proc = git(wt.main, "worktree", "add", wt.path, wt.branch)
    else:
        proc = git(wt.main, "worktree", "add", "-b", wt.branch, wt.path, wt.commit)
    if proc.returncode != 0:
        raise git_failed(f"re-creating worktree {wt.path}: git worktree add", proc)
    if os.path.exists(os.path.join(wt.path, ".gitmodules")):
        git(wt.path, "submodule", "update", "--init", "--recursive")


def checkpoint_for_fork(sessions: Any, info: Any, at: str | None) -> tuple[str, str | None]:
    """``fork --worktree NAME --with-code``: (the checkpoint commit the worktree starts at, a note or None).

    The checkpoint of the workspace as it was at message ``at`` (default: the session's newest message),
    :func:`.checkpoint_restore.checkpoint_at`. Its history holds the ``HEAD`` of its time (its last parent),
    so a branch made there reverts no commit made later on the workspace's branch.
    """
    from . import checkpoint_restore, checkpoints
    from .checkpoint_restore import RewindRefused

    repo = checkpoints.open_repo(info.workspace, sessions.agent(info).get("policy", {}))
    point = sessions.resolve_message(info, at) if at else info.head
    if point is None:
        raise RewindRefused(f"session {info.id} has no messages, so no checkpoint to start a worktree at")
    commit, note = checkpoint_restore.checkpoint_at(sessions, info, repo, point)
    if not repo.exists(commit):
        raise RewindRefused(f"checkpoint {commit} is not in the repository {repo.root}: the session was imported or "
                            "pulled without its checkpoints; fork without --with-code")
    return commit, note
