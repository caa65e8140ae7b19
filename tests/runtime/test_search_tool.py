"""The ``search`` tool: matches, confinement, Git internals, .gitignore, bounds, bad patterns.

Real files in a tmp workspace (one Git workspace built once per module for
the cases that read; the cases that plant something build their own).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kxen_agent.runtime.runner import Runner
from kxen_agent.runtime.tools import TOOLS, ToolContext
from kxen_agent.runtime.tools.search import MAX_LINE_BYTES, MAX_RESULTS
from kxen_agent.session.agent_def import default_agent_definition, lock_version_for, parse_agent_definition
from kxen_agent.session.schema import check
from kxen_agent.store.memory import MemoryStore
from kxen_agent.store.objects import SchemaViolation

from tests.helpers import git, git_workspace

search = TOOLS["search"]


def ctx(ws: Path, **kw) -> ToolContext:
    kw.setdefault("timeout_s", 20.0)
    return ToolContext(workspace=str(ws), cancel_window_s=1.0, cancel=threading.Event(), secret_env_names=(), **kw)


def run(ws: Path, **arguments) -> tuple[str, bool]:
    out = search.run(arguments, ctx(ws))
    return out.output, out.is_error


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("search"))) / "ws"
    git_workspace(root, {
        "README.md": "# Demo\nneedle in the readme\n",
        "src/app.py": "import os\n\ndef needle():\n    return 'Needle'\n",
        "src/util.ts": "export const needle = 1;\n",
        ".gitignore": "build/\n*.log\n",
    })
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("needle built\n")
    (root / "debug.log").write_text("needle logged\n")
    (root / "untracked.txt").write_text("needle untracked\n")
    (root / "blob.bin").write_bytes(b"needle\0binary\n")
    # Git internals: the repository's own, and a nested one shaped like a Git directory.
    with open(root / ".git" / "config", "a") as f:
        f.write("# needle in the git config\n")
    nested = root / "vendor" / "inner"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    (nested / ".git" / "description").write_text("needle in a nested git dir\n")
    return root


def test_matches_are_path_line_text_sorted(repo: Path) -> None:
    out, err = run(repo, pattern="needle")
    assert not err
    assert out.splitlines() == [
        "README.md:2:needle in the readme",
        "untracked.txt:1:needle untracked",  # a directory's files, then its subdirectories
        "src/app.py:3:def needle():",
        "src/util.ts:1:export const needle = 1;",
        "[1 binary file(s) skipped]",
    ]


def test_git_internals_and_ignored_files_are_never_read(repo: Path) -> None:
    out, _ = run(repo, pattern="needle|gitdir|repositoryformatversion")
    assert ".git" not in out and "config" not in out and "nested" not in out
    assert "build/" not in out and "debug.log" not in out  # .gitignore'd
    for path in (".git", ".git/config", "vendor/inner/.git", "src/../.git/config"):
        text, err = run(repo, pattern="needle", path=path)
        assert err and "Git internals" in text, (path, text)
    # An ignored directory named outright is searched (as rg does); so is an ignored file.
    assert run(repo, pattern="needle", path="build")[0] == "build/out.py:1:needle built"
    assert run(repo, pattern="needle", path="debug.log")[0] == "debug.log:1:needle logged"


def test_glob_path_and_ignore_case(repo: Path) -> None:
    assert run(repo, pattern="needle", glob="*.py")[0] == "src/app.py:3:def needle():"
    assert run(repo, pattern="needle", glob="src/*.ts")[0] == "src/util.ts:1:export const needle = 1;"
    out, _ = run(repo, pattern="NEEDLE", path="src", ignore_case=True)
    assert out.splitlines() == ["src/app.py:3:def needle():", "src/app.py:4:    return 'Needle'",
                                "src/util.ts:1:export const needle = 1;"]
    # Anchors hold per line; \\A and a negative lookbehind too (those skip the whole-file screen).
    assert run(repo, pattern="^def needle", path="src")[0] == "src/app.py:3:def needle():"
    assert run(repo, pattern=r"\Adef needle", path="src")[0] == "src/app.py:3:def needle():"
    assert run(repo, pattern=r"(?<!x)needle\(", path="src")[0] == "src/app.py:3:def needle():"
    out, err = run(repo, pattern="absent-word", glob="*.md")
    assert not err and out.startswith("no match for 'absent-word' in '.' (glob '*.md'): 1 file(s) searched")


@pytest.mark.parametrize("pattern, why", [("(", "missing ), unterminated subpattern at position 0"),
                                          ("a{2,1}", "min repeat greater than max repeat at position 2"),
                                          ("", "must not be empty")])
def test_bad_pattern_is_a_tool_error(repo: Path, pattern: str, why: str) -> None:
    out, err = run(repo, pattern=pattern)
    assert err and why in out, out
    out, err = run(repo, pattern="x", nope=1)
    assert err and "unknown argument(s) nope" in out


def test_confined_to_the_workspace(tmp_path: Path) -> None:
    ws = Path(os.path.realpath(tmp_path)) / "ws"
    outside = Path(os.path.realpath(tmp_path)) / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("needle outside\n")
    (ws / "inside.txt").write_text("needle inside\n")
    os.symlink(outside, ws / "link-dir")
    os.symlink(outside / "secret.txt", ws / "link-file.txt")
    os.symlink(ws / "inside.txt", ws / "link-inside.txt")
    out, err = run(ws, pattern="needle")
    assert not err and out == "inside.txt:1:needle inside"  # no symlink followed, in or out
    for path in ("..", "../outside", str(outside), "link-dir", "link-file.txt"):
        text, err = run(ws, pattern="needle", path=path)
        assert err and "escapes the workspace" in text, (path, text)
    text, err = run(ws, pattern="needle", path="missing")
    assert err and "no such file or directory 'missing'" in text


def test_bounds(tmp_path: Path) -> None:
    ws = Path(os.path.realpath(tmp_path))
    (ws / "many.txt").write_text("hit\n" * (MAX_RESULTS + 50))
    (ws / "long.txt").write_text("hit " + "x" * 5000 + "\n")
    (ws / "big.txt").write_text("hit\n" * 1000)
    out = search.run({"pattern": "hit", "glob": "many.txt"}, ctx(ws)).output.splitlines()
    assert len(out) == MAX_RESULTS + 1 and out[-1].startswith("[50 more matching line(s) not shown")
    [line] = search.run({"pattern": "hit", "glob": "long.txt"}, ctx(ws)).output.splitlines()
    assert line.endswith(f" [+{5004 - MAX_LINE_BYTES} bytes]") and len(line) < MAX_LINE_BYTES + 40
    out = search.run({"pattern": "hit", "glob": "big.txt"}, ctx(ws, max_file_bytes=1024)).output
    assert "[1 file(s) over [policy] max_file_bytes skipped: big.txt]" in out
    out = search.run({"pattern": "hit"}, ctx(ws, output_cap=100)).output.splitlines()
    assert 1 < len(out) < 10 and "more matching line(s) not shown" in out[-1]
    # The time bound (here: the tool timeout, already past) stops the walk and says the answer is partial.
    out = search.run({"pattern": "hit"}, ctx(ws, timeout_s=0.0)).output
    assert out.splitlines()[-1].startswith("[search stopped at its time limit after 0 file(s)")


def test_lock_and_run(tmp_path: Path) -> None:
    """A definition naming search makes a version-6 lock; a run calls it, a bad pattern is the model's error."""
    (tmp_path / "s.json").write_text('[{"tool_calls": [{"name": "search", "arguments": {"pattern": "("}}, '
                                     '{"name": "search", "arguments": {"pattern": "ne+dle"}}]}, {"content": "done"}]')
    lock = parse_agent_definition('name = "s"\nprovider = "script"\nscript = "s.json"\ntools = ["search"]\n',
                                  str(tmp_path), "inline")
    assert lock["version"] == 6 and lock["tools"] == ["search"] and lock_version_for({}) == 3
    with pytest.raises(SchemaViolation, match="tool 'search' needs a version-6 lock"):
        check("agent", {**lock, "version": 5})
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("needle\n")
    r = Runner(MemoryStore("search"))
    res = r.start(str(ws), "find it", lock)
    assert res.status == "completed"
    info = r.sessions.get(res.session)
    ops = list(r.ops(r.run_state(info, res.run)[1]).values())
    assert [(e["tool"], e["isError"], e["sideEffects"]) for e in ops] == [("search", True, False),
                                                                          ("search", False, False)]
    assert "invalid regular expression" in r.entry_output(ops[0])
    assert r.entry_output(ops[1]) == "a.txt:1:needle"
    assert default_agent_definition([{"content": "x"}])["tools"] == ["shell", "read_file", "write_file",
                                                                      "edit_file", "list_files"]


