"""`run-otel generate DIR`: the dashboards, rules, their tests and the runbook for the user's stack."""

from __future__ import annotations

from pathlib import Path

from ..config import Config


def generate_files(config: Config, directory: Path) -> tuple[list[Path], list[str]]:
    """(the files written into ``directory``, the settings plausibly wrong for a real stack), from
    [generate], [slo] and the feedback labels. Raises ImportError without the generate extra."""
    from ..generate.artifacts import write
    from ..generate.stack import stack_of, warnings

    stack = stack_of(config.generate, config.slo, config.feedback)
    return write(directory, stack), warnings(stack)
