"""The vectors of objects_spec.md §18.4 (Damage and repair), read from the spec itself."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kxen_agent.store import Store, fsck
from kxen_agent.store.fsio import OS_IO
from kxen_agent.store.objects import encode_object
from kxen_agent.store.refformat import format_ref_file
from kxen_agent.store.repair import repair
from kxen_agent.store.salvage import salvage_log, salvage_pack

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"
A = encode_object("blob", b"a")
B = encode_object("blob", b"b")


def _vectors() -> tuple[bytes, bytes]:
    text = SPEC.read_text()
    sec = text[text.index("### 18.4 Vectors"):]
    log, pack = re.findall(r"```text\n([0-9a-f]+)\n```", sec)[:2]
    return bytes.fromhex(log), bytes.fromhex(pack)


def test_d1_a_step_log_damaged_in_the_middle(tmp_path):
    log, _ = _vectors()
    assert len(log) == 567
    bad = bytearray(log)
    bad[234] ^= 0x01
    store = Store(str(tmp_path / "s"))
    store.put("blob", b"a")  # the state dir exists; A is present
    path = store.steps.path("notes/d1")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.makedirs(os.path.dirname(store.refs.ref_path("notes/d1")), exist_ok=True)
    with open(store.refs.ref_path("notes/d1"), "wb") as f:
        f.write(format_ref_file({}, 0, 0, None, 1))
    with open(path, "wb") as f:
        f.write(bad)
    sal = salvage_log(OS_IO, path, "notes/d1", (1,))
    assert [(r.offset, r.end) for r in sal.records] == [(24, 194), (397, 567)]
    assert [(a, b) for a, b, _ in sal.damage] == [(194, 397)] and sal.before == 1
    rep = fsck(Store(store.root))
    assert [p.kind for p in rep.problems] == ["corrupt-ref"]
    done = repair(Store(store.root), apply=True)
    after = Store(store.root)
    assert fsck(after).clean, [p.line() for p in fsck(after).problems]
    state = after.refs.read("notes/d1")
    assert state.refs == {"r": A.id, "s": A.id} and state.fence == 3
    assert [a.kind for a in done.actions] == ["rebuild"]
    assert after.refs.reflog("notes/d1")[-1].reason.startswith("repair")
    kept = [os.path.join(d, f) for d, _, fs in os.walk(done.lost_found) for f in fs]
    assert any(p.endswith(os.path.join("steps", "notes", "d1")) and open(p, "rb").read() == bytes(bad) for p in kept)


def test_d1_a_source_that_does_not_reach_a_proven_value_is_not_taken(tmp_path):
    log, _ = _vectors()
    bad = bytearray(log)
    bad[234] ^= 0x01
    store = Store(str(tmp_path / "s"))
    store.put("blob", b"a")
    path = store.steps.path("notes/d1")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.makedirs(os.path.dirname(store.refs.ref_path("notes/d1")), exist_ok=True)
    with open(store.refs.ref_path("notes/d1"), "wb") as f:
        f.write(format_ref_file({}, 0, 0, None, 1))
    with open(path, "wb") as f:
        f.write(bad)
    source = ("a bundle", {A.id: A, B.id: B}.get, {"notes/d1": {"r": B.id, "s": A.id}})
    repair(Store(store.root), sources=[source], apply=True)
    assert Store(store.root).refs.read("notes/d1").refs == {"r": A.id, "s": A.id}


def test_d2_a_damaged_pack_entry(tmp_path):
    _, pack = _vectors()
    assert len(pack) == 190
    bad = bytearray(pack)
    bad[138] ^= 0x01
    path = tmp_path / "pack-x.pack"
    path.write_bytes(bad)
    sal = salvage_pack(OS_IO, str(path))
    assert {oid: v[0] for oid, v in sal.good.items()} == {A.id: 16}
    assert [(d.oid, d.offset) for d in sal.damaged] == [(B.id, 81)]
    assert "entry checksum mismatch" in sal.damaged[0].reason


def test_d3_a_truncated_loose_object(tmp_path):
    store = Store(str(tmp_path / "s"))
    oid = store.put("blob", b"a")
    p = store.loose.path(oid)
    data = open(p, "rb").read()
    for cut in range(len(data)):
        with open(p, "wb") as f:
            f.write(data[:cut])
        rep = fsck(Store(store.root))
        assert [(d.oid, d.offset) for d in rep.damage] == [(oid, None)], cut
    done = repair(Store(store.root), apply=True)
    assert not os.path.exists(p) and fsck(Store(store.root)).clean
    assert [a.kind for a in done.actions] == ["lost-found"]
