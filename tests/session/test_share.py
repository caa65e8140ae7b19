"""Private, resumable sharing (objects_spec.md §12.14): bundles encrypted to age or SSH keys and signed with SSH keys.

Real ``kxen-agent`` processes, a real ``ssh-keygen``, real ``pyrage``: one
session is made once for the module and exported in every envelope; each
test imports or verifies in a fresh state dir.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import Cli, git_workspace, require_tools, write_agent

pyrage = pytest.importorskip("pyrage")  # a runtime dependency: never skipped where kxen-agent is installed


def keypair(d: Path, name: str, kind: str = "ed25519") -> Path:
    key = d / name
    cmd = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"{name}@kxen.invalid", "-f", str(key)]
    if kind == "rsa":
        cmd[4:4] = ["-b", "2048"]
    subprocess.run(cmd, check=True)
    return key


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    require_tools("ssh-keygen")
    d = tmp_path_factory.mktemp("share")
    ws = git_workspace(d / "ws")
    agent = write_agent(d / "agent", [{"content": "done"}], tools=[])
    a = Cli(d / "state-a", strict=True)
    ses = a.run_json(ws, "hello", agent, expect=0).json()["session"]
    alice, bob, carol = keypair(d, "alice"), keypair(d, "bob", "rsa"), keypair(d, "carol")
    age_id = pyrage.x25519.Identity.generate()
    (d / "age.key").write_text(f"# test identity\n{age_id}\n")
    (d / "allowed").write_text(f"alice@kxen.invalid {' '.join((d / 'alice.pub').read_text().split()[:2])}\n")
    b = {}
    for name, args in {
        "plain": [],
        "age": ["--encrypt-to", str(age_id.to_public())],
        "ssh": ["--encrypt-to", str(d / "bob.pub"), "--encrypt-to", (d / "carol.pub").read_text().strip()],
        "signed": ["--sign", str(alice)],
        "carol-signed": ["--sign", str(carol)],
        "both": ["--sign", str(alice), "--encrypt-to", str(d / "bob.pub")],
    }.items():
        b[name] = d / f"{name}.kxb"
        a("session", "export", ses, "-o", str(b[name]), *args, expect=0)
    return {"d": d, "ws": ws, "ses": ses, "bundles": b, "alice": alice, "bob": bob, "carol": carol,
            "age": d / "age.key", "allowed": d / "allowed"}


def importer(world: dict, name: str) -> Cli:
    return Cli(world["d"] / f"state-{name}", strict=True)


def imported(cli: Cli, world: dict, bundle: Path, *args: str) -> dict:
    p = cli("session", "import", str(bundle), "--workspace", str(world["ws"]), "--json", *args, expect=0)
    res = p.json()
    assert res["sessions"] == {world["ses"]: "created"}, res
    return res


def test_encrypted_export_imports_with_the_right_identity_age_and_ssh(world: dict) -> None:
    b = world["bundles"]
    assert b["age"].read_bytes().startswith(b"age-encryption.org/v1\n")
    plain = b["plain"].read_bytes()
    for raw in (b["age"].read_bytes(), b["ssh"].read_bytes()):
        assert plain[8:] not in raw and b"hello" not in raw  # the session's text is not in the file
    res = imported(importer(world, "age"), world, b["age"], "--identity", str(world["age"]))
    assert res["envelope"] == {"encrypted": True, "signature": None}
    imported(importer(world, "bob"), world, b["ssh"], "-i", str(world["bob"]))  # ssh-rsa
    c = importer(world, "carol")
    imported(c, world, b["ssh"], "-i", str(world["carol"]))  # ssh-ed25519
    assert "hello" in str(c.log(world["ses"]))
    c.fsck_clean()


def test_a_wrong_or_missing_identity_is_refused_in_one_line_and_writes_nothing(world: dict) -> None:
    b = world["bundles"]
    cli = importer(world, "wrong")
    line = cli.refused("session", "import", str(b["ssh"]), "-w", str(world["ws"]), "-i", str(world["alice"]), code=2)
    assert "cannot decrypt bundle" in line and "nothing was imported" in line, line
    line = cli.refused("session", "import", str(b["age"]), "-w", str(world["ws"]), code=2)
    assert "is encrypted (age, to 1 recipient(s): X25519); give --identity FILE" in line, line
    line = cli.refused("session", "import", str(b["age"]), "-w", str(world["ws"]), "-i", str(world["d"] / "allowed"),
                       code=2)
    assert "neither an age identity file" in line, line
    assert not cli.state_dir.exists()
    line = cli.refused("bundle", "verify", str(b["ssh"]), code=2)
    assert "is encrypted (age, to 2 recipient(s): ssh-rsa, ssh-ed25519)" in line, line


def test_a_signed_bundle_verifies_and_names_its_signer(world: dict) -> None:
    b, cli = world["bundles"], importer(world, "verify")
    raw = b["signed"].read_bytes()
    assert raw.startswith(b"KXSIGNED\x01") and raw.endswith(b["plain"].read_bytes()[-32:])
    doc = cli("bundle", "verify", str(b["signed"]), "--allowed-signers", str(world["allowed"]), "--json",
              expect=0).json()
    sig = doc["envelope"]["signature"]
    assert sig["checked"] and sig["principal"] == "alice@kxen.invalid" and sig["fingerprint"].startswith("SHA256:")
    assert doc["path"] == str(b["signed"])
    p = cli("bundle", "verify", str(b["signed"]), expect=0)  # unchecked without an allowed-signers file
    assert "not checked: give --allowed-signers FILE" in p.out


def test_a_one_byte_change_is_refused(world: dict, tmp_path: Path) -> None:
    raw = bytearray(world["bundles"]["signed"].read_bytes())
    cli = importer(world, "flip")
    for at in (len(raw) - 40, 400):  # in the bundle's objects; in its header
        bad = bytearray(raw)
        bad[at] ^= 0x01
        f = tmp_path / f"flip{at}.kxb"
        f.write_bytes(bad)
        for cmd in (["bundle", "verify", str(f)], ["session", "import", str(f), "-w", str(world["ws"])]):
            line = cli.refused(*cmd, "--allowed-signers", str(world["allowed"]), code=1)
            assert "does not match the bundle's bytes" in line and "alice@kxen.invalid" in line, line
    assert not cli.state_dir.exists()


def test_an_unknown_signer_is_named_and_an_unsigned_bundle_refused(world: dict) -> None:
    b, cli = world["bundles"], importer(world, "unknown")
    carol_fp = subprocess.run(["ssh-keygen", "-lf", str(world["d"] / "carol.pub")], check=True,
                                            capture_output=True, text=True).stdout.split()[1]
    line = cli.refused("session", "import", str(b["carol-signed"]), "-w", str(world["ws"]),
                       "--allowed-signers", str(world["allowed"]), code=2)
    assert carol_fp in line and "does not allow" in line, line
    line = cli.refused("session", "import", str(b["plain"]), "-w", str(world["ws"]),
                       "--allowed-signers", str(world["allowed"]), code=2)
    assert "is not signed" in line, line
    assert not cli.state_dir.exists()


def test_sign_then_encrypt_round_trip(world: dict) -> None:
    b = world["bundles"]
    cli = importer(world, "both")
    res = imported(cli, world, b["both"], "-i", str(world["bob"]), "--allowed-signers", str(world["allowed"]))
    assert res["envelope"]["encrypted"] and res["envelope"]["signature"]["principal"] == "alice@kxen.invalid"
    # Signed inside the encryption: decrypted, the file is the signed envelope.
    inner = pyrage.decrypt(b["both"].read_bytes(), [pyrage.ssh.Identity.from_buffer(world["bob"].read_bytes())])
    assert inner.startswith(b"KXSIGNED\x01")
    cli.fsck_clean()
    p = cli("session", "import", str(b["both"]), "-w", str(world["ws"]), "-i", str(world["bob"]), expect=0)
    assert "unchanged" in p.out and "not checked" in p.err  # importing twice is a no-op


def test_bad_recipients_and_keys_write_nothing(world: dict, tmp_path: Path) -> None:
    a = Cli(world["d"] / "state-a", strict=True)
    out = tmp_path / "x.kxb"
    for args in (["--encrypt-to", "age1nope"], ["--encrypt-to", "ssh-ed25519 AAAAnope"],
                 ["--encrypt-to", str(tmp_path / "missing.pub")], ["--sign", str(tmp_path / "missing")]):
        a.refused("session", "export", world["ses"], "-o", str(out), *args, code=2)
        assert not out.exists()


def test_import_trust_accepts_a_bundle_signed_by_an_allowed_signer_in_one_step(world: dict, tmp_path: Path) -> None:
    a = Cli(world["d"] / "state-a", strict=True)
    steps = [{"content": "first"}, {"tool_calls": [{"name": "shell", "arguments": {"command": "touch trusted-ran"}}]},
             {"content": "second"}]
    ses = a.run_json(world["ws"], "first", write_agent(tmp_path / "agent", steps), expect=0).json()["session"]
    signed = tmp_path / "t.kxb"
    a("session", "export", ses, "-o", str(signed), "--sign", str(world["alice"]), expect=0)
    plain = importer(world, "untrusted")
    line = plain.refused("session", "import", str(signed), "-w", str(world["ws"]), "--trust", code=2)
    assert "--allowed-signers" in line and not plain.state_dir.exists(), line
    plain("session", "import", str(signed), "-w", str(world["ws"]), expect=0)
    assert plain("--resume", ses, "--task", "go on", "--json").rc == 3  # the trust boundary holds without --trust
    assert not (world["ws"] / "trusted-ran").exists()
    b = importer(world, "trusted")
    res = b("session", "import", str(signed), "-w", str(world["ws"]), "--allowed-signers", str(world["allowed"]),
            "--trust", "--json", expect=0).json()
    assert res["trusted"] == [ses] and res["envelope"]["signature"]["principal"] == "alice@kxen.invalid", res
    assert b("--resume", ses, "--task", "go on", "--json", expect=0).json()["status"] == "completed"
    assert (world["ws"] / "trusted-ran").exists()
