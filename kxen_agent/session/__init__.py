"""The session layer: durable conversations over the object store.

A Session is a ref group of the store (``sessions/<ses_id>``) naming its
metadata, its newest message and its runs' states; the shapes of its
objects are checked where they come in (the hook the store's fsck and
bundle reader call); it is bound to a workspace identity, not a path, runs
with a DCPAgent lock captured from an agent definition, and moves between
runners as a bundle or through a Git remote.

Modules, one line each:

- :mod:`.ids` — session ids as typed: unique prefixes, a typo's near match, an id from elsewhere;
- :mod:`.sessions` — :class:`SessionStore`: sessions, messages, forks, delete/undelete;
- :mod:`.names` — session names: their form, uniqueness, rename, and names from elsewhere (§14.16);
- :mod:`.schema` — the shapes of session objects (``objects_spec.md`` §14), checked on the way in;
- :mod:`.positions` — message ids by position, the cache ``fork --at`` finds a message with (§11a.1);
- :mod:`.grep_index` — the search index ``session grep`` reads, a cache of message texts (§11a.2);
- :mod:`.grep_format` — the search index's bytes and its scan, free of the store;
- :mod:`.grep_stamp` — the index's stamp: a search that reads no ref while the refs' files keep their stats;
- :mod:`.commit_links` — which tool call made a Git commit, from the checkpoints' recorded ``HEAD``s;
- :mod:`.status` — every status word of runs and operations;
- :mod:`.records` — frozen RunState and JournalEntry records;
- :mod:`.agent_def` — agent definition files parsed into a DCPAgent lock body;
- :mod:`.mcp_def` — ``[mcp.servers.NAME]``: MCP servers in a definition and the lock's ``mcp`` (§14.15);
- :mod:`.workspace` — workspace identity, binding checks and kxen Git worktrees;
- :mod:`.worktrees` — finding and re-creating sessions' worktrees (delete/undelete);
- :mod:`.checkpoints` — workspace checkpoints: commits of the workspace repository per tool call (§14.14);
- :mod:`.checkpoint_pack` — a checkpoint's commit and pack, in Git's formats, without two ``git`` processes;
- :mod:`.checkpoint_restore` — rewinding the workspace to a checkpoint, crash-safe and undoable;
- :mod:`.checkpoint_travel` — checkpoints in a bundle (§12.7a) or on a remote (§16.1), only when asked;
- :mod:`.transfer` — export to a bundle and import with a binding;
- :mod:`.share` — bundles signed (``ssh-keygen -Y``) and encrypted (age): sealing and opening (§12.14);
- :mod:`.damage` — sessions intact, damaged or unreadable, and the branch repair makes;
- :mod:`.repair` — repair's sources (bundles, the Git remote) and the branches of lost sessions;
- :mod:`.trust` — what this state dir decided itself and what arrived from elsewhere (§14.13);
- :mod:`.remote` — ``session push`` and the readers push and pull share;
- :mod:`.remote_pull` — ``session pull``;
- :mod:`.remote_listing` — ``session ls-remote``, incremental (its cache of what each remote's refs said);
- :mod:`.gitio` — ``git`` as the transport: the state dir's Git mirror and scratch repositories;
- :mod:`.narrow_push` — a push's remote advertises only the refs it needs (``receive.hideRefs``), where it may;
- :mod:`.push_pack` — a push's pack and index, its entries compressed by two threads;
- :mod:`.gitproc` — the one door to the ``git`` executable (safe configuration, timeouts).

It works over any :class:`~kxen_agent.store.protocols.Repository` (the disk
store, or a :class:`~kxen_agent.store.memory.MemoryStore`) and never
touches the object store's files itself. The one set of files of the state
dir it owns is the Git mirror ``<state dir>/git`` (:mod:`.gitio`: a cache
of sessions' Git images plus what each remote was last seen to hold). It
knows nothing of runs beyond the objects it reads (the run loop is the
runtime's). The names below are its public surface; everything else is
reached through its module, and a name beginning with ``_`` is nobody's
business outside this package.
"""

TYPE_CHECKING = False  # typing's own value at run time, without importing typing (session grep's lean start)

import kxen_agent.lazy

if TYPE_CHECKING:  # the names below, for type checkers and readers; at run time they load on first use
    from .agent_def import AgentDefinitionError, default_agent_definition, load_agent_definition, parse_agent_definition
    from .schema import RUN_RE, SES_RE, SESSION_SCHEMA, SessionSchema
    from .sessions import (
        BLOB_THRESHOLD,
        Message,
        SessionError,
        SessionInfo,
        SessionStore,
        UnknownSession,
        msg_id,
        new_id,
    )
    from .transfer import ImportedSessions, export_sessions, import_sessions
    from .workspace import (
        InvalidWorktreeName,
        WorkspaceError,
        WorkspaceIdentity,
        WorkspaceMismatch,
        WorkspaceNotFound,
        check_binding,
        inspect_workspace,
    )

# Name -> the module that defines it. Imported on first use (PEP 562), so
# that importing one module of this package (the CLI's start-up: a read
# command needs a few of them) does not import them all.
_LAZY: dict[str, str] = {
    "AgentDefinitionError": ".agent_def",
    "BLOB_THRESHOLD": ".sessions",
    "ImportedSessions": ".transfer",
    "InvalidWorktreeName": ".workspace",
    "Message": ".sessions",
    "RUN_RE": ".schema",
    "SESSION_SCHEMA": ".schema",
    "SES_RE": ".schema",
    "SessionError": ".sessions",
    "SessionInfo": ".sessions",
    "SessionSchema": ".schema",
    "SessionStore": ".sessions",
    "UnknownSession": ".sessions",
    "WorkspaceError": ".workspace",
    "WorkspaceIdentity": ".workspace",
    "WorkspaceMismatch": ".workspace",
    "WorkspaceNotFound": ".workspace",
    "check_binding": ".workspace",
    "default_agent_definition": ".agent_def",
    "export_sessions": ".transfer",
    "import_sessions": ".transfer",
    "inspect_workspace": ".workspace",
    "load_agent_definition": ".agent_def",
    "msg_id": ".sessions",
    "new_id": ".sessions",
    "parse_agent_definition": ".agent_def",
}


__getattr__, __dir__ = kxen_agent.lazy.lazy_surface(__name__, _LAZY, globals())
del kxen_agent  # bound by the import above; not a name of this package


__all__ = [
    "AgentDefinitionError",
    "BLOB_THRESHOLD",
    "ImportedSessions",
    "InvalidWorktreeName",
    "Message",
    "RUN_RE",
    "SESSION_SCHEMA",
    "SES_RE",
    "SessionError",
    "SessionInfo",
    "SessionSchema",
    "SessionStore",
    "UnknownSession",
    "WorkspaceError",
    "WorkspaceIdentity",
    "WorkspaceMismatch",
    "WorkspaceNotFound",
    "check_binding",
    "default_agent_definition",
    "export_sessions",
    "import_sessions",
    "inspect_workspace",
    "load_agent_definition",
    "msg_id",
    "new_id",
    "parse_agent_definition",
]
