"""The one module that talks to jemalloc, the allocator a CPU training run is started under where it can be
(Debian's libjemalloc2: `LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2`, docs/training.md): `purge()` hands
the pages its arenas keep unused back to the kernel, through its `mallctl` interface. Where another allocator
serves the process, nothing happens.

Why a training loop asks: told never to hand pages back on its own (`MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1`),
jemalloc spares a CPU step the kernel's page faults (its default hands GBs back every step and faults them in again
at the next one: 1.66x the CPU), but its footprint then grows with every step (11.3 GB after about 280 steps, when
the kernel killed the process). A purge every few dozen steps keeps both: the faults once per purge, not once a step.
"""

from __future__ import annotations

import ctypes

ARENAS_ALL = 4096     # MALLCTL_ARENAS_ALL: "arena.<i>.purge" with this i purges every arena


def _mallctl():
    try:
        mallctl = ctypes.CDLL(None).mallctl      # the process's own symbols: jemalloc's when it was preloaded
    except AttributeError:
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    mallctl.restype = ctypes.c_int
    return mallctl


_MALLCTL = _mallctl()


def loaded() -> bool:
    """Whether jemalloc serves this process's malloc."""
    return _MALLCTL is not None


def purge() -> bool:
    """Hands every arena's unused pages back to the kernel; False where jemalloc does not serve this process."""
    return _MALLCTL is not None and _MALLCTL(f"arena.{ARENAS_ALL}.purge".encode(), None, None, None, 0) == 0
