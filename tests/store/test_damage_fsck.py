"""fsck names the damage, once: the two reproductions of the damage issue, exactly diagnosed.

1. One flipped byte in a pack: the one damaged object is named (id, file,
   offset, kind) with every ref that reaches it; nothing that still reads
   is reported missing.
2. One flipped bit in a step log's committed records: the log's intact
   records (before and after the damage) and the damaged bytes are named;
   its session is unreadable, the others intact.

The state dirs are made once per module with the library (three finished
runs), then copied for each test; every check goes through the real CLI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kxen_agent.runtime.runner import Runner
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import Store
from kxen_agent.store.gc import gc
from kxen_agent.store.objects import links_of, decode_body
from kxen_agent.store.steps import scan

from tests.helpers import Cli as Kxen
from tests.reliability.workloads import TASK, agent
from .helpers import CLI_NAMESPACES


def _build(root: Path, *, packed: bool) -> list[str]:
    store = Store(str(root / "state"), namespaces=CLI_NAMESPACES)
    ws = root / "ws"
    ws.mkdir(parents=True)
    sessions = []
    for _ in range(3):
        res = Runner(store).start(str(ws), TASK, agent())
        assert res.status == "completed", res
        sessions.append(res.session)
    if packed:
        gc(store, prune="now")
    return sessions


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    out = {}
    for name, packed in (("packed", True), ("steps", False)):
        root = tmp_path_factory.mktemp(name)
        out[name] = (root, _build(root, packed=packed))
    return out


def _copy(templates, name: str, tmp_path: Path) -> tuple[Path, list[str]]:
    root, sessions = templates[name]
    shutil.copytree(root, tmp_path / "t", symlinks=True)
    return tmp_path / "t" / "state", sessions


def _reaching(store: Store, oid: bytes) -> list[str]:
    """Every ref (group/name) whose closure holds ``oid``, computed on the undamaged store."""
    out = []
    for group in store.refs.groups():
        for name, root in store.refs.read(group).refs.items():
            seen, stack = set(), [root]
            while stack:
                cur = stack.pop()
                if cur in seen:
                    continue
                seen.add(cur)
                obj = store.read_raw(cur)
                stack.extend(links_of(obj.kind, decode_body(obj)))
            if oid in seen:
                out.append(f"{group}/{name}")
    return sorted(out)


def _no_self_advice(rep: dict, text: str) -> None:
    for p in rep["problems"]:
        assert "fsck" not in p["message"] and "fsck" not in p["next"], p
    assert "run fsck" not in text and "'kxen-agent fsck'" not in text, text


def test_one_flipped_byte_in_a_pack_names_the_one_object(templates, tmp_path):
    state, sessions = _copy(templates, "packed", tmp_path)
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    (pack,) = store.packs
    # A message of the first session: its history reaches it.
    head = store.refs.read(f"sessions/{sessions[0]}").refs["head"]
    want = _reaching(store, head)
    off = pack._locate(head)[0]
    kind = store.read_raw(head).kind
    others = [s for s in sessions if not any(w.startswith(f"sessions/{s}/") for w in want)]
    pack.close()
    with open(pack.path, "r+b") as f:
        f.seek(off + 57 + 3)  # inside the entry's stored bytes
        b = f.read(1)
        f.seek(off + 57 + 3)
        f.write(bytes([b[0] ^ 0x01]))

    k = Kxen(state, strict=True)
    p = k("fsck", "--json")
    assert p.rc == 1, str(p)
    rep = p.json()
    assert [(x["kind"], x["where"]) for x in rep["problems"]] == [("corrupt-object", f"{pack.path}:{head.hex()}")]
    assert rep["damage"] == [{"id": head.hex(), "file": pack.path, "offset": off, "kind": kind,
                              "reason": rep["damage"][0]["reason"], "reachedFrom": want}]
    assert "checksum" in rep["damage"][0]["reason"]
    assert rep["damagedPacks"][0]["entriesRead"] == rep["objects"] == rep["packedObjects"]
    assert rep["damagedPacks"][0]["entriesDamaged"] == 1
    states = {s["id"]: s for s in rep["sessions"]}
    assert states[sessions[0]]["state"] == "damaged"
    assert states[sessions[0]]["firstUnreadableMessage"] == "msg_" + head.hex()
    assert all(states[s]["state"] == "intact" for s in others)
    assert rep["problems"][0]["next"].startswith("kxen-agent repair")
    text = k("fsck")
    _no_self_advice(rep, text.err + text.out)
    assert f"corrupt-object: {pack.path}:{head.hex()}: {kind} object {head.hex()} at offset {off} does not read" \
        .replace(f"{kind} object", f"a {kind} object") in text.err
    assert "next, for corrupt-object: kxen-agent repair" in text.err
    # What reads still reads: the other sessions' logs.
    for s in others:
        k("session", "log", s, expect=0)


def test_one_flipped_bit_in_a_step_log_names_its_intact_records(templates, tmp_path):
    state, sessions = _copy(templates, "steps", tmp_path)
    ses = sessions[1]
    path = state / "steps" / "sessions" / ses
    data = bytearray(path.read_bytes())
    line_end = data.index(b"\n") + 1
    recs, end = scan(bytes(data), line_end, str(path))
    assert end == len(data) and len(recs) >= 4
    bad = recs[2]
    data[bad.offset + 40] ^= 0x10  # a bit of the record's body: a committed record, damaged
    path.write_bytes(bytes(data))

    k = Kxen(state, strict=True)
    p = k("fsck", "--json")
    assert p.rc == 1, str(p)
    rep = p.json()
    assert [(x["kind"], x["where"]) for x in rep["problems"]] == [("corrupt-ref", str(path))]
    msg = rep["problems"][0]["message"]
    assert msg.startswith(f"step log {path} is damaged at offset {bad.offset}: ")
    assert f"damaged bytes {bad.offset}-{bad.end}; {len(recs) - 1} records check (2 before the damage, " \
           f"{len(recs) - 3} after)" in msg
    (log,) = rep["damagedStepLogs"]
    assert log["intactRecords"] == [[r.offset, r.end] for r in recs if r is not bad]
    assert log["damage"] == [{"start": bad.offset, "end": bad.end, "reason": log["damage"][0]["reason"]}]
    states = {s["id"]: s["state"] for s in rep["sessions"]}
    assert states == {s: ("unreadable" if s == ses else "intact") for s in sessions}
    text = k("fsck")
    _no_self_advice(rep, text.err + text.out)
    assert "next, for corrupt-ref: kxen-agent repair --apply" in text.err
    for s in sessions:
        if s != ses:
            k("session", "log", s, expect=0)
