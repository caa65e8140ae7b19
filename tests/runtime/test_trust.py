"""The trust boundary (objects_spec.md §14.13): what a session from elsewhere can make this machine do.

Real ``kxen-agent`` processes on two state dirs (the author's and the
importer's), real Git clones, a bundle between them, and a fake
Chat Completions server that records every request and its
``Authorization`` header. Each test is one of issue 25's reproductions:
on the code before the trust boundary, each one sent the importer's key,
or ran the author's shell command, on the importer's machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kxen_agent.store import RefUpdate, Store
from tests.helpers import Cli, Proc, git, git_workspace, write_agent

from .fake_openai import FakeOpenAI

SECRET_VAR = "KXEN_TEST_SOME_SECRET"
AUTHOR_KEY = "sk-author-0f1e2d3c4b5a"
IMPORTER_SECRET = "importer-secret-9a8b7c6d5e"


class Kx(Cli):
    """The CLI that never shows a traceback."""

    def __call__(self, *args: str, **kw) -> Proc:  # type: ignore[override]
        p = super().__call__(*args, **kw)
        assert "Traceback" not in p.err, str(p)
        return p


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def clone(src: Path, dst: Path) -> Path:
    """Another checkout of the same repository (no origin, as the source has none: the same identity)."""
    git(src.parent, "clone", "-q", str(src), str(dst))
    git(dst, "remote", "remove", "origin")
    return dst


def two_machines(tmp_path: Path) -> tuple[Path, Kx, Path, Kx]:
    """The author (workspace, CLI with its key) and the importer (a clone, CLI with its own secret)."""
    ws_a = git_workspace(tmp_path / "A")
    ws_b = clone(ws_a, tmp_path / "B")
    a = Kx(tmp_path / "state-a", env={SECRET_VAR: AUTHOR_KEY})
    b = Kx(tmp_path / "state-b", env={SECRET_VAR: IMPORTER_SECRET})
    return ws_a, a, ws_b, b


def move(a: Kx, b: Kx, ses: str, ws_b: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "s.bundle"
    a("session", "export", ses, "--output", str(bundle), expect=0)
    b("session", "import", str(bundle), "--workspace", str(ws_b), expect=0)


def openai_agent(directory: Path, server: FakeOpenAI, **kw) -> Path:
    return write_agent(directory, None, provider="openai", model="gpt-test", base_url=server.base_url,
                       api_key_env=SECRET_VAR, **kw)


def paused(p: Proc, ses: str) -> dict:
    """A run that waits for this machine's decision: exit 3, input_required, the next command named."""
    assert p.rc == 3, str(p)
    res = p.json()
    assert res["status"] == "input_required" and res["unknownOps"] == [], res
    assert f"kxen-agent session trust {ses}" in res["error"] and f"kxen-agent --resume {ses}" in res["error"], res
    return res


# ---------------------------------------------------------------- 1. keys go only where this machine sends them


