"""Permissions of a state dir and of bundles (``objects_spec.md`` §10.4; issue 25, reproduction 5).

Through the installed CLI, in real processes with the umask they are given:
a state dir is 0700 with 0600 files (lock files too) and an exported bundle
0600 even under ``umask 000``; the shared mode gives 02770/0660 even under
``umask 077``; a state dir owned by another uid is refused with one line
and nothing changed, and used when ``KXEN_AGENT_SAFE_DIRECTORIES`` lists it;
another local user can neither read a transcript nor take a lock on a lock
file (the attack: a shared lock held forever blocks ``gc``). The tests run
as root, as CI does; "another user" is uid 65534 (nobody).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import KXEN_AGENT, Cli, Proc, git_workspace, write_agent

NOBODY = 65534


def run(cli: Cli, *args: str, umask: int, env: dict[str, str] | None = None, expect: int | None = None) -> Proc:
    """``kxen-agent ARGS`` in a process whose umask is ``umask``."""
    full = {**cli.env, **(env or {})}
    done = subprocess.run([KXEN_AGENT, *args], capture_output=True, text=True, env=full, umask=umask, timeout=60)
    p = Proc(tuple(args), done.returncode, done.stdout, done.stderr)
    if expect is not None:
        assert p.rc == expect, str(p)
    return p


def modes(root: Path) -> tuple[set[int], set[int]]:
    """(the modes of every directory, the modes of every file) at and under ``root``."""
    dirs, files = {stat.S_IMODE(root.stat().st_mode)}, set()
    for p in root.rglob("*"):
        m = stat.S_IMODE(p.lstat().st_mode)
        (dirs if p.is_dir() else files).add(m)
    return dirs, files


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A directory other users can traverse (pytest's own tmp dirs are root's alone: they would hide the attack)."""
    d = Path(tempfile.mkdtemp(prefix="kxen-perm-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _session(cli: Cli, base: Path, umask: int, env: dict[str, str] | None = None) -> str:
    ws = git_workspace(base / "ws")
    agent = write_agent(base / "agent", [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]},
                                         {"content": "done"}])
    res = run(cli, "run", "--workspace", str(ws), "--task", "say hi", "--agent", str(agent), "--json",
              umask=umask, env=env, expect=0)
    return res.json()["session"]


def test_umask_000_still_gives_0700_dirs_0600_files_and_a_0600_bundle(public_tmp: Path) -> None:
    state = public_tmp / "state"
    cli = Cli(state)
    ses = _session(cli, public_tmp, 0)
    run(cli, "gc", "--prune=now", umask=0, expect=0)  # takes gc's lock files, may write a pack
    for name in ("b.kxb", "b.json"):
        run(cli, "session", "export", ses, "-o", str(public_tmp / name), umask=0, expect=0)
        assert stat.S_IMODE((public_tmp / name).stat().st_mode) == 0o600, name
    dirs, files = modes(state)
    assert dirs == {0o700} and files == {0o600}, (sorted(map(oct, dirs)), sorted(map(oct, files)))
    locks = [p for p in state.rglob("*.lock")]
    assert locks, "no lock file was made: the check saw none"


def test_another_user_can_neither_read_a_transcript_nor_hold_a_lock(public_tmp: Path) -> None:
    """Reproduction 5: uid 65534 opens the store lock and holds a shared lock on it, which blocks gc forever."""
    state = public_tmp / "state"
    cli = Cli(state)
    _session(cli, public_tmp, 0o022)  # the most common umask: it made 0755/0644 before
    lock = state / "locks" / "gc.lock"
    assert lock.exists()
    probe = ("import fcntl, sys\n"
             "try:\n"
             "    f = open(sys.argv[1], 'rb')\n"
             "    fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
             "    print('locked')\n"
             "except PermissionError:\n"
             "    print('denied')\n")
    transcript = next(p for p in (state / "steps").rglob("*") if p.is_file())  # the run's messages
    for target in (lock, transcript):
        done = subprocess.run([shutil.which("python3", path="/usr/bin:/bin") or "python3", "-c", probe, str(target)], capture_output=True, text=True,
                              user=NOBODY, group=NOBODY, extra_groups=[], timeout=30)
        assert done.stdout.strip() == "denied", (target, done.stdout, done.stderr)


