"""The search index, version 2 (objects_spec.md §11a.2): per-entry checksums — a line that damage made is
never reported (the file is written anew from the objects), and fsck finds the damage a search cannot see —
and the session metadata a file carries, so that a warm search reads no object."""

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


def test_a_warm_search_reads_no_object_and_takes_new_metadata_from_the_objects(tmp_path: Path) -> None:
    from kxen_agent.cli.grep_lean import matcher
    from kxen_agent.session.grep_index import parse_index, search
    from kxen_agent.store import Store

    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    ses = kx.json("run", "--workspace", str(repo), "--task", "alpha-task probe-word", "-n", "first")["session"]
    kx.run("session", "grep", "probe-word")  # writes the index
    path = kx.state / "cache" / "grep" / "sessions" / ses

    def searched() -> tuple[list, list]:
        store = Store(str(kx.state), namespaces=("sessions",))
        read: list = []  # the objects read (from loose files, packs or step logs alike)
        get = store.get
        store.get = lambda oid, kind=None: (read.append(kind), get(oid, kind))[1]  # type: ignore[method-assign]
        hits, _figures = search(store, matcher("probe-word", regex=False, ignore_case=False))
        return hits, read

    hits, read = searched()
    assert [h.line for h in hits] == ["alpha-task probe-word"] and read == []
    # A rename writes new metadata: read once from its object, then the file names it, and nothing is read.
    before = parse_index(ses, path.read_bytes()).meta_id
    kx.run("session", "rename", ses, "second")
    hits, read = searched()
    assert [h.sessions for h in hits] == [(ses,)] and "session" in read
    assert parse_index(ses, path.read_bytes()).meta_id != before
    hits, read = searched()
    assert len(hits) == 1 and read == []
    assert json.loads(kx.run("session", "grep", "probe-word", "-s", "second", "--json").out)["sessions"] == [ses]
    assert json.loads(kx.run("fsck", "--json").out)["clean"]
