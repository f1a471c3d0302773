"""The checks of a built Config beyond each value's type, and the list they report into.

Every check runs, and every error is kept: as the OpenTelemetry Collector's config.go gathers
its errors (multierr), a file is fixed in one pass. A check that reads a value already found bad
adds nothing, so one mistake is reported once and not again by each check that depends on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.engine import make_url

from .sections import (
    DEFAULT_THRESHOLDS,
    TLS_MODES,
    TRACE_STORES,
    VERIFYING_TLS_MODES,
    Config,
    ConfigError,
    ExportConfig,
    GenerateConfig,
)

# A key as (section, key); a part of a key's value as (section, "key[1]") or (section, "key.name").
Key = tuple[str, str]

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
# Tuples, not sets: the errors come out in the same order on every run.
_POSITIVE = (
    ("feedback", "window_seconds"),
    ("feedback", "interval_seconds"),
    ("poll", "interval_seconds"),
    ("poll", "batch_size"),
    ("poll", "tool_chunk_size"),
    ("poll", "retry_initial_seconds"),
    ("poll", "retry_max_seconds"),
    ("export", "timeout_seconds"),
    ("export", "max_timeout_seconds"),
    ("export", "max_attempts"),
    ("content", "max_length"),
    ("trace", "max_spans_per_trace"),
    ("trace", "max_attribute_length"),
    ("trace", "max_list_length"),
    ("ha", "takeover_seconds"),
    ("metrics", "otlp_interval_seconds"),
    ("metrics", "max_tool_names"),
    ("metrics", "max_dedup_reasons"),
    ("source", "statement_timeout_seconds"),
    ("poll", "stuck_after_seconds"),
    ("poll", "shutdown_timeout_seconds"),
    ("slo", "window_days"),
)
_NON_NEGATIVE = (
    ("poll", "settle_seconds"),
    ("poll", "run_timeout_seconds"),
    ("poll", "gap_timeout_seconds"),
    ("poll", "late_window_seconds"),
    ("poll", "orphan_wait_seconds"),
    ("source", "connect_timeout_seconds"),
    ("poll", "backfill_retry_seconds"),
)
_EXPORT_PEMS = (
    "certificate",
    "client_certificate",
    "client_key",
    "logs_certificate",
    "logs_client_certificate",
    "logs_client_key",
)


class Problems:
    """The errors found so far, one line each. A line names the ``RUN_OTEL_*`` or ``OTEL_*``
    variable that set its key, since that, not the file, is where the user fixes it."""

    def __init__(self, variables: Mapping[Key, str] | None = None) -> None:
        self._variables = dict(variables or {})
        self._bad: set[Key] = set()
        self.lines: list[str] = []

    def bad(self, key: Key, message: str) -> None:
        """``key``'s value is unusable: said once, and checks that read it later add nothing."""
        self.add(message, key)
        self._bad.add(key)

    def add(self, message: str, *keys: Key) -> None:
        """A problem with ``keys``, unless one of them is already bad (it would be a follow-on)."""
        if self._bad.intersection(keys):
            return
        named = [name for name in dict.fromkeys(map(self._variable, keys)) if name and name not in message]
        line = ": ".join([*named, message])
        if line not in self.lines:  # the same line twice would say no more
            self.lines.append(line)

    def _variable(self, key: Key) -> str | None:
        section, name = key
        return self._variables.get((section, re.split(r"[.\[]", name, maxsplit=1)[0]))

    def raise_any(self) -> None:
        if self.lines:
            raise ConfigError("\n".join(self.lines))


def check(config: Config, problems: Problems) -> Config:
    """``config`` with its thresholds over the defaults; every problem found goes into ``problems``.
    Each key's own checks run first, so a check across keys sees which of them are bad."""
    _check_values(config, problems)
    _check_lists(config, problems)
    _check_generate(config, problems)
    generate = _thresholds_over_defaults(config.generate, problems)
    _check_across(config, problems)
    _check_source_tls(config, problems)
    _check_export(config.export, problems)
    return replace(config, generate=generate)


