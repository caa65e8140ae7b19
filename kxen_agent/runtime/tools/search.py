"""The ``search`` tool: a ripgrep-like content search of the workspace (read-only).

This module owns the search's walk, its filters and its bounds. A call
names a ``pattern`` (a Python regular expression, matched line by line),
a ``path`` (a directory or a file, default the workspace root), an optional
``glob`` on file names, and ``ignore_case``. It answers ``path:line:text``
lines, like ``rg -n``: a directory's files (in name order) before its
subdirectories (in name order), each file's lines in order.

Confinement is the file tools' (:mod:`.files`): ``path`` is resolved with
symlinks followed and refused if it lands outside the workspace or in its
Git internals; the walk then opens directories one component at a time
without following a symlink, never enters a directory named ``.git`` or
one shaped like a Git directory, and never reads a symlink (a link to a
file outside the workspace is not searched; one to a file inside is not
either: the file is searched under its own path). Only regular files are
read, non-blocking.

What Git ignores is skipped when the workspace is in a Git work tree: the
files searched are those ``git ls-files -co --exclude-standard`` lists
(tracked, and untracked but not ignored), run through
:mod:`kxen_agent.session.gitproc` (no fsmonitor, no hooks); elsewhere, or
when that command fails, every file is searched.

Bounds: at most :data:`MAX_RESULTS` matching lines, each shown up to
:data:`MAX_LINE_BYTES` bytes; the output at most the context's output cap;
files larger than ``[policy] max_file_bytes`` and binary files (a NUL byte
in the first :data:`BINARY_PROBE` bytes) skipped; the search stops at
:data:`MAX_SECONDS` (or the tool timeout, if shorter) or when the run is
canceled, reporting what it found so far. Each bound that cut the answer
is said on its last lines, with what to narrow.

It must never write anything nor start a process other than ``git
ls-files``, and never raise for a bad pattern or path: those are error
outcomes the model reads and corrects.

Limitations:

- The pattern is Python's ``re`` syntax, not ripgrep's Rust syntax (the
  common subset is the same); a pattern with catastrophic backtracking on
  one long line can run past the time bound, which is checked between
  lines, not inside one match (lines are matched on their first
  :data:`MAX_MATCH_CHARS` characters to keep that short).
- ``glob`` is :func:`fnmatch.fnmatchcase`: a glob without ``/`` is matched
  against the file's name, one with ``/`` against its workspace-relative
  path, where ``*`` also matches ``/``; no ``{a,b}`` and no ``!``.
- Files of a Git submodule are not searched in a Git workspace (the
  superproject's ``ls-files`` lists the submodule, not its files).
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import time
from typing import Any

from .files import _is_git_dir, _is_git_name, _open_dir, _parts, _Refused, _resolve
from .protocol import BadArguments, ToolContext, ToolOutcome, check_arguments, redact

__all__ = ["BINARY_PROBE", "MAX_LINE_BYTES", "MAX_MATCH_CHARS", "MAX_RESULTS", "MAX_SECONDS", "Search"]

#: Matching lines shown at most; past it the answer says how many more there were.
MAX_RESULTS = 200
#: The longest line shown, in UTF-8 bytes; a longer one is cut and says by how much.
MAX_LINE_BYTES = 400
#: A line is matched on its first this-many characters (a minified file's one line stays cheap).
MAX_MATCH_CHARS = 16_384
#: A NUL in the first this-many bytes makes a file binary (as Git and ripgrep judge it).
BINARY_PROBE = 8192
#: The search's own deadline (the tool timeout when shorter).
MAX_SECONDS = 10.0
#: The longest pattern accepted.
MAX_PATTERN_CHARS = 1000

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: What makes a whole-text match no proof of a line match's absence: \A and \Z (a line's start and end are
#: the text's only once) and negative lookarounds (a newline next to a line may fail them).
_NOT_SCREENABLE = re.compile(r"\\[AZ]|\(\?<?!")
_Patterns = tuple[re.Pattern[str], "re.Pattern[str] | None"]


def _screen(pattern: str, rx: re.Pattern[str]) -> re.Pattern[str] | None:
    """A pattern that matches a whole text whenever ``rx`` matches one of its lines (or None, when the pattern
    has no such form): ``^``/``$`` at every line, the rest as it is; a file it does not match is skipped in one
    pass of the regular expression engine instead of a Python loop over its lines."""
    if _NOT_SCREENABLE.search(pattern):
        return None
    try:
        return re.compile(pattern, rx.flags | re.MULTILINE)
    except re.error:
        return None


def _git_listed(root: str, timeout: float) -> set[str] | None:
    """The workspace-relative paths Git does not ignore, or None outside a work tree (or when git fails)."""
    from kxen_agent.session import gitproc

    try:
        p = gitproc.run(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                        timeout=max(1.0, timeout))
    except (OSError, gitproc.GitTimeout):
        return None
    if p.returncode != 0:
        return None
    return {os.fsdecode(name) for name in p.stdout.split(b"\0") if name}


class _Found:
    """The lines found so far, and every reason the answer is not the whole answer."""

    def __init__(self, cap: int) -> None:
        self.lines: list[str] = []
        self.size = 0
        self.cap = cap
        self.more = 0           # matching lines past MAX_RESULTS or the output cap
        self.files = 0          # files searched
        self.binary = 0
        self.too_big: list[str] = []
        self.unreadable: list[str] = []
        self.stopped: str | None = None

    def add(self, rel: str, lineno: int, line: str) -> None:
        if len(self.lines) >= MAX_RESULTS or self.size >= self.cap:
            self.more += 1
            return
        raw = line.encode("utf-8", errors="replace")
        if len(raw) > MAX_LINE_BYTES:
            line = raw[:MAX_LINE_BYTES].decode("utf-8", errors="ignore") + f" [+{len(raw) - MAX_LINE_BYTES} bytes]"
        shown = f"{rel}:{lineno}:{line}"
        self.lines.append(shown)
        self.size += len(shown.encode("utf-8", errors="replace")) + 1

    def full(self) -> bool:
        return len(self.lines) >= MAX_RESULTS or self.size >= self.cap


class Search:
    name = "search"
    side_effects = False
    description = (
        "Search the contents of workspace files for a regular expression (Python re syntax), line by line, "
        "like ripgrep: answers path:line:text lines. .git and what .gitignore ignores are skipped, "
        "binary files too; the number of results, line length and time are bounded."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The regular expression to find in each line."},
            "path": {"type": "string", "description": "Directory or file to search, relative to the workspace root.",
                     "default": "."},
            "glob": {"type": "string", "description": "Only files whose name (or, with '/', path) matches this glob, "
                     "e.g. '*.py' or 'src/*.ts'.", "default": ""},
            "ignore_case": {"type": "boolean", "description": "Match regardless of case.", "default": False},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        try:
            args = check_arguments(self.name, arguments, self.parameters)
            rx = self._compile(args["pattern"], args["ignore_case"])
            screen = _screen(args["pattern"], rx)
            real = _resolve(args["path"], ctx)
        except BadArguments as e:
            return ToolOutcome(str(e), is_error=True)
        path, glob = args["path"], args["glob"]
        root = os.path.realpath(ctx.workspace)
        deadline = time.monotonic() + min(MAX_SECONDS, ctx.timeout_s)
        found = _Found(ctx.output_cap)
        listed = _git_listed(root, deadline - time.monotonic())
        parts = _parts(real, root)
        prefix = "/".join(parts) + "/"
        if listed is not None and parts and not any(p.startswith(prefix) for p in listed):
            listed = None  # a directory Git ignores as a whole, named outright: searched (as rg does)
        try:
            try:
                with _open_dir(root, parts, path) as dfd:
                    self._walk(dfd, "/".join(parts), (rx, screen), glob, listed, found, ctx, deadline)
            except NotADirectoryError:
                if not parts:
                    raise
                with _open_dir(root, parts[:-1], path) as dfd:
                    # A file named outright is searched even if Git ignores it (as rg does).
                    self._file(dfd, parts[-1], "/".join(parts), (rx, screen), found, ctx, deadline)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except FileNotFoundError:
            return ToolOutcome(f"search: no such file or directory '{path}'; use list_files to see what exists",
                               is_error=True)
        except OSError as e:
            return ToolOutcome(f"search: cannot read '{path}': {e.strerror or e}", is_error=True)
        return ToolOutcome(redact(self._answer(found, args), ctx.secret_values()), is_error=False)

    @staticmethod
    def _compile(pattern: str, ignore_case: bool) -> re.Pattern[str]:
        if not pattern:
            raise BadArguments("search: 'pattern' must not be empty")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise BadArguments(f"search: 'pattern' is {len(pattern)} characters, over {MAX_PATTERN_CHARS}; "
                               "search for a shorter part of the text")
        try:
            return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        except (re.error, RecursionError, OverflowError) as e:
            where = f" at position {e.pos}" if isinstance(e, re.error) and e.pos is not None else ""
            msg = e.msg if isinstance(e, re.error) else str(e) or type(e).__name__
            raise BadArguments(f"search: invalid regular expression {pattern!r}: {msg}{where}; "
                               "escape special characters (\\. \\( \\[) to match them literally") from None

    def _walk(self, dfd: int, rel_top: str, rx: _Patterns, glob: str, listed: set[str] | None,
              found: _Found, ctx: ToolContext, deadline: float) -> None:
        walk = os.fwalk(".", dir_fd=dfd, follow_symlinks=False)
        try:
            for dirpath, dirnames, filenames, dirfd in walk:
                dirnames[:] = sorted(d for d in dirnames if not _is_git_name(d) and not _is_git_dir(dirfd, d))
                rel_dir = os.path.normpath(os.path.join(rel_top, dirpath)) if rel_top else os.path.normpath(dirpath)
                for name in sorted(filenames):
                    if _is_git_name(name):
                        continue
                    rel = name if rel_dir == os.curdir else f"{rel_dir}/{name}"
                    if listed is not None and rel not in listed:
                        continue
                    if glob and not fnmatch.fnmatchcase(rel if "/" in glob else name, glob):
                        continue
                    if self._stop(found, ctx, deadline) or found.more > 10_000:
                        return
                    self._file(dirfd, name, rel, rx, found, ctx, deadline)
        finally:
            walk.close()

    @staticmethod
    def _stop(found: _Found, ctx: ToolContext, deadline: float) -> bool:
        if found.stopped is None:
            if ctx.cancel.is_set():
                found.stopped = "cancel"
            elif time.monotonic() > deadline:
                found.stopped = "time"
        return found.stopped is not None

    def _file(self, dfd: int, name: str, rel: str, patterns: _Patterns, found: _Found, ctx: ToolContext,
              deadline: float) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return  # symlinks are never followed; FIFOs, sockets and devices never read
            if st.st_size > ctx.max_file_bytes:
                found.too_big.append(rel)
                return
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
            with os.fdopen(fd, "rb") as f:
                now = os.fstat(f.fileno())
                if not stat.S_ISREG(now.st_mode):
                    return
                data = f.read(ctx.max_file_bytes + 1)
        except OSError:
            found.unreadable.append(rel)
            return
        if len(data) > ctx.max_file_bytes:
            found.too_big.append(rel)
            return
        if b"\0" in data[:BINARY_PROBE]:
            found.binary += 1
            return
        found.files += 1
        text = data.decode("utf-8", errors="replace")
        rx, screen = patterns
        if screen is not None and not screen.search(text):
            return  # one pass over the whole file proves no line matches
        for lineno, line in enumerate(text.split("\n"), 1):
            if lineno % 4096 == 0 and self._stop(found, ctx, deadline):
                return
            if rx.search(line, 0, MAX_MATCH_CHARS):
                found.add(rel, lineno, line.rstrip("\r"))
                if found.full() and found.more > 10_000:
                    return  # enough counted: the answer says "more than"

    @staticmethod
    def _answer(found: _Found, args: dict[str, Any]) -> str:
        lines = list(found.lines)
        where = f"'{args['path']}'" + (f" (glob {args['glob']!r})" if args["glob"] else "")
        if not lines:
            lines.append(f"no match for {args['pattern']!r} in {where}: {found.files} file(s) searched")
        if found.more:
            lines.append(f"[{found.more}{'+' if found.more > 10_000 else ''} more matching line(s) not shown "
                         f"(at most {MAX_RESULTS} lines, {found.cap} bytes); narrow the pattern, path or glob]")
        if found.stopped == "time":
            lines.append(f"[search stopped at its time limit after {found.files} file(s); results are partial: "
                         "search a subdirectory or use a glob]")
        elif found.stopped == "cancel":
            lines.append("[search canceled; results are partial]")
        if found.binary:
            lines.append(f"[{found.binary} binary file(s) skipped]")
        if found.too_big:
            lines.append(f"[{len(found.too_big)} file(s) over [policy] max_file_bytes skipped: "
                         f"{', '.join(found.too_big[:5])}{' ...' if len(found.too_big) > 5 else ''}]")
        if found.unreadable:
            lines.append(f"[could not read: {', '.join(found.unreadable[:5])}"
                         f"{' ...' if len(found.unreadable) > 5 else ''}]")
        return "\n".join(lines)
