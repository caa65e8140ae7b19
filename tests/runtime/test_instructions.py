"""Project instructions (AGENTS.md): read at a run's start, recorded in the run, given to the model.

In-process runs over a ``MemoryStore`` with a provider that records what
the model is sent; one CLI case runs real processes through ``run show``,
export and import into a fresh state dir, and checks every stored byte for
the planted secret.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kxen_agent.runtime.instructions import MAX_FILE_BYTES, read_instructions
from kxen_agent.runtime.providers import make_provider
from kxen_agent.runtime.runner import Runner
from kxen_agent.session.agent_def import default_agent_definition, parse_agent_definition
from kxen_agent.session.schema import check, text_blob
from kxen_agent.store.memory import MemoryStore
from kxen_agent.store.objects import SchemaViolation
from tests.helpers import Cli, object_bytes, write_agent

SECRET = "kxen-planted-secret-4f2a9c"  # the value of a credential-looking variable of the runner


class Recorder:
    """A provider that keeps the messages of each model call, then lets the script provider answer."""

    def __init__(self, inner, calls: list) -> None:
        self.inner, self.calls = inner, calls

    def complete(self, messages, specs, **kw):
        self.calls.append([dict(m) for m in messages])
        return self.inner.complete(messages, specs, **kw)

    def close(self) -> None:
        self.inner.close()


class Crash(BaseException):
    pass


def runner(store: MemoryStore, calls: list, events: list | None = None, fault=None) -> Runner:
    return Runner(store, providers=lambda lock, ep: Recorder(make_provider(lock, ep), calls),
                  on_event=(events if events is not None else []).append, fault=fault or (lambda p: None))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = Path(os.path.realpath(tmp_path)) / "ws"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "AGENTS.md").write_text("Root: run make test.\n")
    (root / "pkg" / "AGENTS.md").write_text("Pkg: keep the API stable.\n")
    (root / "pkg" / "deep" / "CLAUDE.md").write_text("Deep: claude notes.\n")
    return root


def preamble(call: list[dict]) -> list[dict]:
    return [m for m in call if m["role"] == "system"]


def test_nested_files_recorded_in_order_and_given_after_the_system_prompt(ws: Path, monkeypatch) -> None:
    monkeypatch.chdir(ws / "pkg" / "deep")
    store, calls = MemoryStore("instr"), []
    res = runner(store, calls).start(str(ws), "task", default_agent_definition([{"content": "done"}]))
    assert res.status == "completed"
    r = Runner(store)
    st = r.run_state(r.sessions.get(res.session), res.run)[1]
    assert [(i["path"], i["size"], i["truncated"]) for i in st["instructions"]] == [
        ("AGENTS.md", 21, False), ("pkg/AGENTS.md", 26, False)]  # CLAUDE.md is not a default name
    assert [text_blob(store, i["blob"]) for i in st["instructions"]] == ["Root: run make test.\n",
                                                                        "Pkg: keep the API stable.\n"]
    [call] = calls
    system, instr = preamble(call)
    assert call[:2] == [system, instr] and system["content"] == "You are a careful coding agent."
    assert instr["content"].index("--- AGENTS.md ---\nRoot: run make test.") < instr["content"].index(
        "--- pkg/AGENTS.md ---\nPkg: keep the API stable.")
    # [policy] instructions names the files; the default is not written into the lock.
    steps = ws.parent / "s.json"
    steps.write_text('[{"content": "done"}]')
    lock = parse_agent_definition('name = "a"\nprovider = "script"\nscript = "s.json"\n[policy]\n'
                                  'instructions = ["AGENTS.md", "CLAUDE.md"]\n', str(ws.parent), "inline")
    assert lock["version"] == 6 and lock["policy"]["instructions"] == ["AGENTS.md", "CLAUDE.md"]
    default = parse_agent_definition('name = "a"\nprovider = "script"\nscript = "s.json"\n[policy]\n'
                                     'instructions = ["AGENTS.md"]\n', str(ws.parent), "inline")
    assert default["version"] == 3 and "instructions" not in default["policy"]
    res = Runner(store).start(str(ws), "task", lock)
    st = Runner(store).run_state(Runner(store).sessions.get(res.session), res.run)[1]
    assert [i["path"] for i in st["instructions"]] == ["AGENTS.md", "pkg/AGENTS.md", "pkg/deep/CLAUDE.md"]
    none = parse_agent_definition('name = "a"\nprovider = "script"\nscript = "s.json"\n[policy]\ninstructions = []\n',
                                  str(ws.parent), "inline")
    res = Runner(store).start(str(ws), "task", none)
    assert "instructions" not in Runner(store).run_state(Runner(store).sessions.get(res.session), res.run)[1]
    with pytest.raises(SchemaViolation, match="instructions"):
        check("run", {**st, "instructions": [{"path": "AGENTS.md", "blob": b"\0" * 32, "size": "1",
                                              "truncated": False}]})


def test_a_resume_uses_the_recorded_text_not_the_file_now(ws: Path, monkeypatch) -> None:
    monkeypatch.chdir(ws)
    store, calls = MemoryStore("instr"), []
    steps = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    lock = default_agent_definition(steps)

    def crash(point: str) -> None:
        if point == "provider:after-response" and len(calls) == 2:
            raise Crash(point)

    with pytest.raises(Crash):
        runner(store, calls, fault=crash).start(str(ws), "task", lock)
    (ws / "AGENTS.md").write_text("Root: CHANGED after the run started.\n")
    [info] = Runner(store).sessions.list()
    res = runner(store, calls).resume(info.id)
    assert res.status == "completed" and len(calls) == 3
    assert all("Root: run make test." in preamble(c)[1]["content"] for c in calls)
    assert not any("CHANGED" in m["content"] for c in calls for m in preamble(c))
    # A new run (a new task) reads the file as it is at its start.
    res = runner(store, calls).resume(info.id, task="again")
    assert "CHANGED" in preamble(calls[-1])[1]["content"]


def test_the_bound_and_redaction(tmp_path: Path) -> None:
    root = Path(os.path.realpath(tmp_path))
    straddle = "x" * (MAX_FILE_BYTES - 10) + SECRET + "\n" + "y" * 50_000
    (root / "AGENTS.md").write_text(straddle)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.md"
    outside.write_text("outside the workspace\n")
    (root / "sub").mkdir()
    os.symlink(outside, root / "sub" / "AGENTS.md")
    found = read_instructions(str(root), str(root / "sub"), ["AGENTS.md"], [SECRET])
    [f] = found.files
    raw = f.text.encode("utf-8")
    assert f.truncated and f.size == len(straddle) and len(raw) == MAX_FILE_BYTES
    assert SECRET[:8] not in f.text and f.text.endswith("x[REDACTED]")  # redacted whole, then cut
    assert any(w.endswith("outside the workspace (or in its Git internals): not read") for w in found.warnings)
    os.mkfifo(root / "CLAUDE.md")  # never opened: it would block a reader with no writer
    fifo = read_instructions(str(root), None, ["CLAUDE.md"], [])
    assert fifo.files == () and fifo.warnings == (f"{root / 'CLAUDE.md'} is not a regular file: not read",)
    assert any(f"AGENTS.md is {len(straddle)} bytes, over the {MAX_FILE_BYTES}-byte bound" in w
               for w in found.warnings)


def test_run_show_export_import_and_no_secret_stored(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    planted = f"Build with make.\nDEPLOY_TOKEN={SECRET}\n"
    (ws / "AGENTS.md").write_text(planted)
    (ws / "sub" / "AGENTS.md").write_text("x" * (MAX_FILE_BYTES + 100))
    agent = write_agent(tmp_path / "agent", [{"content": "done"}])
    a = Cli(tmp_path / "state-a", {"KXEN_TEST_DEPLOY_TOKEN": SECRET}, strict=True)
    p = a("run", "--workspace", str(ws), "--task", "go", "--agent", str(agent), cwd=ws / "sub", expect=0)
    assert f"sub/AGENTS.md is {MAX_FILE_BYTES + 100} bytes, over the {MAX_FILE_BYTES}-byte bound" in p.err
    [ses] = a.sessions()
    shown = a("run", "show", ses["id"], "--json", expect=0).json()
    res = {"session": shown["session"], "run": shown["run"]}
    assert [(i["path"], i["size"], i["truncated"]) for i in shown["instructions"]] == [
        ("AGENTS.md", len(planted), False), ("sub/AGENTS.md", MAX_FILE_BYTES + 100, True)]
    text = a("run", "show", res["session"], res["run"], expect=0).out
    ids = [i["object"] for i in shown["instructions"]]
    assert f"instructions: AGENTS.md ({ids[0][:12]}), sub/AGENTS.md ({ids[1][:12]}, truncated)" in text
    for path, raw in object_bytes(a.state_dir):
        assert SECRET.encode() not in raw, path
    bundle = tmp_path / "s.bundle"
    a("session", "export", res["session"], "--output", str(bundle), expect=0)
    b = Cli(tmp_path / "state-b", strict=True)
    (ws / "AGENTS.md").write_text("Changed on the other machine.\n")
    b("session", "import", str(bundle), "--workspace", str(ws), expect=0)
    assert b.run_show(res["session"], res["run"])["instructions"] == shown["instructions"]
    b.fsck_clean()
    assert json.loads(json.dumps(shown["instructions"]))  # plain JSON


@pytest.mark.parametrize("value, why", [('"AGENTS.md"', "expected an array of file names, got string"),
                                        ('["docs/AGENTS.md"]', "'docs/AGENTS.md' is not a file name"),
                                        ('[".."]', "'..' is not a file name"),
                                        ('["A.md", "A.md"]', "'A.md' is listed twice"),
                                        ("[1]", "expected file names (strings), got integer")])
def test_bad_instruction_names_are_refused_in_one_line(tmp_path: Path, value: str, why: str) -> None:
    (tmp_path / "s.json").write_text('[{"content": "done"}]')
    with pytest.raises(Exception, match=r"^inline: key 'policy.instructions': ") as e:
        parse_agent_definition(f'name = "a"\nprovider = "script"\nscript = "s.json"\n[policy]\ninstructions = {value}\n',
                               str(tmp_path), "inline")
    assert why in str(e.value) and "\n" not in str(e.value)
