"""The peers kxen is compared with, fed the same conversation.

- **JSONL**: one file per session, one JSON line per message, in the layout
  popular agent CLIs use (a message wrapped with ``uuid``, ``parentUuid``,
  ``sessionId``, ``timestamp``, ``cwd``); a fork copies the file's prefix;
  an export is the file, or the file compressed with zstd (level 3).
- **Git** (C): the same messages as Git objects, one commit per message
  whose tree holds one blob (the message as JSON), written by
  ``git fast-import``; a fork is a branch from the fork point's commit.
- **dulwich** (pure-Python Git): the same Git objects, written into and
  read back from a pack.

Nothing here times anything; :mod:`bench.run` does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from typing import Iterable, Sequence

import zstandard

__all__ = [
    "GitFamily",
    "dulwich_export",
    "dulwich_import",
    "git",
    "git_fast_import",
    "jsonl_copy_prefix",
    "jsonl_line",
    "jsonl_load_for_resume",
    "jsonl_zstd_export",
    "jsonl_zstd_import",
    "message_json",
    "write_jsonl",
]

ZSTD_LEVEL = 3
_T0 = 1_760_000_000  # a fixed clock: identical runs write identical bytes


def message_json(m: dict, seq: int) -> bytes:
    """A message as the one blob of its Git commit (compact JSON)."""
    d = {"seq": seq, "role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        d["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id") is not None:
        d["tool_call_id"] = m["tool_call_id"]
    if m.get("run") is not None:
        d["run"] = m["run"]
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ================================================================== JSONL


def _uuid(ses: str, seq: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{ses}/{seq}"))


def jsonl_line(m: dict, seq: int, ses: str) -> bytes:
    msg: dict = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        msg["tool_calls"] = m["tool_calls"]
    if m.get("tool_call_id") is not None:
        msg["tool_call_id"] = m["tool_call_id"]
    rec = {
        "type": m["role"],
        "uuid": _uuid(ses, seq),
        "parentUuid": _uuid(ses, seq - 1) if seq else None,
        "sessionId": ses,
        "timestamp": f"2025-10-09T08:{(seq // 60) % 60:02d}:{seq % 60:02d}.{seq % 1000:03d}Z",
        "cwd": "/work/project",
        "message": msg,
    }
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def write_jsonl(path: str, messages: Iterable[dict], ses: str, start: int = 0, prefix_from: str | None = None,
                prefix_bytes: int = 0) -> list[int]:
    """Write a session file; return the end offset of every line (a fork's prefix length)."""
    ends: list[int] = []
    with open(path, "wb") as f:
        if prefix_from is not None:
            with open(prefix_from, "rb") as src:
                _copy(src, f, prefix_bytes)
        off = prefix_bytes
        for i, m in enumerate(messages):
            line = jsonl_line(m, start + i, ses)
            f.write(line)
            off += len(line)
            ends.append(off)
    return ends


def _copy(src, dst, n: int) -> None:
    left = n
    while left:
        b = src.read(min(left, 1 << 20))
        if not b:
            raise EOFError("prefix longer than the file")
        dst.write(b)
        left -= len(b)


def jsonl_copy_prefix(src: str, dst: str, nbytes: int, *, durable: bool) -> None:
    """Fork a JSONL session: copy its first ``nbytes`` (the fork point's line end).

    ``durable``: fsync the new file and its directory (as kxen makes a fork durable).
    """
    with open(src, "rb") as s, open(dst, "wb") as d:
        _copy(s, d, nbytes)
        if durable:
            d.flush()
            os.fsync(d.fileno())
    if durable:
        fd = os.open(os.path.dirname(dst), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def jsonl_load_for_resume(path: str, system: str) -> list[dict]:
    """Parse a session file into the provider's message list (what a resume sends).

    The whole file is parsed (a JSONL session has no other way to its
    newest messages); the list is then bounded as kxen-agent bounds what a
    run holds (:func:`bound_view`), so both sides send the model the same
    messages and the comparison checks it.
    """
    out: list[dict] = []
    with open(path, "rb") as f:
        for line in f:
            msg = json.loads(line)["message"]
            d = {"role": msg["role"], "content": msg.get("content")}
            if msg.get("tool_calls"):
                d["tool_calls"] = [dict(c) for c in msg["tool_calls"]]
            if msg.get("tool_call_id") is not None:
                d["tool_call_id"] = msg["tool_call_id"]
            out.append(d)
    return [{"role": "system", "content": system}, *bound_view(out)]


def bound_view(messages: list[dict]) -> list[dict]:
    """The bounds of ``kxen_agent.runtime.history_bound`` over a parsed history (oldest first, no system
    message), in place: newest first, each text cut to MESSAGE_CHARS; once HISTORY_CHARS are spent every
    older message is the shared ELIDED stub, and so is a tool result left at the oldest end of what is
    shown (its call is not). Without it a history past 8 Mi characters loads differently on the two sides."""
    from kxen_agent.runtime.history_bound import ELIDED, HISTORY_CHARS, MESSAGE_CHARS, _cut

    spent, first = 0, -1
    for i in range(len(messages) - 1, -1, -1):
        if spent >= HISTORY_CHARS:
            first = i
            break
        m = messages[i]
        text = m["content"] or ""
        if len(text) > MESSAGE_CHARS:
            m = messages[i] = {**m, "content": _cut(text)}
        spent += len(m["content"] or "") + sum(len(c.get("name", "")) + len(c.get("arguments", ""))
                                               for c in m.get("tool_calls") or ())
    if first >= 0:
        messages[: first + 1] = [ELIDED] * (first + 1)
        k = first + 1
        while k < len(messages) and messages[k]["role"] == "tool":
            messages[k] = ELIDED
            k += 1
    return messages


def jsonl_zstd_export(paths: Sequence[str], out_dir: str) -> list[str]:
    outs = []
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    for p in paths:
        o = os.path.join(out_dir, os.path.basename(p) + ".zst")
        with open(p, "rb") as s, open(o, "wb") as d:
            cctx.copy_stream(s, d, size=os.path.getsize(p))
        outs.append(o)
    return outs


def jsonl_zstd_import(paths: Sequence[str], out_dir: str) -> int:
    """Decompress each file into ``out_dir`` and parse every line (the import's check)."""
    dctx = zstandard.ZstdDecompressor()
    lines = 0
    for p in paths:
        o = os.path.join(out_dir, os.path.basename(p)[: -len(".zst")])
        with open(p, "rb") as s, open(o, "wb") as d:
            dctx.copy_stream(s, d)
        with open(o, "rb") as f:
            for line in f:
                json.loads(line)
                lines += 1
    return lines


# ================================================================== Git


def git(*args: str, cwd: str | None = None, input: bytes | None = None) -> bytes:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    p = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout


class GitFamily:
    """Branches for ``git fast-import``: a base branch and forks of it."""

    def __init__(self) -> None:
        self.branches: list[tuple[str, Sequence[dict], str | None, int]] = []

    def add(self, branch: str, messages: Sequence[dict], *, from_branch: str | None = None, at: int = 0) -> None:
        """``messages`` on ``branch``; a fork starts after message ``at`` (count) of ``from_branch``."""
        self.branches.append((branch, messages, from_branch, at))


def git_fast_import(repo: str, family: GitFamily) -> None:
    """A bare repository holding ``family``: one commit (tree + blob) per message."""
    if os.path.exists(repo):
        shutil.rmtree(repo)
    git("init", "-q", "--bare", repo)
    marks: dict[tuple[str, int], int] = {}  # (branch, count) -> commit mark
    next_mark = 1
    proc = subprocess.Popen(["git", "fast-import", "--quiet", "--done"], cwd=repo, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env=dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull))
    assert proc.stdin is not None
    w = proc.stdin.write
    t = _T0
    for branch, messages, base, at in family.branches:
        prev = marks[(base, at)] if base is not None else None
        seq0 = at if base is not None else 0
        for i, m in enumerate(messages):
            seq = seq0 + i
            blob = message_json(m, seq)
            text = f"{m['role']} message {seq}\n".encode()
            t += 1
            out = [b"commit refs/heads/", branch.encode(), b"\nmark :%d\n" % next_mark,
                   b"committer kxen-bench <bench@example.invalid> %d +0000\n" % t,
                   b"data %d\n" % len(text), text]
            if prev is not None:
                out.append(b"from :%d\n" % prev)
            out += [b"M 100644 inline message.json\ndata %d\n" % len(blob), blob, b"\n"]
            w(b"".join(out))
            prev = next_mark
            marks[(branch, seq + 1)] = next_mark
            next_mark += 1
    w(b"done\n")
    proc.stdin.close()
    err = proc.stderr.read() if proc.stderr else b""
    if proc.wait() != 0:
        raise RuntimeError(f"git fast-import failed: {err.decode(errors='replace')[-2000:]}")


# ================================================================== dulwich


def dulwich_export(repo_dir: str, branches: Sequence[str], out_base: str) -> int:
    """Read every object reachable from ``branches`` and write one pack; return the object count."""
    from dulwich.object_format import SHA1
    from dulwich.pack import write_pack
    from dulwich.repo import Repo

    repo = Repo(repo_dir)
    try:
        store = repo.object_store
        seen: set[bytes] = set()
        objs = []
        stack = [repo.refs[b"refs/heads/" + b.encode()] for b in branches]
        while stack:
            sha = stack.pop()
            if sha in seen:
                continue
            seen.add(sha)
            c = store[sha]
            objs.append(c)
            if c.tree not in seen:
                seen.add(c.tree)
                tree = store[c.tree]
                objs.append(tree)
                for entry in tree.items():
                    if entry.sha not in seen:
                        seen.add(entry.sha)
                        objs.append(store[entry.sha])
            stack.extend(p for p in c.parents if p not in seen)
        write_pack(out_base, objs, object_format=SHA1)
        return len(objs)
    finally:
        repo.close()


def dulwich_import(pack_path: str, dest_dir: str) -> int:
    """Receive a pack: index it (hashing every object) and check it (checksums, every object parses)."""
    from dulwich.object_format import SHA1
    from dulwich.pack import Pack, PackData

    os.makedirs(dest_dir, exist_ok=True)
    base = os.path.join(dest_dir, "pack-incoming")
    shutil.copyfile(pack_path, base + ".pack")
    data = PackData(base + ".pack", SHA1)
    try:
        data.create_index(base + ".idx")
    finally:
        data.close()
    pack = Pack(base, object_format=SHA1)
    try:
        pack.check()
        return len(pack)
    finally:
        pack.close()
