"""``session push``, ``session pull``, ``session ls-remote``: sessions through a real Git remote.

Two machines (two state dirs, two clones) share one bare repository served
by path, by ``git daemon`` and by smart HTTP. The round trip runs on all
three; the rules (fast-forward only, compare-and-swap, diverged, the
incremental size, an unreachable remote, ``--with-branch``, per-origin
pushes) on the path transport, where nothing but the rule differs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kxen_agent.session import SessionStore, default_agent_definition, inspect_workspace
from kxen_agent.session.remote import push_sessions
from kxen_agent.session.remote_pull import pull_sessions
from kxen_agent.store import RefUpdate, Store, encode_object
from tests.helpers import git
from tests.remote.conftest import STEPS, Machine, Remote, both_went_on, make_machine

PATH_ONLY = pytest.mark.parametrize("transport", ["path"])


def _row(listing: dict, ses: str) -> dict:
    (row,) = [s for s in listing["sessions"] if s["id"] == ses]
    return row


# ---------------------------------------------------------------- the round trip


def test_round_trip_with_resume_on_the_other_machine(machines: tuple[Machine, Machine], served: Remote) -> None:
    """Over each transport: a runs and pushes, b pulls and resumes and pushes, a pulls the result."""
    a, b = machines
    ses = a.run("first task")["session"]
    assert a.json("session", "push", ses)["pushes"][0]["sessions"] == {ses: "created"}
    pulled = b.json("session", "pull", ses)
    assert pulled["sessions"] == {ses: "created"} and pulled["workspaces"][ses] == os.path.realpath(b.ws)
    second = b.kx("--resume", ses, "--task", "second task", "--json", expect=0, cwd=b.ws).json()
    assert second["status"] == "completed" and second["result"] == "Second task done."
    assert b.json("session", "push", ses)["pushes"][0]["sessions"] == {ses: "updated"}
    assert a.json("session", "pull", ses)["sessions"] == {ses: "updated"}
    log = a.log(ses)
    assert log == b.log(ses) and [m["content"] for m in log if m["role"] == "assistant" and not m["toolCalls"]] == [
        "First task done.", "Second task done."]
    served.fsck_strict()


@PATH_ONLY
def test_what_the_remote_and_each_machine_hold_along_the_way(machines: tuple[Machine, Machine], served: Remote,
                                                             tmp_path: Path) -> None:
    a, b = machines
    first = a.run("first task")
    ses = first["session"]
    a.kx("session", "push", ses, expect=0)
    served.fsck_strict()
    assert set(served.refs()) == {f"refs/kxen/sessions/{ses}"}
    # Sessions are never on a branch: a plain clone does not bring them.
    plain = tmp_path / "plain"
    subprocess.run(["git", "clone", "-q", str(served.path), str(plain)], check=True, capture_output=True)
    assert "kxen" not in git(plain, "for-each-ref")
    # ls-remote: from the tips alone, before b has anything.
    row = _row(b.json("session", "ls-remote"), ses)
    assert (row["runStatus"], row["run"], row["local"], row["lease"]) == ("completed", first["run"], "absent", None)
    assert row["messages"] == len(a.log(ses)) and row["head"] == a.log(ses)[-1]["id"]
    b.kx("session", "pull", ses, expect=0, cwd=b.ws)
    b.kx.fsck_clean()
    shown = b.kx.session_show(ses)
    assert shown["workspace"]["root"] == os.path.realpath(b.ws)
    assert shown["workspace"]["identity"] == a.kx.session_show(ses)["workspace"]["identity"]
    assert _row(b.json("session", "ls-remote"), ses)["local"] == "same"
    # a goes on, b is behind, then up to date both ways.
    a.kx("--resume", ses, "--task", "second task", "--json", expect=0)
    assert _row(b.json("session", "ls-remote"), ses)["local"] == "same"  # a has not pushed yet
    a.kx("session", "push", ses, expect=0)
    assert _row(b.json("session", "ls-remote"), ses)["local"] == "behind"  # issue 29: not "differs"
    assert b.json("session", "pull", ses)["sessions"] == {ses: "updated"}
    assert b.json("session", "pull", ses)["sessions"] == {ses: "unchanged"}
    assert b.json("session", "push", ses)["pushes"][0]["sessions"] == {ses: "up-to-date"}
    assert b.log(ses) == a.log(ses)


# ---------------------------------------------------------------- incremental


def _long_session(store: Store, ws: str, n: int) -> str:
    sessions = SessionStore(store)
    info = sessions.create(default_agent_definition(STEPS), inspect_workspace(ws))
    _append(store, info.id, n, start=0)
    return info.id


def _append(store: Store, ses: str, n: int, *, start: int) -> None:
    """``n`` messages on the session's head, written as one pack (a run writes loose objects; the push reads either)."""
    info = SessionStore(store).get(ses)
    head, seq = info.head, (store.get(info.head, "message")["seq"] if info.head else -1)
    writer = store.pack_writer()
    for i in range(start, start + n):
        seq += 1
        value = {"seq": seq, "role": "user" if i % 2 == 0 else "assistant",
                 "content": f"message {i}: " + " ".join(f"w{(i * 7919 + j) % 1000}" for j in range(60))}
        if head is not None:
            value["parent"] = head
        obj = encode_object("message", value)
        writer.add(obj)
        head = obj.id
    writer.seal().commit()
    store.reload_packs()
    store.refs.transaction(info.group, [RefUpdate("head", info.head, head)], reason="test")


