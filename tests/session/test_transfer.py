"""Moving sessions between runners: ``session export`` / ``session import``.

Real ``kxen-agent`` processes, real Git repositories and clones. The seed's
"Ephemeral runner" flow is run with its commands verbatim (relative bundle
names, run from the bundle's directory); every refusal must leave the
target state dir without a session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from kxen_agent.store import Store
from kxen_agent.store.bundle import iter_bundle_objects
from tests.helpers import Cli, git, git_workspace, write_agent

FAKE_KEY = "sk-kxen-FAKE-1234567890abcdef"
KEY_ENV = "KXEN_TEST_PROVIDER_KEY"
URL_TOKEN = "tok3n-c0ffee-5ecret"
ORIGIN = f"https://user:{URL_TOKEN}@example.invalid/org/repo.git"
CLEAN_ORIGIN = "https://example.invalid/org/repo"
CANARY = "kxen-env-canary-7f3a9c"  # set in the environment, never used by the agent

STEPS = [
    {"content": "Looking around.",
     "tool_calls": [{"name": "shell", "arguments": {"command": f"echo key=${KEY_ENV}"}},
                    {"name": "write_file", "arguments": {"path": "NOTES.md", "content": "notes\n"}}]},
    {"content": "First task done."},
    {"content": "Second task.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo second"}}]},
    {"content": "Second task done."},
]


class Kx(Cli):
    """The CLI that never shows a traceback (:class:`tests.helpers.Cli`, strict)."""

    def __init__(self, state_dir: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(state_dir, env, strict=True)


def clone(src: Path, dst: Path) -> Path:
    """A fresh clone of ``src`` whose origin is the credential-free spelling of the same URL."""
    git(src.parent, "clone", "-q", str(src), str(dst))
    git(dst, "remote", "set-url", "origin", CLEAN_ORIGIN)
    return dst


def source_repo(path: Path) -> Path:
    """Repository A: two commits (so a clone can be rewound behind the recorded HEAD), origin with credentials."""
    git_workspace(path)
    (path / "src.txt").write_text("v2\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "second")
    git(path, "remote", "add", "origin", ORIGIN)
    return path


def refs_and_objects(state: Path) -> tuple[dict, list[str], dict]:
    """Every ref value, the object and pack files on disk, and each group's reflog length."""
    if not state.exists():
        return {}, [], {}
    store = Store(str(state))
    groups = list(store.refs.groups())
    refs = {g: dict(store.refs.read(g).refs) for g in groups}
    logs = {g: len(store.refs.reflog(g)) for g in groups}
    objs = sorted(str(p.relative_to(state)) for p in (state / "objects").rglob("*") if p.is_file()) \
        if (state / "objects").exists() else []
    return refs, objs, logs


@dataclass(frozen=True)
class Source:
    tmp: Path
    repo: Path
    kx: Kx
    ses: str
    runs: tuple[str, str]  # (completed, unfinished)
    json_bundle: Path
    pack_bundle: Path


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    """Runner A: a session with one completed run and one run killed mid-way, exported in both forms.

    The agent names a provider key variable (set to a fake key), the task
    text holds the key, and a shell step echoes it: the credential test
    looks for it in the bundles.
    """
    tmp = tmp_path_factory.mktemp("runner-a")
    repo = source_repo(tmp / "A")
    agent = write_agent(tmp / "agent", STEPS, api_key_env=KEY_ENV)
    kx = Kx(tmp / "state-a", env={KEY_ENV: FAKE_KEY, "KXEN_TEST_CANARY": CANARY})
    first = kx.run_json(repo, f"first task, the key is {FAKE_KEY}", agent, expect=0).json()
    assert first["status"] == "completed", first
    ses = first["session"]
    # The runner is destroyed in the middle of the second run (SIGKILL after its first turn).
    killed = kx("--resume", ses, "--task", "second task", "--json", env={"KXEN_AGENT_FAULT": "tool:after-turn"})
    assert killed.rc == -9, str(killed)
    second = [r for r in kx.session_show(ses)["runs"] if r["id"] != first["run"]]
    assert len(second) == 1 and second[0]["status"] != "completed", second
    # The seed's command, verbatim, from the directory that will hold the bundle.
    kx("session", "export", ses, "--output", "session.bundle.json", cwd=tmp, expect=0)
    kx("session", "export", ses, "--output", "x.bundle", cwd=tmp, expect=0)
    return Source(tmp, repo, kx, ses, (first["run"], second[0]["id"]), tmp / "session.bundle.json", tmp / "x.bundle")


