"""The file tools: ``read_file``, ``write_file``, ``edit_file``, ``list_files``.

This module owns confinement of a tool's path to the workspace (a path is
resolved with symlinks followed and refused if it lands outside), the
workspace's Git internals kept out of reach, atomic replacement of a file's
content (temp file, fsync, rename, fsync of the directory: a crash leaves
the old file or the new one), and the four tools' behaviour and messages.

Git internals: a path whose resolved form goes through a directory named
``.git`` (any case, as Git itself refuses on case-insensitive disks), names
a ``.git`` file (a submodule's or worktree's link to its Git directory), or
goes through any directory that *is* a Git directory (``HEAD`` with
``objects`` and ``refs``, or a worktree's ``commondir``: a separate,
submodule's or worktree's Git directory, a bare repository) is refused:
Git runs programs that ``config`` and ``hooks/`` name
(``core.fsmonitor``, a hook), so a file tool writing there would get past
``approve = ["shell"]``. :class:`GitInternalsWatch` tells a run whether
``config`` or ``hooks/`` of its workspace's repository changed meanwhile
(by the ``shell`` tool, say).

Only regular files are read or replaced (a FIFO would block, a device never
end): the kind is checked before anything is opened, and files are opened
non-blocking. ``edit_file`` reads and ``write_file`` writes at most
:attr:`~.protocol.ToolContext.max_file_bytes` (``[policy] max_file_bytes``,
default 8 MiB); ``read_file`` reads at most its output cap.

After resolution, a path is opened one component at a time from the
workspace's directory, never following a symlink: a directory swapped for a
symlink (or a file) between the resolution and the use is a tool error
naming the path, never a write elsewhere.

It must never run a process (that is :mod:`.shell`) nor raise for a bad path
or a file-system error: a refused path, a missing file or an ``OSError`` is a
:class:`~.protocol.ToolOutcome` with ``is_error`` set, which the model can
read and correct.

Limitations:

- A directory already opened is used even if it is then *moved* elsewhere
  (a rename, not a swap): the file lands in that directory wherever it now
  is. Tools run one at a time and ``shell`` leaves no process of its group
  behind, which keeps that window closed in practice, not in principle.
- A Git directory nested deeper than the path being listed is recognised
  by its name or its shape; one that looks like neither (a corrupt one)
  is listed like any directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from typing import Any

from .protocol import BadArguments, Tool, ToolContext, ToolOutcome, check_arguments, redact

__all__ = ["DEFAULT_MAX_FILE_BYTES", "EditFile", "GitInternalsWatch", "LIST_FILES_MAX_ENTRIES", "ListFiles",
           "ReadFile", "WriteFile"]

LIST_FILES_MAX_ENTRIES = 2000
#: ``[policy] max_file_bytes`` when a lock sets none: the largest file edit_file reads and write_file writes.
DEFAULT_MAX_FILE_BYTES = 8 << 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused(Exception):
    """A path the tool will not use; the message is the tool's error output."""


# --- paths -------------------------------------------------------------------


def _resolve(path: str, ctx: ToolContext) -> str:
    """The realpath of ``path`` (relative to the workspace), refused if outside it."""
    root = os.path.realpath(ctx.workspace)
    if "\x00" in path:
        raise BadArguments(f"path {path!r} contains a NUL byte")
    joined = path if os.path.isabs(path) else os.path.join(root, path)
    # realpath follows symlinks, so a link inside pointing outside is caught too.
    real = os.path.realpath(joined)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise BadArguments(
            f"path '{path}' escapes the workspace '{root}'; use a path inside it"
        )
    _refuse_git_name(path, _parts(real, root))
    return real


def _parts(real: str, root: str) -> list[str]:
    rel = os.path.relpath(real, root)
    return [] if rel == os.curdir else rel.split(os.sep)


def _is_git_name(name: str) -> bool:
    # ".GIT", ".git." and ".git " are the same directory on the disks Git protects (its core.protectNTFS/HFS).
    folded = name.rstrip(". ").casefold()
    return folded in (".git", "git~1")


def _git_refusal(path: str, where: str) -> str:
    return (f"'{path}' is in the repository's Git internals ('{where}'); the file tools never read or write "
            "them (Git runs programs its config and hooks name); use git commands through the shell tool instead")


def _refuse_git_name(path: str, parts: list[str]) -> None:
    for i, name in enumerate(parts):
        if _is_git_name(name):
            raise BadArguments(_git_refusal(path, "/".join(parts[: i + 1])))


