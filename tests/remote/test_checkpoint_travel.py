"""Checkpoints travel only when asked (issue #27 item 5), with real Git: a bare remote and fresh clones.

One remote, one workspace clone and one scripted run per module (``scene``): the run edits a tracked file,
writes an untracked one and removes another with the shell, so the workspace holds changes no commit has.

- ``session export`` without ``--with-checkpoints`` says in one line that the changes stay, and the bundle
  imported into a fresh state dir and clone brings no checkpoint (``session diff`` says they are missing);
- with it, import ``--restore-workspace`` into a fresh state dir and a fresh clone gives byte-identical files;
- ``session push`` likewise without and with it, then ``pull --restore-workspace`` elsewhere;
- a credential planted in an untracked file (checkpointed by a later run) is refused by the scan, for export
  and push, and nothing is written or sent.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import Cli, git, git_workspace, write_agent

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def _steps() -> list[dict]:
    return [
        {"content": "edit", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "src/a.txt", "content": "edited by the agent\n"}},
            {"name": "write_file", "arguments": {"path": "notes/wip.txt", "content": "work in progress\n"}},
            {"name": "shell", "arguments": {"command": "rm src/gone.txt && printf 'bin\\0ary' > blob.bin"}}]},
        {"content": "done"},
        {"content": "look", "tool_calls": [{"name": "shell", "arguments": {"command": "echo look"}}]},
        {"content": "done again"},
    ]


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and rel.parts[0] != ".git":
            out[str(rel)] = p.read_bytes()
    return out


class Scene:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.origin = root / "origin.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(self.origin)], check=True)
        self.ws = git_workspace(root / "ws", {"README.md": "# r\n", "src/a.txt": "original\n",
                                              "src/gone.txt": "to be removed\n"})
        git(self.ws, "remote", "add", "origin", str(self.origin))
        git(self.ws, "push", "-q", "origin", "main")
        git(self.ws, "fetch", "-q", "origin")
        self.cli = Cli(root / "state")
        self.agent = write_agent(root / "agent", _steps())
        p = self.cli("run", "--workspace", str(self.ws), "--task", "edit", "--agent", str(self.agent), expect=0)
        self.ses = p.err.split("session ", 1)[1].split()[0]
        self.n = 0

    def machine(self) -> tuple[Cli, Path]:
        """A fresh state dir and a fresh clone of the remote."""
        self.n += 1
        clone = self.root / f"clone{self.n}"
        subprocess.run(["git", "clone", "-q", str(self.origin), str(clone)], check=True)
        return Cli(self.root / f"state{self.n}"), clone


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    return Scene(tmp_path_factory.mktemp("travel"))


def test_export_import_without_and_with_checkpoints(scene: Scene) -> None:
    plain = scene.root / "plain.kxb"
    p = scene.cli("session", "export", scene.ses, "-o", str(plain), expect=0)
    assert "stay here; --with-checkpoints carries them" in p.err, str(p)
    cli, clone = scene.machine()
    cli("session", "import", str(plain), "--workspace", str(clone), expect=0)
    assert git(clone, "for-each-ref", "refs/kxen/") == ""
    assert "checkpoints" in cli.refused("session", "diff", scene.ses)

    carried = scene.root / "carried.kxb"
    p = scene.cli("session", "export", scene.ses, "-o", str(carried), "--with-checkpoints", "--json", expect=0)
    info = p.json()
    assert "git-checkpoints" in info["capabilities"] and info["checkpointBytes"] > 0, info
    v = scene.cli("bundle", "verify", str(carried), "--json", expect=0).json()
    assert v["checkpointBytes"] == info["checkpointBytes"] and v["contentDigest"] == info["contentDigest"]
    cli, clone = scene.machine()
    p = cli("session", "import", str(carried), "--workspace", str(clone), "--restore-workspace", expect=0)
    assert f"{scene.ses}: checkpoints created" in p.out and "workspace restored to checkpoint" in p.out, str(p)
    assert files(clone) == files(scene.ws)
    tip = git(scene.ws, "rev-parse", f"refs/kxen/checkpoints/{scene.ses}")
    assert git(clone, "rev-parse", f"refs/kxen/checkpoints/{scene.ses}") == tip
    git(clone, "fsck", "--strict", "--no-dangling")
    assert cli("session", "diff", scene.ses, "--stat", expect=0).out == scene.cli(
        "session", "diff", scene.ses, "--stat", expect=0).out
    # Imported again: nothing changes.
    p = cli("session", "import", str(carried), "--workspace", str(clone), expect=0)
    assert f"{scene.ses}: checkpoints unchanged" in p.out
    # A bundle with a checkpoint section is refused by an older reader's rule: one flipped byte in the section.
    raw = bytearray(carried.read_bytes())
    raw[-40] ^= 1
    bad = scene.root / "bad.kxb"
    bad.write_bytes(bytes(raw))
    assert "bundle trailer checksum mismatch" in scene.cli.refused("bundle", "verify", str(bad), code=1)


def test_push_pull_without_and_with_checkpoints(scene: Scene) -> None:
    p = scene.cli("session", "push", scene.ses, expect=0, cwd=scene.ws)
    assert "stay here; --with-checkpoints carries them" in p.err, str(p)
    assert f"refs/kxen/checkpoints/{scene.ses}" not in git(scene.origin, "for-each-ref")
    cli, clone = scene.machine()
    cli("session", "pull", scene.ses, "--workspace", str(clone), expect=0, cwd=clone)
    assert git(clone, "for-each-ref", "refs/kxen/") == ""

    p = scene.cli("session", "push", scene.ses, "--with-checkpoints", expect=0, cwd=scene.ws)
    assert f"{scene.ses}: checkpoints" in p.out, str(p)
    cli, clone = scene.machine()
    p = cli("session", "pull", scene.ses, "--workspace", str(clone), "--restore-workspace", expect=0, cwd=clone)
    assert "workspace restored to checkpoint" in p.out, str(p)
    assert files(clone) == files(scene.ws)
    git(clone, "fsck", "--strict", "--no-dangling")


def test_a_planted_credential_is_refused(scene: Scene) -> None:
    (scene.ws / "notes" / "creds.txt").write_text(f"token = {TOKEN}\n")  # untracked, not ignored
    scene.cli("--resume", scene.ses, "--task", "look", expect=0)  # its shell call checkpoints the file
    out = scene.root / "secret.kxb"
    p = scene.cli("session", "export", scene.ses, "-o", str(out), "--with-checkpoints")
    assert p.rc == 1 and p.err.splitlines()[-1].startswith("kxen-agent: error: refusing export"), str(p)
    assert "the checkpoints hold 1 text(s) that look like credentials" in p.err and TOKEN not in p.err, str(p)
    assert not out.exists() and not [n for n in os.listdir(scene.root) if n.startswith(".kxen")]
    before = git(scene.origin, "for-each-ref")
    p = scene.cli("session", "push", scene.ses, "--with-checkpoints", cwd=scene.ws)
    assert p.rc == 1 and "checkpoint file notes/creds.txt" in p.err and TOKEN not in p.err, str(p)
    assert git(scene.origin, "for-each-ref") == before
    scene.cli("session", "export", scene.ses, "-o", str(out), "--with-checkpoints", "--allow-secrets", expect=0)
