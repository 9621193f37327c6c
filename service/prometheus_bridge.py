"""prometheus_client's multiprocess values, each change written to the process's file in one step.

In multiprocess mode each inc(), dec(), set() and a histogram's observe() goes through four Python functions of
prometheus_client's (the value's inc, its check for a fork, the file's write_value, its packing) to put two
doubles into the process's mmaped file, where /metrics reads them: thirteen such writes a one-sentence /translate
on the HTTP process's path. `FastValue` writes the same bytes at the same place from its own inc() and set(),
at once as before (a scrape reads what has been counted), in one function.

Everything here depends on prometheus_client's private layout (0.26: `values.MultiProcessValue`'s `_file`, `_key`,
`_value`, `_timestamp`; `MmapedDict`'s `_m` and `_positions`; two doubles, value then timestamp, written whole
by one slice assignment as it writes them), so `install()` checks it on a value it makes and leaves
prometheus_client's own class in place when it does not match. After a fork, the first change in the new
process goes through prometheus_client's own inc() or set(), which opens the process's own files.
"""

from __future__ import annotations

import os
import struct
import threading

_pack = struct.Struct(b"dd").pack        # a value and its timestamp, as mmap_dict packs them
_lock = threading.Lock()                 # every FastValue's change, and the making of one


def install() -> None:
    """Replaces prometheus_client's multiprocess value class with FastValue. Before any metric is made; again:
    nothing more. The first value made checks the layout (`_layout_known`); where it differs every value goes
    through prometheus_client's own methods."""
    from prometheus_client import values

    base = values.ValueClass
    if not getattr(base, "_multiprocess", False) or getattr(base, "_fast", False):
        return
    forked = [False]                     # since the last change through prometheus_client's own methods
    known: list[bool] = []               # [whether the layout is this module's], once a value was made
    os.register_at_fork(after_in_child=lambda: forked.__setitem__(0, True))   # no getpid() a change

    class FastValue(base):
        _fast = True

        def __init__(self, *args, **kwargs):
            with _lock:
                super().__init__(*args, **kwargs)
                forked[0] = False        # made (and every value's file reopened if it had forked) in this one
                if not known:
                    known.append(_layout_known(self))

        def inc(self, amount):
            with _lock:
                if forked[0] or not known[0]:
                    base.inc(self, amount)       # reopens every value's file after a fork
                    forked[0] = False
                    return
                self._value += amount
                self._timestamp = 0.0
                self._store()

        def set(self, value, timestamp=None):
            with _lock:
                if forked[0] or not known[0]:
                    base.set(self, value, timestamp)
                    forked[0] = False
                    return
                self._value, self._timestamp = value, timestamp or 0.0
                self._store()

        def _store(self):
            """The value and its timestamp written where prometheus_client writes them (under _lock)."""
            file = self._file
            at = file._positions[self._key]
            file._m[at:at + 16] = _pack(self._value, self._timestamp)

        def get(self):
            with _lock:
                return base.get(self)

    values.ValueClass = FastValue


def _layout_known(value) -> bool:
    """Whether `value` has the attributes FastValue writes through, its file the position of its key, and the
    bytes there its value and timestamp as _pack writes them."""
    try:
        file, at = value._file, value._file._positions[value._key]
        return bytes(file._m[at:at + 16]) == _pack(value._value, value._timestamp)
    except (AttributeError, KeyError, TypeError):
        return False
