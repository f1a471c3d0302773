"""What every command shares: the --config and --shard options, loading the
config once, and turning known failures into one line and an exit code."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ..config import Config

# Imports that pull in SQLAlchemy, gRPC or the SDK happen inside the functions that
# need them, so `run-otel --help` starts in a fraction of the time a command takes.

log = logging.getLogger("run_otel")

EXIT_FAILED = 1
EXIT_USAGE = 2
# Done and checkpointed, but some spans were rejected by the receiver or dropped as too large.
EXIT_PARTIAL = 3

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RUN_OTEL_CONFIG",
    help="TOML config file (env RUN_OTEL_CONFIG). `run-otel config --example` prints every key with "
    "its default; RUN_OTEL_<SECTION>__<KEY> variables override it.",
)


def fail(message: str, code: int = EXIT_FAILED) -> None:
    click.echo(f"run-otel: error: {message}", err=True)
    sys.exit(code)


def fail_config(error: Exception) -> None:
    """Every error the config holds, each on a line of its own that stands alone (a terminal,
    grep, journald), so the file is fixed in one pass."""
    fail("\nrun-otel: error: ".join(f"config: {line}" for line in str(error).splitlines()), EXIT_USAGE)


def load(config_path: Path | None, shard: str | None = None, demo: bool = False) -> Config:
    if not demo and not config_path and not os.environ.get("RUN_OTEL_SOURCE__URL"):
        # The defaults point at the demo's SQLite files: never run against them by accident.
        fail(
            "no config: pass --config FILE or set RUN_OTEL_CONFIG (or RUN_OTEL_SOURCE__URL); "
            "`run-otel config --example` prints one to start from, and `run-otel demo` needs none",
            EXIT_USAGE,
        )
    from ..config import ConfigError, load_config, overridden_file_keys
    from ..mapping.masking import Scrubber, configured_secrets
    from ..sharding import ShardError, parse_shard
    from ..telemetry.logs import configure_logging, scrub_output

    try:
        config = load_config(config_path)
        if shard:
            config = replace(config, shard=parse_shard(shard))
        config.source.connect_url()  # reads source.password_file now, so a bad path fails at start
    except (ConfigError, ShardError) as exc:
        fail_config(exc)
    except OSError as exc:
        fail(f"config: source.password_file: {exc.strerror}: {exc.filename}", EXIT_USAGE)
    scrubber = Scrubber.for_secrets(configured_secrets(config.export, config.source, config.state))
    configure_logging(config.log, scrub_output(scrubber))
    for line in overridden_file_keys(config_path):
        log.warning(line)
    return config


def reread(config_path: Path | None, shard: str | None = None) -> Config:
    """The config as `load` builds it, read again for SIGHUP: a bad file raises rather than exits."""
    from ..config import load_config
    from ..sharding import parse_shard

    config = load_config(config_path)
    return replace(config, shard=parse_shard(shard)) if shard else config


def guarded(action: Callable[[], None]) -> None:
    """Runs a command body; known failures become one line and exit code 1."""
    from ..config import ConfigError
    from ..export.sinks import ExportError
    from ..factory import MetricsPortError
    from ..ops.rewind import Refused
    from ..pipeline.lease import LeaseError
    from ..pipeline.state_store import StateStoreError
    from ..source.reader import SourceError
    from .startup import body_starts

    body_starts()  # what the command runs on is imported: collect from here on
    try:
        action()
    except ConfigError as exc:  # found only when a part is built, such as a driver that is not installed
        fail_config(exc)
    except (SourceError, ExportError, StateStoreError, LeaseError, MetricsPortError, Refused) as exc:
        fail(str(exc))


SHARD_OPTION = click.option("--shard", metavar="I/N", help="Only shard I of N (stable hash of run_id), with its own checkpoint.")
