"""The history as remote-write requests carries exactly the samples, labels and exemplars of the
OpenMetrics file written from the same runs, in time order; and `--metrics-push` refuses what it
cannot send before the backfill. The requests are decoded here with a plain protobuf wire reader,
from the field numbers of prompb, not with the encoder's own code."""

from __future__ import annotations

import struct
from collections import defaultdict

import cramjam
import pytest
from click.testing import CliRunner
from test_metrics_history import exported_runs, history_of, samples

from run_otel.cli.main import cli
from run_otel.telemetry import instruments as I
from run_otel.telemetry.remote_write import first_sample, history_series, write_requests


def fields(data: bytes):
    """(field number, value) of one protobuf message: ints for varints, bytes otherwise."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at : at + length], at + length
        else:
            raise AssertionError(f"wire type {wire}")
        yield number, value


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, at


def labels_of(message: bytes) -> dict[str, str]:
    pairs = [dict(fields(label)) for number, label in fields(message) if number == 1]
    return {p[1].decode(): p[2].decode() for p in pairs}


def decoded(payloads: list[bytes]) -> tuple[dict, dict]:
    """Series -> [(timestamp in s, value)] and series -> [exemplar labels as the file writes them],
    in request order."""
    series: dict[tuple[str, frozenset], list] = defaultdict(list)
    exemplars: dict[tuple[str, frozenset], list] = defaultdict(list)
    for payload in payloads:
        for number, timeseries in fields(payload):
            if number != 1:
                continue
            labels = labels_of(timeseries)
            key = (labels.pop("__name__"), frozenset(labels.items()))
            for field, value in fields(timeseries):
                if field == 2:
                    sample = dict(fields(value))
                    series[key].append((sample[2] // 1000, struct.unpack("<d", sample[1])[0]))
                elif field == 3:
                    ex = labels_of(value)
                    exemplars[key].append(f'trace_id="{ex["trace_id"]}",span_id="{ex["span_id"]}"')
    return series, exemplars


def test_the_requests_hold_the_files_samples_and_exemplars_in_time_order():
    history, text = history_of(exported_runs())
    series = history_series(history, I.JOB, I.INSTANCE)
    requests = list(write_requests(history, series, per_request=5000))
    assert len(requests) > 3  # precondition: the month is split, so the order across requests counts
    expected = samples(text)
    got, exemplars = decoded([r.payload for r in requests])
    assert set(got) == set(expected)
    for key, points in expected.items():
        assert got[key] == [(ts, v) for ts, v, _e in points], key
        assert exemplars.get(key, []) == [e for *_p, e in points if e], key
    assert sum(len(e) for e in exemplars.values()) > 100  # precondition: the runs left exemplars to compare
    assert sum(r.samples for r in requests) == sum(len(p) for p in expected.values())
    last_steps = [r.last_step for r in requests]
    assert last_steps == sorted(last_steps) and last_steps[-1] == history.grid.steps


def test_the_first_sample_is_one_the_push_sends_again():
    history, text = history_of(exported_runs())
    series = history_series(history, I.JOB, I.INSTANCE)
    (one,) = decoded([first_sample(history, series).payload])[0].items()
    key, [(ts, value)] = one
    assert ts == history.grid.first and samples(text)[key][0][:2] == (ts, value)


def test_a_request_is_snappy_block_compressed_protobuf():
    history, _text = history_of(exported_runs(count=20))
    request = next(write_requests(history, history_series(history, I.JOB, I.INSTANCE)))
    framed = bytes(cramjam.snappy.compress_raw(request.payload))
    assert bytes(cramjam.snappy.decompress_raw(framed)) == request.payload
    metadata = [dict(fields(value)) for number, value in fields(request.payload) if number == 3]
    assert {m[2].decode() for m in metadata} >= {"diagnosis_runs", "diagnosis_run_duration_seconds"}
    assert {m[1] for m in metadata} == {1, 3}  # COUNTER and HISTOGRAM


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metrics-push", "prometheus:9090/api/v1/write"], "not an http(s) URL"),
        (["--metrics-push", "http://p/api/v1/write", "--metrics-out", "h.om"], "not both"),
        (["--metrics-push-header", "X-Scope-OrgID: a"], "--metrics-push-header goes with --metrics-push"),
        (["--metrics-push", "http://p/api/v1/write", "--metrics-push-header", "Bearer secret-token"], "as 'Name: value'"),
        (["--metrics-push", "http://p/api/v1/write", "--workers", "2"], "--metrics-push counts the runs in one process"),
    ],
)
def test_metrics_push_refuses_what_it_cannot_send_before_it_backfills(args, says):
    result = CliRunner().invoke(cli, ["backfill", "--since", "1d", *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert "secret-token" not in result.output
