"""``[policy] commit_trailer = true`` (``objects_spec.md`` §14.17): every commit the shell tool makes gets
``Kxen-Session: <ses>@<msg>``, the repository's own hooks still run, its config is never written.

Through the installed CLI, the scripted provider and real Git. One module-wide world (two repositories, a
linked worktree, one run with the policy on and one with it off, then a commit of the user's own) is built
once; each test reads a part of it. The user's environment carries a Git config entry of its own
(``GIT_CONFIG_COUNT=1``), which every git the agent runs, and every hook, must still see.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import blake3
import pytest

from tests.helpers import Cli, git_workspace, write_agent

#: githooks(5) of Git 2.39: the hooks directory forwards every one of them.
GITHOOKS = {
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit", "prepare-commit-msg",
    "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge", "pre-push", "pre-receive", "update",
    "proc-receive", "post-receive", "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc",
    "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
    "p4-post-changelist", "p4-pre-submit", "post-index-change",
}
TRAILER = re.compile(r"^Kxen-Session: (ses_[0-9a-f]+)@(msg_[0-9a-f]{64})$", re.M)
ENV_LINES = re.compile(r"^((?:GIT_CONFIG_(?:COUNT|KEY_\d+|VALUE_\d+)|KXEN_SESSION|KXEN_MESSAGE)=.*)$", re.M)
SHOW_ENV = "env | grep -E '^(GIT_CONFIG_(COUNT|KEY|VALUE)|KXEN_(SESSION|MESSAGE))' | sort; "

# The repositories' own hooks: each logs its name, the Git config count it sees and the user's entry
# (so a leak of the override, or a lost user entry, shows), and pre-commit refuses while REJECT exists.
HOOK = """#!/bin/sh
printf '%s %s %s %s\\n' "$(basename "$(dirname "$0")")/$(basename "$0")" "${GIT_CONFIG_COUNT-unset}" \
  "$(git config kxen.test)" "$(basename "$(pwd)")" >> "$HOOK_LOG"