# ---------------------------------------------------------------- 1. the seed's migration flow


def test_ephemeral_runner_migration_as_in_the_seed(source: Source, tmp_path: Path) -> None:
    ses = source.ses
    doc = json.loads(source.json_bundle.read_text())
    assert doc["format"] == "kxen-bundle" and doc["version"] == 1
    refs = doc["refs"][f"sessions/{ses}"]
    assert {"meta", "head", f"runs/{source.runs[0]}", f"runs/{source.runs[1]}"} <= set(refs), refs
    assert doc["objectCount"] == len(doc["objects"]) > 0
    assert {o["kind"] for o in doc["objects"]} >= {"session", "agent", "message", "run", "journal"}
    assert all(set(o) == {"id", "kind", "bytes"} for o in doc["objects"])

    # `bundle verify` needs no state dir and creates none.
    nowhere = tmp_path / "no-state-dir"
    verifier = Kx(nowhere)
    infos = {}
    for b in (source.json_bundle, source.pack_bundle):
        infos[b.name] = verifier("bundle", "verify", str(b), "--json", expect=0).json()
    assert not nowhere.exists()
    assert infos["session.bundle.json"]["format"] == "json" and infos["x.bundle"]["format"] == "pack"
    assert infos["session.bundle.json"]["refs"] == infos["x.bundle"]["refs"] == {f"sessions/{ses}": refs}
    assert infos["session.bundle.json"]["objects"] == infos["x.bundle"]["objects"] == doc["objectCount"]

    before = source.kx.session_show(ses)
    for form, bundle in (("json", source.json_bundle), ("pack", source.pack_bundle)):
        runner = tmp_path / f"runner-{form}"
        runner.mkdir()
        checkout = clone(source.repo, runner / "repo")
        # A fresh, empty state dir; the runner is set up with the same agent definition (a lock from
        # elsewhere that is not this machine's own would wait for `session trust`: tests/runtime/test_trust.py).
        kx = Kx(runner / "state", env={"KXEN_AGENT_AGENT": str(source.tmp / "agent" / "agent.toml")})
        # Relative bundle name, run from the bundle's directory, as in the seed.
        imp = kx("session", "import", bundle.name, "--workspace", str(checkout), cwd=bundle.parent, expect=0)
        assert f"{ses}: created" in imp.out, str(imp)
        # The seed's resume, verbatim: the run killed on runner A finishes here.
        done = kx("--resume", ses, "--workspace", str(checkout), "--json", expect=0).json()
        assert done["run"] == source.runs[1] and done["status"] == "completed", done
        assert done["result"] == "Second task done."
        # And a new task goes on from there.
        res = kx("--resume", ses, "--workspace", str(checkout), "--task", "after the move", "--json", expect=0).json()
        assert res["status"] == "completed" and res["session"] == ses, res
        after = kx.session_show(ses)
        for key in ("id", "parentId", "branchRootId", "forkPoint", "forkKind", "createdNs", "agentLock", "agent"):
            assert after[key] == before[key], key
        for key in ("identity", "remoteHash", "branch"):
            assert after["workspace"][key] == before["workspace"][key], key
        assert after["workspace"]["root"] == after["workspace"]["repoRoot"] == os.path.realpath(checkout)
        ids = [r["id"] for r in after["runs"]]
        assert ids[:2] == list(source.runs) and ids[-1] == res["run"], ids
        assert all(r["status"] == "completed" for r in after["runs"]), after["runs"]
        assert (checkout / "NOTES.md").exists() is False  # the clone's files are its own; nothing was copied
        kx.fsck_clean()


