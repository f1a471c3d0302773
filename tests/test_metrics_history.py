"""Counters at 0 from the start, and the metrics history `backfill --metrics-out` writes: the same
series as /metrics, a sample every step in time order, each run counted after it finished."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from run_otel.config import FeedbackConfig, GenerateConfig, build_config
from run_otel.factory import build_metrics
from run_otel.mapping.span_data import trace_id_for
from run_otel.ops.demo import generate
from run_otel.pipeline.results import ExportedRun, PollResult
from run_otel.source.clock import SourceClock
from run_otel.source.rows import (
    INTENTS,
    TERMINAL_STATUSES,
    FeedbackRow,
    RunRow,
    ToolRow,
    is_terminal,
)
from run_otel.telemetry import instruments as I
from run_otel.telemetry.history import Grid, MetricsHistory
from run_otel.telemetry.openmetrics import write_openmetrics

SINCE = datetime(2026, 11, 1)
UNTIL = SINCE + timedelta(hours=2)
STEP = 60
LINE = re.compile(r"^(?P<name>\w+)\{(?P<labels>.*?)\} (?P<value>\S+) (?P<ts>\d+)(?: # \{(?P<exemplar>[^}]*)\} \S+ \S+)?$")
PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# The labels the scrape adds, and the one the SDK writes empty (no label to Prometheus).
SCRAPE_ONLY = {"job", "instance", "otel_scope_schema_url"}


def row(values: dict, cls, **extra):
    values = {**values, **extra}
    return cls(**{name: values.get(name) for name in cls._fields})


def exported_runs(count: int = 150, seed: int = 11, hours: float = 2) -> list[ExportedRun]:
    """The demo mix over ``hours`` before UNTIL, as the backfill hands them to its recorder."""
    workload = generate(seed, count, anchor=SINCE + timedelta(hours=hours), span_seconds=hours * 3600 - 120)
    tools = defaultdict(list)
    for number, tool in enumerate(workload.tools, 1):
        tools[tool["run_id"]].append(row(tool, ToolRow, id=number))
    return [
        ExportedRun(row(run, RunRow, id=number), tools[run["run_id"]], False, 1)
        for number, run in enumerate(workload.terminal_runs(), 1)
    ]


def history_of(runs: list[ExportedRun], until: datetime = UNTIL, step: int = STEP) -> tuple[MetricsHistory, str]:
    clock = SourceClock("UTC")
    grid = Grid.covering(clock.epoch(SINCE), clock.epoch(until), step)
    history = MetricsHistory(grid, lambda run: clock.epoch(run.updated_at), FeedbackConfig().label_of)
    history.runs_exported(PollResult(runs=runs), 0.0)
    out = io.StringIO()
    write_openmetrics(history, out, I.JOB, I.INSTANCE)
    return history, out.getvalue()


def samples(text: str) -> dict[tuple[str, frozenset], list[tuple[int, float, str | None]]]:
    """Series -> [(timestamp, value, exemplar labels)], in file order."""
    series: dict[tuple[str, frozenset], list] = defaultdict(list)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, line
        labels = frozenset(PAIR.findall(match["labels"]))
        series[(match["name"], labels)].append((int(match["ts"]), float(match["value"]), match["exemplar"]))
    return series


def scrape(metrics) -> dict[tuple[str, frozenset], float]:
    """/metrics as the OpenMetrics exposition serves it, without the scrape's own labels."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in SCRAPE_ONLY)): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def epoch(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()


# -- counters at 0 ----------------------------------------------------------------------------


def test_a_fresh_metrics_endpoint_has_the_enum_series_at_zero():
    metrics = build_metrics(build_config({}))
    served = scrape(metrics)
    metrics.shutdown()
    scope = {("otel_scope_name", "run_otel"), ("otel_scope_version", served_version(served))}
    for status in TERMINAL_STATUSES:
        for intent in INTENTS:
            for outcome in (status, "none"):
                labels = frozenset({("status", status), ("intent", intent), ("release_outcome", outcome), *scope})
                assert served.get(("diagnosis_runs_total", labels)) == 0, (status, intent, outcome)
    for intent in INTENTS:
        assert served.get(("diagnosis_run_tokens_total", frozenset({("intent", intent), *scope}))) == 0, intent


