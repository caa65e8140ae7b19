"""Encrypted and signed bundles vs the plain one: file size and export CPU time (issue #30, ``objects_spec.md`` §12.14).

    .venv/bin/python -m bench.share [--messages 3000] [--repeats 5] [--dir DIR]

Builds one session-like history (``bench/pack_compression.py``'s synthetic
transcript: prose, code and tool outputs), then exports it, in this process,
as each variant: plain; signed (``ssh-keygen -Y sign``, ed25519); encrypted
to an age recipient; encrypted to an SSH ed25519 key; signed then encrypted
to three recipients (age, ed25519, RSA-3072). Opening (decrypting and
checking the signature, no import) is timed too. The figure is CPU time,
this process plus its children (``ssh-keygen``), median of ``--repeats``,
so that a loaded machine does not skew it; wall time is reported beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn) -> tuple[float, float, object]:
    c, w = _cpu(), time.perf_counter()
    out = fn()
    return _cpu() - c, time.perf_counter() - w, out


def build(root: str, messages: int) -> object:
    from kxen_agent.store import Store

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pack_compression import synth_session

    store = Store(root)
    step = store.step("ses/bench")
    head = None
    for obj in synth_session(messages, 1):
        step.put_raw(obj)
        head = obj.id
    step.update("head", None, head)
    step.commit("bench")
    return store


def keys(d: str) -> dict:
    import pyrage

    for name, kind in (("ed", "ed25519"), ("rsa", "rsa")):
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", os.path.join(d, name)]
                       + (["-b", "3072"] if kind == "rsa" else []), check=True)
    ident = pyrage.x25519.Identity.generate()
    with open(os.path.join(d, "age.key"), "w") as f:
        f.write(f"{ident}\n")
    with open(os.path.join(d, "allowed"), "w") as f:
        f.write("bench " + " ".join(open(os.path.join(d, "ed.pub")).read().split()[:2]) + "\n")
    return {"age": str(ident.to_public()), "ed": os.path.join(d, "ed"), "ed.pub": os.path.join(d, "ed.pub"),
            "rsa.pub": os.path.join(d, "rsa.pub"), "age.key": os.path.join(d, "age.key"),
            "allowed": os.path.join(d, "allowed")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args(argv)
    from kxen_agent.session.share import open_bundle, sealing
    from kxen_agent.store import export_bundle

    work = a.dir or tempfile.mkdtemp(prefix="kxen-bench-share-")
    os.makedirs(work, exist_ok=True)
    store = build(os.path.join(work, "state"), a.messages)
    k = keys(work)
    variants = {
        "plain": ({}, []),
        "signed (ed25519)": ({"sign_key": k["ed"]}, []),
        "encrypted, 1 age recipient": ({"encrypt_to": [k["age"]]}, [k["age.key"]]),
        "encrypted, 1 ssh-ed25519": ({"encrypt_to": [k["ed.pub"]]}, [k["ed"]]),
        "signed + encrypted, 3 recipients": ({"sign_key": k["ed"], "encrypt_to": [k["age"], k["ed.pub"], k["rsa.pub"]]},
                                             [k["age.key"]]),
    }
    rows = []
    for name, (kw, ids) in variants.items():
        out = os.path.join(work, "b.kxb")
        exp, opn = [], []
        for _ in range(a.repeats):
            def export() -> None:
                with sealing(out, **kw) as s:
                    export_bundle(store, ["ses/bench"], s.path)

            exp.append(_timed(export)[:2])

            def open_() -> None:
                with open_bundle(out, identities=ids or None,
                                 allowed_signers=k["allowed"] if "sign_key" in kw else None) as o:
                    assert os.path.getsize(o.path) > 0

            opn.append(_timed(open_)[:2])
        rows.append((name, os.path.getsize(out), statistics.median(c for c, _ in exp),
                     statistics.median(w for _, w in exp), statistics.median(c for c, _ in opn)))
    plain_size, plain_cpu = rows[0][1], rows[0][2]
    print(f"{a.messages} messages, median of {a.repeats}; CPU = this process + ssh-keygen")
    print("| variant | file bytes | vs plain | export CPU | vs plain | export wall | open CPU (decrypt + check) |")
    print("|---|---|---|---|---|---|---|")
    for name, size, cpu, wall, ocpu in rows:
        print(f"| {name} | {size:,} | {size / plain_size:.4f}x (+{size - plain_size:,}) | {cpu * 1000:.0f} ms | "
              f"{cpu / plain_cpu:.2f}x | {wall * 1000:.0f} ms | {ocpu * 1000:.0f} ms |")
    if a.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
