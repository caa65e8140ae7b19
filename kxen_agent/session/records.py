"""A run's state and its journal entries as frozen records (``objects_spec.md`` §14.5, §14.6).

:class:`RunState` and :class:`JournalEntry` are the typed form of the decoded
``run`` and ``journal`` objects: ``from_cbor`` takes the map the store decodes
(checked by :mod:`.schema` first), ``to_cbor`` gives back a map that encodes to
the same bytes. An optional key is kept absent or present exactly as read
(:data:`ABSENT`), a key this version does not know is kept in ``extra`` (§14:
a newer writer may add keys; a reader passes them on), and status words come
back as exact strings. So ``X.from_cbor(v).to_cbor()`` encodes byte for byte
as ``v`` did (``tests/session/test_records.py``, on the spec's vectors and on
the objects a real run writes).

Pure values: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .status import Approval, ApproverName, OpSource, OpState, RunStatus

__all__ = ["ABSENT", "JournalEntry", "RunState"]


class _Absent:
    """An optional key that is not in the object (distinct from a key whose value is null)."""

    _one: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


def _key(f: Any) -> str:
    return f.metadata.get("key", f.name)


class _Record:
    """from_cbor / to_cbor over the dataclass fields; each field's metadata names its key and says whether
    it is optional (absent when :data:`ABSENT`)."""

    extra: tuple[tuple[str, Any], ...]

    @classmethod
    def from_cbor(cls, value: Mapping[str, Any]) -> Any:
        kw: dict[str, Any] = {}
        known = set()
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            key = _key(f)
            known.add(key)
            if key in value:
                conv = f.metadata.get("enum")
                kw[f.name] = conv(value[key]) if conv is not None else value[key]
            elif not f.metadata.get("optional"):
                raise KeyError(key)
        kw["extra"] = tuple((k, v) for k, v in value.items() if k not in known)
        return cls(**kw)

    def to_cbor(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if v is ABSENT:
                continue
            out[_key(f)] = v.value if f.metadata.get("enum") is not None and v is not None else v
        out.update(self.extra)
        return out


def _req(key: str | None = None, enum: Any = None) -> Any:
    return field(metadata={"key": key, "enum": enum} if key else {"enum": enum})


def _opt(key: str | None = None, enum: Any = None) -> Any:
    meta = {"optional": True, "enum": enum}
    if key:
        meta["key"] = key
    return field(default=ABSENT, metadata=meta)


@dataclass(frozen=True)
class RunState(_Record):
    """One state of a DCPRun (§14.5). Optional keys are :data:`ABSENT` when the object lacks them."""

    id: str = _req()
    session: str = _req()
    index: int = _req()
    task: str = _req()
    model: str = _req()
    agent: bytes = _req()
    status: RunStatus = _req(enum=RunStatus)
    turn: int = _req()
    result: str | None = _req()
    error: str | None = _req()
    settled: bool = _req()
    start_head: bytes = _req("startHead")
    started_ns: int = _req("startedNs")
    updated_ns: int = _req("updatedNs")
    previous: bytes = _opt()
    journal: bytes = _opt()
    requested_model: str = _opt("requestedModel")
    base_url: str | None = _opt("baseUrl")
    api_key_env: str | None = _opt("apiKeyEnv")
    retry_of: str = _opt("retryOf")
    usage: Mapping[str, int] = _opt()
    compacted_turn: int = _opt("compactedTurn")
    turn_usage: Mapping[str, int] | None = _opt("turnUsage")
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True)
class JournalEntry(_Record):
    """One state of one operation (§14.6). Optional keys are :data:`ABSENT` when the object lacks them."""

    op: str = _req()
    run: str = _req()
    turn: int = _req()
    call_id: str = _req("callId")
    tool: str = _req()
    arguments: str = _req()
    message: bytes = _req()
    side_effects: bool = _req("sideEffects")
    state: OpState = _req(enum=OpState)
    source: OpSource = _req(enum=OpSource)
    time_ns: int = _req("timeNs")
    output: str = _opt()
    output_blob: bytes = _opt("outputBlob")
    is_error: bool = _opt("isError")
    approval: Approval = _opt(enum=Approval)
    approver: ApproverName = _opt(enum=ApproverName)
    note: str = _opt()
    origin: str = _opt()
    checkpoint_before: str = _opt("checkpointBefore")
    checkpoint_after: str = _opt("checkpointAfter")
    previous: bytes = _opt()
    extra: tuple[tuple[str, Any], ...] = ()
