"""Copies between the engine's blocks where the model runs (service/inference/row_gather.py): the graph written as
protobuf bytes copies what numpy's gather copies, and an engine whose blocks are onnxruntime's (the path a CUDA
device takes: the translation cache's reorder, the encoder outputs' select, the cross slots and a generation
batch's cache by that graph) translates and generates exactly as one on numpy arrays, in batches cut up front
and in running batches that requests join at different steps. Here on onnxruntime's CPU provider: no GPU has
run it yet."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from service.inference.cross_slots import CrossSlots
from service.inference.device_memory import BlockPool
from service.inference.engine import Engine
from service.inference.row_gather import RowGather
from service.shared.options import SearchOptions

from conftest import ROOT, pairs64
from test_batch_invariance import SEARCHES, joined_at, joining

DE_EN, LM = ROOT / "models" / "de-en", ROOT / "models" / "lm-small"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape, rows, width", [
    ((6, 5, 4, 16, 8), [4, 0, 0, -1, 2, 3, 1], 8),       # narrower, rows repeated, a new row (-1)
    ((6, 5, 4, 8, 8), [1, 2, -1], 24),                  # wider: zeros past the old columns
    ((2, 3, 1, 8, 4), [0, 1, 2], 8),                    # the same rows at the same width
])
def test_the_gather_graph_copies_what_numpy_gathers(dtype, shape, rows, width):
    L, R, h, W, d_k = shape
    src = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    dst = np.full((L, len(rows), h, width, d_k), np.nan, dtype=dtype)
    RowGather("cpu", dtype)(src.ctypes.data, shape, np.array(rows), width, dst.ctypes.data)
    kept = min(W, width)
    assert np.array_equal(dst[:, :, :, :kept], np.take(src[:, :, :, :kept], np.clip(rows, 0, R - 1), axis=1))
    assert not dst[:, :, :, kept:].any()


def on_onnxruntime_blocks(engine: Engine) -> Engine:
    """The engine with its blocks onnxruntime's, as on a device, and their copies run as there."""
    engine.pool = engine.graph.pool = BlockPool(engine.float_dtype, "cpu", host_blocks=False)
    return engine


@pytest.fixture(scope="module")
def engines():
    return (Engine(DE_EN, device="cpu", intra_op_threads=1),
            on_onnxruntime_blocks(Engine(DE_EN, device="cpu", intra_op_threads=1)))


def same_hypotheses(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        np.testing.assert_allclose([h.score for h in x], [h.score for h in y], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("options", [SearchOptions(beam_size=4, num_hypotheses=2), SearchOptions(beam_size=1)],
                         ids=["beam 4", "greedy"])
def test_an_engine_on_onnxruntime_blocks_translates_as_on_numpy_arrays(engines, options, monkeypatch):
    host, device = engines
    ran = Counter()
    for name in ("_copy_into", "_place_on_device"):          # the cross slots' device copies, counted
        method = getattr(CrossSlots, name)
        monkeypatch.setattr(CrossSlots, name, lambda self, *a, _m=method, _n=name: (ran.update([_n]), _m(self, *a)))
    ids = host.source_ids([de for de, _ in pairs64()][:24], "en")
    # One batch: sentences end at different steps, so their rows and encoder outputs leave (select).
    same_hypotheses(host.search(ids, options), device.search(ids, options))
    # A running batch: requests of one or two sentences join every other step, every third with other options.
    requests = [[ids[i]] + ([ids[-1 - i]] if i % 3 == 2 else []) for i in range(12)]
    mate = replace(options, length_penalty=0.6, max_length=20)
    opts = [mate if i % 3 == 1 else options for i in range(len(requests))]
    assert len({o.rows_per_input for o in opts}) == 1
    for h, d in zip(joining(host, requests, opts, 2), joining(device, requests, opts, 2), strict=True):
        same_hypotheses(h, d)
    assert device.pool._gather is not None and host.pool._gather is None    # the graph did the copies
    assert ran["_copy_into"] and ran["_place_on_device"], ran   # slots moved, widened and placed on the device


@pytest.mark.parametrize("search", SEARCHES)
def test_a_generation_engine_on_onnxruntime_blocks_continues_as_on_numpy_arrays(search):
    host = Engine(LM, device="cpu", intra_op_threads=1)
    device = on_onnxruntime_blocks(Engine(LM, device="cpu", intra_op_threads=1))
    words = [1, 2, 3, 5, 8, 1, 2, 4, 0, 6]
    prompts = host.prompt_ids([" ".join(de.split()[:k]) for k, (de, _) in zip(words, pairs64())])
    options, seeds = replace(SEARCHES[search], max_length=12), [300 + i for i in range(len(prompts))]
    steps = [0, 0, 1, 1, 1, 3, 4, 7, 7, 9]               # joining beside running rows, several at once
    assert joined_at(device, prompts, options, seeds, steps) == joined_at(host, prompts, options, seeds, steps)
    assert device.pool._gather is not None and host.pool._gather is None
