#!/usr/bin/env python3
"""The long mode of the fuzz targets: each target to a published depth, in chunks.

    .venv/bin/python fuzz/long.py cbor [--executions 1000000] [--chunk 100000]
    .venv/bin/python fuzz/long.py --all           # every target in turn, one at a time
    .venv/bin/python fuzz/long.py --report        # the table RELIABILITY.md publishes

Each chunk is one libFuzzer process (``fuzz/targets.py TARGET -runs=N``)
over the target's grown corpus (``fuzz/corpus/grown/<target>/``, where
libFuzzer writes what it finds) and its committed seeds
(``fuzz/corpus/<target>/``, read only). A chunk that ends appends one line
to the ledger ``fuzz/long/<target>.jsonl``: executions, the executions that
only replayed the corpus at start-up, coverage (libFuzzer's ``cov``: edges
of the instrumented Python, atheris's feedback; ``ft``: features), the
corpus size, the crash artifacts, time and the source it ran (``--label``).
Runs resume from the ledger, so an interrupted run loses at most one
chunk, and chunks fit a working session. A target is done when its
*mutated* executions (all, minus the start-up replays) reach
``--executions``; then its grown corpus is merged (``-merge=1``: only the
inputs that add coverage are kept, so what is committed stays small).

A chunk that crashes keeps its artifact under ``fuzz/long/artifacts/<target>/``
(copy it to ``fuzz/crashers/<target>/`` and fix the bug, ``fuzz/README.md``);
three crashing chunks in a row stop the target.

Run it at low priority so that it takes only idle time, e.g. from a
snapshot of a commit, so that edits in the working tree do not reach a
chunk half made::

    git archive HEAD | tar -x -C /tmp/snap
    PYTHONPATH=/tmp/snap nice -n 19 .venv/bin/python /tmp/snap/fuzz/long.py --all \\
        --out "$PWD/fuzz" --label "$(git rev-parse --short HEAD)"

It never changes the committed seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_ORDER = ("cbor", "loose", "schema", "json", "pack", "bundle")
#: libFuzzer flags of every chunk: a slow input is a finding at 60 s, a memory
#: bound well above what any input may take (the readers are held to 256 MB
#: by tests/reliability/test_memory_bound.py; here the bound catches runaways).
CHUNK_FLAGS = ("-timeout=60", "-rss_limit_mb=1024", "-print_final_stats=1")

_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_INITED = re.compile(r"#(\d+)\s+INITED")
_UNITS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


def _ledger(out: str, target: str) -> str:
    return os.path.join(out, "long", f"{target}.jsonl")


def read_ledger(out: str, target: str) -> list[dict[str, Any]]:
    path = _ledger(out, target)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(out: str, target: str) -> dict[str, Any]:
    rows = read_ledger(out, target)
    crashes = sorted({c for r in rows for c in r["crashes"]})
    last = rows[-1] if rows else {}
    return {
        "target": target,
        "chunks": len(rows),
        "executions": sum(r["executions"] for r in rows),
        "mutated": sum(r["executions"] - r["replayed"] for r in rows),
        "cov": last.get("cov"),
        "ft": last.get("ft"),
        "corpus": last.get("corpus"),
        "seconds": round(sum(r["seconds"] for r in rows)),
        "crashes": crashes,
        "labels": sorted({r["label"] for r in rows}),
        "merged": last.get("merged"),
    }


def parse_chunk_output(text: str) -> dict[str, int]:
    """Executions, start-up replays and coverage from one libFuzzer process's output."""
    units = _UNITS.findall(text)
    inited = _INITED.findall(text)
    done = _DONE.findall(text) or _STATUS.findall(text)
    out = {"executions": int(units[-1]) if units else 0, "replayed": int(inited[0]) if inited else 0}
    if done:
        _n, cov, ft, corp = done[-1]
        out.update(cov=int(cov), ft=int(ft), corpus=int(corp))
    return out


