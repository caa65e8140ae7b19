"""The one I/O seam: no module of the store but ``fsio`` calls the file system itself.

Issue #12: every operation that touches a file (reads, ``stat``, listings,
``utime``, writes) goes through the store's :class:`~kxen_agent.store.fsio.FileIO`,
so that tracing and fault injection see everything. The check reads the
source (an AST, so comments and docstrings do not count) of every module
under ``kxen_agent/store``; the few seam methods with no other test are
tested here too.
"""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

import kxen_agent.store as store_pkg
from kxen_agent.store.fsio import FileIO, TracingIO

STORE = Path(store_pkg.__file__).parent

#: ``os`` functions that touch a file (or a directory, or a descriptor of one).
OS_FILE_CALLS = {
    "stat", "lstat", "fstat", "listdir", "scandir", "walk", "open", "close", "read", "write", "utime",
    "replace", "rename", "renames", "unlink", "remove", "mkdir", "makedirs", "rmdir", "removedirs", "fsync",
    "fdatasync", "ftruncate", "truncate", "link", "symlink", "readlink", "chmod", "chown", "access",
}
#: ``os.path`` functions that stat a file.
OS_PATH_CALLS = {"exists", "lexists", "isdir", "isfile", "islink", "getsize", "getmtime", "getatime", "getctime",
                 "samefile", "realpath"}


def _file_calls(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue  # a name in an annotation (``-> mmap.mmap``) calls nothing
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "mmap":
            found.append((node.lineno, f"mmap.{f.attr}()"))
        elif isinstance(f, ast.Name) and f.id == "open":
            found.append((node.lineno, "open()"))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os" \
                and f.attr in OS_FILE_CALLS:
            found.append((node.lineno, f"os.{f.attr}()"))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "path" \
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "os" and f.attr in OS_PATH_CALLS:
            found.append((node.lineno, f"os.path.{f.attr}()"))
    return found


def test_the_checker_finds_what_it_looks_for() -> None:
    src = ("import os, mmap\nos.stat(p)\nos.path.isdir(p)\nopen(p)\nmmap.mmap(fd, 0)\nx.open(p)\n# os.walk(p)\n"
           "def f(m: mmap.mmap) -> None: ...\n")
    assert sorted(w for _, w in _file_calls(src)) == ["mmap.mmap()", "open()", "os.path.isdir()", "os.stat()"]


def test_no_module_of_the_store_but_the_seam_calls_the_file_system() -> None:
    offenders = []
    for path in sorted(STORE.rglob("*.py")):
        if path.name == "fsio.py" and path.parent == STORE:
            continue
        for line, what in _file_calls(path.read_text()):
            offenders.append(f"{path.relative_to(STORE.parent.parent)}:{line}: {what}")
    assert offenders == []


# ------------------------------------------------------------------ seam methods


def test_scandir_stops_at_its_limit(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"")
    io = FileIO()
    assert len(io.scandir(str(tmp_path))) == 10
    assert len(io.scandir(str(tmp_path), limit=4)) == 4
    assert len(io.scandir(str(tmp_path), limit=40)) == 10
    assert io.read_count == 3


def test_ensure_file_creates_a_missing_file_once_and_says_so(tmp_path: Path) -> None:
    io = TracingIO(sync=False)
    path = str(tmp_path / "x.lock")
    assert io.ensure_file(path) is True and os.path.getsize(path) == 0
    (tmp_path / "x.lock").write_bytes(b"kept")  # an existing file is left as it is
    assert io.ensure_file(path) is False and (tmp_path / "x.lock").read_bytes() == b"kept"
    assert [(op.kind, op.path) for op in io.trace] == [("create", path)]
    # Reads: is a file there (twice), and is its directory there (only before creating).
    assert io.op_count == 1 and io.read_count == 3 and io.fsyncs == 0


def test_ensure_file_makes_a_missing_directory_durably_first(tmp_path: Path) -> None:
    io = TracingIO(sync=False)
    path = str(tmp_path / "locks" / "ns" / "x.lock")
    assert io.ensure_file(path) is True
    assert [(op.kind, os.path.relpath(op.path, tmp_path)) for op in io.trace] == [
        ("mkdir", "locks"), ("fsync_dir", "."), ("mkdir", "locks/ns"), ("fsync_dir", "locks"),
        ("create", "locks/ns/x.lock")]


def test_lexists_sees_a_dangling_symlink(tmp_path: Path) -> None:
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    io = FileIO()
    assert io.lexists(str(tmp_path / "link")) and not io.exists(str(tmp_path / "link"))
    assert not io.lexists(str(tmp_path / "none"))


def test_a_read_hook_failure_is_raised_before_the_read(tmp_path: Path) -> None:
    io = FileIO()

    def dying(op: str, path: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    io.read_hook = dying
    for call in (io.exists, io.lexists, io.isdir, io.islink, io.listdir, io.scandir, io.stat, io.read):
        with pytest.raises(OSError) as ei:
            call(str(tmp_path))
        assert ei.value.errno == errno.EIO
