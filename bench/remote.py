"""Workload 7 of ``bench.run``: sessions through a Git remote, against Git moving the same history.

::

    .venv/bin/python -m bench.run --only remote [--quick]

One session of N messages (``_content.Conversation``, the export workload's
content; N = 10,000 by default) in a state dir whose workspace's ``origin``
is a bare repository by path; the peer is the same N messages as Git
commits (one commit + tree + blob per message, ``git fast-import``, as the
export workload builds them). Each repeat uses fresh remotes and measures:

- **push**: ``push_sessions`` of the whole session (kxen reads its objects,
  builds their Git image, writes it as one pack with its index,
  ``git push --atomic``) vs ``git push`` of the branch;
- **pull**: ``pull_sessions`` into a fresh state dir and clone (fetch, then
  every object rehashed, decoded strictly and schema-checked, then written)
  vs ``git fetch`` into a fresh bare repository with
  ``fetch.fsckObjects`` (Git's own verification of what it receives);
- **incremental push size**: 10 new messages onto the N, pushed; the bytes
  the remote received (the pack it kept: ``receive.unpackLimit=1``) as a
  share of the full push's. Target: under 5 %. Git's push of the same 10
  commits is the context.

Bytes are the packs the remote keeps (what crossed the wire: a push over
any transport sends exactly that pack); times are wall clock with CPU
seconds beside them, the median of the repeats.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Callable

from . import _peers as peers
from ._content import Conversation, safe_fork_point

__all__ = ["w_remote"]


def _bare(path: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    peers.git("init", "-q", "--bare", path)
    peers.git("config", "receive.unpackLimit", "1", cwd=path)  # keep each push's pack as received
    return path


def _packs(repo: str) -> dict[str, int]:
    d = os.path.join(repo, "objects", "pack")
    return {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".pack")}


def _new_bytes(repo: str, before: dict[str, int]) -> int:
    return sum(v for k, v in _packs(repo).items() if k not in before)


def _workspace(path: str, origin: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    peers.git("init", "-q", "-b", "main", cwd=path)
    peers.git("-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-q", "--allow-empty", "-m",
              "code", cwd=path)
    peers.git("remote", "add", "origin", origin, cwd=path)
    peers.git("push", "-q", "origin", "main", cwd=path)
    return path


def _clone(origin: str, path: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    peers.git("clone", "-q", "-b", "main", origin, path)
    return path


def w_remote(plan: Any, res: Any, work: str, *, timed: Callable[..., tuple[float, float, Any]],
             median: Callable[[list[float]], float], rate: Callable[..., str], mib: Callable[[float], str],
             log: Callable[[str], None]) -> dict:
    """Measure push, pull and the incremental push; add the rows to ``res`` (workload ``7 remote``)."""
    from kxen_agent.session.remote import push_sessions
    from kxen_agent.session.remote_pull import pull_sessions
    from kxen_agent.store import RefUpdate

    from ._kxen import Builder, measuring_store

    n_want = 200 if plan.quick else 10_000 * plan.scale
    d = os.path.join(work, "remote")
    os.makedirs(d, exist_ok=True)
    conv = Conversation(7, plan.text_chars)
    msgs = list(conv.messages(n_want + 40))
    n = safe_fork_point(msgs, n_want)
    base, extra = msgs[:n], msgs[n:n + 10]
    # Git: the same messages as commits, and the 10 more on top.
    fam = peers.GitFamily()
    fam.add("main", base)
    src = os.path.join(d, "git-src")
    peers.git_fast_import(src, fam)
    fam2 = peers.GitFamily()
    fam2.add("main", base + extra)
    src2 = os.path.join(d, "git-src-more")
    peers.git_fast_import(src2, fam2)
    rounds: list[dict[str, float]] = []
    for r in range(plan.repeats):
        log(f"remote round {r + 1}/{plan.repeats}: {n:,} messages")
        kremote = _bare(os.path.join(d, f"kxen-remote-{r}.git"))
        ws = _workspace(os.path.join(d, f"ws-{r}"), kremote)
        state = os.path.join(d, f"state-{r}")
        shutil.rmtree(state, ignore_errors=True)
        b = Builder(state, ws)
        head = b.chain(base, [len(base)])[len(base)]
        ses = b.session(head)
        out: dict[str, float] = {}
        before = _packs(kremote)
        out["kxen_push"], out["kxen_push_cpu"], _ = timed(push_sessions, measuring_store(state), [ses])
        out["kxen_push_bytes"] = _new_bytes(kremote, before)
        # The incremental push: 10 messages more.
        more = b.chain(extra, [len(extra)], parent=head)[len(extra)]
        b.store.refs.transaction(f"sessions/{ses}", [RefUpdate("head", head, more)], reason="bench: 10 more")
        before = _packs(kremote)
        out["kxen_inc"], out["kxen_inc_cpu"], _ = timed(push_sessions, measuring_store(state), [ses])
        out["kxen_inc_bytes"] = _new_bytes(kremote, before)
        # Pull the whole session into a fresh machine.
        clone = _clone(kremote, os.path.join(d, f"clone-{r}"))
        dest = os.path.join(d, f"pulled-{r}")
        shutil.rmtree(dest, ignore_errors=True)
        out["kxen_pull"], out["kxen_pull_cpu"], _ = timed(pull_sessions, measuring_store(dest), [ses], clone)
        # Git: push the branch, 10 more, fetch it with fsck.
        gremote = _bare(os.path.join(d, f"git-remote-{r}.git"))
        before = _packs(gremote)
        out["git_push"], out["git_push_cpu"], _ = timed(peers.git, "push", "-q", gremote, "main", cwd=src)
        out["git_push_bytes"] = _new_bytes(gremote, before)
        before = _packs(gremote)
        out["git_inc"], out["git_inc_cpu"], _ = timed(peers.git, "push", "-q", gremote, "main", cwd=src2)
        out["git_inc_bytes"] = _new_bytes(gremote, before)
        gdest = os.path.join(d, f"git-fetched-{r}.git")
        shutil.rmtree(gdest, ignore_errors=True)
        peers.git("init", "-q", "--bare", gdest)
        out["git_fetch"], out["git_fetch_cpu"], _ = timed(
            peers.git, "-c", "fetch.fsckObjects=true", "fetch", "-q", gremote, "refs/heads/*:refs/heads/*", cwd=gdest)
        # The remote the kxen side wrote is ordinary Git.
        subprocess.run(["git", "-C", kremote, "fsck", "--strict", "--no-dangling"], check=True, capture_output=True)
        rounds.append(out)
    m = {k: median([x[k] for x in rounds]) for k in rounds[0]}
    res.raw["remote"] = dict(m, messages=n)
    for op, peer, what in (("push", "push", f"push of {n:,} msgs: kxen session push vs git push of the same commits"),
                           ("pull", "fetch", "pull of the session (fetch + verify every object) vs git fetch "
                                             "(fetch.fsckObjects)")):
        k, p = m[f"kxen_{op}"], m[f"git_{peer}"]
        res.add("7 remote", what, rate(n, k), rate(n, p), p / k, "(context)", None,
                cpu=m[f"git_{peer}_cpu"] / m[f"kxen_{op}_cpu"])
    share = m["kxen_inc_bytes"] / m["kxen_push_bytes"]
    res.add("7 remote", f"incremental push: 10 msgs onto {n:,}, bytes sent / the full push's",
            f"{m['kxen_inc_bytes']:,.0f} B of {mib(m['kxen_push_bytes'])}",
            f"git: {m['git_inc_bytes']:,.0f} B of {mib(m['git_push_bytes'])}", share, "< 0.05", share < 0.05,
            fmt="{:.4f}")
    res.add("7 remote", "full push: bytes sent, kxen / git (same messages)", mib(m["kxen_push_bytes"]),
            mib(m["git_push_bytes"]), m["kxen_push_bytes"] / m["git_push_bytes"], "(context)", None)
    res.add("7 remote", "incremental push of 10 msgs: time, kxen vs git push of 10 commits",
            f"{m['kxen_inc'] * 1000:.0f} ms", f"{m['git_inc'] * 1000:.0f} ms", m["git_inc"] / m["kxen_inc"],
            "(context)", None)
    return m
