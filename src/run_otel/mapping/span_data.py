"""A span as plain data, before encoding, and the ids every run's spans get.

The ids are pure functions of the row (the run_id, the tool row's id), so a
re-export gives the same trace, and a trace id is the run's UUID where it has one.
Span ids hash the normalized run id (the UUID in lower case), so run ids that
differ only in the UUID's letter case, which share a trace id, share every span
id too. A later row with a run id an earlier row has gets ids of its own
(``duplicate_identity``; the rule is in ``pipeline/duplicates.py``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from opentelemetry.proto.trace.v1.trace_pb2 import Status

AttrValue = str | bool | int | float | tuple[str, ...]
# A span event: name, time, attributes.
Event = tuple[str, int, tuple[tuple[str, AttrValue], ...]]

# OTLP's own status codes (UNSET 0, OK 1, ERROR 2).
STATUS_UNSET: Final = Status.STATUS_CODE_UNSET
STATUS_OK: Final = Status.STATUS_CODE_OK
STATUS_ERROR: Final = Status.STATUS_CODE_ERROR

# A duration beyond a day is a broken row, not a slow call: treat it as absent
# so one bad value does not stretch a trace over weeks.
MAX_DURATION_MS: Final = 86_400_000
_UUID_RUN_ID: Final = re.compile(r"run-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{12})")


class SpanData(NamedTuple):
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, AttrValue], ...]
    status_code: int = STATUS_UNSET
    status_message: str = ""
    # Attributes removed to fit the limits (OTLP's own count; see limits.py).
    dropped_attributes_count: int = 0
    events: tuple[Event, ...] = ()
    # Spans of other traces this one links to: (trace id, span id).
    links: tuple[tuple[bytes, bytes], ...] = ()

    def attribute_map(self) -> dict[str, AttrValue]:
        return dict(self.attributes)


class LogData(NamedTuple):
    """An event as an OTLP log record at INFO, tied to a span: the GenAI conventions' newer form."""

    time_ns: int
    event_name: str
    trace_id: bytes
    span_id: bytes
    attributes: tuple[tuple[str, AttrValue], ...]


@dataclass(frozen=True)
class MappedRun:
    """A run's spans, root first, and the warnings its rows raised."""

    spans: list[SpanData]
    warnings: list[str] = field(default_factory=list)

    @property
    def root(self) -> SpanData:
        return self.spans[0]


def nonzero_window(digest: bytes, size: int) -> bytes:
    """The first non-zero ``size``-byte window of ``digest`` (OTLP forbids all-zero ids)."""
    first = digest[:size]
    if first.strip(b"\x00"):
        return first  # all but never zero: one slice, no loop
    for offset in range(0, len(digest) - size + 1, size):
        chunk = digest[offset : offset + size]
        if any(chunk):
            return chunk
    return nonzero_window(hashlib.sha256(digest).digest(), size)  # pragma: no cover - 2^-128 odds


def normalized_run_id(run_id: str) -> str:
    """``run-<uuid>`` with the UUID in lower case; any other run id as it is."""
    if run_id.islower() or not _UUID_RUN_ID.fullmatch(run_id):  # the common case costs one C call
        return run_id
    return "run-" + run_id[4:].lower()


def trace_id_for(run_id: str) -> bytes:
    """The UUID's 128 bits for ``run-<uuid>``, else SHA-256 of ``diagnosis_run:<run_id>``."""
    match = _UUID_RUN_ID.fullmatch(run_id)
    if match:
        uuid_bytes = bytes.fromhex("".join(match.groups()))
        if any(uuid_bytes):
            return uuid_bytes
    return nonzero_window(hashlib.sha256(f"diagnosis_run:{run_id}".encode()).digest(), 16)


def root_span_id_for(run_id: str) -> bytes:
    return nonzero_window(hashlib.sha256(f"run:{normalized_run_id(run_id)}".encode()).digest(), 8)


def completion_span_id_for(run_id: str) -> bytes:
    """The span that carries the final outcome of a run first sent as incomplete."""
    return nonzero_window(hashlib.sha256(f"run_completion:{normalized_run_id(run_id)}".encode()).digest(), 8)


def tool_span_id_for(run_id: str, tool_id: int) -> bytes:
    return nonzero_window(hashlib.sha256(f"tool_invocation:{normalized_run_id(run_id)}:{tool_id}".encode()).digest(), 8)


class RunIdentity(NamedTuple):
    """Whose ids a run row's spans get.

    ``key`` is what every span id but the trace's hashes: the normalized run id, or, for a
    later row with a run id an earlier row has, that and ``#`` and its own primary key.
    Such a row's root links to the trace of the row that owns the run id (``link``)."""

    key: str
    trace_id: bytes
    root_id: bytes
    link: tuple[bytes, bytes] | None = None  # the owning row's trace and root span
    owner_pk: int = 0  # the owning row's primary key; 0 for the owner itself

    @property
    def duplicate(self) -> bool:
        return self.link is not None


def identity_for(run_id: str) -> RunIdentity:
    """The ids of the row that owns ``run_id``: its trace is the run id's own, as SPEC section 1 says."""
    return RunIdentity(normalized_run_id(run_id), trace_id_for(run_id), root_span_id_for(run_id))


def duplicate_identity(run_id: str, row_pk: int, owner_run_id: str, owner_pk: int) -> RunIdentity:
    """The ids of a later row with the run id of the row ``owner_pk``: a trace of its own, linked to that row's."""
    key = f"{normalized_run_id(run_id)}#{row_pk}"
    trace_id = nonzero_window(hashlib.sha256(f"diagnosis_run:{key}".encode()).digest(), 16)
    owner = identity_for(owner_run_id)
    return RunIdentity(key, trace_id, root_span_id_for(key), (owner.trace_id, owner.root_id), owner_pk)
