"""Derived caches (store/caches.py): placed, removed with their group, checked by fsck's hooks (§11a)."""

from __future__ import annotations

import os

import pytest

from kxen_agent.store import BadRefName, RefUpdate, Store, fsck
from kxen_agent.store.caches import CacheKind, Caches

G = "ns/g1"


def _write(path: str, data: bytes = b"derived") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_path_remove_and_the_fsck_hook(tmp_path) -> None:
    seen = []

    def verify(store):
        seen.append(store)
        return [(store.caches.path(DEMO, G), "entry 0 is wrong")], ["2 good entries, then a torn tail"]

    DEMO = CacheKind("demo", verify=verify, problem="demo-cache", title="demo cache")
    store = Store(str(tmp_path / "s"), caches=(DEMO,))
    oid = store.put("blob", b"x")
    store.refs.transaction(G, [RefUpdate("head", None, oid)], reason="r")
    path = store.caches.path(DEMO, G)
    assert path == os.path.join(store.root, "cache", "demo", "ns", "g1")
    _write(path)
    rep = fsck(store)
    assert seen == [store]
    assert [(p.kind, p.where, p.message) for p in rep.problems] == [("demo-cache", path, "entry 0 is wrong")]
    assert rep.notes == [("demo cache", "2 good entries, then a torn tail")] and not rep.clean
    assert "notes" not in rep.to_json() and rep.stray_files == [], "a group's cache is no stray file"
    # A store not given the kind does not check it (it still places and removes its files).
    plain = Store(store.root)
    assert plain.caches.kinds == () and fsck(plain).problems == [] and fsck(plain).notes == []
    # Removing the group removes its caches of every kind found on disk, given or not.
    other = os.path.join(store.root, "cache", "other", "ns", "g1")
    _write(other)
    store.refs.remove_group(G)
    assert not os.path.exists(path) and not os.path.exists(other)
    assert not store.refs.read(G).exists


def test_names_are_checked(tmp_path) -> None:
    caches = Caches(str(tmp_path), None)  # type: ignore[arg-type] - nothing here touches a file
    kind = CacheKind("history")
    with pytest.raises(BadRefName):
        caches.path(kind, "no-slash")
    with pytest.raises(BadRefName):
        CacheKind("a/b")
    with pytest.raises(ValueError, match="two cache kinds"):
        Caches(str(tmp_path), None, (kind, CacheKind("history")))  # type: ignore[arg-type]
    assert not os.listdir(tmp_path)