def _packs(remote: Remote) -> dict[str, int]:
    d = remote.path / "objects" / "pack"
    return {p.name: p.stat().st_size for p in d.glob("*.pack")}


@PATH_ONLY
def test_ten_messages_onto_two_thousand_push_under_five_percent(served: Remote, tmp_path: Path) -> None:
    a = make_machine(tmp_path, "a", served)
    store = Store.open(str(a.state), namespaces=("sessions",))
    ses = _long_session(store, str(a.ws), 2000)
    before = _packs(served)
    (rep,) = push_sessions(store, [ses])
    full = {k: v for k, v in _packs(served).items() if k not in before}
    assert rep.sessions == {ses: "created"} and rep.new_objects[ses] > 2000
    _append(store, ses, 10, start=2000)
    mid = _packs(served)
    (rep,) = push_sessions(store, [ses])
    inc = {k: v for k, v in _packs(served).items() if k not in mid}
    assert rep.sessions == {ses: "updated"} and rep.new_objects[ses] == 10  # only the new messages travel
    assert len(full) == 1 and len(inc) == 1
    ratio = sum(inc.values()) / sum(full.values())
    assert ratio < 0.05, (inc, full)
    served.fsck_strict()
    # And a pull elsewhere gets exactly that history back.
    b = make_machine(tmp_path, "b", served)
    bstore = Store.open(str(b.state), namespaces=("sessions",))
    pulled = pull_sessions(bstore, [ses], str(b.ws))
    assert pulled.sessions == {ses: "created"}
    assert [m.oid for m in SessionStore(bstore).iter_back(SessionStore(bstore).get(ses).head)] == \
           [m.oid for m in SessionStore(store).iter_back(SessionStore(store).get(ses).head)]


# ---------------------------------------------------------------- refusals


@PATH_ONLY
def test_diverged_and_stale_are_refused_with_nothing_changed(machines: tuple[Machine, Machine],
                                                            served: Remote) -> None:
    a, b = machines
    ses = both_went_on(a, b)
    a.kx("session", "push", ses, expect=0)
    remote_before, b_before = served.refs(), b.snapshot()
    # b last saw the remote before a's push: its compare-and-swap fails.
    err = b.kx.refused("session", "push", ses, cwd=b.ws)
    assert "changed since this state dir last saw it" in err and f"kxen-agent session pull {ses}" in err, err
    # Pulling shows the histories diverged: refused, saying what to do.
    err = b.kx.refused("session", "pull", ses, cwd=b.ws)
    assert "diverged" in err and f"kxen-agent session fork {ses}" in err, err
    assert f"kxen-agent session delete {ses}" in err, err
    assert served.refs() == remote_before and b.snapshot() == b_before
    # What to do, as the message says: fork the local one and push the fork...
    fork = b.kx("session", "fork", ses, "--json", expect=0).json()["id"]
    rep = b.json("session", "push", fork)["pushes"][0]
    assert rep["sessions"] == {fork: "created"}
    # (its first push builds on what the remote already holds of the shared history)
    assert rep["newObjects"][fork] < len(b.log(fork))
    served.fsck_strict()
    # ...then take the remote's: a session deleted here comes back as the remote has it.
    b.kx("session", "delete", ses, expect=0)
    assert b.json("session", "pull", ses)["sessions"] == {ses: "restored"}
    assert b.log(ses) == a.log(ses)