def test_an_old_world_readable_state_dir_is_closed_by_its_first_write(public_tmp: Path) -> None:
    state = public_tmp / "state"
    cli = Cli(state)
    _session(cli, public_tmp, 0o022)
    state.chmod(0o755)  # as kxen-agent made it before §10.4
    run(cli, "session", "list", umask=0o022, expect=0)
    assert stat.S_IMODE(state.stat().st_mode) == 0o755, "a read changed the state dir"
    run(cli, "gc", umask=0o022, expect=0)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_shared_mode_gives_02770_dirs_and_0660_files_under_umask_077(public_tmp: Path) -> None:
    state = public_tmp / "state"
    cli = Cli(state)
    shared = {"KXEN_AGENT_SHARED": "group"}
    ses = _session(cli, public_tmp, 0o077, env=shared)
    # The mode is the state dir's: a process without the variable keeps it.
    run(cli, "gc", "--prune=now", umask=0o077, expect=0)
    run(cli, "session", "fork", ses, "--json", umask=0o077, expect=0)
    dirs, files = modes(state)
    assert dirs == {0o2770} and files == {0o660}, (sorted(map(oct, dirs)), sorted(map(oct, files)))
    # A bundle leaves the state dir: it is its writer's alone, shared mode or not.
    run(cli, "session", "export", ses, "-o", str(public_tmp / "b.kxb"), umask=0o077, env=shared, expect=0)
    assert stat.S_IMODE((public_tmp / "b.kxb").stat().st_mode) == 0o600


def test_shared_asked_for_on_a_private_state_dir_is_refused_in_one_line(public_tmp: Path) -> None:
    state = public_tmp / "state"
    cli = Cli(state)
    _session(cli, public_tmp, 0o022)
    p = run(cli, "session", "list", umask=0o022, env={"KXEN_AGENT_SHARED": "group"}, expect=1)
    assert p.err.count("\n") == 1 and "is private" in p.err and "chmod" in p.err, p.err
    p = run(cli, "session", "list", umask=0o022, env={"KXEN_AGENT_SHARED": "world"}, expect=1)
    assert p.err.count("\n") == 1 and "'group' or 'private'" in p.err, p.err


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_a_state_dir_owned_by_another_uid_is_refused_unless_listed_safe(public_tmp: Path) -> None:
    state = public_tmp / "state"
    cli = Cli(state)
    ses = _session(cli, public_tmp, 0o022)
    os.chown(state, NOBODY, NOBODY)
    before = _tree(state)
    for args in (("session", "list"), ("session", "show", ses), ("gc",), ("fsck",),
                 ("session", "export", ses, "-o", str(public_tmp / "x.kxb"))):
        p = run(cli, *args, umask=0o022, expect=1)
        assert p.err.count("\n") == 1 and "Traceback" not in p.err, p.err
        assert f"owned by uid {NOBODY}" in p.err and "KXEN_AGENT_SAFE_DIRECTORIES" in p.err, p.err
    assert _tree(state) == before and not (public_tmp / "x.kxb").exists()
    # Listed (as itself, through a symlink, or with '*'), it is used as before; root is no exception above.
    link = public_tmp / "link"
    link.symlink_to(state)
    for listed in (str(state), f"/nonexistent{os.pathsep}{link}", "*"):
        p = run(cli, "session", "list", "--json", umask=0o022,
                env={"KXEN_AGENT_SAFE_DIRECTORIES": listed}, expect=0)
        assert [s["id"] for s in p.json()["sessions"]] == [ses]
    run(cli, "session", "list", umask=0o022, env={"KXEN_AGENT_SAFE_DIRECTORIES": str(public_tmp)}, expect=1)


def test_push_under_umask_000_leaves_nothing_open_to_others(public_tmp: Path) -> None:
    """The state dir's Git mirror (made by git, not the seam) follows §10.4 too."""
    from tests.helpers import git
    from tests.remote.gitserver import bare_repo

    remote = bare_repo(public_tmp / "remote.git")
    state = public_tmp / "state"
    cli = Cli(state)
    ses = _session(cli, public_tmp, 0)
    ws = public_tmp / "ws"
    git(ws, "remote", "add", "origin", str(remote))
    git(ws, "push", "-q", "origin", "main")
    run(cli, "session", "push", ses, umask=0, expect=0)
    assert (state / "git").is_dir()
    open_to_others = sorted(str(p.relative_to(state)) for p in [state, *state.rglob("*")]
                            if not p.is_symlink() and p.lstat().st_mode & 0o077)
    assert open_to_others == []


@pytest.mark.parametrize("shared", [False, True])
def test_a_state_dir_made_by_hand_takes_its_mode_at_the_first_write(public_tmp: Path, shared: bool) -> None:
    state = public_tmp / "state"
    state.mkdir(mode=0o755)
    cli = Cli(state)
    env = {"KXEN_AGENT_SHARED": "group"} if shared else {}
    run(cli, "session", "list", umask=0o022, env=env, expect=0)
    assert stat.S_IMODE(state.stat().st_mode) == 0o755, "a read changed the state dir"
    _session(cli, public_tmp, 0o022, env=env)
    dirs, files = modes(state)
    assert dirs == ({0o2770} if shared else {0o700}), sorted(map(oct, dirs))
    assert files == ({0o660} if shared else {0o600}), sorted(map(oct, files))

