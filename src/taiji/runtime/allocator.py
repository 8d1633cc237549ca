"""glibc's malloc, set for a training loop's steady state.

Every step allocates and frees the same large CPU buffers (activations, their gradients, the next
batch). With glibc's defaults, freed memory at the top of the heap goes back to the kernel once more
than ``M_TRIM_THRESHOLD`` of it is free (twice the mmap threshold, which follows the largest block
freed so far), and the next step faults the same pages in again, each one zeroed by the kernel. In
``benchmarks/throughput.py`` (a 1.1M-parameter CNN, two workers on two cores) runs whose heap layout
trimmed every step took 600–1000 minor faults and 1–2 ms of system time per 37 ms step, mostly
inside ReLU's backward, writing its freshly mapped output.

``keep_freed_memory()`` (called by the Job's step engine) fixes both thresholds once per process:
blocks below ``MMAP_THRESHOLD`` come from the heap (and are reused), and up to ``TRIM_THRESHOLD`` of
free memory stays mapped, per heap: the main one, each thread's arena, and those of processes forked
afterwards (data-loader workers), which inherit the settings. The cost: memory freed after a peak
stays mapped up to that margin. Nothing is changed where the user chose already
(``MALLOC_*_`` variables, ``glibc.malloc.*`` in ``GLIBC_TUNABLES``, or ``TAIJI_MALLOC_TUNING=0``),
nor where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Mapping

from .. import env

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 512 << 20
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_applied = False


def tuning_wanted(environ: Mapping[str, str]) -> bool:
    """False where the user turned it off or set malloc's thresholds themselves."""
    if not env.MALLOC_TUNING.get(environ) or any(name in environ for name in _USER_SETTINGS):
        return False
    return "glibc.malloc." not in environ.get("GLIBC_TUNABLES", "")


def applied() -> bool:
    """Whether this process runs with the thresholds set here."""
    return _applied


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (see module doc) unless the user chose; True if they are set now."""
    global _applied
    if _applied:
        return True
    if not tuning_wanted(os.environ) or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library (glibc, checked above)
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError) as exc:
        log.debug("glibc's mallopt is not reachable (%s); malloc's defaults stay", exc)
        return False
    # either call alone switches glibc's adaptive thresholds off: report it if only one took
    trim = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    mapped = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    if not (trim and mapped):
        log.warning(
            "could only partly set glibc's malloc thresholds (trim: %s, mmap: %s); set "
            "TAIJI_MALLOC_TUNING=0 if this process's memory use suffers",
            trim,
            mapped,
        )
        return False
    _applied = True
    log.info(
        "malloc keeps freed memory mapped between steps (up to %d MiB; TAIJI_MALLOC_TUNING=0: off)",
        TRIM_THRESHOLD >> 20,
    )
    return True