@PATH_ONLY
def test_an_unreachable_remote_is_named_without_credentials(machines: tuple[Machine, Machine], served: Remote,
                                                            tmp_path: Path) -> None:
    a, _ = machines
    ses = a.run("first task")["session"]
    before = a.snapshot()
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"git://127.0.0.1:{port}/remote.git", f"http://user:s3cr3t-t0ken@127.0.0.1:{port}/remote.git",
                str(tmp_path / "no-such-repo.git")):
        err = a.kx.refused("session", "push", ses, "--remote", url)
        assert "cannot be reached" in err and "s3cr3t" not in err, err
        assert url.replace("user:s3cr3t-t0ken@", "") in err, err
        err = a.kx.refused("session", "pull", ses, "--remote", url)
        assert "cannot be reached" in err and "s3cr3t" not in err, err
    err = a.kx.refused("session", "push", ses, "--remote", "nosuchremote", code=2)
    assert "no remote 'nosuchremote'" in err, err
    assert a.snapshot() == before


@PATH_ONLY
def test_pull_of_a_session_the_remote_lacks_is_refused(machines: tuple[Machine, Machine]) -> None:
    _, b = machines
    err = b.kx.refused("session", "pull", "ses_0123456789abcdef0123", cwd=b.ws)
    assert "is not on" in err and "ls-remote" in err, err
    assert not b.state.exists()


# ---------------------------------------------------------------- worktree forks and origins


@PATH_ONLY
def test_with_branch_pushes_a_worktree_fork_and_pull_binds_it_to_a_worktree(
        machines: tuple[Machine, Machine], served: Remote, tmp_path: Path) -> None:
    a, b = machines
    ses = a.run("first task")["session"]
    fork = a.kx("session", "fork", ses, "--worktree", "alt", "--json", expect=0).json()
    fid = fork["id"]
    alt = Path(fork["workspace"]["root"])
    (alt / "alt.txt").write_text("on the branch\n")
    git(alt, "add", "-A")
    git(alt, "commit", "-q", "-m", "work on alt")
    rep = a.json("session", "push", ses, fid, "--with-branch")["pushes"]
    assert rep[0]["sessions"] == {ses: "created", fid: "created"}
    assert list(rep[0]["branches"]) == ["refs/heads/kxen/alt"]
    assert served.git("rev-parse", "refs/heads/kxen/alt").strip() == git(alt, "rev-parse", "HEAD").strip()
    served.fsck_strict()
    # Machine b: fetch the branch, make a worktree of it, pull both sessions.
    git(b.ws, "fetch", "-q", "origin", "kxen/alt:kxen/alt")
    balt = tmp_path / "b-alt"
    git(b.ws, "worktree", "add", "-q", str(balt), "kxen/alt")
    pulled = b.json("session", "pull", ses, fid, "--workspace", f"{fid}={balt}")
    assert pulled["sessions"] == {ses: "created", fid: "created"}
    assert pulled["workspaces"] == {ses: os.path.realpath(b.ws), fid: os.path.realpath(balt)}
    assert b.kx.session_show(fid)["workspace"]["branch"] == "kxen/alt"
    # Without the worktree the fork's branch check refuses, naming the way out.
    c = make_machine(tmp_path, "c", served)
    err = c.kx.refused("session", "pull", ses, fid, cwd=c.ws)
    assert "kxen/alt" in err, err
    assert not c.state.exists()


@PATH_ONLY
def test_one_push_of_sessions_of_two_origins_pushes_each_to_its_own(machines: tuple[Machine, Machine],
                                                                    served: Remote, tmp_path: Path) -> None:
    a, _ = machines
    other = tmp_path / "other.git"
    subprocess.run(["git", "init", "-q", "--bare", str(other)], check=True)
    second_ws = tmp_path / "second-ws"
    second_ws.mkdir()
    git(second_ws, "init", "-q", "-b", "main")
    git(second_ws, "commit", "-q", "--allow-empty", "-m", "x")
    git(second_ws, "remote", "add", "origin", str(other))
    s1 = a.run("first task")["session"]
    s2 = a.kx("run", "--workspace", str(second_ws), "--task", "t", "--agent", str(a.agent), "--json",
              expect=0).json()["session"]
    reps = a.json("session", "push", s1, s2)["pushes"]
    assert sorted((tuple(r["sessions"]), r["remote"]) for r in reps) == sorted(
        [((s1,), f"origin ({served.url})"), ((s2,), f"origin ({other})")])
    assert f"refs/kxen/sessions/{s1}" in served.refs()
    other_refs = subprocess.run(["git", "-C", str(other), "for-each-ref", "refs/kxen/"], capture_output=True,
                                text=True, check=True).stdout
    assert s2 in other_refs and s1 not in other_refs
