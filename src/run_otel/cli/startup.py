"""The cyclic collector while a command starts.

Start-up imports SQLAlchemy, gRPC and protobuf and reads the config: some 90,000
objects that live as long as the process. The collector's passes over them while
they are being made cost a sixth of a backfill's start and find almost nothing,
so the command line starts with it off (:func:`quiet_start`). When the command's
body runs (:func:`body_starts`), what start-up built is frozen and the collector
comes back on: frozen objects are never scanned again, which keeps every later
full pass small and leaves the pages a forked backfill part inherits unwritten.
The few hundred objects of import-time garbage frozen with them are never freed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_start() -> Iterator[None]:
    """The collector off for the block until :func:`body_starts`; on again after it, if it was on before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def body_starts() -> None:
    """Freezes what start-up built and turns the collector back on, in a :func:`quiet_start`;
    where the collector is on already (a test running a command in-process) it does nothing."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