# ---------------------------------------------------------------- 2. refusals


def test_import_refused_for_a_workspace_that_fails_the_identity_check(source: Source, tmp_path: Path) -> None:
    kx = Kx(tmp_path / "state")
    other = git_workspace(tmp_path / "other")
    git(other, "remote", "add", "origin", "https://example.invalid/org/other.git")
    branch = clone(source.repo, tmp_path / "branch")
    git(branch, "switch", "-q", "-c", "feature")
    behind = clone(source.repo, tmp_path / "behind")
    git(behind, "reset", "-q", "--hard", "HEAD~1")  # HEAD no longer contains the recorded HEAD
    cases = [
        (other, source.json_bundle, "origin remote differs"),
        (branch, source.pack_bundle, "branch 'feature'"),
        (behind, source.json_bundle, "does not descend"),
        (tmp_path / "missing", source.pack_bundle, "does not exist"),
    ]
    for ws, bundle, why in cases:
        err = kx.refused("session", "import", str(bundle), "--workspace", str(ws))
        assert why in err, err
        # The binding is judged before the state dir is touched: none was created.
        assert not kx.state_dir.exists(), sorted(p.name for p in kx.state_dir.iterdir())


@pytest.mark.parametrize("meta, why", [
    (("blob", b"not a session"), "ref sessions/ses_0123456789abcdef0123/meta must name a session object"),
    (("session", {"id": "ses_0123456789abcdef0123"}), "(session): key 'parentId' is missing"),
    (("session", ["a", "list"]), "(session): session metadata must be a map, not array"),
])
def test_import_refuses_a_bundle_whose_metadata_ref_is_not_a_session(tmp_path: Path, meta: tuple, why: str) -> None:
    """A bundle sound byte for byte whose ``meta`` ref names no usable session: one line, no state dir."""
    from kxen_agent.store import RefUpdate
    from kxen_agent.store.bundle import export_bundle

    src = Store(str(tmp_path / "src"))
    oid = src.put(*meta)
    src.refs.transaction("sessions/ses_0123456789abcdef0123", [RefUpdate("meta", None, oid)], reason="test")
    bundle = tmp_path / "odd.bundle"
    export_bundle(src, ["sessions/ses_0123456789abcdef0123"], str(bundle))
    kx = Kx(tmp_path / "state")
    err = kx.refused("session", "import", str(bundle), "--workspace", str(git_workspace(tmp_path / "ws")))
    assert f"bad bundle {bundle}" in err and why in err, err
    assert not kx.state_dir.exists()


# ---------------------------------------------------------------- 3 and 6. re-import, fast-forward, lease, divergence


HOLDER = textwrap.dedent("""\
    import sys
    from kxen_agent.store import Store
    from kxen_agent.runtime.lease import Lease
    lease = Lease.acquire(Store(sys.argv[1]), sys.argv[2], run="run_heldbytest", purpose="run")
    print("held", flush=True)
    sys.stdin.read()
    lease.release()
""")


