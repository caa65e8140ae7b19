"""A remote holding many sessions (the fleet case): ``session ls-remote`` at 500 sessions, concurrent pushers.

The remote is built by ``bench/fleet.py``'s builder (one ``git fast-import``
in the layout of a first push, which the bench proves against a real push)
once per module. The listing runs through the installed CLI with a ``git``
on ``PATH`` that logs every process it starts: a warm listing must start no
process per session (no ``cat-file``, no ``fetch``), whatever the remote
holds. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.fleet import build_remote, concurrent_pushers, count_log, fast_import_stream, git_counter, make_session
from tests.helpers import cli_env, git, run_kxen

N = 500
BAD = "ses_badref0000"  # a session ref naming a blob, not a group commit


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("fleet")
    remote = base / "remote.git"
    ids = build_remote(str(remote), N - 1)
    blob = subprocess.run(["git", "-C", str(remote), "hash-object", "-w", "--stdin"], input=b"not a session\n",
                          capture_output=True, check=True).stdout.decode().strip()
    git(remote, "update-ref", f"refs/kxen/sessions/{BAD}", blob)
    ws = base / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    git(ws, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "c")
    git(ws, "remote", "add", "origin", str(remote))
    return {"base": base, "remote": remote, "ws": ws, "ids": ids}


def _state(base: Path, name: str) -> Path:
    """A state dir that exists (as a runner's does), holding no session: the first write makes it (§10.3)."""
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store
    from kxen_agent.store.objects import encode_object

    state = base / name
    Store(str(state), namespaces=(NS,)).put_raw(encode_object("blob", b"first write"))
    return state


def _listing(fleet: dict, state: Path, log: Path) -> list[dict]:
    if log.exists():
        log.unlink()
    env = cli_env(state, git_counter(str(fleet["base"] / "bin"), str(log)))
    p = run_kxen(["session", "ls-remote", "--json"], env=env, cwd=fleet["ws"], expect=0)
    return json.loads(p.out)["sessions"]


def _check_rows(rows: list[dict], ids: list[str]) -> None:
    by_id = {r["id"]: r for r in rows}
    assert sorted(by_id) == sorted([*ids, BAD])
    bad = by_id.pop(BAD)
    assert "is not a commit" in bad["error"], bad
    for i, ses in enumerate(ids):
        row = by_id[ses]
        s = make_session(i, leased=i % 100 == 99)  # build_remote's default: one session in 100 holds a lease
        assert "error" not in row, row
        assert row["head"] == "msg_" + s.refs["head"].hex() and row["messages"] == 2, row
        assert (row["parentId"], row["forkKind"], row["fence"], row["local"]) == (None, None, 0, "absent"), row
        if s.lease is not None:
            assert row["lease"]["host"] == json.loads(s.lease)["host"], row
        else:
            assert row["lease"] is None, row


def test_ls_remote_lists_every_session_cold_then_warm_with_no_process_per_session(fleet: dict) -> None:
    state = _state(fleet["base"], "state-a")
    log = fleet["base"] / "git-a.log"
    cold = _listing(fleet, state, log)
    _check_rows(cold, fleet["ids"])
    ran = count_log(str(log))
    # One fetch of the tips and one cat-file for all of them (not four per session).
    assert ran.get("fetch") == 1 and ran.get("cat-file") == 1, ran

    warm = _listing(fleet, state, log)
    assert warm == cold
    ran = count_log(str(log))
    assert "fetch" not in ran and "cat-file" not in ran, ran
    assert sum(ran.values()) < 30, ran  # a fixed handful (remote resolution, workbench, ls-remote), not per session

    # A new session on the remote: only its tip is fetched and read; the rest comes from the cache.
    extra = make_session(N + 7)
    subprocess.run(["git", "fast-import", "--quiet"], cwd=fleet["remote"], check=True,
                   input=b"".join(fast_import_stream([extra])))
    again = _listing(fleet, state, log)
    assert [r["id"] for r in again] == sorted([*fleet["ids"], BAD, extra.ses])
    assert [r for r in again if r["id"] != extra.ses] == cold
    ran = count_log(str(log))
    assert ran.get("fetch") == 1 and ran.get("cat-file") == 1, ran
    git(fleet["remote"], "update-ref", "-d", f"refs/kxen/sessions/{extra.ses}")


def test_a_damaged_or_missing_listing_cache_changes_nothing_but_the_work(fleet: dict) -> None:
    state = _state(fleet["base"], "state-b")
    log = fleet["base"] / "git-b.log"
    first = _listing(fleet, state, log)
    caches = list((state / "git" / "kxen-listing").iterdir())
    assert len(caches) == 1
    data = caches[0].read_bytes()
    # Flip one byte of the body: the checksum no longer holds, the cache is not used.
    caches[0].write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    assert _listing(fleet, state, log) == first
    assert count_log(str(log)).get("cat-file") == 1  # everything read again
    caches[0].unlink()
    assert _listing(fleet, state, log) == first


def test_a_missing_state_dir_is_listed_and_not_created(fleet: dict) -> None:
    state = fleet["base"] / "never-made"
    rows = _listing(fleet, state, fleet["base"] / "git-c.log")
    assert len(rows) == N
    assert not state.exists()


def test_eight_runners_push_eight_sessions_at_once_and_every_push_lands(fleet: dict) -> None:
    work = fleet["base"] / "pushers"
    work.mkdir()
    remote = work / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", "--mirror", str(fleet["remote"]), str(remote)], check=True)
    res = concurrent_pushers(str(work), str(remote), 8, 2, log=lambda _: None)
    assert res["exit_codes"] == [0] * 8
    assert res["failed"] == [], res["failed"]
    assert res["pushes"] == res["landed"] == 16
    assert res["all_refs_present"]
    done = subprocess.run(["git", "-C", str(remote), "fsck", "--strict", "--no-dangling"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_the_builder_makes_what_a_real_push_makes(tmp_path: Path) -> None:
    from bench.fleet import template_check

    assert template_check(str(tmp_path))["commit"]


def test_a_tip_the_remote_cannot_send_is_that_sessions_row_and_the_rest_are_listed(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    ids = build_remote(str(remote), 12, leases_every=0)
    # A commit whose tree the remote lacks (a damaged repository): upload-pack cannot send it.
    body = b"tree " + b"1" * 40 + b"\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nx\n"
    broken = subprocess.run(["git", "-C", str(remote), "hash-object", "-t", "commit", "--literally", "-w", "--stdin"],
                            input=body, capture_output=True, check=True).stdout.decode().strip()
    git(remote, "update-ref", "refs/kxen/sessions/ses_broken0000", broken)
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    git(ws, "remote", "add", "origin", str(remote))
    state = _state(tmp_path, "state")
    p = run_kxen(["session", "ls-remote", "--json"], env=cli_env(state), cwd=ws, expect=0)
    rows = {r["id"]: r for r in json.loads(p.out)["sessions"]}
    assert sorted(rows) == sorted([*ids, "ses_broken0000"])
    assert "cannot be fetched" in rows.pop("ses_broken0000")["error"]
    assert all("error" not in r and r["messages"] == 2 for r in rows.values()), rows
    # The text listing names it as that session's problem, and lists the others.
    text = run_kxen(["session", "ls-remote"], env=cli_env(state), cwd=ws, expect=0).out
    assert "ses_broken0000  (unreadable: its commit cannot be fetched" in text, text
    assert all(ses in text for ses in ids)
