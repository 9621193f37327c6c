"""What a worker's scheduler shows a dashboard (service/metrics.py): the rows decoding now, the requests it holds
that wait for a row, the key/value cache its searches hold (per model), and the rows of every decoder call
(a histogram). A scheduler makes one `SchedulerWatch` for its engines and calls `update` whenever those change
(after a step, an admission, an abandon); the decoder calls are counted by the engines themselves, through the
hook their decoder graph offers (DecoderGraph.on_call), which also leaves the rows of the latest call in
`last_rows` for the scheduler to attribute to the batch it stepped."""

from __future__ import annotations

from typing import Any

from ..metrics import metrics


class SchedulerWatch:
    def __init__(self, endpoint: str, engines: dict[str, Any]):
        m = metrics()
        self.last_rows = 0                     # rows of the latest decoder call (0: none since reset)
        self._pools = {model: getattr(engine, "pool", None) for model, engine in engines.items()}
        self._running = {model: m.running_rows.labels(endpoint, model) for model in engines}
        self._cache = {model: m.cache_bytes.labels(endpoint, model) for model in engines}
        self._waiting = m.waiting_requests.labels(endpoint)
        for model, engine in engines.items():
            graph = getattr(engine, "graph", None)     # fake engines (tests) have none
            if graph is not None:
                graph.on_call = self._observer(m.step_batch_rows.labels(endpoint, model))

    def _observer(self, histogram):
        def on_call(rows: int) -> None:
            self.last_rows = rows
            histogram.observe(rows)
        return on_call

    def update(self, running: dict[str, int], waiting: int) -> None:
        """running: rows decoding now per model (models left out: 0); waiting: requests held with no row
        decoding. The cache is read from each engine's memory pool."""
        for model, gauge in self._running.items():
            gauge.set(running.get(model, 0))
        for model, pool in self._pools.items():
            self._cache[model].set(pool.lent_bytes if pool is not None else 0)
        self._waiting.set(waiting)
