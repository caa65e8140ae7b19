"""A session push asks the remote to advertise only the refs it needs (``receive.hideRefs``).

What the remote advertised is read from Git's own packet trace
(``GIT_TRACE_PACKET``: the lines the pushing ``git`` received), what was
sent from the packs the remote kept (``receive.unpackLimit=1``). The ssh
cases run a fake ``ssh`` (``GIT_SSH_COMMAND``) that runs the remote's
command on this machine: through ``sh`` as an ordinary ssh server does,
or through ``git shell`` as a server that runs nothing but Git's own
programs (the way a hosting service refuses any other command).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.fleet import build_remote
from kxen_agent.errors import KxenError
from kxen_agent.session import SessionStore
from kxen_agent.session.gitio import remote_key
from kxen_agent.session.narrow_push import ENV, PLAIN_DIR, receive_pack_command, refs_to_show, transport_of
from kxen_agent.session.remote import push_sessions, session_ref
from kxen_agent.store import Store
from tests.helpers import git
from tests.remote.test_push_pull import _append, _long_session

OTHERS = 20  # sessions already on the remote, none of them this test's


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    path = tmp_path / "remote.git"
    build_remote(str(path), OTHERS, leases_every=0)
    git(path, "config", "receive.unpackLimit", "1")  # every push's pack kept as received: what was sent
    return path


def _workspace(tmp_path: Path, origin: str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    git(ws, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "c")
    git(ws, "remote", "add", "origin", origin)
    return ws


def _advertised(trace: Path) -> set[str]:
    """The refs under refs/kxen/ the pushing git received in the remote's advertisement (and forget the trace)."""
    out = set()
    if trace.exists():
        for line in trace.read_text(errors="replace").splitlines():
            if "push< " in line:
                words = line.split("push< ", 1)[1].split("\\0")[0].split("\0")[0].split()
                if len(words) >= 2 and len(words[0]) == 40 and words[1].startswith("refs/kxen/"):
                    out.add(words[1])
        trace.unlink()
    return out


def _packs(remote: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (remote / "objects" / "pack").glob("*.pack")}


def _objects_in(remote: Path, pack: str) -> int:
    idx = (remote / "objects" / "pack" / pack).with_suffix(".idx")
    out = subprocess.run(["git", "show-index"], stdin=idx.open("rb"), capture_output=True, check=True).stdout
    return len(out.splitlines())


