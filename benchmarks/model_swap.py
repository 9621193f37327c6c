"""Issue 53's bar for model control, its full 60 s: 16 clients translate on models/de-en (beam 2, the five card
sentences in turn) while the package is replaced by another version three times and a broken version (a corrupted
encoder.onnx whose checksum was rewritten to match, so that only onnxruntime in the workers can refuse it) is tried
once between. Printed: the requests answered and failed, the versions that answered (each must be one that was
loaded; the broken one never), each load call's status and time (and the broken one's reason), the latency
percentiles in the windows around the swaps and outside them, and of the requests in flight while a load call ran,
and each worker version's measured resident cost.

    python benchmarks/model_swap.py [--seconds 60] [--clients 16] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
from common import ROOT, cpu_facts, describe_cpu, service

import httpx

sys.path.insert(0, str(ROOT / "tests"))
from test_model_control import TEXTS, broken_version, new_version  # noqa: E402  (the tests' package copies)

ADMIN_KEY = "bench-admin-key"


async def clients(url: str, seconds: float, n: int) -> list[tuple[float, float, int, str | None]]:
    """(start, seconds, status, version) of each request of `n` clients sending as fast as they are answered."""
    deadline, out = time.monotonic() + seconds, []

    async def one(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            i = k
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                r = await http.post("/translate", json={"text": TEXTS[i % len(TEXTS)], "source_lang": "de",
                                                        "target_lang": "en", "beam_size": 2})
                version = r.json().get("model_version") if r.status_code == 200 else None
                out.append((t0, time.monotonic() - t0, r.status_code, version))
                i += 1

    await asyncio.gather(*(one(k) for k in range(n)))
    return out


async def swaps(url: str, root: Path, seconds: float) -> list[tuple[str, float, float, int, str]]:
    """(version, start, seconds, status, message) of each load call, spread over the run."""
    calls = []
    async with httpx.AsyncClient(base_url=url, timeout=300, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        for version in ("v2", "v3", "broken", "v4"):
            await asyncio.sleep(seconds / 5)
            path = broken_version(root, version, True) if version == "broken" else new_version(root, version)
            t0 = time.monotonic()
            r = await http.post("/admin/models", json={"path": str(path)})
            message = r.json()["error"]["message"] if r.status_code != 200 else ""
            calls.append((version, t0, time.monotonic() - t0, r.status_code, message))
    return calls


def percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49] * 1000:.0f} ms, p95 {q[94] * 1000:.0f} ms, max {max(values) * 1000:.0f} ms ({len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "admin.keys").write_text(ADMIN_KEY + "\n")
        extra = ["--workers", str(args.workers), "--admin-keys-file", str(root / "admin.keys")]
        with service([str(ROOT / "models" / "de-en")], extra) as (_, url):
            first = httpx.get(url + "/admin/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
            loaded = {first["models"][0]["active"]}

            async def run():
                return await asyncio.gather(clients(url, args.seconds, args.clients), swaps(url, root, args.seconds))
            answers, calls = asyncio.run(run())
            listing = httpx.get(url + "/admin/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    loaded |= {v for v, _, _, status, _ in calls if status == 200}
    failed = [a for a in answers if a[2] != 200]
    versions = {a[3] for a in answers if a[2] == 200}
    print(describe_cpu(cpu_facts()))
    print(f"{len(answers)} requests by {args.clients} clients in {args.seconds:g} s, {args.workers} workers: "
          f"{len(failed)} failed; versions that answered {sorted(versions)} (all loaded: {versions <= loaded}, "
          f"the broken one never: {'broken' not in versions})")
    for version, _, took, status, message in calls:
        print(f"  load {version}: {status} in {took:.2f} s {message}")
    near = [a[1] for a in answers if any(t0 - 1 <= a[0] <= t0 + took + 1 for _, t0, took, _, _ in calls)]
    far = [a[1] for a in answers if not any(t0 - 1 <= a[0] <= t0 + took + 1 for _, t0, took, _, _ in calls)]
    # In flight while a load call ran (its span overlapping the call's): those a worker's load could hold up.
    during = [a[1] for a in answers if any(a[0] < t0 + took and a[0] + a[1] > t0 for _, t0, took, _, _ in calls)]
    print(f"  latency within 1 s of a load: {percentiles(near)}")
    print(f"  latency otherwise:            {percentiles(far)}")
    print(f"  latency in flight during one: {percentiles(during)}")
    for v in listing["models"][0]["versions"]:
        print(f"  version {v['version']}: files {v['bytes'] >> 20} MiB, measured resident {v['resident_bytes'] >> 20} "
              "MiB a worker")


if __name__ == "__main__":
    main()
