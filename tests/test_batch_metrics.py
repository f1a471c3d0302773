"""A batch's runs reach the metrics SDK summed per series (counters) and per bucket (histograms):
the same counts, sums and exemplars as one measurement at a time, in a few hundred calls rather
than forty a run."""

from __future__ import annotations

import random
from datetime import datetime

import pytest
from helpers import bridge_metrics
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from run_otel.config import build_config
from run_otel.pipeline.results import ExportedRun, PollResult
from run_otel.source.rows import RunRow, ToolRow
from run_otel.telemetry import batch_tally
from run_otel.telemetry.measurements import run_measurements

T = datetime(2026, 12, 1, 12)
TOOLS = ("lookup_knowledge", "query_logs", "query_metrics", "search_runbook")


def batch(runs: int, seed: int = 3) -> PollResult:
    rnd = random.Random(seed)
    out = []
    for n in range(runs):
        run_id = f"run-00000000-0000-4000-8000-{n:012d}"
        status = rnd.choice(("SUCCESS", "SUCCESS", "FAILED", "FALLBACK"))
        run = RunRow(n, run_id, "s", status, None, "DIAGNOSIS", status, None, rnd.randint(100, 200_000), 4200, 5, 4, T, T)
        tools = [
            ToolRow(
                n * 100 + k,
                run_id,
                k,
                rnd.choice(TOOLS),
                10,
                rnd.choice(("L0", "L1", "L0+L1", None)),
                rnd.randint(0, 3),
                rnd.randint(0, 2),
                False,
                rnd.choice(("PRECISE", "REFERENCE", None)),
                rnd.choice((None, "duplicate")),
                None,
                rnd.choice((3, 40, 180, 2500, 61_000)),
                rnd.random() > 0.1,
                None,
                T,
            )
            for k in range(rnd.randint(0, 12))
        ]
        out.append(ExportedRun(run, tools, rnd.random() < 0.05, 1 + len(tools), 1.7e9 + rnd.random() * 600))
    return PollResult(runs=out, run_count=len(out), spans=sum(e.span_count for e in out))


def points(reader: InMemoryMetricReader) -> dict:
    """metric -> attributes -> what Prometheus would show of it."""
    out: dict = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    key = tuple(sorted(p.attributes.items()))
                    if hasattr(p, "bucket_counts"):
                        value = (tuple(p.bucket_counts), p.count, round(p.sum, 9), p.min, p.max)
                    else:
                        value = p.value
                    out.setdefault(metric.name, {})[key] = value
    return out


def one_by_one(metrics, result: PollResult, acked_at: float) -> None:
    """How runs were recorded before: every measurement on its own."""
    from run_otel.telemetry import instruments as I

    for exported in result.runs:
        for measurement in run_measurements(exported, None, metrics._bounds):
            metrics._measure(measurement)
        if exported.incomplete:
            metrics._get(I.INCOMPLETE_RUNS).add(1)
        metrics._get(I.EXPORT_DELAY).record(max(acked_at - exported.settled_at - metrics._settle, 0.0))
    metrics._get(I.EXPORTED_SPANS).add(result.accepted_spans)


@pytest.mark.parametrize("by_bucket", [True, False], ids=["by bucket", "one by one, where the SDK differs"])
def test_a_batch_shows_what_one_measurement_at_a_time_showed(monkeypatch, by_bucket):
    monkeypatch.setattr(batch_tally, "weighted", lambda: by_bucket)
    config = build_config({})
    batched, single = InMemoryMetricReader(), InMemoryMetricReader()
    a, b = bridge_metrics(config, [batched]), bridge_metrics(config, [single])
    for seed in range(3):
        result = batch(400, seed)
        a.runs_exported(result, 1.7e9 + 900)
        one_by_one(b, result, 1.7e9 + 900)
    shown, expected = points(batched), points(single)
    for name in ("run_otel.start.timestamp",):  # when each was made
        shown.pop(name), expected.pop(name)
    assert expected["diagnosis.tool.duration"]  # the precondition: histograms and counters with many series
    assert len(expected["diagnosis.tool.invocations"]) > 20
    assert shown == expected
    a.shutdown()
    b.shutdown()


def test_the_sdk_works_by_the_bucket():
    assert batch_tally.weighted()  # this SDK's histogram adds a bucket's observations in one call


def test_a_batch_reaches_the_sdk_in_a_call_per_series_and_bucket():
    metrics = bridge_metrics(build_config({}), [InMemoryMetricReader()])
    calls = 0

    class Counting:
        def __init__(self, instrument):
            self._instrument = instrument

        def add(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            self._instrument.add(*args, **kwargs)

        def record(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            self._instrument.record(*args, **kwargs)

        def set(self, *args, **kwargs):
            self._instrument.set(*args, **kwargs)

    result = batch(500)
    for seed in (4, 5):  # the tools' first calls, which start their series at 0, are behind us
        metrics.runs_exported(batch(500, seed), 1.7e9)
    metrics._i = {name: Counting(instrument) for name, instrument in metrics._i.items()}
    measurements = sum(1 for exported in result.runs for _m in run_measurements(exported, None, metrics._bounds))
    metrics.runs_exported(result, 1.7e9 + 900)
    assert measurements > 10_000  # the precondition: what one call a measurement would have cost
    assert calls < 600, calls  # the series and buckets of a batch, and the export delay's
    metrics.shutdown()


def test_a_batch_hashes_a_tool_span_id_only_for_the_exemplars_it_keeps(monkeypatch):
    from run_otel.telemetry import measurements

    metrics = bridge_metrics(build_config({}), [InMemoryMetricReader()])
    metrics.runs_exported(batch(500, 4), 1.7e9)  # the series exist
    hashed = 0
    real = measurements.tool_span_id_for

    def counted(key: str, tool_id: int) -> bytes:
        nonlocal hashed
        hashed += 1
        return real(key, tool_id)

    monkeypatch.setattr(measurements, "tool_span_id_for", counted)
    result = batch(500)
    tools = sum(len(exported.tools) for exported in result.runs)
    metrics.runs_exported(result, 1.7e9 + 900)
    assert tools > 2_500  # the precondition: what a SHA-256 a tool call would have cost
    assert 0 < hashed < 600, hashed  # the exemplars of the tool series and buckets, at most
    metrics.shutdown()
