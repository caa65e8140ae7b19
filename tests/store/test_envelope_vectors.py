"""The bundle envelopes' vector (objects_spec.md §12.14), read out of the spec, and the pure parser's refusals.

The vector's files are in ``tests/vectors/envelope/``; the signature is
checked with the real ``ssh-keygen``, the ciphertext opened with ``pyrage``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import blake3
import pytest

from kxen_agent.store.bundle import BadBundle
from kxen_agent.store.bundle.envelope import (SIGNATURE_NAMESPACE, age_stanza_types, encode_signed_head,
                                              envelope_kind, parse_signed_head, parse_ssh_signature)
from tests.helpers import require_tools

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "vectors" / "envelope"


def _spec_section() -> str:
    text = (ROOT / "objects_spec.md").read_text()
    return text[text.index("### 12.14 "):text.index("## 13. Test vectors")]


def _vector() -> tuple[dict[str, str], bytes]:
    section = _spec_section()
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    fields = dict(line.split(": ", 1) for line in next(b for b in blocks if b.startswith("envelope: ")).splitlines())
    signature = next(b for b in blocks if b.startswith("-----BEGIN SSH SIGNATURE-----")).encode()
    return fields, signature


VEC, SIGNATURE = _vector()


def _file(key: str) -> bytes:
    name, digest = VEC[key].split()
    data = (VECTORS / name).read_bytes()
    assert blake3.blake3(data).hexdigest() == digest, name
    return data


def test_the_signed_envelope_is_its_head_signature_and_bundle() -> None:
    bundle, signed = _file("bundle"), _file("signed")
    head = bytes.fromhex(VEC["signed-head"])
    assert signed == head + SIGNATURE + bundle
    assert encode_signed_head(SIGNATURE) == head + SIGNATURE
    sig, offset = parse_signed_head(signed, "v")
    assert (sig, signed[offset:]) == (SIGNATURE, bundle)
    s = parse_ssh_signature(sig, "v")
    assert (s.fingerprint, s.namespace, s.key_type) == (VEC["fingerprint"], SIGNATURE_NAMESPACE, "ssh-ed25519")
    assert [envelope_kind(x[:32]) for x in (bundle, signed, _file("encrypted"))] == [None, "signed", "age"]


def test_the_signature_verifies_with_the_allowed_signers_line_and_not_after_a_change(tmp_path: Path) -> None:
    require_tools("ssh-keygen")
    (tmp_path / "allowed").write_text(VEC["allowed-signers"] + "\n")
    (tmp_path / "sig").write_bytes(SIGNATURE)
    bundle = _file("bundle")
    principal = VEC["allowed-signers"].split()[0]

    def verify(data: bytes) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(tmp_path / "allowed"), "-I", principal,
                               "-n", SIGNATURE_NAMESPACE, "-s", str(tmp_path / "sig")], input=data,
                              capture_output=True)

    assert verify(bundle).returncode == 0
    assert verify(bundle[:-1] + bytes([bundle[-1] ^ 1])).returncode != 0


def test_the_ciphertext_decrypts_to_the_signed_envelope_with_either_identity() -> None:
    pyrage = pytest.importorskip("pyrage")
    encrypted, signed = _file("encrypted"), _file("signed")
    age_id = [ln for ln in (VECTORS / VEC["age-identity"]).read_text().splitlines() if ln.startswith("AGE-")][0]
    assert pyrage.decrypt(encrypted, [pyrage.x25519.Identity.from_str(age_id)]) == signed
    ssh_id = pyrage.ssh.Identity.from_buffer((VECTORS / VEC["ssh-identity"]).read_bytes())
    assert pyrage.decrypt(encrypted, [ssh_id]) == signed
    # rage also writes a "grease" stanza of random type (ignored by every reader, so readers stay lenient).
    assert age_stanza_types(encrypted) == ["X25519", "ssh-ed25519"]


@pytest.mark.parametrize("mutate, reason", [
    (lambda s: s[:10], "inside the signed envelope's head"),
    (lambda s: s[:8] + b"\x02" + s[9:], "signed envelope version 2"),
    (lambda s: s[:9] + b"\x00\x00\x00\x00" + s[13:], "signature length 0"),
    (lambda s: s[:200], "inside the signature"),
    (lambda s: s[:13] + s[13:40].replace(b"BEGIN", b"BEGxN") + s[40:], "not an armored SSH signature"),
    (lambda s: s[:327] + s, "holds another envelope"),
    (lambda s: s[:327] + b"age-encryption.org/v1\n", "holds another envelope"),
])
def test_the_parser_refuses_a_broken_head(mutate, reason: str) -> None:
    with pytest.raises(BadBundle, match=re.escape(reason)):
        parse_signed_head(mutate(_file("signed")), "v")


def test_a_signature_made_for_another_namespace_is_refused(tmp_path: Path) -> None:
    require_tools("ssh-keygen")
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    sig = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", "git"], input=b"x",
                         capture_output=True, check=True).stdout
    with pytest.raises(BadBundle, match="namespace 'git'"):
        parse_signed_head(encode_signed_head(sig) + _file("bundle"), "v")
