"""The user's docs quote no measured figure: measurements live in ``bench/README.md``.

A figure copied into the README drifts the day the code changes (the README
once said 6.5 fsyncs per step and 3.3x load for resume while the bench said
1.00 and 0.96x). So the rule is the simplest honest one: ``README.md`` and
``docs/*.md`` quote no bench figure — a ratio to a peer (``0.96x``), an
fsync count (``1.00 fsync``), a file count (``4,605 files``), a throughput
(``53 MB/s``), a share (``0.2 %``), or a number in a sentence that says it was measured — and
point to ``bench/README.md`` instead, whose table is from one run on the
current code. Limits and defaults (``120 s``, ``64 tool calls``) are
settings, not measurements, and are not matched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What a measured figure looks like in prose.
FIGURES = {
    "a ratio to a peer": re.compile(r"(?<![\w.-])\d+(?:\.\d+)?x(?![\w-])"),
    "an fsync count": re.compile(r"\b\d+(?:\.\d+)? (?:fsyncs?|fsync syscalls)\b"),
    "a file count": re.compile(r"\b\d{1,3}(?:,\d{3})+ files\b"),
    "a throughput": re.compile(r"\b\d+(?:\.\d+)? ?[KMG]i?B/s\b"),
    "a share in percent": re.compile(r"\b\d+(?:\.\d+)? ?%"),
    "a number said to be measured": re.compile(r"\b[Mm]easured\b[^.;]*?\d"),
}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers (code shows commands, not results)."""
    lines, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((n, line))
    return lines


def figures_in(text: str) -> list[str]:
    found = []
    lines = prose(text)
    # Join each paragraph so that a figure broken over two lines is still seen.
    joined = " ".join(line.strip() for _, line in lines)
    for what, rx in FIGURES.items():
        for m in rx.finditer(joined):
            found.append(f"{what}: {m.group(0)!r}")
    return found


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_quote_no_bench_figure(path: Path) -> None:
    found = figures_in(path.read_text(encoding="utf-8"))
    assert not found, (f"{path.relative_to(ROOT)} quotes measured figures; point to bench/README.md instead "
                       f"(its table is the current one): {found}")


def test_the_detector_sees_the_figures_that_drifted() -> None:
    # The stale figures of issue 26, as the README quoted them.
    for text in ("a durable step costs 6.5 fsyncs", "takes 3.3x a JSONL parse", "leaves 4,605 files",
                 "1.00 fsync per step", "0.96x the JSONL parse", "zstd-3 runs at 53 MB/s",
                 "Measured: a 50 MB argument costs 143 MB", "send 0.2 % of the full push"):
        assert figures_in(text), text
    for text in ("waits at most 120 s", "at most 64 tool calls", "a 2-core machine", "--scale 10", "x86-64",
                 "```\nkxen-agent bench 2.5x\n```"):
        assert not figures_in(text), text


def test_the_bench_readme_opens_with_the_current_table() -> None:
    text = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    head = text[: text.find("\n## ", text.find("\n## ") + 1)]
    assert "## Current results" in head and "|---" in head, "bench/README.md opens with one current table"
    assert "load average" in head, "the current table states the machine's load"
