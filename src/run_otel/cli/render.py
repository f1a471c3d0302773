"""Span trees for the terminal, its progress bars and `check`'s lines, with rich."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.style import Style
from rich.text import Text

from ..config import Config
from ..mapping import attributes as A
from ..mapping.span_data import STATUS_ERROR, MappedRun, SpanData
from ..pipeline.recorder import Recorder
from ..pipeline.results import PollResult

if TYPE_CHECKING:
    from ..ops.show import RunTrace
from ..source.rows import is_terminal
from ..source.terminal_text import terminal_safe
from .links import trace_links

_ROOT_KEYS = (A.RUN_INTENT, A.RUN_STATUS, A.RUN_RELEASE_OUTCOME, A.RUN_TOTAL_TOKEN_COUNT, A.RUN_TOOL_SPANS_DROPPED)
_TOOL_KEYS = (A.RAG_RETRIEVAL_LAYER, A.RAG_L0_MATCH_COUNT, A.RAG_L1_MATCH_COUNT, A.RAG_RELEVANCE_LEVEL, A.RAG_DEDUP_REASON)
_SHORT = {
    A.RUN_INTENT: "",
    A.RUN_STATUS: "status=",
    A.RUN_RELEASE_OUTCOME: "release=",
    A.RUN_TOTAL_TOKEN_COUNT: "tokens=",
    A.RUN_TOOL_SPANS_DROPPED: "dropped=",
    A.RAG_RETRIEVAL_LAYER: "",
    A.RAG_L0_MATCH_COUNT: "l0=",
    A.RAG_L1_MATCH_COUNT: "l1=",
    A.RAG_RELEVANCE_LEVEL: "",
    A.RAG_DEDUP_REASON: "dedup=",
}


def duration_text(nanos: int) -> str:
    if nanos >= 1_000_000_000:
        return f"{nanos / 1e9:.1f} s"
    return f"{nanos / 1e6:.0f} ms"


def _label(span: SpanData, keys: tuple[str, ...]) -> Text:
    attrs = span.attribute_map()
    label = Text()
    label.append(terminal_safe(span.name), style="bold")
    label.append(f"  {duration_text(span.end_ns - span.start_ns)}", style="cyan")
    for key in keys:
        if key in attrs:
            label.append(f"  {_SHORT[key]}{terminal_safe(attrs[key])}")
    paths = attrs.get(A.RAG_EVIDENCE_PATHS)
    if paths:
        joined = " ".join(paths if isinstance(paths, tuple) else [str(paths)])
        label.append("  evidence: " + terminal_safe(joined), style="dim")
    if span.status_code == STATUS_ERROR:
        label.append(f"  ERROR {terminal_safe(attrs.get(A.ERROR_TYPE, ''))}", style="bold red")
        if span.status_message:
            label.append_text(linked(": " + shortened(terminal_safe(span.status_message), MESSAGE_WIDTH), "red"))
    return label


MESSAGE_WIDTH = 80
_URL = re.compile(r"https?://[^\s\"'<>]+")


def shortened(message: str, width: int) -> str:
    """``message`` cut to about ``width`` characters between words, never inside one: a first
    word longer than that (a link, a path) is kept whole."""
    if len(message) <= width:
        return message
    words = message.split(" ")
    kept = words[0]
    for word in words[1:]:
        if len(kept) + 1 + len(word) > width - 2:
            return kept + " …"
        kept += " " + word
    return kept


def linked(text: str, style: str = "") -> Text:
    """``text`` with each URL in it a link: rich writes OSC 8 on a terminal and the plain URL in a pipe."""
    out = Text(text, style=style)
    for match in _URL.finditer(text):
        out.stylize(Style(link=match.group()), match.start(), match.end())
    return out


def span_tree(mapped: MappedRun) -> list[Text]:
    """The root, then each tool span under it, one line each. Drawn here rather than with
    rich's Tree, which wraps or crops every label at the terminal's width."""
    spans = mapped.spans[1:]
    lines = [_label(mapped.root, _ROOT_KEYS)]
    for index, span in enumerate(spans):
        branch = "└── " if index == len(spans) - 1 else "├── "
        lines.append(Text.assemble(branch, _label(span, _TOOL_KEYS)))
    return lines


# -- terminal output of the commands ------------------------------------------------


def finding_text(what: str, detail: str) -> str:
    """A `check` line's text as rich markup: it may quote the database (a feedback value, a
    column type), which is shown with its control characters escaped and its brackets literal."""
    return escape(terminal_safe(what) + (f": {terminal_safe(detail)}" if detail else ""))


def print_trace(console: Console, config: Config, trace: RunTrace) -> None:
    """Prints a run's span tree as it would be exported, its warnings and its links."""
    mapped = trace.mapped
    # soft_wrap: no line is broken or cropped here; the terminal wraps a long one itself, so a
    # link or a message is never split over two lines (a split link opens neither half).
    show = partial(console.print, soft_wrap=True)
    show(Text(f"trace {mapped.root.trace_id.hex()}  ({terminal_safe(trace.run.run_id)})"))
    if not is_terminal(trace.run.status):
        waiting = f"not exported yet: status {terminal_safe(trace.run.status)}; it will be once it finishes or times out"
        show(Text(waiting, style="yellow"))
    for line in span_tree(mapped):
        show(line)
    for warning in trace.warnings:
        show(Text.assemble(("warning:", "yellow"), " ", linked(terminal_safe(warning))))
    for link in trace_links(config, mapped.root.trace_id.hex()):
        show(Text.assemble("open: ", linked(link)))


class ProgressRecorder(Recorder):
    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress, self._task = progress, task

    def runs_exported(self, result: PollResult, acked_at: float) -> None:
        self._progress.advance(self._task, result.run_count)


def progress_task(console: Console) -> Callable[[str, int], AbstractContextManager[Callable[[int, str], None]]]:
    """A progress bar for one task: yields the function that moves it to (done, rate)."""

    @contextmanager
    def task(label: str, total: int) -> Iterator[Callable[[int, str], None]]:
        with progress_bar(console) as progress:
            task_id = progress.add_task(label, total=total, rate="")
            yield lambda done, rate: progress.update(task_id, completed=done, rate=rate)

    return task


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