def run_chunk(target: str, runs: int, out: str, label: str, python: str) -> dict[str, Any]:
    grown = os.path.join(out, "corpus", "grown", target)
    seeds = os.path.join(HERE, "corpus", target)  # the committed seeds of the source that runs
    art = os.path.join(out, "long", "artifacts", target)
    os.makedirs(grown, exist_ok=True)
    os.makedirs(art, exist_ok=True)
    before = set(os.listdir(art))
    cmd = [python, os.path.join(HERE, "targets.py"), target, f"-runs={runs}", *CHUNK_FLAGS,
           f"-artifact_prefix={art}/", grown]
    if os.path.isdir(seeds):
        cmd.append(seeds)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=os.path.dirname(HERE))
    text = p.stdout.decode("utf-8", "replace")
    _cleanup_scratch(p)
    row = {"target": target, "label": label, "started": round(t0), "seconds": round(time.time() - t0, 1),
           "rc": p.returncode, **parse_chunk_output(text),
           "crashes": sorted(set(os.listdir(art)) - before)}
    if p.returncode != 0 and not row["crashes"]:
        row["tail"] = text[-2000:]
    with open(_ledger(out, target), "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    return row


def _cleanup_scratch(p: subprocess.CompletedProcess) -> None:
    # libFuzzer exits without atexit: targets.py's scratch dirs of dead
    # processes are removed by the next start, but not the last one's.
    import glob
    import tempfile

    for base in ("/dev/shm", tempfile.gettempdir()):
        for d in glob.glob(os.path.join(base, "kxen-fuzz-*")):
            m = re.match(r"kxen-fuzz-(\d+)-", os.path.basename(d))
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                shutil.rmtree(d, ignore_errors=True)


def merge(target: str, out: str, python: str) -> int:
    """Keep only the grown inputs that add coverage (libFuzzer ``-merge=1``); the count kept."""
    grown = os.path.join(out, "corpus", "grown", target)
    merged = grown + ".merging"
    shutil.rmtree(merged, ignore_errors=True)
    os.makedirs(merged)
    env = dict(os.environ, KXEN_FUZZ_TARGET=target, PATH=os.path.dirname(python) + os.pathsep + os.environ["PATH"])
    # -merge re-executes argv[0] with flags only: targets.py, with the target in the environment.
    p = subprocess.run([os.path.join(HERE, "targets.py"), "-merge=1", *CHUNK_FLAGS, merged, grown],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=os.path.dirname(HERE), env=env)
    if p.returncode != 0:
        shutil.rmtree(merged, ignore_errors=True)
        raise SystemExit(f"merge of {target} failed:\n{p.stdout.decode('utf-8', 'replace')[-2000:]}")
    shutil.rmtree(grown)
    os.rename(merged, grown)
    n = len(os.listdir(grown))
    rows = read_ledger(out, target)
    if rows:
        rows[-1]["merged"] = n
        with open(_ledger(out, target), "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    return n


def run_target(target: str, executions: int, chunk: int, out: str, label: str, python: str) -> None:
    crashing = 0
    while True:
        s = summary(out, target)
        if s["mutated"] >= executions:
            break
        row = run_chunk(target, chunk, out, label, python)
        print(f"{target}: chunk of {row['executions']} executions ({row['replayed']} replayed) in {row['seconds']} s, "
              f"cov {row.get('cov')}, rc {row['rc']}, crashes {row['crashes']}", flush=True)
        crashing = crashing + 1 if row["rc"] != 0 else 0
        if crashing >= 3:
            print(f"{target}: three chunks in a row ended with rc != 0; stopping (see the ledger)", flush=True)
            return
    if summary(out, target).get("merged") is None:
        print(f"{target}: merged grown corpus: {merge(target, out, python)} inputs", flush=True)
    print(json.dumps(summary(out, target)), flush=True)


def report(out: str) -> str:
    lines = ["| target | executions (mutated) | chunks | cov (edges) | ft | corpus (merged) | wall s | crashes |",
             "|---|---|---|---|---|---|---|---|"]
    for t in TARGET_ORDER:
        s = summary(out, t)
        if not s["chunks"]:
            lines.append(f"| {t} | not run | | | | | | |")
            continue
        lines.append(f"| {t} | {s['executions']:,} ({s['mutated']:,}) | {s['chunks']} | {s['cov']} | {s['ft']} | "
                     f"{s['corpus']} ({s['merged'] if s['merged'] is not None else '-'}) | {s['seconds']:,} | "
                     f"{len(s['crashes'])} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("--all", action="store_true", help="every target in turn")
    ap.add_argument("--executions", type=int, default=1_000_000, help="mutated executions per target")
    ap.add_argument("--chunk", type=int, default=100_000, help="executions per libFuzzer process")
    ap.add_argument("--out", default=HERE, help="where corpus/grown, long/ (ledgers, artifacts) live")
    ap.add_argument("--label", default="", help="recorded with each chunk: the source it ran (a commit)")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args(argv)
    if a.report:
        print(report(a.out))
        return 0
    targets = TARGET_ORDER if a.all else [a.target]
    if not a.all and a.target not in TARGET_ORDER:
        ap.error(f"name a target ({', '.join(TARGET_ORDER)}) or --all")
    os.makedirs(os.path.join(a.out, "long"), exist_ok=True)
    for t in targets:
        run_target(t, a.executions, a.chunk, a.out, a.label, sys.executable)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
