"""Trust: what this state dir decided for itself, and what arrived from elsewhere (``objects_spec.md`` §14.13).

A session is portable: a bundle or a pull brings its agent lock, its run
states and its tool journal from another machine, written by whoever made
them. This module owns three judgements the runtime acts on:

- **Where a session's facts were written.** The state dir's own reflog of
  the session's group (:class:`LocalRecords`) is the one record a bundle
  cannot carry or forge: every line whose reason is not an import's
  (``import bundle …``) or a pull's (``pull from remote``) was committed by
  a kxen-agent process on this state dir. From it: whether this state dir
  created the session, whether it has run it, which messages it put on
  ``head``, which run states and session metadata it wrote.
- **Which (endpoint, key variable) pairs may be used** (:func:`lock_problem`):
  a provider's official endpoint with its standard variable, the pairs of
  agent definitions this state dir ran or registered, and the pairs and
  locks a person accepted here (trust records, kept as blobs under the ref
  group ``trust/local``, :class:`TrustStore`). A ``script`` lock (a list of
  tool calls) must itself be this state dir's or accepted.
- **The origin a journal entry records** (``origin``, §14.6): this state
  dir's id, informative only — a reader acts on a decision only when its
  own reflog shows it committed it.

It never calls a model or a tool, and writes only the trust group.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kxen_agent.store import RefUpdate
from kxen_agent.store.codec import decode_strict, encode
from kxen_agent.store.protocols import Repository

from .sessions import NS

__all__ = [
    "FOREIGN_REASONS",
    "LocalRecords",
    "OFFICIAL_ENDPOINTS",
    "TRUST_GROUP",
    "TrustRecord",
    "TrustStore",
    "lock_pair",
    "lock_problem",
    "normal_url",
    "official_pair",
    "ours_now",
]

#: The ref group holding this state dir's trust records and its id (§14.13).
TRUST_GROUP = "trust/local"
#: Reflog reasons of transactions that brought another machine's refs (§14.1 import, §16.7 pull).
FOREIGN_REASONS = ("import bundle", "pull from remote")
#: Each provider's standard key variable and the official endpoint its value may go to.
OFFICIAL_ENDPOINTS = {"OPENAI_API_KEY": "https://api.openai.com/v1", "ANTHROPIC_API_KEY": "https://api.anthropic.com"}
#: How a trust record came to be (§14.13 ``how``).
HOWS = ("local", "accepted", "command-line")


def normal_url(url: str | None) -> str | None:
    """``url`` as compared for trust: scheme and host lower-cased, the default port and a final ``/`` dropped."""
    if url is None:
        return None
    try:
        p = urllib.parse.urlsplit(url.strip())
        host = (p.hostname or "").lower()
        port = p.port
    except ValueError:
        return url
    scheme = p.scheme.lower()
    netloc = host if port is None or (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    return urllib.parse.urlunsplit((scheme, netloc, p.path.rstrip("/"), p.query, ""))


def official_pair(endpoint: str | None, key_env: str | None) -> bool:
    """Whether ``key_env``'s value may go to ``endpoint`` on every machine: a provider's official endpoint with
    its standard variable (or with no variable: a placeholder key, and the provider is who it says it is)."""
    url = normal_url(endpoint)
    if key_env is None:
        return url in {normal_url(u) for u in OFFICIAL_ENDPOINTS.values()}
    return key_env in OFFICIAL_ENDPOINTS and normal_url(OFFICIAL_ENDPOINTS[key_env]) == url


def lock_pair(lock: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The (endpoint, key variable) an agent lock names (its provider's official endpoint when it names none)."""
    url = lock.get("base_url")
    if url is None and lock.get("provider") == "openai":
        url = OFFICIAL_ENDPOINTS["OPENAI_API_KEY"]
    if url is None and lock.get("provider") == "anthropic":
        url = OFFICIAL_ENDPOINTS["ANTHROPIC_API_KEY"]
    return url, lock.get("api_key_env")


def _foreign(reason: str) -> bool:
    return any(reason == r or reason.startswith(r + " ") for r in FOREIGN_REASONS)


