"""The typed configuration: one frozen section per table of the TOML file."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import get_type_hints

from sqlalchemy.engine import URL, make_url

ENV_PREFIX = "RUN_OTEL_"
CONFIG_ENV = "RUN_OTEL_CONFIG"


# MySQL's --ssl-mode names, lower-cased.
TLS_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
VERIFYING_TLS_MODES = ("verify_ca", "verify_identity")


class ConfigError(ValueError):
    """A bad key or value, with the key's dotted name in the message."""


@dataclass(frozen=True)
class SourceConfig:
    url: str = "sqlite:///run-otel-demo.db"
    password_file: str = ""
    timezone: str = "UTC"
    connect_timeout_seconds: float = 10.0
    statement_timeout_seconds: float = 30.0
    tls_mode: str = "preferred"
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # Off by default: the JSON functions cost the agent's database 5.7x the CPU of sending the column.
    evidence_in_database: bool = False

    def connect_url(self) -> URL:
        """The URL to connect with, with the password from ``password_file`` if set."""
        url = make_url(self.url)
        if self.password_file:
            secret = Path(self.password_file).read_text(encoding="utf-8").strip()
            url = url.set(password=secret)
        return url


@dataclass(frozen=True)
class StateConfig:
    url: str = "sqlite:///run-otel-state.db"


@dataclass(frozen=True)
class PollConfig:
    interval_seconds: float = 5.0
    batch_size: int = 500
    settle_seconds: float = 2.0
    run_timeout_seconds: float = 3600.0
    gap_timeout_seconds: float = 600.0
    late_window_seconds: float = 600.0
    orphan_wait_seconds: float = 600.0
    start_from: str = "now"
    tool_chunk_size: int = 500
    retry_initial_seconds: float = 1.0
    retry_max_seconds: float = 60.0
    stuck_after_seconds: float = 300.0
    shutdown_timeout_seconds: float = 25.0
    backfill_retry_seconds: float = 300.0


@dataclass(frozen=True)
class ExportConfig:
    protocol: str = "grpc"
    endpoint: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 10.0
    # A receiver slower than timeout_seconds gets a longer deadline, doubled up to this.
    max_timeout_seconds: float = 60.0
    insecure: bool = True
    compression: str = "none"
    max_attempts: int = 3
    # PEM files: the CA that signed the receiver's certificate, and the client pair for mTLS.
    certificate: str = ""
    client_certificate: str = ""
    client_key: str = ""
    # The same for the OTLP log records (feedback.log_records); empty: the three above.
    logs_certificate: str = ""
    logs_client_certificate: str = ""
    logs_client_key: str = ""
    # Under the 4 MiB gRPC receive limit most receivers keep (the collector's, Jaeger's).
    max_request_bytes: int = 3 * 1024 * 1024

    def resolved_endpoint(self) -> str:
        """The OTLP endpoint, defaulting per protocol as the OTLP spec does."""
        if self.endpoint:
            return self.endpoint
        return "http://localhost:4318" if self.protocol == "http/protobuf" else "localhost:4317"


@dataclass(frozen=True)
class TraceConfig:
    agent_name: str = "diagnosis-agent"
    provider_name: str = ""
    conventions: list[str] = field(default_factory=lambda: ["gen_ai"])
    project_name: str = ""
    tool_time_anchor: str = "end"
    max_spans_per_trace: int = 1000
    max_attribute_length: int = 4096
    max_list_length: int = 128


@dataclass(frozen=True)
class ContentConfig:
    capture: bool = False
    max_length: int = 1024
    redact: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FeedbackConfig:
    enabled: bool = True
    # Runs created this long ago or less are rechecked for new or changed feedback.
    window_seconds: float = 86400.0
    interval_seconds: float = 60.0
    evaluation_name: str = "user_feedback"
    # Label -> gen_ai.evaluation.score.value. A feedback value matches a label whatever
    # its case, and with "-" or " " for "_"; the metric counts it under the label as
    # written here. A value no label matches counts as "other", with a warning.
    scores: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FEEDBACK_SCORES))
    negative: list[str] = field(default_factory=lambda: [k for k, v in DEFAULT_FEEDBACK_SCORES.items() if v == 0.0])
    # Also send each rating as a gen_ai.evaluation.result OTLP log record (the endpoint must take logs).
    log_records: bool = False

    def known_labels(self) -> frozenset[str]:
        return frozenset(self.scores) | frozenset(self.negative)

    @cached_property
    def _labels(self) -> dict[str, str]:
        # The spelling in `negative` wins: it is what the alert's regex matches.
        return {feedback_key(label): label for label in (*self.scores, *self.negative)}

    def label_of(self, value: str | None) -> str | None:
        """The configured label ``value`` means, or None when the config maps it to none."""
        return self._labels.get(feedback_key(value)) if value is not None else None

    @cached_property
    def _scores(self) -> dict[str, float]:
        return {feedback_key(label): score for label, score in self.scores.items()}

    def score_of(self, value: str | None) -> float | None:
        return self._scores.get(feedback_key(value)) if value is not None else None


