"""Private, resumable sharing: sealing a bundle in its envelopes, and opening them.

The byte formats are :mod:`kxen_agent.store.bundle.envelope`'s
(``objects_spec.md`` §12.14); this module does the I/O around them:

- encryption and decryption through ``pyrage`` (the Python binding of the
  Rust ``age`` crate), imported only when a bundle is encrypted or opened,
  to age recipients (``age1...``) and SSH public keys (``ssh-ed25519``,
  ``ssh-rsa``), with age identity files or SSH private keys;
- signatures through ``ssh-keygen -Y sign`` / ``-Y find-principals`` /
  ``-Y verify`` with the namespace ``kxen-agent-bundle``, as Git's
  ``gpg.format=ssh`` does (so an allowed-signers file written for Git works
  here, and a Git commit signature never verifies as a bundle's).

A sealed bundle is written as any bundle (temp file next to the target,
fsync, rename, fsync of the directory). Opening one writes the bundle inside
to a private temporary directory (0700, under ``$TMPDIR``), which is removed
when the caller is done: the bundle readers read files, and a decrypted
bundle must never be left beside the encrypted one.

It must never accept an envelope it cannot check when asked to check it:
with ``allowed_signers`` given, an unsigned bundle, an unknown signer and a
changed byte are all refused before anything is read from the bundle inside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterator

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store.bundle import BadBundle
from kxen_agent.store.bundle.envelope import (AGE_MAGIC, SIGNATURE_NAMESPACE, SIGNED_READ_SIZE, age_stanza_types,
                                              encode_signed_head, envelope_kind, parse_signed_head,
                                              parse_ssh_signature)
from kxen_agent.store.fsio import OS_IO, FileIO

__all__ = ["CannotDecrypt", "Opened", "Sealing", "SignatureCheck", "UntrustedSigner", "load_identities",
           "open_bundle", "parse_recipients", "seal_bundle", "sealing", "sign_payload"]

#: How long ``ssh-keygen`` may take (it reads the bundle once).
SSH_KEYGEN_TIMEOUT_S = 600
_COPY = 1 << 20


class CannotDecrypt(UsageError):
    """No identity given opens the encrypted bundle (or none was given); nothing was read from it."""


class UntrustedSigner(UsageError):
    """The bundle's signature is by a key the allowed-signers file does not name, or it is not signed."""


@dataclass(frozen=True)
class SignatureCheck:
    """Who signed a bundle, and whether that was checked against an allowed-signers file."""

    key_type: str
    fingerprint: str
    principal: str | None  # the allowed-signers name, once checked
    checked: bool

    def line(self) -> str:
        if self.checked:
            return f"signature good, by {self.principal} ({self.key_type} key {self.fingerprint})"
        return f"signed by {self.key_type} key {self.fingerprint} (not checked: give --allowed-signers FILE)"

    def to_json(self) -> dict:
        return {"keyType": self.key_type, "fingerprint": self.fingerprint, "principal": self.principal,
                "checked": self.checked}


@dataclass(frozen=True)
class Opened:
    """A bundle file with its envelopes taken off: ``path`` is the bundle inside (or the file itself)."""

    path: str
    source: str
    encrypted: bool
    signature: SignatureCheck | None

    def envelope_json(self) -> dict:
        return {"encrypted": self.encrypted, "signature": self.signature.to_json() if self.signature else None}

    def restate(self, e: KxenError) -> KxenError:
        """``e`` with the temporary path it names replaced by the file the user gave."""
        if self.path != self.source and self.path in str(e):
            e.args = (str(e).replace(self.path, f"{self.source} (the bundle inside)"),)
        return e


def _pyrage():
    try:
        import pyrage  # noqa: PLC0415 — only encrypted bundles need it
    except ImportError:  # pragma: no cover — a runtime dependency
        raise KxenError("encrypted bundles need the pyrage package, which is not installed: "
                        "pip install 'pyrage>=1.4'") from None
    return pyrage