def served_version(served: dict) -> str:
    versions = {v for _name, labels in served for k, v in labels if k == "otel_scope_version"}
    assert len(versions) == 1, versions
    return versions.pop()


def test_a_tools_calls_make_their_own_series_and_no_zero_siblings():
    """A tool's name is the agent's: a series per value and layer, relevance and outcome up front
    (24 for a retrieval tool) is what filled the SDK's limit at 3,000 names. Only what was called."""
    metrics = build_metrics(build_config({}))
    run = next(run for run in exported_runs(40) if run.tools)
    retrieval = run.tools[0]._replace(
        tool_name="kb",
        retrieval_layer="L0",
        relevance_level="PRECISE",
        success=True,
        l0_match_count=2,
        l1_match_count=None,
        dedup_reason=None,
    )
    function = run.tools[0]._replace(
        tool_name="logs",
        retrieval_layer=None,
        relevance_level=None,
        success=True,
        l0_match_count=None,
        l1_match_count=None,
        dedup_reason=None,
    )
    metrics.runs_exported(PollResult(runs=[ExportedRun(run.run, [retrieval, function], False, 3)]), 0.0)
    served = {
        (name, frozenset((k, v) for k, v in labels if not k.startswith("otel_"))): v
        for (name, labels), v in scrape(metrics).items()
    }
    metrics.shutdown()
    counters = {
        (name, labels): value
        for (name, labels), value in served.items()
        if name.endswith("_total") and {("tool_name", "kb"), ("tool_name", "logs")} & labels
    }
    kb_call = frozenset(dict(tool_name="kb", retrieval_layer="L0", relevance_level="PRECISE", success="true").items())
    logs_call = frozenset(dict(tool_name="logs", retrieval_layer="none", relevance_level="none", success="true").items())
    assert counters == {
        ("diagnosis_tool_invocations_total", kb_call): 1,
        ("diagnosis_tool_invocations_total", logs_call): 1,
        ("rag_matches_total", frozenset({("layer", "L0"), ("tool_name", "kb")})): 2,
    }


def test_ratings_of_every_label_and_intent_start_at_zero_when_ratings_are_counted():
    """So the first rating after a restart shows in increase(), as the first run does."""
    feedback = FeedbackConfig(scores={"Good": 1.0, "meh": 0.5}, negative=["BAD"])
    served = scrape_of(build_config({"feedback": {"scores": feedback.scores, "negative": feedback.negative}}))
    ratings = {labels: v for (name, labels), v in served.items() if name == "diagnosis_run_feedback_total"}
    expected = {frozenset({("feedback", f), ("intent", i)}) for f in ("Good", "meh", "BAD", "other") for i in INTENTS}
    assert {frozenset((k, v) for k, v in labels if not k.startswith("otel_")) for labels in ratings} == expected
    assert set(ratings.values()) == {0}
    off = scrape_of(build_config({"feedback": {"enabled": False}}))
    assert not [name for name, _labels in off if name == "diagnosis_run_feedback_total"]


def scrape_of(config) -> dict[tuple[str, frozenset], float]:
    metrics = build_metrics(config)
    try:
        return scrape(metrics)
    finally:
        metrics.shutdown()


# -- the history ------------------------------------------------------------------------------


def test_the_history_has_the_series_names_labels_buckets_and_totals_of_metrics():
    runs = exported_runs()
    metrics = build_metrics(build_config({}))
    metrics.runs_exported(PollResult(runs=runs), 0.0)
    # Live, a run's rating is counted as the backfill's ratings sender sends it, beside the export.
    rated = [r.run for r in runs if r.run.feedback is not None and is_terminal(r.run.status)]
    assert rated  # the demo mix has ratings, so the feedback family is compared too
    metrics.feedback_sent([FeedbackRow(r.id, r.run_id, r.intent, r.feedback, r.updated_at) for r in rated])
    served = scrape(metrics)
    metrics.shutdown()
    run_families = tuple(i.prometheus for i in I.RUN_INSTRUMENTS)
    served = {key: value for key, value in served.items() if key[0].startswith(run_families)}
    written = samples(history_of(runs)[1])
    assert len(written) > 100  # the demo mix: every family, many label sets
    scraped_labels = {("job", I.JOB), ("instance", I.INSTANCE)}
    final = {}
    for (name, labels), points in written.items():
        assert scraped_labels <= labels, labels
        final[(name, labels - scraped_labels)] = points[-1][1]
    assert set(final) <= set(served), set(final) - set(served)
    # /metrics also has the siblings a tool's first call starts at 0; everything counted is in both.
    counted = {key: value for key, value in served.items() if value}
    assert {key: final.get(key) for key in counted} == pytest.approx(counted)


