"""Checkpoints in the JSON form of a bundle (``objects_spec.md`` §12.7a, vectors §13.5), hostile cases first.

Each ``json-checkpoints:`` block of the spec is put into a real JSON-form bundle (its ``digest`` recomputed as
the spec says, so only the member is at fault) and read back: accepted with the decoded bytes, or refused with
the block's reason. Then the member's own bounds: the capability without the member and the member without the
capability, a member that is not a string, a digest that does not cover it, a Git bundle over the limit (on
export, with the real limit, and on import, with the reader's limit lowered); each refusal is one line and
imports nothing (``tests/remote/test_checkpoint_travel_json.py`` refuses through ``session import``).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import blake3
import pytest

from kxen_agent.store import Store
from kxen_agent.store.bundle import BadBundle, export_bundle, import_bundle, verify_bundle
from kxen_agent.store.bundle import json_form
from kxen_agent.store.bundle.json_form import MAX_JSON_CHECKPOINT_BYTES

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"
_FENCE = re.compile(r"^```[^\n]*\n(json-checkpoints: .*?)^```[ \t]*$", re.S | re.M)
BLOCKS = [dict(line.split(": ", 1) for line in b.splitlines()) for b in _FENCE.findall(SPEC.read_text())]
GIT = b"# v2 git bundle\n\n"  # the shortest Git bundle: no references, no pack


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, bytes]:
    """A store, a JSON-form bundle of it with ``GIT`` as checkpoints (parsed), and its content digest's preimage."""
    root = tmp_path_factory.mktemp("jsonckp")
    s = Store(str(root / "s"))
    with s.step("ses/a") as step:
        blob = step.put("blob", b"hello\n")
        step.update("head", None, step.put("message", {"role": "user", "text": "hi", "out": blob}))
        step.commit("test")
    plain = export_bundle(s, ["ses/a"], str(root / "plain.json"), fmt="json")
    info = export_bundle(s, ["ses/a"], str(root / "with.json"), fmt="json", git_section=(io.BytesIO(GIT), len(GIT)))
    assert info.content_digest == plain.digest == plain.content_digest != info.digest
    doc = json.loads((root / "with.json").read_text())
    return root, doc, bytes.fromhex(plain.digest)


def _digest(doc: dict, git: bytes | None) -> str:
    """The digest §12.7a says: the content digest's bytes (rebuilt by the writer), then the section's bytes."""
    from kxen_agent.store.bundle.header import _Header

    refs = {g: {n: bytes.fromhex(h) for n, h in r.items()} for g, r in doc["refs"].items()}
    h = _Header((), refs, doc["objectCount"], doc["objectBytes"]).content_digest()
    for o in doc["objects"]:
        h.update(bytes.fromhex(o["id"]))
    if git is not None:
        h.update(b"KXGITCKP" + len(git).to_bytes(8, "big") + git)
    return h.hexdigest()


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return path


def _refused(path: Path, why: str, tmp_path: Path) -> None:
    """Verify and import both refuse with ``why``; the import writes nothing into an existing store."""
    with pytest.raises(BadBundle, match=re.escape(why)) as verified:
        verify_bundle(str(path))
    assert "\n" not in str(verified.value)
    dst = Store(str(tmp_path / "dst"))
    with pytest.raises(BadBundle, match=re.escape(why)):
        import_bundle(dst, str(path))
    s = Store(dst.root)
    assert list(s.refs.groups()) == [] and list(s.iter_ids()) == []
    assert not os.path.isdir(s.pack_dir) or os.listdir(s.pack_dir) == []


def test_the_spec_has_the_vectors() -> None:
    assert {b["json-checkpoints"] for b in BLOCKS} == {"shortest", "not-canonical-base64", "not-base64",
                                                       "not-a-git-bundle"}


def test_the_writer_writes_the_member_and_the_digest_the_spec_says(made: tuple[Path, dict, bytes]) -> None:
    root, doc, _ = made
    text = (root / "with.json").read_text()
    assert list(doc) == ["format", "version", "capabilities", "refs", "objectCount", "objectBytes", "objects",
                         "checkpoints", "digest"]
    assert doc["capabilities"] == ["git-checkpoints"] and doc["checkpoints"] == "IyB2MiBnaXQgYnVuZGxlCgo="
    assert doc["digest"] == _digest(doc, GIT)
    got = verify_bundle(str(root / "with.json"))
    assert got.checkpoint_data == GIT and got.checkpoints == (text.index('"IyB2'), len(GIT))
    assert got.to_json()["checkpointBytes"] == len(GIT) and got.digest == doc["digest"]


