"""The ``run-otel`` command line."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from . import __version__
from .checkpoint import CheckpointError, CheckpointStore
from .config import Config, ConfigError, load_config
from .encoding import resource_attributes
from .export import ExportError, build_sink
from .poller import Poller, PollResult, Recorder
from .source import Source, SourceError

log = logging.getLogger("run_otel")

EXIT_FAILED = 1
EXIT_USAGE = 2

_CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RUN_OTEL_CONFIG",
    help="TOML config file (env RUN_OTEL_CONFIG). Every key is documented in config/run-otel.toml; "
    "RUN_OTEL_<SECTION>__<KEY> variables override it.",
)


class _SecretFilter(logging.Filter):
    """Scrubs known secrets from every log record, whatever logged it."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self._secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            for secret in self._secrets:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


def _configure_logging(config: Config) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log.format == "json":
        fmt = '{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":%(message)r}'
    else:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    try:
        password = config.source_url().password
    except OSError:
        password = None
    handler.addFilter(_SecretFilter([str(password) if password else ""]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log.level)


def _fail(message: str, code: int = EXIT_FAILED) -> None:
    click.echo(f"run-otel: error: {message}", err=True)
    sys.exit(code)


def _load(config_path: Path | None, shard: str | None = None) -> Config:
    try:
        config = load_config(config_path)
        if shard:
            config = replace(config, shard=_parse_shard(shard))
        config.source_url()  # reads source.password_file now, so a bad path fails at start
    except ConfigError as exc:
        _fail(f"config: {exc}", EXIT_USAGE)
    except OSError as exc:
        _fail(f"config: source.password_file: {exc.strerror}: {exc.filename}", EXIT_USAGE)
    _configure_logging(config)
    return config


def _parse_shard(text: str) -> tuple[int, int]:
    index, sep, total = text.partition("/")
    if not (sep and index.isdigit() and total.isdigit() and 0 <= int(index) < int(total)):
        raise ConfigError(f"--shard must be i/N with 0 <= i < N, got {text!r}")
    return int(index), int(total)


def _guarded(action: Callable[[], None]) -> None:
    """Runs a command body; known failures become one line and exit code 1."""
    try:
        action()
    except (SourceError, ExportError, CheckpointError) as exc:
        _fail(str(exc))


def build_poller(config: Config, recorder: Recorder | None = None, sink=None) -> Poller:
    source = Source(config)
    store = CheckpointStore(config)
    return Poller(
        config,
        source,
        sink or build_sink(config),
        store,
        resource_attributes(config, os.environ),
        recorder=recorder,
    )


def _summary(result: PollResult) -> str:
    return (
        f"exported {len(result.runs)} runs ({result.spans} spans); "
        f"{result.pending} pending, {result.gaps} gaps"
        + (f"; receiver rejected {result.rejected_spans} spans" if result.rejected_spans else "")
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="run-otel")
def cli() -> None:
    """Export the diagnosis agent's runs as OpenTelemetry traces.

    Each diagnosis_run row becomes a root span and each of its tool_invocation
    rows a child span, sent over OTLP to Jaeger, Tempo or any collector. The
    database is only read, never written.

    Start with `run-otel demo` to see it on a built-in workload, then
    `run-otel check --config FILE` against your own database.
    """


@cli.command()
@_CONFIG_OPTION
@click.option("--shard", metavar="I/N", help="Export only shard I of N (stable hash of run_id), with its own checkpoint.")
def once(config_path: Path | None, shard: str | None) -> None:
    """Poll once: export every finished run since the checkpoint, then exit.

    Exits 0 when the receiver acknowledged everything (the checkpoint is then
    saved), 1 with a one-line reason otherwise (the checkpoint does not move).
    """
    config = _load(config_path, shard)

    def body() -> None:
        poller = build_poller(config)
        result = poller.poll()
        click.echo(_summary(result))

    _guarded(body)


@cli.command()
@_CONFIG_OPTION
@click.option("--shard", metavar="I/N", help="Export only shard I of N (stable hash of run_id), with its own checkpoint.")
def run(config_path: Path | None, shard: str | None) -> None:
    """Run the daemon: poll every poll.interval_seconds until SIGTERM.

    Polls never overlap. On SIGTERM or Ctrl-C the batch in flight is finished
    and its checkpoint saved before the process exits. A database or receiver
    outage is retried with backoff; nothing is skipped.
    """
    config = _load(config_path, shard)
    _guarded(lambda: Daemon(config).run_forever())


class Daemon:
    """The APScheduler loop around a Poller, with backoff and a clean stop."""

    def __init__(self, config: Config):
        self._config = config
        self._stop = threading.Event()
        self._failures = 0
        self._retry_at = 0.0
        self.poller = build_poller(config)

    def _tick(self) -> None:
        if time.monotonic() < self._retry_at or self._stop.is_set():
            return
        try:
            result = self.poller.poll()
        except (SourceError, ExportError, CheckpointError) as exc:
            self._failures += 1
            delay = min(
                self._config.poll.retry_initial_seconds * 2 ** (self._failures - 1),
                self._config.poll.retry_max_seconds,
            )
            self._retry_at = time.monotonic() + delay
            log.error("poll failed (%s); retrying in %.0fs", exc, delay)
            return
        self._failures, self._retry_at = 0, 0.0
        if result.runs:
            log.info(_summary(result))

    def stop(self, *_args) -> None:
        self._stop.set()
        self.poller.stop_requested.set()

    def run_forever(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = BackgroundScheduler(timezone="UTC")
        scheduler.add_job(
            self._tick,
            "interval",
            seconds=self._config.poll.interval_seconds,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=_utcnow(),
        )
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        scheduler.start()
        log.info("run-otel %s polling %s every %.0fs", __version__, self.poller.describe_source(), self._config.poll.interval_seconds)
        self._stop.wait()
        log.info("stopping: finishing the batch in flight")
        scheduler.shutdown(wait=True)
        log.info("stopped")


def _utcnow():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def main() -> None:
    cli(prog_name="run-otel")


if __name__ == "__main__":  # pragma: no cover
    main()