def test_a_foreign_lock_gets_no_key_until_this_machine_accepts_it(server: FakeOpenAI, tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    server.reply_content("done on A")
    server.reply_content("done on B")
    ses = a.run_json(ws_a, "first", openai_agent(tmp_path / "agent-a", server), expect=0).json()["session"]
    assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {AUTHOR_KEY}"]
    move(a, b, ses, ws_b, tmp_path)

    # The importer's new task: nothing is sent anywhere, the run waits (durably) for a decision.
    res = paused(b("--resume", ses, "--task", "go on", "--json"), ses)
    assert len(server.requests) == 1
    assert SECRET_VAR in res["error"] and server.base_url in res["error"], res
    # Resumed again without a decision: it still waits, still sends nothing.
    paused(b("--resume", ses, "--json"), ses)
    # --base-url alone still names the foreign variable: refused the same way.
    paused(b("--resume", ses, "--base-url", server.base_url + "/", "--json"), ses)
    assert len(server.requests) == 1
    assert b.run_show(ses, res["run"])["status"] == "input_required"

    # What `session trust` shows: the lock as it would be used.
    show = b("session", "trust", ses)  # not a terminal, no --yes: shown, nothing accepted
    assert show.rc == 3, str(show)
    for word in ("provider:", "openai", "gpt-test", server.base_url, SECRET_VAR, "tools:", "shell", "approve:",
                 "env_keep:", "--yes"):
        assert word in show.out, (word, show.out)
    assert len(server.requests) == 1

    b("session", "trust", ses, "--yes", expect=0)
    done = b("--resume", ses, "--json", expect=0).json()
    assert done["status"] == "completed" and done["result"] == "done on B", done
    assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {AUTHOR_KEY}", f"Bearer {IMPORTER_SECRET}"]
    # The acceptance is durable and per lock: the next task runs at once.
    server.reply_content("again")
    assert b("--resume", ses, "--task", "more", "--json", expect=0).json()["status"] == "completed"
    b.fsck_clean()


def test_a_pair_named_on_the_command_line_is_the_other_way_out(server: FakeOpenAI, tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    server.reply_content("ok")
    ses = a.run_json(ws_a, "first", openai_agent(tmp_path / "agent-a", server), expect=0).json()["session"]
    move(a, b, ses, ws_b, tmp_path)
    paused(b("--resume", ses, "--task", "go on", "--json"), ses)
    own = "KXEN_TEST_IMPORTER_OWN_KEY"
    res = b("--resume", ses, "--base-url", server.base_url, "--api-key-env", own, "--json",
            env={own: "importer-own-key"}, expect=0).json()
    assert res["status"] == "completed", res
    assert server.requests[-1].headers["authorization"] == "Bearer importer-own-key"
    bad = b("--resume", ses, "--api-key-env", "lower-case", "--task", "x")
    assert bad.rc == 2 and "--api-key-env" in bad.err, str(bad)


def test_agent_file_re_binds_the_session_to_a_definition_of_this_machine(server: FakeOpenAI, tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    server.reply_content("ok")
    ses = a.run_json(ws_a, "first", openai_agent(tmp_path / "agent-a", server), expect=0).json()["session"]
    move(a, b, ses, ws_b, tmp_path)
    paused(b("--resume", ses, "--task", "go on", "--json"), ses)
    own = "KXEN_TEST_IMPORTER_OWN_KEY"
    mine = write_agent(tmp_path / "agent-b", None, provider="openai", model="gpt-b", base_url=server.base_url,
                       api_key_env=own)
    res = b("--resume", ses, "--agent", str(mine), "--json", env={own: "importer-own-key"}, expect=0).json()
    assert res["status"] == "completed" and res["requestedModel"] == "gpt-b", res
    assert server.requests[-1].headers["authorization"] == "Bearer importer-own-key"
    show = b("session", "show", ses, expect=0).out
    assert f"endpoint:   {server.base_url}" in show and f"key variable: {own}" in show, show


def test_a_foreign_script_lock_runs_no_command_until_accepted(tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    steps = [{"content": "first"},
             {"tool_calls": [{"name": "shell", "arguments": {"command": "touch pwned"}}]},
             {"content": "second"}]
    agent = write_agent(tmp_path / "agent-a", steps)
    ses = a.run_json(ws_a, "first", agent, expect=0).json()["session"]
    move(a, b, ses, ws_b, tmp_path)
    paused(b("--resume", ses, "--task", "go on", "--json"), ses)
    assert not (ws_b / "pwned").exists()
    # A fork made here of the imported session has the same lock: not this machine's either.
    fork = b("session", "fork", ses, "--json", expect=0).json()["id"]
    paused(b("--resume", fork, "--task", "in the fork", "--json"), fork)
    assert not (ws_b / "pwned").exists()
    shown = b("session", "trust", ses).out
    assert "script steps:" in shown and "touch pwned" in shown, shown
    b("session", "trust", ses, "--yes", expect=0)
    assert b("--resume", ses, "--json", expect=0).json()["status"] == "completed"
    assert (ws_b / "pwned").exists()


# ---------------------------------------------------------------- 2. decisions do not travel, facts do


def _importer_with_own_agent(tmp_path: Path, b: Kx, ws_b: Path, server: FakeOpenAI) -> None:
    """The importer runs a session of its own with the same definition: the endpoint and key variable are its own."""
    server.reply_content("mine")
    # no_terminal = "refuse": a call it is asked for here off a terminal is refused, not left waiting.
    own = b.run_json(ws_b, "own work", openai_agent(tmp_path / "agent-b", server,
                                                    policy={"approve": ["shell"], "no_terminal": "refuse"}),
                     expect=0).json()
    assert own["status"] == "completed"


def test_an_approval_given_on_another_machine_is_not_acted_on(server: FakeOpenAI, tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    agent = openai_agent(tmp_path / "agent-a", server, policy={"approve": ["shell"]})
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": "touch pwned"}))])
    # The author approves (--yes) and the run stops right after its `Decided: yes` step.
    killed = a("run", "--workspace", str(ws_a), "--task", "t", "--agent", str(agent), "--yes", "--json",
               env={"KXEN_AGENT_FAULT": "approval:after-decided"})
    assert killed.rc == -9, str(killed)
    ses = a.sessions()[0]["id"]
    assert not (ws_a / "pwned").exists()
    _importer_with_own_agent(tmp_path, b, ws_b, server)
    move(a, b, ses, ws_b, tmp_path)
    sent = len(server.requests)

    res = paused(b("--resume", ses, "--yes", "--json"), ses)  # the importer's --yes is no decision on this call
    assert "touch pwned" in res["error"] and "decided on another machine" in res["error"], res
    assert not (ws_b / "pwned").exists()
    assert len(server.requests) == sent
    journal = b.run_show(ses, res["run"])["journal"]
    assert [(j["state"], j["approval"]) for j in journal] == [("Decided", {"answer": "yes", "by": "--yes"})]

    shown = b("session", "trust", ses).out
    assert "touch pwned" in shown and "decided yes by --yes" in shown, shown
    server.reply_content("done")
    b("session", "trust", ses, "--yes", expect=0)
    done = b("--resume", ses, "--json", expect=0).json()
    assert done["status"] == "completed", done
    assert (ws_b / "pwned").exists()
    journal = b.run_show(ses, done["run"])["journal"]
    assert [(j["state"], j["approval"]["by"]) for j in journal] == [("Settled", "trust")]
    b.fsck_clean()


def test_a_call_another_machine_asked_for_and_nobody_decided_waits(server: FakeOpenAI, tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    agent = openai_agent(tmp_path / "agent-a", server)  # approve = []: no call ever waits for a yes
    server.reply_tool_calls([("call_1", "shell", json.dumps({"command": "touch pwned"}))])
    killed = a("run", "--workspace", str(ws_a), "--task", "t", "--agent", str(agent), "--json",
               env={"KXEN_AGENT_FAULT": "tool:after-started"})
    assert killed.rc == -9, str(killed)
    ses = a.sessions()[0]["id"]
    # As a hostile author leaves it: the run state from before `Started`, the call pending with no entry.
    store = Store(str(tmp_path / "state-a"))
    group = f"sessions/{ses}"
    (name, cur), = [(n, v) for n, v in store.refs.read(group).refs.items() if n.startswith("runs/")]
    before = store.get(cur, "run")["previous"]
    assert "journal" not in store.get(before, "run")
    store.refs.transaction(group, [RefUpdate(name, cur, before)], reason="test: the state before Started")
    _importer_with_own_agent(tmp_path, b, ws_b, server)
    move(a, b, ses, ws_b, tmp_path)
    sent = len(server.requests)

    res = paused(b("--resume", ses, "--json"), ses)
    assert "touch pwned" in res["error"], res
    assert not (ws_b / "pwned").exists() and len(server.requests) == sent
    # Refused here: it never runs, and the run goes on with the refusal as the call's outcome.
    server.reply_content("done")
    b("session", "trust", ses, "--yes", "--refuse-calls", expect=0)
    done = b("--resume", ses, "--json", expect=0).json()
    assert done["status"] == "completed" and not (ws_b / "pwned").exists(), done
    journal = b.run_show(ses, done["run"])["journal"]
    assert [(j["state"], j["outcome"]["output"]) for j in journal] == [("Settled", "refused by the user")]


# ---------------------------------------------------------------- 3. --continue picks only this state dir's sessions


def test_continue_ignores_a_future_dated_imported_session(tmp_path: Path) -> None:
    ws_a, a, ws_b, b = two_machines(tmp_path)
    agent = write_agent(tmp_path / "agent", [{"content": "done"}])
    mine = b.run_json(ws_b, "mine", agent, expect=0).json()["session"]
    ses = a.run_json(ws_a, "theirs", agent, expect=0).json()["session"]
    # The author's clock (or a hostile bundle) says ten years ahead.
    store = Store(str(tmp_path / "state-a"))
    group = f"sessions/{ses}"
    meta_oid = store.refs.read(group).refs["meta"]
    meta = store.get(meta_oid, "session")
    later = time.time_ns() + 10 * 365 * 86400 * 10**9
    new = store.put("session", dict(meta, createdNs=later, revisedNs=later, previous=meta_oid))
    store.refs.transaction(group, [RefUpdate("meta", meta_oid, new)], reason="test: future")
    move(a, b, ses, ws_b, tmp_path)
    assert b("--continue", "--task", "next", "--json", cwd=ws_b, expect=0).json()["session"] == mine
    # Even once run here, its times are in the future: never picked.
    b("--resume", ses, "--task", "x", "--agent", str(agent), "--json", expect=0)
    assert b("--continue", "--task", "next", "--json", cwd=ws_b, expect=0).json()["session"] == mine


# ---------------------------------------------------------------- the seed's flow stays unattended


def test_an_imported_session_made_with_this_runners_agent_resumes_unattended(tmp_path: Path) -> None:
    """The ephemeral runner: configured with its agent (KXEN_AGENT_AGENT), it imports and resumes, no pause."""
    ws_a, a, ws_b, b = two_machines(tmp_path)
    steps = [{"content": "a"}, {"tool_calls": [{"name": "shell", "arguments": {"command": "touch ran"}}]},
             {"content": "b"}]
    agent_a = write_agent(tmp_path / "agent-a", steps)
    agent_b = write_agent(tmp_path / "agent-b", steps)  # the same definition, the runner's own copy
    ses = a.run_json(ws_a, "first", agent_a, expect=0).json()["session"]
    move(a, b, ses, ws_b, tmp_path)
    res = b("--resume", ses, "--task", "next", "--json", env={"KXEN_AGENT_AGENT": str(agent_b)}, expect=0).json()
    assert res["status"] == "completed" and (ws_b / "ran").exists(), res


def test_the_standard_endpoint_with_its_standard_variable_needs_no_decision(tmp_path: Path) -> None:
    """In-process (the official endpoint is not reachable from a test): an imported session whose lock names
    the OpenAI API with OPENAI_API_KEY resumes on the importer without a pause, with the importer's key."""
    from kxen_agent.runtime.providers import AssistantTurn
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.agent_def import load_agent_definition
    from kxen_agent.session.transfer import export_sessions, import_sessions

    ws_a = git_workspace(tmp_path / "A")
    ws_b = clone(ws_a, tmp_path / "B")
    lock = load_agent_definition(str(write_agent(tmp_path / "agent", None, provider="openai", model="gpt-x")))
    assert lock["api_key_env"] == "OPENAI_API_KEY" and lock["base_url"] is None
    seen = []

    class Fake:
        def __init__(self, lock, endpoint):
            seen.append((endpoint.base_url, lock["api_key_env"]))

        def complete(self, messages, tools, **kw):
            return AssistantTurn(content="fine", tool_calls=(), model="gpt-x", finish_reason="stop")

        def close(self):
            pass

    a = Runner(Store(str(tmp_path / "state-a")), providers=Fake)
    ses = a.start(str(ws_a), "first", lock).session
    export_sessions(a.store, [ses], str(tmp_path / "s.bundle"))
    b_store = Store(str(tmp_path / "state-b"))
    import_sessions(b_store, str(tmp_path / "s.bundle"), str(ws_b))
    seen.clear()
    res = Runner(b_store, providers=Fake).resume(ses, task="next")
    assert res.status == "completed", res
    assert seen and all(s == ("https://api.openai.com/v1", "OPENAI_API_KEY") for s in seen), seen


# ---------------------------------------------------------------- §14.13 trust record vector


def test_the_trust_record_vector_is_what_a_record_encodes_to() -> None:
    import ast
    import re

    import blake3

    from kxen_agent.session.trust import TrustRecord

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text(encoding="utf-8")
    block = re.search(r"^vector: trust-record-lock\n(.*?)^```", spec, re.S | re.M).group(1)
    value = ast.literal_eval(dict(line.split(": ", 1) for line in block.splitlines())["value"])
    rec = TrustRecord("lock", "http://127.0.0.1:8000/v1", "SOME_SECRET_VAR", "accepted",
                      blake3.blake3(b"example agent lock").digest(), "ses_4f2a9c7e1b3d5a6e8c0b", 1700000003000000000)
    assert rec.encode() == value
    assert TrustRecord.decode(value) == rec
    assert rec.ref_name() == "locks/d1005e3e9d674bce05de314b9780162c8a9e6669f200ff51cf1f0400fec3b581"
    assert TrustRecord.decode(value[:-1]) is None  # a damaged record accepts nothing


def test_always_said_on_another_machine_approves_nothing_here(tmp_path: Path) -> None:
    """In-process: "always for this run" answered on the author's machine for `shell` does not approve the
    next `shell` call the run makes on the importer's (that call is asked here: the importer's approver decides)."""
    from kxen_agent.runtime.approvals import Decision
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.agent_def import load_agent_definition
    from kxen_agent.session.transfer import export_sessions, import_sessions

    ws_a = git_workspace(tmp_path / "A")
    ws_b = clone(ws_a, tmp_path / "B")
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo one"}}]},
             {"tool_calls": [{"name": "shell", "arguments": {"command": "touch pwned"}}]},
             {"content": "done"}]
    lock = load_agent_definition(str(write_agent(tmp_path / "agent", steps, policy={"approve": ["shell"]})))

    class Stop(Exception):
        pass

    def after_first_turn(point: str) -> None:
        if point == "tool:after-turn":
            raise Stop

    a = Runner(Store(str(tmp_path / "state-a")), fault=after_first_turn)
    a.approver = lambda request, cancel: Decision("yes", "user-always")
    with pytest.raises(Stop):
        a.start(str(ws_a), "t", lock)
    (ses,) = [s.id for s in a.sessions.list()]
    export_sessions(a.store, [ses], str(tmp_path / "s.bundle"))
    b_store = Store(str(tmp_path / "state-b"))
    import_sessions(b_store, str(tmp_path / "s.bundle"), str(ws_b))
    b = Runner(b_store)
    b.approver = lambda request, cancel: Decision("no", "user")  # asked here: the importer's person refuses
    assert b.accept_trust(ses)["accepted"]  # the script lock: accepted; no call is pending
    res = b.resume(ses)
    assert res.status == "completed", res
    assert not (ws_b / "pwned").exists()
    ops = list(b.ops(b.run_state(b.sessions.get(ses), res.run)[1]).values())
    assert [(e["approver"], e.get("output")) for e in ops] == [("user-always", "one\n[exit code 0]"),
                                                               ("user", "refused by the user")], ops