def _recipient(text: str, where: str):
    pyrage = _pyrage()
    try:
        if text.startswith("age1"):
            return pyrage.x25519.Recipient.from_str(text)
        if text.startswith(("ssh-ed25519 ", "ssh-rsa ")):
            return pyrage.ssh.Recipient.from_str(" ".join(text.split()[:2]))
    except pyrage.RecipientError as e:
        raise UsageError(f"--encrypt-to {where}: not a valid recipient ({e}); nothing was written") from None
    raise UsageError(f"--encrypt-to {where}: not an age recipient (age1...), an SSH public key "
                     "(ssh-ed25519 or ssh-rsa) or a file of them; nothing was written")


def parse_recipients(texts: list[str]) -> list:
    """pyrage recipients from ``--encrypt-to`` values: a key, or a file of keys (``~/.ssh/id_ed25519.pub``)."""
    out = []
    for text in texts:
        text = text.strip()
        path = os.path.expanduser(text)
        if not text.startswith(("age1", "ssh-")) and os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [(n, ln.strip()) for n, ln in enumerate(f, 1)]
            keys = [(n, ln) for n, ln in lines if ln and not ln.startswith("#")]
            if not keys:
                raise UsageError(f"--encrypt-to {text}: the file holds no recipient; nothing was written")
            out.extend(_recipient(ln, f"{text}:{n}") for n, ln in keys)
        else:
            out.append(_recipient(text, text))
    if not out:
        raise UsageError("--encrypt-to needs at least one recipient")
    return out


def load_identities(paths: list[str]) -> list:
    """pyrage identities from ``--identity`` files: age identity files or SSH private keys."""
    pyrage = _pyrage()
    out = []
    for given in paths:
        path = os.path.expanduser(given)
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except OSError as e:
            raise UsageError(f"--identity {given}: cannot read it: {e.strerror}; nothing was imported") from None
        if b"PRIVATE KEY-----" in data:
            try:
                out.append(pyrage.ssh.Identity.from_buffer(data))
            except pyrage.IdentityError as e:
                hint = (" (a passphrase-protected key: use a copy without one, or an age identity)"
                        if "decrypted" in str(e) else "")
                raise UsageError(f"--identity {given}: not a usable SSH private key: {e}{hint}") from None
            continue
        found = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines()
                 if ln.strip().startswith("AGE-SECRET-KEY-")]
        if not found:
            raise UsageError(f"--identity {given}: neither an age identity file (AGE-SECRET-KEY-...) nor an SSH "
                             "private key")
        for ln in found:
            try:
                out.append(pyrage.x25519.Identity.from_str(ln))
            except pyrage.IdentityError as e:
                raise UsageError(f"--identity {given}: a bad age identity: {e}") from None
    return out


def _ssh_keygen(args: list[str], stdin_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, LC_ALL="C")
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        return subprocess.run(["ssh-keygen", *args], stdin=stdin, capture_output=True, env=env,
                              timeout=SSH_KEYGEN_TIMEOUT_S)
    except FileNotFoundError:
        raise KxenError("ssh-keygen (OpenSSH 8.2 or later) is needed to sign and check bundles; it is not on "
                        "PATH") from None
    finally:
        if stdin_path:
            stdin.close()


def _last_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {p.returncode}"


def sign_payload(key: str, payload_path: str) -> bytes:
    """An armored SSH signature of the file's bytes, namespace ``kxen-agent-bundle``."""
    path = os.path.expanduser(key)
    if not os.path.isfile(path):
        raise UsageError(f"--sign {key}: no such key file; nothing was written")
    p = _ssh_keygen(["-Y", "sign", "-f", path, "-n", SIGNATURE_NAMESPACE], payload_path)
    if p.returncode != 0 or not p.stdout.startswith(b"-----BEGIN SSH SIGNATURE-----"):
        raise UsageError(f"--sign {key}: ssh-keygen could not sign: {_last_line(p)}; nothing was written")
    return p.stdout


