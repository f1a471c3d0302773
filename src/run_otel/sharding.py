"""Sharding: which runs one process exports when several share the work.

A shard is ``(index, total)``: the runs whose stable hash of ``run_id`` falls
on ``index`` out of ``total``. Each shard keeps its own checkpoint, named here,
so ``--shard 1/3`` on the command line, the checkpoint ``shard-1-of-3`` in the
state store, and the metrics' ``shard`` label all mean the same thing.
"""

from __future__ import annotations

import hashlib
import re

Shard = tuple[int, int]
WHOLE: Shard = (0, 1)


class ShardError(ValueError):
    """A --shard value that names no shard."""


def shard_of(run_id: str, shards: int) -> int:
    """A stable shard number for ``run_id``, the same in every process and release."""
    digest = hashlib.sha256(f"shard:{run_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def in_shard(run_id: str, shard: Shard) -> bool:
    index, total = shard
    return total == 1 or shard_of(run_id, total) == index


def shard_name(shard: Shard) -> str:
    """The checkpoint's name, also the metrics' ``shard`` label."""
    index, total = shard
    return "default" if total == 1 else f"shard-{index}-of-{total}"


def shard_from_name(name: str) -> Shard | None:
    """``(index, total)`` from a checkpoint name ``shard-I-of-N``; None for ``default`` or another name."""
    match = re.fullmatch(r"shard-(\d+)-of-(\d+)", name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_shard(text: str) -> Shard:
    """``I/N`` as typed after ``--shard``."""
    index, sep, total = text.partition("/")
    if not (sep and index.isdigit() and total.isdigit() and 0 <= int(index) < int(total)):
        raise ShardError(f"--shard must be i/N with 0 <= i < N, got {text!r}")
    return int(index), int(total)


def shard_option(shard: Shard) -> str:
    """The ``--shard`` option a command for this shard needs; empty for the whole."""
    index, total = shard
    return f" --shard {index}/{total}" if total > 1 else ""
