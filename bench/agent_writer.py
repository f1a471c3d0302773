"""An agent writing runs at a set rate, as the diagnosis agent does.

Each run is three statements: the run inserted RUNNING, its tool rows (one
multi-row INSERT) half way through, and the UPDATE that finishes it; every
20th run is rated a few seconds after it finished (an UPDATE of ``feedback``
and ``updated_at``). Runs start evenly spaced, so at N runs a second about
N x ``run_seconds`` are in flight. It writes as its own database user, so the
server counts its rows apart from run-otel's.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import uuid
from datetime import UTC, datetime

from db_cost import EVIDENCE, TOOL_NAMES, WRITER_PASSWORD, WRITER_USER

RATE_EVERY = 20


class AgentWriter(threading.Thread):
    def __init__(self, port: int, database: str, tools: int, run_seconds: float = 1.0, rating_delay: float = 5.0):
        super().__init__(daemon=True, name="agent-writer")
        self._port, self._database, self._tools = port, database, tools
        self._run_seconds, self._rating_delay = run_seconds, rating_delay
        self._rate = 0.0
        self._next_start = 0.0
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.started_runs = 0
        self.ratings = 0
        self.behind_seconds = 0.0  # the most the writer fell behind its schedule

    def set_rate(self, runs_per_second: float) -> None:
        """From now on, start this many runs a second (0: none; those in flight still finish)."""
        with self._lock:
            self._rate = runs_per_second
            self._next_start = time.monotonic()

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for e in self._events if e[2] == "finish")

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def run(self) -> None:
        import pymysql

        conn = pymysql.connect(
            host="127.0.0.1",
            port=self._port,
            user=WRITER_USER,
            password=WRITER_PASSWORD,
            database=self._database,
            autocommit=True,
            charset="utf8mb4",
        )
        with conn.cursor() as cur:
            while not self._halt.is_set():
                now = time.monotonic()
                due = self._due(now)
                for at, action, data in due:
                    self.behind_seconds = max(self.behind_seconds, now - at)
                    getattr(self, f"_do_{action}")(cur, data)
                if not due:
                    time.sleep(min(0.005, max(0.0, self._wake_at() - time.monotonic())))
        conn.close()

    def _due(self, now: float) -> list[tuple[float, str, object]]:
        with self._lock:
            out: list[tuple[float, str, object]] = []
            while self._rate > 0 and self._next_start <= now:
                out.append((self._next_start, "start", None))
                self._next_start += 1.0 / self._rate
            while self._events and self._events[0][0] <= now:
                at, _n, action, data = heapq.heappop(self._events)
                out.append((at, action, data))
            return sorted(out, key=lambda e: e[0])

    def _wake_at(self) -> float:
        with self._lock:
            times = [self._events[0][0]] if self._events else []
            if self._rate > 0:
                times.append(self._next_start)
            return min(times, default=time.monotonic() + 0.05)

    def _later(self, seconds: float, action: str, data: object) -> None:
        with self._lock:
            heapq.heappush(self._events, (time.monotonic() + seconds, next(self._order), action, data))

    def _do_start(self, cur, _data: object) -> None:
        run_id = f"run-{uuid.uuid4()}"
        cur.execute(
            "INSERT INTO diagnosis_run (run_id, session_id, query, status, intent, agent_flow, step_count, "
            "tool_call_count, created_at, updated_at) VALUES (%s, %s, 'why is checkout slow?', 'RUNNING', 'DIAGNOSIS', "
            "'CHAT_HARNESS', %s, %s, UTC_TIMESTAMP(), UTC_TIMESTAMP())",
            (run_id, f"sess-{self.started_runs % 50}", self._tools + 1, self._tools),
        )
        number = self.started_runs
        self.started_runs += 1
        run = (cur.lastrowid, run_id, number)
        self._later(self._run_seconds / 2, "tools", run)
        self._later(self._run_seconds, "finish", run)

    def _do_tools(self, cur, run) -> None:
        _pk, run_id, number = run
        at = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
        rows = [
            (
                f"sess-{number % 50}",
                run_id,
                step,
                TOOL_NAMES[step % len(TOOL_NAMES)],
                '{"q":"x"}',
                2048,
                EVIDENCE,
                180,
                step != 7,
                at,
            )
            for step in range(1, self._tools + 1)
        ]
        # All values as parameters: PyMySQL then sends the rows as one multi-row INSERT.
        cur.executemany(
            "INSERT INTO tool_invocation (session_id, run_id, step_id, tool_name, input_params, output_length, "
            "retrieval_details, duration_ms, success, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )

    def _do_finish(self, cur, run) -> None:
        pk, _run_id, number = run
        cur.execute(
            "UPDATE diagnosis_run SET status = 'SUCCESS', release_outcome = 'SUCCESS', total_duration_ms = %s, "
            "total_token_count = 4200, updated_at = UTC_TIMESTAMP() WHERE id = %s",
            (int(self._run_seconds * 1000), pk),
        )
        if number % RATE_EVERY == 0:
            self._later(self._rating_delay, "rating", run)

    def _do_rating(self, cur, run) -> None:
        pk, _run_id, number = run
        feedback = "DOWN" if number % (RATE_EVERY * 3) == 0 else "UP"
        cur.execute("UPDATE diagnosis_run SET feedback = %s, updated_at = UTC_TIMESTAMP() WHERE id = %s", (feedback, pk))
        self.ratings += 1
