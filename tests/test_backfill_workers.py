"""`backfill --workers N`: the same spans as one process, each piece in id order, the pieces taken
in turn, and on a stop a resume line before which every id was sent."""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import datetime

from helpers import demo_backfill_config, received_roots, write_config
from servers import Receiver, free_port, wait_for

from run_otel.config import load_config
from run_otel.ops.backfill_job import run_backfill
from run_otel.ops.backfill_workers import Running, Tally, _Piece, pieces
from run_otel.ops.demo import generate, insert_workload
from run_otel.pipeline.backfill import Plan, Window, resume_hint
from run_otel.pipeline.backfilled import merged


def test_the_pieces_are_contiguous_cover_the_range_and_shrink_to_a_quarter_batch():
    for first, last, workers, batch in [(1, 10, 3, 500), (5, 5, 4, 500), (1, 1_000_000, 2, 500), (100, 107, 8, 4), (3, 4, 32, 1)]:
        cut = pieces(Plan(first, last, "ids"), workers, batch)
        assert cut[0][0] == first and cut[-1][1] == last
        assert all(a <= b for a, b in cut)
        assert all(cut[k][1] + 1 == cut[k + 1][0] for k in range(len(cut) - 1))
        sizes = [b - a + 1 for a, b in cut]
        assert sizes == sorted(sizes, reverse=True)
        smallest = max(1, min(batch // 4, -(-(last - first + 1) // workers)))
        assert all(size >= smallest for size in sizes[:-1])
        assert len(cut) >= min(workers, last - first + 1)  # a short range still gives each process a piece
        # Each piece is at most a 2N-th of what was left (or a quarter batch): the last ones are small.
        for a, b in cut:
            left = last - a + 1
            assert b - a + 1 <= max(-(-left // (2 * workers)), smallest)
    assert [b - a + 1 for a, b in pieces(Plan(1, 8000, "ids"), 2, 500)][:3] == [2000, 1500, 1125]
    assert len(pieces(Plan(1, 1_000_000, "ids"), 2, 500)) < 60  # a few dozen reports of what was taken


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
        for low, high in pieces(Plan(1, max(agent_db.execute("SELECT MAX(id) FROM diagnosis_run")[0]), "ids"), 2, 50):
            in_piece = [run_id for run_id in order if low <= run_id <= high]
            assert in_piece and in_piece == sorted(in_piece)
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
        assert running.method == "spawn" and tally.unsent() is None and not tally.errors()
        assert {piece.taken_by for piece in tally.pieces} == {0, 1}
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
        resume_to = last_line.split("--to-id ")[1].split()[0]
        resumed = subprocess.run(
            [
                sys.executable,
                "-m",
                "run_otel",
                "backfill",
                "--from-id",
                str(resume_from),
                "--to-id",
                resume_to,
                "--config",
                str(config),
            ],
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
    receiver = Receiver()
    receiver.start()
    try:
        config = demo_backfill_config(tmp_path, receiver.endpoint, 40)
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


def test_the_resume_id_is_the_first_id_of_any_piece_left_unsent():
    cut = [
        _Piece(1, 10, read_to=10, taken_by=0),  # finished
        _Piece(11, 20, read_to=14, taken_by=1),  # stopped after 14
        _Piece(21, 30, read_to=20),  # never taken
        _Piece(31, 40, read_to=35, taken_by=0),  # its process failed after 35
        _Piece(41, 50, read_to=50, taken_by=0),  # finished by the process that failed later
    ]
    tally = Tally(cut, workers=2)
    tally.failed(0, "UNAVAILABLE")
    assert tally.errors() == ["ids 31..40: UNAVAILABLE"]
    for second_read_to, named in ((10, "1..30"), (20, "1..10, 21..30")):  # the second piece left, or finished
        more = Tally([_Piece(1, 10, 0, taken_by=0), _Piece(11, 20, second_read_to, taken_by=0), _Piece(21, 30, 20, taken_by=1)])
        more.failed(0, "UNAVAILABLE")
        more.failed(1, "UNAVAILABLE")
        assert more.errors() == [f"ids {named}: UNAVAILABLE"]  # one error, once, over the pieces it left
    assert tally.piece_of(14) is cut[1] and tally.piece_of(41) is cut[4] and tally.piece_of(50) is cut[4]
    assert Tally([_Piece(1, 10, read_to=10), _Piece(11, 20, read_to=20)]).unsent() is None
    # What to resume: up to the end of the last piece left unsent, and whether any piece between was sent.
    assert tally.unsent() == (15, 40, True)  # every id before 15 was sent; from it on, some were not
    assert Tally([_Piece(1, 10, read_to=5), _Piece(11, 20, read_to=20), _Piece(21, 30, read_to=20)]).unsent() == (6, 30, False)
    assert Tally([_Piece(1, 10, read_to=5), _Piece(11, 20, read_to=20)]).unsent() == (6, 10, True)
    assert "ids 6..30 were not all sent; resume with --from-id 6 --to-id 30" in resume_hint(5, 30, none_sent=False)
    assert resume_hint(5, 10).startswith("ids 6..10 were not sent; resume with --from-id 6 --to-id 10")


def test_a_piece_that_ends_in_ids_without_a_run_is_finished(agent_db, tmp_path):
    """Auto-increment gaps (rolled-back inserts, a Galera node's auto_increment_increment) and
    deleted runs leave ids without a run, also at the end of a piece: its last batch reads to the
    piece's end, so the backfill finishes rather than naming a resume line for ids it sent."""
    ids = _seed(agent_db, 300)
    agent_db.execute("DELETE FROM tool_invocation WHERE run_id IN (SELECT run_id FROM diagnosis_run WHERE id % 3 <> 1)")
    agent_db.execute("DELETE FROM diagnosis_run WHERE id % 3 <> 1")
    kept = {trace: run_id for trace, run_id in ids.items() if run_id % 3 == 1}
    last = max(kept.values())
    # The precondition: pieces end on ids that hold no run, and so does the first half of the range.
    cut = pieces(Plan(1, last, "ids"), 2, 50)
    assert sum(b % 3 != 1 for _a, b in cut[:-1]) >= 3 and (last // 2) % 3 != 1
    receiver = Receiver()
    receiver.start()
    try:
        process = _backfill(_config(agent_db, tmp_path, receiver, "gaps"), "--workers", "2")
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert out.startswith(f"backfilled {len(kept)} runs"), out
        assert "resume" not in err and f"{last}/{last}" in err
        assert received_roots(receiver) == set(kept)
    finally:
        receiver.stop()


def _two_processes(agent_db, tmp_path, receiver: Receiver, last_id: int) -> tuple[Running, int]:
    """Two processes started over ids 1..last_id in this one, and the first one's pid."""
    config = load_config(_config(agent_db, tmp_path, receiver, "two"), environ={})
    running = Running(config, Window(), Plan(1, last_id, "ids"), 2)
    pid = running._processes[0].pid
    assert pid is not None
    return running, pid


def test_a_slowed_process_leaves_the_pieces_it_has_not_taken_to_the_other(agent_db, tmp_path):
    """One process stopped from its start: the other takes every piece, so the backfill does not
    wait on the slow one for half the range."""
    ids = _seed(agent_db, 600)
    receiver = Receiver()
    receiver.start()
    try:
        running, slowed = _two_processes(agent_db, tmp_path, receiver, max(ids.values()))
        os.kill(slowed, signal.SIGSTOP)

        def go_on() -> None:
            with contextlib.suppress(ProcessLookupError):  # ended and reaped
                os.kill(slowed, signal.SIGCONT)

        resumed = threading.Timer(60, go_on)  # whatever happens, it ends
        resumed.start()
        try:
            tally = running.wait(lambda tally: go_on() if tally.done[1] else None)
        finally:
            resumed.cancel()
            go_on()
    finally:
        receiver.stop()
    assert tally.unsent() is None and not tally.errors()
    assert received_roots(receiver) == set(ids)
    by_other = sum(piece.taken_by == 1 for piece in tally.pieces)
    assert len(tally.pieces) > 6 and by_other >= len(tally.pieces) - 2, [p.taken_by for p in tally.pieces]


def test_a_process_that_dies_leaves_the_pieces_it_took_and_the_other_takes_the_rest(agent_db, tmp_path):
    ids = _seed(agent_db, 600)
    receiver = Receiver()
    receiver.start()
    try:
        running, victim = _two_processes(agent_db, tmp_path, receiver, max(ids.values()))

        def on_progress(tally: Tally) -> None:
            if any(piece.taken_by == 0 for piece in tally.pieces) and running._processes[0].exitcode is None:
                os.kill(victim, signal.SIGKILL)  # out of memory, say: no word from it

        tally = running.wait(on_progress)
    finally:
        receiver.stop()
    taken = [piece for piece in tally.pieces if piece.taken_by == 0]
    left = [piece for piece in tally.pieces if not piece.finished]
    # The precondition: it died holding a piece, before finishing it.
    assert taken and left and all(piece.taken_by == 0 for piece in left)
    assert all(piece.finished for piece in tally.pieces if piece.taken_by == 1)
    assert sum(piece.taken_by == 1 for piece in tally.pieces) >= len(tally.pieces) - len(taken)
    # The resume line ends with the last piece the dead process left, not with the range.
    unsent = tally.unsent()
    assert unsent is not None and unsent[:2] == (left[0].read_to + 1, left[-1].last_id)
    assert left[-1].last_id < max(ids.values())
    named = ", ".join(f"{a}..{b}" for a, b in merged((p.first_id, p.last_id) for p in left))
    assert tally.errors() == [f"ids {named}: the worker process exited with code -9"]
    sent = received_roots(receiver)
    assert {trace for trace, run_id in ids.items() if run_id < unsent[0]} <= sent


def _die_holding(lock) -> None:
    lock.acquire()
    os._exit(0)


def test_a_lock_left_held_by_a_dead_process_ends_the_taking_with_a_warning(caplog):
    """A process killed while it took a piece leaves the lock held: the others stop taking after a
    wait, rather than wait for ever, and the pieces nobody took are left to the resume line."""
    from run_otel.ops.backfill_workers import _taking

    taken = multiprocessing.get_context("fork").Value("i", 0)
    reports: list = []

    class Reports:
        def put(self, message) -> None:
            reports.append(message)

    cut = [(1, 10), (11, 20), (21, 30)]
    assert list(_taking(cut, taken, 0, Reports(), wait=0.1)) == cut  # the precondition: free, it takes every piece
    taken.value = 1
    holder = multiprocessing.get_context("fork").Process(target=_die_holding, args=(taken.get_lock(),))
    holder.start()
    holder.join(30)
    assert holder.exitcode == 0  # it took the lock and ended without giving it back
    with caplog.at_level(logging.WARNING):
        assert list(_taking(cut, taken, 1, Reports(), wait=0.2)) == []
    assert "no next piece of the id range after 0s: a worker process died taking one" in caplog.text
    assert reports == [("took", 0, 0), ("took", 0, 1), ("took", 0, 2)]
