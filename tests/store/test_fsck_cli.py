"""fsck and cat-object through the real console script, against real files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kxen_agent.store import RefUpdate, Store, fsck
from kxen_agent.store.fsck import NEXT

from .helpers import one_line_error, run_cli

G = "notes/s1"  # not sessions/: these objects are free-form, the session schema does not govern them


@pytest.fixture
def populated(store: Store) -> dict[str, bytes]:
    """A blob, a message linking to it, a ref to the message, one dangling blob."""
    blob = store.put("blob", b"the file the message talks about\n")
    msg = store.put("message", {"role": "user", "text": "see the attachment", "attachment": blob})
    store.refs.transaction(G, [RefUpdate("head", None, msg)], reason="first message")
    dangling = store.put("blob", b"written, never referenced")
    return {"blob": blob, "msg": msg, "dangling": dangling}


def _fsck_json(state_dir: Path) -> tuple[int, dict]:
    p = run_cli(state_dir, "fsck", "--json")
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    return p.returncode, json.loads(p.stdout)


def test_clean_store_exits_zero_and_lists_dangling(state_dir, populated):
    p = run_cli(state_dir, "fsck")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert f"dangling object {populated['dangling'].hex()}" in out
    assert "3 objects" in out and "1 ref in 1 group," in out and "2 reachable" in out and "clean" in out
    code, rep = _fsck_json(state_dir)
    assert code == 0
    assert rep["clean"] is True and rep["problems"] == []
    assert rep["dangling"] == [populated["dangling"].hex()]
    assert (rep["objects"], rep["refs"], rep["reachable"]) == (3, 1, 2)
    assert rep["stateDir"] == str(state_dir)


def test_flipped_byte_in_a_loose_object_is_named(state_dir, store, populated):
    path = store.loose.path(populated["blob"])
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x01
        f.seek(0)
        f.write(data)
    p = run_cli(state_dir, "fsck")
    assert p.returncode != 0
    assert "Traceback" not in p.stderr.decode()
    assert f"corrupt-object: {path}:" in p.stderr.decode()
    code, rep = _fsck_json(state_dir)
    assert code != 0 and rep["clean"] is False
    assert [(x["kind"], x["where"]) for x in rep["problems"]][0] == ("corrupt-object", path)


def test_ref_to_a_missing_object_names_the_ref(state_dir, store, populated):
    os.unlink(store.loose.path(populated["msg"]))
    p = run_cli(state_dir, "fsck")
    assert p.returncode != 0
    assert f"missing-object: {G}/head: ref points to missing object {populated['msg'].hex()}" in p.stderr.decode()
    _, rep = _fsck_json(state_dir)
    assert {"kind": "missing-object", "where": f"{G}/head",
            "message": f"ref points to missing object {populated['msg'].hex()}",
            "next": NEXT["missing-object"]} in rep["problems"]


def test_broken_link_is_a_problem(state_dir, store, populated):
    os.unlink(store.loose.path(populated["blob"]))
    code, rep = _fsck_json(state_dir)
    assert code != 0 and rep["clean"] is False
    assert rep["problems"] == [
        {"kind": "broken-link", "where": populated["msg"].hex(),
         "message": f"links to missing object {populated['blob'].hex()}", "next": NEXT["broken-link"]}
    ]


def test_edited_reflog_is_a_mismatch(state_dir, store, populated):
    # The reflog file is written by a checkpoint (objects_spec.md §6.8); the
    # objects the ref names are loose (put outside any step).
    assert store.refs.checkpoint(G)
    path = store.refs.log_path(G)
    with open(path, "rb") as f:
        data = f.read()
    # Same length (the ref file records it), different last "new" id.
    edited = data.replace(populated["msg"].hex().encode(), populated["dangling"].hex().encode())
    assert edited != data and len(edited) == len(data)
    with open(path, "wb") as f:
        f.write(edited)
    code, rep = _fsck_json(state_dir)
    assert code != 0
    assert [(x["kind"], x["where"]) for x in rep["problems"]] == [("reflog-mismatch", f"{G}/head")]
    assert populated["dangling"].hex() in rep["problems"][0]["message"]


def test_edited_step_record_is_damage_not_a_tail(state_dir, store, populated):
    # The step log's counterpart: a committed record followed by another
    # that a byte flip broke is no torn append (§6.8): fsck names the group.
    store.refs.transaction(G, [RefUpdate("tip", None, populated["blob"])], reason="second")
    path = store.refs.steps_path(G)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.index(b"first message")  # inside the first record: its checksum fails, the second is intact
    data[at] ^= 0x20
    with open(path, "wb") as f:
        f.write(data)
    code, rep = _fsck_json(state_dir)
    assert code == 1
    assert ("corrupt-ref", path) in [(x["kind"], x["where"]) for x in rep["problems"]]  # the log, named once


def test_ref_missing_from_its_reflog_is_a_mismatch(state_dir, store, populated):
    store.refs.transaction(G, [RefUpdate("tip", None, populated["blob"])], reason="second")
    assert store.refs.checkpoint(G)  # both transactions' lines in the reflog file
    path = store.refs.log_path(G)
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    first, second = lines
    # Keep the recorded size, but make the second line name another ref.
    with open(path, "wb") as f:
        f.write(first + second.replace(b" tip\t", b" tap\t"))
    _, rep = _fsck_json(state_dir)
    kinds = sorted((x["kind"], x["where"]) for x in rep["problems"])
    assert kinds == [("reflog-mismatch", f"{G}/tap"), ("reflog-mismatch", f"{G}/tip")]


def test_garbage_in_refs_dir_is_reported_not_fatal(state_dir, store, populated):
    # An editor's backup file next to a ref file must not crash fsck.
    assert store.refs.checkpoint(G)  # the ref file exists
    with open(store.refs.ref_path(G) + "~", "wb") as f:
        f.write(b"junk")
    code, rep = _fsck_json(state_dir)
    assert code == 1
    assert [(x["kind"], x["where"]) for x in rep["problems"]] == [("corrupt-ref", f"{G}~")]


def test_garbage_in_steps_dir_is_reported_not_fatal(state_dir, store, populated):
    # The same next to a step log (§11 checks 2b and 7): not a group's log, nor a crash.
    backup = store.refs.steps_path(G) + "~"
    with open(backup, "wb") as f:
        f.write(b"junk")
    code, rep = _fsck_json(state_dir)
    assert code == 1
    assert [(x["kind"], x["where"]) for x in rep["problems"]] == [("corrupt-ref", f"{G}~")]
    assert backup in rep["strayFiles"]


@pytest.mark.parametrize("damaged", ["ref file", "step log header"])
def test_corrupt_ref_file(state_dir, store, populated, damaged):
    if damaged == "ref file":
        assert store.refs.checkpoint(G)  # the ref file exists
        with open(store.refs.ref_path(G), "ab") as f:
            f.write(b"not a ref line\n")
    else:
        path = store.refs.steps_path(G)
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data.replace(b"kxen-steps 2 ", b"kxen-steps 9 ", 1))
    code, rep = _fsck_json(state_dir)
    assert code == 1 and rep["problems"][0]["kind"] == "corrupt-ref"


def test_stray_file_among_objects_is_listed(state_dir, store, populated):
    stray = os.path.join(os.path.dirname(store.loose.path(populated["blob"])), "tmp_leftover")
    with open(stray, "wb") as f:
        f.write(b"half-written")
    code, rep = _fsck_json(state_dir)
    assert code == 0 and rep["strayFiles"] == [stray]


def test_fsck_on_a_missing_state_dir_creates_nothing(tmp_path):
    state = tmp_path / "nowhere" / "state"
    p = run_cli(state, "fsck")
    assert p.returncode == 0, p.stderr.decode()
    assert not (tmp_path / "nowhere").exists()
    code, rep = _fsck_json(state)
    assert code == 0 and rep["clean"] is True and rep["objects"] == 0
    assert list(tmp_path.iterdir()) == []


def test_fsck_on_an_empty_existing_dir_writes_nothing(state_dir):
    state_dir.mkdir()
    assert run_cli(state_dir, "fsck").returncode == 0
    assert list(state_dir.iterdir()) == []


def test_newer_format_version_is_refused_in_one_line(state_dir, populated):
    (state_dir / "FORMAT").write_bytes(b"kxen-agent-state 99\n")
    for args in (["fsck"], ["fsck", "--json"], ["cat-object", populated["msg"].hex()[:8]]):
        p = run_cli(state_dir, *args)
        assert p.returncode != 0
        line = one_line_error(p.stderr)
        assert "format version 99" in line and "upgrade kxen-agent" in line
        assert p.stdout == b""


def test_foreign_directory_is_refused(state_dir):
    state_dir.mkdir()
    (state_dir / "notes.txt").write_text("mine")
    p = run_cli(state_dir, "fsck")
    assert p.returncode != 0
    assert "is not empty and is not a kxen-agent state dir" in one_line_error(p.stderr)
    assert sorted(os.listdir(state_dir)) == ["notes.txt"]


def test_garbled_format_file_is_refused(state_dir):
    state_dir.mkdir()
    (state_dir / "FORMAT").write_bytes(b"something else\n")
    p = run_cli(state_dir, "fsck")
    assert p.returncode != 0
    assert "is not a kxen-agent format file" in one_line_error(p.stderr)


# ------------------------------------------------------------------ cat-object


def test_cat_object_by_prefix(state_dir, populated):
    msg = populated["msg"].hex()
    p = run_cli(state_dir, "cat-object", msg[:8])
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert out.startswith(f"message {msg}\n")
    assert json.loads(out.split("\n", 1)[1]) == {
        "attachment": populated["blob"].hex(), "role": "user", "text": "see the attachment"}

    p = run_cli(state_dir, "cat-object", "--json", msg[:12].upper())
    assert p.returncode == 0, p.stderr.decode()
    got = json.loads(p.stdout)
    assert got["id"] == msg and got["kind"] == "message" and got["value"]["role"] == "user"

    p = run_cli(state_dir, "cat-object", populated["blob"].hex())
    assert p.returncode == 0 and p.stdout == b"the file the message talks about\n"


# Two blobs whose ids share their first 8 hex digits (found by brute force).
AMBIGUOUS = (b"ambiguous-96139", b"ambiguous-135267")


def test_cat_object_ambiguous_prefix(state_dir, store):
    a, b = (store.put("blob", v) for v in AMBIGUOUS)
    assert a[:4] == b[:4] and a != b
    p = run_cli(state_dir, "cat-object", a.hex()[:8])
    assert p.returncode == 2
    assert "ambiguous" in one_line_error(p.stderr)
    # One more digit is enough to tell them apart.
    n = next(i for i in range(8, 64) if a.hex()[i] != b.hex()[i]) + 1
    p = run_cli(state_dir, "cat-object", a.hex()[:n])
    assert p.returncode == 0 and p.stdout == AMBIGUOUS[0]


@pytest.mark.parametrize("arg", ["deadbeef", "0" * 64, "nothex!!", "abc", "g" * 8])
def test_cat_object_unknown_or_bad_id(state_dir, populated, arg):
    p = run_cli(state_dir, "cat-object", arg)
    assert p.returncode != 0
    line = one_line_error(p.stderr)
    assert line.startswith("kxen-agent: error:")
    assert p.stdout == b""


def test_cat_object_of_a_corrupt_object_is_one_line(state_dir, store, populated):
    path = store.loose.path(populated["msg"])
    with open(path, "ab") as f:
        f.write(b"\x00")
    p = run_cli(state_dir, "cat-object", populated["msg"].hex())
    assert p.returncode != 0
    assert "bytes follow the zstd frame" in one_line_error(p.stderr)


def test_in_process_fsck_agrees_with_the_cli(state_dir, store, populated):
    rep = fsck(store)
    code, js = _fsck_json(state_dir)
    assert rep.to_json() == js and code == 0


def test_the_mcp_and_prompts_dirs_are_not_stray(state_dir, store, populated):
    # An MCP run's process-group records (§14.15) and the chat prompt history (§1.3) are the state
    # dir's own; another top-level name is listed.
    for name in ("mcp", "prompts", "notes"):
        os.makedirs(os.path.join(state_dir, name))
        with open(os.path.join(state_dir, name, "x.json"), "w") as f:
            f.write("{}")
    code, rep = _fsck_json(state_dir)
    assert code == 0 and rep["strayFiles"] == [os.path.join(str(state_dir), "notes")]
