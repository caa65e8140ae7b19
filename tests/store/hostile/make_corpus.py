"""Generate the hostile-bundle corpus in this directory (and its MANIFEST.json).

    .venv/bin/python tests/store/hostile/make_corpus.py [--check] [--explain [NAME]]

Every file is built byte by byte from the format's pure functions, with
every checksum correct except where the defect under test is, so each file
exercises one rule. Entries are stored raw or as hand-assembled zstd frames
(raw and RLE blocks), so the bytes do not depend on the zstd library's
compressor: regenerating gives the same files (``--check`` compares them;
the test suite does too). ``MANIFEST.json`` maps each file to a substring
of the one-line error it must produce. ``--explain`` prints ``valid.kxb``
field by field (the example in the spec).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import blake3  # noqa: E402

from kxen_agent.store import codec  # noqa: E402
from kxen_agent.store.objects import encode_object  # noqa: E402

ENTRY_MAGIC = b"\x8bKXE"
END_MAGIC = b"\x8bKXZ"
ZSTD_MAGIC = bytes.fromhex("28b52ffd")


def crc(*parts: bytes) -> int:
    c = 0
    for p in parts:
        c = zlib.crc32(p, c)
    return c


# ------------------------------------------------------------------ objects

BLOB = encode_object("blob", b"hello, bundle\n")
MSG = encode_object("message", {"role": "user", "text": "hi", "attachment": BLOB.id})
SES = encode_object("session", {"name": "demo", "head": MSG.id})
REFS = {"ses/demo": {"head": MSG.id, "meta": SES.id}}
ORDER = [MSG, BLOB, SES]  # parents first: refs' targets, then what they link to
BIG = encode_object("blob", b"a" * 1000)  # compresses to a 27-byte hand-made frame


def zstd_raw_frame(payload: bytes, declared: int | None = None) -> bytes:
    """A single-segment zstd frame of one raw block (RFC 8878 §3.1.1)."""
    size = len(payload) if declared is None else declared
    fhd = bytes([0b1110_0000])  # FCS 8 bytes, single segment
    block = (1 | (0 << 1) | (len(payload) << 3)).to_bytes(3, "little")  # last, raw
    return ZSTD_MAGIC + fhd + size.to_bytes(8, "little") + block + payload


def zstd_rle_frame(declared: int, block_size: int, byte: int = 0) -> bytes:
    """A frame declaring ``declared`` bytes whose RLE block expands to ``block_size``."""
    fhd = bytes([0b1110_0000])
    block = (1 | (1 << 1) | (block_size << 3)).to_bytes(3, "little")  # last, RLE
    return ZSTD_MAGIC + fhd + declared.to_bytes(8, "little") + block + bytes([byte])


def zstd_two_block_frame(head: bytes, fill: int, count: int) -> bytes:
    """A frame of ``head`` (a raw block) then ``count`` copies of ``fill`` (an RLE block)."""
    fhd = bytes([0b1110_0000])
    b1 = (0 | (0 << 1) | (len(head) << 3)).to_bytes(3, "little")  # not last, raw
    b2 = (1 | (1 << 1) | (count << 3)).to_bytes(3, "little")  # last, RLE
    return ZSTD_MAGIC + fhd + (len(head) + count).to_bytes(8, "little") + b1 + head + b2 + bytes([fill])


def zstd_frame_without_size(payload: bytes) -> bytes:
    fhd = bytes([0b0000_0000])  # no FCS, not single segment: a window descriptor follows
    window = bytes([0x00])  # 1 KiB window
    block = (1 | (0 << 1) | (len(payload) << 3)).to_bytes(3, "little")
    return ZSTD_MAGIC + fhd + window + block + payload


def entry(oid: bytes, stored: bytes, *, method: int = 0, raw_len: int | None = None, stored_len: int | None = None,
          bad_crc: bool = False) -> bytes:
    raw_len = len(stored) if raw_len is None else raw_len
    stored_len = len(stored) if stored_len is None else stored_len
    head = ENTRY_MAGIC + struct.pack(">B32sQQ", method, oid, raw_len, stored_len)
    c = crc(head, stored) ^ (1 if bad_crc else 0)
    return head + struct.pack(">I", c) + stored


def stored_entry(obj, **kw) -> bytes:
    return entry(obj.id, obj.raw, **kw)


def pack_section(entries: list[bytes], *, dictionary: bytes = b"", version: int = 1, count: int | None = None,
                 pack_trailer: bytes | None = None) -> bytes:
    head = b"KXPK" + struct.pack(">II", version, len(dictionary)) + dictionary
    body = head + struct.pack(">I", crc(head)) + b"".join(entries)
    body += END_MAGIC + struct.pack(">Q", len(entries) if count is None else count)
    return body + (blake3.blake3(body).digest() if pack_trailer is None else pack_trailer)


def header_cbor(refs=REFS, *, caps=(), objects: int | None = None, size: int | None = None, order=ORDER) -> bytes:
    return codec.encode({
        "capabilities": list(caps),
        "objects": len(order) if objects is None else objects,
        "refs": refs,
        "size": sum(len(o.raw) for o in order) if size is None else size,
    })


def bundle(header: bytes | None = None, pack: bytes | None = None, *, version: int = 1, header_len: int | None = None,
           trailing: bytes = b"", bad_trailer: bool = False, header_crc: int | None = None) -> bytes:
    header = header_cbor() if header is None else header
    pack = pack_section([stored_entry(o) for o in ORDER]) if pack is None else pack
    prefix = b"KXBUNDLE" + struct.pack(">II", version, len(header) if header_len is None else header_len)
    hcrc = crc(prefix, header) if header_crc is None else header_crc
    body = prefix + header + struct.pack(">I", hcrc) + pack
    digest = blake3.blake3(body).digest()
    if bad_trailer:
        digest = bytes([digest[0] ^ 1]) + digest[1:]
    return body + digest + trailing


def flip(data: bytes, index: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[index] ^= 1 << bit
    return bytes(b)


# ------------------------------------------------------------------ JSON


def json_bundle(refs=REFS, order=ORDER, *, version=1, digest: str | None = None, elements=None, extra: str = "",
                count: int | None = None) -> bytes:
    hdr = header_cbor(refs, order=order, objects=count)
    d = blake3.blake3(b"kxen-bundle-json 1\n" + hdr)
    for o in order:
        d.update(o.id)
    head = {
        "format": "kxen-bundle", "version": version, "capabilities": [],
        "refs": {g: {n: v.hex() for n, v in r.items()} for g, r in refs.items()},
        "objectCount": len(order) if count is None else count, "objectBytes": sum(len(o.raw) for o in order),
    }
    els = elements if elements is not None else [
        json.dumps({"id": o.hex, "kind": o.kind, "bytes": base64.b64encode(o.raw).decode()}, separators=(",", ":"))
        for o in order
    ]
    text = json.dumps(head, separators=(",", ":"))[:-1] + ',"objects":[\n' + ",\n".join(els) + "\n]"
    text += ',"digest":"' + (digest or d.hexdigest()) + '"' + extra + "}\n"
    return text.encode()


# ------------------------------------------------------------------ the corpus


def corpus() -> dict[str, tuple[bytes, str]]:
    """file name -> (bytes, expected error substring; '' for a valid bundle)."""
    valid = bundle()
    c: dict[str, tuple[bytes, str]] = {}
    c["valid.kxb"] = (valid, "")
    c["valid.json"] = (json_bundle(), "")

    # Truncations: inside the prefix, the header, an entry header, an object, the trailers.
    hlen = len(header_cbor())
    first_entry = 16 + hlen + 4 + 16
    for name, cut in [
        ("truncated-prefix.kxb", 5),
        ("truncated-header.kxb", 16 + hlen // 2),
        ("truncated-entry-header.kxb", first_entry + 20),
        ("truncated-object.kxb", first_entry + 57 + 10),
        ("truncated-pack-trailer.kxb", len(valid) - 40),
        ("truncated-bundle-trailer.kxb", len(valid) - 1),
    ]:
        c[name] = (valid[:cut], "truncated")
    c["empty.kxb"] = (b"", "empty file")
    c["not-a-bundle.txt"] = (b"PK\x03\x04 this is a zip file, not a bundle", "not a kxen bundle")

    # Single flipped bits, one in each region (the test suite flips every bit).
    c["bitflip-header.kxb"] = (flip(valid, 16 + 3), "header checksum mismatch")
    c["bitflip-object.kxb"] = (flip(valid, first_entry + 57 + 3), "entry checksum mismatch")
    c["bitflip-pack-trailer.kxb"] = (flip(valid, len(valid) - 33), "pack trailer checksum mismatch")
    c["bitflip-bundle-trailer.kxb"] = (flip(valid, len(valid) - 1, 7), "bundle trailer checksum mismatch")

    # Object bytes that do not hash to the entry's id (every checksum right).
    fake = hashlib.sha256(b"not the blob").digest()
    msg_fake = encode_object("message", {"role": "user", "text": "hi", "attachment": fake})
    pack = pack_section([stored_entry(msg_fake), entry(fake, BLOB.raw), stored_entry(SES)])
    refs = {"ses/demo": {"head": msg_fake.id, "meta": SES.id}}
    order = [msg_fake, BLOB, SES]
    c["object-hash-mismatch.kxb"] = (bundle(header_cbor(refs, order=order), pack), "not to its id")

    # Refs or links to objects the bundle lacks; extra, misordered and duplicate objects.
    lost = hashlib.sha256(b"lost").digest()
    refs = {"ses/demo": {"head": MSG.id, "meta": SES.id, "old": lost}}
    c["ref-to-missing-object.kxb"] = (bundle(header_cbor(refs)), "ref ses/demo/old points to object")
    c["link-to-missing-object.kxb"] = (
        bundle(header_cbor(order=[MSG, SES]), pack_section([stored_entry(MSG), stored_entry(SES)])),
        "links to object " + BLOB.hex,
    )
    extra = encode_object("blob", b"not reachable from any ref")
    order = ORDER + [extra]
    c["unreachable-extra-object.kxb"] = (
        bundle(header_cbor(order=order), pack_section([stored_entry(o) for o in order])), "not reachable from the refs",
    )
    order = [BLOB, MSG, SES]
    c["child-before-parent.kxb"] = (
        bundle(header_cbor(order=order), pack_section([stored_entry(o) for o in order])), "not reachable from the refs",
    )
    order = ORDER + [BLOB]
    c["duplicate-entry.kxb"] = (
        bundle(header_cbor(order=order), pack_section([stored_entry(o) for o in order])), "appears twice",
    )
    c["count-mismatch.kxb"] = (bundle(header_cbor(objects=5)), "header declares 5 objects")
    c["size-mismatch.kxb"] = (bundle(header_cbor(size=7)), "object bytes")
    c["end-count-mismatch.kxb"] = (bundle(pack=pack_section([stored_entry(o) for o in ORDER], count=2)), "end record counts 2")

    # Ref names that try to leave the refs directory.
    for name, refs, expect in [
        ("refname-dotdot.kxb", {"ses/demo": {"..": MSG.id}}, "invalid ref name"),
        ("refname-traversal.kxb", {"ses/demo": {"../../../etc/passwd": MSG.id}}, "invalid ref name"),
        ("refname-absolute.kxb", {"ses/demo": {"/head": MSG.id}}, "invalid ref name"),
        ("refname-double-slash.kxb", {"ses/demo": {"a//b": MSG.id}}, "invalid ref name"),
        ("group-dotdot.kxb", {"ses/..": {"head": MSG.id}}, "invalid ref group"),
        ("group-traversal.kxb", {"../ses": {"head": MSG.id}}, "invalid ref group"),
        ("group-three-segments.kxb", {"ses/demo/x": {"head": MSG.id}}, "invalid ref group"),
        ("refname-lock.kxb", {"ses/demo": {"head.lock": MSG.id}}, "invalid ref name"),
    ]:
        order = [MSG, BLOB]
        c[name] = (bundle(header_cbor(refs, order=order), pack_section([stored_entry(o) for o in order])), expect)

    # Versions and capabilities from the future.
    c["unknown-version.kxb"] = (bundle(version=2), "unknown bundle version 2")
    c["unknown-capability.kxb"] = (bundle(header_cbor(caps=["shallow"])), "unknown capability 'shallow'")
    c["unknown-pack-version.kxb"] = (bundle(pack=pack_section([stored_entry(o) for o in ORDER], version=9)), "unknown pack version 9")
    c["unknown-method.kxb"] = (
        bundle(pack=pack_section([stored_entry(MSG, method=7), stored_entry(BLOB), stored_entry(SES)])), "unknown compression method 7",
    )
    c["capability-without-dictionary.kxb"] = (bundle(header_cbor(caps=["zstd-dict"])), "disagree")
    c["header-length-2pow31.kxb"] = (bundle(header_len=1 << 31), "exceeds")

    # Sizes that would make a reader allocate without bound.
    big = entry(BLOB.id, b"x" * 16, method=1, raw_len=1 << 40, stored_len=16)
    c["entry-declares-2pow40.kxb"] = (bundle(pack=pack_section([stored_entry(MSG), big, stored_entry(SES)])), "1099511627776-byte object")
    c["entry-stored-2pow40.kxb"] = (
        bundle(pack=pack_section([stored_entry(MSG), entry(BLOB.id, BLOB.raw, raw_len=len(BLOB.raw), stored_len=1 << 40), stored_entry(SES)])),
        "entry stores 1099511627776 bytes",
    )
    big_frame = zstd_two_block_frame(b"blob 1000\x00", ord("a"), 1000)
    big_refs = {"ses/big": {"head": BIG.id}}
    big_header = header_cbor(big_refs, order=[BIG])

    def big_bundle(stored: bytes) -> bytes:
        return bundle(big_header, pack_section([entry(BIG.id, stored, method=1, raw_len=len(BIG.raw))]))

    c["valid-zstd.kxb"] = (big_bundle(big_frame), "")
    c["zstd-declares-2pow40.kxb"] = (big_bundle(zstd_raw_frame(b"blob 100", declared=1 << 40)), "zstd frame declares 1099511627776 bytes")
    lying = zstd_rle_frame(declared=len(BLOB.raw), block_size=128 * 1024)
    c["zstd-expands-past-declared.kxb"] = (
        bundle(pack=pack_section([stored_entry(MSG), entry(BLOB.id, lying, method=1, raw_len=len(BLOB.raw)), stored_entry(SES)])),
        "does not decompress",
    )
    nosize = zstd_frame_without_size(BLOB.raw)
    c["zstd-without-size.kxb"] = (
        bundle(pack=pack_section([stored_entry(MSG), entry(BLOB.id, nosize, method=1, raw_len=len(nosize)), stored_entry(SES)])),
        "declares no size",
    )
    c["zstd-second-frame.kxb"] = (big_bundle(big_frame + big_frame), "not decompress")
    c["zstd-trailing-byte.kxb"] = (big_bundle(big_frame + b"\x00"), "not decompress")

    # CBOR bombs, in the header and inside an object (whose id is right).
    deep = b"\x81" * 10_000 + b"\x00"
    c["cbor-deep-header.kxb"] = (bundle(deep), "nesting deeper than 64")
    huge = bytes.fromhex("9b0000000100000000")  # an array declaring 2**32 elements
    c["cbor-2pow32-header.kxb"] = (bundle(huge), "4294967296 elements")
    for name, body, expect in [
        ("cbor-deep-object.kxb", deep, "nesting deeper than 64"),
        ("cbor-2pow32-object.kxb", huge, "4294967296 elements"),
        ("cbor-map-2pow32-object.kxb", bytes.fromhex("bb0000000100000000"), "4294967296 entries"),
    ]:
        raw = b"message %d\x00" % len(body) + body
        oid = blake3.blake3(raw).digest()
        refs = {"ses/demo": {"head": oid}}
        hdr = codec.encode({"capabilities": [], "objects": 1, "refs": refs, "size": len(raw)})
        c[name] = (bundle(hdr, pack_section([entry(oid, raw)])), expect)

    c["trailing-garbage.kxb"] = (bundle(trailing=b"\x00garbage"), "trailing garbage")
    c["header-not-a-map.kxb"] = (bundle(codec.encode([1, 2, 3])), "header is not a map")
    c["header-unknown-key.kxb"] = (
        bundle(codec.encode({"capabilities": [], "objects": 3, "refs": REFS, "size": 1, "env": "PATH"})), "header keys",
    )

    # JSON form.
    vj = json_bundle()
    c["truncated.json"] = (vj[: len(vj) // 2], "truncated")
    c["json-trailing-garbage.json"] = (vj + b"{}", "trailing garbage")
    tampered = encode_object("blob", b"hello, bundlf\n")
    els = [json.dumps({"id": o.hex, "kind": o.kind, "bytes": base64.b64encode(tampered.raw if o is BLOB else o.raw).decode()},
                      separators=(",", ":")) for o in ORDER]
    c["json-object-hash-mismatch.json"] = (json_bundle(elements=els), "not to its id")
    c["json-digest-mismatch.json"] = (json_bundle(digest="0" * 64), "digest mismatch")
    c["json-deep.json"] = (b'{"format":' + b"[" * 10_000 + b"]" * 10_000 + b"}", "nested too deeply")
    c["json-duplicate-key.json"] = (json_bundle(extra=',"version":1'), "duplicate JSON key")
    c["json-unknown-key.json"] = (json_bundle(extra=',"environment":{"OPENAI_API_KEY":"x"}'), "unknown key")
    c["json-float-version.json"] = (json_bundle().replace(b'"version":1', b'"version":1.0'), "not an integer")
    c["json-huge-integer.json"] = (json_bundle().replace(b'"version":1', b'"version":' + b"9" * 5000), "invalid JSON value")
    c["json-count-2pow32.json"] = (json_bundle(count=1 << 32), "header declares 4294967296 objects")
    upper = [json.dumps({"id": o.hex.upper() if o is MSG else o.hex, "kind": o.kind, "bytes": base64.b64encode(o.raw).decode()},
                        separators=(",", ":")) for o in ORDER]
    c["json-uppercase-id.json"] = (json_bundle(elements=upper), "lower-case hex")
    b64 = base64.b64encode(BLOB.raw).decode()
    assert b64.endswith("=")
    # The last character before '=' carries unused bits: set one (same bytes, another spelling).
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = b64.rstrip("=")[-1]
    pad = len(b64) - len(b64.rstrip("="))
    spelled = b64.rstrip("=")[:-1] + alphabet[alphabet.index(last) | 1] + "=" * pad
    els = [json.dumps({"id": o.hex, "kind": o.kind, "bytes": spelled if o is BLOB else base64.b64encode(o.raw).decode()},
                      separators=(",", ":")) for o in ORDER]
    c["json-noncanonical-base64.json"] = (json_bundle(elements=els), "canonical base64")
    els = [json.dumps({"id": o.hex, "kind": "blob" if o is MSG else o.kind, "bytes": base64.b64encode(o.raw).decode()},
                      separators=(",", ":")) for o in ORDER]
    c["json-kind-mismatch.json"] = (json_bundle(elements=els), "kind says 'blob'")
    c["json-refname-dotdot.json"] = (json_bundle({"ses/demo": {"a/../b": MSG.id}}, [MSG, BLOB]), "invalid ref name")
    c["json-duplicate-object.json"] = (json_bundle(order=ORDER + [BLOB]), "appears twice")
    c["json-unknown-version.json"] = (json_bundle(version=2), "unknown bundle version 2")
    c["json-not-utf8.json"] = (b'{"format":"\xff\xfe"}', "not UTF-8")
    return c


def write(directory: str = HERE) -> dict[str, str]:
    manifest = {}
    for name, (data, expect) in sorted(corpus().items()):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
        manifest[name] = expect
    with open(os.path.join(directory, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


def check(directory: str = HERE) -> list[str]:
    """Names of corpus files whose bytes differ from what this script generates."""
    bad = []
    for name, (data, _expect) in sorted(corpus().items()):
        try:
            with open(os.path.join(directory, name), "rb") as f:
                if f.read() != data:
                    bad.append(name)
        except FileNotFoundError:
            bad.append(name)
    return bad


def explain(data: bytes) -> str:
    """The pack-form bundle ``data``, field by field (for the spec's example)."""
    lines = []
    pos = 0

    def field_(n: int, what: str, show: str | None = None) -> bytes:
        nonlocal pos
        chunk = data[pos : pos + n]
        hx = chunk.hex()
        if len(hx) > 64:
            hx = hx[:60] + "…"
        lines.append(f"{pos:5d} {n:4d}  {hx:<64}  {what}{'' if show is None else ': ' + show}")
        pos += n
        return chunk

    field_(8, "bundle magic", repr(data[:8]))
    (v,) = struct.unpack(">I", field_(4, "bundle version"))
    lines[-1] += f" = {v}"
    (hl,) = struct.unpack(">I", field_(4, "header length"))
    lines[-1] += f" = {hl}"
    hdr = codec.decode(data[pos : pos + hl], links_only=True)
    shown = json.dumps(hdr, default=lambda b: b.hex()[:12] + "…")
    field_(hl, "header, strict CBOR", shown)
    field_(4, "CRC-32 of prefix and header")
    field_(4, "pack magic", "'KXPK'")
    field_(4, "pack version", "1")
    (dl,) = struct.unpack(">I", field_(4, "dictionary length"))
    lines[-1] += f" = {dl}"
    if dl:
        field_(dl, "zstd dictionary")
    field_(4, "CRC-32 of the pack header")
    while data[pos : pos + 4] == ENTRY_MAGIC:
        field_(4, "entry magic")
        field_(1, "method", {0: "0 = stored", 1: "1 = zstd", 2: "2 = zstd + dictionary"}[data[pos]])
        oid = field_(32, "object id")
        (raw_len,) = struct.unpack(">Q", field_(8, "object length"))
        lines[-1] += f" = {raw_len}"
        (sl,) = struct.unpack(">Q", field_(8, "stored length"))
        lines[-1] += f" = {sl}"
        field_(4, "CRC-32 of entry header and stored bytes")
        field_(sl, "stored bytes", repr(data[pos : pos + min(sl, 40)]) + ("…" if sl > 40 else ""))
        del oid
    field_(4, "end magic")
    (n,) = struct.unpack(">Q", field_(8, "entry count"))
    lines[-1] += f" = {n}"
    field_(32, "pack trailer: BLAKE3-256 of the pack section before it")
    field_(32, "bundle trailer: BLAKE3-256 of every byte before it")
    assert pos == len(data)
    return "\n".join(lines)


if __name__ == "__main__":
    if "--explain" in sys.argv:
        rest = sys.argv[sys.argv.index("--explain") + 1 :]
        print(explain(corpus()[rest[0] if rest else "valid.kxb"][0]))
    elif "--check" in sys.argv:
        bad = check()
        print("corpus up to date" if not bad else f"out of date: {bad}")
        sys.exit(1 if bad else 0)
    else:
        m = write()
        print(f"wrote {len(m)} files to {HERE}")
