"""``session grep`` (its index: objects_spec.md §11a.2): every session's messages searched, a message shared
by forks reported once with its sessions, and the index a cache — deleted, damaged or behind, the answer is
the objects'. The CLI as a subprocess on real Git repositories."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import CLI_TIMEOUT_S
from tests.session.test_cli_sessions import Kx, make_repo


def grep(kx: Kx, *args: str, code: int = 0) -> dict:
    proc = kx.run("session", "grep", *args, "--json", code=code)
    return json.loads(proc.out)


def test_grep_over_forks_filters_and_a_cache_that_is_only_a_cache(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    root = kx.json("run", "--workspace", str(repo), "--task", "alpha-task", "-n", "root")["session"]
    fork = kx.json("session", "fork", "root")["id"]
    kx.json("--resume", fork, "--task", "only-in-the-fork")
    other = kx.json("run", "--workspace", str(repo), "--task", "beta-task NOTES.md")["session"]

    # A message shared by the fork is reported once, with both sessions.
    res = grep(kx, "alpha-task")
    assert [(m["sessions"], m["role"], m["line"]) for m in res["matches"]] == [([root, fork], "user", "alpha-task")]
    assert res["matches"][0]["dateNs"] and res["matches"][0]["seq"] == 0
    assert grep(kx, "only-in-the-fork")["sessions"] == [fork]
    # Tool results and tool calls are searched; each matching line once; roles filter.
    tools = grep(kx, "NOTES.md", "--role", "tool")["matches"]
    assert tools and {m["role"] for m in tools} == {"tool"}
    assert {tuple(m["sessions"]) for m in tools} == {(root, fork), (other,)}
    assert grep(kx, "write_file", "--role", "assistant")["matches"]
    # --session (a name works), -l, --regex, -i, --since.
    assert {tuple(m["sessions"]) for m in grep(kx, "NOTES", "--session", "root")["matches"]} == {(root,)}
    assert kx.run("session", "grep", "-l", "NOTES.md").out.split() == sorted([root, fork, other])
    assert [m["line"] for m in grep(kx, "-E", r"^(alpha|beta)-task\b")["matches"]] == ["alpha-task",
                                                                                      "beta-task NOTES.md"]
    assert grep(kx, "-i", "ALPHA-TASK")["sessions"] == sorted([root, fork])
    assert grep(kx, "alpha-task", "--since", "2999-01-01", code=1)["matches"] == []
    assert grep(kx, "no such text anywhere", code=1) == {"pattern": "no such text anywhere", "sessions": [],
                                                         "matches": []}
    assert "not a regular expression" in kx.fail("session", "grep", "-E", "(", code=2)
    text = kx.run("session", "grep", "alpha-task").out.splitlines()
    assert len(text) == 1 and text[0].startswith(f"{root},{fork} msg_") and text[0].endswith(": alpha-task")
    assert " user " in text[0]

    # The fork's index file holds only what it added; the shared messages live in the root's once.
    cache = kx.state / "cache" / "grep" / "sessions"
    assert (cache / fork).stat().st_size < (cache / root).stat().st_size
    want = grep(kx, "NOTES")
    # Deleted, damaged (fsck says so first), or behind a new run: the same answer as the objects give.
    (cache / root).unlink()
    assert grep(kx, "NOTES") == want
    data = bytearray((cache / other).read_bytes())
    data[-5] ^= 0x01
    (cache / other).write_bytes(bytes(data))
    fsck = json.loads(kx.run("fsck", "--json", code=None).out)
    assert [p["kind"] for p in fsck["problems"]] == ["grep-index"], fsck["problems"]
    assert grep(kx, "NOTES") == want
    kx.json("--resume", root, "--task", "gamma-later")
    assert grep(kx, "gamma-later")["sessions"] == [root]
    assert json.loads(kx.run("fsck", "--json").out)["clean"]


BUILD = textwrap.dedent("""\
    import sys
    from kxen_agent.store import FileIO, RefUpdate, Store
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.workspace import inspect_workspace

    class NoSync(FileIO):  # test setup only: durability is not under test
        def write_tmp(self, d, data, *, sync=True, prefix="tmp_"):
            return super().write_tmp(d, data, sync=False, prefix=prefix)
        def fsync_dir(self, d):
            pass

    s = SessionStore(Store(sys.argv[1], io=NoSync()))
    n, per = int(sys.argv[3]), int(sys.argv[4])
    for k in range(n // per):
        info = s.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(sys.argv[2]))
        msgs = [{"role": ("user", "assistant", "tool")[i % 3], "content": f"message {k}-{i} " + "w" * 200}
                for i in range(per)]
        head = s.append_messages(None, msgs)
        s.store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="test: history")
""")


@pytest.mark.long("test_grep_over_forks_filters_and_a_cache_that_is_only_a_cache covers every rule at a small size")
def test_grep_over_100000_messages(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    subprocess.run([sys.executable, "-c", BUILD, str(kx.state), str(plain), "100000", "10000"], check=True,
                   timeout=CLI_TIMEOUT_S * 20)
    res = grep(kx, "-E", r"message [0-9]-4242 ")
    assert [m["line"].split()[1] for m in res["matches"]] == [f"{k}-4242" for k in range(10)]
    assert len(res["sessions"]) == 10
    assert kx.run("session", "grep", "-l", "message 3-10000 ", code=1).out == ""
    assert grep(kx, "message 9-9999 ")["matches"][0]["seq"] == 9999


def test_the_spec_example_is_the_encoding() -> None:
    from kxen_agent.session.grep_index import encode_index, parse_index

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text()
    block = spec.split("grep-index: two-messages\nbytes: ", 1)[1].split("\n", 1)[0]
    made = encode_index([(b"\x11" * 32, 1700000000000000000, 0, "user", b"fix the failing test\n"),
                         (b"\x22" * 32, 1700000000000000000, 1, "tool", b"pytest -q\n1 failed\n")],
                        base_ses=None, base_seq=-1, base_id=None, head_id=b"\x22" * 32, meta_id=b"\x33" * 32,
                        created_ns=1690000000000000000)
    assert made.hex() == block and len(made) == 433
    f = parse_index("ses_x", made)
    assert [e[3] for e in f.entries()] == ["user", "tool"] and f.id_at_seq(1) == b"\x22" * 32


def test_a_fork_whose_parent_was_deleted_reports_shared_messages_once_after_undelete(tmp_path: Path) -> None:
    kx = Kx(tmp_path)
    repo = make_repo(tmp_path / "repo", kx.env)
    root = kx.json("run", "--workspace", str(repo), "--task", "delta-task")["session"]
    fork = kx.json("session", "fork", root)["id"]
    kx.run("session", "delete", root)
    assert [m["sessions"] for m in grep(kx, "delta-task")["matches"]] == [[fork]]  # the fork's file: whole
    kx.run("session", "undelete", root)
    assert [sorted(m["sessions"]) for m in grep(kx, "delta-task")["matches"]] == [sorted([root, fork])]
