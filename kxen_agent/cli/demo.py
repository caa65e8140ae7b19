"""``kxen-agent demo``: the README's main job, offline, printing each command.

It creates a scratch Git workspace, runs the bundled scripted agent there
(named with ``--agent``: the one way besides this command to run it)
(real shell and file tool calls), shows the session, forks it with a Git
worktree, exports it, imports it on a "fresh runner" (a new state dir and a
fresh clone), resumes it there, and checks both stores with fsck. Every step
is a real ``kxen-agent`` process; nothing here touches the library directly.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile

import typer

from kxen_agent.errors import KxenError
from kxen_agent.session.gitproc import git_argv

from ._render import out
from .run_cmds import DEMO_AGENT


class DemoFailed(KxenError):
    """A step of the demo did not do what it should."""


def _git(cwd: str, *args: str) -> None:
    out(f"$ {shlex.join(['git', '-C', cwd, *args])}")
    subprocess.run(
        git_argv(["-c", "user.name=kxen demo", "-c", "user.email=demo@kxen.invalid", "-c", "init.defaultBranch=main",
                  *args]),
        cwd=cwd, check=True, capture_output=True,
    )


def run_demo(base: str | None) -> None:
    base = os.path.abspath(base) if base else tempfile.mkdtemp(prefix="kxen-demo-")
    os.makedirs(base, exist_ok=True)
    if os.listdir(base):
        raise DemoFailed(f"demo directory {base} is not empty; give an empty or new --dir")
    ws = os.path.join(base, "workspace", "repo")
    state_a = os.path.join(base, "runner-a-state")
    state_b = os.path.join(base, "runner-b-state")
    os.makedirs(ws)
    out(f"# scratch workspace: {ws} (a Git repository, origin https://example.invalid/demo/repo.git)")
    _git(ws, "init", "-q")
    with open(os.path.join(ws, "README.md"), "w") as f:
        f.write("# demo project\n\nA scratch repository for the kxen-agent demo.\n")
    _git(ws, "add", "README.md")
    _git(ws, "commit", "-q", "-m", "initial commit")
    _git(ws, "remote", "add", "origin", "https://example.invalid/demo/repo.git")

    def kx(state: str, *args: str, expect: int = 0, show: bool = True) -> str:
        cmd = ["kxen-agent", *args]
        out(f"\n$ KXEN_AGENT_STATE_DIR={state} {shlex.join(cmd)}")
        env = dict(os.environ, KXEN_AGENT_STATE_DIR=state)
        p = subprocess.run([sys.executable, "-m", "kxen_agent", *args], env=env, capture_output=True, text=True)
        if show:
            # Progress lines (stderr) happened before the result (stdout).
            for line in (p.stderr + p.stdout).rstrip("\n").split("\n"):
                out(f"  {line}")
        if p.returncode != expect:
            raise DemoFailed(f"`{shlex.join(cmd)}` exited {p.returncode}, expected {expect}: {p.stderr.strip()[-300:]}")
        return p.stdout

    # The scripted agent is named explicitly: `run` never picks it on its own.
    res = json.loads(kx(state_a, "run", "--workspace", ws, "--task", "Review the project and leave notes.",
                        "--agent", DEMO_AGENT, "--json"))
    ses = res["session"]
    kx(state_a, "session", "show", ses)
    kx(state_a, "session", "log", ses)
    kx(state_a, "run", "show", ses, res["run"])
    kx(state_a, "session", "fork", ses, "--worktree", "alternative_fix")
    kx(state_a, "session", "tree", ses)
    bundle = os.path.join(base, "session.bundle")
    kx(state_a, "session", "export", ses, "--output", bundle)
    kx(state_a, "bundle", "verify", bundle)
    runner_b = os.path.join(base, "runner-b", "repo")
    out("\n# a fresh runner: a new clone and an empty state dir")
    out(f"$ git clone {ws} {runner_b}")
    os.makedirs(os.path.dirname(runner_b))
    subprocess.run(git_argv(["clone", "-q", ws, runner_b]), check=True, capture_output=True)
    _git(runner_b, "remote", "set-url", "origin", "https://example.invalid/demo/repo.git")
    kx(state_b, "session", "import", bundle, "--workspace", runner_b)
    # The fresh runner resumes with its own agent definition: a lock from elsewhere runs nothing unasked.
    kx(state_b, "--resume", ses, "--workspace", runner_b, "--task", "Continue with the next step.", "--agent", DEMO_AGENT)
    kx(state_b, "session", "show", ses)
    kx(state_a, "fsck")
    kx(state_b, "fsck")
    out(f"\n# done: session {ses} ran, forked, moved to a fresh runner and resumed there. Files in {base}")


def demo_cmd(
    dir: str = typer.Option(None, "--dir", metavar="DIR", help="An empty directory for the demo (default: a new temp dir)."),
) -> None:
    """Run the guided offline demo: a session run, forked, exported, imported and resumed.

    Every step is a real kxen-agent command, printed before it runs.

    \b
    Example:
      kxen-agent demo --dir /tmp/kxen-demo
    """
    run_demo(dir)


def register(app: typer.Typer) -> None:
    """Nothing to do: main.py loads ``demo`` by name (``main.COMMANDS``); kept for older callers."""
