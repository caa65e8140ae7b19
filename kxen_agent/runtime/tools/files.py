"""The file tools: ``read_file``, ``write_file``, ``edit_file``, ``list_files``.

This module owns confinement of a tool's path to the workspace (a path is
resolved with symlinks followed and refused if it lands outside), atomic
replacement of a file's content (temp file, fsync, rename: a crash leaves the
old file or the new one), and the four tools' behaviour and messages.

It must never run a process (that is :mod:`.shell`) nor raise for a bad path
or a file-system error: a refused path, a missing file or an ``OSError`` is a
:class:`~.protocol.ToolOutcome` with ``is_error`` set, which the model can
read and correct.

Limitations:

- Confinement resolves a path once, then uses it; a process that swaps a
  directory for a symlink between the check and the use (e.g. a background
  ``shell`` command) can win that race. Tools run one at a time and ``shell``
  leaves no process of its group behind, which keeps that window closed in
  practice, not in principle.
"""

from __future__ import annotations

import os
import stat
import uuid
from typing import Any

from .protocol import BadArguments, Tool, ToolContext, ToolOutcome, check_arguments, redact

__all__ = ["EditFile", "LIST_FILES_MAX_ENTRIES", "ListFiles", "ReadFile", "WriteFile"]

LIST_FILES_MAX_ENTRIES = 2000


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
    return real


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


def _atomic_write(real: str, data: bytes) -> None:
    """Write ``data`` to ``real`` via a temp file in the same directory + os.replace,
    so a crash leaves either the old file or the new one, never half of one."""
    directory, base = os.path.split(real)
    tmp = os.path.join(directory, f".{base}.kxen-{uuid.uuid4().hex}.tmp")
    # 0o666 through the umask: a new file gets the mode any editor would give it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, os.stat(real).st_mode & 0o7777)
        except FileNotFoundError:
            pass
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _os_error(action: str, path: str, exc: OSError) -> ToolOutcome:
    return ToolOutcome(f"cannot {action} '{path}': {exc.strerror or exc}", is_error=True)


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
        if os.path.isdir(real):
            return ToolOutcome(f"'{path}' is a directory; use list_files to see its entries", is_error=True)
        if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
            # A FIFO or device would block or never end.
            return ToolOutcome(f"'{path}' is not a regular file; read_file reads files only", is_error=True)
        try:
            with open(real, "rb") as f:
                # One byte past the cap is enough to know we truncated; the
                # size tells how much.
                data = f.read(ctx.output_cap + 1)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use list_files to see what exists", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
        text = data[: ctx.output_cap].decode("utf-8", errors="replace")
        if len(data) > ctx.output_cap:
            text += f"\n[output truncated: {max(size, len(data)) - ctx.output_cap} bytes omitted]"
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
        if os.path.isdir(real):
            return ToolOutcome(f"'{path}' is a directory; write_file needs a file path", is_error=True)
        data = args["content"].encode("utf-8")
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            _atomic_write(real, data)
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
        try:
            with open(real, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return ToolOutcome(f"no such file '{path}'; use write_file to create it", is_error=True)
        except IsADirectoryError:
            return ToolOutcome(f"'{path}' is a directory; edit_file needs a file path", is_error=True)
        except OSError as e:
            return _os_error("read", path, e)
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
            _atomic_write(real, text.replace(old, new, 1).encode("utf-8"))
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
        if not os.path.isdir(real):
            what = "not a directory" if os.path.exists(real) else "no such directory"
            return ToolOutcome(f"list_files: '{path}' is {what}; give a directory path", is_error=True)
        root = os.path.realpath(ctx.workspace)
        entries: list[str] = []
        truncated = False
        errors: list[str] = []
        # Entries are workspace-relative, so the model can pass them straight
        # to the other tools.
        for dirpath, dirnames, filenames in os.walk(real, onerror=lambda e: errors.append(str(e.filename))):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            rel_dir = os.path.relpath(dirpath, root)
            names = [(d, True) for d in dirnames] + [(f, False) for f in filenames if f != ".git"]
            for name, is_dir in sorted(names):
                rel = name if rel_dir == os.curdir else os.path.join(rel_dir, name)
                entries.append(rel + "/" if is_dir else rel)
            if len(entries) > LIST_FILES_MAX_ENTRIES:
                truncated = True
                break
        entries.sort()
        lines = entries[:LIST_FILES_MAX_ENTRIES]
        if truncated:
            lines.append(f"[listing truncated at {LIST_FILES_MAX_ENTRIES} entries; list a subdirectory]")
        if errors:
            lines.append(f"[could not read: {', '.join(os.path.relpath(e, root) for e in errors)}]")
        if not entries:
            lines.append("[empty directory]")
        return ToolOutcome("\n".join(lines), is_error=False)
