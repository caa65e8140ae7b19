"""Sessions: durable conversations as objects and refs.

A Session is a ref group ``sessions/<ses_id>`` with these refs
(``objects_spec.md`` §14):

- ``meta``: the Session metadata object (kind ``session``): ids, fork
  fields, the DCPAgent lock (a link to the ``agent`` object) and the
  workspace binding. A rebind or import writes a new metadata object that
  links to the previous one.
- ``head``: the newest message (kind ``message``); the history is the chain
  of ``parent`` links from it, like Git commits. Absent while empty.
- ``runs/<run_id>``: the newest state object of each DCPRun (the runtime's).

A fork is a new group whose ``head`` is the fork point: it shares every
history object with its parent, so forking costs one metadata object and
one ref transaction whatever the history's length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

from kxen_agent.errors import KxenError, UsageError
from kxen_agent.store import AmbiguousId, CorruptObject, MissingObject, RefUpdate
from kxen_agent.store.protocols import ObjectStore, Repository

from .ids import (MIN_PREFIX, AmbiguousPrefix, SessionError, UnknownSession, is_id_or_prefix,  # noqa: F401
                  near_id, resolve_prefix)
from .schema import SES_RE, misplaced, put, read, text_blob
from .workspace import (
    WorkspaceIdentity,
    WorkspaceNotFound,
    check_binding,
    check_fork_binding,
    create_worktree,
    highest_missing_dir,
    inspect_workspace,
    remove_worktree,
    rollback_worktree,
    validate_worktree_name,
    worktree_location,
)

if TYPE_CHECKING:
    from .worktrees import KxenWorktree

__all__ = [
    "AmbiguousPrefix",
    "BLOB_THRESHOLD",
    "Message",
    "SessionError",
    "SessionInfo",
    "SessionStore",
    "UnknownSession",
    "msg_id",
    "new_id",
    "resolve_prefix",
]

#: Message content longer than this (UTF-8 bytes) is stored in a blob object,
#: so identical tool outputs are stored once.
BLOB_THRESHOLD = 1024

NS = "sessions"
_SES_RE = SES_RE
_MSG_RE = re.compile(r"msg_([0-9a-fA-F]{8,64})")



def new_id(prefix: str) -> str:
    import secrets  # here: a read command never makes an id, and the module costs start-up

    return f"{prefix}_{secrets.token_hex(10)}"


def msg_id(oid: bytes) -> str:
    return "msg_" + oid.hex()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


class Message(NamedTuple):
    """One history message, as read back (``content`` already resolved from its blob).

    A named tuple: a resume makes one per message of the history, and a
    tuple is made in a fraction of a frozen dataclass's time.
    """

    oid: bytes
    seq: int
    role: str
    content: str | None
    run: str | None
    tool_calls: list[dict]
    tool_call_id: str | None
    parent: bytes | None
    #: A ``compaction`` message's last summarized message (§14.4); None for the other roles.
    through: bytes | None = None

    @property
    def id(self) -> str:
        return msg_id(self.oid)

    def to_provider(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "seq": self.seq,
            "role": self.role,
            "run": self.run,
            "content": self.content,
            "toolCalls": self.tool_calls,
            "toolCallId": self.tool_call_id,
            **({"through": msg_id(self.through)} if self.through is not None else {}),
        }


@dataclass(frozen=True)
class SessionInfo:
    """A session's metadata and refs, as read at one moment."""

    id: str
    meta_oid: bytes
    meta: dict
    head: bytes | None
    runs: dict[str, bytes]
    deleted_ns: int | None
    fence: int

    @property
    def workspace(self) -> WorkspaceIdentity:
        return WorkspaceIdentity.from_record(self.meta["workspace"])

    @property
    def agent_oid(self) -> bytes:
        return self.meta["agent"]

    @property
    def group(self) -> str:
        return f"{NS}/{self.id}"

    def to_json(self) -> dict:
        m = self.meta
        return {
            "id": self.id,
            "parentId": m.get("parentId"),
            "branchRootId": m["branchRootId"],
            "forkPoint": m.get("forkPoint"),
            "forkKind": m.get("forkKind"),
            "createdNs": m["createdNs"],
            "agentLock": self.agent_oid.hex(),
            "workspace": _ws_json(m["workspace"]),
            "head": msg_id(self.head) if self.head else None,
            "deleted": self.deleted_ns is not None,
            "name": m.get("name"),
        }


