"""The search index's per-entry checksums (objects_spec.md §11a.2, version 2): a line that damage made is
never reported (the file is written anew from the objects), and fsck finds the damage a search cannot see."""

from __future__ import annotations

import json
from pathlib import Path

from tests.session.test_cli_sessions import Kx, make_repo


def test_a_damaged_entry_is_never_reported_and_fsck_finds_what_a_search_cannot(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    ses = kx.json("run", "--workspace", str(repo), "--task", "alpha-task probe-word")["session"]
    want = json.loads(kx.run("session", "grep", "probe-word", "--json").out)
    assert [m["line"] for m in want["matches"]] == ["alpha-task probe-word"]
    path = kx.state / "cache" / "grep" / "sessions" / ses
    good = path.read_bytes()
    assert good.startswith(b"kxen-grep 2\n")

    # A byte of the matching entry's text changed (not the table: the digest would refuse the whole file).
    path.write_bytes(good.replace(b"alpha-task probe-word", b"alphA-task probe-word"))
    assert json.loads(kx.run("session", "grep", "probe-word", "--json").out) == want
    assert path.read_bytes() == good  # written anew from the objects

    # Damage that hides the match: the search cannot see it (it hashes only what it reports); fsck does.
    path.write_bytes(good.replace(b"probe-word", b"probe-wore"))
    kx.run("session", "grep", "probe-word", code=1)
    fsck = json.loads(kx.run("fsck", "--json", code=None).out)
    assert [p["kind"] for p in fsck["problems"]] == ["grep-index"], fsck["problems"]
    assert "checksum" in fsck["problems"][0]["message"], fsck["problems"]
    path.unlink()
    assert json.loads(kx.run("session", "grep", "probe-word", "--json").out) == want