def seal_bundle(plain_path: str, out: str, *, recipients: list | None, sign_key: str | None,
                io: FileIO = OS_IO) -> tuple[int, SignatureCheck | None]:
    """Write the bundle at ``plain_path`` to ``out`` signed (``sign_key``), then encrypted (``recipients``).

    Returns the bytes written and who signed. The target is written as a
    bundle is: a temp file beside it, fsync, rename, fsync of the directory.
    """
    work = os.path.dirname(plain_path)
    src = plain_path
    signer = None
    if sign_key is not None:
        sig = sign_payload(sign_key, plain_path)
        s = parse_ssh_signature(sig, out)
        signer = SignatureCheck(s.key_type, s.fingerprint, None, False)
        src = os.path.join(work, "signed")
        with open(src, "wb") as dst, open(plain_path, "rb") as f:
            dst.write(encode_signed_head(sig))
            shutil.copyfileobj(f, dst, _COPY)
    target = os.path.realpath(out)
    if os.path.exists(target) and not os.path.isfile(target):
        raise UsageError(f"cannot write bundle {out}: it exists and is not a regular file; nothing was written")
    directory = os.path.dirname(target) or "."
    tmp = io.write_tmp(directory, b"", sync=False, prefix=".kxen-bundle-tmp-")
    try:
        with open(tmp, "wb") as dst, open(src, "rb") as f:
            if recipients:
                _pyrage().encrypt_io(f, dst, recipients)
            else:
                shutil.copyfileobj(f, dst, _COPY)
            size = dst.tell()
        io.fsync_path(tmp)
        io.rename_into_place(tmp, target)
        io.fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            io.unlink(tmp)
        raise
    return size, signer


def _check_signature(sig: bytes, payload: str, allowed_signers: str, where: str) -> SignatureCheck:
    s = parse_ssh_signature(sig, where)
    allowed = os.path.expanduser(allowed_signers)
    if not os.path.isfile(allowed):
        raise UsageError(f"--allowed-signers {allowed_signers}: no such file; nothing was read from {where}")
    sig_path = os.path.join(os.path.dirname(payload), "signature")
    with open(sig_path, "wb") as f:
        f.write(sig)
    p = _ssh_keygen(["-Y", "find-principals", "-f", allowed, "-s", sig_path])
    principals = p.stdout.decode("utf-8", "replace").split() if p.returncode == 0 else []
    if not principals:
        raise UntrustedSigner(f"bundle {where} is signed by {s.key_type} key {s.fingerprint}, which "
                              f"{allowed_signers} does not allow; nothing was imported — add that key to the "
                              "allowed signers file if you trust it")
    p = _ssh_keygen(["-Y", "verify", "-f", allowed, "-I", principals[0], "-n", SIGNATURE_NAMESPACE,
                     "-s", sig_path], payload)
    if p.returncode != 0:
        raise BadBundle(where, f"the signature by {principals[0]} ({s.key_type} key {s.fingerprint}) does not match "
                        "the bundle's bytes: it was changed after it was signed; nothing was imported")
    return SignatureCheck(s.key_type, s.fingerprint, principals[0], True)


def _copy_from(src: str, dst: str, offset: int) -> None:
    with open(src, "rb") as f, open(dst, "wb") as out:
        f.seek(offset)
        shutil.copyfileobj(f, out, _COPY)


