"""model/jemalloc.py: under jemalloc told never to hand pages back (the training command's MALLOC_CONF,
docs/training.md), purge() gives freed memory back to the kernel; under any other allocator it does nothing."""

import os
import subprocess
import sys

import pytest

from model import jemalloc

from conftest import ROOT

LIBRARY = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
PROBE = """
from model import jemalloc
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
blocks = [bytearray(40_000_000) for _ in range(10)]        # 400 MB written, then freed
del blocks
kept = rss_mb()
print(jemalloc.loaded(), jemalloc.purge(), kept, rss_mb())
"""


def test_without_jemalloc_purge_does_nothing():
    assert not jemalloc.loaded() and jemalloc.purge() is False


@pytest.mark.skipif(not os.path.exists(LIBRARY), reason="Debian's libjemalloc2 is not installed (scripts/test.sh "
                    "installs it as root)")
def test_purge_hands_back_what_jemalloc_kept():
    env = dict(os.environ, LD_PRELOAD=LIBRARY, MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    loaded, purged, kept, after = out.stdout.split()
    assert (loaded, purged) == ("True", "True")
    assert int(kept) > 300 and int(after) < int(kept) - 300, out.stdout     # kept until the purge, then given back
