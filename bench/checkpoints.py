"""Workload 9 of ``bench.run``: the cost of a workspace checkpoint per tool call, against ``git stash create``.

::

    .venv/bin/python -m bench.run --only checkpoints [--quick]
    .venv/bin/python -m bench.checkpoints [--quick]       # this workload alone

A tool call that may change files costs one checkpoint (``objects_spec.md``
§14.14: the before of a call is the after of the previous one). On a
repository of ``FILES`` files (10,000; 300 with ``--quick``) in 100
directories, with the session's kept index warm, each repeat changes 1 or
1,000 files (new content each time), then takes a checkpoint
(:meth:`~kxen_agent.session.checkpoints.Checkpointer.take`: ``git config``
for the trust boundary's overrides, ``status``, ``update-index``,
``write-tree``, a commit and a pack written by kxen-agent, ``update-ref``;
every git through the hardened runner, objects and ref fsynced) and runs ``git stash
create`` on the same tree with those files changed again (the repository's
index warm too; each side hashes and writes n files of content it has not
seen, since Git skips writing an object that exists; ``stash create``
fsyncs nothing, moves no ref and leaves untracked files out). Figures: wall and CPU (this process and its git children)
per checkpoint and the ratio to ``stash create``, target at most 1.5.

Then the run's per-call figures with checkpoints on and off: one CLI run of
the script provider making ``CALLS`` ``write_file`` calls in the
10,000-file workspace, per call (wall and CPU of the whole process tree).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

__all__ = ["CALLS", "FILES", "w_checkpoints"]

FILES = 10_000
CALLS = 20
_GIT_ID = ["-c", "user.name=bench", "-c", "user.email=bench@kxen.invalid", "-c", "commit.gpgsign=false"]


def _cpu_children() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c, t = _cpu_children(), time.perf_counter()
    r = fn()
    return time.perf_counter() - t, _cpu_children() - c, r


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", *_GIT_ID, "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def make_repo(path: str, files: int) -> list[str]:
    """A committed repository of ``files`` small files in 100 directories; their paths."""
    os.makedirs(path)
    _git(path, "init", "-q", "-b", "main")
    names = []
    for i in range(files):
        d = os.path.join(path, f"d{i % 100:02d}")
        os.makedirs(d, exist_ok=True)
        name = f"d{i % 100:02d}/f{i:05d}.txt"
        with open(os.path.join(path, name), "w") as f:
            f.write(f"file {i}\n" + "x" * 200 + "\n")
        names.append(name)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "base")
    _git(path, "status", "--porcelain")  # the repository's index warm (stat data fresh)
    return names


def _change(repo: str, names: list[str], n: int, tag: str) -> None:
    for name in names[:n]:
        with open(os.path.join(repo, name), "a") as f:
            f.write(f"{tag}\n")


def w_checkpoints(plan: Any, res: Any, work: str, *, median: Callable, ms: Callable, log: Callable) -> None:
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.workspace import inspect_workspace

    files = 300 if plan.quick else FILES
    repeats = max(plan.repeats, 1) * (1 if plan.quick else 5)
    repo = os.path.join(work, "ckpt-repo")
    shutil.rmtree(repo, ignore_errors=True)
    t0 = time.perf_counter()
    names = make_repo(repo, files)
    log(f"checkpoints: repository of {files:,} files built ({time.perf_counter() - t0:.1f} s)")
    cp = ckpt.Checkpointer(ckpt.open_repo(inspect_workspace(repo), {}), "ses_bench000000000000",
                           os.path.join(work, "ckpt-index"), ckpt.Bounds())
    cp.take("warm")  # the kept index as a run leaves it after its first checkpoint
    changed_cases = [1, min(1000, files // 3)]
    raw: dict[str, Any] = {}
    for n in changed_cases:
        k_wall, k_cpu, s_wall, s_cpu = [], [], [], []
        for r in range(repeats):
            # Each side hashes and writes n files of content it has not seen: Git skips writing an object
            # that exists, so measuring both on the same content would give the second a free ride.
            _change(repo, names, n, f"k{n}-{r}")
            w, c, _ = _timed(lambda: cp.take(f"bench {n} {r}"))
            k_wall.append(w)
            k_cpu.append(c)
            _change(repo, names, n, f"s{n}-{r}")
            w, c, out = _timed(lambda: subprocess.run(["git", *_GIT_ID, "-C", repo, "stash", "create"],
                                                      check=True, capture_output=True))
            assert out.stdout.strip(), "git stash create saw no change"
            s_wall.append(w)
            s_cpu.append(c)
        kw, kc, sw, sc = median(k_wall), median(k_cpu), median(s_wall), median(s_cpu)
        raw[n] = {"checkpoint_wall": k_wall, "checkpoint_cpu": k_cpu, "stash_wall": s_wall, "stash_cpu": s_cpu}
        res.add("9 checkpoints", f"checkpoint per tool call, {n:,} of {files:,} files changed: kxen vs git stash create",
                f"{ms(kw)} (CPU {ms(kc)})", f"{ms(sw)} (CPU {ms(sc)})", kw / sw, "<= 1.5", kw / sw <= 1.5,
                cpu=kc / sc if sc else None)
    _git(repo, "checkout", "-q", "--", ".")
    raw["run"] = _run_per_call(res, work, repo, plan.quick, ms=ms, log=log)
    res.raw["checkpoints"] = raw


def _run_per_call(res: Any, work: str, repo: str, quick: bool, *, ms: Callable, log: Callable) -> dict:
    """One CLI run of CALLS write_file calls with checkpoints on, one with them off: per-call wall and CPU."""
    kxen = os.path.join(os.path.dirname(sys.executable), "kxen-agent")
    calls = 4 if quick else CALLS
    steps = [{"tool_calls": [{"name": "write_file", "arguments": {"path": f"out/w{i}.txt", "content": f"{i}\n"}}]}
             for i in range(calls)] + [{"content": "done"}]
    out: dict[str, Any] = {}
    for mode in ("on", "off"):
        d = tempfile.mkdtemp(prefix=f"agent-{mode}-", dir=work)
        with open(os.path.join(d, "steps.json"), "w") as f:
            json.dump(steps, f)
        with open(os.path.join(d, "agent.toml"), "w") as f:
            f.write('name = "bench"\nprovider = "script"\nscript = "steps.json"\ntools = ["write_file"]\n'
                    f"[policy]\nmax_turns = {calls + 5}\n" + ("checkpoints = false\n" if mode == "off" else ""))
        env = dict(os.environ, KXEN_AGENT_STATE_DIR=os.path.join(work, f"state-{mode}"))
        env.pop("KXEN_AGENT_FAULT", None)
        w, c, p = _timed(lambda: subprocess.run(
            [kxen, "run", "--workspace", repo, "--task", "bench", "--agent", os.path.join(d, "agent.toml")],
            env=env, capture_output=True, text=True))
        if p.returncode != 0:
            raise RuntimeError(f"bench run ({mode}) failed: {p.stderr}")
        out[mode] = (w / calls, c / calls)
        shutil.rmtree(os.path.join(repo, "out"), ignore_errors=True)
    (on_w, on_c), (off_w, off_c) = out["on"], out["off"]
    res.add("9 checkpoints", f"a run of {calls} write_file calls: time per call, checkpoints on vs off (whole CLI run)",
            f"{ms(on_w)} (CPU {ms(on_c)})", f"{ms(off_w)} (CPU {ms(off_c)})", on_w / off_w, "(context)",
            cpu=on_c / off_c if off_c else None)
    log(f"checkpoints: run per call on {ms(on_w)}, off {ms(off_w)}")
    return out


def main() -> int:
    from .run import Results, log, make_plan, median, ms, table

    quick = "--quick" in sys.argv
    plan = make_plan(quick, 1, None)
    res = Results(plan)
    work = tempfile.mkdtemp(prefix="kxen-bench-ckpt-")
    try:
        w_checkpoints(plan, res, work, median=median, ms=ms, log=log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
