"""A backfill keeps the memory a batch frees for the next one: the next batch's blocks come from
the heap, without the page faults (and the kernel's zeroing) of memory given back and taken again."""

from __future__ import annotations

import subprocess
import sys

from helpers import demo_backfill_config, received_roots
from servers import Receiver

# Batches of 24 blocks of 1 MiB, allocated and freed: after two, how many pages eight more fault in.
BATCHES = """
import resource
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def batch():
    blocks = [b"x" * (1 << 20) for _ in range(24)]
    del blocks
for _ in range(2):
    batch()
before = faults()
for _ in range(8):
    batch()
print("FAULTS", faults() - before)
"""
PAGES = 8 * 24 * (1 << 20) // 4096


def _faults(prelude: str) -> int:
    done = subprocess.run([sys.executable, "-c", prelude + BATCHES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("FAULTS ")[-1])


def test_a_kept_heap_serves_the_next_batch_without_faulting_its_pages_in():
    # The precondition: by default glibc gives the blocks back, and each batch faults them in again.
    assert _faults("") > PAGES // 2
    assert _faults("from run_otel.pipeline.heap import keep_freed_memory\nassert keep_freed_memory()\n") < PAGES // 100


def test_a_backfill_keeps_its_freed_memory(tmp_path):
    receiver = Receiver()
    receiver.start()
    try:
        config = demo_backfill_config(tmp_path, receiver.endpoint, 20)
        backfill = (
            "import sys\n"
            "from run_otel.cli.main import main\n"
            f"sys.argv = ['run-otel', 'backfill', '--from-id', '1', '--config', {str(config)!r}]\n"
            "try:\n"
            "    main()\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
        )
        faults = _faults(backfill)
        assert len(received_roots(receiver)) > 10  # the precondition: it really exported
    finally:
        receiver.stop()
    assert faults < PAGES // 100