def _check_values(config: Config, problems: Problems) -> None:
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(config, section), key)
        if value not in choices:
            problems.bad((section, key), f"{section}.{key} must be one of {', '.join(choices)}, got {value!r}")
    for keys, bound in ((_POSITIVE, "greater than 0"), (_NON_NEGATIVE, "0 or more")):
        for section, key in keys:
            value = getattr(getattr(config, section), key)
            if value < 0 or (value == 0 and keys is _POSITIVE):
                problems.bad((section, key), f"{section}.{key} must be {bound}, got {value!r}")
    start = config.poll.start_from
    if start not in ("now", "beginning") and not (start.isdigit() and int(start) > 0):
        problems.bad(("poll", "start_from"), f"poll.start_from must be now, beginning or a positive run id, got {start!r}")
    if config.export.max_request_bytes < MIN_REQUEST_BYTES:
        problems.bad(
            ("export", "max_request_bytes"),
            f"export.max_request_bytes must be at least {MIN_REQUEST_BYTES} (64 KiB), got {config.export.max_request_bytes}",
        )
    if not 0 < config.metrics.port < 65536:
        problems.bad(("metrics", "port"), f"metrics.port must be a TCP port, got {config.metrics.port}")
    try:
        ZoneInfo(config.source.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        problems.bad(("source", "timezone"), f"source.timezone must be an IANA time zone, got {config.source.timezone!r}")
    for section in ("source", "state"):
        try:
            make_url(getattr(config, section).url)
        except Exception:  # SQLAlchemy raises ArgumentError; never echo the URL, it may hold a password
            problems.bad((section, "url"), f"{section}.url is not a SQLAlchemy URL")


def _check_lists(config: Config, problems: Problems) -> None:
    """Each bad item of a list on its own line: two bad regexes are two errors."""
    for i, convention in enumerate(config.trace.conventions):
        if convention not in _CONVENTIONS:
            problems.bad(
                ("trace", f"conventions[{i}]"),
                f"trace.conventions: unknown profile {convention!r} (known: {', '.join(_CONVENTIONS)})",
            )
    for i, pattern in enumerate(config.content.redact):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.bad(("content", f"redact[{i}]"), f"content.redact: bad regex {pattern!r}: {exc}")


def _check_generate(config: Config, problems: Problems) -> None:
    if not 0 < config.slo.objective < 1:
        problems.bad(
            ("slo", "objective"),
            f"slo.objective is the share of runs that must not fail, between 0 and 1, got {config.slo.objective:g}",
        )
    job = config.generate.job
    if not job or any(c in job for c in '"\\\n'):
        problems.bad(
            ("generate", "job"), f"generate.job must be a Prometheus job name without quotes or backslashes, got {job!r}"
        )
    for i, store in enumerate(config.generate.trace_stores):
        if store not in TRACE_STORES:
            problems.bad(
                ("generate", f"trace_stores[{i}]"),
                f"generate.trace_stores: unknown trace store {store!r} (known: {', '.join(TRACE_STORES)})",
            )


def _thresholds_over_defaults(generate: GenerateConfig, problems: Problems) -> GenerateConfig:
    """The thresholds a file sets, over the built-in ones: a table that names one keeps the others."""
    thresholds = dict(DEFAULT_THRESHOLDS)
    for name, value in generate.thresholds.items():
        key = ("generate", f"thresholds.{name}")
        default = DEFAULT_THRESHOLDS.get(name)
        if default is None:
            problems.bad(key, f"generate.thresholds: unknown threshold {name!r} (known: {', '.join(DEFAULT_THRESHOLDS)})")
        elif value <= 0 or (name.endswith("_ratio") and value > 1):
            bound = "between 0 and 1" if name.endswith("_ratio") else "greater than 0"
            problems.bad(key, f"generate.thresholds.{name} must be {bound}, got {value:g}")
        elif isinstance(default, int) and not float(value).is_integer():
            problems.bad(key, f"generate.thresholds.{name} counts whole runs, calls, ratings or seconds, got {value:g}")
        else:
            thresholds[name] = int(value) if isinstance(default, int) else value
    return replace(generate, thresholds=thresholds)


def _check_across(config: Config, problems: Problems) -> None:
    if config.ha.enabled and config.ha.takeover_seconds <= config.poll.interval_seconds:
        problems.add(
            f"ha.takeover_seconds ({config.ha.takeover_seconds:g}) must be longer than poll.interval_seconds "
            f"({config.poll.interval_seconds:g}): the active instance renews its lease once per poll",
            ("ha", "takeover_seconds"),
            ("poll", "interval_seconds"),
        )


def _missing_files(section: str, values: object, keys: Iterable[str], problems: Problems) -> None:
    # Not bad: that a path is set still holds, and the checks across keys read no more than that.
    for key in keys:
        path = getattr(values, key)
        if path and not Path(path).is_file():
            problems.add(f"{section}.{key}: no such file: {path}", (section, key))


def _check_source_tls(config: Config, problems: Problems) -> None:
    source = config.source
    _missing_files("source", source, ("tls_ca", "tls_cert", "tls_key"), problems)
    if source.tls_key and not source.tls_cert:
        problems.add(
            "source.tls_key needs source.tls_cert (the client certificate)", ("source", "tls_key"), ("source", "tls_cert")
        )
    if source.tls_ca and source.tls_mode not in VERIFYING_TLS_MODES:
        problems.add(
            f"source.tls_ca is set but source.tls_mode is {source.tls_mode!r}: "
            "set tls_mode to verify_identity (or verify_ca) to verify the server against it",
            ("source", "tls_ca"),
            ("source", "tls_mode"),
        )
    if source.tls_cert and source.tls_mode in ("disabled", "preferred"):
        problems.add(
            f"source.tls_cert needs source.tls_mode required, verify_ca or verify_identity, not {source.tls_mode!r}",
            ("source", "tls_cert"),
            ("source", "tls_mode"),
        )


def _check_export(export: ExportConfig, problems: Problems) -> None:
    """The receiver's URL, and its PEM files: present, and each client key with its certificate."""
    # OTLP/HTTP's endpoint is a URL; without a scheme the HTTP client's only word is "InvalidSchema".
    endpoint = export.endpoint
    if export.protocol == "http/protobuf" and endpoint and not endpoint.startswith(("http://", "https://")):
        problems.add(
            f'export.endpoint {endpoint!r} has no scheme: with export.protocol = "http/protobuf" it is a URL, '
            f"such as http://{endpoint} (https:// with TLS)",
            ("export", "endpoint"),
            ("export", "protocol"),
        )
    _missing_files("export", export, _EXPORT_PEMS, problems)
    for prefix in ("", "logs_"):
        cert, key = f"{prefix}client_certificate", f"{prefix}client_key"
        if bool(getattr(export, cert)) != bool(getattr(export, key)):
            problems.add(
                f"export.{cert} and export.{key} go together (mTLS): set both or neither", ("export", cert), ("export", key)
            )
