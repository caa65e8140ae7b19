"""A short fuzz run of every target, as part of the normal test suite.

Two parts, both over the committed seed corpora (``fuzz/corpus/<target>/``):

- in process, always: every seed, then a fixed number of inputs made by a
  seeded random mutator (bit flips, interesting bytes and integers, inserts,
  deletes, truncations, splices of two seeds) — deterministic, so a failure
  reproduces, and independent of atheris;
- under atheris (libFuzzer, coverage-guided) for a few seconds per target,
  when atheris is installed (``pip install atheris``; the CI image has it).

Long runs: ``fuzz/README.md``.
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import depth

from . import load_targets

TARGETS = load_targets().TARGETS
ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"
#: Mutated inputs per target: about a second each on the 2-core machine (KXEN_TEST_LONG=1); the
#: normal suite takes the first half of the same deterministic sequence.
_MUTANTS_LONG = {"cbor": 10000, "loose": 2000, "pack": 1000, "bundle": 400, "schema": 10000, "json": 1000}
MUTANTS = {t: depth(fast=n // 2, long=n) for t, n in _MUTANTS_LONG.items()}
ATHERIS_SECONDS = int(os.environ.get("KXEN_FUZZ_SMOKE_SECONDS", "2"))

_WIDE = [struct.pack(">I", v) for v in (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)] + [
    struct.pack(">Q", v) for v in (0, 2**32, 2**40, 2**63, 2**64 - 1)
] + [b"\x1b\xff\xff\xff\xff\xff\xff\xff\xff", b"\x9b\x00\x00\x00\x01\x00\x00\x00\x00", b"\x00" * 32]
_BYTES = [0x00, 0x01, 0x17, 0x18, 0x1F, 0x7F, 0x80, 0xBF, 0xC0, 0xF4, 0xF6, 0xFF]


def seeds(target: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((CORPUS / target).iterdir()) if p.is_file()]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """One to eight random edits of ``data``."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
        op = rng.randrange(9)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(pos, len(b) - 1)] = rng.choice(_BYTES)
        elif op == 2:
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:
            del b[pos : pos + rng.randint(1, 64)]
        elif op == 4:
            w = rng.choice(_WIDE)
            b[pos : pos + len(w)] = w
        elif op == 5:
            del b[pos:]
        elif op == 6:
            other = rng.choice(corpus)
            cut = rng.randrange(len(other) + 1)
            b = b[:pos] + bytearray(other[cut:])
        elif op == 7 and b:
            start = rng.randrange(len(b))
            b[pos:pos] = b[start : start + rng.randint(1, 128)]
        elif op == 8 and b:  # a little-endian interesting size (zstd frame headers are little-endian)
            b[pos : pos + 8] = rng.choice((2**40, 2**63, 64 << 20, 0)).to_bytes(8, "little")
    return bytes(b)


def test_every_target_has_a_small_seed_corpus():
    total = 0
    for target in TARGETS:
        s = seeds(target)
        assert s, f"fuzz/corpus/{target} is empty; run fuzz/make_corpus.py --seeds"
        total += sum(len(x) for x in s)
    assert total < 2 << 20, f"seed corpora hold {total} bytes; keep them under 2 MiB"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_and_seeded_mutants(target, tmp_path):
    fn = TARGETS[target]
    corpus = seeds(target)
    rng = random.Random(f"kxen-fuzz-{target}")
    inputs = [(f"seed {i}", x) for i, x in enumerate(corpus)]
    inputs += [(f"mutant {i}", mutate(rng, rng.choice(corpus), corpus)) for i in range(MUTANTS[target])]
    for label, data in inputs:
        try:
            fn(data)
        except BaseException as e:
            saved = tmp_path / f"crash-{target}"
            saved.write_bytes(data)
            pytest.fail(
                f"fuzz target {target!r} crashed on {label} ({len(data)} bytes, saved to {saved}): "
                f"{type(e).__name__}: {e}\nCommit it as fuzz/crashers/{target}/<name> and fix the bug."
            )


@pytest.mark.slow
def test_atheris_smoke_run_of_every_target(tmp_path):
    import atheris  # noqa: F401  (the test extra installs it; a missing fuzzer is a failure, not a skip)
    before = {t: sorted(p.name for p in (CORPUS / t).iterdir()) for t in TARGETS}
    procs = {}
    for target in sorted(TARGETS):
        work, art = tmp_path / target / "work", tmp_path / target / "art"
        work.mkdir(parents=True)
        art.mkdir()
        procs[target] = subprocess.Popen(
            [sys.executable, str(ROOT / "fuzz" / "targets.py"), target, f"-max_total_time={ATHERIS_SECONDS}",
             "-timeout=30", "-rss_limit_mb=1024", "-print_final_stats=1", f"-artifact_prefix={art}/",
             str(work), str(CORPUS / target)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    failures = []
    for target, p in procs.items():
        out = p.communicate(timeout=120)[0].decode("utf-8", "replace")
        # libFuzzer exits without atexit: remove the target's scratch dir here.
        for base in ("/dev/shm", tempfile.gettempdir()):
            for d in glob.glob(os.path.join(base, f"kxen-fuzz-{p.pid}-*")):
                shutil.rmtree(d, ignore_errors=True)
        runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
        crashes = list((tmp_path / target / "art").iterdir())
        if p.returncode != 0 or crashes or not runs or int(runs.group(1)) == 0:
            failures.append(f"{target}: rc={p.returncode}, artifacts={[c.name for c in crashes]}\n{out[-3000:]}")
    assert not failures, "\n\n".join(failures)
    assert before == {t: sorted(p.name for p in (CORPUS / t).iterdir()) for t in TARGETS}, "the seed corpus was modified"


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_grown_corpus_replays_clean(target, tmp_path):
    """Every input the long mode kept (``fuzz/corpus/grown/<target>/``) still runs clean: a change that
    breaks an invariant on what the fuzzer found fails here, without a fuzzer."""
    grown = CORPUS / "grown" / target
    inputs = sorted(p for p in grown.iterdir() if p.is_file()) if grown.is_dir() else []
    assert inputs, f"{grown} holds no input; run `python fuzz/long.py {target}` (fuzz/README.md)"
    fn = TARGETS[target]
    for p in inputs:
        try:
            fn(p.read_bytes())
        except BaseException as e:
            pytest.fail(f"fuzz target {target!r} fails on grown input {p.name}: {type(e).__name__}: {e}")
