"""One writer per state store and shard, on SQLite, in the fast loop.

The end-to-end tests (test_single_writer.py) hold the commands to it on SQLite and MariaDB;
these catch a break in the lock itself within a minute.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
from servers import wait_for

from run_otel.config import build_config
from run_otel.factory import build_store_lock
from run_otel.pipeline.store_lock import FileLock, StoreLock, StoreLockedError


def _config(tmp_path, state_url: str | None = None, shard=(0, 1)):
    config = build_config({"state": {"url": state_url or f"sqlite:///{tmp_path / 'state.db'}"}})
    return replace(config, shard=shard)


def test_a_second_writer_is_refused_and_told_who_holds_the_store(tmp_path):
    first, second = build_store_lock(_config(tmp_path)), build_store_lock(_config(tmp_path))
    assert isinstance(first, FileLock)  # precondition: a SQLite file gets the flock
    with first:
        assert first.held
        assert not second.acquire()
        refusal = second.refusal()
        assert isinstance(refusal, StoreLockedError)
        message = str(refusal)
        assert f"host {socket.gethostname()}, pid {os.getpid()}" in message
        assert "state.db" in message and "(shard default)" in message
        assert "one writer per state store and shard" in message
        with pytest.raises(StoreLockedError):
            second.__enter__()
    assert not first.held
    assert second.acquire()  # released: the next writer gets it
    second.release()


def test_each_shard_has_a_lock_of_its_own(tmp_path):
    zero = build_store_lock(_config(tmp_path, shard=(0, 2)))
    one = build_store_lock(_config(tmp_path, shard=(1, 2)))
    again = build_store_lock(_config(tmp_path, shard=(0, 2)))
    with zero, one:
        assert zero.held and one.held
        assert not again.acquire()
        assert "(shard shard-0-of-2)" in again.in_use()


def test_a_killed_holder_frees_the_store_at_once(tmp_path):
    config_line = f"build_config({{'state': {{'url': 'sqlite:///{tmp_path / 'state.db'}'}}}})"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from run_otel.config import build_config\n"
            "from run_otel.factory import build_store_lock\n"
            f"lock = build_store_lock({config_line})\n"
            "assert lock.acquire()\n"
            "print('held', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = build_store_lock(_config(tmp_path))
        assert not lock.acquire()  # precondition: the other process holds it
        assert f"pid {holder.pid}" in lock.in_use()
        holder.kill()
        holder.wait()
        wait_for(lock.acquire, timeout=5, what="the lock after its holder died")
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_store_nothing_else_can_open_needs_no_lock(tmp_path):
    lock = build_store_lock(_config(tmp_path, "sqlite://"))
    assert type(lock) is StoreLock
    assert lock.acquire() and build_store_lock(_config(tmp_path, "sqlite://")).acquire()


def test_a_backend_without_a_lock_is_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        lock = build_store_lock(_config(tmp_path, "postgresql://run:otel@db/state"))
    assert type(lock) is StoreLock
    assert "one writer per shard is not enforced on postgresql" in caplog.text
    assert "run:otel@" not in caplog.text  # the password stays out of the warning


def test_a_lock_name_past_64_characters_is_hashed_so_two_shards_of_a_long_database_never_share_one():
    from run_otel.factory import lease_name
    from run_otel.pipeline.named_lock import MAX_LOCK_NAME, lock_name
    from run_otel.sharding import shard_name

    database = "agent_diagnosis_production_eu_west_1_" + "x" * 40
    names = {
        shard: lease_name(replace(build_config({"source": {"url": f"mysql+pymysql://r@db/{database}"}}), shard=shard))
        for shard in ((0, 2), (1, 2))
    }
    assert all(len(name) <= MAX_LOCK_NAME for name in names.values()), names  # the server refuses longer names
    assert len(set(names.values())) == 2, names  # a cut at 64 characters would leave the shards one lock
    # The state store's lock too, and a name that fits is kept as it is, readable.
    stores = {lock_name("run-otel-state", database, shard_name(shard)) for shard in ((0, 2), (1, 2))}
    assert len(stores) == 2 and all(len(name) <= MAX_LOCK_NAME for name in stores)
    assert lock_name("run-otel-state", "agent", "default") == "run-otel-state:agent:default"
