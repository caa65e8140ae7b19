"""Which tool call made a Git commit: ``session which COMMIT``, from the workspace checkpoints.

A workspace checkpoint (``objects_spec.md`` §14.14) is taken before and
after every tool call that may change files, and its last parent is the
workspace's ``HEAD`` of that moment. So the ``HEAD`` before and after each
such call is already recorded, and the commits the call made are those
reachable from the ``HEAD`` after it and not from the ``HEAD`` before it —
``old..new``, amends and rebases included. Nothing new is written: this
module reads the journal and the checkpoint commits (``git rev-list
--parents``, ``git merge-base --is-ancestor``) and never writes.

A commit no tool call made (one of the user's own, or one made while no
checkpoint was taken: checkpoints off, a session bound to no Git
repository) is found by none. A tool call that made commits is reported
with every session whose history holds it (a fork shares its parent's
calls up to its fork point).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kxen_agent.errors import KxenError

from . import gitproc
from .checkpoints import CheckpointError, NoCheckpoints, checkpoints_of, open_repo, session_checkpoints

__all__ = ["CommitLink", "which"]

_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class CommitLink:
    """A tool call whose ``HEAD`` moved to include ``commit``."""

    commit: str
    sessions: tuple[str, ...]
    run: str
    message: bytes
    op: str
    tool: str
    head_before: str | None
    head_after: str

    def to_json(self) -> dict:
        return {"commit": self.commit, "sessions": list(self.sessions), "run": self.run,
                "message": "msg_" + self.message.hex(), "op": self.op, "tool": self.tool,
                "headBefore": self.head_before, "headAfter": self.head_after}


def _git(root: str, args: list[str]) -> Any:
    return gitproc.run(args, cwd=root)


def _head_of(root: str, checkpoint: str, checkpoints: set[str], cache: dict[str, str | None]) -> str | None:
    """The ``HEAD`` a checkpoint recorded: its last parent, unless that is the previous checkpoint (no HEAD)."""
    if checkpoint in cache:
        return cache[checkpoint]
    p = _git(root, ["rev-list", "--parents", "-n", "1", checkpoint])
    parts = p.stdout.decode().split() if p.returncode == 0 else []
    parents = [x for x in parts[1:] if _SHA1.fullmatch(x)]
    head = parents[-1] if parents and parents[-1] not in checkpoints else None
    cache[checkpoint] = head
    return head


def _is_ancestor(root: str, a: str, b: str) -> bool:
    return _git(root, ["merge-base", "--is-ancestor", a, b]).returncode == 0


def which(sessions: Any, commit_text: str, workspace: str) -> tuple[str, list[CommitLink]]:
    """(the full commit id, the tool calls that made it) for ``commit_text`` in the repository at ``workspace``.

    Every session bound to that repository is looked at; a session whose
    checkpoints cannot be read is skipped.
    """
    from .workspace import inspect_workspace

    here = inspect_workspace(workspace)
    if here.repo_root is None:
        raise KxenError(f"{workspace} is not in a Git repository; run `session which` in the repository of the commit")
    p = _git(here.root, ["rev-parse", "-q", "--verify", commit_text.strip() + "^{commit}"])
    full = p.stdout.decode().strip()
    if p.returncode != 0 or not _SHA1.fullmatch(full):
        raise KxenError(f"{commit_text.strip()!r} is not a commit of the repository at {here.root}")
    found: dict[str, CommitLink] = {}
    cache: dict[str, str | None] = {}
    for info in sessions.list(on_damaged=lambda g, e: None):
        if info.workspace.identity != here.identity:
            continue
        try:
            repo = open_repo(here, {})
            ops = session_checkpoints(sessions, info)
            known = set(checkpoints_of(repo, info.id)) | {c for o in ops for c in (o.before, o.after) if c}
        except (NoCheckpoints, CheckpointError, KxenError):
            continue
        for o in ops:
            if o.after is None:
                continue
            before = _head_of(here.root, o.before, known, cache) if o.before else None
            after = _head_of(here.root, o.after, known, cache)
            if after is None or after == before:
                continue
            if not _is_ancestor(here.root, full, after):
                continue
            if before is not None and _is_ancestor(here.root, full, before):
                continue
            link = found.get(o.op)
            owners = (link.sessions if link else ()) + (info.id,)
            found[o.op] = CommitLink(full, owners, o.run, o.message, o.op, o.tool, before, after)
    return full, sorted(found.values(), key=lambda c: (c.sessions[0], c.op))
