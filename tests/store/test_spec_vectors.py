"""The test vectors of ``objects_spec.md`` (§13, §12.8, §12.12, §14.7, §14.9), read from the spec itself.

Every fenced block of the spec that starts with ``vector:``, ``reject:``,
``example:``, ``layout:`` (a file described field by field), ``remote-url:``
or ``workspace-identity:``, and the JSON bundle example, is parsed here and
checked against the implementation (and the files in ``hostile/``), so the
spec and the code cannot drift apart: editing one byte of a vector in the
markdown makes a test below fail. Ids are also recomputed with the
``blake3`` package directly and CBOR bodies cross-checked with ``cbor2``,
so a vector is not only "what the code does" but agrees with independent
implementations.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import blake3
import cbor2
import pytest

from kxen_agent.store.objects import (
    KINDS,
    CorruptObject,
    compress_loose,
    decode_body,
    decompress_loose,
    encode_object,
    parse_object,
)
from kxen_agent.store.refs import (
    ReflogEntry,
    format_ref_file,
    format_reflog_line,
    parse_ref_file,
    parse_reflog,
)

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def _blocks() -> list[str]:
    return _FENCE.findall(SPEC.read_text(encoding="utf-8"))


def _fields(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        key, sep, value = line.partition(": ")
        assert sep, f"line without 'key: value' in a spec block: {line!r}"
        assert key not in out, f"key {key!r} repeated in a spec block"
        out[key] = value
    return out


def _tagged(tag: str) -> list[dict[str, str]]:
    return [_fields(b) for b in _blocks() if b.startswith(f"{tag}: ")]


VECTORS = _tagged("vector")
REJECTS = _tagged("reject")
EXAMPLES = _tagged("example")
REFLOG_LINES = [e for e in EXAMPLES if e["example"] == "reflog-line"]
REF_FILES = [e for e in EXAMPLES if e["example"] == "ref-file"]


def _same(a: Any, b: Any) -> bool:
    """Equality that also tells True from 1 and bytes from str, at any depth."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


# ------------------------------------------------------------------ §13.1


def test_spec_has_enough_vectors() -> None:
    assert len(VECTORS) >= 6
    names = [v["vector"] for v in VECTORS]
    assert len(set(names)) == len(names), "vector names must be unique"
    assert {v["kind"] for v in VECTORS} == set(KINDS), "every kind has a vector"
    for v in VECTORS:
        assert set(v) == {"vector", "kind", "value", "bytes", "id"}, v["vector"]


@pytest.mark.parametrize("vec", VECTORS, ids=[v["vector"] for v in VECTORS])
def test_vector_encodes_to_its_bytes_and_id(vec: dict[str, str]) -> None:
    value = ast.literal_eval(vec["value"])
    obj = encode_object(vec["kind"], value)
    assert obj.raw.hex() == vec["bytes"]
    assert obj.id.hex() == vec["id"]
    assert obj.kind == vec["kind"]
    # The id is plain BLAKE3 of the object bytes (§4), computed without the store.
    assert blake3.blake3(bytes.fromhex(vec["bytes"])).hexdigest() == vec["id"]


@pytest.mark.parametrize("vec", VECTORS, ids=[v["vector"] for v in VECTORS])
def test_vector_parses_back_to_its_value(vec: dict[str, str]) -> None:
    value = ast.literal_eval(vec["value"])
    raw = bytes.fromhex(vec["bytes"])
    obj = parse_object(raw, vec["vector"], expect_id=bytes.fromhex(vec["id"]))
    assert obj.kind == vec["kind"]
    assert _same(decode_body(obj), value)
    # The header is '<kind> <decimal length>\0' (§3.1).
    assert raw[: obj.body_offset] == b"%s %d\x00" % (vec["kind"].encode(), len(raw) - obj.body_offset)


@pytest.mark.parametrize("vec", [v for v in VECTORS if v["kind"] != "blob"], ids=lambda v: v["vector"])
def test_vector_body_agrees_with_cbor2(vec: dict[str, str]) -> None:
    value = ast.literal_eval(vec["value"])
    body = parse_object(bytes.fromhex(vec["bytes"]), vec["vector"]).body
    assert _same(cbor2.loads(body), value)
    assert cbor2.dumps(value, canonical=True) == body


