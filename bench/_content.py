"""Deterministic, realistic agent conversations for the benchmarks.

A conversation is a list of provider-style message dicts, exactly what
``SessionStore.append_messages`` takes (``role``, ``content``,
``tool_calls``, ``tool_call_id``, ``run``). Its shape follows a coding
agent's session: a user task, then turns of an assistant message (some
prose, one or two tool calls) followed by the tool results, and now and
then a final answer and a new task. Content has mixed lengths:

- prose: 5 to 400 words, cut from a Zipf-ish word stream (not repetitive
  text: every slice starts at a fresh random offset of a 16 MB stream);
- tool outputs of a few KB: excerpts of real Python source (the standard
  library's files), pytest runs, ``ls -l``, ``grep -n`` and ``git diff``
  output, short write confirmations;
- some repeated outputs: about 15 % of tool outputs repeat an earlier
  output exactly (a command run again, a file read again unchanged).

The same seed gives the same conversation on every machine with the same
Python standard library. Nothing here knows about any store.
"""

from __future__ import annotations

import json
import os
import random
import sys
import sysconfig
from typing import Iterator

__all__ = ["Conversation", "conversation", "content_bytes"]

WORDS = (
    "the a to of and in is it that for on with as this be are was file test function "
    "error value return import class def self path line code run session object store "
    "pack index ref group commit update read write check build fix change add remove "
    "use need should would could will can may must now then also but not only when "
    "if else because so which what where how why here there data bytes list map key "
    "tests pass fail failing passed assert expected got module package directory "
    "command output result tool call arguments message user assistant model token "
    "config option flag default timeout retry lock process thread race crash durable "
    "parser encoder decoder cache buffer stream socket request response header body "
    "schema migration database query index table column row transaction rollback"
).split()

#: Share of tool outputs that repeat an earlier output byte for byte.
REPEAT_SHARE = 0.15

_STREAM_CHARS = 16 << 20


class _Text:
    """Cheap fresh prose: slices of one long random word stream."""

    def __init__(self, rng: random.Random, chars: int = _STREAM_CHARS) -> None:
        weights = [1.0 / (i + 1) ** 0.9 for i in range(len(WORDS))]
        words = rng.choices(WORDS, weights=weights, k=max(chars, 64 << 10) // 6)
        # Sentences: a capital and a full stop every 6 to 24 words.
        i = 0
        while i < len(words):
            words[i] = words[i].capitalize()
            j = min(i + rng.randint(6, 24), len(words))
            words[j - 1] += "."
            i = j
        self.stream = " ".join(words)
        self.rng = rng

    def words(self, n: int) -> str:
        s = self.stream
        start = self.rng.randrange(0, len(s) - 8 * n - 64)
        start = s.index(" ", start) + 1
        end = s.find(" ", start + 6 * n)
        return s[start:end if end > 0 else None]


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "test", "tests", "idlelib", "__pycache__"))
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".py")]
    return out


