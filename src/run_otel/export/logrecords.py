"""OTLP log records: the GenAI conventions' events, sent to the endpoint's logs service.

Events are moving from span events to log records; ``gen_ai.evaluation.result``
goes out as one, tied to the run's trace and root span. Not every endpoint
takes logs (Jaeger's does not by default), so this is off unless
``feedback.log_records`` is set, and a refusal never holds back traces: it is
logged once, counted as an unacknowledged batch, and the pass goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import SEVERITY_NUMBER_INFO, LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from .. import __version__
from ..config import ExportConfig
from ..mapping import attributes as A
from ..mapping.span_data import LogData
from .encoding import any_value
from .sinks import ExportError, GrpcSink, HttpSink, Sink
from .throttle import Throttle
from .transport import logs_tls

log = logging.getLogger(__name__)


# The logs service's reply (ExportLogsPartialSuccess) has the trace reply's field numbers and
# types, so the span sinks' parsing reads its rejected count and message unchanged.
class GrpcLogSink(GrpcSink):
    METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"

    def describe(self) -> str:
        return super().describe() + " (logs)"


class HttpLogSink(HttpSink):
    PATH = "/v1/logs"


def build_log_sink(config: ExportConfig, throttle: Throttle | None = None) -> GrpcLogSink | HttpLogSink:
    """The log records go to the traces' endpoint, so to the same receiver: pass its ``throttle``."""
    tls = logs_tls(config)
    if config.protocol == "http/protobuf":
        return HttpLogSink(config, tls, throttle)
    return GrpcLogSink(config, tls, throttle)


def encode_log_record(record: LogData) -> LogRecord:
    return LogRecord(
        time_unix_nano=record.time_ns,
        observed_time_unix_nano=record.time_ns,  # not "now": a re-send is byte-identical
        severity_number=SEVERITY_NUMBER_INFO,
        event_name=record.event_name,
        trace_id=record.trace_id,
        span_id=record.span_id,
        attributes=[KeyValue(key=k, value=any_value(v)) for k, v in record.attributes],
    )


def logs_request(records: Sequence[LogData], resource: Mapping[str, str]) -> bytes:
    """One ExportLogsServiceRequest with the traces' resource and scope, serialized."""
    return ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                resource=Resource(attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in resource.items()]),
                scope_logs=[
                    ScopeLogs(
                        scope=InstrumentationScope(name=A.SCOPE_NAME, version=__version__),
                        log_records=[encode_log_record(r) for r in records],
                        schema_url=A.SCHEMA_URL,
                    )
                ],
            )
        ]
    ).SerializeToString()


class LogRecordSender:
    """Sends log records; a refusal is logged once per process and counted, never raised."""

    def __init__(self, sink: Sink, resource: Mapping[str, str], on_failure: Callable[[], None] = lambda: None):
        self._sink = sink
        self._resource = dict(resource)
        self._on_failure = on_failure
        self._warned = False

    def send(self, records: Sequence[LogData]) -> bool:
        if not records:
            return True
        try:
            self._sink.send(logs_request(records, self._resource))
        except ExportError as exc:
            self._on_failure()
            if not self._warned:
                self._warned = True
                log.warning(
                    "gen_ai.evaluation.result log records not accepted (%s); traces are not held back. "
                    "If the endpoint takes no OTLP logs (Jaeger's does not by default), set feedback.log_records = false",
                    exc,
                )
            else:
                log.debug("log records not accepted: %s", exc)
            return False
        return True

    def close(self) -> None:
        self._sink.close()