@pytest.mark.parametrize("vec", VECTORS, ids=[v["vector"] for v in VECTORS])
def test_vector_survives_the_loose_frame(vec: dict[str, str]) -> None:
    raw = bytes.fromhex(vec["bytes"])
    assert decompress_loose(compress_loose(raw), vec["vector"]) == raw


# ------------------------------------------------------------------ §13.2


def _reject_bytes(rej: dict[str, str]) -> bytes:
    """``bytes``, then ``then`` (``h×n``: byte ``h`` repeated ``n`` times) when the vector has it."""
    raw = bytes.fromhex(rej["bytes"])
    if "then" in rej:
        unit, times = rej["then"].split("×")
        raw += bytes.fromhex(unit) * int(times)
    return raw


def test_spec_has_reject_vectors() -> None:
    assert len(REJECTS) >= 10
    for r in REJECTS:
        assert set(r) - {"then"} == {"reject", "bytes", "error"}, r["reject"]


@pytest.mark.parametrize("rej", REJECTS, ids=[r["reject"] for r in REJECTS])
def test_reject_vector_is_refused(rej: dict[str, str]) -> None:
    raw = _reject_bytes(rej)
    with pytest.raises(CorruptObject) as info:
        decode_body(parse_object(raw, rej["reject"]))
    assert info.value.reason == rej["error"]


def test_the_budget_vector_is_one_item_over_and_one_item_less_is_read() -> None:
    """``cbor-over-budget`` breaks the budget and nothing else: one element fewer decodes."""
    from kxen_agent.store import codec

    (rej,) = [r for r in REJECTS if r["reject"] == "cbor-over-budget"]
    body = parse_object(_reject_bytes(rej), "spec").body
    assert body[:5] == b"\x9a" + (codec.MAX_BODY_ITEMS).to_bytes(4, "big")
    under = b"\x9a" + (codec.MAX_BODY_ITEMS - 1).to_bytes(4, "big") + body[6:]
    assert codec.decode(under) == [0] * (codec.MAX_BODY_ITEMS - 1)
    assert codec.encode([0] * (codec.MAX_BODY_ITEMS - 1)) == under
    with pytest.raises(codec.EncodeError, match="value of 524289 data items, more than the 524288"):
        codec.encode([0] * codec.MAX_BODY_ITEMS)
    # Maps are charged two items an entry: 262143 entries and the map itself fit.
    keys = sorted((f"{i:05x}" for i in range(262143)), key=lambda k: (len(k), k))
    value = {k: 0 for k in keys}
    assert codec.decode(codec.encode(value)) == value
    with pytest.raises(codec.EncodeError):
        codec.encode({**value, "zzzzz": 0})


# ------------------------------------------------------------------ §13.3


def _entry(e: dict[str, str]) -> ReflogEntry:
    def oid(text: str) -> bytes | None:
        v = ast.literal_eval(text)
        return None if v is None else bytes.fromhex(v)

    return ReflogEntry(
        oid(e["old"]),
        oid(e["new"]),
        int(e["time_ns"]),
        int(e["fence"]),
        e["name"],
        ast.literal_eval(e["reason"]),
    )


def test_reflog_lines_are_byte_exact() -> None:
    assert REFLOG_LINES
    for e in REFLOG_LINES:
        entry = _entry(e)
        line = format_reflog_line(entry)
        assert line.hex() == e["bytes"]
        (back,) = parse_reflog(line, "spec")
        # §7.1, written out here: whitespace collapsed, then controls and surrogates as U+FFFD.
        printable = re.sub("[\x00-\x1f\x7f-\x9f\ud800-\udfff]", "\ufffd", " ".join(entry.reason.split()))
        assert back == ReflogEntry(entry.old, entry.new, entry.time_ns, entry.fence, entry.name, printable)


def test_a_reader_accepts_control_characters_written_before_the_rule() -> None:
    """§7.1: writers replace them, readers still take a line that holds them (older reflogs)."""
    (e,) = [r for r in REFLOG_LINES if r["group"] == "session/s-0002"]
    line = bytes.fromhex(e["bytes"]).replace("\ufffd".encode(), b"\x1b", 1)
    (back,) = parse_reflog(line, "spec")
    assert "\x1b" in back.reason