@pytest.mark.parametrize("vec", BLOCKS, ids=[b["json-checkpoints"] for b in BLOCKS])
def test_vector(vec: dict[str, str], made: tuple[Path, dict, bytes], tmp_path: Path) -> None:
    _, doc, _ = made
    b64 = vec["checkpoints"]
    try:
        git = json_form.base64.b64decode(b64, validate=True)
    except ValueError:
        git = None
    doc = {**doc, "checkpoints": b64, "digest": _digest(doc, git if git is not None else b"")}
    path = _write(tmp_path / "v.json", doc)
    if vec["result"].startswith("accepted"):
        assert vec["result"] == f"accepted, {len(git)} bytes"
        assert bytes.fromhex(vec["digest-tail"]) == b"KXGITCKP" + len(git).to_bytes(8, "big") + git
        res = import_bundle(Store(str(tmp_path / "dst")), str(path))
        assert res.groups == {"ses/a": "created"} and res.info.checkpoint_data == git
    else:
        _refused(path, re.fullmatch(r"refused \((.*)\)", vec["result"]).group(1), tmp_path)  # type: ignore[union-attr]


def test_capability_and_member_go_together(made: tuple[Path, dict, bytes], tmp_path: Path) -> None:
    _, doc, _ = made
    no_member = {k: v for k, v in doc.items() if k != "checkpoints"}
    _refused(_write(tmp_path / "a.json", no_member),
             "the git-checkpoints capability is declared but the bundle has no checkpoints member", tmp_path)
    _refused(_write(tmp_path / "b.json", {**doc, "capabilities": []}),
             "a checkpoints member without the git-checkpoints capability", tmp_path)
    _refused(_write(tmp_path / "c.json", {**doc, "capabilities": ["git-checkpoints", "git-checkpoints"]}),
             "capabilities name one twice", tmp_path)
    _refused(_write(tmp_path / "d.json", {**doc, "checkpoints": 17}),
             "checkpoints must be a string", tmp_path)


def test_the_digest_covers_the_checkpoints(made: tuple[Path, dict, bytes], tmp_path: Path) -> None:
    _, doc, content = made
    other = b"# v2 git bundle\n\n\n"  # a Git bundle still, one byte longer: only the digest can tell
    altered = {**doc, "checkpoints": json_form.base64.b64encode(other).decode()}
    _refused(_write(tmp_path / "a.json", altered),
             "digest mismatch: the refs, the list of objects or the checkpoints were altered", tmp_path)
    # The content digest alone (the digest without checkpoints) does not do either.
    _refused(_write(tmp_path / "b.json", {**doc, "digest": content.hex()}),
             "digest mismatch: the refs, the list of objects or the checkpoints were altered", tmp_path)
    assert blake3.blake3(b"").hexdigest() != doc["digest"]  # (the digest is a real BLAKE3, not a constant)


def test_export_refuses_a_git_bundle_over_the_limit_and_writes_nothing(made: tuple[Path, dict, bytes],
                                                                      tmp_path: Path) -> None:
    root, _, _ = made
    s = Store(str(root / "s"))
    out = tmp_path / "big.json"
    # The length is judged before a byte of it is read: an empty file claiming one byte more than the limit.
    with pytest.raises(Exception, match=r"more than the JSON form of a bundle carries \(67108864"):
        export_bundle(s, ["ses/a"], str(out), fmt="json", git_section=(io.BytesIO(b""), MAX_JSON_CHECKPOINT_BYTES + 1))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_reader_bounds_the_member_before_holding_it(made: tuple[Path, dict, bytes], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, doc, _ = made
    path = _write(tmp_path / "long.json", doc)  # valid: 24 base64 characters
    assert verify_bundle(str(path)).checkpoint_data == GIT
    monkeypatch.setattr(json_form, "_MAX_CKP_B64", 20)  # the limit lowered below this member
    _refused(path, "a JSON value longer than 22 characters", tmp_path)