@dataclass
class LocalRecords:
    """What this state dir's reflog of one session says it wrote itself (the lines no import or pull wrote)."""

    created_here: bool = False
    ran_here: bool = False
    heads: set[bytes] = field(default_factory=set)
    #: the session metadata a line of ``session: create`` or ``session: agent`` put on ``meta``: a lock chosen here
    metas: set[bytes] = field(default_factory=set)
    #: the session this one was forked from here (its lock is the parent's: local only if it is local there)
    fork_of: str | None = None
    #: run id -> [(state id, reason)] of the run states this state dir put on ``runs/<run>``
    run_states: dict[str, list[tuple[bytes, str]]] = field(default_factory=dict)

    @classmethod
    def read(cls, store: Repository, ses: str) -> "LocalRecords":
        out = cls()
        lines = store.refs.reflog(f"{NS}/{ses}")
        if lines:
            first = lines[0].reason
            out.created_here = first.startswith("session: create") or first.startswith("session: fork")
            if first.startswith("session: fork of "):
                out.fork_of = first[len("session: fork of "):].strip() or None
        for e in lines:
            if _foreign(e.reason) or e.new is None:
                continue
            if e.reason.startswith("run "):
                out.ran_here = True
            if e.name == "head":
                out.heads.add(e.new)
            elif e.name == "meta" and (e.reason.startswith("session: create") or e.reason.startswith("session: agent")):
                out.metas.add(e.new)
            elif e.name.startswith("runs/"):
                out.run_states.setdefault(e.name[5:], []).append((e.new, e.reason))
        return out

    def local_agents(self, store: Repository, _depth: int = 0) -> set[bytes]:
        """The agent locks this state dir chose for the session: those it created it with or re-bound it to
        (``--agent``), and for a fork made here, its parent's (a fork of an imported session launders nothing)."""
        out = {store.get(m, "session")["agent"] for m in self.metas}
        if self.fork_of is not None and _depth < 64:
            from kxen_agent.errors import KxenError

            try:
                out |= LocalRecords.read(store, self.fork_of).local_agents(store, _depth + 1)
            except KxenError:
                pass  # the parent is gone or damaged: its lock counts for nothing
        return out

    def committed_journal(self, store: Repository, run: str, entry: bytes, reason_prefix: str) -> bool:
        """Whether this state dir committed a state of ``run`` whose newest journal entry is ``entry``.

        Only states whose reason starts with ``reason_prefix`` are read (a
        decision's step names its operation), so this costs a read or two.
        """
        for oid, reason in self.run_states.get(run, ()):
            if reason.startswith(reason_prefix) and store.get(oid, "run").get("journal") == entry:
                return True
        return False