class Conversation:
    """A generator of one conversation's messages (deterministic per seed)."""

    def __init__(self, seed: int = 1, text_chars: int = _STREAM_CHARS) -> None:
        """``text_chars``: the size of the prose stream (smaller starts faster; 16 MB for real runs)."""
        self.rng = random.Random(seed)
        self.text = _Text(self.rng, text_chars)
        self.root = sysconfig.get_paths()["stdlib"]
        # A project's worth of files (a few hundred), read again and again.
        files = _stdlib_files()
        self.files = sorted(self.rng.sample(files, min(600, len(files))))
        self._file_cache: dict[str, list[str]] = {}
        self._rel: dict[str, str] = {p: os.path.relpath(p, self.root) for p in self.files}
        self.past: list[str] = []
        self.calls = 0

    # ---------------------------------------------------------- tool outputs

    def _lines(self, path: str) -> list[str]:
        lines = self._file_cache.get(path)
        if lines is None:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                lines = []
            self._file_cache[path] = lines
        return lines

    def _excerpt(self) -> tuple[str, str]:
        rng = self.rng
        for _ in range(20):
            path = rng.choice(self.files)
            lines = self._lines(path)
            if len(lines) > 30:
                break
        n = rng.randint(20, 120)
        a = rng.randrange(0, max(1, len(lines) - n))
        rel = self._rel[path]
        body = "\n".join(f"{a + i + 1:5d}\t{ln}" for i, ln in enumerate(lines[a:a + n]))
        return json.dumps({"path": rel}), body + "\n"

    def _pytest(self) -> tuple[str, str]:
        rng, w = self.rng, WORDS
        n = rng.randint(3, 300)
        out = ["============================= test session starts ==============================",
               "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
               f"rootdir: /work/project, configfile: pyproject.toml", f"collected {n} items", ""]
        for _ in range(rng.randint(2, 12)):
            mod = f"tests/test_{rng.choice(w)}_{rng.choice(w)}.py"
            out.append(mod + " " + "".join(rng.choice("....F.s") for _ in range(rng.randint(1, 40)))
                       + f" [{rng.randint(1, 100):3d}%]")
        if rng.random() < 0.6:
            out += ["", "=================================== FAILURES ===================================",
                    f"___________________________ test_{rng.choice(w)}_{rng.choice(w)} ___________________________", ""]
            for _ in range(rng.randint(5, 40)):
                out.append(f"    {rng.choice(w)} = {rng.choice(w)}({rng.choice(w)}, {rng.randint(0, 999)})")
            out.append(f">       assert {rng.choice(w)} == {rng.randint(0, 99)}")
            out.append(f"E       AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}")
            out.append(f"tests/test_{rng.choice(w)}.py:{rng.randint(10, 900)}: AssertionError")
        out.append(f"========================= {rng.randint(0, n)} passed, {rng.randint(0, 5)} failed "
                   f"in {rng.random() * 9:.2f}s =========================")
        return json.dumps({"command": "python -m pytest -q"}), "\n".join(out) + "\n"

    def _ls(self) -> tuple[str, str]:
        rng, w = self.rng, WORDS
        out = [f"total {rng.randint(8, 900)}"]
        for _ in range(rng.randint(4, 50)):
            name = f"{rng.choice(w)}_{rng.choice(w)}{rng.choice(['.py', '.md', '.json', '', '.txt'])}"
            out.append(f"{rng.choice(['-rw-r--r--', 'drwxr-xr-x', '-rwxr-xr-x'])} 1 agent agent "
                       f"{rng.randint(0, 99999):6d} {rng.choice(['Jan', 'Feb', 'Mar', 'Nov'])} "
                       f"{rng.randint(1, 28):2d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {name}")
        return json.dumps({"command": "ls -l"}), "\n".join(out) + "\n"

    def _grep(self) -> tuple[str, str]:
        rng = self.rng
        word = rng.choice(WORDS)
        out = []
        for _ in range(rng.randint(3, 40)):
            path = rng.choice(self.files)
            lines = self._lines(path)
            if not lines:
                continue
            i = rng.randrange(len(lines))
            rel = self._rel[path]
            out.append(f"{rel}:{i + 1}:{lines[i]}")
        return json.dumps({"command": f"grep -rn {word} ."}), "\n".join(out) + "\n"

    def _diff(self) -> tuple[str, str]:
        rng = self.rng
        path = rng.choice(self.files)
        lines = self._lines(path) or ["pass"]
        rel = self._rel[path]
        out = [f"diff --git a/{rel} b/{rel}", f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
               f"--- a/{rel}", f"+++ b/{rel}"]
        for _ in range(rng.randint(1, 4)):
            a = rng.randrange(len(lines))
            out.append(f"@@ -{a + 1},7 +{a + 1},8 @@")
            for ln in lines[a:a + 3]:
                out.append(" " + ln)
            out.append("-" + (lines[a + 3] if a + 3 < len(lines) else ""))
            out.append("+    " + self.text.words(rng.randint(3, 12)))
            out.append("+    # " + self.text.words(rng.randint(3, 12)))
            for ln in lines[a + 4:a + 7]:
                out.append(" " + ln)
        return json.dumps({"command": "git diff"}), "\n".join(out) + "\n"

    def _write(self) -> tuple[str, str]:
        rng = self.rng
        path = f"src/{rng.choice(WORDS)}_{rng.choice(WORDS)}.py"
        return (json.dumps({"path": path, "content": self.text.words(rng.randint(20, 200))}),
                f"wrote {rng.randint(100, 9000)} bytes to {path}")

    def tool_output(self) -> tuple[str, str, str]:
        """(tool name, arguments JSON, output) of one call."""
        rng = self.rng
        if self.past and rng.random() < REPEAT_SHARE:
            name, args, out = rng.choice(self.past)
            return name, args, out
        r = rng.random()
        if r < 0.35:
            name, (args, out) = "read_file", self._excerpt()
        elif r < 0.55:
            name, (args, out) = "shell", self._pytest()
        elif r < 0.65:
            name, (args, out) = "shell", self._ls()
        elif r < 0.75:
            name, (args, out) = "shell", self._grep()
        elif r < 0.85:
            name, (args, out) = "shell", self._diff()
        else:
            name, (args, out) = "write_file", self._write()
        if len(self.past) < 5000:
            self.past.append((name, args, out))
        else:
            self.past[rng.randrange(5000)] = (name, args, out)
        return name, args, out

    # ---------------------------------------------------------- messages

    def messages(self, n: int, run: str = "run_benchmark000000000") -> Iterator[dict]:
        """Exactly ``n`` messages; the history never ends inside a tool turn's
        calls unless ``n`` cuts it there (a fork point must not, see fork_points)."""
        rng = self.rng
        made = 0
        turns_left = 0
        while made < n:
            if turns_left == 0:
                yield {"role": "user", "content": self.text.words(rng.randint(10, 120)), "run": run}
                made += 1
                turns_left = rng.randint(4, 25)
                continue
            turns_left -= 1
            if turns_left == 0:
                yield {"role": "assistant", "content": self.text.words(rng.randint(30, 400)), "run": run}
                made += 1
                continue
            k = 1 if rng.random() < 0.8 else 2
            calls, outs = [], []
            for _ in range(k):
                self.calls += 1
                name, args, out = self.tool_output()
                calls.append({"id": f"call_{self.calls}", "name": name, "arguments": args})
                outs.append(out)
            text = self.text.words(rng.randint(5, 150)) if rng.random() < 0.6 else None
            yield {"role": "assistant", "content": text, "tool_calls": calls, "run": run}
            made += 1
            for c, out in zip(calls, outs):
                if made >= n:
                    break
                yield {"role": "tool", "content": out, "tool_call_id": c["id"], "run": run}
                made += 1


