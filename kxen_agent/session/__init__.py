"""The session layer: durable conversations over the object store.

A Session is a ref group of the store (``sessions/<ses_id>``) naming its
metadata, its newest message and its runs' states (:mod:`.sessions`); the
shapes of its objects are checked where they come in (:mod:`.schema`, the
hook the store's fsck and bundle reader call); it is bound to a workspace
identity, not a path (:mod:`.workspace`), runs with a DCPAgent lock
captured from an agent definition (:mod:`.agent_def`), and moves between
runners as a bundle (:mod:`.transfer`).

It works over any :class:`~kxen_agent.store.protocols.Repository` (the disk
store, or a :class:`~kxen_agent.store.memory.MemoryStore`); it never touches
the state dir's files itself, and it knows nothing of runs beyond the
objects it reads (the run loop is the runtime's). The names below are its
public surface; everything else is reached through its module, and a name
beginning with ``_`` is nobody's business outside this package.
"""

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