def _head(path: str, n: int, where: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise BadBundle(where, f"cannot open: {e.strerror}") from None


@contextlib.contextmanager
def open_bundle(path: str, *, identities: list[str] | None = None,
                allowed_signers: str | None = None) -> Iterator[Opened]:
    """The bundle inside ``path``'s envelopes, for the bundle readers; a plain bundle is yielded as is.

    Decrypts with ``identities`` (files) when the file is encrypted; checks
    the signature against ``allowed_signers`` when given (and then refuses an
    unsigned bundle). The temporary files are removed when the block ends.
    """
    where = str(path)
    kind = envelope_kind(_head(path, len(AGE_MAGIC), where))
    if kind is None:
        if allowed_signers is not None:
            raise UntrustedSigner(f"bundle {where} is not signed, and --allowed-signers asks for a signature; "
                                  "nothing was imported")
        yield Opened(where, where, False, None)
        return
    if kind == "age-armored":
        raise BadBundle(where, "an ASCII-armored age file: kxen-agent writes and reads binary age files; "
                        "`age -d` it into a bundle first", 0)
    work = tempfile.mkdtemp(prefix="kxen-bundle-")  # 0700: the bundle inside is its owner's alone
    try:
        current, encrypted = where, False
        if kind == "age":
            if not identities:
                kinds = age_stanza_types(_head(where, 1 << 16, where))
                raise CannotDecrypt(f"bundle {where} is encrypted (age, to {len(kinds)} recipient(s): "
                                    f"{', '.join(kinds)}); give --identity FILE (your age identity or SSH private "
                                    "key) to open it")
            ids = load_identities(identities)
            pyrage = _pyrage()
            current, encrypted = os.path.join(work, "decrypted"), True
            try:
                with open(where, "rb") as f, open(current, "wb") as out:
                    pyrage.decrypt_io(f, out, ids)
            except pyrage.DecryptError as e:
                raise CannotDecrypt(f"cannot decrypt bundle {where} with {', '.join(identities)}: {e}; nothing was "
                                    "imported — it was encrypted to other keys: ask its sender to encrypt it to "
                                    "your public key") from None
            kind = envelope_kind(_head(current, len(AGE_MAGIC), where))
            if kind not in (None, "signed"):
                raise BadBundle(where, "the encrypted bundle holds another encrypted file, not a bundle")
        signature = None
        if kind == "signed":
            sig, offset = parse_signed_head(_head(current, SIGNED_READ_SIZE, where), where)
            payload = os.path.join(work, "bundle")
            _copy_from(current, payload, offset)
            if current != where:
                os.unlink(current)
            current = payload
            if allowed_signers is not None:
                signature = _check_signature(sig, payload, allowed_signers, where)
            else:
                s = parse_ssh_signature(sig, where)
                signature = SignatureCheck(s.key_type, s.fingerprint, None, False)
        elif allowed_signers is not None:
            raise UntrustedSigner(f"bundle {where} is not signed, and --allowed-signers asks for a signature; "
                                  "nothing was imported")
        opened = Opened(current, where, encrypted, signature)
        try:
            yield opened
        except KxenError as e:
            raise opened.restate(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Sealing:
    """Where an export writes the bundle (``path``), and, once sealed, what ``out`` holds."""

    path: str
    out: str
    recipients: int = 0
    signer: SignatureCheck | None = None
    size: int | None = None  # the sealed file's bytes, once written

    @property
    def sealed(self) -> bool:
        return self.path != self.out

    def envelope_json(self) -> dict:
        return {"encrypted": self.recipients > 0, "recipients": self.recipients,
                "signature": self.signer.to_json() if self.signer else None, "fileBytes": self.size}

    def describe(self) -> str:
        parts = []
        if self.signer is not None:
            parts.append(f"signed by {self.signer.key_type} key {self.signer.fingerprint}")
        if self.recipients:
            parts.append(f"encrypted to {self.recipients} recipient(s)")
        return ", ".join(parts)


@contextlib.contextmanager
def sealing(out: str, *, encrypt_to: list[str] | None = None, sign_key: str | None = None,
            io: FileIO = OS_IO) -> Iterator[Sealing]:
    """An export into ``out``, sealed when the block ends: signed with ``sign_key``, encrypted to ``encrypt_to``.

    Without either, the block writes ``out`` itself. Recipients and the key
    are checked before the block runs, so a bad one writes nothing; the plain
    bundle goes to a private temporary directory, removed at the end.
    """
    if not encrypt_to and sign_key is None:
        yield Sealing(out, out)
        return
    recipients = parse_recipients(encrypt_to) if encrypt_to else []
    if sign_key is not None and not os.path.isfile(os.path.expanduser(sign_key)):
        raise UsageError(f"--sign {sign_key}: no such key file; nothing was written")
    work = tempfile.mkdtemp(prefix="kxen-bundle-")
    try:
        # The plain bundle keeps the target's name: the form (pack or JSON) is chosen by it.
        s = Sealing(os.path.join(work, os.path.basename(out) or "bundle"), out, len(recipients))
        yield s
        s.size, s.signer = seal_bundle(s.path, out, recipients=recipients, sign_key=sign_key, io=io)
    finally:
        shutil.rmtree(work, ignore_errors=True)
