"""Git as the transport of sessions: the ``git`` processes, the scratch repositories and the state dir's mirror.

Owns every ``git`` command that session push, pull, ls-remote and the
remote lease run, and three kinds of repository:

- the **mirror**, ``<state dir>/git``: a bare repository holding the Git
  image (``objects_spec.md`` §16) of every session this state dir pushed or
  pulled, and, as refs ``refs/kxen-seen/<remote key>/<group>``, the group
  commit each remote was last seen to hold — what a push's compare-and-swap
  expects. It is a cache plus those records: lose it, and the next push is
  refused until a pull has seen the remote again;
- a **workbench** per operation: a scratch bare repository in the system's
  temp directory that borrows the mirror's objects (``alternates``) and,
  of the workspace repository's configuration, only what names the remote:
  ``remote.<name>.url``, ``pushurl`` and ``fetch`` and the
  ``url.<base>.insteadOf``/``pushInsteadOf`` rewrites. Everything else
  (credential helpers, ``core.sshCommand``, HTTP settings) is the user's
  global and system configuration's, never the workspace's: that file may
  have been written by an agent, and Git runs commands it names. A remote
  whose URL is an ``ext::`` command, or that names an ``uploadpack`` or
  ``receivepack`` program, is refused. Nothing is written into the
  workspace repository. New objects are written, and fetched objects land,
  in the workbench; only after the operation succeeded are its packs
  adopted into the mirror, so a refused or interrupted push or pull
  changes nothing in the state dir. Every ``git`` runs through
  :mod:`.gitproc` (its safe configuration, a timeout, killed with its
  children); a workbench removes itself on SIGTERM too (:func:`~.gitproc.terminable`);
- the **remote**, any URL Git speaks (a path, ``file://``, ``ssh://``,
  ``git://``, smart HTTP(S)).

Authentication is Git's own: kxen-agent passes the remote's name or URL to
``git`` and never reads, stores or prints a credential; a URL is shown only
without its user-info, and Git's own error lines are shown with any
user-info removed.

It knows Git and files, not sessions (``remote.py`` does); it must never
write into a workspace repository or the kxen object store.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

import blake3

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import OS_IO
from kxen_agent.store.locks import file_lock
from kxen_agent.store.gitmap import GitObject, hex40, kxen_id_of_path

from . import gitproc, narrow_push
from .push_pack import indexed_pack
from .workspace import normalize_remote_url, strip_credentials

__all__ = [
    "GitFailed",
    "Mirror",
    "PushRejected",
    "PushUpdate",
    "Remote",
    "RemoteUnreachable",
    "UnsafeRemote",
    "Workbench",
    "resolve_remote",
    "run_git",
]

#: Where the mirror lives in a state dir, and where it keeps what each remote was last seen to hold.
MIRROR_DIR = "git"
SEEN_PREFIX = "refs/kxen-seen/"
#: The lock file (in the mirror) every writer of the mirror's refs holds (fasteners: released when its process dies).
WRITE_LOCK = "kxen-write.lock"
#: Past this many packs in the mirror, adopting one more repacks it into one.
MAX_PACKS = 48
#: Besides :data:`.gitproc.SAFE_CONFIG` (no hooks, fsmonitor, ext::, signing, maintenance): how we want objects kept.
_SAFE_CONFIG = (
    "fetch.unpackLimit=1", "transfer.unpackLimit=1", "transfer.fsckObjects=true",
    "fetch.writeCommitGraph=false", "core.fsync=reference,loose-object,pack,index", "core.fsyncMethod=fsync",
    "protocol.version=2", "advice.pushUpdateRejected=false",
)
#: The keys of the workspace's configuration a workbench copies: what names a remote, and nothing that runs a program.
_REMOTE_KEYS = ("url", "pushurl", "fetch")
_REWRITE_KEY = re.compile(r"url\.(.+)\.(insteadof|pushinsteadof)", re.DOTALL)
_COMMAND_REMOTE_KEYS = ("uploadpack", "receivepack", "vcs")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_REMOTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


class GitFailed(KxenError):
    """A local ``git`` command failed (not the remote's doing)."""


class RemoteUnreachable(KxenError):
    """The remote could not be reached or read (network, authentication, no such repository)."""

    def __init__(self, remote: "Remote", line: str, what: str) -> None:
        super().__init__(f"remote {remote.display} cannot be reached ({line}); nothing was {what}; "
                         "check the URL, the network and your Git credentials, then retry")
        self.remote = remote
        self.line = line


class PushRejected(KxenError):
    """The remote refused a push (a lost compare-and-swap, a non-fast-forward); nothing was changed there."""

    def __init__(self, remote: "Remote", statuses: Mapping[str, str], message: str) -> None:
        super().__init__(message)
        self.remote = remote
        self.statuses = dict(statuses)


def git_env() -> dict[str, str]:
    return gitproc.git_env()


def scrub(text: str) -> str:
    """``text`` with the user-info of every URL in it removed (Git's lines may quote a URL)."""
    return _USERINFO.sub("", text)


def _first_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    pick = (fatal or lines or ["(no output)"])[0]
    return scrub(" ".join(pick.split()))


def run_git(args: Sequence[str], *, git_dir: str | None = None, cwd: str | None = None,
            input: bytes | None = None, check: bool = True, remote: bool = False,
            config: Sequence[str] = ()) -> subprocess.CompletedProcess[bytes]:
    """``git [--git-dir=D] -c SAFE... ARGS`` through :func:`.gitproc.run`; a failure is :class:`GitFailed` when ``check``.

    ``remote``: the command talks to a remote (its longer timeout);
    ``config``: more ``-c`` settings, after (so over) ours.
    """
    try:
        done = gitproc.run(args, git_dir=git_dir, cwd=cwd, input=input, remote=remote,
                           config=(*_SAFE_CONFIG, *config))
    except gitproc.GitTimeout as e:
        if remote:
            raise
        raise GitFailed(str(e)) from None
    except KxenError:
        raise
    except FileNotFoundError:
        raise GitFailed("git executable not found on PATH; install Git to push or pull sessions") from None
    if check and done.returncode != 0:
        raise GitFailed(f"git {args[0]} failed (exit {done.returncode}): {_first_line(done.stderr)}")
    return done


# ---------------------------------------------------------------- remotes


class UnsafeRemote(KxenError):
    """The workspace's configuration makes a remote run a program (an ``ext::`` URL, ``uploadpack``...): refused."""


@dataclass(frozen=True)
class Remote:
    """A remote as Git will be told it (``spec``: a remote name or a URL) and as we show and key it.

    ``display`` is the URL without user-info (or ``NAME (URL)``); ``key`` the
    hash of the credential-free normalized URL (the same hash a session's
    workspace record keeps of its origin), which names the remote in the
    mirror; ``settings`` the workspace repository's configuration entries a
    workbench copies (the remote's ``url``, ``pushurl`` and ``fetch``, the
    URL rewrites: see the module docstring), as (key, value) pairs;
    ``cwd`` where ``git`` runs (relative URLs are relative to it).
    """

    spec: str
    url: str
    display: str
    key: str
    settings: tuple[tuple[str, str], ...]
    cwd: str


def remote_key(url: str) -> str:
    return blake3.blake3(b"kxen-remote-v1\0" + normalize_remote_url(url).encode("utf-8", "surrogateescape")).hexdigest()


def _looks_like_url(text: str) -> bool:
    return "://" in text or text.startswith(("/", ".", "~")) or (":" in text.split("/", 1)[0])


_TRANSPORT = re.compile(r"([A-Za-z0-9][A-Za-z0-9+.-]*)::", re.DOTALL)


def _runs_command(url: str) -> bool:
    """Whether Git would run ``url`` as a command (the ``ext::`` remote helper)."""
    m = _TRANSPORT.match(url.strip())
    return m is not None and m.group(1).lower() == "ext"


def _repository_settings(repo_root: str, name: str | None, where: str) -> tuple[tuple[str, str], ...]:
    """The entries of the repository's own configuration a workbench copies (see the module docstring).

    Refuses (:class:`UnsafeRemote`) a remote ``name`` whose configuration
    names a program to run. The user's global and system configuration are
    read by Git itself in the workbench, as in any repository.
    """
    p = run_git(["config", "--show-scope", "--null", "--list"], cwd=repo_root, check=False)
    if p.returncode != 0:
        return ()
    out: list[tuple[str, str]] = []
    it = iter(p.stdout.split(b"\0"))
    for scope_b in it:
        entry = next(it, None)
        if entry is None:
            break
        if scope_b not in (b"local", b"worktree"):
            continue
        key_b, _, value_b = entry.partition(b"\n")
        key, value = key_b.decode("utf-8", "surrogateescape"), value_b.decode("utf-8", "surrogateescape")
        if "\n" in key or "\n" in value:
            continue
        if name is not None and key.startswith(f"remote.{name}."):
            field = key[len(f"remote.{name}."):]
            if field in _COMMAND_REMOTE_KEYS:
                raise UnsafeRemote(f"remote {name!r} of {where} sets remote.{name}.{field}, a program for Git to run, "
                                   f"which kxen-agent never runs; remove it (git config --unset remote.{name}.{field}) "
                                   "or name the remote by URL with --remote URL")
            if field in _REMOTE_KEYS:
                if field != "fetch" and _runs_command(value):
                    raise UnsafeRemote(f"remote {name!r} of {where} has an ext:: URL, a command for Git to run, "
                                       "which kxen-agent never runs; give the remote a URL Git fetches from")
                out.append((key, value))
            continue
        m = _REWRITE_KEY.fullmatch(key)
        if m is not None:
            if _runs_command(m.group(1)):
                raise UnsafeRemote(f"{where}'s configuration rewrites URLs to an ext:: command "
                                   f"(url.<ext::...>.{'pushInsteadOf' if m.group(2) == 'pushinsteadof' else 'insteadOf'}"
                                   f" = {value}), which kxen-agent never runs; remove that url.* entry")
            out.append((f"url.{m.group(1)}.{'pushInsteadOf' if m.group(2) == 'pushinsteadof' else 'insteadOf'}", value))
    return tuple(out)


def resolve_remote(repo_root: str | None, name_or_url: str | None, *, what: str) -> Remote:
    """The remote ``name_or_url`` (default ``origin``) of the repository at ``repo_root``.

    A name must be a remote of that repository; a URL (or a path) is used
    as given (a relative path from the current directory). ``what`` says
    whose repository it is, for the errors. A remote Git would reach by
    running a command is refused (:class:`UnsafeRemote`).
    """
    name = name_or_url if name_or_url is not None else "origin"
    common = None
    if repo_root is not None and os.path.isdir(repo_root):
        p = run_git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=repo_root, check=False)
        if p.returncode == 0:
            common = p.stdout.decode("utf-8", "surrogateescape").strip()
    where = f"repository {repo_root}"
    if common is not None and _REMOTE_NAME.fullmatch(name) and not _looks_like_url(name):
        got = run_git(["remote", "get-url", "--", name], cwd=repo_root, check=False)
        if got.returncode == 0:
            assert repo_root is not None
            url = got.stdout.decode("utf-8", "surrogateescape").strip()
            settings = _repository_settings(repo_root, name, where)
            if _runs_command(url):
                raise UnsafeRemote(f"remote {name!r} of {where} resolves to an ext:: command, which kxen-agent "
                                   "never runs; give the remote a URL Git fetches from")
            return Remote(name, url, f"{name} ({strip_credentials(url)})", remote_key(_absolute(url, repo_root)),
                          settings, repo_root or ".")
    if name_or_url is None or (_REMOTE_NAME.fullmatch(name) and not _looks_like_url(name)):
        where = f"repository {repo_root}" if common else f"{what} (no Git repository at {repo_root or '?'})"
        raise UsageError(f"no remote {name!r} in {where}; add one (git remote add {name} URL) "
                         "or name the remote with --remote URL")
    if _runs_command(name):
        raise UnsafeRemote("--remote names an ext:: command, which kxen-agent never runs; give a URL Git fetches from")
    url = _absolute(name, os.getcwd())
    settings = _repository_settings(repo_root, None, where) if common is not None and repo_root is not None else ()
    return Remote(url, url, strip_credentials(url), remote_key(url), settings, repo_root if common else os.getcwd())


