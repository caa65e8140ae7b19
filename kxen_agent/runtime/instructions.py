"""Project instructions: the ``AGENTS.md`` files a run reads at its start and gives the model.

At a run's start (a new run: a task, a retry), :func:`read_instructions`
reads, in the workspace root and then in each directory from the root down
to the current directory (when that is inside the workspace), every file
named by the lock's ``[policy] instructions`` (default ``AGENTS.md``), in
that order: the root's first, the nearest last. Each file's text is bounded
(:data:`MAX_FILE_BYTES`) and redacted like every text a run persists
(:mod:`.redaction`), then stored as a blob in the run's first step; the run
state records which (``instructions``: path, blob, size, truncated;
``objects_spec.md`` §14.5). :func:`model_preamble` gives the model the
system prompt and then those recorded texts, on every turn: a resume, a
run imported on another machine or looked at from a fork uses what the run
recorded, never the file as it is now.

Bounds: each file's first :data:`MAX_FILE_BYTES` (64 KiB) of UTF-8 text are
kept (cut at a character boundary after redaction); the model is told the
file was cut and how long it was, and the run's start says so as a
warning. At most :data:`MAX_FILES` files are read: the root's and the
nearest others. A file is read only if it is a regular file (a symlink is
followed only to a regular file inside the workspace, never into Git
internals), non-blocking; one that cannot be read is left out with a
warning, never an error that stops the run.

It must never write to the store itself (the runner's step writes the
blobs, :attr:`Instructions.blobs`) nor read anything but those files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kxen_agent.session.agent_def import instructions_of
from kxen_agent.session.schema import text_blob
from kxen_agent.store.objects import encode_object
from kxen_agent.store.protocols import ObjectStore

from .redaction import redact

__all__ = ["MAX_FILES", "MAX_FILE_BYTES", "InstructionFile", "Instructions", "model_preamble", "read_for_run",
           "read_instructions", "recorded_files"]

#: The most of one instruction file kept and given to the model (UTF-8 bytes, after redaction).
MAX_FILE_BYTES = 64 * 1024
#: The most instruction files a run reads (the root's, then the nearest to the current directory).
MAX_FILES = 16
# Read past the bound before redacting, so a secret that straddles the cut is redacted whole, not left
# half-visible (a value longer than this margin is the one that could be: none is).
_READ_MARGIN = 64 * 1024

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class InstructionFile:
    """One instruction file as a run recorded it: ``path`` relative to the workspace root (``/``-separated),
    ``text`` as given to the model (bounded, redacted), ``size`` the file's size when read, ``truncated``
    whether ``text`` is only its first :data:`MAX_FILE_BYTES`."""

    path: str
    text: str
    size: int
    truncated: bool


@dataclass(frozen=True)
class Instructions:
    """What a run's start read: the files, the warnings to show, and what its first step writes."""

    files: tuple[InstructionFile, ...] = ()
    warnings: tuple[str, ...] = ()
    #: The blobs (UTF-8 texts) the run's first step writes, and the run state key linking them.
    blobs: tuple[bytes, ...] = field(default=())

    @property
    def state(self) -> dict[str, Any]:
        """The run state's ``instructions`` key (§14.5), or nothing when no file was read."""
        if not self.files:
            return {}
        return {"instructions": [{"path": f.path, "blob": encode_object("blob", f.text.encode("utf-8")).id,
                                  "size": f.size, "truncated": f.truncated} for f in self.files]}


def _is_git_name(name: str) -> bool:
    return name.rstrip(". ").casefold() in (".git", "git~1")


def _directories(root: str, cwd: str | None) -> list[str]:
    """The root, then each directory down to ``cwd`` when it is inside the root (not into Git internals)."""
    dirs = [root]
    if cwd is None:
        return dirs
    real = os.path.realpath(cwd)
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        return dirs
    here = root
    for part in os.path.relpath(real, root).split(os.sep):
        if _is_git_name(part):
            break
        here = os.path.join(here, part)
        dirs.append(here)
    return dirs


