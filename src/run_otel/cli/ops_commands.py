"""The operator's commands: `status`, `rewind`, `export`, `config`, `health` and `generate`."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from ..source.terminal_text import terminal_safe
from .options import CONFIG_OPTION, EXIT_FAILED, EXIT_USAGE, SHARD_OPTION, fail, guarded, load
from .times import TimeParam

# As in cli: what a command runs on is imported in its body, to keep --help fast.


@click.command()
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON object per shard, one per line.")
def status(config_path: Path | None, as_json: bool) -> None:
    """Where each shard stands: checkpoint, newest run, lag, pending runs, gaps.

    The lag is in run ids (newest id minus the high-water mark) and in seconds
    (the newest run's created_at minus the high-water run's). Reads only: a
    state store that does not exist is reported, never created.
    """
    from rich.console import Console
    from rich.table import Table

    from ..ops.status import status as shard_status

    config = load(config_path)

    def body() -> None:
        found = shard_status(config)
        rows = found.shards
        if not rows:
            fail(f"state store {found.state_store} holds no checkpoint yet")
        if as_json:
            for row in rows:
                click.echo(json.dumps(row.as_dict(), sort_keys=True))
            return
        table = Table("shard", "high-water id", "newest id", "lag (runs)", "lag", "pending", "gaps", "saved", box=None)
        for row in rows:
            lag = "-" if row.lag_seconds is None else f"{row.lag_seconds:.0f}s"
            saved = datetime.fromtimestamp(row.saved_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            table.add_row(
                terminal_safe(row.shard),
                str(row.high_water_id),
                str(row.newest_id),
                str(row.lag_runs),
                lag,
                str(row.pending_runs),
                str(row.gaps),
                f"{saved} ({time.time() - row.saved_at:.0f}s ago)",
            )
        # A table wraps at 80 columns in a pipe; give it room where no terminal says how wide.
        console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
        console.print(table)
        console.print(f"state store {rows[0].state_store}; source {found.source}")
        for row in rows:
            if row.ahead_runs:
                console.print(
                    f"[bold red]{row.shard}: the checkpoint is {row.ahead_runs} run ids ahead of the source[/]; "
                    "`run-otel check` says how to recover"
                )

    guarded(body)


@click.command()
@CONFIG_OPTION
@click.option("--to-id", type=click.IntRange(min=1), default=None, help="The next poll exports from this run id again.")
@click.option("--since", type=TimeParam(), default=None, help="...from the first run created at this time (24h, 7d, or a date).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Rewind even while another instance holds the HA lease.")
@SHARD_OPTION
def rewind(
    config_path: Path | None, to_id: int | None, since: datetime | None, yes: bool, force: bool, shard: str | None
) -> None:
    """Move the checkpoint back, so the next poll exports from there again.

    Give --to-id N or --since T. Re-sent spans are byte-identical to the first
    copies, so Jaeger and Tempo show each span once; a rewind forward skips the
    ids in between. Stop the daemon first: rewind refuses while another
    instance holds the state store or the HA lease, unless --force.
    """
    if (to_id is None) == (since is None):
        raise click.UsageError("give exactly one of --to-id and --since")
    from ..ops.rewind import rewind as move_checkpoint

    config = load(config_path, shard)
    first = to_id if to_id is not None else since
    assert first is not None  # exactly one of the two, checked above

    def body() -> None:
        line = move_checkpoint(config, first, force, confirm=lambda question: yes or click.confirm(question))
        if line is None:
            fail("nothing changed", EXIT_FAILED)
        else:
            click.echo(line)

    guarded(body)


@click.command("export")
@CONFIG_OPTION
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--incomplete", is_flag=True, help="Also send runs that are still PENDING or RUNNING, marked incomplete.")
def export_command(config_path: Path | None, run_ids: tuple[str, ...], incomplete: bool) -> None:
    """Send RUN_IDS now, whatever the checkpoint says; it is not moved.

    A finished run is sent as the daemon would send it. A waiting run is
    skipped unless --incomplete, which sends it as incomplete (ERROR).
    """
    from ..ops.send_now import export_runs

    config = load(config_path)

    def body() -> None:
        outcome = export_runs(config, run_ids, incomplete)
        for run_id, trace in outcome.sent:
            click.echo(f"sent {terminal_safe(run_id)} as trace {trace}")
        for run_id in outcome.waiting:
            click.echo(f"skipped {terminal_safe(run_id)}: not finished yet (use --incomplete to send it as incomplete)", err=True)
        for run_id in outcome.unknown:
            click.echo(f"no run with run_id {run_id!r}", err=True)
        click.echo(f"{len(outcome.sent)} run(s), {outcome.spans} span(s) sent")
        if outcome.unknown or not outcome.sent:
            raise SystemExit(EXIT_FAILED)

    guarded(body)


@click.command("config")
@click.option(
    "--example", is_flag=True, required=True, help="Print the documented example: every key, its default and what it does."
)
def config_command(example: bool) -> None:
    """Print the documented example config (every key with its default).

    Start a deployment with: run-otel config --example > /etc/run-otel/run-otel.toml
    """
    from importlib.resources import files

    click.echo(files("run_otel").joinpath("example.toml").read_text(encoding="utf-8"), nl=False)


@click.command()
@CONFIG_OPTION
@click.option("--live", is_flag=True, help="Ask /healthz (the process is alive) instead of /readyz (the last poll succeeded).")
def health(config_path: Path | None, live: bool) -> None:
    """Probe the running daemon's /readyz on the configured metrics port.

    Exit 0 when it answers 200 within 3 s, else 1 with the reason. It reads
    metrics.host and metrics.port from the same config and RUN_OTEL_* variables
    as the daemon, so a container HEALTHCHECK follows a changed port.
    """
    from ..ops.probe import health as probe_health

    config = load(config_path)
    if not config.metrics.enabled:
        fail("metrics.enabled is false, so nothing serves /readyz or /healthz", EXIT_USAGE)
    url, healthy, why = probe_health(config, live)
    click.echo(f"{url}: {why}")
    if not healthy:
        sys.exit(EXIT_FAILED)


@click.command()
@CONFIG_OPTION
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def generate(config_path: Path | None, directory: Path) -> None:
    """Write the dashboards, alert and recording rules, their tests and the runbook into DIRECTORY.

    For your stack, from the config's [generate] section (the scrape job, where
    the runbook and Grafana are served, the data source uids, the thresholds)
    and [slo] (the objective behind the error-budget burn alerts). Without a
    config, the defaults: the files this project ships. Writes
    dashboards/*.json for Grafana, prometheus/alerts.yml for Prometheus'
    rule_files, prometheus/alerts_test.yml for `promtool test rules`, and
    runbook.md; files already there are replaced.
    """
    from ..ops.generate_job import generate_files

    config = load(config_path, demo=True)

    def body() -> None:
        try:
            written, warnings = generate_files(config, directory)
        except ImportError as exc:
            # A dependency of the package itself: only a broken or partial install lacks it.
            fail(f"generate needs {exc.name}, a dependency of run-otel: install run-otel again", EXIT_FAILED)
        for path in written:
            click.echo(f"wrote {path}")
        for line in warnings:
            click.echo(f"warning: {line}", err=True)

    guarded(body)


COMMANDS = (status, rewind, export_command, config_command, health, generate)