def test_a_push_is_advertised_its_own_refs_alone_and_lands(remote: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "packets"
    monkeypatch.setenv("GIT_TRACE_PACKET", str(trace))
    ws = _workspace(tmp_path, str(remote))
    store = Store.open(str(tmp_path / "state"), namespaces=("sessions",))
    ses = _long_session(store, str(ws), 6)
    (rep,) = push_sessions(store, [ses])
    assert rep.sessions == {ses: "created"}
    assert _advertised(trace) == set()  # its ref is not there yet; the other 20 sessions are hidden
    _append(store, ses, 3, start=6)
    events = tmp_path / "events"
    monkeypatch.setenv("GIT_TRACE2_EVENT", str(events))
    (rep,) = push_sessions(store, [ses])
    monkeypatch.delenv("GIT_TRACE2_EVENT")
    assert rep.sessions == {ses: "updated"} and rep.new_objects[ses] == 3
    assert _advertised(trace) == {session_ref(ses)}
    # The remote's connectivity check listed, as its quarantine's "alternate refs", the shown ref alone.
    listed = [e["argv"] for e in map(json.loads, events.read_text().splitlines())
              if e.get("event") == "start" and "--format=%(objectname)" in e.get("argv", [])
              and f"--git-dir={remote}" in e["argv"]]
    assert listed and all(argv[argv.index("--") + 1:] == [session_ref(ses)] for argv in listed), listed
    assert git(remote, "rev-parse", session_ref(ses)).strip() == rep.commits[ses]
    # Without the narrowing, the same remote advertises every session (what the test would see if it broke).
    monkeypatch.setenv(ENV, "0")
    _append(store, ses, 1, start=9)
    push_sessions(store, [ses])
    assert len(_advertised(trace)) == OTHERS + 1
    # The remote named by its URL (not a remote of the workspace): Git's push URL for it is found the same way.
    monkeypatch.setenv(ENV, "1")
    _append(store, ses, 1, start=10)
    (rep,) = push_sessions(store, [ses], remote=str(remote))
    assert rep.sessions == {ses: "updated"} and _advertised(trace) == {session_ref(ses)}
    done = subprocess.run(["git", "-C", str(remote), "fsck", "--strict", "--no-dangling"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_a_forks_first_push_sends_no_more_than_with_every_ref_advertised(remote: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "packets"
    ws = _workspace(tmp_path, str(remote))
    state = tmp_path / "state"
    store = Store.open(str(state), namespaces=("sessions",))
    parent = _long_session(store, str(ws), 200)
    push_sessions(store, [parent])
    fork = SessionStore(store).fork(parent).id
    _append(store, fork, 5, start=200)
    # The same fork pushed twice from the same starting point: narrowed, then with every ref advertised.
    shutil.copytree(state, tmp_path / "state-before", symlinks=True)
    shutil.copytree(remote, tmp_path / "remote-before", symlinks=True)
    sent = {}
    for narrowed in (True, False):
        shutil.rmtree(state)
        shutil.rmtree(remote)
        shutil.copytree(tmp_path / "state-before", state, symlinks=True)
        shutil.copytree(tmp_path / "remote-before", remote, symlinks=True)
        monkeypatch.setenv(ENV, "1" if narrowed else "0")
        monkeypatch.setenv("GIT_TRACE_PACKET", str(trace))
        before = _packs(remote)
        store = Store.open(str(state), namespaces=("sessions",))
        (rep,) = push_sessions(store, [fork])
        assert rep.sessions == {fork: "created"}
        (new,) = [p for p in _packs(remote) if p not in before]
        sent[narrowed] = (_objects_in(remote, new), _packs(remote)[new])
        shown = _advertised(trace)
        if narrowed:
            assert shown == {session_ref(parent)}  # the history it builds on, nothing else
        else:
            assert len(shown) == OTHERS + 1
    objects, size = sent[True]
    assert objects == sent[False][0] and objects < 20, sent  # the 200 shared messages did not travel
    assert size <= sent[False][1] + 16, sent  # the same objects (the commit times may differ by a digit's zlib)


def _fake_ssh(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A ``GIT_SSH_COMMAND`` that runs the remote command here (``sh`` or ``git shell``); its log of commands."""
    log = tmp_path / f"ssh-{how}.log"
    script = tmp_path / f"ssh-{how}"
    run = {"sh": 'exec sh -c "$cmd"', "git-shell": 'exec git shell -c "$cmd"',
           # Refuses any other command by a line on its output (what Git reads the refs from), not on stderr.
           "stdout": 'case "$cmd" in git-*) exec sh -c "$cmd";; esac\necho "Invalid command: $cmd"; exit 1',
           # Fetches, but no push at all: Permission denied for any receive-pack, as a read-only key gets.
           "read-only": 'case "$cmd" in *receive-pack*) echo "ERROR: Permission to r.git denied to reader." >&2; '
                        'exit 1;; esac\nexec git shell -c "$cmd"'}[how]
    # OpenSSH's arguments: options, the host, then the command as one word (the last).
    script.write_text(f'#!/bin/sh\nfor cmd; do :; done\nprintf "%s\\n" "$cmd" >> {shlex.quote(str(log))}\n{run}\n')
    script.chmod(0o755)
    return script, log


def _receive_packs(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return ["narrow" if line.startswith("git -c receive.hideRefs=") else "plain"
            for line in lines if "receive-pack" in line]


def test_over_ssh_a_shell_server_is_asked_for_the_narrowed_list(remote: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    script, log = _fake_ssh(tmp_path, "sh")
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "ssh")
    trace = tmp_path / "packets"
    monkeypatch.setenv("GIT_TRACE_PACKET", str(trace))
    ws = _workspace(tmp_path, f"fakehost:{remote}")
    store = Store.open(str(tmp_path / "state"), namespaces=("sessions",))
    ses = _long_session(store, str(ws), 4)
    push_sessions(store, [ses])
    _append(store, ses, 2, start=4)
    (rep,) = push_sessions(store, [ses])
    assert rep.sessions == {ses: "updated"}
    assert _receive_packs(log) == ["narrow", "narrow"]
    assert _advertised(trace) == {session_ref(ses)}
    assert git(remote, "rev-parse", session_ref(ses)).strip() == rep.commits[ses]
    # Narrowed to local remotes only, an ssh server never sees the command.
    monkeypatch.setenv(ENV, "local")
    _append(store, ses, 1, start=6)
    push_sessions(store, [ses])
    assert _receive_packs(log) == ["narrow", "narrow", "plain"]


@pytest.mark.parametrize("server", ["git-shell", "stdout"])
def test_a_server_that_runs_only_git_receive_pack_gets_it_in_the_same_push_and_is_remembered(
        remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    script, log = _fake_ssh(tmp_path, server)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "ssh")
    url = f"fakehost:{remote}"
    ws = _workspace(tmp_path, url)
    state = tmp_path / "state"
    store = Store.open(str(state), namespaces=("sessions",))
    ses = _long_session(store, str(ws), 4)
    (rep,) = push_sessions(store, [ses])
    assert rep.sessions == {ses: "created"}
    # Refused (git shell runs nothing else), then the plain receive-pack: one push, landed.
    assert _receive_packs(log) == ["narrow", "plain"]
    assert git(remote, "rev-parse", session_ref(ses)).strip() == rep.commits[ses]
    assert (state / "git" / PLAIN_DIR / remote_key(url)).is_file()
    log.unlink()
    _append(store, ses, 2, start=4)
    (rep,) = push_sessions(store, [ses])
    assert rep.sessions == {ses: "updated"} and _receive_packs(log) == ["plain"]


def test_a_server_that_refuses_every_push_fails_as_before_and_nothing_is_remembered(
        remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script, log = _fake_ssh(tmp_path, "read-only")
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "ssh")
    ws = _workspace(tmp_path, f"fakehost:{remote}")
    state = tmp_path / "state"
    store = Store.open(str(state), namespaces=("sessions",))
    ses = _long_session(store, str(ws), 2)
    refs_before = git(remote, "for-each-ref")
    with pytest.raises(KxenError) as e:
        push_sessions(store, [ses])
    assert "cannot be reached" in str(e.value) and "Could not read from remote repository" in str(e.value), e.value
    assert _receive_packs(log) == ["narrow", "plain"]  # both asked; the plain one's refusal is the error
    assert not (state / "git" / PLAIN_DIR).exists()
    assert git(remote, "for-each-ref") == refs_before


def test_the_transport_and_the_command() -> None:
    for url, kind in (("/srv/r.git", "local"), ("../r.git", "local"), ("file:///srv/r.git", "local"),
                      ("./a:b", "local"), ("host:r.git", "ssh"), ("git@host:org/r.git", "ssh"),
                      ("ssh://git@host:2222/r.git", "ssh"), ("git+ssh://host/r.git", "ssh"),
                      ("git://host/r.git", "other"), ("https://host/r.git", "other"), ("ext::sh -c x", "other"),
                      ("hg::https://host/r", "other"), ("", "other")):
        assert transport_of(url) == kind, url
    shown = refs_to_show(["refs/kxen/sessions/ses_a", "refs/kxen/leases/ses_a", "refs/heads/kxen/x"],
                         ["refs/kxen/sessions/ses_p"])
    assert shown == ["refs/kxen/leases/ses_a", "refs/kxen/sessions/ses_a", "refs/kxen/sessions/ses_p"]
    assert refs_to_show(["refs/kxen/checkpoints/ses_a"], []) is None  # builds on other sessions' checkpoints
    cmd = receive_pack_command(shown)
    # One shell line whose words are Git's arguments, the negations quoted.
    assert shlex.split(cmd) == ["git", "-c", "receive.hideRefs=refs/kxen",
                                "-c", "receive.hideRefs=!refs/kxen/leases/ses_a",
                                "-c", "receive.hideRefs=!refs/kxen/sessions/ses_a",
                                "-c", "receive.hideRefs=!refs/kxen/sessions/ses_p",
                                "-c", "core.alternateRefsPrefixes=refs/kxen/leases/ses_a refs/kxen/sessions/ses_a "
                                      "refs/kxen/sessions/ses_p", "receive-pack"]