def test_reimport_is_a_noop_then_fast_forwards_waits_for_the_lease_and_refuses_divergence(tmp_path: Path) -> None:
    repo = source_repo(tmp_path / "A")
    agent = write_agent(tmp_path / "agent", STEPS)
    src, dst = Kx(tmp_path / "state-a"), Kx(tmp_path / "state-b", env={"KXEN_AGENT_AGENT": str(agent)})
    ses = src.run_json(repo, "first", agent, expect=0).json()["session"]
    b1 = tmp_path / "b1.bundle"
    src("session", "export", ses, "--output", str(b1), expect=0)
    checkout = clone(repo, tmp_path / "B")

    first = dst("session", "import", str(b1), "--workspace", str(checkout), "--json", expect=0).json()
    assert first["sessions"] == {ses: "created"} and first["newObjects"] > 0, first
    state = refs_and_objects(dst.state_dir)
    again = dst("session", "import", str(b1), "--workspace", str(checkout), expect=0)
    assert f"{ses}: unchanged" in again.out and "0 new objects" in again.out, str(again)
    assert refs_and_objects(dst.state_dir) == state

    # Work is committed on the new runner (its HEAD moves past the recorded one)
    # and more runs happen on the source: the new export fast-forwards the target...
    (checkout / "work.txt").write_text("done on B\n")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "work on runner B")
    run2 = src.resume(ses, "--task", "second", expect=0).json()["run"]
    b2 = tmp_path / "b2.bundle.json"
    src("session", "export", ses, "--output", str(b2), expect=0)
    # ...but not while a run here holds the session's lease (exit 75, nothing changed).
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(dst.state_dir), ses], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dst.env)
    try:
        assert holder.stdout.readline().startswith("held"), holder.stderr.read()
        state = refs_and_objects(dst.state_dir)
        err = dst.refused("session", "import", str(b2), "--workspace", str(checkout), code=75)
        assert "run_heldbytest" in err, err
        assert refs_and_objects(dst.state_dir) == state
    finally:
        _, errs = holder.communicate("", timeout=30)
    assert holder.returncode == 0, errs
    upd = dst("session", "import", str(b2), "--workspace", str(checkout), "--json", expect=0).json()
    assert upd["sessions"] == {ses: "updated"}, upd
    show = dst.session_show(ses)
    assert [r["id"] for r in show["runs"]][-1] == run2 and show["workspace"]["root"] == os.path.realpath(checkout)

    # Both runners go on: the histories diverge and the import is refused.
    src.resume(ses, "--task", "on A", expect=0)
    dst.resume(ses, "--workspace", str(checkout), "--task", "on B", expect=0)
    b3 = tmp_path / "b3.bundle"
    src("session", "export", ses, "--output", str(b3), expect=0)
    state, show = refs_and_objects(dst.state_dir), dst.session_show(ses)
    err = dst.refused("session", "import", str(b3), "--workspace", str(checkout))
    assert "diverged" in err and ses in err and "nothing was imported" in err, err
    assert refs_and_objects(dst.state_dir) == state and dst.session_show(ses) == show
    dst.fsck_clean()


# ---------------------------------------------------------------- 4. forks share history


def test_forks_share_their_history_in_one_bundle(source: Source, tmp_path: Path) -> None:
    kx = source.kx
    ses = source.ses
    forks = [kx("session", "fork", ses, "--json", expect=0).json()["id"] for _ in range(2)]
    family = [ses, *forks]
    together = kx("session", "export", *family, "--output", str(tmp_path / "family.bundle"), "--json",
                  expect=0).json()
    alone = [kx("session", "export", s, "--output", str(tmp_path / f"{s}.bundle"), "--json", expect=0).json()["objects"]
             for s in family]
    assert sorted(together["refs"]) == sorted(f"sessions/{s}" for s in family)
    assert together["objects"] < sum(alone), (together["objects"], alone)
    assert together["objects"] == len({o.id for o in iter_bundle_objects(str(tmp_path / "family.bundle"))})

    checkout = clone(source.repo, tmp_path / "B")
    dst = Kx(tmp_path / "state")
    res = dst("session", "import", str(tmp_path / "family.bundle"), "--workspace", str(checkout), "--json",
              expect=0).json()
    assert res["sessions"] == {s: "created" for s in family}, res
    listed = {s["id"]: s for s in dst.sessions()}
    assert set(listed) == set(family)
    for f in forks:
        assert listed[f]["parentId"] == ses and listed[f]["forkKind"] == "conversation"
        assert listed[f]["branchRootId"] == ses
    assert all(s["workspace"]["root"] == os.path.realpath(checkout) for s in listed.values())
    tree = dst("session", "tree", ses, "--json", expect=0).json()
    text = json.dumps(tree)
    assert all(s in text for s in family), tree
    dst.fsck_clean()


# ---------------------------------------------------------------- 5. no credentials


