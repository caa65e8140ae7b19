"""Derived caches: files a layer above keeps per ref group, which the store places, removes and has checked.

A cache (``objects_spec.md`` §11a) is a file ``cache/<kind>/<ns>/<id>``
derived from a group's objects, never needed (deleting one loses nothing
but time) and never fsynced. The store knows three things of each
:class:`CacheKind`: where its file for a group lives
(:meth:`Caches.path`), that it goes when the group goes
(:meth:`Caches.remove`, called by the group's removal), and how fsck
checks it (the kind's ``verify`` hook, run by :func:`~.fsck.fsck` through
:meth:`Caches.verify`). What a cache holds is its layer's business: the
run loop's history index (``runtime/history_index.py``) is the one kind
today. A store is given the kinds it checks (``Store(root, caches=...)``),
as it is given its namespaces; placing and removing need no declaring.
Every file-system call goes through the store's :class:`~.fsio.FileIO`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .fsio import FileIO
from .refformat import validate_group, validate_namespace

__all__ = ["CacheKind", "Caches", "CacheCheck", "replace_cache_file"]

#: What a kind's fsck hook returns: problems as (path, what is wrong) — fsck
#: reports them and is not clean — and notes, what is normal for a cache
#: (a torn tail that readers cut off), printed but not counted.
CacheCheck = tuple[list[tuple[str, str]], list[str]]


def replace_cache_file(io: FileIO, path: str, data: bytes) -> None:
    """Make the cache file at ``path`` hold ``data``: written beside it and renamed over it, so a reader sees
    the old file or the new one, never a mixture; no fsync (a cache, §11a). Raises OSError (its temp file
    removed)."""
    d = os.path.dirname(path)
    io.makedirs(d)
    tmp = io.write_tmp(d, data, sync=False)
    try:
        io.rename(tmp, path)
    except BaseException:
        try:
            io.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass(frozen=True)
class CacheKind:
    """One kind of derived cache.

    ``name``: its directory under ``cache/`` (one path segment).
    ``verify``: fsck's hook, given the store, returning a :data:`CacheCheck`
    (None: the kind's files are not checked). ``problem``: the kind of the
    fsck problems it reports; ``title``: how a note names the kind.
    ``files``: names of files the kind keeps beside its namespaces, no
    group's (``cache/<kind>/<name>``: the search index's stamp, §11a.2),
    which fsck's stray-file listing passes over and ``verify`` checks.
    """

    name: str
    verify: Callable[[Any], CacheCheck] | None = None
    problem: str = "cache"
    title: str = "cache"
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_namespace(self.name)  # one segment, as a namespace is (§6.1)


class Caches:
    """The caches of one state dir: under ``<root>/cache``, of the kinds this store was given."""

    def __init__(self, root: str, io: FileIO, kinds: Iterable[CacheKind] = ()) -> None:
        self.root = root
        self.io = io
        kinds = tuple(kinds)
        if len({k.name for k in kinds}) != len(kinds):
            raise ValueError(f"two cache kinds of one name among {[k.name for k in kinds]}")
        #: The kinds fsck checks (their ``verify`` hooks).
        self.kinds: tuple[CacheKind, ...] = kinds

    @property
    def dir(self) -> str:
        return os.path.join(self.root, "cache")

    def path(self, kind: CacheKind, group: str) -> str:
        """Where ``group``'s cache of ``kind`` lives: ``cache/<kind>/<ns>/<id>``."""
        return os.path.join(self.dir, kind.name, *validate_group(group).split("/"))

    def files(self, kind: CacheKind, ns: str) -> list[str]:
        """The paths of the caches of ``kind`` in namespace ``ns``, sorted (temp files and directories are
        fsck's stray-file listing's to name, not a cache's)."""
        base = os.path.dirname(self.path(kind, f"{ns}/_"))
        try:
            names = sorted(self.io.listdir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        paths = (os.path.join(base, name) for name in names if not name.startswith("tmp_"))
        return [p for p in paths if not self.io.isdir(p)]

    def kind_files(self) -> frozenset[str]:
        """The paths of the files the kinds keep beside their namespaces (:attr:`CacheKind.files`)."""
        return frozenset(os.path.join(self.dir, k.name, f) for k in self.kinds for f in k.files)

    def remove(self, group: str) -> None:
        """Remove every cache of ``group``, of any kind found on disk (the group is gone).

        No fsync: a leftover is a stray file that the next removal of the
        group's name, or a user, removes.
        """
        parts = validate_group(group).split("/")
        try:
            kinds = self.io.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            kinds = []
        for kind in kinds:
            try:
                self.io.unlink(os.path.join(self.dir, kind, *parts))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass

    def verify(self, store: Any) -> list[tuple[CacheKind, CacheCheck]]:
        """Run each kind's fsck hook on ``store``: the kind and what its hook found."""
        return [(k, k.verify(store)) for k in self.kinds if k.verify is not None]
