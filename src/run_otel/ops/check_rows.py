"""`run-otel check`'s verdicts on row shapes: tool rows whose run never appeared (from the
daemon's look, in the state store, each run id asked again), and whether two runs may share a
run id in this schema. Each is (level, what, detail), as ``check.Finding`` takes them."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import Config, ConfigError
from ..factory import build_store
from ..pipeline.state_store import StateStoreError
from ..source.reader import Source, SourceError
from ..source.run_ids import RunIdRows
from ..source.terminal_text import terminal_safe

OK, WARN = "ok", "warn"


def row_shape_findings(config: Config, source: Source) -> Iterator[tuple[str, str, str]]:
    rows = RunIdRows(source)
    try:
        why = rows.why_possible()
    except SourceError as exc:
        yield WARN, "run ids", f"cannot read the schema: {exc}"
        return
    if why is not None:
        yield OK, "run ids", f"{why}: two rows may share one; the later ones go out as traces of their own (docs/mapping.md)"
    yield from _orphans(config, rows)


def _orphans(config: Config, rows: RunIdRows) -> Iterator[tuple[str, str, str]]:
    if not config.poll.orphan_wait_seconds:
        return
    try:
        store = build_store(config, create=False)
    except (StateStoreError, ConfigError):
        return  # no store yet: the state store check says so
    try:
        scan = store.orphan_scan()
    except StateStoreError:
        return  # the state store check says so
    finally:
        store.close()
    if scan is None:
        yield OK, "orphan tool rows", "not looked for yet: the daemon looks after each poll"
        return
    appeared = set(rows.lowest(scan.runs)) if scan.runs else set()  # runs that came after all: their rows go with them
    still = {run_id: entry for run_id, entry in scan.runs.items() if run_id.casefold() not in appeared}
    count = sum(entry[0] for entry in still.values()) + scan.others
    if not count:
        yield OK, "orphan tool rows", f"none: every tool row up to tool_invocation id {scan.cursor} has its run"
        return
    oldest_run, (_rows, oldest_id, created) = min(still.items(), key=lambda item: item[1][1]) if still else ("", (0, 0, ""))
    oldest = f"; the oldest: tool_invocation {oldest_id} (run_id {terminal_safe(oldest_run)}, created {created})" if still else ""
    yield (
        WARN,
        "orphan tool rows",
        f"{count} tool row(s) of {len(still) or 'more than 1000'} run id(s) have no diagnosis_run row "
        f"(waited poll.orphan_wait_seconds = {config.poll.orphan_wait_seconds:g}s); not exported{oldest}",
    )
