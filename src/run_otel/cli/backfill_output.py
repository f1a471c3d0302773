"""What `backfill` writes besides the traces: the --metrics-out options, and the summary it prints."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..telemetry import instruments as I
from .options import EXIT_USAGE, fail

if TYPE_CHECKING:
    from ..config import Config
    from ..ops.metrics_history import MetricsRequest
    from ..pipeline.backfill import Window


_OPTIONS = (
    click.option(
        "--metrics-out",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        default=None,
        help="Also write the run, tool, RAG and feedback metrics of the backfilled runs to this file as "
        "OpenMetrics, a sample per series every --metrics-step from --since on, for "
        "`promtool tsdb create-blocks-from openmetrics` (docs/operations.md). Needs --since.",
    ),
    click.option(
        "--metrics-push",
        metavar="URL",
        default=None,
        help="Also push those metrics by Prometheus remote write to URL, such as "
        "http://prometheus:9090/api/v1/write, a sample per series every --metrics-step from --since on, "
        "with their own timestamps: no file, and a history the dashboards can zoom into to a single day "
        "(docs/operations.md#metrics-history). Needs --since.",
    ),
    click.option(
        "--metrics-push-header",
        metavar="'NAME: VALUE'",
        multiple=True,
        help="A header for every push request, such as 'X-Scope-OrgID: agents' for Mimir; repeatable.",
    ),
    click.option(
        "--metrics-step",
        type=click.IntRange(min=1),
        default=None,
        help="Seconds between two samples of a series, as the scrape interval would be. "
        "Default: 30 with --metrics-push (half of Grafana's shortest rate window), 60 with --metrics-out.",
    ),
    click.option(
        "--metrics-job",
        default=None,
        help="The job label the daemon's scrape gives it. Default: [generate] job (run-otel), which the "
        "generated rules and dashboards select on and the shipped Prometheus config's scrape sets.",
    ),
    click.option(
        "--metrics-instance",
        default=I.INSTANCE,
        show_default=True,
        help="The instance label: the daemon's scrape target, or a name of its own (`backfill`) to keep "
        "the history apart from the live series.",
    ),
)


def metrics_out_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the --metrics-* options; the command gets them as one ``metrics_out`` (None without a file)."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        metrics_out: Path | None,
        metrics_push: str | None,
        metrics_push_header: tuple[str, ...],
        metrics_step: int | None,
        metrics_job: str | None,
        metrics_instance: str,
        **kw: Any,
    ) -> Any:
        from ..ops.metrics_history import MetricsRequest

        if metrics_out and metrics_push:
            raise click.UsageError("give --metrics-out FILE or --metrics-push URL, not both")
        if metrics_push_header and not metrics_push:
            raise click.UsageError("--metrics-push-header goes with --metrics-push")
        request = None
        if metrics_out:
            _check_writable(metrics_out)
            request = MetricsRequest(metrics_out, metrics_step, metrics_job, metrics_instance)
        elif metrics_push:
            url, headers = _push_target(metrics_push, metrics_push_header)
            request = MetricsRequest(None, metrics_step, metrics_job, metrics_instance, url, headers)
        return command(*args, metrics_out=request, **kw)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def _push_target(url: str, headers: tuple[str, ...]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The URL, checked before the backfill, and each header as (name, value)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(f"--metrics-push {url!r}: not an http(s) URL, such as http://prometheus:9090/api/v1/write", EXIT_USAGE)
    pairs = []
    for header in headers:
        name, colon, value = header.partition(":")
        if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
            # It may hold a token: none of it is shown.
            fail("--metrics-push-header: give each as 'Name: value' (the header given is not shown)", EXIT_USAGE)
        pairs.append((name.strip(), value.strip()))
    return url, tuple(pairs)


def _check_writable(path: Path) -> None:
    """Before the backfill, not after an hour of it: the file's folder must exist and take files."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        fail(f"--metrics-out {path}: the folder {folder} does not exist", EXIT_USAGE)
    if not os.access(folder, os.W_OK):
        fail(f"--metrics-out {path}: the folder {folder} is not writable", EXIT_USAGE)


def backfill_and_report(
    config: Config, window: Window, ids: tuple, with_metrics: bool, workers: int, metrics_out: MetricsRequest | None
) -> None:
    from ..ops.backfill_job import run_backfill
    from ..ops.metrics_push import PushError
    from ..pipeline.backfill import where_to_find
    from ..telemetry.history import HistoryWindowError
    from .links import trace_links

    progress, say = _terminal() if sys.stderr.isatty() else (_plain_progress, _say)
    try:
        outcome = run_backfill(config, window, ids, with_metrics, progress, workers, metrics_out)
    except HistoryWindowError as exc:
        fail(str(exc), EXIT_USAGE)
    except PushError as exc:  # before any run was read: the receiver would refuse the history
        fail(f"--metrics-push: {exc}")
    total = outcome.total
    click.echo(f"backfilled {total.run_count} runs ({total.spans} spans) {window.describe()} in {outcome.seconds:.1f}s")
    for line in where_to_find(outcome.first_trace, outcome.last_trace, outcome.total.in_flight):
        click.echo(line)
    for label, trace_id in (("first", outcome.first_trace), ("last", outcome.last_trace)) if outcome.first_trace else ():
        for link in trace_links(config, trace_id):
            click.echo(f"open {label}: {link}")
    if outcome.metrics:
        click.echo(outcome.metrics.describe())
    if outcome.warning:
        say(f"[bold red]WARNING:[/] {outcome.warning}")
    if outcome.metrics_note:
        say(outcome.metrics_note)
    if outcome.failure:
        fail(outcome.failure)


def _terminal() -> tuple[Callable, Callable[[str], None]]:
    """On a terminal: a progress bar, and lines with rich's markup."""
    from rich.console import Console

    from .render import progress_task

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    return progress_task(console), console.print


def _say(markup: str) -> None:
    """A line to stderr without rich (a pipe, a log file): its markup taken out."""
    click.echo(re.sub(r"\[/?[a-z ]*\]", "", markup), err=True)


@contextmanager
def _plain_progress(label: str, total: int) -> Iterator[Callable[[int, str], None]]:
    """Without a terminal, no bar to redraw: one line at the end, what it came to."""
    state = [0, ""]

    def advance(done: int, rate: str) -> None:
        state[:] = [done, rate]

    try:
        yield advance
    finally:
        click.echo(f"{label} {state[0]:,}/{total:,} {state[1]}".rstrip(), err=True)
