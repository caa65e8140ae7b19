"""The step-log vectors of objects_spec.md §13.4, read from the spec itself and checked against the code.

The version-2 files field by field, the reader rule case by case (every
torn length, every bit of each header field, a copy inside a torn
payload, a good record after torn bytes), the version-1 file, and the
``dd`` recipes run as the spec writes them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import blake3
import pytest

from kxen_agent.store import Store, fsck
from kxen_agent.store.objects import decompress_loose
from kxen_agent.store.steps import (CorruptSteps, StepTx, TxUpdate, encode_header, encode_record, encode_record_v1,
                                    read_header, scan)

from .helpers import CLI_NAMESPACES

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"


def _section() -> str:
    text = SPEC.read_text()
    return text[text.index("### 13.4 Step log"):text.index("## 14. Session layer objects")]


def _blocks(tag: str) -> dict[str, dict[str, str]]:
    out = {}
    for m in re.finditer(r"```\n(" + tag + r": .*?)```", _section(), re.S):
        d = dict(line.split(": ", 1) for line in m.group(1).strip().split("\n"))
        out[d[tag]] = d
    return out


FILES = _blocks("step-log")
CASES = _blocks("step-log-case")


def test_the_spec_has_the_vectors_issue_24_asks_for() -> None:
    assert {"one-step", "two-steps", "one-step-v1"} <= set(FILES)
    assert {"torn-first", "torn-second", "copy-in-torn-payload", "good-after-torn", "flip-generation"} <= set(CASES)
    for field in ("magic", "length", "offset", "header-check", "trailer"):
        assert {f"flip-first-{field}", f"flip-last-{field}"} <= set(CASES), field


def test_the_spec_step_log_decodes_and_encodes_back() -> None:
    v = FILES["one-step"]
    data = bytes.fromhex(v["bytes"])
    version, group, gen, hlen = read_header(data, "spec")
    assert (version, group, gen) == (int(v["version"]), v["group"], int(v["generation"])) == (2, v["group"], 0)
    assert hlen == 45
    recs, end = scan(data, hlen, "spec")
    assert end == len(data) == 298 and len(recs) == 1
    (rec,) = recs
    assert (rec.offset, rec.end) == (45, 298)
    assert rec.tx == StepTx(1700000000000000000, "run run_1: start", 0, None, "leave",
                            (TxUpdate("head", None, rec.objects[0][0]),))
    (oid, at, n) = rec.objects[0]
    assert (at, n) == (213, 21)
    raw = decompress_loose(data[at:at + n], "spec")
    assert raw == b"blob 5\x00hello" and blake3.blake3(raw).digest() == oid
    line = data[:hlen]
    # The fields the table shows: P, HC, S, the trailer and TC.
    assert data[53:61] == (45).to_bytes(8, "big") and data[270:282] == data[49:61]
    assert data[61:77] == blake3.blake3(line + data[45:61]).digest()[:16]
    assert data[234:266] == blake3.blake3(data[45:234]).digest()
    assert data[266:270] == b"PETS" and data[282:298] == blake3.blake3(line + data[266:282]).digest()[:16]
    # Encoding the same step with the same frame gives the same bytes.
    assert encode_header(group, gen) + encode_record(rec.tx, [(oid, data[at:at + n])], 45, line) == data
    two = bytes.fromhex(FILES["two-steps"]["bytes"])
    assert two.startswith(data) and len(two) == 455
    recs2, end2 = scan(two, hlen, "spec")
    assert end2 == 455 and [(r.offset, r.end) for r in recs2] == [(45, 298), (298, 455)]
    assert recs2[1].tx == StepTx(1700000000000000001, "fence up", 1, 1, "leave", ())
    assert two[298:] == encode_record(recs2[1].tx, [], 298, line)


def test_the_version_1_vector_reads_as_the_same_step() -> None:
    v = FILES["one-step-v1"]
    data = bytes.fromhex(v["bytes"])
    version, group, gen, hlen = read_header(data, "spec")
    assert (version, group, gen, hlen, len(data)) == (1, v["group"], 0, 45, 242)
    recs, end = scan(data, hlen, "spec")
    assert end == 242 and len(recs) == 1 and recs[0].objects[0][1:] == (189, 21)
    one = scan(bytes.fromhex(FILES["one-step"]["bytes"]), 45, "spec")[0][0]
    assert recs[0].tx == one.tx
    assert data[210:242] == blake3.blake3(data[45:210]).digest()
    oid, at, n = recs[0].objects[0]
    assert encode_header(group, gen, version=1) + encode_record_v1(recs[0].tx, [(oid, data[at:at + n])]) == data


def _edits(edit: str, base: bytes) -> list[bytes]:
    if m := re.fullmatch(r"cut to every length in \[(\d+), (\d+)\)", edit):
        return [base[:k] for k in range(int(m[1]), int(m[2]))]
    if m := re.fullmatch(r"flip every bit of bytes \[(\d+), (\d+)\)", edit):
        out = []
        for i in range(int(m[1]), int(m[2])):
            for b in range(8):
                d = bytearray(base)
                d[i] ^= 1 << b
                out.append(bytes(d))
        return out
    if m := re.fullmatch(r"flip bit (\d) of byte (\d+)", edit):
        d = bytearray(base)
        d[int(m[2])] ^= 1 << int(m[1])
        return [bytes(d)]
    if m := re.fullmatch(r"append ([0-9a-f]+)", edit):
        return [base + bytes.fromhex(m[1])]
    raise AssertionError(f"unknown edit in §13.4: {edit!r}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reader_rule_case_by_case(name: str) -> None:
    case = CASES[name]
    assert set(case) == {"step-log-case", "base", "edit", "result"}
    base = bytes.fromhex(FILES[case["base"]]["bytes"])
    files = _edits(case["edit"], base)
    assert files
    for data in files:
        hlen = read_header(data, "spec")[3]
        if m := re.fullmatch(r"committed (\d+), end (\d+)", case["result"]):
            recs, end = scan(data, hlen, "spec")
            assert (len(recs), end) == (int(m[1]), int(m[2]))
        else:
            m = re.fullmatch(r"damage at (\d+)", case["result"])
            assert m, case["result"]
            with pytest.raises(CorruptSteps, match=f"is damaged at offset {m[1]}:") as e:
                scan(data, hlen, "spec")
            assert e.value.offset == int(m[1])  # type: ignore[attr-defined]


@pytest.mark.tools("zstd", "b3sum")
def test_the_dd_recipes_of_the_spec_print_what_it_says(tmp_path: Path) -> None:
    sec = _section()
    recipes = re.search(r"```sh\n(.*?)```", sec, re.S)
    assert recipes
    path = tmp_path / "steps" / "sessions" / "ses_0123456789abcdef"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes.fromhex(FILES["one-step"]["bytes"]))
    lines = [ln for ln in recipes.group(1).strip().split("\n")]
    assert len(lines) == 4
    for ln in lines:
        cmd, comment = ln.split("#", 1)
        want = re.search(r"([0-9a-f]{16})…", comment).group(1)
        out = subprocess.run(cmd.replace("dd ", "dd status=none "), shell=True, cwd=tmp_path, check=True,
                             capture_output=True, text=True).stdout
        assert out.startswith(want), (ln, out)


def test_the_spec_step_log_reads_and_checkpoints_as_the_spec_says(tmp_path: Path) -> None:
    v = FILES["one-step"]
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


def test_the_version_1_vector_upgrades_to_the_version_2_bytes(tmp_path: Path) -> None:
    # §6.8.1: the group's next write re-frames the version-1 record: the
    # new file starts with exactly the one-step bytes.
    v1 = FILES["one-step-v1"]
    store = Store(str(tmp_path / "s"), namespaces=CLI_NAMESPACES)
    store.ensure_initialized()
    path = store.refs.steps_path(v1["group"])
    Path(path).write_bytes(bytes.fromhex(v1["bytes"]))
    fresh = Store(store.root, namespaces=CLI_NAMESPACES)
    assert fsck(fresh).clean
    oid = bytes.fromhex("9db8039d1b509628ad5b125ea89780b69fcde5c272215d690a2e4dc69eac75ad")
    fresh.refs.transaction(v1["group"], [], reason="fence up", new_fence=1)
    data = Path(path).read_bytes()
    assert data.startswith(bytes.fromhex(FILES["one-step"]["bytes"]))
    assert [r.tx.reason for r in scan(data, 45, path)[0]] == ["run run_1: start", "fence up"]
    assert Store(store.root, namespaces=CLI_NAMESPACES).refs.read(v1["group"]).refs == {"head": oid}
    assert fsck(Store(store.root, namespaces=CLI_NAMESPACES)).clean
