"""Memory that stays: the allocator settings of every process that makes batches.

glibc serves an allocation over its mmap threshold (128 KiB at first) with a fresh ``mmap`` and
gives it back with ``munmap`` when it is freed; it also trims the heap's free top back to the
system. A process that decodes an image per sample (a 640×480 photo is 0.9 MB of uint8, its float
crop more) so maps, faults in and unmaps the same megabytes for every sample: about 2,000 minor
page faults and milliseconds of system time each, in every fresh worker process.

`keep_freed_memory` sets fixed thresholds (``mallopt``): allocations up to `MMAP_THRESHOLD` come
from the heap, and up to `TRIM_THRESHOLD` of free heap is kept for the next sample. The loader calls
it first thing in each worker process and in the process that makes batches itself
(``num_workers: 0``). A no-op where glibc's ``mallopt`` is not there (another libc, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: ``mallopt`` parameters (``<malloc.h>``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: allocations up to this size come from the heap (glibc's largest allowed: 32 MiB on 64-bit)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free memory at the heap's top kept for the next samples instead of being given back
TRIM_THRESHOLD = 256 * 1024 * 1024

_done = False


def keep_freed_memory() -> bool:
    """Set the thresholds once in this process (module doc); whether glibc took them."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _done = ok
    return ok
