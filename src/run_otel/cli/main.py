"""The ``run-otel`` command line: each command parses, calls one function in ops/ or the factory, and renders."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .backfill_output import backfill_and_report, metrics_out_options
from .ops_commands import COMMANDS as OPERATOR_COMMANDS
from .options import CONFIG_OPTION, EXIT_FAILED, EXIT_PARTIAL, EXIT_USAGE, SHARD_OPTION, fail, guarded, load, reread
from .process_end import end_process
from .startup import quiet_start
from .times import TimeParam

if TYPE_CHECKING:
    from ..config import Config
    from ..ops.metrics_history import MetricsRequest

# Each command imports what it runs on (SQLAlchemy, gRPC, the SDK, rich) in its body:
# `run-otel --help` then costs the interpreter and click, not the whole bridge.


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="run-otel", prog_name="run-otel")
def cli() -> None:
    """Export the diagnosis agent's runs as OpenTelemetry traces.

    Each diagnosis_run row becomes a root span and each of its tool_invocation
    rows a child span, sent over OTLP to Jaeger, Tempo or any collector. The
    database is only read, never written.

    Start with `run-otel demo` to see it on a built-in workload, then
    `run-otel check --config FILE` against your own database.
    """


@cli.command()
@CONFIG_OPTION
@SHARD_OPTION
def once(config_path: Path | None, shard: str | None) -> None:
    """Poll once: export every finished run since the checkpoint, then exit.

    Exits 0 when the receiver acknowledged everything (the checkpoint is then
    saved), 1 with a one-line reason otherwise (the checkpoint does not move),
    and 3 when the checkpoint moved but some spans were not delivered: the
    receiver rejected them (partial_success) or run-otel dropped them as too
    large to send. They are not sent again.
    """
    config = load(config_path, shard)
    undelivered = 0

    def body() -> None:
        nonlocal undelivered
        from ..ops.daemon import summary
        from ..ops.send_now import once

        result, checked = once(config, report=lambda polled: click.echo(summary(polled)))
        undelivered = result.rejected_spans + result.dropped_spans
        if checked:
            click.echo(f"feedback: {checked.rated} rated runs in the window, {checked.sent} new or changed sent")

    guarded(body)
    if undelivered:
        fail(f"{undelivered} spans were not delivered (see the warnings above); the checkpoint moved past them", EXIT_PARTIAL)


@cli.command()
@CONFIG_OPTION
@SHARD_OPTION
def run(config_path: Path | None, shard: str | None) -> None:
    """Run the daemon: poll every poll.interval_seconds until SIGTERM.

    Polls never overlap. On SIGTERM or Ctrl-C the batch in flight is finished
    and its checkpoint saved before the process exits. A database or receiver
    outage is retried with backoff; nothing is skipped. SIGHUP re-reads
    log.level and source.password_file and retries a failed poll at once;
    other changed keys are named and wait for a restart.
    """
    from ..ops.daemon import Daemon

    config = load(config_path, shard)
    guarded(lambda: Daemon(config, fresh=lambda: reread(config_path, shard)).run_forever())


def _utcnow() -> datetime:
    return datetime.now(UTC)


_TIME = TimeParam()


@cli.command()
@CONFIG_OPTION
@click.option(
    "--since",
    type=_TIME,
    default=None,
    help=(
        "Export runs created at or after this time: YYYY-MM-DD[ HH:MM[:SS]] in "
        "source.timezone, ISO 8601 with an offset, or a duration ago (24h, 7d)."
    ),
)
@click.option("--until", type=_TIME, default=None, help="...and before this time [default: no upper bound].")
@click.option(
    "--from-id",
    type=click.IntRange(min=1),
    default=None,
    help="Read run ids from this one, instead of probing for the window's ids.",
)
@click.option("--to-id", type=click.IntRange(min=1), default=None, help="...up to and including this one [default: the newest].")
@click.option("--full-scan", is_flag=True, help="Read every run id once: complete even when ids are not in created_at order.")
@click.option("--with-metrics", is_flag=True, help="Also count the runs in the run metrics (off: history would distort rates).")
@click.option(
    "--workers",
    type=click.IntRange(1, 32),
    default=1,
    show_default=True,
    help="Processes, each exporting a contiguous part of the id range: one per core you can spare. "
    "Each reads the agent's database at the pace of a single backfill, so N of them put N times its load on it.",
)
@SHARD_OPTION
@metrics_out_options
def backfill(
    config_path: Path | None,
    since: datetime | None,
    until: datetime | None,
    from_id: int | None,
    to_id: int | None,
    full_scan: bool,
    with_metrics: bool,
    workers: int,
    shard: str | None,
    metrics_out: MetricsRequest | None,
) -> None:
    """Export history: every finished run created in [--since, --until).

    The id range is found by primary-key probes, never by a scan, and read in
    batches of poll.batch_size with a progress bar. Only runs created inside
    the window are sent. Probes assume ids grow with created_at; when they do
    not (after an import), backfill says so and names --full-scan and
    --from-id/--to-id, which read a whole id range and are always complete.
    --since with --to-id N probes the first id only: the history up to the
    daemon's start, N being the id in its `starting after run id N` line.
    The daemon's checkpoint is never moved, so a backfill can run beside
    `run-otel run`; runs exported by both arrive twice, byte-identical, but for
    a run whose late tool row lay outside its time (docs/operations.md).
    With --workers N, N processes share the range (about N times as fast on N
    free cores); on a stop, the resume line starts at the first id left unsent.
    With --metrics-push URL, the runs' metrics are also pushed by remote write
    as a scrape would have seen them, with their own timestamps; --metrics-out
    FILE writes them for `promtool tsdb create-blocks-from openmetrics`. The
    runs the daemon counts (read from its checkpoint) are left out.
    """
    if since is None and from_id is None and not full_scan:
        raise click.UsageError("give --since, --from-id or --full-scan")
    for flag, given in (("--with-metrics", with_metrics), (metrics_out and metrics_out.flag, metrics_out)):
        if given and workers > 1:
            raise click.UsageError(f"{flag} counts the runs in one process: use it with --workers 1")
    if metrics_out and since is None:
        raise click.UsageError(f"{metrics_out.flag} needs --since: the history starts there")
    if since and until and (since.tzinfo is None) == (until.tzinfo is None) and until <= since:
        raise click.UsageError(f"--until ({until}) must be after --since ({since})")
    if from_id and to_id and to_id < from_id:
        raise click.UsageError(f"--to-id ({to_id}) must not be below --from-id ({from_id})")
    from ..pipeline.backfill import Window
    from ..source.clock import SourceClock

    config = load(config_path, shard)
    clock = SourceClock(config.source.timezone)
    window = Window(since and clock.naive(since), until and clock.naive(until))
    # Compared in the source's zone: one of them may be a duration ago (aware), the other a date (naive).
    if window.since and window.until and window.until <= window.since:
        raise click.UsageError(f"--until ({window.until}) must be after --since ({window.since}), in source.timezone")
    guarded(lambda: backfill_and_report(config, window, (from_id, to_id, full_scan), with_metrics, workers, metrics_out))


# -- the terminal commands ----------------------------------------------------


@cli.command()
@CONFIG_OPTION
@click.argument("run_id")
def show(config_path: Path | None, run_id: str) -> None:
    """Print the span tree that would be exported for RUN_ID.

    Shows names, durations, status and the key RAG attributes, the trace id
    to open in Jaeger or Tempo, and a link when ui.jaeger_url, ui.tempo_url
    or ui.phoenix_url is set. Exits 1 when no run has that run_id.
    """
    from rich.console import Console

    from ..ops.show import run_traces
    from .render import print_trace

    config = load(config_path)

    def body() -> None:
        (trace,), source = run_traces(config, [run_id])
        if trace is None:
            fail(f"no run with run_id {run_id!r} in {source}")
        else:
            print_trace(Console(), config, trace)

    guarded(body)


@cli.command()
@CONFIG_OPTION
def check(config_path: Path | None) -> None:
    """Check a deployment: config, database, schema, indexes, privileges, endpoint.

    One line per check, then a verdict. Warnings (a missing index, a user that
    can write) do not fail; exit 1 only when something run-otel needs is missing.
    """
    from rich.console import Console

    from ..ops.check import FAIL, OK, WARN, run_checks
    from .render import finding_text

    symbols = {OK: "[green]✔[/]", WARN: "[yellow]![/]", FAIL: "[red]✘[/]"}
    config = load(config_path)
    # soft_wrap: a line is never broken at 80 columns when stdout is a pipe (CI, kubectl exec).
    console = Console(highlight=False, soft_wrap=True)
    findings = []
    for finding in run_checks(config):
        findings.append(finding)
        console.print(f"{symbols[finding.level]} {finding_text(finding.what, finding.detail)}")
    failures = sum(f.level == FAIL for f in findings)
    warnings = sum(f.level == WARN for f in findings)
    if failures:
        console.print(f"[red]check failed[/]: {failures} problem(s), {warnings} warning(s)")
        sys.exit(EXIT_FAILED)
    console.print(f"[green]check passed[/] with {warnings} warning(s)")


@cli.command()
@CONFIG_OPTION
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("run-otel-demo.db"),
    show_default=True,
    help="SQLite file to create and seed (replaced if it exists).",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("run-otel-demo.otlp.jsonl"),
    show_default=True,
    help="OTLP-JSON file written when OTEL_EXPORTER_OTLP_ENDPOINT is not set.",
)
@click.option("--runs", type=click.IntRange(1, 1_000_000), default=300, show_default=True, help="Runs to generate.")
@click.option(
    "--seed",
    type=int,
    default=42,
    show_default=True,
    help="Random seed; the same seed gives the same rows and the same OTLP bytes.",
)
@click.option(
    "--anchor",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    default=None,
    help="UTC time the workload ends at [default: the start of the current hour].",
)
def demo(config_path: Path | None, db_path: Path, out_path: Path, runs: int, seed: int, anchor: datetime | None) -> None:
    """Seed a SQLite database with a realistic workload and export it.

    About 300 runs over an hour in several chat sessions: every intent and
    outcome, a few still RUNNING, 0 to 12 tool calls each, L0/L1 retrieval
    with every relevance level, evidence refs and failing calls. They are
    exported through the same poller as `run-otel run`: to
    OTEL_EXPORTER_OTLP_ENDPOINT when it is set, else to an OTLP-JSON file.
    Ends with a summary and the span trees of a failed and a RAG-heavy run.
    """
    base = load(config_path, demo=True)
    # The demo speaks through its summary; keep the daemon's INFO lines out of it.
    logging.getLogger().setLevel(max(logging.getLogger().level, logging.WARNING))
    guarded(lambda: _demo(base, db_path, out_path, runs, seed, anchor))


def _demo(base: Config, db_path: Path, out_path: Path, runs: int, seed: int, anchor: datetime | None) -> None:
    from contextlib import contextmanager

    from rich.console import Console
    from rich.table import Table

    from ..export.sinks import JsonFileSink
    from ..ops.demo import summary_rows
    from ..ops.demo_job import DemoSetup, run_demo
    from .render import ProgressRecorder, print_trace, progress_bar

    console = Console(highlight=False)

    @contextmanager
    def exporting(setup: DemoSetup) -> Iterator[ProgressRecorder]:
        workload = setup.workload
        console.print(f"seeded {len(workload.runs)} runs and {len(workload.tools)} tool calls into {db_path} (seed {seed})")
        with progress_bar(console) as progress:
            task = progress.add_task(f"exporting to {setup.sink.describe()}", total=len(workload.terminal_runs()), rate="")
            yield ProgressRecorder(progress, task)

    anchor = anchor or _utcnow().replace(minute=0, second=0, microsecond=0, tzinfo=None)
    done = run_demo(base, db_path, out_path, (runs, seed), anchor, exporting)
    sink, result = done.setup.sink, done.result
    table = Table(show_header=False, box=None)
    table.add_row("spans exported", f"{result.spans} in {result.run_count} traces to {sink.describe()}")
    for name, value in summary_rows(done.setup.workload):
        table.add_row(name, value)
    console.print(table)
    for title, trace in done.traces:
        console.rule(title)
        print_trace(console, done.setup.config, trace)
    if isinstance(sink, JsonFileSink):
        click.echo(f"OTLP-JSON written to {sink.path}")


for _command in OPERATOR_COMMANDS:
    cli.add_command(_command)


def main() -> None:
    try:
        with quiet_start():
            code = cli.main(prog_name="run-otel", standalone_mode=False)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "run-otel"
        fail(f"{exc.format_message()} (see '{command} --help')", EXIT_USAGE)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        fail("aborted", EXIT_FAILED)
    sys.exit(code if isinstance(code, int) else 0)


def script() -> None:
    """The ``run-otel`` script: :func:`main`, then the process ends without Python's teardown."""
    try:
        main()
    except SystemExit as exc:
        end_process(exc.code)
