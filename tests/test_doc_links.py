"""The user's docs point only at what exists.

Every relative link in ``README.md`` and ``docs/*.md`` names a file of this
repository (and, with ``#anchor``, a heading of that file, as GitHub makes
anchors); every ``§N.M`` they cite is a section of ``objects_spec.md``; the
spec's own table of contents links only to its headings. And each package's
docstring names every module the package holds (a newcomer reads it first).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "objects_spec.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SECTION = re.compile(r"§\s?(\d+[a-z]?(?:\.\d+[a-z]?)*)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def outside_code(text: str) -> str:
    """The text without fenced code blocks (code shows commands, not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return "\n".join(out)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in outside_code(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        a = anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        found.add(a if n == 0 else f"{a}-{n}")
    return found


def spec_sections() -> set[str]:
    found = set()
    for line in SPEC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{2,4} (\d+[a-z]?(?:\.\d+[a-z]?)*)\.? ", line)
        if m:
            found.add(m.group(1))
    return found


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in LINK.findall(outside_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto: — not this repository's
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert not broken_links(path), broken_links(path)


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_spec_section_cited_exists(path: Path) -> None:
    sections = spec_sections()
    cited = set(SECTION.findall(path.read_text(encoding="utf-8")))
    assert not cited - sections, f"{path.relative_to(ROOT)} cites spec sections that do not exist: {sorted(cited - sections)}"


def test_the_spec_table_of_contents_links_to_its_headings() -> None:
    text = SPEC.read_text(encoding="utf-8")
    toc = text[: text.index("\n## 1. ")]
    targets = re.findall(r"\]\(#([^)]+)\)", toc)
    assert len(targets) > 20, "objects_spec.md opens with a table of contents"
    missing = [t for t in targets if t not in anchors(SPEC)]
    assert not missing, missing
    numbered = [m.group(1) for m in re.finditer(r"^#{2,3} (\d.*)$", text, re.M)]
    absent = [h for h in numbered if anchor(h) not in targets]
    assert not absent, f"parts and sections of the spec missing from its contents: {absent}"


def test_the_detector_sees_a_broken_link(tmp_path: Path) -> None:
    page = ROOT / "docs" / "commands.md"
    assert anchor("Live output and `--events`") == "live-output-and---events"
    assert anchor("The workspace's Git internals") == "the-workspaces-git-internals"
    assert "6.8" in spec_sections() and "14.13" in spec_sections() and "11a" in spec_sections()
    fake = tmp_path / "x.md"
    fake.write_text("[a](nowhere.md) [b](#nope) [c](https://example.invalid/)\n```\n[d](not-a-link.md)\n```\n")
    assert broken_links(fake) == ["nowhere.md: no such file", "#nope: no heading with that anchor in x.md"]
    assert page.exists()


# Modules that other branches of issue 26 add; a package docstring may name them before they land.
ANNOUNCED = {"session.status", "session.records", "runtime.plan", "runtime.run_reader", "runtime.tool_call",
             "store.refformat", "store.caches", "store.step"}
PACKAGES = ["", "cli", "session", "runtime", "store"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p or "kxen_agent")
def test_each_package_docstring_names_every_module(package: str) -> None:
    import ast

    pkg_dir = ROOT / "kxen_agent" / package
    doc = ast.get_docstring(ast.parse((pkg_dir / "__init__.py").read_text(encoding="utf-8"))) or ""
    prefix = "kxen_agent." + (package + "." if package else "")
    named = {m[1:] if m.startswith(".") else m[len(prefix):]
             for m in re.findall(r":mod:`~?([\w.]+)`", doc) if m.startswith((".", prefix))}
    present = {p.stem for p in pkg_dir.glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in pkg_dir.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert not present - named, f"kxen_agent/{package} docstring does not name {sorted(present - named)}"
    stale = {m for m in named - present if f"{package}.{m}" not in ANNOUNCED and m != "__main__"}
    assert not stale, f"kxen_agent/{package} docstring names modules that do not exist: {sorted(stale)}"
