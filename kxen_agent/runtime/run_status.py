"""What a reader is shown of a stored run: its state, checked, and its status.

This module owns two rules that the run loop and the read commands
(``session list``, ``session show``, ``run status``) share: a run state is
read through the schema and refused if it is not the run's that names it
(:func:`read_run`), and an unsettled run whose session's lease no live
process holds is shown as ``interrupted`` (:func:`shown_status`). It is
kept apart from :mod:`.runner` so a read command can apply both without
importing the loop, its providers and its tools. It never writes and
never takes a lock.
"""

from __future__ import annotations

from kxen_agent.session.schema import misplaced, read
from kxen_agent.session.sessions import SessionInfo
from kxen_agent.session.status import INTERRUPTED, RunStatus
from kxen_agent.store import CorruptObject
from kxen_agent.store.protocols import Repository

from .lease import Lease, LeaseBackend

__all__ = ["read_run", "shown_status"]


def read_run(store: Repository, info: SessionInfo, run: str, oid: bytes) -> dict:
    """The run state ``oid`` that ``runs/<run>`` of session ``info`` names, checked (§14.5) and to be that run's."""
    st = read(store, oid, "run")
    wrong = misplaced(info.id, f"runs/{run}", st)
    if wrong:
        raise CorruptObject(oid.hex(), f"{wrong}; `kxen-agent fsck` lists every damaged object")
    return st


def shown_status(store: Repository, ses: str, st: dict, *, backend: LeaseBackend | None = None) -> str:
    """The status to show of run state ``st`` of session ``ses``: ``interrupted`` for an unsettled run
    (``running``, or ``completed`` before its final message) whose session's lease no live process
    holds — its process died (a crash, a kill, a full disk) and ``--resume`` finishes it — else the
    stored status (``input_required`` waits for a person — ``run resolve``, ``run approve`` / ``run deny``,
    ``session trust`` — not for a process).

    ``backend`` is where the lease lives (default: :func:`~.lease.lease_backend` of ``store``).
    """
    if (not st.get("settled") and st["status"] != RunStatus.INPUT_REQUIRED
            and not Lease.held(store, ses, backend=backend)):
        return INTERRUPTED
    return st["status"]
