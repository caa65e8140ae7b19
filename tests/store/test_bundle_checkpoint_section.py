"""The checkpoint section of a pack-form bundle (``objects_spec.md`` §12.7a, vectors §13.5).

Each ``checkpoint-section:`` block of the spec is written after a real pack section by ``export_bundle`` and read
back by ``verify_bundle``: the bytes between the pack and the bundle trailer are exactly the block's, the
capability is declared, the reader accepts or refuses as the block says; the JSON form refuses a section; an
import of a bundle with a section imports its objects as any other; a flipped byte in it fails the trailer.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from kxen_agent.store import Store
from kxen_agent.store.bundle import BadBundle, export_bundle, import_bundle, verify_bundle

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"
_FENCE = re.compile(r"^```[^\n]*\n(checkpoint-section: .*?)^```[ \t]*$", re.S | re.M)
BLOCKS = [dict(line.split(": ", 1) for line in b.splitlines()) for b in _FENCE.findall(SPEC.read_text())]


def _store(root: Path) -> Store:
    s = Store(str(root))
    with s.step("ses/a") as step:
        blob = step.put("blob", b"hello\n")
        step.update("head", None, step.put("message", {"role": "user", "text": "hi", "out": blob}))
        step.commit("test")
    return s


def test_the_spec_has_the_vectors() -> None:
    assert {b["checkpoint-section"] for b in BLOCKS} == {"shortest", "not-a-git-bundle"}


@pytest.mark.parametrize("vec", BLOCKS, ids=[b["checkpoint-section"] for b in BLOCKS])
def test_section_vector(vec: dict[str, str], tmp_path: Path) -> None:
    section = bytes.fromhex(vec["section"])
    assert section[:8] == b"KXGITCKP"
    n = int.from_bytes(section[8:16], "big")
    content = section[16:]
    assert len(content) == n
    store = _store(tmp_path / "s")
    plain = export_bundle(store, ["ses/a"], str(tmp_path / "plain.kxb"))
    out = tmp_path / "with.kxb"
    info = export_bundle(store, ["ses/a"], str(out), git_section=(io.BytesIO(content), n))
    assert "git-checkpoints" in info.capabilities and info.content_digest == plain.content_digest
    raw = out.read_bytes()
    assert raw[-32 - len(section):-32] == section  # right before the bundle trailer
    if vec["result"].startswith("accepted"):
        assert vec["result"] == f"accepted, {n} bytes"
        got = verify_bundle(str(out))
        assert got.checkpoints == (len(raw) - 32 - n, n) and got.to_json()["checkpointBytes"] == n
        assert raw[got.checkpoints[0]:got.checkpoints[0] + n] == content
        dst = Store(str(tmp_path / "dst"))
        res = import_bundle(dst, str(out))
        assert res.groups == {"ses/a": "created"} and res.info.checkpoints == got.checkpoints
        bad = tmp_path / "flipped.kxb"
        bad.write_bytes(raw[:-33] + bytes([raw[-33] ^ 1]) + raw[-32:])
        with pytest.raises(BadBundle, match="bundle trailer checksum mismatch"):
            verify_bundle(str(bad))
    else:
        why = re.fullmatch(r"refused \((.*)\)", vec["result"]).group(1)  # type: ignore[union-attr]
        with pytest.raises(BadBundle, match=re.escape(why)):
            verify_bundle(str(out))


def test_the_json_form_carries_no_section(tmp_path: Path) -> None:
    store = _store(tmp_path / "s")
    content = b"# v2 git bundle\n\n"
    with pytest.raises(Exception, match="pack form of a bundle only"):
        export_bundle(store, ["ses/a"], str(tmp_path / "b.json"), fmt="json",
                      git_section=(io.BytesIO(content), len(content)))
    assert not (tmp_path / "b.json").exists()
