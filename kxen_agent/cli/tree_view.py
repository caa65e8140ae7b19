"""``session tree``: the fork family drawn as ``git log --graph`` draws branches.

A fork is a branch off its parent at its fork point, so the family is
drawn the way Git draws branches off a commit: every session above the one
it was forked from, the newest fork straight above its parent, each older
fork one column to the right, joining its parent with ``|/``::

    * ses_…c  (topic/3)  completed  2h ago  task: …
    | * ses_…b  (topic/2)  running  just now  task: …
    |/
    | * ses_…a1  (topic/1/1)  failed  1d ago  task: …
    | * ses_…a  (topic/1)  completed  2d ago  task: …
    |/
    * ses_…  (topic)  completed  3d ago  task: …

Pure rendering: :func:`graph` takes the family's shape and a label per
session, and never reads the store.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

__all__ = ["age", "graph"]


def age(ns: int, now_ns: int | None = None) -> str:
    """How long ago ``ns`` was, in one unit (``just now``, ``5m ago``, ``3h ago``, ``2d ago``, ``6w ago``)."""
    secs = max(0, ((now_ns if now_ns is not None else time.time_ns()) - ns) // 1_000_000_000)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * (2 if unit == "w" else 1):
            return f"{secs // size}{unit} ago"
    return "just now"


def graph(root: str, children: Mapping[str, Sequence[str]], label: Callable[[str], str]) -> list[str]:
    """The family below ``root`` as ``git log --graph`` lines, top first.

    ``children`` lists each session's forks oldest first and is acyclic
    (``SessionStore.tree`` makes it so). A line is the graph prefix then
    ``label(sid)``; a join line is ``|/`` under its columns.
    """
    def lines(node: str) -> list[str]:
        # The newest fork's line runs straight down to its parent: walk that chain
        # without recursing (a long chain of forks of forks costs no stack), and
        # recurse only into the older forks, each drawn one column to the right.
        path = [node]
        while children.get(path[-1]):
            path.append(children[path[-1]][-1])
        out: list[str] = []
        for v in reversed(path):
            for k in reversed(list(children.get(v, ()))[:-1]):
                out.extend("| " + line for line in lines(k))
                out.append("|/")
            out.append("* " + label(v))
        return out

    return lines(root)
