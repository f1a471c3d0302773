"""One typed configuration, built once at start and passed in.

Precedence, lowest first: built-in defaults, the TOML file, the standard
``OTEL_*`` variables (for the keys they define), then ``RUN_OTEL_<SECTION>__<KEY>``.
Every key is checked: an unknown key or a value of the wrong type stops the
start with the key's dotted name.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.engine import URL, make_url

from .otel_env import otel_environment

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
    insecure: bool = True
    compression: str = "none"
    max_attempts: int = 3
    # Under the 4 MiB gRPC receive limit most receivers keep (the collector's, Jaeger's).
    max_request_bytes: int = 3 * 1024 * 1024


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
    "UP": 1.0, "DOWN": 0.0, "THUMBS_UP": 1.0, "THUMBS_DOWN": 0.0, "LIKE": 1.0, "DISLIKE": 0.0,
    "POSITIVE": 1.0, "NEGATIVE": 0.0, "GOOD": 1.0, "BAD": 0.0, "HELPFUL": 1.0, "UNHELPFUL": 0.0, "1": 1.0, "0": 0.0,
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
    # Not a key: set by the CLI (--shard), kept here so it travels with the rest.
    shard: tuple[int, int] = (0, 1)

    def source_url(self) -> URL:
        """The source URL, with the password from ``source.password_file`` if set."""
        url = make_url(self.source.url)
        if self.source.password_file:
            secret = Path(self.source.password_file).read_text(encoding="utf-8").strip()
            url = url.set(password=secret)
        return url

    def export_endpoint(self) -> str:
        """The OTLP endpoint, defaulting per protocol as the OTLP spec does."""
        if self.export.endpoint:
            return self.export.endpoint
        return "http://localhost:4318" if self.export.protocol == "http/protobuf" else "localhost:4317"


_SECTION_TYPES = get_type_hints(Config)
SECTIONS: dict[str, type] = {name: cls for name, cls in _SECTION_TYPES.items() if name != "shard"}

# (section, key, validator, message): checks beyond the type.
_CHOICES = {
    ("export", "protocol"): ("grpc", "http/protobuf"),
    ("export", "compression"): ("none", "gzip"),
    ("trace", "tool_time_anchor"): ("start", "end"),
    ("log", "format"): ("text", "json"),
    ("source", "tls_mode"): TLS_MODES,
    ("log", "level"): ("DEBUG", "INFO", "WARNING", "ERROR"),
}
_CONVENTIONS = ("gen_ai", "openinference")
# Below this a request holds too few spans, and a span's name and status alone may not fit.
MIN_REQUEST_BYTES = 64 * 1024
_POSITIVE = {
    ("feedback", "window_seconds"),
    ("feedback", "interval_seconds"),
    ("poll", "interval_seconds"),
    ("poll", "batch_size"),
    ("poll", "tool_chunk_size"),
    ("poll", "retry_initial_seconds"),
    ("poll", "retry_max_seconds"),
    ("export", "timeout_seconds"),
    ("export", "max_attempts"),
    ("content", "max_length"),
    ("trace", "max_spans_per_trace"),
    ("trace", "max_attribute_length"),
    ("trace", "max_list_length"),
    ("ha", "takeover_seconds"),
    ("metrics", "otlp_interval_seconds"),
    ("source", "statement_timeout_seconds"),
    ("poll", "stuck_after_seconds"),
    ("poll", "shutdown_timeout_seconds"),
}
_NON_NEGATIVE = {
    ("poll", "settle_seconds"),
    ("poll", "run_timeout_seconds"),
    ("poll", "gap_timeout_seconds"),
    ("source", "connect_timeout_seconds"),
    ("poll", "backfill_retry_seconds"),
}


def load_config(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the one Config from a TOML file (optional) and the environment."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    raw: dict[str, Any] = _read_toml(Path(path)) if path else {}
    _merge(raw, otel_environment(env, ConfigError))
    variables = _run_otel_variables(env)
    for (section, key), name in variables.items():
        _check_known(section, key, name)
    _merge(raw, _run_otel_environment(env))
    return build_config(raw)


def overridden_file_keys(path: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Lines naming each key the file sets and a RUN_OTEL_* variable overrides, so
    that precedence is visible (an image's ENV silently beating a mounted file)."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    if not path:
        return []
    raw = _read_toml(Path(path))
    return [
        f"{name} overrides {section}.{key} set in {path}"
        for (section, key), name in _run_otel_variables(env).items()
        if isinstance(raw.get(section), Mapping) and key in raw[section]
    ]


def build_config(raw: Mapping[str, Any]) -> Config:
    """A Config from nested dicts, rejecting unknown keys and bad values."""
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section [{section}] (known: {', '.join(SECTIONS)})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"[{section}] must be a table of keys")
        sections[section] = _build_section(section, SECTIONS[section], values)
    config = Config(**sections)
    _validate(config)
    return config


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _merge(into: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in overrides.items():
        into.setdefault(section, {})
        if isinstance(into[section], dict):
            into[section].update(values)


def _run_otel_variables(env: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """(section, key) -> the RUN_OTEL_<SECTION>__<KEY> variable that sets it."""
    found = {}
    for name in env:
        if not name.startswith(ENV_PREFIX) or "__" not in name or name == CONFIG_ENV:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        found[(section.lower(), key.lower())] = name
    return found


def _check_known(section: str, key: str, variable: str) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"{variable}: unknown config section [{section}] (known: {', '.join(SECTIONS)})")
    hints = get_type_hints(SECTIONS[section])
    if key not in hints:
        raise ConfigError(f"{variable}: unknown config key {section}.{key} (known in [{section}]: {', '.join(hints)})")


def _run_otel_environment(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (section, key), name in _run_otel_variables(env).items():
        out.setdefault(section, {})[key] = _env_value(env[name])
    return out


def _env_value(text: str) -> Any:
    """An environment value as TOML would read it (10, true, ["a"]), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _build_section(section: str, cls: type, values: Mapping[str, Any]):
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"unknown config key {section}.{key} (known in [{section}]: {known})")
        kwargs[key] = _coerce(f"{section}.{key}", hints[key], value)
    return cls(**kwargs)


