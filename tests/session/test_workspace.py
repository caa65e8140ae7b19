"""Workspace identity, binding checks and worktrees, against real git in tmp dirs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.session.workspace import (
    InvalidWorktreeName,
    WorkspaceError,
    WorkspaceIdentity,
    WorkspaceMismatch,
    WorkspaceNotFound,
    check_binding,
    create_worktree,
    inspect_workspace,
    normalize_remote_url,
    remove_worktree,
    strip_credentials,
    validate_worktree_name,
    worktree_path,
)

REMOTE = "https://github.com/org/repo.git"
TOKEN = "ghp_S3cretT0kenValue"


@pytest.fixture(autouse=True)
def _isolated_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A machine with no (or a hostile) git config must behave the same.
    empty = tmp_path / "empty-gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@example.invalid")


def git(cwd: Path | str, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def commit(repo: Path, name: str = "f.txt", content: str | None = None) -> str:
    (repo / name).write_text(content if content is not None else f"{name} {os.urandom(4).hex()}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"change {name}")
    return git(repo, "rev-parse", "HEAD")


def make_repo(path: Path, *, remote: str | None = REMOTE, commits: int = 1) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    if remote is not None:
        git(path, "remote", "add", "origin", remote)
    for i in range(commits):
        commit(path, f"file{i}.txt")
    return path


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()


def worktrees(repo: Path) -> list[str]:
    out = git(repo, "worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


# -- remote URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"https://user:{TOKEN}@github.com/org/repo.git",
        "https://github.com/org/repo",
        "git@github.com:org/repo.git",
        "ssh://git@github.com/org/repo",
        "HTTPS://GitHub.COM:443/org/repo/",
        "ssh://git@github.com:22/org/repo.git/",
        "http://github.com:80/org/repo",
    ],
)
def test_remote_url_variants_normalize_equal(url: str) -> None:
    assert normalize_remote_url(url) == "github.com/org/repo"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ssh://git@host.example:2222/org/repo.git", "host.example:2222/org/repo"),
        ("https://host.example:8443/Org/Repo", "host.example:8443/Org/Repo"),  # path case is kept
        ("git://host.example/org/repo.git", "host.example/org/repo"),
        ("file:///srv/git/repo.git/", "file:/srv/git/repo.git"),  # local .git dirs are distinct paths
        ("/srv/git/repo/", "file:/srv/git/repo"),
        ("../sibling/repo", "file:../sibling/repo"),
        ("git@[::1]:org/repo.git", "[::1]/org/repo"),
        ("ssh://git@[::1]/org/repo", "[::1]/org/repo"),
    ],
)
def test_normalize_remote_url_forms(url: str, expected: str) -> None:
    assert normalize_remote_url(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"https://user:{TOKEN}@github.com/org/repo.git", "https://github.com/org/repo.git"),
        (f"https://{TOKEN}@github.com/org/repo", "https://github.com/org/repo"),
        (f"https://user:{TOKEN}@@host/x", "https://host/x"),  # last @ ends user-info, as in git
        ("git@github.com:org/repo.git", "github.com:org/repo.git"),
        ("/srv/git/repo", "/srv/git/repo"),
    ],
)
def test_strip_credentials(url: str, expected: str) -> None:
    assert strip_credentials(url) == expected


def test_token_never_reaches_identity_or_record(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", remote=f"https://user:{TOKEN}@github.com/org/repo.git")
    plain = make_repo(tmp_path / "p", remote="https://github.com/org/repo")
    ws = inspect_workspace(str(repo))
    assert ws.remote_hash == inspect_workspace(str(plain)).remote_hash
    assert TOKEN not in normalize_remote_url(git(repo, "config", "remote.origin.url"))
    assert TOKEN not in strip_credentials(git(repo, "config", "remote.origin.url"))
    assert TOKEN not in repr(ws)
    assert all(TOKEN not in (v or "") for v in ws.to_record().values())


# -- inspection -------------------------------------------------------------------------------


def test_git_remote_workspace_fields(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    ws = inspect_workspace(str(repo))
    assert ws.root == os.path.realpath(repo)
    assert ws.repo_root == os.path.realpath(repo)
    assert ws.branch == "main"
    assert ws.head == git(repo, "rev-parse", "HEAD")
    assert len(ws.identity) == 64 and int(ws.identity, 16) >= 0
    assert ws.remote_hash is not None and len(ws.remote_hash) == 64


def test_identity_stable_when_head_advances(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    before = inspect_workspace(str(repo))
    commit(repo, "more.txt")
    after = inspect_workspace(str(repo))
    assert after.identity == before.identity
    assert after.head != before.head
    check_binding(before, after, rebind=False)


def test_same_identity_for_each_url_form_of_origin(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", remote="git@github.com:org/repo.git")
    first = inspect_workspace(str(repo))
    for url in ("https://github.com/org/repo", "ssh://git@github.com/org/repo", f"https://u:{TOKEN}@github.com/org/repo.git"):
        git(repo, "remote", "set-url", "origin", url)
        again = inspect_workspace(str(repo))
        assert (again.identity, again.remote_hash) == (first.identity, first.remote_hash)


def test_copied_repo_keeps_identity_but_needs_rebind(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    recorded = inspect_workspace(str(repo))
    current = inspect_workspace(str(copy))
    assert current.identity == recorded.identity
    assert current.root != recorded.root
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(recorded, current, rebind=False)
    assert err.value.field == "root"
    assert "--rebind-workspace" in str(err.value) and current.root in str(err.value)
    check_binding(recorded, current, rebind=True)


def test_clone_with_same_origin_keeps_identity(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    git(clone, "remote", "set-url", "origin", "git@github.com:org/repo.git")
    recorded, current = inspect_workspace(str(repo)), inspect_workspace(str(clone))
    assert current.identity == recorded.identity and current.root != recorded.root
    check_binding(recorded, current, rebind=True)


def test_repo_without_remote_identity_follows_root_commits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", remote=None, commits=2)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    commit(copy, "later.txt")
    ws, moved = inspect_workspace(str(repo)), inspect_workspace(str(copy))
    assert ws.remote_hash is None
    assert moved.identity == ws.identity
    other = make_repo(tmp_path / "other", remote=None)  # different root commit
    assert inspect_workspace(str(other)).identity != ws.identity


def test_subdirectory_workspace(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / "pkg" / "sub").mkdir(parents=True)
    commit(repo, "pkg/sub/x.txt")
    sub = inspect_workspace(str(repo / "pkg" / "sub"))
    top = inspect_workspace(str(repo))
    assert sub.root == os.path.realpath(repo / "pkg" / "sub")
    assert sub.repo_root == os.path.realpath(repo)
    assert sub.identity != top.identity
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(top, sub, rebind=True)
    assert err.value.field == "identity"


def test_plain_directory(tmp_path: Path) -> None:
    d = tmp_path / "plain"
    d.mkdir()
    link = tmp_path / "link"
    link.symlink_to(d)
    ws = inspect_workspace(str(d))
    assert (ws.repo_root, ws.remote_hash, ws.branch, ws.head) == (None, None, None, None)
    assert inspect_workspace(str(link)) == ws  # realpath: the same directory
    moved = tmp_path / "moved"
    shutil.copytree(d, moved)
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(ws, inspect_workspace(str(moved)), rebind=True)
    assert err.value.field == "identity"


def test_repo_without_commits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", remote=None, commits=0)
    ws = inspect_workspace(str(repo))
    assert ws.head is None and ws.branch == "main" and ws.remote_hash is None
    assert ws.repo_root == os.path.realpath(repo)
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    assert inspect_workspace(str(copy)).identity != ws.identity  # unborn repos cannot move


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_workspace_must_be_an_existing_directory(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "file":
        path.write_text("")
    with pytest.raises(WorkspaceNotFound) as err:
        inspect_workspace(str(path))
    assert str(path) in str(err.value) and err.value.exit_code == 2


def test_inside_git_dir_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    with pytest.raises(WorkspaceError, match="not a work tree"):
        inspect_workspace(str(repo / ".git"))


def test_git_environment_of_a_hook_does_not_leak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "r")
    other = make_repo(tmp_path / "o", remote="https://example.com/other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    assert inspect_workspace(str(repo)).root == os.path.realpath(repo)
    assert inspect_workspace(str(repo)).remote_hash != inspect_workspace(str(other)).remote_hash


# -- records ----------------------------------------------------------------------------------


def test_record_round_trip(tmp_path: Path) -> None:
    ws = inspect_workspace(str(make_repo(tmp_path / "r")))
    record = ws.to_record()
    assert set(record) == {"root", "identity", "repo_root", "remote_hash", "branch", "head"}
    assert all(v is None or isinstance(v, str) for v in record.values())
    assert WorkspaceIdentity.from_record(record) == ws
    plain = inspect_workspace(str(tmp_path))
    assert WorkspaceIdentity.from_record(plain.to_record()) == plain


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"identity": 1.5}, "'identity' must be a string"),
        ({"identity": "abc"}, "'identity' is not 64"),
        ({"head": "--upload-pack=evil"}, "'head' is not a Git commit id"),
        ({"extra": "x"}, "unknown key"),
        ({"root": None}, "'root' is null"),
    ],
)
def test_from_record_refuses_malformed(tmp_path: Path, change: dict, message: str) -> None:
    record = {**inspect_workspace(str(make_repo(tmp_path / "r"))).to_record(), **change}
    with pytest.raises(WorkspaceError, match=message):
        WorkspaceIdentity.from_record(record)


def test_from_record_refuses_missing_key(tmp_path: Path) -> None:
    record = inspect_workspace(str(make_repo(tmp_path / "r"))).to_record()
    del record["branch"]
    with pytest.raises(WorkspaceError, match="'branch' missing"):
        WorkspaceIdentity.from_record(record)


# -- binding ----------------------------------------------------------------------------------


def test_same_workspace_binds_with_or_without_rebind(tmp_path: Path) -> None:
    ws = inspect_workspace(str(make_repo(tmp_path / "r")))
    check_binding(ws, ws, rebind=False)
    check_binding(ws, ws, rebind=True)


def test_other_branch_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    recorded = inspect_workspace(str(repo))
    git(repo, "switch", "-q", "-c", "feature")
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(recorded, inspect_workspace(str(repo)), rebind=True)
    assert (err.value.field, err.value.recorded, err.value.current) == ("branch", "main", "feature")
    assert "'feature'" in str(err.value) and "'main'" in str(err.value)


def test_detached_head_refused_when_branch_recorded(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    recorded = inspect_workspace(str(repo))
    git(repo, "switch", "-q", "--detach")
    current = inspect_workspace(str(repo))
    assert current.branch is None and current.head == recorded.head
    with pytest.raises(WorkspaceMismatch, match="detached HEAD"):
        check_binding(recorded, current, rebind=False)
    check_binding(current, recorded, rebind=False)  # no branch recorded: any branch will do


def test_rewound_head_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", commits=2)
    recorded = inspect_workspace(str(repo))
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(recorded, inspect_workspace(str(repo)), rebind=True)
    assert err.value.field == "head" and "does not descend" in str(err.value)


def test_rewritten_head_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    recorded = inspect_workspace(str(repo))
    git(repo, "commit", "-q", "--amend", "-m", "rewritten")
    with pytest.raises(WorkspaceMismatch, match="does not descend"):
        check_binding(recorded, inspect_workspace(str(repo)), rebind=False)


def test_recorded_head_unknown_to_repo_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    current = inspect_workspace(str(repo))
    recorded = WorkspaceIdentity(**{**current.to_record(), "head": "ab" * 20})
    with pytest.raises(WorkspaceMismatch, match="unknown to this repository"):
        check_binding(recorded, current, rebind=False)


def test_recorded_head_but_no_commits_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    recorded = inspect_workspace(str(repo))
    empty = make_repo(tmp_path / "e", commits=0)
    with pytest.raises(WorkspaceMismatch, match="has no commits"):
        check_binding(recorded, inspect_workspace(str(empty)), rebind=True)


def test_different_remote_refused_even_with_rebind(tmp_path: Path) -> None:
    recorded = inspect_workspace(str(make_repo(tmp_path / "a")))
    current = inspect_workspace(str(make_repo(tmp_path / "b", remote="https://github.com/org/other")))
    with pytest.raises(WorkspaceMismatch) as err:
        check_binding(recorded, current, rebind=True)
    assert err.value.field == "identity" and "origin remote differs" in str(err.value)
    assert isinstance(err.value, KxenError)


# -- worktrees --------------------------------------------------------------------------------


def test_worktree_path_rule() -> None:
    assert worktree_path("/src/proj", "fix-1") == "/src/proj.worktrees/fix-1"
    assert worktree_path("/src/proj/", "fix-1") == "/src/proj.worktrees/fix-1"


def test_create_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    ws = inspect_workspace(str(repo))
    wt = create_worktree(ws, "try-1")
    expected = os.path.realpath(tmp_path / "r.worktrees" / "try-1")
    assert wt.root == expected == wt.repo_root
    assert wt.branch == "kxen/try-1" and wt.head == ws.head and wt.identity == ws.identity
    assert expected in [os.path.realpath(p) for p in worktrees(repo)]
    assert git(expected, "symbolic-ref", "--short", "HEAD") == "kxen/try-1"
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"  # the original is untouched


def test_create_worktree_from_subdirectory_binds_subdirectory(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / "pkg").mkdir()
    commit(repo, "pkg/a.txt")
    ws = inspect_workspace(str(repo / "pkg"))
    wt = create_worktree(ws, "sub")
    assert wt.root == os.path.realpath(tmp_path / "r.worktrees" / "sub" / "pkg")
    assert wt.repo_root == os.path.realpath(tmp_path / "r.worktrees" / "sub")
    assert wt.identity == ws.identity


def assert_nothing_created(repo: Path) -> None:
    assert branches(repo) == ["main"]
    assert len(worktrees(repo)) == 1
    assert not (repo.parent / f"{repo.name}.worktrees").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "-x", "x.lock", "", "x..y", "x.", ".x", "a b", "x" * 65, "a@{b"])
def test_invalid_worktree_names_refused(tmp_path: Path, name: str) -> None:
    repo = make_repo(tmp_path / "r")
    with pytest.raises(InvalidWorktreeName) as err:
        create_worktree(inspect_workspace(str(repo)), name)
    assert err.value.exit_code == 2 and isinstance(err.value, UsageError)
    assert_nothing_created(repo)
    with pytest.raises(InvalidWorktreeName):
        validate_worktree_name(name)


def test_valid_worktree_names_accepted() -> None:
    for name in ("a", "fix-1", "v1.2_rc", "X" * 64):
        validate_worktree_name(name)


def test_existing_branch_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "branch", "kxen/taken")
    with pytest.raises(InvalidWorktreeName, match="branch kxen/taken already exists"):
        create_worktree(inspect_workspace(str(repo)), "taken")
    assert sorted(branches(repo)) == ["kxen/taken", "main"]
    assert len(worktrees(repo)) == 1 and not (tmp_path / "r.worktrees").exists()


def test_existing_path_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (tmp_path / "r.worktrees" / "busy").mkdir(parents=True)
    with pytest.raises(InvalidWorktreeName, match="already exists"):
        create_worktree(inspect_workspace(str(repo)), "busy")
    assert branches(repo) == ["main"] and len(worktrees(repo)) == 1
    assert os.listdir(tmp_path / "r.worktrees" / "busy") == []


def test_worktree_needs_git_and_a_commit(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidWorktreeName, match="not a Git repository"):
        create_worktree(inspect_workspace(str(plain)), "w")
    unborn = make_repo(tmp_path / "u", commits=0)
    with pytest.raises(InvalidWorktreeName, match="no commits"):
        create_worktree(inspect_workspace(str(unborn)), "w")
    assert not (tmp_path / "plain.worktrees").exists() and not (tmp_path / "u.worktrees").exists()


def test_failed_creation_rolls_back(tmp_path: Path) -> None:
    # The workspace is an untracked subdirectory, so the new worktree lacks it: the
    # failure comes after `git worktree add` succeeded and must undo all of it.
    repo = make_repo(tmp_path / "r")
    (repo / "scratch").mkdir()
    with pytest.raises(WorkspaceError, match="not tracked"):
        create_worktree(inspect_workspace(str(repo / "scratch")), "w")
    assert_nothing_created(repo)
    assert not (repo / ".git" / "worktrees" / "w").exists()


def test_remove_worktree_undoes_creation(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    wt = create_worktree(inspect_workspace(str(repo)), "gone")
    (Path(wt.root) / "dirty.txt").write_text("uncommitted\n")
    remove_worktree(str(repo), wt.root, "kxen/gone")
    assert branches(repo) == ["main"] and len(worktrees(repo)) == 1
    assert not os.path.exists(wt.root)
    remove_worktree(str(repo), wt.root, "kxen/gone")  # already gone: nothing to do