def test_every_series_has_a_sample_every_step_starting_at_zero():
    history, text = history_of(exported_runs())
    steps = [history.grid.first + k * STEP for k in range(history.grid.steps + 1)]
    assert steps[0] <= epoch(SINCE) < steps[1] and steps[-2] < epoch(UNTIL) <= steps[-1]
    for (name, labels), points in samples(text).items():
        assert [ts for ts, _v, _e in points] == steps, name
        values = [v for _ts, v, _e in points]
        assert values[0] == 0 and values == sorted(values), (name, labels)


def test_a_run_counts_in_every_sample_after_it_finished():
    runs = exported_runs()
    _history, text = history_of(runs)
    totals: dict[int, float] = defaultdict(float)
    for (name, _labels), points in samples(text).items():
        if name == "diagnosis_runs_total":
            for ts, value, _e in points:
                totals[ts] += value
    finished = sorted(epoch(run.run.updated_at) for run in runs)
    assert len(finished) > 100 and finished[-1] < epoch(UNTIL)
    for ts, total in totals.items():
        assert total == sum(1 for moment in finished if moment < ts), ts


def test_exemplars_open_the_trace_of_a_run_counted_at_that_step():
    runs = exported_runs()
    by_trace = {trace_id_for(run.run.run_id).hex(): run.run for run in runs}
    _history, text = history_of(runs)
    with_exemplar: dict[str, int] = defaultdict(int)
    for (name, labels), points in samples(text).items():
        previous = 0.0
        for ts, value, exemplar in points:
            # A counter's sample carries one exactly when it grew; a bucket only when it grew (the
            # smallest bucket holding the value has it, the cumulative ones above grow too).
            if name.endswith("_total"):
                assert (exemplar is not None) == (value > previous), (name, ts)
            else:
                assert exemplar is None or value > previous, (name, ts)
            if exemplar is not None:
                run = by_trace[dict(PAIR.findall(exemplar))["trace_id"]]
                assert ts - STEP <= epoch(run.updated_at) < ts, (name, ts)
                if name == "diagnosis_runs_total":
                    assert ("status", run.status) in labels
                with_exemplar[name] += 1
            previous = value
    assert with_exemplar["diagnosis_runs_total"] > 0 and with_exemplar["diagnosis_tool_duration_seconds_bucket"] > 0


def test_a_run_that_finished_after_the_window_counts_in_the_last_sample():
    runs = exported_runs(40)
    late = runs[-1]
    late = ExportedRun(late.run._replace(updated_at=UNTIL + timedelta(hours=2)), late.tools, False, 1)
    history, text = history_of([*runs[:-1], late])
    total_at = defaultdict(float)
    for (name, _labels), points in samples(text).items():
        if name == "diagnosis_runs_total":
            for ts, value, _e in points:
                total_at[ts] += value
    assert total_at[history.grid.last] == len(runs)
    assert max(total_at) == history.grid.last < epoch(UNTIL) + STEP


def test_the_window_and_step_are_checked():
    with pytest.raises(ValueError, match="the metrics window is empty"):
        Grid.covering(100.0, 100.0, 60)
    with pytest.raises(ValueError, match="at least 1 second"):
        Grid.covering(0.0, 100.0, 0)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--from-id", "1"], "--metrics-out needs --since"),
        (["--since", "1d", "--workers", "2"], "--metrics-out counts the runs in one process: use it with --workers 1"),
        (["--since", "1d", "--metrics-step", "0"], "0 is not in the range x>=1"),
    ],
)
def test_metrics_out_refuses_what_it_cannot_write_before_it_backfills(tmp_path, args, says):
    from click.testing import CliRunner

    from run_otel.cli.main import cli

    result = CliRunner().invoke(cli, ["backfill", "--metrics-out", str(tmp_path / "h.om"), *args])
    assert result.exit_code == 2 and says in result.output, result.output


