"""What ``[policy] commit_trailer`` adds to a commit: CPU per ``git commit`` through its hooks directory vs plain Git.

::

    .venv/bin/python -m bench.commit_trailer [--commits 100] [--json FILE]

One Git repository in a temp dir; commits (``git commit -q --allow-empty -m``)
alternate between plain Git and Git with the environment the ``shell`` tool's
child gets (``objects_spec.md`` §14.17: ``core.hooksPath`` through
``GIT_CONFIG_COUNT``, ``KXEN_SESSION``/``KXEN_MESSAGE``), so both see the same
load. Twice: with no hook of the repository's own, then with a ``pre-commit``
hook (``exit 0``), to show the forwarding does not cost per hook the
repository has. The figure is CPU (user + system of the git process and every
hook it ran), mean per commit; every commit made through the hooks is checked
to carry the trailer. Also timed: writing the hooks directory once (a fresh
state dir), and finding and checking it (a new process's first call).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kxen_agent.runtime import commit_trailer as ct


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _git(repo: Path, env: dict[str, str], *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def measure(commits: int, work: Path) -> dict:
    state = work / "state"
    state.mkdir()
    t0 = time.perf_counter()
    hooks = ct.ensure_hooks_dir(str(state))
    write_ms = (time.perf_counter() - t0) * 1000
    ct._READY.clear()  # as a new process finds it: read and checked
    t0 = time.perf_counter()
    ct.ensure_hooks_dir(str(state))
    check_ms = (time.perf_counter() - t0) * 1000

    (work / "gitconfig").write_text("")
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "KXEN_"))}
    plain.update(GIT_CONFIG_GLOBAL=str(work / "gitconfig"), GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="b",
                 GIT_AUTHOR_EMAIL="b@kxen.invalid", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@kxen.invalid")
    agent = ct.CommitTrailer(hooks, "ses_0123456789abcdef0123", "msg_" + "ab" * 32).apply(plain)
    repo = work / "repo"
    repo.mkdir()
    _git(repo, plain, "init", "-q")
    out: dict = {"commits": commits, "hooksDirWriteMs": round(write_ms, 1), "hooksDirCheckMs": round(check_ms, 1)}
    for case in ("no repository hook", "a repository pre-commit hook"):
        if case.startswith("a "):
            hook = repo / ".git" / "hooks" / "pre-commit"
            hook.write_text("#!/bin/sh\nexit 0\n")
            hook.chmod(0o755)
        cpu = {"plain": 0.0, "trailer": 0.0}
        for i in range(commits):
            for side, env in (("plain", plain), ("trailer", agent)):
                c = _cpu()
                _git(repo, env, "commit", "-q", "--allow-empty", "-m", f"{side} {i}")
                cpu[side] += _cpu() - c
            body = _git(repo, plain, "log", "-1", "--format=%B")
            if f"{ct.TRAILER_KEY}: ses_0123456789abcdef0123@msg_" not in body:
                raise SystemExit(f"commit {i} through the hooks has no trailer:\n{body}")
        out[case] = {side: round(v / commits * 1000, 2) for side, v in cpu.items()}
        out[case]["addedMs"] = round((cpu["trailer"] - cpu["plain"]) / commits * 1000, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.commit_trailer", description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kxen-bench-trailer-") as d:
        m = measure(args.commits, Path(d))
    print(f"git {_git(Path('.'), dict(os.environ), '--version').split()[-1]}, {m['commits']} commits each side")
    print("| repository | plain git commit, CPU | with the trailer hooks, CPU | added |")
    print("|---|---|---|---|")
    for case in ("no repository hook", "a repository pre-commit hook"):
        r = m[case]
        print(f"| {case} | {r['plain']:.1f} ms | {r['trailer']:.1f} ms | {r['addedMs']:.1f} ms |")
    print(f"hooks directory: written in {m['hooksDirWriteMs']:.1f} ms (once per state dir), "
          f"found and checked in {m['hooksDirCheckMs']:.1f} ms (once per process)")
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