def _is_git_dir(dir_fd: int, name: str = ".") -> bool:
    """Whether ``name`` (in ``dir_fd``) looks like a Git directory to Git (its ``is_git_directory``)."""
    def kind(entry: str) -> int | None:
        try:
            return os.stat(os.path.join(name, entry), dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return None

    head = kind("HEAD")
    if head is None or not (stat.S_ISREG(head) or stat.S_ISLNK(head)):
        return False
    common = kind("commondir")
    if common is not None and stat.S_ISREG(common):
        return True
    objects, refs = kind("objects"), kind("refs")
    return objects is not None and refs is not None and stat.S_ISDIR(objects) and stat.S_ISDIR(refs)


def _changed(path: str, where: str) -> _Refused:
    return _Refused(f"path '{path}' changed while the tool was using it: '{where}' is no longer the directory it "
                    "resolved to (a symlink or another file took its place); nothing was done; look again with "
                    "list_files and retry")


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _open_dir(root: str, parts: list[str], path: str, *, create: bool = False) -> Iterator[int]:
    """An fd of the directory ``root/parts...``, opened one component at a time without following symlinks.

    Each directory on the way is refused if it is a Git directory; with
    ``create``, missing ones are made. ``FileNotFoundError`` when one is
    missing and ``create`` is false.
    """
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        for i, name in enumerate(parts):
            shown = "/".join(parts[: i + 1])
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_symlink(fd, name)):
                        raise _changed(path, shown) from None
                    raise
            except OSError as e:
                # A symlink here now: resolution found none, so it appeared since. (A file where a
                # directory is needed is the caller's "not a directory".)
                if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_symlink(fd, name)):
                    raise _changed(path, shown) from None
                raise
            os.close(fd)
            fd = nfd
            if _is_git_dir(fd):
                raise _Refused(_git_refusal(path, shown))
        yield fd
    finally:
        os.close(fd)


def _path_arguments(tool: Tool, arguments: object, ctx: ToolContext) -> tuple[dict[str, Any], str] | ToolOutcome:
    """The file tools' common first step: checked arguments and the confined
    real path of ``arguments["path"]``, or the error outcome to return."""
    try:
        args = check_arguments(tool.name, arguments, tool.parameters)
        return args, _resolve(args["path"], ctx)
    except BadArguments as e:
        return ToolOutcome(str(e), is_error=True)


def _display(real: str, ctx: ToolContext) -> str:
    rel = os.path.relpath(real, os.path.realpath(ctx.workspace))
    return "." if rel == os.curdir else rel


def _not_regular(path: str, mode: int, tool: str) -> str:
    what = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")
    if stat.S_ISDIR(mode):
        return f"'{path}' is a directory; {tool} needs a file path" + ("" if tool != "read_file"
                                                                       else " (list_files shows its entries)")
    return f"'{path}' is {what}, not a regular file; {tool} works on regular files only"


def _read_regular(real: str, ctx: ToolContext, path: str, tool: str, limit: int) -> tuple[bytes, int]:
    """(at most ``limit`` bytes of the regular file ``real``, its size); raises _Refused or OSError."""
    parts = _parts(real, os.path.realpath(ctx.workspace))
    if not parts:
        raise _Refused(_not_regular(path, stat.S_IFDIR, tool))
    with _open_dir(os.path.realpath(ctx.workspace), parts[:-1], path) as dfd:
        leaf = parts[-1]
        st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _changed(path, "/".join(parts))
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(_not_regular(path, st.st_mode, tool))
        # Non-blocking: had a FIFO taken the file's place since the stat, opening it must not wait for a writer.
        fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        with os.fdopen(fd, "rb") as f:
            now = os.fstat(f.fileno())
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
                raise _changed(path, "/".join(parts))
            return f.read(limit), now.st_size


def _atomic_write(real: str, data: bytes, ctx: ToolContext, path: str, tool: str) -> None:
    """Write ``data`` to ``real`` via a temp file in the same directory + rename + fsync of the directory,
    so a crash leaves either the old file or the new one, never half of one."""
    root = os.path.realpath(ctx.workspace)
    parts = _parts(real, root)
    if not parts:
        raise _Refused(_not_regular(path, stat.S_IFDIR, tool))
    with _open_dir(root, parts[:-1], path, create=True) as dfd:
        leaf = parts[-1]
        try:
            st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise _changed(path, "/".join(parts))
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _Refused(_not_regular(path, st.st_mode, tool))
        tmp = f".{leaf}.kxen-{uuid.uuid4().hex}.tmp"[-255:]
        # 0o666 through the umask: a new file gets the mode any editor would give it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if st is not None:
                    os.fchmod(f.fileno(), st.st_mode & 0o7777)
                os.fsync(f.fileno())
            os.replace(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        os.fsync(dfd)


def _os_error(action: str, path: str, exc: OSError) -> ToolOutcome:
    return ToolOutcome(f"cannot {action} '{path}': {exc.strerror or exc}", is_error=True)


def _too_big(path: str, size: int, limit: int, tool: str) -> ToolOutcome:
    return ToolOutcome(f"'{path}' is {size} bytes, over the {limit}-byte limit of {tool} ([policy] max_file_bytes); "
                       "work on it with the shell tool (sed, head) or split it", is_error=True)


# --- file tools --------------------------------------------------------------


class ReadFile:
    name = "read_file"
    side_effects = False
    description = "Read a text file in the workspace. Output is capped; longer files are truncated with a note."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "File path, relative to the workspace root."}},
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        cap = min(ctx.output_cap, ctx.max_file_bytes)
        try:
            # One byte past the cap is enough to know we truncated; the size tells how much.
            data, size = _read_regular(real, ctx, path, self.name, cap + 1)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use list_files to see what exists", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
        text = data[:cap].decode("utf-8", errors="replace")
        if len(data) > cap:
            text += f"\n[output truncated: {max(size, len(data)) - cap} bytes omitted]"
        return ToolOutcome(redact(text, ctx.secret_values()), is_error=False)


