"""A bounded soak under live load with a flapping receiver, and two instances sharing one lease."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from datetime import UTC, datetime

from helpers import DaemonProcess, bridge_sections, received_roots, terminal_trace_ids, write_config
from servers import wait_for

SOAK_SECONDS = int(os.environ.get("SOAK_SECONDS", "180"))


class Load(threading.Thread):
    """The agent, roughly: runs start RUNNING, get tool rows, then finish; some
    inserts sit in open transactions for a while (late commits)."""

    def __init__(self, agent_db, seconds: float, per_second: float = 5):
        super().__init__(daemon=True)
        self.agent_db, self.seconds, self.pause = agent_db, seconds, 1 / per_second
        self.rng = random.Random(99)
        self.running: list[tuple[str, float]] = []
        self.error: Exception | None = None

    def now(self) -> str:
        return datetime.now(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S")

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # surfaced by the test
            self.error = exc

    def _insert(self, conn, run_id: str) -> None:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO diagnosis_run (run_id, session_id, query, status, intent, created_at, updated_at) "
                "VALUES (%s, 'soak', 'q', 'RUNNING', 'DIAGNOSIS', %s, %s)",
                (run_id, self.now(), self.now()),
            )
            for _ in range(self.rng.randint(0, 6)):
                cur.execute(
                    "INSERT INTO tool_invocation (session_id, run_id, tool_name, input_params, retrieval_layer, "
                    "l0_match_count, duration_ms, success, created_at) VALUES "
                    "('soak', %s, 'lookup_knowledge', '{}', 'L0', 2, 40, 1, %s)",
                    (run_id, self.now()),
                )

    def _finish_due(self, conn, final: bool = False) -> None:
        keep = []
        for run_id, due in self.running:
            if final or time.monotonic() >= due:
                status = self.rng.choice(("SUCCESS", "SUCCESS", "SUCCESS", "FALLBACK", "FAILED", "CANCELLED"))
                with conn.cursor() as cur:
                    cur.execute(
                        "UPDATE diagnosis_run SET status=%s, release_outcome=%s, "
                        "total_duration_ms=1500, updated_at=%s WHERE run_id=%s",
                        (status, status, self.now(), run_id),
                    )
            else:
                keep.append((run_id, due))
        self.running = keep

    def _run(self) -> None:
        conn = self.agent_db.server.root(self.agent_db.name)
        held = None  # (connection, run_id, commit at)
        end = time.monotonic() + self.seconds
        try:
            while time.monotonic() < end:
                run_id = f"run-{uuid.uuid4()}"
                if held is None and self.rng.random() < 0.03:
                    slow = self.agent_db.server.root(self.agent_db.name)
                    slow.autocommit(False)
                    self._insert(slow, run_id)
                    held = (slow, run_id, time.monotonic() + self.rng.uniform(3, 12))
                else:
                    self._insert(conn, run_id)
                    self.running.append((run_id, time.monotonic() + self.rng.uniform(0.5, 8)))
                if held and time.monotonic() >= held[2]:
                    held = self._commit(held)
                self._finish_due(conn)
                time.sleep(self.pause)
        finally:
            if held:
                self._commit(held)
            self._finish_due(conn, final=True)
            conn.close()

    def _commit(self, held) -> None:
        """Commits a late insert; only then may the run finish (its row is locked until now)."""
        connection, run_id, _at = held
        connection.commit()
        connection.close()
        self.running.append((run_id, time.monotonic() + self.rng.uniform(0.5, 3)))
        return None


def test_soak_with_a_flapping_receiver(agent_db, otlp, tmp_path):
    sections = bridge_sections(
        agent_db, tmp_path, otlp.endpoint("grpc"), poll={"interval_seconds": 1, "settle_seconds": 2, "retry_max_seconds": 4}
    )
    sections["poll"]["start_from"] = "beginning"
    daemon = DaemonProcess(write_config(tmp_path / "run-otel.toml", sections), tmp_path / "daemon.log")
    load = Load(agent_db, SOAK_SECONDS)
    load.start()
    started = time.monotonic()
    warm_rss = None
    try:
        next_flap = started + 20
        while load.is_alive():
            if warm_rss is None and time.monotonic() - started > 40:
                warm_rss = daemon.rss_kib()
            if time.monotonic() >= next_flap:
                otlp.rotel.stop()
                time.sleep(4)
                otlp.rotel.start()
                next_flap = time.monotonic() + 20
            time.sleep(0.5)
        assert load.error is None, load.error
        expected = terminal_trace_ids(agent_db)
        assert len(expected) > SOAK_SECONDS * 3
        wait_for(lambda: received_roots(otlp.receiver) >= expected, 120, "the soak's runs")
        end_rss = daemon.rss_kib()
        assert daemon.alive()
    finally:
        assert daemon.terminate() == 0
    assert received_roots(otlp.receiver) == expected
    # Memory is bounded by the batch, not by how long the daemon has run.
    assert end_rss <= warm_rss * 1.2 + 8 * 1024, (warm_rss, end_rss)


def test_two_instances_one_lease_and_a_takeover(agent_db, otlp, tmp_path):
    from helpers import utc_now_naive

    from run_otel.ops.demo import generate, insert_workload

    insert_workload(agent_db.engine(), generate(31, 4000, anchor=utc_now_naive()))
    sections = bridge_sections(
        agent_db,
        tmp_path,
        otlp.endpoint("grpc"),
        poll={"interval_seconds": 0.5, "batch_size": 10},
        ha={"enabled": True, "takeover_seconds": 3, "lock_name": "run_otel_test"},
    )
    path = write_config(tmp_path / "run-otel.toml", sections)
    a = DaemonProcess(path, tmp_path / "a.log")
    b = DaemonProcess(path, tmp_path / "b.log")
    try:
        wait_for(
            lambda: "acquired" in a.output() + b.output() and "standing by" in a.output() + b.output(),
            30,
            "one active, one standby",
        )
        active, standby = (a, b) if "acquired" in a.output() else (b, a)
        assert "acquired" not in standby.output()
        wait_for(lambda: len(received_roots(otlp.receiver)) > 200, 60, "the active instance exporting")
        active.kill()
        killed_at = time.monotonic()
        wait_for(lambda: "acquired" in standby.output(), 10, "the standby to take over")
        assert time.monotonic() - killed_at <= 3
        expected = terminal_trace_ids(agent_db)
        wait_for(lambda: received_roots(otlp.receiver) >= expected, 120, "every run after the takeover")
    finally:
        for process in (a, b):
            if process.alive():
                assert process.terminate() == 0
    assert received_roots(otlp.receiver) == expected


HOLD_THE_LEASE = """
import sys, time
from sqlalchemy.engine import make_url
from run_otel.pipeline.lease import MySqlLease
from run_otel.source.engine import make_engine

lease = MySqlLease(make_engine(make_url(sys.argv[1])), sys.argv[2], takeover_seconds=2)
assert lease.held()
print("held", flush=True)
while True:
    time.sleep(60)
"""


def test_a_lease_holder_stopped_with_sigstop_is_freed_by_its_wait_timeout(agent_db):
    """A frozen holder (SIGSTOP, a VM paused) never closes its connection: the server's
    wait_timeout, set to ha.takeover_seconds on the lease's connection, must drop it."""
    import signal
    import subprocess
    import sys

    from run_otel.pipeline.lease import MySqlLease
    from run_otel.pipeline.named_lock import lock_holder

    name = f"run_otel_test_stop_{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LEASE, agent_db.url, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", holder.stderr
        engine = agent_db.engine()
        standby = MySqlLease(engine, name, takeover_seconds=2)
        assert not standby.held()  # precondition: the running holder keeps it
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        wait_for(standby.held, timeout=20, what="the stopped holder's lease to be freed", interval=0.5)
        assert time.monotonic() - started < 15
        assert lock_holder(engine, name) is not None
        standby.release()
    finally:
        holder.kill()
        holder.wait(10)