def _absolute(url: str, base: str | None) -> str:
    """A local path made absolute (Git resolves a relative one from where it runs); any other URL unchanged."""
    if "://" in url or (":" in url.split("/", 1)[0] and not url.startswith((".", "/"))):
        return url
    return os.path.normpath(os.path.join(base or os.getcwd(), os.path.expanduser(url)))


# ---------------------------------------------------------------- the mirror


def _remove_stale(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Mirror:
    """The state dir's bare Git repository (see the module docstring)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, MIRROR_DIR)

    @property
    def objects(self) -> str:
        return os.path.join(self.path, "objects")

    def exists(self) -> bool:
        return os.path.isfile(os.path.join(self.path, "HEAD"))

    def ensure(self) -> None:
        """Create the mirror if it is missing (the state dir must exist: its store made it)."""
        if self.exists():
            return
        # Git's own modes follow the state dir's (objects_spec.md §10.4), whatever the umask.
        shared = "group" if OS_IO.is_shared(self.path) else "0600"
        run_git(["init", "-q", "--bare", f"--shared={shared}", self.path])
        # A mirror is written by kxen-agent only; it never gc's on its own.
        run_git(["config", "gc.auto", "0"], git_dir=self.path)

    def seen(self, key: str, groups: Iterable[str]) -> dict[str, bytes]:
        """The group commit each of ``groups`` was last seen at on the remote ``key`` (absent: never)."""
        if not self.exists():
            return {}
        wanted = {f"{SEEN_PREFIX}{key}/{g}": g for g in groups}
        if not wanted:
            return {}
        p = run_git(["for-each-ref", "--format=%(objectname) %(refname)", f"{SEEN_PREFIX}{key}/"], git_dir=self.path)
        out = {}
        for line in p.stdout.decode("ascii", "replace").splitlines():
            oid, _, ref = line.partition(" ")
            if ref in wanted and hex40(oid):
                out[wanted[ref]] = bytes.fromhex(oid)
        return out

    def all_seen(self, groups_of: Iterable[str]) -> dict[str, bytes]:
        """For ``groups_of`` (groups), any remote's last-seen commit of each (for bases); one per group."""
        if not self.exists():
            return {}
        wanted = set(groups_of)
        p = run_git(["for-each-ref", "--format=%(objectname) %(refname)", SEEN_PREFIX], git_dir=self.path)
        out: dict[str, bytes] = {}
        for line in p.stdout.decode("ascii", "replace").splitlines():
            oid, _, ref = line.partition(" ")
            group = ref[len(SEEN_PREFIX):].partition("/")[2]
            if group in wanted and hex40(oid):
                out.setdefault(group, bytes.fromhex(oid))
        return out

    def set_seen(self, key: str, updates: Sequence[tuple[str, bytes | None, bytes]]) -> None:
        """Record, in one transaction, that the remote ``key`` now holds ``new`` for each group (CAS on ``old``)."""
        if not updates:
            return
        zero = "0" * 40
        lines = ["start"]
        for group, old, new in updates:
            lines.append(f"update {SEEN_PREFIX}{key}/{group} {new.hex()} {old.hex() if old else zero}")
        lines += ["prepare", "commit", ""]
        # Every writer of the mirror's refs holds this lock, and it dies with its
        # process: a Git lock file found under it is a killed writer's (a push
        # killed inside `git update-ref`), which Git would refuse forever and
        # leave every later push asking for a pull that cannot record either.
        with file_lock(os.path.join(self.path, WRITE_LOCK)):
            for group, _old, _new in updates:
                _remove_stale(os.path.join(self.path, *f"{SEEN_PREFIX}{key}/{group}.lock".split("/")))
            _remove_stale(os.path.join(self.path, "packed-refs.lock"))
            run_git(["update-ref", "--stdin"], git_dir=self.path, input="\n".join(lines).encode("ascii"))

    def adopt(self, bench: "Workbench") -> int:
        """Copy the packs ``bench`` wrote or fetched into the mirror, durably, index last; how many."""
        src = os.path.join(bench.path, "objects", "pack")
        dst = os.path.join(self.objects, "pack")
        names = sorted(n for n in os.listdir(src) if n.startswith("pack-") and n.endswith(".idx"))
        for idx in names:
            base = idx[:-4]
            if os.path.exists(os.path.join(dst, idx)):
                continue
            for ext in (".pack", ".idx"):  # the index names the pack: it goes in last
                _copy_durably(os.path.join(src, base + ext), os.path.join(dst, base + ext))
        if names:
            OS_IO.fsync_dir(dst)
            if sum(1 for n in os.listdir(dst) if n.endswith(".idx")) > MAX_PACKS:
                self.consolidate()
        return len(names)

    def consolidate(self) -> None:
        """Repack the mirror into one pack (every push adds one; Git slows down with many).

        ``--keep-unreachable``: a pack another process just adopted and has
        not yet named in a last-seen record is kept, not dropped; a pack that
        appears during the repack is left alone by Git.
        """
        run_git(["repack", "-a", "-d", "-q", "--keep-unreachable"], git_dir=self.path)

    def covered(self, tips: Sequence[bytes]) -> set[bytes]:
        """The kxen ids the objects trees reachable from ``tips`` (commits in the mirror) hold."""
        if not tips:
            return set()
        p = run_git(["rev-list", "--objects", *[t.hex() for t in tips]], git_dir=self.path)
        return _kxen_ids(p.stdout)


def _kxen_ids(rev_list_objects: bytes) -> set[bytes]:
    out = set()
    for line in rev_list_objects.splitlines():
        if len(line) == 41 + 65:
            kid = kxen_id_of_path(line[41:])
            if kid is not None:
                out.add(kid)
    return out


def _copy_durably(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` as the store writes a file: temp file, fsync, rename (the caller fsyncs the dir)."""
    tmp = os.path.join(os.path.dirname(dst), "tmp_" + os.urandom(8).hex())
    try:
        with open(src, "rb") as fin, open(tmp, "xb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        os.chmod(tmp, 0o440 if OS_IO.is_shared(dst) else 0o400)  # §10.4: the owner's (and group's) alone
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---------------------------------------------------------------- workbenches


@dataclass(frozen=True)
class PushUpdate:
    """One ref of an atomic push: ``new`` (a commit id, None to delete) expected to replace ``expect`` (None: absent)."""

    ref: str
    new: bytes | None
    expect: bytes | None
    lease: bool = True  # compare-and-swap on ``expect`` (--force-with-lease); else Git's fast-forward rule


class Workbench:
    """A scratch bare repository borrowing the mirror's objects and the workspace's Git configuration."""

    def __init__(self, remote: Remote, *, mirror: Mirror | None, alternates: Sequence[str] = (),
                 durable: bool = True) -> None:
        self.remote = remote
        self.mirror = mirror
        # Refs of the remote whose history a push from here builds on (:meth:`builds_on`), and its push URLs.
        self._shared: set[str] = set()
        self._push_urls: list[str] | None = None
        # A listing's workbench is read and thrown away: nothing in it needs an fsync
        # (a fetch of 10,000 tips otherwise fsyncs 10,000 ref files).
        self._config: tuple[str, ...] = () if durable else ("core.fsync=none",)
        # SIGTERM now raises, so that close() runs and no scratch repository is left behind.
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(gitproc.terminable())
        try:
            self.path = tempfile.mkdtemp(prefix="kxen-git-")
        except BaseException:
            self._signals.close()
            raise
        try:
            run_git(["init", "-q", "--bare", self.path])
            alt = [a for a in ([mirror.objects] if mirror is not None and mirror.exists() else []) + list(alternates)]
            if alt:
                with open(os.path.join(self.path, "objects", "info", "alternates"), "w", encoding="utf-8") as f:
                    f.write("".join(a + "\n" for a in alt))
            if remote.settings:
                # What names the remote, and nothing else of the workspace's configuration.
                with open(os.path.join(self.path, "config"), "a", encoding="utf-8") as f:
                    f.write(_config_text(remote.settings))
            self._check_urls()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            self._signals.close()

    def _check_urls(self) -> None:
        """Refuse a remote that, with every rewrite applied (the user's too), is an ``ext::`` command."""
        spec = self.remote.spec
        asks = [["ls-remote", "--get-url", "--", spec]]
        if _REMOTE_NAME.fullmatch(spec) and not _looks_like_url(spec):
            asks += [["remote", "get-url", "--all", "--", spec], ["remote", "get-url", "--push", "--all", "--", spec]]
            self._push_urls = []  # a remote name: Git's answer below, or none (then no narrowed push)
        for args in asks:
            p = self.git(args, check=False)
            if args[2] == "--push" and p.returncode == 0:
                self._push_urls = p.stdout.decode("utf-8", "surrogateescape").splitlines()
            for url in p.stdout.decode("utf-8", "surrogateescape").splitlines():
                if _runs_command(url):
                    raise UnsafeRemote(f"remote {self.remote.display} resolves to an ext:: command (a URL rewrite in "
                                       "the Git configuration), which kxen-agent never runs; remove that url.* entry")

    def borrow(self, objects_dir: str) -> None:
        """Read ``objects_dir``'s objects too (the mirror, once it exists)."""
        path = os.path.join(self.path, "objects", "info", "alternates")
        lines = open(path, encoding="utf-8").read().splitlines() if os.path.exists(path) else []
        if objects_dir not in lines:
            with open(path, "a", encoding="utf-8") as f:
                f.write(objects_dir + "\n")

    def forget_packs(self) -> None:
        """Remove this workbench's own packs once the mirror has them (it reads the mirror's)."""
        d = os.path.join(self.path, "objects", "pack")
        for name in sorted(os.listdir(d), key=lambda n: not n.endswith(".idx")):  # an index before its pack
            if name.startswith("pack-"):
                os.unlink(os.path.join(d, name))

    def __enter__(self) -> "Workbench":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def git(self, args: Sequence[str], *, input: bytes | None = None, check: bool = True,
            at_remote: bool = False) -> subprocess.CompletedProcess[bytes]:
        return run_git(args, git_dir=self.path, cwd=self.remote.cwd if at_remote else None, input=input, check=check,
                       remote=at_remote, config=self._config)

    def _at_remote(self, args: Sequence[str], what: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        try:
            return self.git(args, check=False, at_remote=True, input=input)
        except gitproc.GitTimeout:
            raise RemoteUnreachable(self.remote, f"git {args[0]} gave no answer within {gitproc.remote_timeout_s():g} s "
                                    f"and was stopped; {gitproc.REMOTE_TIMEOUT_ENV} sets that limit", what) from None

    # ------------------------------------------------------------ objects

    def write(self, objects: Sequence[GitObject]) -> None:
        """Add ``objects`` as one pack with its index, both written here (no ``git index-pack``).

        Every id was computed from its object's bytes by :mod:`~kxen_agent.store.gitmap`,
        which writes the index ``git index-pack`` would (byte for byte): running it
        cost a process that re-read, inflated and re-hashed every object. The
        remote checks what it receives as it always does. The index goes in
        last: Git never sees an index without its pack.
        """
        if not objects:
            return
        data, idx = indexed_pack(objects)
        base = os.path.join(self.path, "objects", "pack", f"pack-{data[-20:].hex()}")
        for ext, body in ((".pack", data), (".idx", idx)):
            tmp = base + ext + ".tmp"
            with open(tmp, "wb") as f:
                f.write(body)
            os.chmod(tmp, 0o444)
            os.replace(tmp, base + ext)

    def sizes(self, oids: Sequence[bytes]) -> dict[bytes, tuple[str, int]]:
        """(type, size) of each object present (``git cat-file --batch-check``); absent ones are left out."""
        out: dict[bytes, tuple[str, int]] = {}
        for head, _ in self._batch(oids, check_only=True):
            if head is not None:
                out[head[0]] = (head[1], head[2])
        return out

    def read(self, oids: Sequence[bytes]) -> Iterator[tuple[bytes, str, bytes]]:
        """(id, type, body) of each object, streamed (``git cat-file --batch``); absent ones are skipped."""
        for head, body in self._batch(oids, check_only=False):
            if head is not None:
                yield head[0], head[1], body

    def _batch(self, oids: Sequence[bytes], *, check_only: bool):
        if not oids:
            return
        cmd = gitproc.git_argv(["cat-file", "--batch-check" if check_only else "--batch"], git_dir=self.path)
        proc = gitproc.spawn(cmd, cwd=None, env=git_env(), stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)

        def feed() -> None:
            try:
                assert proc.stdin is not None
                for o in oids:
                    proc.stdin.write(o.hex().encode("ascii") + b"\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        assert proc.stdout is not None
        try:
            for _ in oids:
                line = proc.stdout.readline()
                if not line:
                    raise GitFailed("git cat-file ended early")
                parts = line.split()
                if len(parts) == 2 and parts[1] == b"missing":
                    yield None, b""
                    continue
                if len(parts) != 3:
                    raise GitFailed(f"git cat-file said {line[:80]!r}")
                oid, typ, size = bytes.fromhex(parts[0].decode("ascii")), parts[1].decode("ascii"), int(parts[2])
                if check_only:
                    yield (oid, typ, size), b""
                    continue
                body = proc.stdout.read(size)
                proc.stdout.read(1)
                yield (oid, typ, size), body
        finally:
            proc.stdout.close()
            gitproc.kill_tree(proc)
            writer.join()

    def read_specs(self, specs: Sequence[tuple[str, int]]) -> list[tuple[str | None, bytes | None]]:
        """(type, body) of each ``(revision, most bytes)``, in order, from one ``git cat-file --batch``.

        A revision is anything ``git cat-file`` resolves (``<id>``,
        ``<id>^{tree}``, ``<id>:<path>``); one it cannot resolve is
        ``(None, None)``; an object larger than its bound is ``(type, None)``:
        its bytes are read past in pieces, never held.
        """
        if not specs:
            return []
        for spec, _ in specs:
            if "\n" in spec or not spec:
                raise ValueError(f"a revision for git cat-file is one non-empty line, not {spec!r}")
        cmd = gitproc.git_argv(["cat-file", "--batch"], git_dir=self.path)
        proc = gitproc.spawn(cmd, cwd=None, env=git_env(), stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)

        def feed() -> None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"".join(spec.encode("utf-8", "surrogateescape") + b"\n" for spec, _ in specs))
                proc.stdin.close()
            except BrokenPipeError:
                pass

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        assert proc.stdout is not None
        out: list[tuple[str | None, bytes | None]] = []
        try:
            for _, limit in specs:
                line = proc.stdout.readline()
                if not line:
                    raise GitFailed("git cat-file ended early")
                parts = line.split()
                if len(parts) == 3 and parts[2].isdigit() and len(parts[0]) == 40:
                    typ, size = parts[1].decode("ascii", "replace"), int(parts[2])
                    if size <= limit:
                        body = proc.stdout.read(size)
                        out.append((typ, body))
                    else:
                        left = size
                        while left:
                            left -= len(proc.stdout.read(min(left, 1 << 20))) or left
                        out.append((typ, None))
                    proc.stdout.read(1)
                elif parts and parts[-1] in (b"missing", b"ambiguous"):
                    out.append((None, None))
                else:
                    raise GitFailed(f"git cat-file said {line[:80]!r}")
        finally:
            proc.stdout.close()
            gitproc.kill_tree(proc)
            writer.join()
        return out

    def local_refs(self, prefix: str) -> dict[str, bytes]:
        """This workbench's own refs under ``prefix`` (what a fetch brought): name -> id."""
        p = self.git(["for-each-ref", "--format=%(objectname) %(refname)", prefix])
        out = {}
        for line in p.stdout.decode("utf-8", "surrogateescape").splitlines():
            oid, _, ref = line.partition(" ")
            value = hex40(oid)
            if value is not None:
                out[ref] = value
        return out

    def rev_list_objects(self, tips: Sequence[bytes], exclude: Sequence[bytes] = ()) -> list[tuple[bytes, bytes]]:
        """(id, path) of every object reachable from ``tips`` and not from ``exclude`` (path may be empty)."""
        if not tips:
            return []
        args = ["rev-list", "--objects", *[t.hex() for t in tips]]
        if exclude:
            args += ["--not", *[e.hex() for e in exclude]]
        out = []
        for line in self.git(args).stdout.splitlines():
            out.append((bytes.fromhex(line[:40].decode("ascii")), line[41:]))
        return out

    # ------------------------------------------------------------ the remote

    def ls_remote(self, patterns: Sequence[str], *, what: str) -> dict[str, bytes]:
        """The remote's refs named by ``patterns`` (exact names, or a prefix ending in ``/``)."""
        # Git matches a pattern as a glob against a name's tail: a prefix is asked for as PREFIX*.
        asked = [pat + "*" if pat.endswith("/") else pat for pat in patterns]
        p = self._at_remote(["ls-remote", "--", self.remote.spec, *asked], what)
        if p.returncode != 0:
            raise RemoteUnreachable(self.remote, _first_line(p.stderr), what)
        out: dict[str, bytes] = {}
        for line in p.stdout.decode("utf-8", "replace").splitlines():
            oid, _, ref = line.partition("\t")
            value = hex40(oid)
            if value is None:
                raise GitFailed(f"remote {self.remote.display} named ref {ref!r} by {oid[:70]!r}, not a SHA-1 id; "
                                "SHA-256 repositories are not supported")
            # ls-remote matches patterns against the tail of a name: keep exact names and prefixes only.
            if any(ref == pat or (pat.endswith("/") and ref.startswith(pat)) for pat in patterns):
                out[ref] = value
        return out

    def fetch(self, refspecs: Sequence[str], *, what: str, depth: int | None = None,
              negotiation_tips: Sequence[bytes] = ()) -> None:
        """Fetch ``refspecs`` (``+SRC:DST``, DST in this workbench) from the remote.

        Past a few refspecs they go on ``git fetch --stdin`` (no command-line
        limit): protocol v2 then asks the remote for those refs alone.
        """
        args = ["fetch", "--no-tags", "--no-write-fetch-head", "--no-auto-maintenance", "--no-recurse-submodules",
                "--no-prune", "--refmap=", "--quiet"]
        if depth is not None:
            args.append(f"--depth={depth}")
        args += [f"--negotiation-tip={t.hex()}" for t in negotiation_tips]
        if len(refspecs) > 16:
            data = "".join(r + "\n" for r in refspecs).encode("utf-8", "surrogateescape")
            p = self._at_remote([*args, "--stdin", "--", self.remote.spec], what, input=data)
        else:
            p = self._at_remote([*args, "--", self.remote.spec, *refspecs], what)
        if p.returncode != 0:
            raise RemoteUnreachable(self.remote, _first_line(p.stderr), what)

    def fetch_named(self, names: Sequence[str], *, what: str, negotiation_tips: Sequence[bytes] = ()) -> dict[str, bytes]:
        """Fetch the remote's refs ``names`` (full names) into the same names here; the value of each present.

        Unlike ``git ls-remote`` (which asks for every ref of the remote:
        10,000 lines from a remote of 10,000 sessions), a fetch speaks
        protocol v2 with one ``ref-prefix`` per name, so the remote sends
        those refs alone. Each name is fetched as the glob ``NAME*`` (a
        name the remote lacks is then no error); longer names it also
        matches are left out of the answer. Objects already here (the
        mirror's, through ``alternates``) are not sent again.
        """
        if not names:
            return {}
        self.fetch([f"+{n}*:{n}*" for n in names], what=what, negotiation_tips=negotiation_tips)
        wanted = set(names)
        refs = self.local_refs("refs/")
        return {n: v for n, v in refs.items() if n in wanted}

    def builds_on(self, refs: Iterable[str]) -> None:
        """Refs of the remote whose history the next push builds on (a fork's ancestor): they stay advertised."""
        self._shared.update(refs)

    def push(self, updates: Sequence[PushUpdate], *, what: str) -> dict[str, str]:
        """One atomic push of ``updates``; each ref's summary, or :class:`PushRejected` / :class:`RemoteUnreachable`.

        Where the remote's transport runs a command (a path, ``file://``,
        ``ssh``), the remote is asked to advertise only the refs the push
        needs (:mod:`.narrow_push`); a server that refuses that command is
        asked again, in the same push, with the plain ``receive-pack``.
        """
        args = ["push", "--atomic", "--porcelain", "--no-verify", "--quiet"]
        specs = []
        for u in updates:
            if u.lease:
                args.append(f"--force-with-lease={u.ref}:{u.expect.hex() if u.expect else ''}")
            specs.append(f"{u.new.hex() if u.new else ''}:{u.ref}")
        tail = ["--", self.remote.spec, *specs]
        command = self._narrow_command([u.ref for u in updates])
        if command is None:
            p = self._at_remote([*args, *tail], what)
        else:
            p = self._at_remote([*args, f"--receive-pack={command}", *tail], what)
            if p.returncode != 0 and not _push_statuses(p.stdout)[0] and narrow_push.never_spoke(p.stderr):
                # The server ran nothing (it takes only its own git-receive-pack): nothing was sent.
                p = self._at_remote([*args, *tail], what)
                # It reached the remote (landed, or a ref refused: --quiet prints no line on success).
                if (p.returncode == 0 or _push_statuses(p.stdout)[0]) and self.mirror is not None:
                    try:  # a cache: a push that landed never fails for want of it
                        self.mirror.ensure()
                        narrow_push.remember_plain(self.mirror.path, self.remote.key)
                    except (OSError, KxenError):
                        pass
        statuses, rejected = _push_statuses(p.stdout)
        if p.returncode == 0 and not rejected:
            return statuses
        if not statuses:
            raise RemoteUnreachable(self.remote, _first_line(p.stderr), what)
        worst = next((f"{r}: {s}" for r, s in statuses.items() if "atomic push failed" not in s), None)
        raise PushRejected(self.remote, statuses, scrub(worst or _first_line(p.stderr)))

    def _narrow_command(self, refs: Sequence[str]) -> str | None:
        """The ``--receive-pack`` command of a narrowed push of ``refs``, or None to push plainly."""
        allowed = narrow_push.transports()
        if not allowed:
            return None
        shown = narrow_push.refs_to_show(refs, self._shared)
        if shown is None or narrow_push.remembered_plain(self.mirror.path if self.mirror else None, self.remote.key):
            return None
        if self._push_urls is None:
            # A URL given as such: Git's own answer, every rewrite applied, through a scratch remote of that URL.
            spec = self.remote.spec
            if "\n" in spec:
                return None
            with open(os.path.join(self.path, "config"), "a", encoding="utf-8") as f:
                f.write(_config_text([("remote.kxen-push-url.url", spec)]))
            p = self.git(["remote", "get-url", "--push", "--all", "kxen-push-url"], check=False)
            self._push_urls = p.stdout.decode("utf-8", "surrogateescape").splitlines() if p.returncode == 0 else []
        kinds = {narrow_push.transport_of(u) for u in self._push_urls}
        if not kinds or not kinds <= allowed:
            return None
        return narrow_push.receive_pack_command(shown)


def _push_statuses(stdout: bytes) -> tuple[dict[str, str], bool]:
    """Each ref's summary in ``git push --porcelain`` output, and whether any was rejected."""
    statuses: dict[str, str] = {}
    rejected = False
    for line in stdout.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and len(parts[0]) == 1 and ":" in parts[1]:
            ref = parts[1].rpartition(":")[2]
            statuses[ref] = parts[2]
            rejected |= parts[0] == "!"
    return statuses, rejected


def _config_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _config_text(settings: Sequence[tuple[str, str]]) -> str:
    """``settings`` (``section.sub.key``, value) as Git configuration text, one section per entry."""
    out = []
    for key, value in settings:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        out.append(f"[{section} {_config_quote(sub)}]\n\t{name} = {_config_quote(value)}\n")
    return "".join(out)