def test_bundles_hold_no_credentials(source: Source) -> None:
    secrets = [FAKE_KEY, URL_TOKEN, f"user:{URL_TOKEN}", CANARY, os.environ.get("PATH", "") or CANARY]
    # The key really was in play: the task held it (stored redacted) and a shell step asked for it.
    log = source.kx.log(source.ses)
    assert log[0]["role"] == "user" and log[0]["content"] == "first task, the key is [REDACTED]", log[0]
    assert any(f"echo key=${KEY_ENV}" in json.dumps(m) for m in log if m["role"] == "assistant")
    for bundle in (source.json_bundle, source.pack_bundle):
        raw = bundle.read_bytes()
        objects = list(iter_bundle_objects(str(bundle)))
        assert objects
        for secret in secrets:
            s = secret.encode()
            assert s not in raw, (bundle, secret)
            for obj in objects:
                assert s not in obj.raw, (bundle, secret, obj.hex, obj.kind)
        # No environment dump: not even the variable names.
        for name in (KEY_ENV.encode() + b"=", b"KXEN_TEST_CANARY", b"HOME="):
            assert all(name not in obj.raw for obj in objects), name


# ---------------------------------------------------------------- a family with a worktree fork


def test_a_family_with_a_worktree_fork_imports_with_a_binding_per_session(tmp_path: Path) -> None:
    """The root binds to the clone (``--workspace DIR``), the worktree fork to a worktree of its branch
    there (``--workspace SES=DIR``); without the second binding the import names the fix and writes nothing."""
    repo = source_repo(tmp_path / "A")
    agent = write_agent(tmp_path / "agent", STEPS)
    src, dst = Kx(tmp_path / "state-a"), Kx(tmp_path / "state-b", env={"KXEN_AGENT_AGENT": str(agent)})
    ses = src.run_json(repo, "first", agent, expect=0).json()["session"]
    fork = src("session", "fork", ses, "--worktree", "alt", "--json", expect=0).json()["id"]
    bundle = tmp_path / "family.bundle"
    src("session", "export", ses, fork, "--output", str(bundle), expect=0)

    checkout = clone(repo, tmp_path / "B")
    err = dst.refused("session", "import", str(bundle), "--workspace", str(checkout))
    assert f"session {fork}:" in err and f"--workspace {fork}=DIR" in err and "kxen/alt" in err, err
    assert not dst.state_dir.exists()
    for bad, why in ((f"{fork}", "SES=DIR"), (f"ses_0123456789abcdef0123={checkout}", "holds no session"),
                     (f"{fork}=", "names no directory")):
        err = dst.refused("session", "import", str(bundle), "--workspace", str(checkout), "--workspace", bad)
        assert why in err, err
        assert not dst.state_dir.exists()

    # The fork's branch came with the clone (origin/kxen/alt): a worktree of it is the fork's new home.
    alt = tmp_path / "B-alt"
    git(checkout, "worktree", "add", "-q", str(alt), "kxen/alt")
    # SES=DIR takes a unique prefix of one of the bundle's sessions, as every SES does.
    other = "ses_" + next(c * 4 for c in "0123456789abcdef" if not fork[4:].startswith(c) and not ses[4:].startswith(c))
    err = dst.refused("session", "import", str(bundle), "--workspace", str(checkout), "--workspace", f"{other}={alt}")
    assert "holds no session" in err and fork in err, err
    assert not dst.state_dir.exists()
    res = dst("session", "import", str(bundle), "--workspace", str(checkout), "--workspace", f"{fork[:10]}={alt}",
              "--json", expect=0).json()
    assert res["sessions"] == {ses: "created", fork: "created"}, res
    assert res["workspaces"] == {ses: os.path.realpath(checkout), fork: os.path.realpath(alt)}, res
    assert dst.session_show(fork)["workspace"]["branch"] == "kxen/alt"
    done = dst("--resume", fork, "--workspace", str(alt), "--task", "in the fork's worktree", "--json",
               expect=0).json()
    assert done["status"] == "completed" and done["session"] == fork, done
    dst.fsck_clean()