def _ws_json(rec: dict) -> dict:
    keymap = {"repo_root": "repoRoot", "remote_hash": "remoteHash"}
    return {keymap.get(k, k): v for k, v in rec.items()}


class SessionStore:
    """Sessions, messages and forks over a :class:`~kxen_agent.store.protocols.Repository`.

    The disk :class:`~kxen_agent.store.Store` in use, a
    :class:`~kxen_agent.store.memory.MemoryStore` in tests: nothing here
    needs a path (``store.root`` only names the store in messages).
    """

    def __init__(self, store: Repository) -> None:
        self.store = store
        #: The name the next :meth:`create` gives its session (``run -n NAME``: the runner creates it).
        self.new_name: str | None = None

    # ------------------------------------------------------------ lookup

    def group(self, ses: str) -> str:
        return f"{NS}/{ses}"

    def check_id(self, ses: str) -> str:
        if not _SES_RE.fullmatch(ses):
            raise UsageError(f"{ses!r} is not a session id (expected ses_ followed by letters and digits)")
        return ses

    def resolve_id(self, text: str, *, include_deleted: bool = False) -> str:
        """The session id ``text`` names: a full id, or a unique prefix (``ses_6508``) as Git takes them.

        UnknownSession if none matches; :class:`AmbiguousPrefix` (exit 2,
        the candidates listed) if several do. A deleted session counts only
        with ``include_deleted`` (``session undelete``).
        """
        text = text.strip()
        if _SES_RE.fullmatch(text) and self._exists(text, include_deleted):
            return text  # the common case: a full id, one ref file read
        from . import names

        if not is_id_or_prefix("ses", text) and names.is_name(text):
            # A name never looks like an id (names.check_name), so it is read only when the text is no id.
            found_name = names.find(self, text, include_deleted=include_deleted)
            if found_name is None:
                raise names.UnknownName(text, self.store.root)
            return found_name

        def ids() -> list[str]:
            out = []
            for group in self.store.refs.groups(NS):
                sid = group.split("/", 1)[1]
                if sid.startswith(text) and self._exists(sid, include_deleted):
                    out.append(sid)
            return out

        found = resolve_prefix("session", "ses", text, ids, f"in state dir {self.store.root}")
        if found is None:
            every = [g.split("/", 1)[1] for g in self.store.refs.groups(NS)]
            raise UnknownSession(text, self.store.root,
                                 near_id(text, [i for i in every if self._exists(i, include_deleted)]))
        return found

    def _exists(self, ses: str, include_deleted: bool) -> bool:
        try:
            state = self.store.refs.read(self.group(ses))
        except KxenError:
            return True  # damaged: let get() name the damage
        return "meta" in state.refs and (include_deleted or state.deleted_ns is None)

    def get(self, ses: str, *, include_deleted: bool = False) -> SessionInfo:
        self.check_id(ses)
        state = self.store.refs.read(self.group(ses))
        meta_oid = state.refs.get("meta")
        if meta_oid is None or (state.deleted_ns is not None and not include_deleted):
            raise UnknownSession(ses, self.store.root)
        meta = read(self.store, meta_oid, "session")
        wrong = misplaced(ses, "meta", meta)
        if wrong:
            raise CorruptObject(meta_oid.hex(), f"{wrong}; `kxen-agent fsck` lists every damaged object")
        runs = {name[5:]: v for name, v in state.refs.items() if name.startswith("runs/")}
        return SessionInfo(ses, meta_oid, meta, state.refs.get("head"), runs, state.deleted_ns, state.fence)

    def list(self, *, include_deleted: bool = False,
             on_damaged: Callable[[str, KxenError], None] | None = None) -> list[SessionInfo]:
        """Every session, oldest first. A group that does not read as a session
        (a bad id, damaged metadata) is passed to ``on_damaged(group, error)``
        and left out, as ``git for-each-ref`` ignores a broken ref; without
        ``on_damaged`` its error is raised."""
        out = []
        for group in self.store.refs.groups(NS):
            ses = group.split("/", 1)[1]
            try:
                out.append(self.get(ses, include_deleted=include_deleted))
            except UnknownSession:
                continue
            except KxenError as e:
                if on_damaged is None:
                    raise
                on_damaged(group, e)
        out.sort(key=lambda s: (s.meta["createdNs"], s.id))
        return out

    def activity_ns(self, info: SessionInfo) -> int:
        """When the session last changed: its newest metadata or run state (wall clock, informative)."""
        latest = max(info.meta["createdNs"], info.meta.get("revisedNs", 0))
        for oid in info.runs.values():
            st = read(self.store, oid, "run")
            latest = max(latest, st.get("updatedNs", 0), st.get("startedNs", 0))
        return latest

    def latest_for_workspace(self, path: str, keep: Callable[[SessionInfo], bool] | None = None) -> SessionInfo | None:
        """The session last active among those bound to the workspace at ``path`` (``--continue``).

        Bound means: recorded at ``path``'s realpath; failing that, recorded
        with ``path``'s identity elsewhere (the checkout moved, or is another
        clone: the resume then says how to rebind). Damaged sessions are
        skipped.
        """
        root = os.path.realpath(path)
        infos = [i for i in self.list(on_damaged=lambda group, e: None) if keep is None or keep(i)]
        here = [i for i in infos if i.meta["workspace"].get("root") == root]
        try:
            current: WorkspaceIdentity | None = inspect_workspace(root)
        except KxenError:
            current = None
        if not here:
            if current is None:
                return None
            here = [i for i in infos if i.meta["workspace"].get("identity") == current.identity]
        # On branch B, a session bound to B comes first (issue #30): one bound to another branch
        # only when none is, and the resume then says how to fork onto B.
        if current is not None and current.branch:
            on_branch = [i for i in here if i.meta["workspace"].get("branch") == current.branch]
            here = on_branch or here
        best: tuple[int, str] | None = None
        chosen = None
        for info in here:
            try:
                key = (self.activity_ns(info), info.id)
            except KxenError:
                continue
            if best is None or key > best:
                best, chosen = key, info
        return chosen

    def agent(self, info: SessionInfo) -> dict:
        return read(self.store, info.agent_oid, "agent")

    # ------------------------------------------------------------ messages

    def read_message(self, oid: bytes) -> Message:
        v = read(self.store, oid, "message")
        get = v.get
        blob = get("contentBlob")  # the schema says: a link, and then no "content"
        return Message(oid, v["seq"], v["role"], get("content") if blob is None else text_blob(self.store, blob),
                       get("run"), get("toolCalls", []), get("toolCallId"), get("parent"), get("through"))

    def iter_back(self, head: bytes | None) -> Iterator[Message]:
        """Messages from ``head`` back to the first (newest first; streams)."""
        cur = head
        while cur is not None:
            m = self.read_message(cur)
            yield m
            cur = m.parent

    def history(self, head: bytes | None) -> list[Message]:
        out = list(self.iter_back(head))
        out.reverse()
        return out

    def iter_forward(self, head: bytes | None) -> Iterator[Message]:
        """Oldest first without holding the whole history: walks back once
        collecting only ids (32 bytes each), then reads forward."""
        ids: list[bytes] = []
        cur = head
        while cur is not None:
            ids.append(cur)
            cur = read(self.store, cur, "message").get("parent")
        for oid in reversed(ids):
            yield self.read_message(oid)

    def make_message(
        self,
        parent: bytes | None,
        role: str,
        content: str | None,
        *,
        run: str | None = None,
        tool_calls: list[dict] | None = None,
        tool_call_id: str | None = None,
    ) -> bytes:
        """Write one message object (not yet on any ref); return its id."""
        seq = 0 if parent is None else read(self.store, parent, "message")["seq"] + 1
        return self._put_message(parent, seq, role, content, run, tool_calls, tool_call_id)

    def _put_message(self, parent, seq, role, content, run, tool_calls, tool_call_id, through=None) -> bytes:
        v: dict[str, Any] = {"seq": seq, "role": role}
        if parent is not None:
            v["parent"] = parent
        if content is not None and len(content.encode("utf-8")) > BLOB_THRESHOLD:
            v["contentBlob"] = self.store.put("blob", content.encode("utf-8"))
        else:
            v["content"] = content
        if run is not None:
            v["run"] = run
        if tool_calls:
            v["toolCalls"] = [
                {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in tool_calls
            ]
        if tool_call_id is not None:
            v["toolCallId"] = tool_call_id
        if through is not None:
            v["through"] = through
        return put(self.store, "message", v)

    def append_messages(self, parent: bytes | None, messages: list[dict]) -> bytes | None:
        """Write a chain of messages after ``parent``; return the new head id."""
        head = parent
        seq = -1 if parent is None else read(self.store, parent, "message")["seq"]
        with self.store.batch():
            for m in messages:
                seq += 1
                head = self._put_message(
                    head, seq, m["role"], m.get("content"), m.get("run"), m.get("tool_calls"), m.get("tool_call_id"),
                    m.get("through"),
                )
        return head

    def resolve_message(self, info: SessionInfo, text: str) -> bytes:
        """A ``msg_`` id or unique prefix (8+ hex) in ``info``'s history."""
        m = _MSG_RE.fullmatch(text.strip())
        if not m:
            raise UsageError(f"{text!r} is not a message id (expected msg_ followed by 8 to 64 hex digits)")
        listing = f"`kxen-agent session log {info.id}` lists its messages"
        try:
            oid = self.store.resolve(m.group(1))
        except MissingObject:
            raise UsageError(f"message {text} is not in state dir {self.store.root}; {listing}") from None
        except AmbiguousId:
            raise UsageError(
                f"message id prefix {text} is ambiguous in state dir {self.store.root}: give more hex digits; {listing}"
            ) from None
        if self.store.read_raw(oid).kind != "message":
            raise UsageError(f"{text} names a {self.store.read_raw(oid).kind} object, not a message; {listing}")
        target_seq = read(self.store, oid, "message")["seq"]
        # The message must be in *this* session's history (forks share
        # objects): the positions cache answers in one lookup (§11a.1); a
        # refusal, or a store without files, walks back from the head.
        from .positions import find

        if find(self.store, info.group, info.head, oid, target_seq):
            return oid
        cur = info.head
        while cur is not None:
            if cur == oid:
                return oid
            v = read(self.store, cur, "message")
            if v["seq"] <= target_seq:
                break
            cur = v.get("parent")
        newest = f"its newest message is {msg_id(info.head)}" if info.head else "its history is empty"
        raise UsageError(f"message {text} is not in the history of session {info.id} ({newest}); {listing}")

    def _pending_calls(self, point: bytes) -> tuple[list[str], bytes | None]:
        """The tool calls asked at or before ``point`` whose results come after it,
        and the message just before the assistant turn that asked them.

        Reads only back to that turn's assistant message, so the cost is the
        turn's size, not the history's.
        """
        answered: set[str] = set()
        cur: bytes | None = point
        while cur is not None:
            v = read(self.store, cur, "message")
            if v["role"] == "tool":
                if v.get("toolCallId") is not None:
                    answered.add(v["toolCallId"])
                cur = v.get("parent")
                continue
            if v["role"] == "assistant" and v.get("toolCalls"):
                return [c["id"] for c in v["toolCalls"] if c["id"] not in answered], v.get("parent")
            break
        return [], None

    def _next_valid_point(self, head: bytes, point: bytes) -> bytes | None:
        """The oldest message after ``point`` (up to ``head``) where no tool call is pending.

        Only used to word an error: it walks the history between the two.
        """
        newer: list[bytes] = []
        cur: bytes | None = head
        while cur is not None and cur != point:
            newer.append(cur)
            cur = read(self.store, cur, "message").get("parent")
        pending = set(self._pending_calls(point)[0])
        for oid in reversed(newer):
            v = read(self.store, oid, "message")
            if v["role"] == "tool":
                pending.discard(v.get("toolCallId"))
            elif v["role"] == "assistant" and v.get("toolCalls"):
                pending = {c["id"] for c in v["toolCalls"]}
            if not pending:
                return oid
        return None

    def _check_fork_point(self, info: SessionInfo, point: bytes, explicit: bool) -> None:
        """Refuse a fork point that would split an assistant's tool calls from their results."""
        pending, before = self._pending_calls(point)
        if not pending:
            return
        calls = ", ".join(pending)
        before_txt = f"{msg_id(before)} (before that turn)" if before else "none before it (the turn opens the history)"
        if not explicit:
            instead = f"fork --at {msg_id(before)} (before that turn)" if before else "there is no earlier valid point"
            raise SessionError(
                f"cannot fork session {info.id} at its newest message {msg_id(point)}: it asks for tool call(s) "
                f"{calls} whose results are not in the history yet (a run is in progress or waits for "
                f"`kxen-agent run resolve`); {instead}, or fork once the turn is finished"
            )
        after = self._next_valid_point(info.head, point) if info.head is not None else None
        after_txt = f"{msg_id(after)} (after its results)" if after else "none after it yet (the turn is unfinished)"
        raise UsageError(
            f"cannot fork session {info.id} at {msg_id(point)}: it would split tool call(s) {calls} from their "
            f"results; the nearest valid fork points are {before_txt} and {after_txt}"
        )

    # ------------------------------------------------------------ create / fork

    def put_agent(self, lock_body: dict) -> bytes:
        return put(self.store, "agent", lock_body)

    def _meta(
        self,
        ses: str,
        *,
        agent: bytes,
        workspace: WorkspaceIdentity,
        parent_id: str | None,
        branch_root_id: str,
        fork_point: str | None,
        fork_kind: str | None,
        reason: str,
        previous: bytes | None = None,
        created_ns: int | None = None,
        name: str | None = None,
    ) -> dict:
        v: dict[str, Any] = {
            "id": ses,
            "parentId": parent_id,
            "branchRootId": branch_root_id,
            "forkPoint": fork_point,
            "forkKind": fork_kind,
            "agent": agent,
            "workspace": workspace.to_record(),
            "createdNs": created_ns if created_ns is not None else time.time_ns(),
            "reason": reason,
            "revisedNs": time.time_ns(),
        }
        if previous is not None:
            v["previous"] = previous
        if name is not None:
            v["name"] = name
        return v

    def create(self, agent_lock: dict, workspace: WorkspaceIdentity, *, name: str | None = None) -> SessionInfo:
        """A new root session bound to ``workspace`` with the given DCPAgent lock (and ``name``, default
        :attr:`new_name`, §14.16)."""
        from . import names

        name = name if name is not None else self.new_name
        ses = new_id("ses")
        with names.lock(self) if name is not None else _nothing():
            names.claim(self, name)
            # One durable step: the agent lock, the metadata and the ref that names them.
            step = self.store.step(self.group(ses))
            agent = put(step, "agent", agent_lock)
            meta = put(
                step, "session",
                self._meta(
                    ses, agent=agent, workspace=workspace, parent_id=None, branch_root_id=ses,
                    fork_point=None, fork_kind=None, reason="create", name=name,
                ),
            )
            step.update("meta", None, meta)
            step.commit("session: create")
        return self.get(ses)

    def fork(self, ses: str, *, at: str | None = None, worktree: str | None = None,
             workspace: str | None = None, worktree_at: str | None = None, name: str | None = None) -> SessionInfo:
        """A new complete Session sharing ``ses``'s history up to ``at`` (default: its head).

        Never needs the parent's run lease: it reads immutable objects and
        one consistent snapshot of the parent's refs. A fork point that would
        split an assistant's tool calls from their results is refused, naming
        the nearest valid points. With ``worktree``, the new worktree starts
        at the bound workspace's current HEAD. With ``workspace`` (a
        directory), the fork is bound to that checkout of the same repository
        and subdirectory, on whatever branch it is (``git switch -c
        feature-x``, then fork onto it): the metadata's reason is
        ``fork-workspace``. ``worktree_at`` (a checkpoint commit, ``--with-code``) starts the worktree there.
        ``name``: the fork's name (default ``<parent's name>/<n>``, §14.16).
        """
        from . import names

        if name is not None:
            names.claim(self, name)  # before a worktree is made; checked again under the lock
        if worktree is not None and workspace is not None:
            raise UsageError("give either --worktree NAME (a new worktree) or --workspace DIR (an existing "
                             "checkout), not both")
        parent = self.get(ses)
        point = self.resolve_message(parent, at) if at else parent.head
        if point is not None:
            self._check_fork_point(parent, point, explicit=at is not None)
        bound = parent.workspace
        made: tuple[str, str, str, str] | None = None  # (repository, worktree path, branch, its highest new dir)
        reason = "fork"
        if workspace is not None:
            current = inspect_workspace(workspace)
            check_fork_binding(bound, current)
            bound, reason = current, "fork-workspace"
        if worktree is not None:
            validate_worktree_name(worktree)
            # The worktree starts at the workspace's *current* HEAD (the
            # recorded one is only the HEAD at creation), and only from the
            # workspace the session is bound to.
            current = inspect_workspace(bound.root)
            check_binding(bound, current, rebind=False, session=ses)
            repo = current.repo_root or current.root
            # Undone from the repository it was added to, with the worktree's
            # top directory: the new binding may be a subdirectory of it.
            path = worktree_location(repo, worktree)
            made = (repo, path, f"kxen/{worktree}", highest_missing_dir(path))
            bound = create_worktree(dataclasses.replace(current, head=worktree_at) if worktree_at else current,
                                    worktree)
        try:
            new = new_id("ses")
            with names.lock(self):
                if name is None:
                    name = names.fork_name(self, parent)
                else:
                    names.claim(self, name)
                step = self.store.step(self.group(new))
                meta = put(
                    step, "session",
                    self._meta(
                        new,
                        agent=parent.agent_oid,
                        workspace=bound,
                        parent_id=parent.id,
                        branch_root_id=parent.meta["branchRootId"],
                        fork_point=msg_id(point) if point else None,
                        fork_kind="worktree" if worktree else "conversation",
                        reason=reason,
                        name=name,
                    ),
                )
                step.update("meta", None, meta)
                if point is not None:
                    step.update("head", None, point)
                step.commit(f"session: fork of {ses}")
        except BaseException:
            if made is not None:
                rollback_worktree(*made)
            raise
        return self.get(new)

    # ------------------------------------------------------------ binding

    def check_workspace(self, info: SessionInfo, path: str | None, *, rebind: bool) -> WorkspaceIdentity:
        """Check (and with ``rebind``, return) the workspace a resume would use."""
        recorded = info.workspace
        if path is None and not os.path.isdir(recorded.root):
            raise WorkspaceNotFound(
                f"session {info.id} is bound to workspace {recorded.root}, which no longer exists; if it moved, "
                f"bind the new path: kxen-agent --resume {info.id} --workspace NEW_PATH --rebind-workspace"
            )
        current = inspect_workspace(path if path is not None else recorded.root)
        check_binding(recorded, current, rebind=rebind, session=info.id)
        return current

    def rebind(self, ses: str, path: str, *, reason: str = "rebind", fence: int | None = None) -> SessionInfo:
        """Re-point the binding to ``path`` if the identity check passes there."""
        info = self.get(ses)
        current = self.check_workspace(info, path, rebind=True)
        if current.to_record() == info.meta["workspace"]:
            return info
        m = info.meta
        step = self.store.step(self.group(ses), fence=fence)
        meta = put(
            step, "session",
            self._meta(
                ses, agent=m["agent"], workspace=current, parent_id=m.get("parentId"),
                branch_root_id=m["branchRootId"], fork_point=m.get("forkPoint"),
                fork_kind=m.get("forkKind"), reason=reason, previous=info.meta_oid,
                created_ns=m["createdNs"], name=m.get("name"),
            ),
        )
        step.update("meta", info.meta_oid, meta)
        step.commit(f"session: {reason} to {current.root}")
        return self.get(ses)

    def rebound_meta(self, meta: dict, meta_oid: bytes, workspace: WorkspaceIdentity, reason: str, *,
                     into: ObjectStore | None = None) -> bytes:
        """Write a new metadata object for an imported session (no ref moved); ``into``: a step to put it in."""
        return put(
            into if into is not None else self.store, "session",
            self._meta(
                meta["id"], agent=meta["agent"], workspace=workspace, parent_id=meta.get("parentId"),
                branch_root_id=meta["branchRootId"], fork_point=meta.get("forkPoint"),
                fork_kind=meta.get("forkKind"), reason=reason, previous=meta_oid,
                created_ns=meta["createdNs"], name=meta.get("name"),
            ),
        )

    # ------------------------------------------------------------ delete / tree

    def delete(self, ses: str, *, worktree: bool = False) -> tuple[SessionInfo, KxenWorktree | None]:
        """Mark ``ses`` deleted; gc removes its refs after the grace period.

        With ``worktree``, also remove the Git worktree the session is bound
        to and its ``kxen/NAME`` branch, after checking that it is one kxen
        made, that it has no uncommitted changes, and that no other live
        session is bound to it; the branch's commit goes into the reflog
        reason, so ``undelete`` can put the worktree back.
        """
        info = self.get(ses)
        removed = None
        reason = "session: delete"
        if worktree:
            from .worktrees import find_kxen_worktree

            ws = info.workspace
            wt = find_kxen_worktree(ws)
            others = [s.id for s in self.list(on_damaged=lambda g, e: None)
                      if s.id != ses and s.meta["workspace"].get("repo_root") == wt.path]
            if others:
                raise SessionError(
                    f"session {ses}'s worktree {wt.path} is also the workspace of {', '.join(others)}; delete "
                    f"{'them' if len(others) > 1 else 'it'} first, or delete {ses} without --worktree"
                )
            remove_worktree(wt.main, wt.path, wt.branch)
            removed = wt
            # Percent-encoded: a reflog reason has no runs of whitespace (§6.1).
            reason = (f"session: delete --worktree {_quote(wt.path)} {wt.branch} at {wt.commit or '-'} "
                      f"of {_quote(wt.main)}")
        # With a worktree, ``meta`` is "updated" to itself: a transaction
        # without updates writes no reflog line, and this one's reason is
        # what ``undelete`` re-creates the worktree from.
        updates = [RefUpdate("meta", info.meta_oid, info.meta_oid)] if removed is not None else []
        self.store.refs.transaction(self.group(ses), updates, reason=reason, deleted_ns=time.time_ns())
        return info, removed

    def undelete(self, ses: str) -> tuple[SessionInfo, KxenWorktree | None, str | None]:
        """Clear the deleted marker of ``ses`` (before gc removed it): ``(info, worktree, problem)``.

        If the delete removed the session's worktree, it is re-created on
        its branch at the commit it was at (``worktree``); if that fails the
        session is restored all the same and ``problem`` says why.
        """
        state = self.store.refs.read(self.group(ses))
        if "meta" not in state.refs:
            raise UnknownSession(ses, self.store.root)
        if state.deleted_ns is None:
            raise SessionError(f"session {ses} is not deleted; nothing to undelete")
        wt = None
        for e in reversed(self.store.refs.reflog(self.group(ses))):
            if e.reason.startswith("session: delete"):
                wt = _parse_worktree_reason(e.reason)
                break
        self.store.refs.transaction(self.group(ses), [], reason="session: undelete", deleted_ns=None)
        info = self.get(ses)
        problem = None
        if wt is not None and not os.path.lexists(wt.path):
            from .worktrees import restore_worktree

            try:
                restore_worktree(wt)
            except KxenError as e:
                problem = str(e)
        return info, wt, problem

    def tree(self, ses: str) -> tuple[str, dict[str, list[str]], dict[str, SessionInfo]]:
        """(root id, children by parent id, infos) of the fork family of ``ses``."""
        info = self.get(ses)
        root = info.meta["branchRootId"]
        # Deleted sessions stay in the family (marked by ``deleted_ns``) so
        # that the forks of a deleted fork are still drawn under it.
        family = {s.id: s for s in self.list(include_deleted=True, on_damaged=lambda g, e: None)
                  if s.meta["branchRootId"] == root}
        children: dict[str, list[str]] = {}
        for s in family.values():
            p = s.meta.get("parentId")
            if p is not None:
                children.setdefault(p, []).append(s.id)
        # A parent gone altogether (its refs removed) is drawn as a placeholder under the root.
        for p in [p for p in children if p not in family and p != root]:
            children.setdefault(root, []).append(p)
        for v in children.values():
            v.sort(key=lambda i: (family[i].meta["createdNs"] if i in family else 0, i))
        return root, _acyclic(root, children, family), family

    def message_count(self, info: SessionInfo) -> int:
        if info.head is None:
            return 0
        return read(self.store, info.head, "message")["seq"] + 1


_WORKTREE_REASON = re.compile(
    r"session: delete --worktree (\S+) (kxen/\S+) at ([0-9a-f]{40}(?:[0-9a-f]{24})?|-) of (\S+)")


def _quote(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/._-~+@:,=")


def _parse_worktree_reason(reason: str) -> KxenWorktree | None:
    from urllib.parse import unquote

    from .worktrees import KxenWorktree

    m = _WORKTREE_REASON.fullmatch(reason)
    if m is None:
        return None
    commit = None if m.group(3) == "-" else m.group(3)
    return KxenWorktree(unquote(m.group(4)), unquote(m.group(1)), m.group(2), commit)


def _acyclic(root: str, children: dict[str, list[str]], family: dict[str, SessionInfo]) -> dict[str, list[str]]:
    """The fork tree from ``root`` with every session once, whatever ``parentId`` says.

    Hand-edited or imported metadata can name a parent that makes a cycle
    (a session its own parent, two naming each other): such a session is
    drawn once, under the root, instead of recursing forever.
    """
    tree: dict[str, list[str]] = {}
    seen = {root}
    pending = [root]
    while True:
        while pending:
            cur = pending.pop()
            kids = [c for c in children.get(cur, []) if c not in seen]
            seen.update(kids)
            if kids:
                tree[cur] = kids
            pending.extend(kids)
        orphans = sorted(i for i in family if i not in seen)
        if not orphans:
            return tree
        tree.setdefault(root, []).append(orphans[0])
        seen.add(orphans[0])
        pending.append(orphans[0])