def _coerce(name: str, hint: Any, value: Any) -> Any:
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_coerce(f"{name}[]", item, v) for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be a table, got {value!r}")
        _key, item = get_args(hint)
        return {str(k): _coerce(f"{name}.{k}", item, v) for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name} must be a string, got {value!r}")
    raise ConfigError(f"{name}: unsupported type {hint!r}")  # pragma: no cover


def _validate(config: Config) -> None:
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in choices:
            raise ConfigError(f"{section}.{key} must be one of {', '.join(choices)}, got {value!r}")
    for section, key in _POSITIVE | _NON_NEGATIVE:
        value = getattr(getattr(config, section), key)
        if value < 0 or (value == 0 and (section, key) in _POSITIVE):
            bound = "greater than 0" if (section, key) in _POSITIVE else "0 or more"
            raise ConfigError(f"{section}.{key} must be {bound}, got {value!r}")
    for convention in config.trace.conventions:
        if convention not in _CONVENTIONS:
            raise ConfigError(f"trace.conventions: unknown profile {convention!r} (known: {', '.join(_CONVENTIONS)})")
    start = config.poll.start_from
    if start not in ("now", "beginning") and not (start.isdigit() and int(start) > 0):
        raise ConfigError(f"poll.start_from must be now, beginning or a positive run id, got {start!r}")
    if config.ha.enabled and config.ha.takeover_seconds <= config.poll.interval_seconds:
        raise ConfigError(
            f"ha.takeover_seconds ({config.ha.takeover_seconds:g}) must be longer than poll.interval_seconds "
            f"({config.poll.interval_seconds:g}): the active instance renews its lease once per poll"
        )
    if config.export.max_request_bytes < MIN_REQUEST_BYTES:
        raise ConfigError(
            f"export.max_request_bytes must be at least {MIN_REQUEST_BYTES} (64 KiB), got {config.export.max_request_bytes}"
        )
    if not 0 < config.metrics.port < 65536:
        raise ConfigError(f"metrics.port must be a TCP port, got {config.metrics.port}")
    try:
        ZoneInfo(config.source.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"source.timezone must be an IANA time zone, got {config.source.timezone!r}") from None
    for pattern in config.content.redact:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"content.redact: bad regex {pattern!r}: {exc}") from None
    _validate_tls(config.source)
    for section in ("source", "state"):
        try:
            make_url(getattr(config, section).url)
        except Exception:  # SQLAlchemy raises ArgumentError; never echo the URL, it may hold a password
            raise ConfigError(f"{section}.url is not a SQLAlchemy URL") from None


def _validate_tls(source: SourceConfig) -> None:
    for key in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(source, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"source.{key}: no such file: {path}")
    if source.tls_key and not source.tls_cert:
        raise ConfigError("source.tls_key needs source.tls_cert (the client certificate)")
    if source.tls_ca and source.tls_mode not in VERIFYING_TLS_MODES:
        raise ConfigError(
            f"source.tls_ca is set but source.tls_mode is {source.tls_mode!r}: "
            "set tls_mode to verify_identity (or verify_ca) to verify the server against it"
        )
    if source.tls_cert and source.tls_mode in ("disabled", "preferred"):
        raise ConfigError(f"source.tls_cert needs source.tls_mode required, verify_ca or verify_identity, not {source.tls_mode!r}")
