"""Measure pack compression strategies on agent-session-like objects.

Opt-in benchmark (not part of the test suite)::

    .venv/bin/python bench/pack_compression.py [--messages 4000] [--seed 1]

It builds a synthetic session history — user and assistant messages with
tool calls, tool outputs as blobs (real Python source read from the
installed site-packages, plus generated pytest / ls / grep / diff output),
run and journal records — and compresses the same objects with each
candidate strategy:

- ``entry``: one zstd frame per object, no dictionary;
- ``entry+dict``: one zstd frame per object with a dictionary trained on a
  sample of the pack's own objects (the dictionary's size is counted);
- ``segment``: objects concatenated into segments of a fixed size, one zstd
  frame per segment (random access must decompress a whole segment);
- ``stream``: one zstd frame over everything (a lower bound, no random access).

The figures printed are what ``docs/pack_spec_draft.md`` records. The
synthetic generator is reused by ``bench/bundle_memory.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Iterator

import zstandard

from kxen_agent.store.objects import RawObject, encode_object
from kxen_agent.store.pack import COMPRESSION_LEVEL, DICT_SAMPLE_MAX_OBJECT, PackStream, sample_dictionary

WORDS = (
    "the a to of and in is it that for on with as this be are was file test function "
    "error value return import class def self path line code run session object store "
    "pack index ref group commit update read write check build fix change add remove "
    "use need should would could will can may must now then also but not only when "
    "if else because so which what where how why here there data bytes list map key "
    "tests pass fail failing passed assert expected got module package directory "
    "command output result tool call arguments message user assistant model token "
    "config option flag default timeout retry lock process thread race crash durable"
).split()

_SITE_FILES: list[str] | None = None


def _site_files() -> list[str]:
    global _SITE_FILES
    if _SITE_FILES is None:
        import rich

        root = os.path.dirname(os.path.dirname(rich.__file__))
        out = []
        for pkg in ("rich", "typer", "pydantic", "click", "anyio", "httpx2", "_pytest", "fasteners"):
            base = os.path.join(root, pkg)
            for dirpath, _dirs, files in os.walk(base):
                for f in files:
                    if f.endswith(".py"):
                        out.append(os.path.join(dirpath, f))
        out.sort()
        _SITE_FILES = out
    return _SITE_FILES


def _sentence(rng: random.Random, n: int) -> str:
    # Zipf-ish word choice: a few words are very common, as in real text.
    ws = [WORDS[min(int(rng.paretovariate(1.2)) - 1, len(WORDS) - 1)] if rng.random() < 0.6 else rng.choice(WORDS) for _ in range(n)]
    ws[0] = ws[0].capitalize()
    return " ".join(ws) + rng.choice([".", ".", ".", "?", ":"])


def _text(rng: random.Random, words: int) -> str:
    out = []
    while words > 0:
        k = rng.randint(6, 24)
        out.append(_sentence(rng, k))
        words -= k
    return " ".join(out)


def _pytest_output(rng: random.Random) -> bytes:
    n = rng.randint(3, 60)
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
             f"rootdir: /work/project{rng.randint(1, 9)}", f"collected {n} items", ""]
    for i in range(rng.randint(1, 8)):
        mod = f"tests/test_{rng.choice(WORDS)}_{rng.choice(WORDS)}.py"
        lines.append(mod + " " + "".join(rng.choice("....F.s") for _ in range(rng.randint(1, 30))) + f" [{rng.randint(1, 100):3d}%]")
    if rng.random() < 0.5:
        lines += ["", "=================================== FAILURES ===================================",
                  f"___________________________ test_{rng.choice(WORDS)}_{rng.choice(WORDS)} ___________________________", ""]
        for _ in range(rng.randint(3, 20)):
            lines.append(f"    {rng.choice(WORDS)} = {rng.choice(WORDS)}({rng.choice(WORDS)}, {rng.randint(0, 999)})")
        lines.append(f">       assert {rng.choice(WORDS)} == {rng.randint(0, 99)}")
        lines.append(f"E       AssertionError: assert {rng.randint(0, 99)} == {rng.randint(0, 99)}")
    lines.append(f"========================= {rng.randint(0, n)} passed, {rng.randint(0, 5)} failed in {rng.random() * 9:.2f}s =========================")
    return ("\n".join(lines) + "\n").encode()


def _ls_output(rng: random.Random) -> bytes:
    lines = [f"total {rng.randint(8, 900)}"]
    for _ in range(rng.randint(3, 40)):
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}{rng.choice(['.py', '.md', '.json', '', '.txt'])}"
        lines.append(
            f"{rng.choice(['-rw-r--r--', 'drwxr-xr-x', '-rwxr-xr-x'])} 1 agent agent {rng.randint(0, 99999):6d} "
            f"{rng.choice(['Jan', 'Feb', 'Mar', 'Nov'])} {rng.randint(1, 28):2d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {name}"
        )
    return ("\n".join(lines) + "\n").encode()


def _file_excerpt(rng: random.Random) -> bytes:
    files = _site_files()
    path = rng.choice(files)
    with open(path, "rb") as f:
        data = f.read()
    if len(data) > 16384:
        start = rng.randrange(0, len(data) - 16384)
        data = data[start : start + rng.randint(2048, 16384)]
    return data


def _diff_output(rng: random.Random) -> bytes:
    src = _file_excerpt(rng).decode("utf-8", "replace").splitlines()[:60]
    out = [f"diff --git a/src/{rng.choice(WORDS)}.py b/src/{rng.choice(WORDS)}.py", f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
           "--- a/x.py", "+++ b/x.py", f"@@ -{rng.randint(1, 400)},{len(src)} +{rng.randint(1, 400)},{len(src)} @@"]
    for ln in src:
        r = rng.random()
        out.append(("-" if r < 0.1 else "+" if r < 0.2 else " ") + ln)
    return ("\n".join(out) + "\n").encode()


TOOLS = ("read_file", "run_shell", "write_file", "grep", "list_dir", "apply_patch")


def synth_session(messages: int, seed: int = 1) -> Iterator[RawObject]:
    """A session-like object stream: every object after the objects it links to."""
    rng = random.Random(seed)
    session = encode_object("session", {"agent": "coder", "created": 1700000000000 + seed, "workspace": "/work/project", "model": "gpt-5"})
    yield session
    parent = session.id
    t = 1700000000000
    for i in range(messages):
        t += rng.randint(200, 90000)
        r = rng.random()
        if r < 0.2:
            msg = {"role": "user", "parent": parent, "session": session.id, "time": t,
                   "content": [{"type": "text", "text": _text(rng, rng.randint(5, 120))}]}
        elif r < 0.6:
            calls = []
            for c in range(rng.randint(0, 3)):
                tool = rng.choice(TOOLS)
                args = {"path": f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"} if tool != "run_shell" else {"command": f"pytest -q tests/test_{rng.choice(WORDS)}.py"}
                calls.append({"id": f"call_{rng.getrandbits(64):016x}", "name": tool, "arguments": json.dumps(args)})
            msg = {"role": "assistant", "parent": parent, "session": session.id, "time": t,
                   "content": [{"type": "text", "text": _text(rng, rng.randint(10, 300))}],
                   "toolCalls": calls, "usage": {"inputTokens": rng.randint(1000, 90000), "outputTokens": rng.randint(10, 4000)}}
        else:
            kind = rng.random()
            out = _file_excerpt(rng) if kind < 0.45 else _pytest_output(rng) if kind < 0.65 else _diff_output(rng) if kind < 0.85 else _ls_output(rng)
            blob = encode_object("blob", out)
            yield blob
            msg = {"role": "tool", "parent": parent, "session": session.id, "time": t, "callId": f"call_{rng.getrandbits(64):016x}",
                   "output": blob.id, "exitCode": rng.choice([0, 0, 0, 1]), "durationMs": rng.randint(3, 60000)}
            j = encode_object("journal", {"run": session.id, "seq": i, "state": rng.choice(["started", "done"]), "time": t, "tool": rng.choice(TOOLS), "output": blob.id})
            yield j
        m = encode_object("message", msg)
        yield m
        parent = m.id
        if rng.random() < 0.05:
            yield encode_object("run", {"session": session.id, "head": parent, "started": t - 5000, "ended": t, "status": "done", "fence": i})


# --------------------------------------------------------------- strategies


def _timed(fn, repeat: int = 3):
    """(value, best wall time of ``repeat`` runs): other load on the machine only adds."""
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        v = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return v, best


def measure(objs: list[RawObject], level: int = 3) -> list[dict]:
    raws = [o.raw for o in objs]
    total = sum(map(len, raws))
    rows = []

    def row(name, size, ctime, dtime, note=""):
        rows.append({"strategy": name, "bytes": size, "ratio": round(total / size, 2), "compressMBps": round(total / ctime / 1e6, 1),
                     "decompressMBps": round(total / dtime / 1e6, 1) if dtime else None, "note": note})

    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
    frames, ct = _timed(lambda: [cctx.compress(r) for r in raws])
    dctx = zstandard.ZstdDecompressor()
    _, dt = _timed(lambda: [dctx.decompress(f) for f in frames])
    row(f"entry zstd-{level}", sum(map(len, frames)), ct, dt)

    for dsize in (16384, 65536, 112640):
        # Train as the pack writer does: fastCOVER k=1024 d=8, one thread, on
        # a sample of at most 8 MiB (here: every object when they fit).
        step = max(1, total // (8 << 20))
        sample = raws[::step]
        d, tt = _timed(lambda: zstandard.train_dictionary(dsize, sample, k=1024, d=8, steps=0, level=level, threads=1))
        cd = zstandard.ZstdCompressor(level=level, dict_data=d, write_content_size=True, write_checksum=False, write_dict_id=False)
        frames, ct = _timed(lambda: [cd.compress(r) for r in raws])
        dd = zstandard.ZstdDecompressor(dict_data=d)
        _, dt = _timed(lambda: [dd.decompress(f) for f in frames])
        size = sum(map(len, frames)) + len(d.as_bytes())
        row(f"entry+dict{dsize // 1024}K zstd-{level}", size, ct + tt, dt, f"train {tt:.2f}s")

    for seg in (65536, 262144, 1 << 20):
        segs, cur = [], bytearray()
        for r in raws:
            cur += r
            if len(cur) >= seg:
                segs.append(bytes(cur))
                cur = bytearray()
        if cur:
            segs.append(bytes(cur))
        frames, ct = _timed(lambda: [cctx.compress(s) for s in segs])
        _, dt = _timed(lambda: [dctx.decompress(f) for f in frames])
        # Random access reads a whole segment per object: mean bytes decompressed per lookup.
        row(f"segment{seg // 1024}K zstd-{level}", sum(map(len, frames)), ct, dt, f"~{seg // 1024}K decompressed per lookup")

    if level == COMPRESSION_LEVEL:
        # The pack exactly as kxen writes it: the dictionary policy, entry
        # headers, end record, trailer, and its index.
        def as_written():
            small = [o.id for o in objs if len(o.raw) <= DICT_SAMPLE_MAX_OBJECT]
            by_id = {o.id: o for o in objs}
            d = sample_dictionary(by_id.__getitem__, small, sum(len(by_id[i].raw) for i in small))
            sink = bytearray()
            st = PackStream(sink.extend, d)
            for o in objs:
                st.add(o)
            st.finish()
            return len(sink) + len(st.index()), d
        (size, d), ct = _timed(as_written)
        reader_note = f"dict {len(d) if d else 0} B; +{len(objs) * 57 + 44 * len(objs)} B entry headers+index"
        row("kxen pack+idx as written", size, ct, None, reader_note)

    blob = b"".join(raws)
    f, ct = _timed(lambda: cctx.compress(blob))
    _, dt = _timed(lambda: dctx.decompress(f))
    row(f"stream zstd-{level}", len(f), ct, dt, "no random access")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--levels", default="3,9")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    objs = list(synth_session(args.messages, args.seed))
    total = sum(len(o.raw) for o in objs)
    kinds: dict[str, int] = {}
    for o in objs:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    out = {"objects": len(objs), "rawBytes": total, "kinds": kinds, "meanObjectBytes": total // len(objs), "rows": []}
    for lv in map(int, args.levels.split(",")):
        out["rows"] += measure(objs, lv)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(f"{len(objs)} objects, {total} raw bytes (mean {total // len(objs)}), kinds {kinds}")
        for r in out["rows"]:
            print(f"{r['strategy']:<28} {r['bytes']:>10} B  x{r['ratio']:<5} comp {r['compressMBps']:>7} MB/s  "
                  f"decomp {str(r['decompressMBps']):>7} MB/s  {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