def test_metrics_out_into_a_missing_folder_fails_before_the_backfill(tmp_path):
    from click.testing import CliRunner

    from run_otel.cli.main import cli

    target = tmp_path / "missing" / "h.om"
    result = CliRunner().invoke(cli, ["backfill", "--since", "1d", "--metrics-out", str(target)])
    assert result.exit_code == 2 and f"the folder {target.parent} does not exist" in result.output, result.output


def test_the_default_job_and_instance_are_the_shipped_scrapes():
    import yaml

    from run_otel.cli.main import backfill

    config = yaml.safe_load((Path(__file__).parent.parent / "config/prometheus/prometheus.yml").read_text())
    (scrape,) = config["scrape_configs"]
    defaults = {p.name: p.default for p in backfill.params}
    # No --metrics-job: the [generate] section's job, whose default is the shipped scrape's.
    assert defaults["metrics_job"] is None
    assert GenerateConfig().job == scrape["job_name"] == I.JOB
    assert defaults["metrics_instance"] == scrape["static_configs"][0]["targets"][0] == I.INSTANCE


def _agent_db_with_runs(path: Path, hours: float = 2) -> datetime:
    """A SQLite agent database with a demo workload over the last ``hours``; returns the window's start."""
    from sqlalchemy.engine import make_url

    from run_otel.ops.demo import insert_workload
    from run_otel.source.engine import make_engine

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    engine = make_engine(make_url(f"sqlite:///{path}"))
    insert_workload(engine, generate(5, 30, now - timedelta(minutes=5), span_seconds=hours * 3600 - 600), create=True)
    engine.dispose()
    return now - timedelta(hours=hours)


@pytest.mark.parametrize(("job_flag", "job"), [((), "agents-prod"), (("--metrics-job", "by-hand"), "by-hand")])
def test_the_history_takes_the_generate_job_the_rules_select_on(tmp_path, receiver, job_flag, job):
    """Imported series the generated rules and dashboards would not select are no history at all."""
    from click.testing import CliRunner

    from run_otel.cli.main import cli

    since = _agent_db_with_runs(tmp_path / "agent.db")
    (tmp_path / "run-otel.toml").write_text(
        f'[source]\nurl = "sqlite:///{tmp_path / "agent.db"}"\n'
        f'[state]\nurl = "sqlite:///{tmp_path / "state.db"}"\n'
        f'[export]\nendpoint = "{receiver.endpoint}"\n'
        '[generate]\njob = "agents-prod"\n'
    )
    out = tmp_path / "h.om"
    args = ["backfill", "--config", str(tmp_path / "run-otel.toml"), "--since", f"{since:%Y-%m-%d %H:%M:%S}"]
    result = CliRunner().invoke(cli, [*args, "--metrics-out", str(out), *job_flag])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert f'job="{job}"' in text and "diagnosis_runs_total{" in text
    assert {m for m in re.findall(r'job="([^"]*)"', text)} == {job}


