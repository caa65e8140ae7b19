"""Streaming check: export, verify and import a bundle of at least 500 MB under 200 MB RSS.

Opt-in benchmark (not in the test suite; takes a few minutes and ~2 GB of disk)::

    .venv/bin/python bench/bundle_memory.py [--size-mb 520] [--limit-mb 200] [--dir DIR] [--json-form] [--gc]

It builds a state dir holding a session-like history of about ``--size-mb``
MB of objects: incompressible tool outputs (random blobs of 64 KiB to
4 MiB, so the bundle really is that large) linked from a chain of small
messages, plus a synthetic transcript (bench/pack_compression.py). Then each
step runs in a fresh process whose peak RSS (``ru_maxrss``) is measured:

- ``export``: ``export_bundle`` of the session to a pack-form bundle;
- ``verify``: ``verify_bundle`` (no state dir);
- ``import``: ``import_bundle`` into a new, empty state dir;
- ``gc`` (with ``--gc``): ``gc --prune=now`` of the source store (packs it all);
- ``export-json`` / ``import-json`` (with ``--json-form``).

Exit status 1 if a step's peak RSS exceeds ``--limit-mb`` or the bundle is
smaller than 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(root: str, size_mb: int, seed: int = 1) -> dict:
    from kxen_agent.store import Store

    sys.path.insert(0, HERE)
    from pack_compression import synth_session

    store = Store(root)
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    total = 0
    n = 0
    head = None
    t0 = time.perf_counter()
    # One durable step: every object in the record that moves the head.
    step = store.step("ses/bench")
    for obj in synth_session(3000, seed):  # a realistic transcript first
        step.put_raw(obj)
        total += len(obj.raw)
        head = obj.id
    while total < target:
        for _ in range(64):
            size = min(4 << 20, int(rng.paretovariate(1.3) * (64 << 10)))
            blob = step.put("blob", os.urandom(size))
            msg = {"role": "tool", "text": f"output {n} ({size} bytes)", "out": blob, "parent": head}
            head = step.put("message", msg)
            total += size + 200
            n += 1
    step.update("head", None, head)
    step.commit("bench")
    return {"objectsMB": round(total / 1e6, 1), "bigBlobs": n, "seconds": round(time.perf_counter() - t0, 1)}


def child(step: str, args: list[str]) -> None:
    from kxen_agent.store import Store, export_bundle, gc, import_bundle, verify_bundle

    t0 = time.perf_counter()
    if step == "export":
        info = export_bundle(Store(args[0]), ["ses/bench"], args[1], fmt=args[2])
        extra = {"objects": info.objects, "fileMB": round(info.file_bytes / 1e6, 1), "objectMB": round(info.object_bytes / 1e6, 1)}
    elif step == "verify":
        info = verify_bundle(args[0])
        extra = {"objects": info.objects, "fileMB": round(info.file_bytes / 1e6, 1)}
    elif step == "import":
        res = import_bundle(Store(args[0]), args[1])
        extra = {"newObjects": res.new_objects}
    elif step == "gc":
        rep = gc(Store(args[0]), prune="now")
        extra = {"packed": rep.packed, "beforeMB": round(rep.bytes_before / 1e6, 1), "afterMB": round(rep.bytes_after / 1e6, 1)}
    else:
        raise SystemExit(f"unknown step {step}")
    print(json.dumps({"step": step, "seconds": round(time.perf_counter() - t0, 2), "peakRssMB": round(_rss_mb(), 1), **extra}))


def run_step(step: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", step, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{step} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=520)
    ap.add_argument("--limit-mb", type=float, default=200)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--json-form", action="store_true", help="also export and import the JSON form")
    ap.add_argument("--gc", action="store_true", help="also gc the source store")
    a = ap.parse_args()
    work = a.dir or tempfile.mkdtemp(prefix="kxen-bench-")
    os.makedirs(work, exist_ok=True)
    src, dst, out = os.path.join(work, "src"), os.path.join(work, "dst"), os.path.join(work, "session.kxb")
    try:
        built = build(src, a.size_mb)
        print(f"built {built}", flush=True)
        rows = [run_step("export", src, out, "pack"), run_step("verify", out), run_step("import", dst, out)]
        size = os.path.getsize(out)
        if a.json_form:
            jout, jdst = os.path.join(work, "session.json"), os.path.join(work, "dst-json")
            rows += [run_step("export", src, jout, "json"), run_step("verify", jout), run_step("import", jdst, jout)]
            rows[-3]["step"], rows[-2]["step"], rows[-1]["step"] = "export-json", "verify-json", "import-json"
        if a.gc:
            rows.append(run_step("gc", src))
        ok = size >= 500_000_000
        for r in rows:
            mbps = f"{size / 1e6 / r['seconds']:.0f} MB/s" if r["step"] in ("export", "verify", "import") else ""
            over = r["peakRssMB"] > a.limit_mb
            ok = ok and not over
            print(f"{r['step']:<12} {r['seconds']:>7.1f} s  {mbps:>10}  peak RSS {r['peakRssMB']:>6.1f} MB"
                  f"{'  OVER LIMIT' if over else ''}  {json.dumps({k: v for k, v in r.items() if k not in ('step', 'seconds', 'peakRssMB')})}")
        print(f"bundle {size / 1e6:.1f} MB; limit {a.limit_mb} MB RSS: {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
