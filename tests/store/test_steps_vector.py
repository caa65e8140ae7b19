"""The step-log vector of objects_spec.md §13.4, read from the spec itself and checked against the code."""

from __future__ import annotations

import os
import re
from pathlib import Path

import blake3

from kxen_agent.store import Store, fsck
from kxen_agent.store.objects import decompress_loose
from kxen_agent.store.steps import StepTx, TxUpdate, encode_header, encode_record, parse_header, scan

from .helpers import CLI_NAMESPACES

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"


def _block() -> dict[str, str]:
    text = SPEC.read_text()
    m = re.search(r"```\nstep-log: one-step\n(.*?)```", text, re.S)
    assert m, "objects_spec.md §13.4 has no step-log block"
    return dict(line.split(": ", 1) for line in m.group(1).strip().split("\n"))


def test_the_spec_step_log_decodes_and_encodes_back() -> None:
    v = _block()
    data = bytes.fromhex(v["bytes"])
    group, gen, hlen = parse_header(data, "spec")
    assert (group, gen) == (v["group"], int(v["generation"])) and hlen == 45
    recs, end = scan(data, hlen, "spec")
    assert end == len(data) == 242 and len(recs) == 1
    (rec,) = recs
    assert rec.tx == StepTx(1700000000000000000, "run run_1: start", 0, None, "leave",
                            (TxUpdate("head", None, rec.objects[0][0]),))
    (oid, at, n) = rec.objects[0]
    assert (at, n) == (189, 21)
    raw = decompress_loose(data[at:at + n], "spec")
    assert raw == b"blob 5\x00hello" and blake3.blake3(raw).digest() == oid
    assert data[rec.end - 32:rec.end] == blake3.blake3(data[rec.offset:rec.end - 32]).digest()
    # Encoding the same step with the same frame gives the same bytes.
    assert encode_header(group, gen) + encode_record(rec.tx, [(oid, data[at:at + n])]) == data


def test_the_spec_step_log_reads_and_checkpoints_as_the_spec_says(tmp_path: Path) -> None:
    v = _block()
    data = bytes.fromhex(v["bytes"])
    store = Store(str(tmp_path / "s"), namespaces=CLI_NAMESPACES)
    store.ensure_initialized()
    path = store.refs.steps_path(v["group"])
    with open(path, "wb") as f:
        f.write(data)
    fresh = Store(store.root, namespaces=CLI_NAMESPACES)
    st = fresh.refs.read(v["group"])
    oid = bytes.fromhex("9db8039d1b509628ad5b125ea89780b69fcde5c272215d690a2e4dc69eac75ad")
    assert st.refs == {"head": oid} and st.fence == 0 and st.log_size == 174 and st.deleted_ns is None
    assert fresh.get(oid) == b"hello"
    assert fsck(fresh).clean
    # The checkpoint the spec shows (the object made durable in a loose file first, as its caller must).
    fresh.loose.write(fresh.read_raw(oid))
    assert fresh.refs.checkpoint(v["group"])
    ref = Path(fresh.refs.ref_path(v["group"])).read_text()
    assert ref == f"kxen-refs 1\nfence 0\nlog 174\nsteps 1\n{oid.hex()} head\n"
    assert os.path.getsize(fresh.refs.log_path(v["group"])) == 174
    assert Path(path).read_bytes() == encode_header(v["group"], 1)
    assert Store(store.root, namespaces=CLI_NAMESPACES).refs.read(v["group"]) == st