def ours_now(store: Repository, info: Any, now_ns: int | None = None) -> bool:
    """Whether ``--continue`` may pick session ``info``: this state dir created or has run it, and none of
    its times (metadata, run states) is in the future."""
    from kxen_agent.errors import KxenError

    now = time.time_ns() if now_ns is None else now_ns
    try:
        local = LocalRecords.read(store, info.id)
        if not (local.created_here or local.ran_here):
            return False
        if max(info.meta["createdNs"], info.meta.get("revisedNs", 0)) > now:
            return False
        for oid in info.runs.values():
            st = store.get(oid, "run")
            if max(st.get("updatedNs", 0), st.get("startedNs", 0)) > now:
                return False
    except (KxenError, KeyError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class TrustRecord:
    """One trust record (§14.13): a lock, or an (endpoint, key variable) pair, this state dir accepts."""

    what: str  # "lock" | "pair"
    endpoint: str | None
    key_env: str | None
    how: str  # one of HOWS
    lock: bytes | None = None
    session: str | None = None
    accepted_ns: int = 0

    def ref_name(self) -> str:
        if self.what == "lock":
            assert self.lock is not None
            return f"locks/{self.lock.hex()}"
        import blake3

        key = f"{normal_url(self.endpoint) or ''}\n{self.key_env or ''}".encode()
        return f"pairs/{blake3.blake3(key).hexdigest()}"

    def to_value(self) -> dict:
        v: dict[str, Any] = {"what": self.what, "endpoint": self.endpoint, "keyEnv": self.key_env, "how": self.how,
                             "session": self.session, "acceptedNs": self.accepted_ns}
        if self.lock is not None:
            v["lock"] = self.lock
        return v

    def encode(self) -> bytes:
        return encode(self.to_value())

    @classmethod
    def decode(cls, data: bytes) -> "TrustRecord | None":
        """The record a blob holds, or None if it is not one (a damaged record accepts nothing)."""
        try:
            v = decode_strict(data)
        except Exception:
            return None
        if not isinstance(v, dict) or v.get("what") not in ("lock", "pair") or v.get("how") not in HOWS:
            return None
        lock = v.get("lock")
        if v["what"] == "lock" and not (isinstance(lock, bytes) and len(lock) == 32):
            return None
        if not all(isinstance(v.get(k), (str, type(None))) for k in ("endpoint", "keyEnv", "session")):
            return None
        return cls(v["what"], v.get("endpoint"), v.get("keyEnv"), v["how"], lock, v.get("session"),
                   v.get("acceptedNs") if isinstance(v.get("acceptedNs"), int) else 0)


class TrustStore:
    """The trust records of one state dir (the ref group :data:`TRUST_GROUP`, each ref naming a blob)."""

    def __init__(self, store: Repository) -> None:
        self.store = store
        self._cache: list[TrustRecord] | None = None

    def records(self) -> list[TrustRecord]:
        if self._cache is None:
            refs = self.store.refs.read(TRUST_GROUP).refs
            out = []
            for name, oid in sorted(refs.items()):
                if not (name.startswith("locks/") or name.startswith("pairs/")):
                    continue
                rec = TrustRecord.decode(self.store.get(oid, "blob"))
                if rec is not None and rec.ref_name() == name:
                    out.append(rec)
            self._cache = out
        return self._cache

    def locks(self) -> set[bytes]:
        return {r.lock for r in self.records() if r.lock is not None}

    def pairs(self) -> set[tuple[str | None, str | None]]:
        return {(normal_url(r.endpoint), r.key_env) for r in self.records()}

    def add(self, rec: TrustRecord, *, reason: str) -> bool:
        """Record ``rec`` (durably: a blob and a ref in one transaction); False if an equal one is there."""
        name = rec.ref_name()
        current = self.store.refs.read(TRUST_GROUP).refs.get(name)
        if current is not None:
            old = TrustRecord.decode(self.store.get(current, "blob"))
            if old is not None and (old.endpoint, old.key_env, old.lock) == (rec.endpoint, rec.key_env, rec.lock):
                return False
        rec = TrustRecord(rec.what, rec.endpoint, rec.key_env, rec.how, rec.lock, rec.session,
                          rec.accepted_ns or time.time_ns())
        with self.store.step(TRUST_GROUP) as step:
            step.update(name, current, step.put("blob", rec.encode()))
            step.commit(reason)
        self._cache = None
        return True

    def origin(self) -> str:
        """This state dir's id (§14.6 ``origin``): ``sd_`` and 20 hex digits, made on first use."""
        oid = self.store.refs.read(TRUST_GROUP).refs.get("id")
        if oid is not None:
            try:
                text = self.store.get(oid, "blob").decode("ascii")
                if text.startswith("sd_") and len(text) == 23:
                    return text
            except UnicodeDecodeError:
                pass
        text = "sd_" + os.urandom(10).hex()
        with self.store.step(TRUST_GROUP) as step:
            step.update("id", oid, step.put("blob", text.encode("ascii")))
            step.commit("trust: state dir id")
        return text

    def known_origin(self) -> str | None:
        """This state dir's id if it has one (never makes one: reading commands write nothing)."""
        oid = self.store.refs.read(TRUST_GROUP).refs.get("id")
        if oid is None:
            return None
        try:
            return self.store.get(oid, "blob").decode("ascii")
        except UnicodeDecodeError:
            return None


def lock_problem(lock: Mapping[str, Any], lock_oid: bytes, endpoint: str | None, key_env: str | None, *,
                 lock_local: bool, trusted_locks: Iterable[bytes],
                 trusted_pairs: Iterable[tuple[str | None, str | None]]) -> str | None:
    """Why a run may not use ``lock`` with (``endpoint``, ``key_env``) here, or None when it may.

    ``lock_local``: this state dir ran the session with this lock (or
    registered it); ``trusted_*``: its trust records. Pure: the caller
    reads the records.
    """
    if lock.get("mcp") and not (lock_local or lock_oid in set(trusted_locks)):  # §14.15: launch commands
        return "its agent lock starts MCP servers (commands this machine would run) written on another machine"
    if lock.get("provider") == "script":
        if lock_local or lock_oid in set(trusted_locks):
            return None
        return "its agent lock is a script (a list of tool calls) written on another machine"
    if official_pair(endpoint, key_env):
        return None
    pair = (normal_url(endpoint), key_env)
    if pair in set(trusted_pairs):
        return None
    if (lock_local or lock_oid in set(trusted_locks)) and pair == (normal_url(lock_pair(lock)[0]), lock_pair(lock)[1]):
        return None
    what = f"the value of {key_env}" if key_env else "the session's history (no key)"
    return f"it would send {what} to {endpoint or '-'}, a pair of endpoint and key variable this machine has not accepted"
