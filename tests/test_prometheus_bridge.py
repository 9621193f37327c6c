"""service/prometheus_bridge.py: FastValue writes what prometheus_client's own multiprocess value writes. Each case
runs in a fresh interpreter with its own PROMETHEUS_MULTIPROC_DIR (prometheus_client picks its value class when
it is imported); the files are then merged as /metrics merges them, and the two classes' expositions compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Counters, a livesum and a liveall gauge, a histogram; a change in a forked child (its own file, as an HTTP
# process's), inc after set and set after inc, and the values read back with get().
CHANGES = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from prometheus_client import Counter, Gauge, Histogram, values
if sys.argv[2] == "fast":
    from service.prometheus_bridge import install
    install()
requests = Counter("t_requests_total", "requests", ["endpoint", "status"])
in_flight = Gauge("t_in_flight", "in flight", ["endpoint"], multiprocess_mode="livesum")
info = Gauge("t_info", "info", ["model"], multiprocess_mode="liveall")
seconds = Histogram("t_seconds", "latency", ["endpoint"], buckets=(0.01, 0.1, 1.0))
for i in range(100):
    requests.labels("translate", "200").inc()
    in_flight.labels("translate").inc()
    seconds.labels("translate").observe(0.003 * i)
    in_flight.labels("translate").dec()
requests.labels("translate", "422").inc(4)
info.labels("de-en").set(1)
in_flight.labels("generate").set(7)
in_flight.labels("generate").inc(2)
child = os.fork()
if child == 0:
    requests.labels("translate", "200").inc(5)
    seconds.labels("translate").observe(0.5)
    os._exit(0)
os.waitpid(child, 0)
requests.labels("translate", "200").inc()
read = [requests.labels("translate", "200")._value.get(), in_flight.labels("generate")._value.get()]
from service.prometheus_bridge import _layout_known
print(json.dumps({"class": values.ValueClass.__name__, "read": read,
                  "known": _layout_known(requests.labels("translate", "200")._value)}))
"""

MERGED = r"""
import sys
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
lines = generate_latest(registry).decode().splitlines()
print("\n".join(sorted(l for l in lines if l.startswith("t_") and "pid=" not in l)))
"""


def run(tree: Path, kind: str, directory: Path) -> tuple[dict, str]:
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    made = subprocess.run([sys.executable, "-c", CHANGES, str(tree), kind], env=env, capture_output=True, text=True,
                          check=True, timeout=60)
    merged = subprocess.run([sys.executable, "-c", MERGED], env=env, capture_output=True, text=True, check=True,
                            timeout=60)
    return json.loads(made.stdout), merged.stdout


def test_fast_values_write_what_prometheus_clients_own_write(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "fast").mkdir()
    own, own_merged = run(ROOT, "own", tmp_path / "own")
    fast, fast_merged = run(ROOT, "fast", tmp_path / "fast")
    assert own["class"] == "MmapedValue" and fast["class"] == "FastValue" and fast["known"]   # its own writes
    assert fast_merged == own_merged and fast["read"] == own["read"] == [101.0, 9.0]
    assert 't_requests_total{endpoint="translate",status="200"} 106.0' in fast_merged   # the child's 5 too
    assert 't_seconds_bucket{endpoint="translate",le="0.01"} 4.0' in fast_merged
    assert 't_in_flight{endpoint="translate"} 0.0' in fast_merged


def test_a_layout_it_does_not_know_leaves_prometheus_clients_own_writes():
    from service.prometheus_bridge import _layout_known

    class Elsewhere:   # a value whose file keeps no positions where FastValue looks for them
        _file, _key, _value, _timestamp = object(), "k", 0.0, 0.0

    assert not _layout_known(Elsewhere())