class WriteFile:
    name = "write_file"
    side_effects = True
    description = "Create or overwrite a file in the workspace with the given content; parent directories are created."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        try:
            data = args["content"].encode("utf-8")
        except UnicodeEncodeError:
            return ToolOutcome("write_file: 'content' is not valid Unicode text (a lone surrogate); "
                               "send UTF-8 text", is_error=True)
        if len(data) > ctx.max_file_bytes:
            return _too_big(path, len(data), ctx.max_file_bytes, self.name)
        try:
            _atomic_write(real, data, ctx, path, self.name)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except OSError as e:
            return _os_error("write", path, e)
        return ToolOutcome(f"wrote {len(data)} bytes to '{_display(real, ctx)}'", is_error=False)


class EditFile:
    name = "edit_file"
    side_effects = True
    description = (
        "Replace exactly one occurrence of the string 'old' with 'new' in a workspace file. "
        "'old' must occur exactly once; include surrounding lines to make it unique."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "old": {"type": "string", "description": "The exact text to replace; must occur exactly once."},
            "new": {"type": "string", "description": "The replacement text."},
        },
        "required": ["path", "old", "new"],
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path, old, new = args["path"], args["old"], args["new"]
        if not old:
            return ToolOutcome("edit_file: 'old' must not be empty; use write_file to create a file", is_error=True)
        limit = ctx.max_file_bytes
        try:
            raw, size = _read_regular(real, ctx, path, self.name, limit + 1)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use write_file to create it", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
        if len(raw) > limit:
            return _too_big(path, max(size, len(raw)), limit, self.name)
        try:
            # Bytes in, bytes out: line endings stay exactly as they were.
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return ToolOutcome(f"'{path}' is not UTF-8 text; edit_file cannot edit it", is_error=True)
        count = text.count(old)
        if count != 1:
            hint = "check the exact text with read_file" if count == 0 else "include more surrounding text to make it unique"
            return ToolOutcome(
                f"edit_file: 'old' must occur exactly once in '{path}', found {count} times; {hint}",
                is_error=True,
            )
        try:
            data = text.replace(old, new, 1).encode("utf-8")
        except UnicodeEncodeError:
            return ToolOutcome("edit_file: 'new' is not valid Unicode text (a lone surrogate); send UTF-8 text",
                               is_error=True)
        if len(data) > limit:
            return _too_big(path, len(data), limit, self.name)
        try:
            _atomic_write(real, data, ctx, path, self.name)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except OSError as e:
            return _os_error("write", path, e)
        return ToolOutcome(f"edited '{_display(real, ctx)}': replaced 1 occurrence", is_error=False)


