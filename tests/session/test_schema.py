"""Session-layer object shapes (``objects_spec.md`` §14) against what real runs write and hostile input.

The objects come from a real run of the CLI (tool calls, a long output in a
blob, a fork, a rebind-free import): every one must pass the schema, and
every single-key damage of every one must be refused. Then the damage is
put where users meet it — a hand-edited state dir, a bundle from elsewhere —
and each command must answer in one line naming the object.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kxen_agent.session.schema import SESSION_SCHEMA, check, ref_kind
from kxen_agent.store import RefUpdate, Store
from kxen_agent.store.objects import SchemaViolation, decode_body
from tests.helpers import Cli, Proc, depth, git_workspace, write_agent
from tests.store.helpers import closure

LONG = "x" * 3000  # over both blob thresholds: a content blob and an output blob
STEPS = [
    {"content": "Looking.",
     "tool_calls": [{"name": "shell", "arguments": {"command": f"printf '{LONG}'"}},
                    {"name": "write_file", "arguments": {"path": "NOTES.md", "content": "notes\n"}}]},
    {"content": "Done: " + LONG},
    {"content": "Second.", "tool_calls": [{"name": "read_file", "arguments": {"path": "NOTES.md"}}]},
    {"content": "Second done."},
]

#: Keys whose removal leaves a valid object (§14: "optional"); every other key of
#: every object a run writes is needed by a reader.
MAY_DROP = {
    "agent": {"version"},  # without it, a version-1 lock (§14.2): valid, read as it always was
    "session": {"previous"},
    "message": {"run", "toolCalls", "toolCallId"},
    # requestedModel ... turnUsage: runs written before §14.5 had them lack them, and still read.
    "run": {"previous", "journal", "requestedModel", "baseUrl", "retryOf", "usage", "turnUsage"},
    "journal": {"output", "outputBlob", "note", "previous", "checkpointBefore", "checkpointAfter"},  # §14.14: optional
}


class Kx(Cli):
    def __call__(self, *args: str, **kw: Any) -> Proc:
        p = super().__call__(*args, **kw)
        assert "Traceback" not in p.err, str(p)
        return p

    def one_line_error(self, *args: str) -> str:
        p = self(*args)
        lines = p.err.strip().splitlines()
        assert p.rc != 0 and len(lines) == 1 and lines[0].startswith("kxen-agent: error: "), str(p)
        return lines[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[tuple[bytes, str, Any]]]:
    """A state dir after two runs and a fork; (state dir, session, every object as (id, kind, value))."""
    tmp = tmp_path_factory.mktemp("schema")
    kx = Kx(tmp / "state")
    ws = git_workspace(tmp / "ws")
    agent = write_agent(tmp / "agent", STEPS)
    ses = kx.run_json(ws, "first", agent, expect=0).json()["session"]
    kx.resume(ses, "--task", "second", expect=0)
    kx("session", "fork", ses, expect=0)
    store = Store(str(tmp / "state"))
    objs = []
    for oid in store.iter_ids():
        raw = store.read_raw(oid)
        objs.append((oid, raw.kind, decode_body(raw)))
    return tmp / "state", ses, objs


def _other_type(v: Any) -> Any:
    """A value of a type the key cannot have (every key's type is fixed, §14)."""
    if isinstance(v, bool):
        return 1
    if isinstance(v, (int, bytes)):
        return "text"
    if isinstance(v, str) or v is None:  # null keys are "text or null"
        return 5
    if isinstance(v, list):
        return {"a": 1}
    return [1]


def test_every_object_a_run_writes_matches_the_schema(made) -> None:
    _, _, objs = made
    kinds = {oid: kind for oid, kind, _ in objs}
    seen = {kind for _, kind, _ in objs}
    assert seen == {"agent", "session", "message", "run", "journal", "blob"}, seen
    for oid, kind, value in objs:
        for child, want in check(kind, value):
            assert kinds[child] == want, (oid.hex(), kind, child.hex(), want)


def test_every_needed_key_removed_or_retyped_is_refused(made) -> None:
    _, _, objs = made
    tried = 0
    for oid, kind, value in objs:
        if kind == "blob":
            continue
        for key in value:
            dropped = {k: v for k, v in value.items() if k != key}
            optional = key in MAY_DROP[kind] or (
                kind == "journal" and key == "isError" and value["state"] in ("Started", "OutcomeUnknown"))
            if optional:
                check(kind, dropped)
            else:
                with pytest.raises(SchemaViolation):
                    check(kind, dropped)
            with pytest.raises(SchemaViolation):
                check(kind, {**value, key: _other_type(value[key])})
            tried += 2
        check(kind, {**value, "addedByANewerWriter": 1})  # readers ignore keys they do not know
    assert tried > 200, tried


def test_cross_key_rules() -> None:
    """Rules over several keys: seq 0 iff no parent, content xor blob, tool calls on assistants only."""
    link = b"\x01" * 32
    base = {"seq": 1, "role": "assistant", "parent": link, "content": "hi"}
    check("message", base)
    for bad, why in [
        ({**base, "seq": 0}, "seq 0"),
        ({k: v for k, v in base.items() if k != "parent"}, "seq 1"),
        ({**base, "contentBlob": link}, "exactly one"),
        ({**base, "role": "user", "toolCalls": [{"id": "c", "name": "shell", "arguments": "{}"}]}, "user message"),
        ({**base, "toolCalls": []}, "non-empty"),
        ({**base, "toolCalls": [{"id": "c", "name": "shell"}]}, "toolCalls[0]: key 'arguments' is missing"),
        ({**base, "role": "system"}, "expected one of user, assistant, tool"),
    ]:
        with pytest.raises(SchemaViolation, match=re.escape(why)):
            check("message", bad)
    assert ref_kind("sessions/ses_0123456789", "runs/run_x") == "run"
    assert ref_kind("other/x", "meta") is None


# ---------------------------------------------------------------- where users meet it


def _damaged_copy(made, tmp_path: Path) -> tuple[Kx, Store, str]:
    import shutil

    state, ses, _ = made
    shutil.copytree(state, tmp_path / "state")
    return Kx(tmp_path / "state"), Store(str(tmp_path / "state")), ses


def _move(store: Store, ses: str, name: str, new: bytes) -> None:
    old = store.refs.read(f"sessions/{ses}").refs[name]
    store.refs.transaction(f"sessions/{ses}", [RefUpdate(name, old, new)], reason="test: hand edit")


def test_a_hand_edited_message_is_one_line_everywhere(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    head = store.refs.read(f"sessions/{ses}").refs["head"]
    bad = store.put("message", {"seq": "7", "role": "user", "parent": head, "content": "hand-made"})
    _move(store, ses, "head", bad)
    for args in (("session", "log", ses), ("session", "show", ses), ("session", "fork", ses),
                 ("--resume", ses, "--task", "more")):
        err = kx.one_line_error(*args)
        assert bad.hex() in err and "§14.4" in err and "key 'seq' must be an int" in err, (args, err)
    # The listing names the damaged session and lists the rest (the fork's head is older).
    p = kx("session", "list", "--json", expect=0)
    assert [s["id"] for s in p.json()["sessions"]] != [] and ses not in [s["id"] for s in p.json()["sessions"]]
    assert p.err.startswith(f"kxen-agent: warning: ignoring sessions/{ses}") and bad.hex() in p.err, p.err
    rep = kx("fsck", "--json").json()
    assert not rep["clean"]
    assert [(p["kind"], p["message"]) for p in rep["problems"]] == [
        ("schema", "message object: key 'seq' must be an int, not text")], rep["problems"]


def test_a_link_to_the_wrong_kind_and_a_blob_without_utf8(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    group = store.refs.read(f"sessions/{ses}")
    run_state = next(v for k, v in group.refs.items() if k.startswith("runs/"))
    # A message whose parent is a run state: the store's kind check stops the reader.
    bad = store.put("message", {"seq": 1, "role": "user", "parent": run_state, "content": "x"})
    _move(store, ses, "head", bad)
    err = kx.one_line_error("session", "log", ses)
    assert run_state.hex() in err and "expected a message" in err, err
    rep = kx("fsck", "--json").json()
    assert any(p["kind"] == "schema" and p["where"] == bad.hex() and "a run, where a message" in p["message"]
               for p in rep["problems"]), rep["problems"]
    # A content blob that is not UTF-8.
    blob = store.put("blob", b"\xff\xfe not text")
    worse = store.put("message", {"seq": 0, "role": "user", "contentBlob": blob})
    _move(store, ses, "head", worse)
    err = kx.one_line_error("session", "log", ses)
    assert blob.hex() in err and "no UTF-8 text" in err, err


def test_a_run_ref_naming_another_runs_state(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    runs = sorted((k, v) for k, v in store.refs.read(f"sessions/{ses}").refs.items() if k.startswith("runs/"))
    (a, a_oid), (b, b_oid) = runs
    _move(store, ses, a, b_oid)
    err = kx.one_line_error("run", "show", ses, a[5:])
    assert f"names the state of run {b[5:]}" in err, err
    err = kx.one_line_error("session", "show", ses)
    assert b_oid.hex() in err, err


def test_import_refuses_a_bundle_with_a_damaged_object_and_writes_nothing(made, tmp_path: Path) -> None:
    from kxen_agent.store.bundle import export_bundle

    kx, store, ses = _damaged_copy(made, tmp_path)
    group = store.refs.read(f"sessions/{ses}")
    run_state = next(v for k, v in group.refs.items() if k.startswith("runs/"))
    cases = {
        # (the run state is also named by its runs/ ref: either clash is the error)
        "parent-is-a-run": ({"seq": 1, "role": "user", "parent": run_state, "content": "x"},
                            f"object {run_state.hex()} must be a run for ref sessions/{ses}/runs/"),
        "parent-is-a-blob": ({"seq": 1, "role": "user", "parent": store.put("blob", b"b"), "content": "x"},
                             f"must name a message object, but object {store.put('blob', b'b').hex()} is a blob"),
        "bad-role": ({"seq": 1, "role": "robot", "parent": group.refs["head"], "content": "x"},
                     "(message): key 'role' is 'robot', expected one of user, assistant, tool"),
    }
    for name, (value, why) in cases.items():
        bad = store.put("message", value)
        _move(store, ses, "head", bad)
        bundle = tmp_path / f"{name}.bundle"
        export_bundle(store, [f"sessions/{ses}"], str(bundle))
        err = kx.one_line_error("bundle", "verify", str(bundle))
        assert why in err, err
        target = Kx(tmp_path / f"target-{name}")
        err = target.one_line_error("session", "import", str(bundle), "--workspace",
                                    str(git_workspace(tmp_path / f"ws-{name}")))
        assert f"bad bundle {bundle}" in err and why in err, err
        assert not target.state_dir.exists()
    assert SESSION_SCHEMA.ref_kind(f"sessions/{ses}", "head") == "message"


def test_import_refuses_groups_and_refs_no_session_has(made, tmp_path: Path) -> None:
    """Checked before the state dir is touched: a group id that is no session id, a ref no session has,
    a meta that is another session's, a run ref naming another run's state."""
    from kxen_agent.store.bundle import export_bundle

    kx, store, ses = _damaged_copy(made, tmp_path)
    group = store.refs.read(f"sessions/{ses}").refs
    meta, head = group["meta"], group["head"]
    (a, a_oid), (b, b_oid) = sorted((k, v) for k, v in group.items() if k.startswith("runs/"))
    other = "ses_00000000000000000000"
    cases = {
        "bad-id": ("sessions/notasession", {"meta": meta}, "'sessions/notasession', which is not a session"),
        "odd-ref": (f"sessions/{ses}", {"meta": meta, "zzz": head}, "has ref 'zzz', which no session has"),
        "meta-of-another": (f"sessions/{other}", {"meta": meta}, f"the metadata of session {other} is that of {ses}"),
        "run-of-another": (f"sessions/{ses}", {"meta": meta, a: b_oid},
                           f"ref sessions/{ses}/{a} names the state of run {b[5:]}"),
    }
    for name, (g, refs, why) in cases.items():
        src = Store(str(tmp_path / f"src-{name}"))
        for oid in sorted(closure(store, list(refs.values()))):
            raw = store.read_raw(oid)
            src.put_raw(raw)
        src.refs.transaction(g, [RefUpdate(n, None, v) for n, v in sorted(refs.items())], reason="test")
        bundle = tmp_path / f"{name}.bundle"
        export_bundle(src, [g], str(bundle))
        target = Kx(tmp_path / f"target-{name}")
        err = target.one_line_error("session", "import", str(bundle), "--workspace",
                                    str(git_workspace(tmp_path / f"ws-{name}")))
        assert why in err and "nothing imported" in err, (name, err)
        assert not target.state_dir.exists()


def test_a_fork_tree_whose_parents_make_a_cycle_is_drawn_once(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    fork = next(s["id"] for s in kx("session", "list", "--json", expect=0).json()["sessions"] if s["id"] != ses)
    meta_oid = store.refs.read(f"sessions/{fork}").refs["meta"]
    meta = store.get(meta_oid, "session")
    _move(store, fork, "meta", store.put("session", {**meta, "parentId": fork}))  # its own parent
    drawn = kx("session", "tree", ses, expect=0).out.splitlines()
    assert len(drawn) == 2 and drawn[1].startswith(f"* {ses}") and fork in drawn[0], drawn
    tree = kx("session", "tree", fork, "--json", expect=0).json()
    assert tree["id"] == ses and [c["id"] for c in tree["children"]] == [fork], tree


def test_a_task_on_a_session_whose_head_does_not_read_starts_no_run(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    head = store.refs.read(f"sessions/{ses}").refs["head"]
    before = sorted(k for k in store.refs.read(f"sessions/{ses}").refs if k.startswith("runs/"))
    _move(store, ses, "head", store.put("message", {"seq": 9, "role": "user", "parent": head, "content": 5}))
    err = kx.one_line_error("--resume", ses, "--task", "more")
    assert "key 'content' must be text or null, not int" in err, err
    after = sorted(k for k in store.refs.read(f"sessions/{ses}").refs if k.startswith("runs/"))
    assert after == before


def test_the_fast_message_check_agrees_with_the_rules() -> None:
    """``check("message")`` judges common shapes in a few lookups; it must accept exactly what the
    rule-by-rule check accepts, with the same links (hypothesis: valid messages with 0-3 random edits)."""
    from hypothesis import given, settings, strategies as st

    from kxen_agent.session.schema import _message_slow

    link = st.sampled_from([b"\x01" * 32, b"\x02" * 32])
    anything = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from(["", "x", "user", "tool"]),
                         link, st.just([]), st.just({}), st.just([{"id": "c", "name": "shell", "arguments": "{}"}]),
                         st.just([{"id": "c", "name": "shell"}]), st.just(["c"]))
    call = {"id": "c", "name": "shell", "arguments": "{}"}
    bases = [
        {"seq": 0, "role": "user", "content": "hi", "run": "run_0123456789"},
        {"seq": 2, "role": "assistant", "parent": b"\x01" * 32, "content": None, "toolCalls": [call, dict(call)],
         "run": "run_0123456789"},
        {"seq": 3, "role": "tool", "parent": b"\x02" * 32, "contentBlob": b"\x01" * 32, "toolCallId": "c"},
    ]
    keys = ["seq", "role", "parent", "content", "contentBlob", "run", "toolCalls", "toolCallId", "other"]
    edit = st.tuples(st.sampled_from(keys), st.one_of(st.just("drop"), anything))
    seen = {"valid": 0, "invalid": 0}

    # 1500 examples (derandomized: the same ones each run); KXEN_TEST_LONG=1: 3000.
    @settings(max_examples=depth(fast=1500, long=3000), deadline=None, database=None, derandomize=True)
    @given(st.sampled_from(bases), st.lists(edit, max_size=3))
    def agree(base: dict, edits: list) -> None:
        v = dict(base)
        for key, new in edits:
            if new == "drop":
                v.pop(key, None)
            else:
                v[key] = new
        try:
            want = _message_slow(v)
        except SchemaViolation:
            seen["invalid"] += 1
            with pytest.raises(SchemaViolation):
                check("message", v)
        else:
            seen["valid"] += 1
            assert check("message", v) == want

    agree()
    assert seen["valid"] > 150 and seen["invalid"] > 150, seen  # both sides exercised


def test_session_list_names_a_damaged_group_and_lists_the_rest(made, tmp_path: Path) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    good = sorted(s["id"] for s in kx("session", "list", "--json", expect=0).json()["sessions"])
    meta = store.refs.read(f"sessions/{ses}").refs["meta"]
    store.refs.transaction("sessions/notasession", [RefUpdate("meta", None, meta)], reason="test: hand edit")
    p = kx("session", "list", "--json", expect=0)
    assert sorted(s["id"] for s in p.json()["sessions"]) == good
    lines = p.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kxen-agent: warning: ignoring sessions/notasession"), p.err
    assert "fsck" in lines[0]


def test_a_bundle_mixing_in_another_group_is_refused_before_any_object_is_read(tmp_path: Path) -> None:
    from kxen_agent.store.bundle import export_bundle

    src = Store(str(tmp_path / "src"))
    blob = src.put("blob", b"not a session")
    src.refs.transaction("sessions/ses_0123456789abcdef0123", [RefUpdate("meta", None, blob)], reason="test")
    src.refs.transaction("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz/x", [RefUpdate("x", None, blob)], reason="test")
    bundle = tmp_path / "mixed.bundle"
    export_bundle(src, ["sessions/ses_0123456789abcdef0123", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz/x"], str(bundle))
    kx = Kx(tmp_path / "state")
    err = kx.one_line_error("session", "import", str(bundle), "--workspace", str(git_workspace(tmp_path / "ws")))
    assert "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz/x', which is not a session" in err, err
    assert not kx.state_dir.exists()


@pytest.mark.parametrize("script", ['[{"content": NaN}]', '[{"content": 1e999}]', "[" * 5000 + "]" * 5000])
def test_an_agent_lock_whose_script_is_not_plain_json(made, tmp_path: Path, script: str) -> None:
    kx, store, ses = _damaged_copy(made, tmp_path)
    meta_oid = store.refs.read(f"sessions/{ses}").refs["meta"]
    meta = store.get(meta_oid, "session")
    agent = {**store.get(meta["agent"], "agent"), "script": script}
    _move(store, ses, "meta", store.put("session", {**meta, "agent": store.put("agent", agent)}))
    err = kx.one_line_error("session", "show", ses)
    assert "§14.2" in err and "key 'script' is not a valid steps list" in err, err
    rep = kx("fsck", "--json").json()
    assert any(p["kind"] == "schema" and "key 'script'" in p["message"] for p in rep["problems"]), rep["problems"]


def test_agent_lock_versions(made) -> None:
    """§14.2: version 2 on needs policy.env_keep; no version is version 1; a newer version is refused;
    the anthropic provider needs version 3."""
    _, _, objs = made
    (lock,) = {oid: value for oid, kind, value in objs if kind == "agent"}.values()
    assert lock["version"] == 3 and lock["policy"]["env_keep"] == []
    check("agent", {**lock, "version": 2})
    claude = {**lock, "provider": "anthropic", "model": "claude-x", "script": None}
    check("agent", claude)
    with pytest.raises(SchemaViolation, match="provider 'anthropic' needs a version-3 lock, not version 2"):
        check("agent", {**claude, "version": 2})
    with pytest.raises(SchemaViolation, match="key 'model' is empty, but the provider is 'anthropic'"):
        check("agent", {**claude, "model": ""})
    v1 = {k: v for k, v in lock.items() if k != "version"}
    v1["policy"] = {k: v for k, v in lock["policy"].items() if k != "env_keep"}
    check("agent", v1)
    with pytest.raises(SchemaViolation, match="'policy.env_keep' must be an array of text"):
        check("agent", {**lock, "policy": v1["policy"]})
    with pytest.raises(SchemaViolation, match="agent lock version 7 is newer than this kxen-agent reads"):
        check("agent", {**lock, "version": 7})
    # Version 4: the answer limits, each absent (the default) or a positive int.
    check("agent", {**lock, "version": 4, "policy": {**lock["policy"], "max_tool_calls": 8}})
    with pytest.raises(SchemaViolation, match="'max_tool_calls' must be an int"):
        check("agent", {**lock, "version": 4, "policy": {**lock["policy"], "max_tool_calls": "8"}})
