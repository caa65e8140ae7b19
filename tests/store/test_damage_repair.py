"""repair of the issue's two reproductions: from a bundle, from the session's Git remote, with no source.

And damage staying local: gc, ``session export --salvage``, ``session
delete --force``. Every check goes through the real CLI; the state dirs
are the ones of test_damage_fsck (three finished runs), copied per test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kxen_agent.runtime.runner import Runner
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store import Store
from kxen_agent.store.objects import decompress_loose, parse_object
from kxen_agent.store.steps import scan
from tests.helpers import Cli, git, git_workspace
from tests.reliability.workloads import TASK, agent

from .helpers import CLI_NAMESPACES
from .test_damage_fsck import _build


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    out = {}
    for name, packed in (("packed", True), ("steps", False)):
        root = tmp_path_factory.mktemp(name)
        out[name] = (root, _build(root, packed=packed))
    return out


def _copy(templates, name: str, tmp_path: Path) -> tuple[Path, list[str]]:
    root, sessions = templates[name]
    shutil.copytree(root, tmp_path / "t", symlinks=True)
    return tmp_path / "t" / "state", sessions


def _flip_in_pack(state: Path, ses: str) -> bytes:
    """Flip one byte of the head message's entry in the pack; its id."""
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    (pack,) = store.packs
    head = store.refs.read(f"sessions/{ses}").refs["head"]
    off = pack._locate(head)[0]
    pack.close()
    with open(pack.path, "r+b") as f:
        f.seek(off + 60)
        b = f.read(1)
        f.seek(off + 60)
        f.write(bytes([b[0] ^ 0x01]))
    return head


def _flip_in_log(state: Path, ses: str) -> tuple[Path, list, object]:
    path = state / "steps" / "sessions" / ses
    data = bytearray(path.read_bytes())
    recs, _end = scan(bytes(data), data.index(b"\n") + 1, str(path))
    bad = recs[2]
    data[bad.offset + 40] ^= 0x10
    path.write_bytes(bytes(data))
    return path, recs, bad


def _logs(k: Cli, sessions: list[str]) -> dict[str, list[str]]:
    return {s: [m["id"] for m in k.log(s)] for s in sessions}


def _manifest(state: Path) -> list[dict]:
    lines = []
    for d in sorted((state / "lost-found").iterdir()):
        lines += [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]
    return lines


def test_dry_run_changes_nothing_and_says_what_it_would_do(templates, tmp_path):
    state, sessions = _copy(templates, "packed", tmp_path)
    _flip_in_pack(state, sessions[0])
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    k = Cli(state, strict=True)
    p = k("repair")
    assert p.rc == 1, str(p)  # still damaged: it changed nothing
    assert "would repack:" in p.out and "a dry run, nothing changed" in p.out
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before


def test_a_flipped_byte_in_a_pack_repaired_from_a_bundle(templates, tmp_path):
    state, sessions = _copy(templates, "packed", tmp_path)
    k = Cli(state, strict=True)
    want = _logs(k, sessions)
    bundle = tmp_path / "all.bundle"
    k("session", "export", *sessions, "--output", str(bundle), expect=0)
    head = _flip_in_pack(state, sessions[0])
    p = k("repair", "--from", str(bundle), "--apply", "--json")
    assert p.rc == 0, str(p)
    rep = p.json()
    kinds = [(a["kind"], a["target"]) for a in rep["actions"]]
    assert ("restore", head.hex()) in kinds and [k_ for k_, _ in kinds].count("repack") == 1
    assert not any(a["kind"] in ("quarantine", "branch") for a in rep["actions"])
    k.fsck_clean()
    assert _logs(k, sessions) == want  # no acknowledged message lost, no session branched
    assert {s["id"] for s in k.sessions()} == set(sessions)
    kept = _manifest(state)
    assert any(m.get("file", "").endswith(".pack") and m["how"] in ("moved", "copied") for m in kept)
    assert any(m.get("file", "").endswith(".idx") for m in kept)


def test_a_flipped_byte_in_a_pack_with_no_source_branches_at_the_last_intact_message(templates, tmp_path):
    state, sessions = _copy(templates, "packed", tmp_path)
    k = Cli(state, strict=True)
    want = _logs(k, sessions)
    head = _flip_in_pack(state, sessions[0])
    p = k("repair", "--apply", "--json")
    assert p.rc == 0, str(p)
    rep = p.json()
    assert ("quarantine", f"sessions/{sessions[0]}") in [(a["kind"], a["target"]) for a in rep["actions"]]
    k.fsck_clean()
    now = {s["id"]: s for s in k.sessions()}
    assert sessions[0] not in now and all(s in now for s in sessions[1:])
    (branch,) = [s for s in now.values() if s["parentId"] == sessions[0]]
    # The new branch ends at the last message before the damaged head: every message before it kept.
    assert [m["id"] for m in k.log(branch["id"])] == want[sessions[0]][:-1]
    assert branch["head"] != "msg_" + head.hex()
    for s in sessions[1:]:
        assert _logs(k, [s])[s] == want[s]
    # The branch's group says why in its reflog.
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    assert store.refs.reflog(f"sessions/{branch['id']}")[0].reason.startswith("repair")
    assert any(m.get("group") == f"sessions/{sessions[0]}" for m in _manifest(state))