"""
REJECTING = HOOK + "[ ! -e REJECT ] || { echo 'pre-commit: REJECT is there' >&2; exit 1; }\n"


def shell(command: str) -> dict:
    return {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}


def git_out(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


@dataclass
class World:
    tmp: Path
    cli: Cli
    repo: Path
    repo2: Path
    worktree: Path
    config_before: dict[Path, bytes]
    on: dict
    off: dict
    outputs_on: list[str]
    outputs_off: list[str]
    commits: dict[str, str]  # subject -> commit id, from the runs (and the user's own "mine")


def install(hooks: Path, **scripts: str) -> None:
    hooks.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        (hooks / name).write_text(text)
        (hooks / name).chmod(0o755)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("trailer")
    (tmp / "gitconfig").write_text("")
    env = {"GIT_CONFIG_GLOBAL": str(tmp / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@kxen.invalid",
           "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@kxen.invalid",
           # The user's own entry: appended to, never replaced.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "kxen.test", "GIT_CONFIG_VALUE_0": "kept",
           "HOOK_LOG": str(tmp / "hooks.log")}
    cli = Cli(tmp / "state", env)
    repo = git_workspace(tmp / "repo")
    install(repo / ".git" / "hooks", **{"pre-commit": REJECTING, "post-commit": HOOK})
    # A repository with a relative core.hooksPath: its hooks, not .git/hooks, run.
    repo2 = git_workspace(tmp / "repo2")
    git_out(repo2, "config", "core.hooksPath", ".githooks")
    install(repo2 / ".githooks", **{"pre-commit": HOOK, "commit-msg": HOOK})
    install(repo2 / ".git" / "hooks", **{"pre-commit": "#!/bin/sh\necho 'not this one' >&2\nexit 1\n"})
    worktree = tmp / "wt"
    git_out(repo, "worktree", "add", "-q", "-b", "wt", str(worktree))
    config_before = {r: (r / ".git" / "config").read_bytes() for r in (repo, repo2)}

    agent_on = write_agent(tmp / "on", [
        shell(SHOW_ENV + "echo one > a.txt && git add a.txt && git commit -q -m one"),
        # --no-verify skips pre-commit and commit-msg, not prepare-commit-msg; an amend in the same turn adds nothing.
        shell("echo two > b.txt && git add b.txt && git commit -q --no-verify -m two && git rev-parse HEAD && "
              "echo more >> b.txt && git commit -q -a --amend --no-edit --no-verify && git rev-parse HEAD"),
        shell("touch REJECT && echo three > c.txt && git add c.txt && git commit -q -m three; "
              "echo \"commit exit $?\"; rm REJECT; git reset -q"),
        shell("cd ../repo2 && git commit -q --allow-empty -m in-hooks-path && "
              "cd ../wt && git commit -q --allow-empty -m in-worktree && "
              "git merge -q --no-ff --no-edit main -m merged"),
        # An amend from a later message: the commit names both turns that made it.
        shell("git commit -q --amend --no-edit"),
        {"content": "done"},
    ], tools=["shell"], policy={"commit_trailer": True})
    on = cli.run_json(repo, "commit things", agent_on, expect=0).json()
    agent_off = write_agent(tmp / "off", [
        shell(SHOW_ENV + "git commit -q --allow-empty -m off"),
        {"content": "done"},
    ], tools=["shell"])
    off = cli.run_json(repo, "commit without", agent_off, expect=0).json()
    # The user's own commit afterwards, in the same repository and environment.
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "mine"], check=True,
                   env=cli.env)

    def outputs(res: dict) -> list[str]:
        return [j["outcome"]["output"] for j in cli.run_show(res["session"], res["run"])["journal"]
                if j["state"] == "Settled"]

    commits = {}
    for r in (repo, repo2, worktree):
        for line in git_out(r, "log", "--format=%H %s", "--all", "--reflog").splitlines():
            oid, subject = line.split(" ", 1)
            commits.setdefault(subject, oid)
    commits["two-amended"] = git_out(repo, "rev-parse", "main~2").strip()  # main: ... two, off, mine
    return World(tmp, cli, repo, repo2, worktree, config_before, on, off, outputs(on), outputs(off), commits)


def trailers(repo: Path, commit: str) -> list[tuple[str, str]]:
    return TRAILER.findall(git_out(repo, "log", "-1", "--format=%B", commit))


def which(w: World, commit: str, code: int = 0) -> list[dict]:
    p = w.cli("session", "which", commit, "-w", str(w.repo), "--json", expect=code)
    return p.json()["madeBy"]


def test_each_commit_of_the_shell_names_its_session_and_message_as_session_which_does(world: World) -> None:
    w = world
    ses = w.on["session"]
    one = trailers(w.repo, w.commits["one"])
    made = which(w, w.commits["one"])
    assert len(one) == 1 and len(made) == 1
    assert one[0] == (ses, made[0]["message"]) and ses in made[0]["sessions"]
    # Each turn is its own assistant message; the amend of turn 2 in the same call added nothing.
    first, second = re.findall(r"^[0-9a-f]{40}$", w.outputs_on[1], re.M)
    (two,) = trailers(w.repo, first)
    assert trailers(w.repo, second) == [two] and first != second
    assert two[0] == ses and two[1] != one[0][1]
    # Amended (--no-edit) by a later turn: that turn's line is added below the first (addIfDifferent).
    assert git_out(w.repo, "log", "-1", "--format=%s", w.commits["two-amended"]) == "two\n"
    assert w.commits["two-amended"] != second
    amended = trailers(w.repo, w.commits["two-amended"])
    made = which(w, w.commits["two-amended"])
    assert amended[0] == two and amended[1] == (ses, made[0]["message"]) and len(amended) == 2
    # Another repository (core.hooksPath) and a linked worktree, in the turn's own message; a merge commit too.
    msg4 = {trailers(r, w.commits[s])[0] for r, s in
            ((w.repo2, "in-hooks-path"), (w.worktree, "in-worktree"), (w.worktree, "merged"))}
    assert len(msg4) == 1 and msg4.pop()[1] not in (one[0][1], two[1], amended[1][1])


def test_the_repositorys_own_hooks_run_and_can_refuse(world: World) -> None:
    w = world
    log = (w.tmp / "hooks.log").read_text().splitlines()
    # Each hook saw the user's Git config entry and only it (count 1, kxen.test=kept): never the override.
    assert all(line.split()[1:3] == ["1", "kept"] for line in log), log
    hooks = [line.split()[0] for line in log]
    # one: pre- and post-commit; two: --no-verify (post-commit only, twice); three: refused; the off run;
    # repo2's configured hooks (not its .git/hooks) in its own work tree; the worktree's commit and merge
    # run the main repository's hooks; then the user's own commit.
    assert hooks == ["hooks/pre-commit", "hooks/post-commit", "hooks/post-commit", "hooks/post-commit",
                     "hooks/pre-commit",
                     ".githooks/pre-commit", ".githooks/commit-msg", "hooks/pre-commit", "hooks/post-commit",
                     "hooks/pre-commit", "hooks/post-commit",
                     "hooks/pre-commit", "hooks/post-commit",
                     "hooks/pre-commit", "hooks/post-commit"], log
    # Where each ran: the work tree of the commit (the linked worktree's own, for its commit).
    assert [line.split()[3] for line in log] == ["repo"] * 5 + ["repo2"] * 2 + ["wt"] * 2 + ["repo"] * 6, log
    # The refused commit: its output says so, and no commit "three" exists anywhere.
    assert "pre-commit: REJECT is there" in w.outputs_on[2] and "commit exit 1" in w.outputs_on[2]
    assert "three" not in w.commits


def test_the_child_environment_appends_to_the_users_and_only_with_the_policy(world: World) -> None:
    w = world
    got = ENV_LINES.findall(w.outputs_on[0])
    hooks_dir = next(v.split("=", 1)[1] for v in got if v.startswith("GIT_CONFIG_VALUE_1="))
    assert got == ["GIT_CONFIG_COUNT=2", "GIT_CONFIG_KEY_0=kxen.test", "GIT_CONFIG_KEY_1=core.hooksPath",
                   "GIT_CONFIG_VALUE_0=kept", f"GIT_CONFIG_VALUE_1={hooks_dir}",
                   f"KXEN_MESSAGE={trailers(w.repo, w.commits['one'])[0][1]}", f"KXEN_SESSION={w.on['session']}"]
    assert Path(hooks_dir).parent == w.cli.state_dir / "hooks"
    # Policy off: the user's entry alone, no ids, no trailer.
    assert ENV_LINES.findall(w.outputs_off[0]) == ["GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=kxen.test",
                                                   "GIT_CONFIG_VALUE_0=kept"]
    assert trailers(w.repo, w.commits["off"]) == []


def test_the_users_commit_and_the_repositories_config_are_untouched(world: World) -> None:
    w = world
    assert trailers(w.repo, w.commits["mine"]) == []
    assert which(w, w.commits["mine"], code=1) == []
    for repo, before in w.config_before.items():
        assert (repo / ".git" / "config").read_bytes() == before
    assert "hookspath" not in git_out(w.repo, "config", "--list", "--show-origin").lower()
    # Its hooks directory holds its own hooks, nothing of ours.
    assert {n for n in os.listdir(w.repo / ".git" / "hooks") if not n.endswith(".sample")} == {
        "post-commit", "pre-commit"}


def test_the_hooks_directory_is_named_by_its_content_and_fsck_knows_it(world: World) -> None:
    w = world
    top = w.cli.state_dir / "hooks"
    (name,) = os.listdir(top)
    d = top / name
    assert set(os.listdir(d)) == GITHOOKS
    # §14.17: BLAKE3 over, per file in byte order of names, name NUL size NUL bytes.
    h = blake3.blake3()
    for f in sorted(os.listdir(d)):
        data = (d / f).read_bytes()
        h.update(f.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
        assert stat.S_IMODE((d / f).stat().st_mode) == 0o700
    assert h.hexdigest() == name
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    p = w.cli("fsck", "--json")
    assert p.rc == 0, str(p)
    assert str(top) not in p.out


def test_the_policy_key_makes_a_version_6_lock_only_when_on(tmp_path: Path) -> None:
    from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
    from kxen_agent.session.schema import SchemaViolation, check

    base = 'name = "t"\nprovider = "openai"\nmodel = "m"\n[policy]\n'
    plain = parse_agent_definition(base, str(tmp_path), "agent.toml")
    # false is the default: not recorded, so the lock (and its id) stays what it was.
    assert parse_agent_definition(base + "commit_trailer = false\n", str(tmp_path), "agent.toml") == plain
    on = parse_agent_definition(base + "commit_trailer = true\n", str(tmp_path), "agent.toml")
    assert on["version"] == 6 and on["policy"]["commit_trailer"] is True and plain["version"] < 6
    check("agent", on)
    with pytest.raises(SchemaViolation, match="commit_trailer"):
        check("agent", {**on, "policy": {**on["policy"], "commit_trailer": "yes"}})
    with pytest.raises(AgentDefinitionError, match=r"agent.toml: key 'policy.commit_trailer': expected true or false"):
        parse_agent_definition(base + 'commit_trailer = "yes"\n', str(tmp_path), "agent.toml")


def test_a_changed_hooks_directory_is_refused_before_the_call_starts(world: World, tmp_path: Path) -> None:
    w = world
    (d,) = (w.cli.state_dir / "hooks").iterdir()
    saved = (d / "pre-commit").read_bytes()
    repo = git_workspace(tmp_path / "repo")
    cli = Cli(tmp_path / "state", {k: v for k, v in w.cli.env.items() if k != "KXEN_AGENT_STATE_DIR"})
    agent = write_agent(tmp_path / "agent", [shell("git commit -q --allow-empty -m made"), {"content": "done"}],
                        tools=["shell"], policy={"commit_trailer": True})
    # A fresh state dir gets its own copy, byte for byte the same.
    cli.run_json(repo, "first", agent, expect=0)
    (mine,) = (tmp_path / "state" / "hooks").iterdir()
    assert mine.name == d.name and (mine / "pre-commit").read_bytes() == saved
    head = git_out(repo, "rev-parse", "HEAD")
    (mine / "pre-commit").write_bytes(saved.replace(b"exit 0", b"exit 7"))
    p = cli("run", "--workspace", str(repo), "--task", "second", "--agent", str(agent))
    assert p.rc == 1 and "Traceback" not in p.err, str(p)
    assert "commit-trailer hooks directory does not hold what its name says ('pre-commit' differs)" in p.err
    assert git_out(repo, "rev-parse", "HEAD") == head  # the shell call never ran
    # What the message says to do: remove it, run again; the call runs, its commit has the trailer.
    assert f"{mine}: " in p.err and "remove that directory and run again" in p.err
    for f in mine.iterdir():
        f.unlink()
    mine.rmdir()
    ses = re.search(r"session (ses_[0-9a-f]+) created", p.err).group(1)
    cli.resume(ses, expect=0)
    assert [s for s, _ in trailers(repo, "HEAD")] == [ses]
    assert (mine / "pre-commit").read_bytes() == saved


# -- the forwarder under plain Git (the §14.17 claims the runs above do not reach), no CLI --------------------

SES, MSG = "ses_0123456789abcdef0123", "msg_" + "ab" * 32


@pytest.fixture(scope="module")
def plain_git(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, str]]:
    """A work dir, the user's environment (isolated Git, one config entry) and the shell child's with the trailer."""
    from kxen_agent.runtime.commit_trailer import CommitTrailer, ensure_hooks_dir

    tmp = tmp_path_factory.mktemp("forwarder")
    (tmp / "gitconfig").write_text("")
    user = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "KXEN_"))}
    user.update(GIT_CONFIG_GLOBAL=str(tmp / "gitconfig"), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="a",
                GIT_AUTHOR_EMAIL="a@kxen.invalid", GIT_COMMITTER_NAME="a", GIT_COMMITTER_EMAIL="a@kxen.invalid",
                GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="kxen.test", GIT_CONFIG_VALUE_0="kept", GIT_EDITOR="true")
    child = CommitTrailer(ensure_hooks_dir(str(tmp / "state")), SES, MSG).apply(user)
    return tmp, user, child


def run_git(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)


def body(repo: Path, env: dict[str, str], rev: str = "HEAD") -> str:
    return run_git(repo, env, "log", "-1", "--format=%B", rev).stdout


def test_what_gets_the_trailer_under_plain_git(plain_git: tuple[Path, dict, dict]) -> None:
    tmp, user, child = plain_git
    repo = tmp / "what"
    assert run_git(tmp, user, "init", "-q", "-b", "main", str(repo)).returncode == 0

    def change(name: str) -> None:
        (repo / name).write_text(name + "\n")
        assert run_git(repo, user, "add", name).returncode == 0
        assert run_git(repo, user, "commit", "-q", "-m", name).returncode == 0

    change("base")
    assert run_git(repo, user, "switch", "-q", "-c", "side").returncode == 0
    change("s1")
    change("s2")
    assert run_git(repo, user, "switch", "-q", "main").returncode == 0
    change("m1")
    line = f"Kxen-Session: {SES}@{MSG}"
    # A merge's default message has no newline at its end: the trailer still gets a paragraph of its own.
    assert run_git(repo, user, "switch", "-q", "-c", "merging").returncode == 0
    assert run_git(repo, child, "merge", "-q", "--no-ff", "--no-edit", "side").returncode == 0
    assert body(repo, user).rstrip("\n") == f"Merge branch 'side' into merging\n\n{line}"
    # A message Git finds empty stays empty: the commit is refused as Git refuses it.
    p = run_git(repo, child, "commit", "-q", "--allow-empty", "-m", "")
    assert p.returncode != 0 and "empty commit message" in p.stderr
    # After an editor (commit-msg adds it): what the editor wrote, then the trailer; the -v diff is no message.
    editor = tmp / "editor"
    editor.write_text('#!/bin/sh\nsed -i "1i from the editor" "$1"\n')
    editor.chmod(0o755)
    assert run_git(repo, {**child, "GIT_EDITOR": str(editor)}, "commit", "-q", "--allow-empty", "-v").returncode == 0
    assert body(repo, user).rstrip("\n") == f"from the editor\n\n{line}"
    p = run_git(repo, {**child, "GIT_EDITOR": "true"}, "commit", "-q", "--allow-empty", "-v")
    assert p.returncode != 0 and "empty commit message" in p.stderr
    # cherry-pick, revert, rebase: each commit written gets it; am does not (no prepare-commit-msg).
    assert run_git(repo, user, "switch", "-q", "main").returncode == 0
    assert run_git(repo, child, "cherry-pick", "side~1").returncode == 0 and line in body(repo, user)
    assert run_git(repo, child, "revert", "--no-edit", "HEAD").returncode == 0 and line in body(repo, user)
    patch = run_git(repo, user, "format-patch", "-1", "--stdout", "side").stdout
    assert run_git(repo, user, "switch", "-q", "side").returncode == 0
    assert run_git(repo, child, "rebase", "-q", "--reapply-cherry-picks", "main").returncode == 0
    assert [line in body(repo, user, r) for r in ("HEAD", "HEAD~1")] == [True, True]
    assert run_git(repo, user, "switch", "-q", "main").returncode == 0
    assert subprocess.run(["git", "am", "-q"], cwd=repo, env=child, input=patch, text=True).returncode == 0
    assert body(repo, user).startswith("s2\n")
    assert "Kxen-Session" not in body(repo, user)


def test_entries_after_ours_move_down_and_a_push_to_checkout_does_what_git_does(
        plain_git: tuple[Path, dict, dict]) -> None:
    tmp, user, child = plain_git
    repo = tmp / "entries"
    assert run_git(tmp, user, "init", "-q", "-b", "main", str(repo)).returncode == 0
    install(repo / ".git" / "hooks", **{"pre-commit": '#!/bin/sh\necho "$GIT_CONFIG_COUNT $(git config kxen.test) '
                                                      '$(git config kxen.after) [$(git config core.hooksPath)]" >&2\n'})
    # A command of the agent's that adds an entry after ours: the hook sees the user's two, ours gone.
    later = {**child, "GIT_CONFIG_COUNT": "3", "GIT_CONFIG_KEY_2": "kxen.after", "GIT_CONFIG_VALUE_2": "late"}
    p = run_git(repo, later, "commit", "-q", "--allow-empty", "-m", "x")
    assert p.returncode == 0 and p.stderr == "2 kept late []\n", p.stderr
    assert f"Kxen-Session: {SES}@{MSG}" in body(repo, user)

    # push-to-checkout: a hook of ours is there, so Git leaves updateInstead to it; it does what Git does.
    # (A local push never passes GIT_CONFIG_* to receive-pack; --receive-pack puts them back to reach it.)
    dst = tmp / "dst"
    assert run_git(tmp, user, "init", "-q", "-b", "main", str(dst)).returncode == 0
    assert run_git(dst, user, "config", "receive.denyCurrentBranch", "updateInstead").returncode == 0
    (repo / "f").write_text("pushed\n")
    assert run_git(repo, user, "add", "f").returncode == 0
    assert run_git(repo, user, "commit", "-q", "-m", "f").returncode == 0
    receive = ("env GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath "
               f"GIT_CONFIG_VALUE_0={shlex.quote(child['GIT_CONFIG_VALUE_1'])} git-receive-pack")
    assert run_git(repo, user, "push", "-q", f"--receive-pack={receive}", str(dst), "main").returncode == 0
    assert (dst / "f").read_text() == "pushed\n"
    (dst / "f").write_text("changed there\n")
    (repo / "f").write_text("again\n")
    assert run_git(repo, user, "commit", "-q", "-am", "g").returncode == 0
    p = run_git(repo, user, "push", "-q", f"--receive-pack={receive}", str(dst), "main")
    assert p.returncode != 0 and "Working directory has unstaged changes" in p.stderr
    assert (dst / "f").read_text() == "changed there\n"


def test_a_removed_directory_is_written_again_and_a_lost_race_keeps_the_winners(tmp_path: Path) -> None:
    from kxen_agent.runtime import commit_trailer as ct
    from kxen_agent.store.fsio import FileIO

    root = tmp_path / "state"
    d = Path(ct.ensure_hooks_dir(str(root)))
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    # This process checked it before: a hooksPath without hooks would run none of the repository's.
    assert Path(ct.ensure_hooks_dir(str(root))) == d and set(os.listdir(d)) == GITHOOKS

    class Late(FileIO):
        """Another process renames the same directory into place between our look and our rename."""

        looked = False

        def isdir(self, path: str) -> bool:
            if path == str(d) and not self.looked:
                self.looked = True
                return False
            return super().isdir(path)

    ct._READY.discard(str(d))
    before = {f: (d / f).stat().st_ino for f in os.listdir(d)}
    assert ct.ensure_hooks_dir(str(root), Late()) == str(d)
    assert {f: (d / f).stat().st_ino for f in os.listdir(d)} == before  # the winner's files, untouched
    assert os.listdir(root / "hooks") == [d.name]  # our temp directory removed
