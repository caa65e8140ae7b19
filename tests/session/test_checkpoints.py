"""The checkpointer on real Git repositories (``objects_spec.md`` §14.14): what a checkpoint holds and leaves out.

One repository for the module; each test works under its own session id (its own ref and kept index), so the
tests share the repository's objects but not their checkpoints.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kxen_agent.session import checkpoints as ckpt
from kxen_agent.session.workspace import inspect_workspace
from tests.helpers import git, git_workspace


def out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = git_workspace(tmp_path_factory.mktemp("ckpt") / "ws", {
        "README.md": "# readme\n", "src/a.py": "a = 1\n", ".gitignore": "*.tmp\nbuild/\n", "kept.tmp": "x\n"})
    git(ws, "add", "-f", "kept.tmp")  # tracked though ignored: recorded (Git tracks it)
    git(ws, "commit", "-q", "-m", "tracked ignored file")
    return ws


def checkpointer(repo_dir: Path, ses: str, **bounds: int) -> ckpt.Checkpointer:
    ws = inspect_workspace(str(repo_dir))
    repo = ckpt.open_repo(ws, {})
    index = str(repo_dir.parent / "state" / ses / "index")
    return ckpt.Checkpointer(repo, ses, index, ckpt.Bounds(**bounds))


def files(repo_dir: Path, commit: str) -> set[str]:
    return set(out(repo_dir, "ls-tree", "-r", "--name-only", commit).split())


def test_a_checkpoint_is_the_workspace_as_git_sees_it(repo_dir: Path) -> None:
    c = checkpointer(repo_dir, "ses_a0000000000000000001")
    (repo_dir / "new.txt").write_text("new\n")
    (repo_dir / "skip.tmp").write_text("ignored\n")
    (repo_dir / "build").mkdir(exist_ok=True)
    (repo_dir / "build" / "out.bin").write_text("ignored dir\n")
    try:
        first = c.take("first")
        assert files(repo_dir, first.commit) == {"README.md", "src/a.py", ".gitignore", "kept.tmp", "new.txt"}
        # Nothing changed: no new commit, the ref's stands.
        again = c.take("again")
        assert again.reused and again.commit == first.commit
        os.remove(repo_dir / "src" / "a.py")
        second = c.take("second")
        assert not second.reused and "src/a.py" not in files(repo_dir, second.commit)
        parents = out(repo_dir, "rev-list", "--parents", "-n1", second.commit).split()[1:]
        assert parents == [first.commit, out(repo_dir, "rev-parse", "HEAD").strip()]
        assert ckpt.checkpoints_of(c.repo, c.ses) == [second.commit, first.commit]
        # The user's index and work tree are untouched.
        assert out(repo_dir, "diff", "--cached", "--name-only") == ""
        assert ckpt.diff(c.repo, first.commit, second.commit, stat=True).strip().startswith("src/a.py | 1 -")
    finally:
        git(repo_dir, "checkout", "-q", "--", "src/a.py")
        os.remove(repo_dir / "new.txt")


def test_bounds_leave_files_out_and_list_them(repo_dir: Path) -> None:
    c = checkpointer(repo_dir, "ses_b0000000000000000001", max_file_bytes=100, max_files=2)
    names = ["big.bin", "n1.txt", "n2.txt", "n3.txt"]
    (repo_dir / "big.bin").write_bytes(b"x" * 101)
    for n in names[1:]:
        (repo_dir / n).write_text(n)
    try:
        cp = c.take("bounded")
        assert dict(cp.left_out) == {"big.bin": "over checkpoint_max_file_bytes (101 > 100)",
                                     "n3.txt": "past checkpoint_max_files (2)"}
        got = files(repo_dir, cp.commit)
        assert {"n1.txt", "n2.txt"} <= got and not {"big.bin", "n3.txt"} & got
        msg = out(repo_dir, "log", "-1", "--format=%B", cp.commit)
        assert "left out (2):\n  big.bin: over checkpoint_max_file_bytes (101 > 100)\n" in msg
    finally:
        for n in names:
            os.remove(repo_dir / n)


def test_submodule_is_recorded_as_its_commit(repo_dir: Path, tmp_path: Path) -> None:
    sub = git_workspace(repo_dir / "vendor" / "lib", {"lib.txt": "lib\n"})
    try:
        cp = checkpointer(repo_dir, "ses_c0000000000000000001").take("with a nested repository")
        entry = out(repo_dir, "ls-tree", cp.commit, "vendor/lib").split()
        assert entry[:3] == ["160000", "commit", out(sub, "rev-parse", "HEAD").strip()]
    finally:
        subprocess.run(["rm", "-rf", str(repo_dir / "vendor")], check=True)


def test_the_repositorys_own_filters_never_run(repo_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "filter-ran"
    git(repo_dir, "config", "filter.evil.clean", f"touch {marker}; cat")
    (repo_dir / ".gitattributes").write_text("*.txt filter=evil\n")
    (repo_dir / "f.txt").write_text("text\n")
    try:
        cp = checkpointer(repo_dir, "ses_d0000000000000000001").take("filters")
        assert "f.txt" in files(repo_dir, cp.commit)
        assert not marker.exists(), "a checkpoint ran a filter the repository's configuration names"
    finally:
        git(repo_dir, "config", "--remove-section", "filter.evil")
        os.remove(repo_dir / ".gitattributes")
        os.remove(repo_dir / "f.txt")


def test_deleting_the_refs_of_pruned_sessions(repo_dir: Path) -> None:
    c = checkpointer(repo_dir, "ses_e0000000000000000001")
    c.take("to delete")
    keep = checkpointer(repo_dir, "ses_e0000000000000000002")
    keep.take("to keep")
    gone = ckpt.delete_checkpoint_refs(str(repo_dir), ["ses_e0000000000000000001", "ses_e00000000000000000ff"])
    assert gone == ["refs/kxen/checkpoints/ses_e0000000000000000001"]
    assert c.repo.tip(c.ses) is None and keep.repo.tip(keep.ses) is not None


def test_sha256_repository_and_policy_off_record_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "sha256"
    ws.mkdir()
    git(ws, "init", "-q", "--object-format=sha256")
    why = ckpt.unavailable_reason(inspect_workspace(str(ws)), {})
    assert why is not None and "sha256" in why
    with pytest.raises(ckpt.NoCheckpoints, match="checkpoints support sha1 repositories only"):
        ckpt.open_repo(inspect_workspace(str(ws)), {})
    assert ckpt.unavailable_reason(inspect_workspace(str(ws)), {"checkpoints": False}).startswith("[policy]")


def test_the_policy_keys_make_a_version_5_lock(tmp_path: Path) -> None:
    from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
    from kxen_agent.session.schema import SchemaViolation, check

    base = 'name = "a"\nprovider = "openai"\nmodel = "m"\n'
    plain = parse_agent_definition(base, str(tmp_path), "a.toml")
    assert plain["version"] == 3 and "checkpoints" not in plain["policy"]  # unchanged: the same lock id as before
    lock = parse_agent_definition(base + "[policy]\ncheckpoints = false\ncheckpoint_max_file_bytes = 1024\n",
                                  str(tmp_path), "a.toml")
    assert lock["version"] == 5
    assert (lock["policy"]["checkpoints"], lock["policy"]["checkpoint_max_file_bytes"]) == (False, 1024)
    check("agent", lock)
    assert ckpt.Bounds.of(lock["policy"]).max_file_bytes == 1024
    with pytest.raises(AgentDefinitionError, match="policy.checkpoints"):
        parse_agent_definition(base + "[policy]\ncheckpoints = 1\n", str(tmp_path), "a.toml")
    with pytest.raises(AgentDefinitionError, match="out of range"):
        parse_agent_definition(base + "[policy]\ncheckpoint_max_files = -1\n", str(tmp_path), "a.toml")
    with pytest.raises(SchemaViolation, match="policy.checkpoints"):
        check("agent", {**lock, "policy": {**lock["policy"], "checkpoints": "no"}})
