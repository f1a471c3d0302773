"""`backfill --workers N`: the same spans as one process, each part in id order, and on a stop a
resume line before which every id was sent."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import datetime

from helpers import received_roots, write_config
from servers import Receiver, free_port, wait_for

from run_otel.config import load_config
from run_otel.ops.backfill_job import run_backfill
from run_otel.ops.backfill_workers import Running, split
from run_otel.ops.demo import generate, insert_workload
from run_otel.pipeline.backfill import Plan, Window


def test_the_parts_are_contiguous_cover_the_range_and_are_never_empty():
    for first, last, workers in [(1, 10, 3), (5, 5, 4), (1, 1_000_000, 2), (100, 107, 8), (3, 4, 32)]:
        parts = split(Plan(first, last, "ids"), workers)
        assert parts[0][0] == first and parts[-1][1] == last
        assert all(a <= b for a, b in parts)
        assert all(parts[k][1] + 1 == parts[k + 1][0] for k in range(len(parts) - 1))
        assert len(parts) == min(workers, last - first + 1)
        sizes = [b - a + 1 for a, b in parts]
        assert max(sizes) - min(sizes) <= 1


def _seed(agent_db, runs: int) -> dict[str, int]:
    """The demo workload (tool calls, evidence, failures), long finished or timed out; trace id -> run id."""
    insert_workload(agent_db.engine(), generate(7, runs, datetime(2026, 1, 1)))
    return {run_id[4:].replace("-", ""): row_id for row_id, run_id in agent_db.execute("SELECT id, run_id FROM diagnosis_run")}


def _config(agent_db, tmp_path, receiver: Receiver, name: str):
    return write_config(
        tmp_path / f"{name}.toml",
        {
            "source": {"url": agent_db.url},
            "state": {"url": f"sqlite:///{tmp_path / (name + '.db')}"},
            "poll": {"batch_size": 50},
            "export": {"endpoint": receiver.endpoint},
            "metrics": {"enabled": False},
        },
    )


def _backfill(config, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "run_otel", "backfill", "--from-id", "1", *extra, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RUN_OTEL_LOG__LEVEL": "DEBUG"},
    )


def _spans(receiver: Receiver) -> Counter:
    return Counter(span.SerializeToString() for _r, _s, span in receiver.spans())


def test_two_workers_send_the_same_spans_as_one_each_part_in_id_order(agent_db, tmp_path):
    ids = _seed(agent_db, 600)
    one, two, three = Receiver(), Receiver(), Receiver()
    one.start(), two.start(), three.start()
    try:
        single = _backfill(_config(agent_db, tmp_path, one, "one"))
        out_single, err = single.communicate(timeout=300)
        assert single.returncode == 0, err
        split_run = _backfill(_config(agent_db, tmp_path, two, "two"), "--workers", "2")
        out_split, err_split = split_run.communicate(timeout=300)
        assert split_run.returncode == 0, err_split
        # The precondition: a real workload, all of it sent both ways.
        assert len(ids) > 500 and received_roots(one) == received_roots(two) == set(ids)
        assert _spans(one) == _spans(two)
        assert out_single.splitlines()[0].split(" in ")[0] == out_split.splitlines()[0].split(" in ")[0]
        order = [ids[span.trace_id.hex()] for _r, _s, span in two.spans() if not span.parent_span_id]
        (first_part, second_part) = split(Plan(1, max(agent_db.execute("SELECT MAX(id) FROM diagnosis_run")[0]), "ids"), 2)
        for low, high in (first_part, second_part):
            in_part = [run_id for run_id in order if low <= run_id <= high]
            assert in_part and in_part == sorted(in_part)
        # The precondition: the split path ran (interleaving depends on timing), its parts forked.
        assert "2 workers" in err_split and "2 worker processes, started by fork" in err_split
        # Spawned parts, as beside another thread, send the same spans too.
        busy = threading.Event()
        beside = threading.Thread(target=busy.wait, daemon=True)
        beside.start()
        config = load_config(_config(agent_db, tmp_path, three, "three"), environ={})
        running = Running(config, Window(), Plan(1, max(ids.values()), "ids"), 2)
        tally = running.wait(lambda _tally: None)
        busy.set()
        assert running.method == "spawn" and tally.resume_from() is None and not tally.errors()
        assert _spans(three) == _spans(one)
    finally:
        one.stop(), two.stop(), three.stop()


def test_the_parts_fork_from_a_lone_thread_and_spawn_beside_another():
    program = (
        "import threading\n"
        "from run_otel.ops.backfill_workers import start_method\n"
        "print(start_method())\n"
        "done = threading.Event()\n"
        "threading.Thread(target=done.wait).start()\n"
        "print(start_method())\n"
        "done.set()\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fork", "spawn"]


def test_a_part_that_cannot_start_stops_the_parts_already_started_and_names_the_resume_line(agent_db, tmp_path, monkeypatch):
    ids = _seed(agent_db, 50)
    config = load_config(
        write_config(
            tmp_path / "c.toml",
            {
                "source": {"url": agent_db.url},
                "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
                "export": {"endpoint": "127.0.0.1:9"},
                "metrics": {"enabled": False},
            },
        ),
        environ={},
    )
    started: list = []
    real_start = multiprocessing.process.BaseProcess.start

    def start_or_run_out(process) -> None:
        if started:  # the kernel's answer when it is out of processes
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        real_start(process)
        started.append(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_or_run_out)
    before = signal.getsignal(signal.SIGTERM)
    busy = threading.Event()  # another thread: the parts are spawned, and die of SIGTERM while they import
    threading.Thread(target=busy.wait, daemon=True).start()
    try:
        outcome = run_backfill(config, Window(), (1, None, False), False, progress=None, workers=2)  # type: ignore[arg-type]
    finally:
        busy.set()
    assert len(started) == 1  # the precondition: one part ran when the second failed
    started[0].join(timeout=30)
    assert started[0].exitcode == -signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    assert outcome.failure is not None and "could not start 2 worker processes" in outcome.failure
    assert f"resume with --from-id 1 --to-id {max(ids.values())}" in outcome.failure


def test_a_stopped_split_backfill_names_a_resume_id_before_which_every_run_was_sent(agent_db, tmp_path):
    ids = _seed(agent_db, 1500)
    receiver = Receiver(hold_after=6)  # both parts are under way, then their sends wait
    receiver.start()
    try:
        config = _config(agent_db, tmp_path, receiver, "stop")
        process = _backfill(config, "--workers", "2")
        assert receiver.holding.wait(120), "the backfill never got under way"
        process.send_signal(signal.SIGTERM)
        receiver.release()
        _out, err = process.communicate(timeout=120)
        assert process.returncode == 1, err
        last_line = err.strip().splitlines()[-1]
        assert "stopped by SIGTERM" in last_line and "resume with --from-id" in last_line, err
        resume_from = int(last_line.split("--from-id ")[1].split()[0])
        sent = received_roots(receiver)
        assert 1 < resume_from <= max(ids.values())  # the precondition: it stopped part-way
        assert f"every id before {resume_from} was sent" in last_line
        assert {trace for trace, run_id in ids.items() if run_id < resume_from} <= sent
        assert sent != set(ids)
        resumed = subprocess.run(
            [sys.executable, "-m", "run_otel", "backfill", "--from-id", str(resume_from), "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert resumed.returncode == 0, resumed.stderr
        wait_for(lambda: received_roots(receiver) == set(ids), 30, "every run after the resume")
    finally:
        receiver.stop()


def test_a_split_backfill_that_could_send_nothing_claims_nothing_was_sent(agent_db, tmp_path):
    ids = _seed(agent_db, 100)
    config = write_config(
        tmp_path / "down.toml",
        {
            "source": {"url": agent_db.url},
            "state": {"url": f"sqlite:///{tmp_path / 'down.db'}"},
            "export": {"endpoint": f"127.0.0.1:{free_port()}", "timeout_seconds": 2},
            "metrics": {"enabled": False},
        },
    )
    process = _backfill(config, "--workers", "2")
    _out, err = process.communicate(timeout=300)
    last_line = err.strip().splitlines()[-1]
    assert process.returncode == 1 and last_line.startswith("run-otel: error: ids 1.."), err
    assert f"resume with --from-id 1 --to-id {max(ids.values())}" in last_line
    assert "was sent" not in last_line


def test_with_metrics_asks_for_one_worker(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "run_otel", "backfill", "--from-id", "1", "--workers", "2", "--with-metrics"],
        capture_output=True,
        text=True,
        env={**os.environ, "RUN_OTEL_SOURCE__URL": f"sqlite:///{tmp_path / 'none.db'}"},
        timeout=60,
    )
    assert done.returncode == 2 and "--with-metrics counts the runs in one process" in done.stderr, done.stderr


def test_a_backfill_without_metrics_loads_no_metrics_sdk(tmp_path):
    """Start-up is part of every backfill: what it does not use, it does not import. (An HTTP
    client still loads: the secret detector's plugins import one.)"""
    db = tmp_path / "agent.db"
    subprocess.run(
        [sys.executable, "-m", "run_otel", "demo", "--db", str(db), "--runs", "40"], cwd=tmp_path, check=True, capture_output=True
    )
    receiver = Receiver()
    receiver.start()
    try:
        config = write_config(
            tmp_path / "c.toml",
            {
                "source": {"url": f"sqlite:///{db}"},
                "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
                "export": {"endpoint": receiver.endpoint},
                "metrics": {"enabled": False},
            },
        )
        probe = (
            "import atexit, sys\n"
            "unused = ('prometheus_client', 'opentelemetry.sdk.metrics', 'opentelemetry.exporter.prometheus')\n"
            "atexit.register(lambda: print('LOADED', sorted(m for m in unused if m in sys.modules)))\n"
            "from run_otel.cli.main import main\n"
            f"sys.argv = ['run-otel', 'backfill', '--from-id', '1', '--config', {str(config)!r}]\n"
            "main()\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("backfilled ")
    assert len(received_roots(receiver)) > 30  # the precondition: it really exported
    assert "LOADED []" in done.stdout, done.stdout


def test_the_resume_id_is_the_first_id_any_part_left_unsent():
    from run_otel.ops.backfill_workers import Tally, _Part

    parts = [
        _Part(1, 10, read_to=10, done=True),  # finished
        _Part(11, 20, read_to=14, done=True),  # stopped after 14
        _Part(21, 30, read_to=20),  # never read a batch
        _Part(31, 40, read_to=35, done=True, error="UNAVAILABLE"),  # failed after 35
    ]
    tally = Tally(parts)
    assert tally.resume_from() == 15  # every id before it was sent; from it on, some were not
    assert tally.errors() == ["ids 31..40: UNAVAILABLE"]
    assert Tally([_Part(1, 10, read_to=10, done=True), _Part(11, 20, read_to=20, done=True)]).resume_from() is None