def test_a_history_that_cannot_be_written_leaves_no_part_of_itself(tmp_path):
    from contextlib import contextmanager

    from run_otel.ops.metrics_history import MetricsRequest, write_history

    @contextmanager
    def progress(_label, _total):
        yield lambda _done, _detail: None

    history, _text = history_of(exported_runs(40))
    folder = tmp_path / "out"
    folder.mkdir()
    request = MetricsRequest(folder / "h.om")
    written = write_history(history, request, progress)
    assert written.path.read_text().endswith("# EOF\n") and written.series == history.series_count()
    # A file size limit makes the write fail half way, as a full disk does.
    import resource
    import signal

    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (written.bytes // 2, limits[1]))
    try:
        with pytest.raises(OSError, match="File too large"):
            write_history(history, MetricsRequest(folder / "again.om"), progress)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert sorted(p.name for p in folder.iterdir()) == ["h.om"]


def _add_runs(url: str, runs: list[tuple[str, str, datetime]], seconds: int = 5) -> None:
    """``runs`` as (run_id, status, created_at), inserted in that order; a finished run ends ``seconds`` after it started."""
    from sqlalchemy import insert
    from sqlalchemy.engine import make_url

    from run_otel.source.engine import make_engine
    from run_otel.source.schema import diagnosis_run, metadata

    engine = make_engine(make_url(url))
    metadata.create_all(engine)
    with engine.begin() as conn:
        for run_id, status, created in runs:
            updated = created + timedelta(seconds=seconds) if status == "SUCCESS" else created
            values = {"run_id": run_id, "session_id": "s", "query": "q", "status": status, "intent": "DIAGNOSIS"}
            conn.execute(insert(diagnosis_run).values(**values, created_at=created, updated_at=updated))
    engine.dispose()


def _runs_counted(series: dict) -> float:
    return sum(value for (name, _labels), value in series.items() if name == "diagnosis_runs_total")


def test_the_history_and_the_daemon_count_each_run_once_across_the_cutover(tmp_path, receiver):
    """The procedure of docs/operations.md: the daemon starts with no checkpoint (start_from = "now"),
    the backfill's history ends at its start. A run in flight at the start is the daemon's: it takes
    it over, and the history, reading the daemon's checkpoint, leaves it out. The newest run at the
    start, where the daemon's mark is, had finished: the daemon starts after it, so it is the history's."""
    from click.testing import CliRunner
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from run_otel.cli.main import cli
    from run_otel.factory import build_parts, build_poller
    from run_otel.source.engine import make_engine

    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    before = [(f"old-{n}", "SUCCESS", now - timedelta(minutes=90 - n)) for n in range(20)]
    at_mark = ("at-mark", "SUCCESS", now - timedelta(minutes=4))
    _add_runs(url, [*before, ("in-flight", "RUNNING", now - timedelta(minutes=5)), at_mark])
    (tmp_path / "run-otel.toml").write_text(
        f'[source]\nurl = "{url}"\n[state]\nurl = "sqlite:///{tmp_path / "state.db"}"\n'
        f'[export]\nendpoint = "{receiver.endpoint}"\n[poll]\nsettle_seconds = 0\n'
    )
    config = build_config(
        {
            "source": {"url": url},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "export": {"endpoint": receiver.endpoint},
            "poll": {"settle_seconds": 0},
        }
    )

    # The daemon's first start, at T0 = now: after the newest run id, the finished run at the mark.
    metrics = build_metrics(config)
    with build_parts(config, recorder=metrics) as parts:
        poller = build_poller(parts)
        first = poller.poll()
        assert (first.pending, first.run_count) == (1, 0)  # the run in flight is taken over; the one at the mark is not sent
        engine = make_engine(make_url(url))
        with engine.begin() as conn:  # it finishes after T0; two new runs come in
            conn.execute(
                text("UPDATE diagnosis_run SET status = 'SUCCESS', updated_at = :t WHERE run_id = 'in-flight'"), {"t": now}
            )
        engine.dispose()
        _add_runs(url, [(f"new-{n}", "SUCCESS", now) for n in range(2)], seconds=0)
        poller.poll()
    live = _runs_counted(scrape(metrics))
    metrics.shutdown()

    out = tmp_path / "h.om"
    args = ["--since", f"{now - timedelta(hours=2):%Y-%m-%d %H:%M:%S}", "--until", f"{now:%Y-%m-%d %H:%M:%S}"]
    result = CliRunner().invoke(cli, ["backfill", "--config", str(tmp_path / "run-otel.toml"), *args, "--metrics-out", str(out)])
    assert result.exit_code == 0, result.output
    history = _runs_counted({key: points[-1][1] for key, points in samples(out.read_text()).items()})

    assert "1 run(s) left out, counted by the daemon" in result.output
    # 20 old runs and the one at the mark in the history; the one in flight and the 2 new ones live:
    # 24 runs, each once.
    assert (history, live) == (21, 3)


def test_the_tee_passes_every_recorder_call_to_each_recorder():
    """The backfill's live metrics and history share one Tee: a Recorder method it did not pass on
    would leave one of them silent."""
    from run_otel.pipeline.recorder import Recorder, Tee

    calls: list[tuple[int, str, tuple]] = []

    class Spy(Recorder):
        def __init__(self, n: int):
            self.n = n

        def __getattribute__(self, name: str):
            if name.startswith("_") or name == "n" or not callable(getattr(Recorder, name, None)):
                return object.__getattribute__(self, name)
            return lambda *args: calls.append((object.__getattribute__(self, "n"), name, args))

    methods = [name for name, member in vars(Recorder).items() if callable(member) and not name.startswith("_")]
    assert len(methods) > 10  # the whole interface, not a part of it
    tee = Tee(Spy(1), Spy(2))
    for name in methods:
        getattr(tee, name)(name)
    assert calls == [(n, name, (name,)) for name in methods for n in (1, 2)]