def test_a_flipped_bit_in_a_step_log_repaired_with_no_source(templates, tmp_path):
    state, sessions = _copy(templates, "steps", tmp_path)
    k = Cli(state, strict=True)
    ses = sessions[1]
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    fence = store.refs.read(f"sessions/{ses}").fence
    path, recs, bad = _flip_in_log(state, ses)
    data = path.read_bytes()
    intact = [(oid, data[at:at + n]) for r in recs if r is not bad for oid, at, n in r.objects]
    p = k("repair", "--apply", "--json")
    assert p.rc == 0, str(p)
    k.fsck_clean()
    # Every object of every record that checked still reads, by its id.
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    for oid, frame in intact:
        assert store.read_raw(oid).raw == parse_object(decompress_loose(frame, "f"), "f").raw
    # No fence lowered: the group, if rebuilt, has at least its fence; if quarantined, a branch goes on.
    rep = p.json()
    done = {a["kind"] for a in rep["actions"] if a["target"] == f"sessions/{ses}"}
    if "rebuild" in done:
        assert store.refs.read(f"sessions/{ses}").fence >= fence
    else:
        assert "quarantine" in done and "branch" in done, rep
    for s in sessions:
        if s != ses:
            k("session", "log", s, expect=0)
    # The damaged log itself is kept.
    assert any(m.get("file", "").startswith(f"steps/sessions/{ses}") for m in _manifest(state))


def test_a_flipped_bit_in_a_step_log_repaired_from_a_bundle_loses_nothing(templates, tmp_path):
    state, sessions = _copy(templates, "steps", tmp_path)
    k = Cli(state, strict=True)
    want = _logs(k, sessions)
    bundle = tmp_path / "all.bundle"
    k("session", "export", *sessions, "--output", str(bundle), expect=0)
    _flip_in_log(state, sessions[1])
    p = k("repair", "--from", str(bundle), "--apply")
    assert p.rc == 0, str(p)
    k.fsck_clean()
    got = {s["id"]: s for s in k.sessions()}
    # Every acknowledged message is readable: in the session itself or in its new branch.
    for s in sessions:
        ids = [m["id"] for m in k.log(s)] if s in got else \
            [m["id"] for m in k.log(next(x for x in got.values() if x["parentId"] == s)["id"])]
        assert ids == want[s] or set(ids) <= set(want[s]), (s, ids)
    # The repaired session's messages through the CLI, the others' through the library the CLI reads
    # with (a cat-object process per message cost more CPU than the rest of the test).
    for m in want[sessions[1]]:
        k("cat-object", m, expect=0)
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    for s, msgs in want.items():
        for m in msgs:
            assert store.read_raw(bytes.fromhex(m.removeprefix("msg_"))).kind == "message", (s, m)


def test_damage_stays_local_gc_export_salvage_delete_force(templates, tmp_path):
    state, sessions = _copy(templates, "steps", tmp_path)
    k = Cli(state, strict=True)
    want = _logs(k, sessions)
    _flip_in_log(state, sessions[1])
    # Others still read, fork and export.
    k("session", "fork", sessions[0], expect=0)
    k("session", "export", sessions[2], "--output", str(tmp_path / "c.bundle"), expect=0)
    # gc packs what reads, prunes nothing (an unreachable object the damaged part might need), says so.
    stray = Store(str(state), namespaces=CLI_NAMESPACES).put("blob", b"unreachable, maybe the damaged part's")
    p = k("gc", "--prune=now")
    assert p.rc == 0, str(p)
    assert "pruned nothing" in p.err and f"group sessions/{sessions[1]} does not read" in p.err
    assert _logs(k, [sessions[0], sessions[2]]) == {s: want[s] for s in (sessions[0], sessions[2])}
    assert Store(str(state), namespaces=CLI_NAMESPACES).read_raw(stray).body == b"unreachable, maybe the damaged part's"
    # The damaged session: refused as it is, moved out whole with --force.
    p = k("session", "delete", sessions[1])
    assert p.rc != 0 and "repair" in p.err and "Traceback" not in p.err
    p = k("session", "delete", sessions[1], "--force", expect=0)
    assert "lost-found" in p.out
    k.fsck_clean()


def test_export_salvage_stops_at_the_damage(templates, tmp_path):
    state, sessions = _copy(templates, "packed", tmp_path)
    k = Cli(state, strict=True)
    want = _logs(k, sessions)
    _flip_in_pack(state, sessions[0])
    bundle = tmp_path / "s.bundle"
    p = k("session", "export", sessions[0], "--output", str(bundle))
    assert p.rc != 0 and "--salvage" in p.err
    p = k("session", "export", sessions[0], "--output", str(bundle), "--salvage", expect=0)
    assert "warning" in p.err
    other = tmp_path / "other"
    o = Cli(other, strict=True)
    ws = templates["packed"][0] / "ws"  # a plain directory: identified by its path
    o("session", "import", str(bundle), "--workspace", str(ws), expect=0)
    assert [m["id"] for m in o.log(sessions[0])] == want[sessions[0]][:-1]


def test_repair_from_the_sessions_git_remote(tmp_path):
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    ws = git_workspace(tmp_path / "ws")
    git(ws, "remote", "add", "origin", str(bare))
    git(ws, "push", "-q", "origin", "main")
    state = tmp_path / "state"
    store = Store(str(state), namespaces=CLI_NAMESPACES)
    res = Runner(store).start(str(ws), TASK, agent())
    assert res.status == "completed"
    ses = res.session
    k = Cli(state, strict=True)
    want = _logs(k, [ses])
    k("session", "push", ses, expect=0, cwd=ws)
    _flip_in_log(state, ses)
    p = k("repair", "--remote", "origin", "--workspace", str(ws), "--apply", "--json")
    assert p.rc == 0, str(p)
    k.fsck_clean()
    got = {s["id"]: s for s in k.sessions()}
    s = ses if ses in got else next(x["id"] for x in got.values() if x["parentId"] == ses)
    assert [m["id"] for m in k.log(s)] == want[ses]
