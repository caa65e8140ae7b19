"""Checkpoints travel in the JSON form of a bundle too (issue #27 item 5, ``objects_spec.md`` §12.7a).

The scene of ``test_checkpoint_travel.py`` (a bare remote, a workspace clone, one scripted run whose
workspace holds changes no commit has): ``session export --format json --with-checkpoints`` imported with
``--restore-workspace`` into a fresh state dir and a fresh clone gives byte-identical files, the same
checkpoint ref and the same content digest as the pack form; a JSON bundle whose ``checkpoints`` member was
altered is refused by ``session import`` in one line, nothing imported or adopted.
"""

from __future__ import annotations

import base64
import json

from tests.helpers import git
from tests.remote.test_checkpoint_travel import Scene, files, scene  # noqa: F401  (the module's fixture)


def test_json_form_export_import_restores_byte_identical_files(scene: Scene) -> None:  # noqa: F811
    carried = scene.root / "carried.json"
    p = scene.cli("session", "export", scene.ses, "-o", str(carried), "--format", "json", "--with-checkpoints",
                  "--json", expect=0)
    info = p.json()
    assert info["format"] == "json" and info["capabilities"] == ["git-checkpoints"], info
    assert info["checkpointBytes"] > 0 and info["digest"] != info["contentDigest"], info
    doc = json.loads(carried.read_text())
    git_bundle = base64.b64decode(doc["checkpoints"])
    assert git_bundle.startswith(b"# v2 git bundle\n") and len(git_bundle) == info["checkpointBytes"]
    pack = scene.root / "same.kxb"
    v = scene.cli("session", "export", scene.ses, "-o", str(pack), "--with-checkpoints", "--json", expect=0).json()
    assert v["contentDigest"] == info["contentDigest"]  # the same sessions whichever the form
    cli, clone = scene.machine()
    p = cli("session", "import", str(carried), "--workspace", str(clone), "--restore-workspace", expect=0)
    assert f"{scene.ses}: checkpoints created" in p.out and "workspace restored to checkpoint" in p.out, str(p)
    assert files(clone) == files(scene.ws)
    tip = git(scene.ws, "rev-parse", f"refs/kxen/checkpoints/{scene.ses}")
    assert git(clone, "rev-parse", f"refs/kxen/checkpoints/{scene.ses}") == tip
    git(clone, "fsck", "--strict", "--no-dangling")
    p = cli("session", "import", str(carried), "--workspace", str(clone), expect=0)
    assert f"{scene.ses}: checkpoints unchanged" in p.out, str(p)


def test_an_altered_checkpoints_member_is_refused_in_one_line(scene: Scene) -> None:  # noqa: F811
    carried = scene.root / "carried2.json"
    scene.cli("session", "export", scene.ses, "-o", str(carried), "--with-checkpoints", expect=0)
    doc = json.loads(carried.read_text())
    raw = bytearray(base64.b64decode(doc["checkpoints"]))
    raw[-1] ^= 1  # inside the Git pack: still a Git bundle's header, still canonical base64
    bad = scene.root / "bad.json"
    bad.write_text(json.dumps({**doc, "checkpoints": base64.b64encode(bytes(raw)).decode()}))
    cli, clone = scene.machine()
    p = cli("session", "import", str(bad), "--workspace", str(clone), "--restore-workspace")
    assert p.rc != 0 and "the refs, the list of objects or the checkpoints were altered" in p.err, str(p)
    assert len(p.err.strip().splitlines()) == 1 and "Traceback" not in p.err, str(p)
    assert git(clone, "for-each-ref", "refs/kxen/") == ""
    assert files(clone) != files(scene.ws)  # nothing restored