def test_ref_file_is_byte_exact_and_counts_its_reflog() -> None:
    assert REF_FILES
    for e in REF_FILES:
        refs = {k: bytes.fromhex(v) for k, v in ast.literal_eval(e["refs"]).items()}
        deleted = ast.literal_eval(e["deleted"])
        data = format_ref_file(refs, int(e["fence"]), int(e["log"]), deleted)
        assert data.hex() == e["bytes"]
        state = parse_ref_file(data, e["group"], "spec")
        assert (state.refs, state.fence, state.log_size, state.deleted_ns) == (
            refs,
            int(e["fence"]),
            int(e["log"]),
            deleted,
        )
        # The ref file's 'log' is the length of its group's reflog lines.
        lines = [bytes.fromhex(r["bytes"]) for r in REFLOG_LINES if r["group"] == e["group"]]
        assert sum(map(len, lines)) == int(e["log"])
        # Each ref's last reflog line ends at the ref's value (§7.2).
        last = {x.name: x.new for x in parse_reflog(b"".join(lines), "spec")}
        assert last == refs


def test_text_renderings_match_the_hex() -> None:
    blocks = _blocks()
    ref_text = [b for b in blocks if b.startswith("kxen-refs 1\n")]
    for e in REF_FILES:
        assert bytes.fromhex(e["bytes"]).decode("ascii") in ref_text
    log_text = [b for b in blocks if "<TAB>" in b]
    assert log_text
    whole = b"".join(bytes.fromhex(r["bytes"]) for r in REFLOG_LINES if r["group"] == "session/s-0001")
    assert log_text[0].replace("<TAB>", "\t").encode("utf-8") == whole


# ------------------------------------------------------------------ §12.8, §12.12: bundles, packs, index

HOSTILE = Path(__file__).resolve().parent / "hostile"
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)(?:\s+(.*))?$")


