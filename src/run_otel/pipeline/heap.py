"""The C heap of a backfill: memory a batch frees is kept for the next one.

A batch allocates tens of megabytes in blocks above glibc's thresholds (the encoded
spans, each request of up to ``export.max_request_bytes``, the driver's buffers) and
frees them once acknowledged. glibc gives such memory back to the system at once (a
block it mapped on its own, the top of the heap past the trim threshold), so the next
batch faults every page in again and the kernel zeroes each: about 20,000 page faults
in a backfill of 36,000 spans, where 7,500 remain with the memory kept. The peak is the
same (the same batches are in flight); the memory goes back when the process ends, not
between batches. Only the backfill asks for it: a daemon's memory shrinks after a
catch-up. Elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
from typing import Final

_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
# glibc's largest mmap threshold on a 64-bit machine: blocks up to it come from the heap.
KEPT_BLOCK_BYTES: Final = 32 << 20


def keep_freed_memory() -> bool:
    """Blocks up to 32 MiB from the heap, and up to 64 MiB of freed heap kept; False where not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, KEPT_BLOCK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * KEPT_BLOCK_BYTES))