def _read_one(path: str, root: str) -> tuple[bytes, int] | str | None:
    """(up to the bound and margin of the file's bytes, its size); a warning; None when there is no such file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        inside = real.startswith(root.rstrip(os.sep) + os.sep)
        if not inside or any(_is_git_name(p) for p in os.path.relpath(real, root).split(os.sep)):
            return f"{path} is a symlink to {real}, outside the workspace (or in its Git internals): not read"
    try:
        target = os.stat(path)  # what a symlink names: a device or a FIFO is never opened
    except FileNotFoundError:
        return None  # a dangling symlink
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    if stat.S_ISDIR(target.st_mode):
        return None  # a directory of that name holds no instructions
    if not stat.S_ISREG(target.st_mode):
        return f"{path} is not a regular file: not read"
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None  # a dangling symlink
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        if stat.S_ISDIR(now.st_mode):
            return None  # a directory of that name holds no instructions
        if not stat.S_ISREG(now.st_mode):
            return f"{path} is not a regular file: not read"
        try:
            return f.read(MAX_FILE_BYTES + _READ_MARGIN), now.st_size
        except OSError as e:
            return f"cannot read {path}: {e.strerror or e}"


def _bounded(data: bytes, size: int, secrets: Iterable[str]) -> tuple[str, bool]:
    """The text given to the model: redacted, then cut to :data:`MAX_FILE_BYTES` at a character boundary."""
    text = redact(data.decode("utf-8", errors="replace"), secrets)
    raw = text.encode("utf-8")
    if len(raw) <= MAX_FILE_BYTES and size <= len(data):
        return text, False
    return raw[:MAX_FILE_BYTES].decode("utf-8", errors="ignore"), True


def read_instructions(root: str, cwd: str | None, names: Sequence[str], secrets: Iterable[str]) -> Instructions:
    """The instruction files a run starting in workspace ``root`` (from ``cwd``) reads (see the module)."""
    root = os.path.realpath(root)
    secrets = list(secrets)
    found: list[InstructionFile] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for d in _directories(root, cwd):
        for name in names:
            path = os.path.join(d, name)
            got = _read_one(path, root)
            if got is None:
                continue
            if isinstance(got, str):
                warnings.append(redact(got, secrets))
                continue
            real = os.path.realpath(path)
            if real in seen:  # CLAUDE.md a symlink to AGENTS.md: once
                continue
            seen.add(real)
            data, size = got
            text, cut = _bounded(data, size, secrets)
            rel = redact(os.path.relpath(path, root).replace(os.sep, "/"), secrets)
            if cut:
                warnings.append(f"{rel} is {max(size, len(data))} bytes, over the {MAX_FILE_BYTES}-byte bound for "
                                f"project instructions: the model is given its first {MAX_FILE_BYTES} bytes")
            found.append(InstructionFile(rel, text, max(size, len(data)), cut))
    if len(found) > MAX_FILES:
        left = [f.path for f in found[1:len(found) - MAX_FILES + 1]]
        warnings.append(f"{len(found)} instruction files, over {MAX_FILES}: left out {', '.join(left)}")
        found = found[:1] + found[len(found) - MAX_FILES + 1:]
    return Instructions(tuple(found), tuple(warnings), tuple(f.text.encode("utf-8") for f in found))


def read_for_run(root: str, lock: Mapping[str, Any], secrets: Iterable[str],
                 warn: Callable[[str], None] = lambda line: None) -> Instructions:
    """:func:`read_instructions` of ``root`` from this process's current directory, with the lock's names;
    each warning passed to ``warn``."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # the current directory was removed
        cwd = None
    found = read_instructions(root, cwd, instructions_of(dict(lock)), secrets)
    for line in found.warnings:
        warn(line)
    return found


def recorded_files(store: ObjectStore, st: Mapping[str, Any]) -> list[InstructionFile]:
    """The instruction files run state ``st`` recorded (none for a run from before §14.5 had them)."""
    out = []
    for item in st.get("instructions") or ():
        blob = item["blob"]
        text = _TEXTS.get(blob)
        if text is None:
            text = text_blob(store, blob)
            if len(_TEXTS) >= 64:
                _TEXTS.clear()
            _TEXTS[blob] = text
        out.append(InstructionFile(item["path"], text, item["size"], item["truncated"]))
    return out


#: Blob id -> text: an object's content never changes under its id, so the texts are read once per process.
_TEXTS: dict[bytes, str] = {}


def model_preamble(store: ObjectStore, agent: Mapping[str, Any], st: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the model is given before the history: the system prompt, then the run's recorded instructions."""
    out: list[dict[str, Any]] = [{"role": "system", "content": agent.get("system", "")}]
    parts = []
    for f in recorded_files(store, st):
        if not f.text.strip():
            continue
        cut = (f"\n[kxen-agent: {f.path} is {f.size} bytes; only its first {MAX_FILE_BYTES} are given]"
               if f.truncated else "")
        parts.append(f"--- {f.path} ---\n{f.text.rstrip()}{cut}")
    if parts:
        out.append({"role": "system", "content": "Project instructions (the workspace's files, the root's first, "
                    "the nearest to the working directory last; a nearer one wins where they differ):\n\n"
                    + "\n\n".join(parts)})
    return out
