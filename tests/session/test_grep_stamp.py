"""The search index's stamp (objects_spec.md §11a.2, session/grep_stamp.py): a ``session grep`` of a state dir
where nothing changed since the last search reads no ref and imports no store, and one where a session changed
(a run's messages, a fork, a delete, an import, a change that keeps the file's size, inode and modification
time) always sees the change.

Sessions are written in-process through the store (real files); every search is a real process, which says on
stderr whether it imported the store (``store``) or not (``lean``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kxen_agent.store.fold import fold_step_logs
from kxen_agent.session.grep_stamp import (ABSENT, BadStamp, FileStat, GroupStamp, Stamp, encode_stamp,
                                           lean_search, parse_stamp, stamp_path, state_dir)
from tests.helpers import CLI_TIMEOUT_S, cli_env

#: ``kxen-agent ARGS`` as the console script runs it, then which way it went (the last line of stderr): ``long``
#: when it brought the index up to date through the store (``grep_index``), else ``lean``; and ``+store`` when the
#: store package was imported.
PROBE = ("import sys\nfrom kxen_agent.cli.start import run\ncode = run(sys.argv[1:])\nsys.stdout.flush()\n"
         "way = 'long' if 'kxen_agent.session.grep_index' in sys.modules else 'lean'\n"
         "print(way + ('+store' if 'kxen_agent.store' in sys.modules else ''), file=sys.stderr)\nsys.exit(code)\n")


def _sessions(state: Path):
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Store

    return SessionStore(Store(str(state), namespaces=("sessions",)))


def _new(state: Path, ws: Path, texts: list[str]) -> str:
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.workspace import inspect_workspace
    from kxen_agent.store import RefUpdate

    s = _sessions(state)
    info = s.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(str(ws)))
    head = s.append_messages(None, [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)])
    s.store.refs.transaction(info.group, [RefUpdate("head", None, head)], reason="test: history")
    return info.id


def _append(state: Path, ses: str, texts: list[str]) -> None:
    from kxen_agent.store import RefUpdate

    s = _sessions(state)
    info = s.get(ses)
    head = s.append_messages(info.head, [{"role": "user", "content": t} for t in texts])
    s.store.refs.transaction(info.group, [RefUpdate("head", info.head, head)], reason="test: more")


class Grep:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.env = cli_env(self.state)

    def __call__(self, *args: str) -> tuple[str, int, str]:
        """(the way it went, exit code, stdout) of ``kxen-agent session grep ARGS``."""
        p = subprocess.run([sys.executable, "-c", PROBE, "session", "grep", *args], env=self.env,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S)
        *rest, way = p.stderr.splitlines()
        assert not rest, p.stderr
        return way, p.returncode, p.stdout

    def twice(self, *args: str) -> tuple[int, str]:
        """Search the long way (something changed), then the lean way: the same answer both times."""
        first = self(*args)
        assert first[0] == "long+store", (args, first)
        again = self(*args)
        assert again == ("lean", *first[1:]), (args, first, again)
        return first[1:]


@pytest.fixture
def g(tmp_path: Path) -> Grep:
    g = Grep(tmp_path)
    g.a = _new(g.state, g.ws, ["alpha one", "assistant says alpha", "common line"])  # type: ignore[attr-defined]
    g.b = _new(g.state, g.ws, ["beta one", "common line", "beta two"])  # type: ignore[attr-defined]
    return g


def test_a_search_where_nothing_changed_reads_no_ref_and_answers_as_the_long_way(g: Grep) -> None:
    a, b = g.a, g.b  # type: ignore[attr-defined]
    assert g.twice("common") == (0, g("common")[2])  # neither the store imported nor a ref read
    cases = [["common", "--json"], ["-l", "common"], ["-E", "^(alpha|beta) one$", "--json"], ["-i", "ALPHA"],
             ["--role", "assistant", "alpha", "--json"], ["common", "--since", "2999-01-01"], ["nowhere at all"],
             ["common", "--since", "1d", "--json"]]
    lean = {tuple(c): g(*c) for c in cases}
    for c in cases:
        Path(stamp_path(str(g.state))).unlink()
        want = g(*c)
        # --since reads its duration with the store's parser (cli/_args.py): imported, but no ref is read.
        way = "lean+store" if "--since" in c else "lean"
        assert want[0] == "long+store" and lean[tuple(c)] == (way, *want[1:]), c
    assert g("-l", "common")[2].split() == sorted([a, b])
    assert json.loads(g("common", "--json")[2])["sessions"] == sorted([a, b])
    # --session: a full id the stamp lists is answered here, as the long way answers it; a prefix goes the long
    # way (so would a name), as does a search under a fault spec (the seam counts its file operations).
    for args, way in ((["common", "-s", a], "lean"), (["-l", "common", "-s", b, "--session", a], "lean"),
                      (["common", "-s", a[:10], "--json"], "long+store")):
        got = g(*args)
        Path(stamp_path(str(g.state))).unlink()
        want = g(*args)
        assert want[0] == "long+store" and got == (way, *want[1:]), args
    out = g("common", "-s", a)
    assert out[0] == "lean" and a in out[2] and b not in out[2]
    g.env["KXEN_AGENT_IO_FAULT"] = "EIO@100000"
    assert g("common")[0] == "long+store"


def test_a_session_changed_between_two_searches_is_always_seen(g: Grep, tmp_path: Path) -> None:
    a, b = g.a, g.b  # type: ignore[attr-defined]
    g.twice("gamma")
    # A run's messages: the step log grows.
    _append(g.state, a, ["gamma here"])
    code, out = g.twice("gamma", "-l")
    assert (code, out.split()) == (0, [a])
    # A fork: a new ref file in refs/sessions (and the fork shares the parent's messages).
    fork = _sessions(g.state).fork(a).id
    assert g.twice("gamma", "-l")[1].split() == sorted([a, fork])
    # A delete: the group's step log grows; its messages are no longer searched.
    _sessions(g.state).delete(b)
    assert g.twice("beta", "-l") == (1, "")
    # A checkpoint folds a step log into its ref file (a rename): nothing changed, but the refs are read again.
    fold_step_logs(_sessions(g.state).store, groups=[f"sessions/{a}"])
    assert g.twice("gamma", "-l")[1].split() == sorted([a, fork])


def test_a_change_that_keeps_size_inode_and_modification_time_is_seen(g: Grep) -> None:
    """The step log of ``a`` is rewritten in place with another valid state of the same size (the head on
    another branch of the same length), and its modification time set back: only its change time says so."""
    from kxen_agent.store import RefUpdate

    a = g.a  # type: ignore[attr-defined]
    s = _sessions(g.state)
    info = s.get(a)
    store = s.store
    fold_step_logs(store, groups=[info.group])  # the log starts empty: two one-record logs to choose between
    log = Path(store.refs.steps_path(info.group))
    before = log.read_bytes()
    left = s.append_messages(info.head, [{"role": "user", "content": "left branch"}])
    right = s.append_messages(info.head, [{"role": "user", "content": "rght branch"}])
    store.refs.transaction(info.group, [RefUpdate("head", info.head, left)], reason="test: branch")
    on_left = log.read_bytes()
    with open(log, "r+b") as f:  # back to the checkpoint, in place (the same inode), then the other branch
        f.truncate(len(before))
    store = _sessions(g.state).store
    store.refs.transaction(info.group, [RefUpdate("head", info.head, right)], reason="test: branch")
    assert len(log.read_bytes()) == len(on_left) and log.read_bytes() != on_left
    assert g.twice("branch", "-l")[1].split() == [a]
    assert g("rght")[1] == 0 and g("left")[1] == 1
    st = log.stat()
    with open(log, "r+b") as f:
        f.write(on_left)  # the left branch's log: same size, same inode
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = log.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    way, code, out = g("left")
    assert (way, code) == ("long+store", 0) and "left branch" in out
    assert g("rght")[:2] == ("lean", 1)


def test_an_import_is_seen(g: Grep, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = Grep(tmp_path / "other")
    c = _new(other.state, g.ws, ["delta imported"])  # bound to the same plain directory
    bundle = tmp_path / "c.kxb"
    kx = [sys.executable, "-m", "kxen_agent"]
    subprocess.run([*kx, "session", "export", c, "-o", str(bundle)], env=other.env, check=True, capture_output=True,
                   timeout=CLI_TIMEOUT_S)
    g.twice("delta")
    p = subprocess.run([*kx, "session", "import", str(bundle), "--workspace", str(g.ws)], env=g.env,
                       capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert p.returncode == 0, p.stderr
    assert g.twice("delta", "-l") == (0, c + "\n")


def test_a_stamp_is_not_trusted_for_changes_in_its_clock_tick_nor_when_damaged(g: Grep) -> None:
    g.twice("alpha")
    path = Path(stamp_path(str(g.state)))
    good = path.read_bytes()
    stamp = parse_stamp(good)
    assert not stamp.racy()
    # A file changed at m0 or later may have kept every stat: the stamp says nothing of it.
    newest = max(max(s.mtime_ns, s.ctime_ns) for s in (*stamp.top, *(x for g in stamp.groups for x in (g.ref, g.log))))
    path.write_bytes(encode_stamp(stamp._replace(m0=newest)))
    assert parse_stamp(path.read_bytes()).racy()
    assert g("alpha")[0] == "long+store"
    # Damage: a byte changed fails the digest.
    damaged = bytearray(good)
    damaged[70] ^= 1
    with pytest.raises(BadStamp):
        parse_stamp(bytes(damaged))
    path.write_bytes(bytes(damaged))
    assert g("alpha")[0] == "long+store" and g("alpha")[0] == "lean"


def test_a_stamp_that_says_other_than_the_refs_is_not_followed_and_fsck_names_it(g: Grep) -> None:
    from kxen_agent.cli.grep_lean import matcher

    a = g.a  # type: ignore[attr-defined]
    g.twice("alpha")
    kx = [sys.executable, "-m", "kxen_agent"]

    def fsck() -> dict:
        p = subprocess.run([*kx, "fsck", "--json"], env=g.env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        return json.loads(p.stdout)

    rep = fsck()
    assert rep["problems"] == [] and not [f for f in rep["strayFiles"] if "grep" in f], rep
    path = Path(stamp_path(str(g.state)))
    stamp = parse_stamp(path.read_bytes())
    lie = stamp._replace(groups=tuple(x._replace(head=b"\x44" * 32) if x.name == a else x for x in stamp.groups))
    path.write_bytes(encode_stamp(lie))
    # Its index file names the real head: the search goes the long way (and writes the stamp again).
    assert lean_search(str(g.state), matcher("alpha", regex=False, ignore_case=False)) is None
    assert [p["kind"] for p in fsck()["problems"]] == ["grep-index"]
    path.write_bytes(b"kxen-grep-stamp 1\nnot a stamp")
    assert [p["message"] for p in fsck()["problems"]][0].startswith("search index stamp does not parse")
    assert g("alpha")[0] == "long+store"
    assert fsck()["problems"] == []


def test_the_spec_example_is_the_encoding() -> None:
    s = 10 ** 9
    stamp = Stamp(1700000000 * s, (FileStat(1, 10, 19, 1690000000 * s, 1690000000 * s),
                                   FileStat(2, 11, 4096, 1699999999 * s, 1699999999 * s),
                                   FileStat(2, 15, 4096, 1699999999 * s, 1699999999 * s)),
                  (GroupStamp("ses_0000000001", FileStat(1, 12, 146, 1699999990 * s, 1699999990 * s),
                              FileStat(1, 13, 900, 1699999999 * s, 1699999999 * s), True, b"\x22" * 32, b"\x33" * 32),
                   GroupStamp("ses_0000000002", FileStat(1, 14, 146, 1699999980 * s, 1699999980 * s), ABSENT, False,
                              None, None)))
    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text()
    block = spec.split("grep-stamp: two-names\nbytes: ", 1)[1].split("\n", 1)[0]
    made = encode_stamp(stamp)
    assert made.hex() == block and len(made) == 618
    assert parse_stamp(made) == stamp and not stamp.racy()
    with pytest.raises(BadStamp):
        parse_stamp(made[:-1])


def test_the_state_dir_is_the_stores(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kxen_agent.store import Store

    home = tmp_path / "home"
    for env, want in (({"KXEN_AGENT_STATE_DIR": "rel/state"}, os.path.abspath("rel/state")),
                      ({"XDG_DATA_HOME": str(tmp_path)}, str(tmp_path / "kxen-agent")),
                      ({"XDG_DATA_HOME": "rel", "HOME": str(home)}, str(home / ".local/share/kxen-agent")),
                      ({"HOME": str(home)}, str(home / ".local/share/kxen-agent"))):
        monkeypatch.delenv("KXEN_AGENT_STATE_DIR", raising=False)
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert state_dir() == want == Store.open().root, env
