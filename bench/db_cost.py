"""What run-otel costs the agent's database, by MariaDB's own account.

The server logs every statement (the slow log at ``long_query_time = 0``, with
``log_slow_verbosity = query_plan``, so each entry carries ``Rows_examined`` and
``Full_scan``), and keeps per-user counters (``userstat = 1``:
``information_schema.USER_STATISTICS``). run-otel and the agent's writer connect
as different users, so each side's rows are told apart by the server itself.
A phase is a byte range of the slow log and the difference of two counter
snapshots; this module seeds the database, takes the snapshots and reads the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE_USER, WRITER_USER = "run_otel", "agent"
BRIDGE_PASSWORD, WRITER_PASSWORD = "bridge-pw", "writer-pw"

# Short JSON evidence, as bench/run.py seeds it: the statements' cost is in rows, not bytes.
EVIDENCE = '{"evidence_status":"supported","evidence_refs":[{"raw_path":"$.logs[0]","text":"evidence text"}]}'
TOOL_NAMES = ("lookup_knowledge", "query_logs", "query_metrics", "search_runbook")


def server_args(slow_log: Path) -> tuple[str, ...]:
    """mariadbd options: every statement in the slow log with its plan flags, per-user counters,
    and a buffer pool that holds the seeded tables, so a phase reads memory, not the disk."""
    return (
        "--innodb-buffer-pool-size=1G",
        "--userstat=1",
        "--slow-query-log=1",
        f"--slow-query-log-file={slow_log}",
        "--long-query-time=0",
        "--log-slow-verbosity=query_plan",
        "--log-queries-not-using-indexes=1",
        # Its temporary tables beside the log, in a folder of its own rather than a /tmp others clean.
        f"--tmpdir={slow_log.parent}",
    )


def create_users(conn, database: str) -> None:
    """run-otel reads (SELECT only, as its docs ask); the agent writes."""
    with conn.cursor() as cur:
        for user, password, grants in (
            (BRIDGE_USER, BRIDGE_PASSWORD, "SELECT"),
            (WRITER_USER, WRITER_PASSWORD, "SELECT, INSERT, UPDATE"),
        ):
            cur.execute(f"CREATE OR REPLACE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
            cur.execute(f"GRANT {grants} ON `{database}`.* TO '{user}'@'127.0.0.1'")


def seed(conn, runs: int, tools: int, hours: float, ended_minutes_ago: float = 15.0) -> None:
    """``runs`` finished runs spread over ``hours`` up to ``ended_minutes_ago`` (ids in time order,
    every 20th rated), each with ``tools`` tool rows: the sequence engine, two statements. They end
    before poll.late_window_seconds (10 minutes), so no seeded run is watched for late rows."""
    step = hours * 3600 / runs
    ended = int(ended_minutes_ago * 60)
    with conn.cursor() as cur:
        cur.execute(
            f"""INSERT INTO diagnosis_run (run_id, session_id, query, status, intent, release_outcome, agent_flow,
                    feedback, total_duration_ms, total_token_count, step_count, tool_call_count, created_at, updated_at)
                SELECT CONCAT('run-seed-', LPAD(seq, 10, '0')), CONCAT('sess-', seq % 50), 'q',
                       ELT(1 + seq % 20, 'FAILED', 'FALLBACK', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS',
                           'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS', 'SUCCESS',
                           'SUCCESS', 'SUCCESS', 'SUCCESS', 'FALLBACK', 'CANCELLED'),
                       'DIAGNOSIS', 'SUCCESS', 'CHAT_HARNESS', IF(seq % 20 = 0, ELT(1 + seq % 3, 'UP', 'DOWN', 'UP'), NULL),
                       9000, 4200, {tools + 1}, {tools},
                       UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) + {ended} + 9 SECOND,
                       UTC_TIMESTAMP() - INTERVAL ROUND(({runs} - seq) * {step}) + {ended} SECOND
                FROM seq_1_to_{runs}"""
        )
        cur.execute(
            f"""INSERT INTO tool_invocation (session_id, run_id, step_id, tool_name, input_params, output_length,
                    retrieval_layer, l0_match_count, l1_match_count, is_truncated, relevance_level,
                    retrieval_details, duration_ms, success, error_message, created_at)
                SELECT r.session_id, r.run_id, t.seq, ELT(1 + t.seq % 4, {", ".join(f"'{n}'" for n in TOOL_NAMES)}),
                       '{{"q":"x"}}', 2048, IF(t.seq % 2 = 0, 'L0+L1', NULL), IF(t.seq % 2 = 0, 3, NULL),
                       IF(t.seq % 2 = 0, 2, NULL), 0, IF(t.seq % 2 = 0, 'PRECISE', NULL), '{EVIDENCE}', 180,
                       IF(t.seq = 7, 0, 1), IF(t.seq = 7, 'timeout after 30000 ms', NULL), r.created_at + INTERVAL 1 SECOND
                FROM diagnosis_run r JOIN seq_1_to_{tools} t ORDER BY r.id, t.seq"""
        )
        # INSERT ... SELECT reserves ids in growing blocks and leaves the rest unused: without this the
        # writer's first run would sit thousands of ids above the last seeded one, a gap no agent leaves.
        for table in ("diagnosis_run", "tool_invocation"):
            cur.execute(f"SELECT MAX(id) + 1 FROM {table}")
            cur.execute(f"ALTER TABLE {table} AUTO_INCREMENT = {int(cur.fetchone()[0])}")
        # Into the buffer pool, so the first measured read is not the one that loads the disk.
        cur.execute("SELECT COUNT(*), SUM(LENGTH(retrieval_details)) FROM tool_invocation")
        cur.execute("SELECT COUNT(*), SUM(LENGTH(query)) FROM diagnosis_run")


# -- counters -----------------------------------------------------------------------------

USER_COLUMNS = ("ROWS_READ", "ROWS_INSERTED", "ROWS_UPDATED", "SELECT_COMMANDS", "UPDATE_COMMANDS", "OTHER_COMMANDS")


@dataclass
class Snapshot:
    slow_log_bytes: int
    users: dict[str, dict[str, int]]
    select_scan: int


def snapshot(conn, slow_log: Path) -> Snapshot:
    """The counters now. FLUSH SLOW LOGS first, so every entry written so far is in the file."""
    with conn.cursor() as cur:
        cur.execute("FLUSH SLOW LOGS")
        cur.execute(f"SELECT USER, {', '.join(USER_COLUMNS)} FROM information_schema.USER_STATISTICS")
        users = {row[0]: dict(zip(USER_COLUMNS, map(int, row[1:]))) for row in cur.fetchall()}
        cur.execute("SHOW GLOBAL STATUS LIKE 'Select_scan'")
        select_scan = int(cur.fetchone()[1])
    return Snapshot(slow_log.stat().st_size, users, select_scan)


def user_delta(before: Snapshot, after: Snapshot, user: str) -> dict[str, int]:
    first, last = before.users.get(user, {}), after.users.get(user, {})
    return {key: last.get(key, 0) - first.get(key, 0) for key in USER_COLUMNS}


# -- the slow log -------------------------------------------------------------------------


@dataclass
class Entry:
    user: str
    rows_examined: int
    full_scan: bool
    sql: str


_HEAD = re.compile(r"^# User@Host: (\S+?)\[", re.M)
_EXAMINED = re.compile(r"Rows_examined: (\d+)")
_FULL_SCAN = re.compile(r"Full_scan: (Yes|No)")
# Lines of an entry that are not its statement, and the header FLUSH SLOW LOGS writes into the file.
_NOT_SQL = re.compile(r"#|SET timestamp=|use |\S+, Version: |Tcp port: |Time\s+Id\s+Command")


def read_entries(slow_log: Path, start: int, end: int) -> list[Entry]:
    """The slow log's entries written between two snapshots' byte offsets."""
    with slow_log.open("rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", "replace")
    heads = list(_HEAD.finditer(text))
    out = []
    for head, following in zip(heads, [*heads[1:], None]):
        chunk = text[head.start() : following.start() if following else len(text)]
        sql = " ".join(line for line in chunk.splitlines() if line and not _NOT_SQL.match(line))
        examined, scan = _EXAMINED.search(chunk), _FULL_SCAN.search(chunk)
        out.append(Entry(head[1], int(examined[1]) if examined else 0, bool(scan and scan[1] == "Yes"), sql))
    return out


def shape(sql: str) -> str:
    """A statement with its values taken out: literals become ?, an IN list (...)."""
    s = re.sub(r"'(?:[^'\\]|\\.|'')*'", "?", sql)
    s = re.sub(r"\b\d+(?:\.\d+)?\b", "?", s)
    s = re.sub(r"\(\s*\?(?:\s*,\s*\?)*\s*\)", "(...)", s)
    return re.sub(r"\s+", " ", s).strip().rstrip(";")


# The statement kinds the report names, by shape (SQLAlchemy's MySQL rendering of source/reader.py).
WATCH, FEEDBACK, BACKLOG, POLL, PROBE, SESSION, OTHER = (
    "late-row watch",
    "feedback pass",
    "backlog probe",
    "main poll",
    "other primary-key probes",
    "session (rollback, set-up)",
    "other",
)
KINDS = (WATCH, FEEDBACK, BACKLOG, POLL, PROBE, SESSION, OTHER)
_PK_PROBE = "where diagnosis_run.id >= ? order by diagnosis_run.id limit ?"


def kind_of(s: str, previous: str | None) -> str:
    low = s.lower()
    if "count(*)" in low and "group by tool_invocation.run_id" in low:
        return WATCH
    # Since the watch reads new tool rows by primary key (tool_feed.py): the range, its gaps, where it starts.
    if "where tool_invocation.id > ?" in low or "where tool_invocation.id in (...)" in low or "max(tool_invocation.id)" in low:
        return WATCH
    if "feedback is not null" in low:
        return FEEDBACK
    if low.startswith("select diagnosis_run.id, diagnosis_run.created_at from diagnosis_run order by diagnosis_run.id desc"):
        return BACKLOG
    if low.startswith(
        "select diagnosis_run.id, diagnosis_run.created_at from diagnosis_run where diagnosis_run.id = (select max("
    ):
        return BACKLOG  # the same probe, by MAX(id)
    if low.endswith(_PK_PROBE) and "select diagnosis_run.id, diagnosis_run.created_at" in low:
        # The lag's second probe follows the newest-run probe; the others search the feedback window.
        return BACKLOG if previous == BACKLOG else PROBE
    if low.startswith("select max(diagnosis_run.id)"):
        return PROBE
    if "utc_timestamp(" in low or "diagnosis_run.id > ?" in low or ".id in (...)" in low or ".run_id in (...)" in low:
        return POLL
    if low in ("rollback", "commit", "select version()") or low.startswith(("set ", "show ")):
        return SESSION
    return OTHER


def opens_poll(s: str) -> bool:
    """Each poll starts by measuring the database's clock: one statement a poll."""
    return s.lower() == "select utc_timestamp(...) as utc_timestamp_1"