def conversation(n: int, seed: int = 1) -> list[dict]:
    return list(Conversation(seed).messages(n))


def content_bytes(messages: list[dict]) -> int:
    """UTF-8 bytes of message content plus tool-call arguments: the payload."""
    total = 0
    for m in messages:
        if m.get("content"):
            total += len(m["content"].encode("utf-8"))
        for c in m.get("tool_calls") or ():
            total += len(c["arguments"].encode("utf-8"))
    return total


def safe_fork_point(messages: list[dict], at: int) -> int:
    """The largest k <= at such that the first k messages leave no tool call unanswered."""
    k = at
    while k > 0:
        pending: set[str] = set()
        # Only the last assistant turn before k can be open.
        j = k - 1
        while j >= 0 and messages[j]["role"] == "tool":
            pending.discard(messages[j].get("tool_call_id"))
            j -= 1
        if j >= 0 and messages[j]["role"] == "assistant" and messages[j].get("tool_calls"):
            answered = {messages[i].get("tool_call_id") for i in range(j + 1, k)}
            if any(c["id"] not in answered for c in messages[j]["tool_calls"]):
                k = j
                continue
        return k
    return 0


if __name__ == "__main__":  # a quick look: python -m bench._content 2000
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    msgs = conversation(n)
    print(n, "messages,", content_bytes(msgs), "content bytes,",
          sum(1 for m in msgs if m["role"] == "tool"), "tool outputs")
