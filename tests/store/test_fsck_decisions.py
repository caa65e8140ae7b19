"""fsck is never clean over damage, and the spec's open questions decided (issue 24, objects_spec.md §6.9, §11).

Each test is one decision of the spec, checked through fsck or a reader
against real files. Step logs the tests need in a shape no writer makes are
written here byte by byte in format version 1 (§6.8), as a second
implementation would write them: a reader still reads that version, so the
tests do not lean on the writer's encoder.
"""

from __future__ import annotations

import os

import blake3
import pytest

from kxen_agent.store import RefUpdate, Store, fsck
from kxen_agent.store import codec
from kxen_agent.store.fold import fold_step_logs

from .helpers import CLI_NAMESPACES

G = "sessions/ses_dec"


def _open(root) -> Store:
    return Store(str(root), namespaces=CLI_NAMESPACES)


def _problems(store: Store) -> list[tuple[str, str]]:
    return [(p.kind, p.where) for p in fsck(_open(store.root)).problems]


# ------------------------------------------------------------------ stale logs hold nothing (question 8)


def _stale_log_holding_meta(tmp_path):
    """A group whose ref ``meta`` names an object held only by a stale step log.

    A checkpoint that died before its last rename leaves the log of the
    previous generation (§6.8); here the pack the checkpoint relied on is
    lost too, so the stale log is the object's only copy.
    """
    store = _open(tmp_path / "s")
    with store.writing():
        meta = store.put("blob", b"meta " + b"m" * 500)
        head = store.put("blob", b"head 0")
        store.refs.transaction(G, [RefUpdate("meta", None, meta), RefUpdate("head", None, head)], reason="start")
    path = store.refs.steps_path(G)
    stale = open(path, "rb").read()
    fold_step_logs(store)
    open(path, "wb").write(stale)  # the checkpoint's new generation never made it
    for name in os.listdir(store.pack_dir):
        os.unlink(os.path.join(store.pack_dir, name))  # and the pack is lost
    return store, meta, head


def test_a_ref_to_an_object_only_a_stale_log_holds_is_a_problem(tmp_path):
    store, meta, head = _stale_log_holding_meta(tmp_path)
    rep = fsck(_open(store.root))
    assert sorted((p.kind, p.where) for p in rep.problems) == [("missing-object", f"{G}/head"),
                                                               ("missing-object", f"{G}/meta")]
    assert "stale step log" in rep.problems[0].message and store.refs.steps_path(G) in rep.problems[0].message
    assert meta.hex() not in rep.dangling and rep.objects == 0 and rep.in_steps == 2
    # What fsck warned of: the group's next transaction replaces the stale log, and meta is gone.
    fresh = _open(store.root)
    with fresh.writing():
        new = fresh.put("blob", b"head 1")
        fresh.refs.transaction(G, [RefUpdate("head", head, new)], reason="next")
    after = fsck(_open(store.root))
    assert ("missing-object", f"{G}/meta") in [(p.kind, p.where) for p in after.problems]


def test_a_leftover_log_of_a_removed_group_holds_nothing_either(tmp_path):
    store = _open(tmp_path / "s")
    with store.writing():
        obj = store.put("blob", b"only in the leftover")
        store.refs.transaction(G, [RefUpdate("head", None, obj)], reason="one")
    fold_step_logs(store)
    for name in os.listdir(store.pack_dir):
        os.unlink(os.path.join(store.pack_dir, name))
    log = store.refs.steps_path(G)
    # A removed group's leftover log of generation 1 (no ref file), holding a record by hand.
    os.unlink(store.refs.ref_path(G))
    os.unlink(store.refs.log_path(G))
    rec = _record({"time": 1, "reason": "x", "fence": 0, "updates": [["head", None, obj]]},
                  [(obj, _frame(store, obj, b"only in the leftover"))])
    open(log, "wb").write(_header(G, 1) + rec)
    other = "sessions/ses_other"
    fresh = _open(store.root)
    fresh.refs.transaction(other, [RefUpdate("head", None, obj)], reason="names it")
    rep = fsck(_open(store.root))
    assert [(p.kind, p.where) for p in rep.problems] == [("missing-object", f"{other}/head")]
    assert "leftover" in rep.problems[0].message


# ------------------------------------------------------------------ version-1 logs by hand


def _header(group: str, gen: int) -> bytes:
    return b"kxen-steps 1 %s %d\n" % (group.encode(), gen)


def _record(tx: dict, objects=()) -> bytes:
    txb = codec.encode(tx)
    body = len(txb).to_bytes(4, "big") + txb + b"".join(oid + len(f).to_bytes(4, "big") + f for oid, f in objects)
    head = b"STEP" + len(body).to_bytes(4, "big")
    return head + body + blake3.blake3(head + body).digest()


def _frame(store: Store, oid: bytes, data: bytes) -> bytes:
    from kxen_agent.store.objects import compress_loose, encode_object

    obj = encode_object("blob", data)
    assert obj.id == oid
    return compress_loose(obj.raw)