@dataclass
class KindCost:
    statements: int = 0
    rows_examined: int = 0
    full_scans: int = 0


@dataclass
class Cost:
    """One user's statements over a phase, by kind and by shape."""

    kinds: dict[str, KindCost] = field(default_factory=lambda: {k: KindCost() for k in KINDS})
    shapes: dict[str, dict] = field(default_factory=dict)
    polls: int = 0
    # The late-row watch in each poll: rows examined, and run ids asked for (the runs watched).
    watch_rows: list[int] = field(default_factory=list)
    watch_ids: list[int] = field(default_factory=list)

    @property
    def statements(self) -> int:
        return sum(k.statements for k in self.kinds.values())

    @property
    def rows_examined(self) -> int:
        return sum(k.rows_examined for k in self.kinds.values())

    @property
    def full_scans(self) -> int:
        return sum(k.full_scans for k in self.kinds.values())


def bridge_cost(entries: list[Entry], user: str = BRIDGE_USER) -> Cost:
    cost = Cost()
    previous: str | None = None
    for entry in entries:
        if entry.user != user:
            continue
        s = shape(entry.sql)
        kind = kind_of(s, previous)
        if opens_poll(s):
            cost.polls += 1
            cost.watch_rows.append(0)
            cost.watch_ids.append(0)
        if kind == WATCH and cost.polls:
            cost.watch_rows[-1] += entry.rows_examined
            cost.watch_ids[-1] += _in_list_length(entry.sql)
        if kind != SESSION:
            previous = kind
        k = cost.kinds[kind]
        k.statements += 1
        k.rows_examined += entry.rows_examined
        k.full_scans += entry.full_scan
        one = cost.shapes.setdefault(s, {"kind": kind, "statements": 0, "rows_examined": 0, "full_scans": 0})
        one["statements"] += 1
        one["rows_examined"] += entry.rows_examined
        one["full_scans"] += entry.full_scan
    return cost


def _in_list_length(sql: str) -> int:
    found = re.search(r"\bIN \(([^)]*)\)", sql, re.I)
    return found[1].count(",") + 1 if found else 0