class Crash(BaseException):
    """The process "dies" at a fault point: nothing in the runner catches it, as nothing catches a SIGKILL."""


def test_a_search_interrupted_after_started_is_run_again_on_resume(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('[{"tool_calls": [{"name": "search", "arguments": {"pattern": "payload"}}]}, '
                                     '{"content": "done"}]')
    lock = parse_agent_definition('name = "s"\nprovider = "script"\nscript = "s.json"\ntools = ["search"]\n',
                                  str(tmp_path), "inline")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.txt").write_text("payload-42\n")
    store = MemoryStore("search-crash")

    def crash(point: str) -> None:
        if point == "tool:after-started":
            raise Crash(point)

    with pytest.raises(Crash):
        Runner(store, fault=crash).start(str(ws), "find", lock)
    r = Runner(store, fault=lambda p: None)
    [info] = r.sessions.list()
    [run_id] = info.runs
    [op] = r.ops(r.run_state(info, run_id)[1]).values()
    assert (op["tool"], op["state"], op["sideEffects"]) == ("search", "Started", False)
    res = r.resume(info.id)
    assert (res.status, res.unknown_ops) == ("completed", [])
    [done] = r.ops(r.run_state(r.sessions.get(info.id), run_id)[1]).values()
    assert (done["op"], done["state"], r.entry_output(done)) == (op["op"], "Settled", "data.txt:1:payload-42")