class ListFiles:
    name = "list_files"
    side_effects = False
    description = (
        "List files and directories under a workspace directory, recursively, sorted; "
        "directories end with '/', .git is skipped, symlinks are listed but not followed."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory, relative to the workspace root.", "default": "."}
        },
        "additionalProperties": False,
    }

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        checked = _path_arguments(self, arguments, ctx)
        if isinstance(checked, ToolOutcome):
            return checked
        args, real = checked
        path = args["path"]
        root = os.path.realpath(ctx.workspace)
        try:
            with _open_dir(root, _parts(real, root), path) as dfd:
                return self._list(dfd, real, root)
        except _Refused as e:
            return ToolOutcome(str(e), is_error=True)
        except (FileNotFoundError, NotADirectoryError):
            what = "not a directory" if os.path.lexists(real) else "no such directory"
            return ToolOutcome(f"list_files: '{path}' is {what}; give a directory path", is_error=True)
        except OSError as e:
            return _os_error("list", path, e)

    @staticmethod
    def _list(dfd: int, real: str, root: str) -> ToolOutcome:
        entries: list[str] = []
        truncated = False
        errors: list[str] = []
        # Entries are workspace-relative, so the model can pass them straight to the other tools.
        rel_top = os.path.relpath(real, root)
        walk = os.fwalk(".", dir_fd=dfd, follow_symlinks=False,
                        onerror=lambda e: errors.append(os.path.normpath(os.path.join(rel_top, str(e.filename)))))
        for dirpath, dirnames, filenames, dirfd in walk:
            dirnames[:] = sorted(d for d in dirnames if not _is_git_name(d) and not _is_git_dir(dirfd, d))
            rel_dir = os.path.normpath(os.path.join(rel_top, dirpath))
            names = [(d, True) for d in dirnames] + [(f, False) for f in filenames if not _is_git_name(f)]
            for name, is_dir in sorted(names):
                rel = name if rel_dir == os.curdir else os.path.join(rel_dir, name)
                entries.append(rel + "/" if is_dir else rel)
            if len(entries) > LIST_FILES_MAX_ENTRIES:
                truncated = True
                break
        walk.close()
        entries.sort()
        lines = entries[:LIST_FILES_MAX_ENTRIES]
        if truncated:
            lines.append(f"[listing truncated at {LIST_FILES_MAX_ENTRIES} entries; list a subdirectory]")
        if errors:
            lines.append(f"[could not read: {', '.join(errors)}]")
        if not entries:
            lines.append("[empty directory]")
        return ToolOutcome("\n".join(lines), is_error=False)


# --- the repository's Git internals, watched over a run ------------------------------------


def _git_dirs(workspace: str) -> list[str]:
    """The Git directory of the repository ``workspace`` is in, and its common directory (a worktree's)."""
    d = os.path.realpath(workspace)
    while True:
        dot = os.path.join(d, ".git")
        if os.path.isdir(dot):
            git_dir = dot
            break
        if os.path.isfile(dot):
            try:
                with open(dot, "rb") as f:
                    line = f.read(4096).split(b"\n", 1)[0].decode("utf-8", "surrogateescape").strip()
            except OSError:
                return []
            if not line.startswith("gitdir:"):
                return []
            git_dir = os.path.join(d, line[len("gitdir:"):].strip())
            break
        parent = os.path.dirname(d)
        if parent == d:
            return []
        d = parent
    dirs = [os.path.realpath(git_dir)]
    try:
        with open(os.path.join(git_dir, "commondir"), "rb") as f:
            common = f.read(4096).decode("utf-8", "surrogateescape").strip()
        dirs.append(os.path.realpath(os.path.join(git_dir, common)))
    except OSError:
        pass
    return dirs


def _fingerprint(path: str) -> str | None:
    """What a file or a symlink is: kind, mode and content (or target); None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    h = hashlib.sha256(f"{stat.S_IFMT(st.st_mode)}:{st.st_mode & 0o7777}:".encode())
    if stat.S_ISLNK(st.st_mode):
        h.update(os.fsencode(os.readlink(path)))
    elif stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                h.update(f.read(DEFAULT_MAX_FILE_BYTES))
        except OSError:
            h.update(b"?")
    return h.hexdigest()


class GitInternalsWatch:
    """``config`` and ``hooks/`` of a workspace's repository, as they were when made.

    :meth:`changes` names what differs now: a run reports it at its end
    (Git runs programs those name, ``core.fsmonitor`` in the next
    ``git status`` for one).
    """

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.before = self._snapshot()

    def _snapshot(self) -> dict[str, str | None]:
        shot: dict[str, str | None] = {}
        try:
            dirs = _git_dirs(self.workspace)
        except OSError:
            return shot
        for i, d in enumerate(dirs):
            for name in ("config", "config.worktree"):
                shot[os.path.join(d, name)] = _fingerprint(os.path.join(d, name))
            if i == len(dirs) - 1:  # hooks live in the common directory
                hooks = os.path.join(d, "hooks")
                shot[hooks] = _fingerprint(hooks)
                try:
                    names = sorted(os.listdir(hooks))
                except OSError:
                    names = []
                for n in names[:256]:
                    shot[os.path.join(hooks, n)] = _fingerprint(os.path.join(hooks, n))
        return shot

    def changes(self) -> list[str]:
        """The paths (``.git/config``, ``.git/hooks/pre-commit``...) added, removed or changed since."""
        after = self._snapshot()
        changed = [p for p in sorted(set(self.before) | set(after)) if self.before.get(p) != after.get(p)]
        return [self._shown(p) for p in changed]

    def _shown(self, path: str) -> str:
        rel = os.path.relpath(path, os.path.realpath(self.workspace))
        return path if rel.startswith(os.pardir) else rel