def _layouts() -> dict[str, list[tuple[int, int, str]]]:
    """``layout:`` blocks: name -> rows (offset, size, hex field); other lines continue a description."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    for block in _blocks():
        if not block.startswith("layout: "):
            continue
        first, _, rest = block.partition("\n")
        rows = []
        for line in rest.splitlines():
            m = _ROW.match(line)
            if m:
                rows.append((int(m.group(1)), int(m.group(2)), m.group(3)))
            else:
                assert line.startswith(" ") and line.strip(), f"bad layout line {line!r}"
        out[first[len("layout: ") :]] = rows
    return out


LAYOUTS = _layouts()


def _check_layout(name: str, data: bytes) -> None:
    rows = LAYOUTS[name]
    at = 0
    for off, size, field in rows:
        assert off == at, f"{name}: row at {off}, expected {at}"
        got = data[off : off + size]
        assert len(got) == size, f"{name}: row at {off} runs past the end"
        if "×" in field:
            unit, times = field.split("×")
            assert got == bytes.fromhex(unit) * int(times), f"{name}: row at {off}"
        elif field.endswith("…"):
            assert got.hex().startswith(field[:-1]), f"{name}: row at {off}"
        else:
            assert got.hex() == field, f"{name}: row at {off}"
        at = off + size
    assert at == len(data), f"{name}: the rows cover {at} of {len(data)} bytes"


def test_spec_has_the_bundle_layouts() -> None:
    assert set(LAYOUTS) == {"valid.kxb", "valid-zstd.kxb", "valid.kxb pack index"}


@pytest.mark.parametrize("name", ["valid.kxb", "valid-zstd.kxb"])
def test_bundle_layout_is_byte_exact(name: str) -> None:
    from kxen_agent.store.bundle import verify_bundle

    path = HOSTILE / name
    _check_layout(name, path.read_bytes())
    info = verify_bundle(str(path))
    assert info.digest == path.read_bytes()[-32:].hex()


def test_bundle_trailers_are_plain_blake3() -> None:
    data = (HOSTILE / "valid.kxb").read_bytes()
    assert blake3.blake3(data[:534]).digest() == data[534:]
    assert blake3.blake3(data[145:502]).digest() == data[502:534]
    assert blake3.blake3(data[350:372]).hexdigest() == data[298:330].hex()


def test_import_writes_the_pack_section_and_the_index_of_the_spec(tmp_path: Path) -> None:
    from kxen_agent.store import Store
    from kxen_agent.store.bundle import import_bundle

    data = (HOSTILE / "valid.kxb").read_bytes()
    store = Store(str(tmp_path / "state"))
    res = import_bundle(store, str(HOSTILE / "valid.kxb"))
    assert res.pack == data[502:534].hex()
    base = tmp_path / "state" / "objects" / "pack" / f"pack-{res.pack}"
    assert Path(str(base) + ".pack").read_bytes() == data[145:534]
    idx = Path(str(base) + ".idx").read_bytes()
    _check_layout("valid.kxb pack index", idx)
    assert blake3.blake3(idx[:-32]).digest() == idx[-32:]


def test_json_bundle_example_is_the_file_and_its_digest_recomputes() -> None:
    text = (HOSTILE / "valid.json").read_text(encoding="utf-8")
    (block,) = [b for b in _blocks() if b.startswith('{"format":"kxen-bundle"')]
    assert block == text
    import json

    doc = json.loads(text)
    header = (HOSTILE / "valid.kxb").read_bytes()[16:141]  # the same header map (§12.8)
    refs = {g: {n: bytes.fromhex(v) for n, v in r.items()} for g, r in doc["refs"].items()}
    value = {"capabilities": doc["capabilities"], "objects": doc["objectCount"], "refs": refs, "size": doc["objectBytes"]}
    assert cbor2.dumps(value, canonical=True) == header
    h = blake3.blake3(b"kxen-bundle-json 1\n" + header)
    for o in doc["objects"]:
        h.update(bytes.fromhex(o["id"]))
    assert h.hexdigest() == doc["digest"]


# ------------------------------------------------------------------ §14.7: workspace identity

REMOTE_URLS = _tagged("remote-url")
IDENTITIES = _tagged("workspace-identity")


def test_spec_has_workspace_vectors() -> None:
    assert len(REMOTE_URLS) >= 5
    assert {i["workspace-identity"] for i in IDENTITIES} == {"git-remote", "git-roots", "git-unborn", "dir"}


@pytest.mark.parametrize("vec", REMOTE_URLS, ids=[v["remote-url"] for v in REMOTE_URLS])
def test_remote_url_normalisation(vec: dict[str, str]) -> None:
    from kxen_agent.session.workspace import normalize_remote_url

    assert set(vec) == {"remote-url", "normalized"}
    assert normalize_remote_url(ast.literal_eval(vec["remote-url"])) == ast.literal_eval(vec["normalized"])


@pytest.mark.parametrize("vec", IDENTITIES, ids=[f"{v['workspace-identity']}:{v['rel']}" for v in IDENTITIES])
def test_workspace_identity(vec: dict[str, str]) -> None:
    from kxen_agent.session import workspace

    assert set(vec) == {"workspace-identity", "key", "rel", "identity", "remote_hash"}
    tag, key, rel = vec["workspace-identity"], ast.literal_eval(vec["key"]), ast.literal_eval(vec["rel"])
    # The definition, computed here without the module ...
    raw = b"kxen-ws-v1\0" + tag.encode() + b"\0" + key.encode() + b"\0" + rel.encode()
    assert blake3.blake3(raw).hexdigest() == vec["identity"]
    # ... and by the module.
    assert workspace._identity(tag, key, rel) == vec["identity"]
    expected_remote = ast.literal_eval(vec["remote_hash"]) if vec["remote_hash"] == "None" else vec["remote_hash"]
    if tag == "git-remote":
        assert blake3.blake3(b"kxen-remote-v1\0" + key.encode()).hexdigest() == expected_remote
        assert workspace._remote_hash(key) == expected_remote
    else:
        assert expected_remote is None


# ------------------------------------------------------------------ §10.2: the FORMAT file

FORMAT_FILES = _tagged("format-file")


def test_spec_has_format_file_vectors() -> None:
    assert {f["opens"] for f in FORMAT_FILES} >= {"1", "2", "refused"}
    assert {f["format-file"] for f in FORMAT_FILES} >= {"leading-zero", "leading-zeros"}


@pytest.mark.parametrize("vec", FORMAT_FILES, ids=[v["format-file"] for v in FORMAT_FILES])
def test_format_file(vec: dict[str, str], tmp_path: Path) -> None:
    from kxen_agent.store import Store, fsck
    from kxen_agent.store.repo import StateDirError

    assert set(vec) == {"format-file", "bytes", "opens"}
    root = tmp_path / "state"
    root.mkdir()
    (root / "FORMAT").write_bytes(bytes.fromhex(vec["bytes"]))
    if vec["opens"] == "refused":
        with pytest.raises(StateDirError):
            Store(str(root))
        return
    store = Store(str(root))
    assert store.format_version == int(vec["opens"])
    if store.format_version == 1:
        assert fsck(store).clean


# ------------------------------------------------------------------ §5.4, §12.3: frames refused on their header

REJECT_FRAMES = _tagged("reject-frame")


def test_spec_has_frame_vectors() -> None:
    assert {v["reject-frame"] for v in REJECT_FRAMES} >= {"window-2pow31", "dictionary-id"}


@pytest.mark.parametrize("vec", REJECT_FRAMES, ids=[v["reject-frame"] for v in REJECT_FRAMES])
def test_frame_is_refused_as_a_loose_object_and_as_a_pack_entry(vec: dict[str, str]) -> None:
    from kxen_agent.store.pack import Decompressor

    assert set(vec) == {"reject-frame", "bytes", "error"}
    frame = bytes.fromhex(vec["bytes"])
    with pytest.raises(CorruptObject) as info:
        decompress_loose(frame, "spec")
    assert info.value.reason == vec["error"]
    # The same frame as a method-1 pack entry (§12.3): the same rule.
    import zstandard

    size = zstandard.get_frame_parameters(frame).content_size
    with pytest.raises(CorruptObject) as info:
        Decompressor(None).decompress_raw(1, size, frame, "spec")
    assert info.value.reason == vec["error"].replace("a loose object uses none", "a method-1 entry uses none")


def test_the_window_vector_holds_a_valid_object_that_a_small_window_reads() -> None:
    """Only the window is wrong: the same blocks under a single-segment header read back."""
    (vec,) = [v for v in REJECT_FRAMES if v["reject-frame"] == "window-2pow31"]
    frame = bytes.fromhex(vec["bytes"])
    single = frame[:4] + bytes([0b1110_0000]) + frame[6:]  # single segment: no window descriptor
    raw = decompress_loose(single, "spec")
    assert parse_object(raw, "spec").body == b"aaaaa"


# ------------------------------------------------------------------ §12.8: which form a file is

BUNDLE_STARTS = _tagged("bundle-start")


def test_spec_has_bundle_start_vectors() -> None:
    assert {v["bundle-start"] for v in BUNDLE_STARTS} >= {"json-after-64-whitespace", "json-after-65-whitespace"}


@pytest.mark.parametrize("vec", BUNDLE_STARTS, ids=[v["bundle-start"] for v in BUNDLE_STARTS])
def test_bundle_start(vec: dict[str, str], tmp_path: Path) -> None:
    from kxen_agent.store.bundle import BadBundle, verify_bundle
    from kxen_agent.store.bundle.json_form import _JsonBundleReader
    from kxen_agent.store.bundle.pack_form import _PackBundleReader
    from kxen_agent.store.bundle.verify import _open_reader
    from kxen_agent.store.fsio import OS_IO

    assert set(vec) == {"bundle-start", "bytes", "form"}
    start = bytes.fromhex(vec["bytes"])
    # The start of a valid bundle of each form, so that the form's reader gets past its first checks.
    valid = {"pack": (HOSTILE / "valid.kxb").read_bytes(), "json": (HOSTILE / "valid.json").read_bytes()}
    form = vec["form"]
    if form in valid:
        ws = len(start) - len(start.lstrip(b" \t\r\n"))
        data = start[:ws] + valid[form]
        path = tmp_path / "b"
        path.write_bytes(data)
        with open(path, "rb") as f:
            reader = _open_reader(str(path), f, OS_IO)
        assert isinstance(reader, _PackBundleReader if form == "pack" else _JsonBundleReader)
        assert verify_bundle(str(path)).format == form
    else:
        path = tmp_path / "b"
        path.write_bytes(start)
        with pytest.raises(BadBundle) as info:
            verify_bundle(str(path))
        assert form == f"refused ({info.value.reason})"


# ------------------------------------------------------------------ §11: fsck cases

FSCK_CASES = _tagged("fsck-case")


def test_spec_has_fsck_cases() -> None:
    assert {v["fsck-case"] for v in FSCK_CASES} >= {"file-directly-in-refs", "index-without-pack"}


@pytest.mark.parametrize("vec", FSCK_CASES, ids=[v["fsck-case"] for v in FSCK_CASES])
def test_fsck_case(vec: dict[str, str], tmp_path: Path) -> None:
    from kxen_agent.store import Store, fsck

    assert set(vec) == {"fsck-case", "files", "stray", "problems"}
    root = tmp_path / "state"
    Store(str(root), namespaces=("sessions",)).ensure_initialized()
    for rel in vec["files"].split():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    rep = fsck(Store(str(root), namespaces=("sessions",)))
    want_stray = [] if vec["stray"] == "none" else vec["stray"].split()
    assert sorted(os.path.relpath(p, root) for p in rep.stray_files) == sorted(want_stray)
    want_problems = [] if vec["problems"] == "none" else vec["problems"].split()
    assert [p.kind for p in rep.problems] == want_problems, [p.line() for p in rep.problems]


# ------------------------------------------------------------------ §12.7: the content digest

CONTENT_DIGESTS = _tagged("content-digest")


@pytest.mark.parametrize("vec", CONTENT_DIGESTS, ids=[v["content-digest"] for v in CONTENT_DIGESTS])
def test_content_digest_is_the_same_for_both_forms_and_names_the_import(vec: dict[str, str], tmp_path: Path) -> None:
    from kxen_agent.store import Store
    from kxen_agent.store.bundle import import_bundle, verify_bundle

    assert set(vec) == {"content-digest", "digest", "reason"}
    names = vec["content-digest"].split()
    assert len(names) == 2
    for name in names:
        info = verify_bundle(str(HOSTILE / name))
        assert info.content_digest == vec["digest"], name
        store = Store(str(tmp_path / name))
        import_bundle(store, str(HOSTILE / name))
        for group in info.refs:
            assert {e.reason for e in store.refs.reflog(group)} == {vec["reason"]}
    # The definition, computed here without the bundle package.
    data = (HOSTILE / names[0]).read_bytes()
    header = cbor2.loads(data[16:16 + int.from_bytes(data[12:16], "big")])
    header["capabilities"] = []
    h = blake3.blake3(b"kxen-bundle-json 1\n" + cbor2.dumps(header, canonical=True))
    import json

    for o in json.loads((HOSTILE / names[1]).read_text())["objects"]:
        h.update(bytes.fromhex(o["id"]))
    assert h.hexdigest() == vec["digest"]


def test_a_dictionary_does_not_change_the_content_digest(tmp_path: Path) -> None:
    """The pack form with zstd-dict and the JSON form of one export: one content digest."""
    from kxen_agent.store import RefUpdate, Store
    from kxen_agent.store.bundle import export_bundle, verify_bundle

    store = Store(str(tmp_path / "s"))
    prev = None
    for i in range(128):  # enough alike, enough of them: the pack trains a dictionary
        text = "".join(f"step {i}.{j}: module m{(i * j) % 17} built, {(i + j) % 13} warnings, see line {i * 31 + j}; "
                       for j in range(17))
        prev = store.put("message", {"text": text, **({"parent": prev} if prev else {})})
    store.refs.transaction("ses/many", [RefUpdate("head", None, prev)], reason="t")
    pack = export_bundle(store, ["ses/many"], str(tmp_path / "b.kxb"), fmt="pack")
    js = export_bundle(store, ["ses/many"], str(tmp_path / "b.json"), fmt="json")
    assert pack.capabilities == ("zstd-dict",) and js.capabilities == ()
    assert pack.digest != js.digest
    assert pack.content_digest == js.content_digest == js.digest
    assert verify_bundle(str(tmp_path / "b.kxb")).content_digest == pack.content_digest


# ------------------------------------------------------------------ §3.1: the header's grammar and regex


def test_the_header_regex_of_the_spec_is_its_grammar_and_the_readers_rule() -> None:
    from kxen_agent.store.objects import MAX_OBJECT_SIZE

    text = SPEC.read_text(encoding="utf-8")
    (pattern,) = re.findall(r"`\^(\(blob\|message[^`]*)`", text)
    rx = re.compile(pattern.encode().replace(b"\\x00", b"\x00"))
    for digits in ["0", "7", "00", "07", "10", "67108864", "67108865", "99999999", "999999999", "1" + "0" * 19]:
        n = int(digits)
        header = b"blob " + digits.encode() + b"\x00"
        legal = rx.fullmatch(header) is not None and n <= MAX_OBJECT_SIZE
        # The grammar: "0" / %x31-39 *7DIGIT, and the limit.
        assert legal == (re.fullmatch(r"0|[1-9][0-9]{0,7}", digits) is not None and n <= MAX_OBJECT_SIZE)
        body = b"a" * n if n <= MAX_OBJECT_SIZE else b"a"
        try:
            parse_object(header + body, "spec")
            accepted = True
        except CorruptObject:
            accepted = False
        assert accepted == legal, digits