# The vocabularies agents commonly write, positive 1.0 and negative 0.0.
DEFAULT_FEEDBACK_SCORES: dict[str, float] = {
    "UP": 1.0,
    "DOWN": 0.0,
    "THUMBS_UP": 1.0,
    "THUMBS_DOWN": 0.0,
    "LIKE": 1.0,
    "DISLIKE": 0.0,
    "POSITIVE": 1.0,
    "NEGATIVE": 0.0,
    "GOOD": 1.0,
    "BAD": 0.0,
    "HELPFUL": 1.0,
    "UNHELPFUL": 0.0,
    "1": 1.0,
    "0": 0.0,
}


def feedback_key(value: str) -> str:
    """How feedback values and labels are compared: " Thumbs-down" is THUMBS_DOWN."""
    return "_".join(value.strip().upper().replace("-", " ").split())


@dataclass(frozen=True)
class ServiceConfig:
    name: str = "diagnosis-agent"
    namespace: str = ""
    environment: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9464
    prometheus: bool = True
    otlp: bool = False
    otlp_interval_seconds: float = 15.0
    # The distinct tool names and dedup reasons kept apart; later ones count as "other".
    max_tool_names: int = 100
    max_dedup_reasons: int = 20


@dataclass(frozen=True)
class UiConfig:
    jaeger_url: str = ""
    tempo_url: str = ""
    # Phoenix's base URL: trace links, and each rating as an annotation on the run's root span.
    phoenix_url: str = ""


@dataclass(frozen=True)
class HaConfig:
    enabled: bool = False
    lock_name: str = "run_otel"
    takeover_seconds: float = 30.0


@dataclass(frozen=True)
class LogConfig:
    level: str = "INFO"
    format: str = "text"


@dataclass(frozen=True)
class SloConfig:
    # The share of finished runs that must not end FAILED, over window_days.
    objective: float = 0.95
    window_days: int = 30


# The trace stores the generated dashboards can link to, each with its Grafana data source.
TRACE_STORES = ("tempo", "jaeger")


@dataclass(frozen=True)
class GenerateConfig:
    """What `run-otel generate` writes into the dashboards, rules and runbook for the user's stack."""

    job: str = "run-otel"
    runbook_url: str = "docs/runbook.md"
    grafana_url: str = "http://localhost:3000"
    # Empty: Grafana's default data source of that type is preselected.
    prometheus_datasource_uid: str = ""
    tempo_datasource_uid: str = ""
    jaeger_datasource_uid: str = "jaeger"
    # The trace stores the dashboards link to; one the stack does not run would leave dead links.
    trace_stores: list[str] = field(default_factory=lambda: list(TRACE_STORES))
    # Alert thresholds by name; a table in the file sets some and keeps the others.
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))


# The numbers the alert rules compare with; whole numbers count runs, calls, ratings or seconds.
DEFAULT_THRESHOLDS: dict[str, float] = {
    # share of finished runs, over 10 minutes, with at least min_runs runs in them
    "run_failure_ratio": 0.10,
    "run_fallback_ratio": 0.20,
    "min_runs": 20,
    # share of one tool's calls, with at least min_tool_calls calls of it
    "tool_error_ratio": 0.25,
    "min_tool_calls": 20,
    # no successful poll for this long (seconds)
    "stall_seconds": 300,
    # run ids not yet exported, and still growing
    "backlog_runs": 500,
    # share of ratings that are negative over an hour, with at least min_feedback ratings in it
    "negative_feedback_ratio": 0.30,
    "min_feedback": 10,
    # runs waiting to finish: the health dashboard's red line
    "pending_runs": 100,
    # seconds the longest-waiting run may stay pending before DiagnosisRunsStuckPending fires
    "stuck_seconds": 1800,
}


@dataclass(frozen=True)
class Config:
    source: SourceConfig = field(default_factory=SourceConfig)
    state: StateConfig = field(default_factory=StateConfig)
    poll: PollConfig = field(default_factory=PollConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    content: ContentConfig = field(default_factory=ContentConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    ha: HaConfig = field(default_factory=HaConfig)
    log: LogConfig = field(default_factory=LogConfig)
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    # Not a key: set by the CLI (--shard), kept here so it travels with the rest.
    shard: tuple[int, int] = (0, 1)


_SECTION_TYPES = get_type_hints(Config)
SECTIONS: dict[str, type] = {name: cls for name, cls in _SECTION_TYPES.items() if name != "shard"}
