"""The envelopes a bundle may travel in: signed (ours) and encrypted (age).

Normative text: ``objects_spec.md`` §12.14. A bundle (pack or JSON form)
is never changed by an envelope; an envelope wraps its exact bytes:

- the *signed envelope*: :data:`SIGNED_MAGIC`, a version byte, the length of
  an SSH signature (``ssh-keygen -Y sign`` with the namespace
  :data:`SIGNATURE_NAMESPACE`, armored, as Git's ``gpg.format=ssh`` writes
  it), the signature, then the bundle's bytes — what it signs;
- the *encrypted envelope*: an age file (``age-encryption.org/v1``, binary,
  not armored) whose plaintext is a bundle or a signed envelope (signed
  before encrypted, so the signature names who wrote the bundle, not who
  encrypted it).

This module is pure: bytes in, values out. It never opens a file, never
runs ``ssh-keygen``, never imports an age implementation (the session
layer's ``share`` module does those).
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

from .header import BUNDLE_MAGIC, BadBundle

__all__ = [
    "AGE_ARMOR_MAGIC",
    "AGE_MAGIC",
    "MAX_SIGNATURE_SIZE",
    "SIGNATURE_NAMESPACE",
    "SIGNED_HEAD_SIZE",
    "SIGNED_MAGIC",
    "SIGNED_READ_SIZE",
    "SIGNED_VERSION",
    "SshSignature",
    "age_stanza_types",
    "encode_signed_head",
    "envelope_kind",
    "parse_signed_head",
    "parse_ssh_signature",
]

#: The first bytes of an age file (its version line), binary form.
AGE_MAGIC = b"age-encryption.org/v1\n"
#: The first bytes of an ASCII-armored age file: not written, named when refused.
AGE_ARMOR_MAGIC = b"-----BEGIN AGE ENCRYPTED FILE-----"
#: The first bytes of a signed envelope (the same length as ``KXBUNDLE``).
SIGNED_MAGIC = b"KXSIGNED"
SIGNED_VERSION = 1
#: The ``-n`` namespace of every bundle signature: a signature made for
#: Git commits, files or anything else never verifies as a bundle's.
SIGNATURE_NAMESPACE = "kxen-agent-bundle"
#: magic, version (u8), signature length (u32, big-endian).
SIGNED_HEAD_SIZE = len(SIGNED_MAGIC) + 1 + 4
#: An armored RSA-8192 signature is about 1.6 KB; anything past this is not one.
MAX_SIGNATURE_SIZE = 1 << 16
#: What :func:`parse_signed_head` needs of a file at most: the head, the signature, the signed bytes' magic.
SIGNED_READ_SIZE = SIGNED_HEAD_SIZE + MAX_SIGNATURE_SIZE + len(BUNDLE_MAGIC)

_ARMOR_BEGIN = b"-----BEGIN SSH SIGNATURE-----"
_ARMOR_END = b"-----END SSH SIGNATURE-----"


def envelope_kind(head: bytes) -> str | None:
    """``"age"``, ``"signed"`` or None (not an envelope: a bundle, or nothing we know) from a file's first bytes.

    ``head`` must hold at least ``len(AGE_MAGIC)`` bytes when the file does.
    """
    if head.startswith(AGE_MAGIC):
        return "age"
    if head.startswith(SIGNED_MAGIC):
        return "signed"
    if head.startswith(AGE_ARMOR_MAGIC):
        return "age-armored"
    return None


def age_stanza_types(head: bytes) -> list[str]:
    """The recipient stanza types of an age file's header (``X25519``, ``ssh-ed25519``, ``ssh-rsa``...), from its first bytes.

    Grease stanzas (random types ending ``-grease``, which age writers add so
    that readers stay lenient) are left out; a header cut short by ``head``
    gives the stanzas seen so far.
    """
    out = []
    for line in head.split(b"\n---", 1)[0].split(b"\n"):
        if line.startswith(b"-> "):
            kind = line[3:].split(b" ", 1)[0].decode("ascii", "replace")
            if not kind.endswith("-grease"):
                out.append(kind)
    return out


def encode_signed_head(signature: bytes) -> bytes:
    """The bytes before the bundle in a signed envelope."""
    if not signature.startswith(_ARMOR_BEGIN) or len(signature) > MAX_SIGNATURE_SIZE:
        raise ValueError("not an armored SSH signature of at most 64 KiB")
    return SIGNED_MAGIC + bytes([SIGNED_VERSION]) + struct.pack(">I", len(signature)) + signature


def parse_signed_head(data: bytes, where: str) -> tuple[bytes, int]:
    """The signature and the offset of the signed bytes, from the first bytes of a signed envelope.

    ``data`` holds at least the head, the signature and 8 more bytes when
    the file does (:data:`SIGNED_READ_SIZE` bytes are always enough).
    Raises :class:`BadBundle` naming the first problem and its offset.
    """
    if not data.startswith(SIGNED_MAGIC):
        raise BadBundle(where, "not a signed bundle envelope", 0)
    if len(data) < SIGNED_HEAD_SIZE:
        raise BadBundle(where, f"truncated: the file ends after {len(data)} bytes, inside the signed envelope's head",
                        len(data))
    version = data[len(SIGNED_MAGIC)]
    if version != SIGNED_VERSION:
        raise BadBundle(where, f"signed envelope version {version}, this kxen-agent reads version {SIGNED_VERSION} "
                        "(upgrade kxen-agent)", len(SIGNED_MAGIC))
    (size,) = struct.unpack_from(">I", data, len(SIGNED_MAGIC) + 1)
    if not 0 < size <= MAX_SIGNATURE_SIZE:
        raise BadBundle(where, f"signature length {size}, not 1 to {MAX_SIGNATURE_SIZE}", len(SIGNED_MAGIC) + 1)
    end = SIGNED_HEAD_SIZE + size
    if len(data) < end:
        raise BadBundle(where, f"truncated: the file ends after {len(data)} bytes, inside the signature", len(data))
    sig = data[SIGNED_HEAD_SIZE:end]
    parse_ssh_signature(sig, where, SIGNED_HEAD_SIZE)  # its shape and namespace, before anything runs on it
    rest = data[end:end + len(BUNDLE_MAGIC)]
    if rest in (SIGNED_MAGIC, AGE_MAGIC[:len(BUNDLE_MAGIC)]):  # (no bundle starts so: §12.7, §12.8)
        raise BadBundle(where, "a signed envelope holds another envelope, not a bundle", end)
    return sig, end


@dataclass(frozen=True)
class SshSignature:
    """What an armored SSH signature (the ``SSHSIG`` format of OpenSSH's PROTOCOL.sshsig) says of itself."""

    key_type: str  # "ssh-ed25519", "ssh-rsa", ...
    public_key: bytes  # the key's wire blob
    namespace: str
    hash_algorithm: str

    @property
    def fingerprint(self) -> str:
        """The signing key's fingerprint as ``ssh-keygen -l`` prints it (``SHA256:`` and unpadded base64)."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.public_key).digest()).decode().rstrip("=")


def parse_ssh_signature(armored: bytes, where: str, offset: int = 0) -> SshSignature:
    """Read an armored SSH signature's fields; refuse one not made for bundles (another namespace)."""
    body = armored.strip()
    if not (body.startswith(_ARMOR_BEGIN) and body.endswith(_ARMOR_END)):
        raise BadBundle(where, "the signature is not an armored SSH signature", offset)
    try:
        blob = base64.b64decode(b"".join(body[len(_ARMOR_BEGIN):-len(_ARMOR_END)].split()), validate=True)
    except ValueError:
        raise BadBundle(where, "the signature's base64 does not decode", offset) from None
    if not blob.startswith(b"SSHSIG") or len(blob) < 10:
        raise BadBundle(where, "the signature is not an SSHSIG blob", offset)
    pos = 10  # "SSHSIG" and its version (u32)
    fields = []
    for _ in range(5):  # public key, namespace, reserved, hash algorithm, signature
        if pos + 4 > len(blob):
            raise BadBundle(where, "the signature blob is truncated", offset)
        (n,) = struct.unpack_from(">I", blob, pos)
        if pos + 4 + n > len(blob):
            raise BadBundle(where, "the signature blob is truncated", offset)
        fields.append(blob[pos + 4:pos + 4 + n])
        pos += 4 + n
    key, namespace, _reserved, hash_alg, _sig = fields
    (tn,) = struct.unpack_from(">I", key, 0) if len(key) >= 4 else (0,)
    key_type = key[4:4 + tn].decode("ascii", "replace")
    ns = namespace.decode("utf-8", "replace")
    if ns != SIGNATURE_NAMESPACE:
        raise BadBundle(where, f"the signature was made for namespace {ns!r}, not {SIGNATURE_NAMESPACE!r}: "
                        "it is not a bundle signature", offset)
    return SshSignature(key_type, key, ns, hash_alg.decode("ascii", "replace"))
