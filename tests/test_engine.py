"""The model package and its onnxruntime engine, checked against the PyTorch model they come from.

The tiny model has memorised 64 real Ding sentence pairs (tests/fixtures/pairs64.tsv), so the right
outputs are known, and its decoding is fast enough to run every search option over all 64 inputs.
"""

import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model import evaluate
from model.decoding import TorchDecoder, translate
from model.export import export_package, export_translation
from model.quantize import SCHEMES
from model.transformer import Transformer, TransformerConfig
import service.inference.device as device_module
from service.inference.decoders import OrtDecoder, source_groups
from service.inference.device import DeviceError, probe_device, session_options
from service.inference.engine import Engine
from service.shared.options import SearchOptions
from service.shared.package import INT8_STATIC, PackageError, file_entries, load_package

from conftest import ROOT, pairs64, torch_reference

PAIRS = pairs64()
SOURCES = [de for de, _ in PAIRS]
REFERENCES = [en for _, en in PAIRS]
# Parity inputs: the 64 memorised sentences and 64 the model never saw (the same words, lower-cased,
# each with its last word dropped), so the comparison also covers uncertain, longer-running outputs.
UNSEEN = [" ".join(de.lower().split()[:-1]) or de.lower() for de in SOURCES]
PARITY = SOURCES + UNSEEN


@pytest.fixture(scope="module")
def engine(tiny_package) -> Engine:
    return Engine(tiny_package, device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def reference(tiny_run):
    yield from torch_reference(tiny_run)


@pytest.fixture(scope="module")
def ids(engine) -> list[list[int]]:
    return engine.source_ids(SOURCES, "en")


@pytest.fixture(scope="module")
def greedy(engine, ids) -> list[list[int]]:
    """Unconstrained greedy outputs (token ids), the baseline the constrained searches are compared to."""
    return [h[0].tokens for h in engine.search(ids, SearchOptions(beam_size=1))]


def tokens(engine: Engine, ids, **options) -> list[list[int]]:
    return [h[0].tokens for h in engine.search(ids, SearchOptions(**options))]


def has_repeat(toks: list[int]) -> bool:
    return len(toks) != len(set(toks))


# --- the package ----------------------------------------------------------------------------------

def test_model_json_describes_the_package(tiny_package):
    meta = json.loads((tiny_package / "model.json").read_text())
    assert meta["format"] == "transerve-model/1"
    assert meta["task"] == "translation"
    assert meta["directions"] == ["de-en"] and meta["languages"] == ["de", "en"]
    assert meta["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    assert meta["precision"] == "fp32"
    assert meta["config"]["d_k"] == meta["config"]["d_model"] // meta["config"]["h"]
    assert set(meta["files"]) == {"encoder.onnx", "decoder.onnx", "spm.model"}
    for name, info in meta["files"].items():
        data = (tiny_package / name).read_bytes()
        assert info["bytes"] == len(data)
        assert info["sha256"] == hashlib.sha256(data).hexdigest(), name


def test_graphs_pass_the_checker_and_have_the_documented_signatures(tiny_package):
    meta = json.loads((tiny_package / "model.json").read_text())
    c = meta["config"]
    # Names in model.json that are fixed by the model; every other name is a dynamic axis.
    fixed = {"layers": c["n_decoder_layers"], "heads": c["h"], "d_k": c["d_k"], "vocab": c["vocab_size"]}
    for graph in ("encoder", "decoder"):
        model = onnx.load(str(tiny_package / f"{graph}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        doc = meta["graphs"][graph]
        for values, documented in ((model.graph.input, doc["inputs"]), (model.graph.output, doc["outputs"])):
            assert [v.name for v in values] == list(documented)
            for v in values:
                dims = v.type.tensor_type.shape.dim
                assert len(dims) == len(documented[v.name]), v.name
                for dim, want in zip(dims, documented[v.name]):
                    if isinstance(want, int) or want in fixed:
                        assert dim.dim_value == fixed.get(want, want), (v.name, want)
                    else:  # dynamic: a symbolic size, named as documented ("past_len + 1" is an expression)
                        assert dim.dim_param and want.split()[0] in dim.dim_param, (v.name, want, dim)


def test_the_self_attention_reads_its_total_length_from_the_host(tiny_package):
    """GroupQueryAttention's total_sequence_length is the `total` input, fed by the engine from the host: computed
    in the graph (ReduceMax of positions + 1), onnxruntime's CUDA kernel read it wrongly (log-probs off by up to 16
    on an H200; benchmarks/results/gpu-h200.md)."""
    graph = onnx.load(str(tiny_package / "decoder.onnx")).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == json.loads((tiny_package / "model.json").read_text())["config"]["n_decoder_layers"]
    assert all(n.input[6] == "total" for n in attention)
    assert "total" in [i.name for i in graph.input]
    assert not [n for n in graph.node if n.op_type == "ReduceMax"]


def without_total_input(package, out):
    """A copy of a translation package whose decoder computes `total` in the graph, as packages exported before
    2026-12-04 did (ReduceMax(positions) + 1)."""
    shutil.copytree(package, out)
    model = onnx.load(str(out / "decoder.onnx"))
    g = model.graph
    g.node.extend([onnx.helper.make_node("ReduceMax", ["positions"], ["old_max"], keepdims=1),
                   onnx.helper.make_node("Constant", [], ["old_one"], value=onnx.helper.make_tensor(
                       "old_one", onnx.TensorProto.INT32, [1], [1])),
                   onnx.helper.make_node("Add", ["old_max", "old_one"], ["old_total"])])
    for node in g.node:
        if node.op_type == "GroupQueryAttention":
            node.input[6] = "old_total"
    keep = [i for i in g.input if i.name != "total"]
    del g.input[:]
    g.input.extend(keep)
    onnx.save(model, str(out / "decoder.onnx"))
    meta = json.loads((out / "model.json").read_text())
    meta["files"] |= file_entries(out, ["decoder.onnx"])
    del meta["graphs"]["decoder"]["inputs"]["total"]
    (out / "model.json").write_text(json.dumps(meta))
    return out


def test_a_package_computing_total_in_its_graph_still_translates_the_same_on_the_cpu(tiny_package, engine, ids,
                                                                                      tmp_path):
    old = Engine(without_total_input(tiny_package, tmp_path / "old"), device="cpu", intra_op_threads=1)
    assert not old.graph.host_total and engine.graph.host_total
    for beam in (1, 4):
        options = SearchOptions(beam_size=beam)
        assert ([h[0].tokens for h in old.search(ids[:8], options)]
                == [h[0].tokens for h in engine.search(ids[:8], options)])


def test_on_cuda_a_package_computing_total_itself_is_told_to_be_upgraded(tiny_package, engine, tmp_path, caplog):
    old = Engine(without_total_input(tiny_package, tmp_path / "old"), device="cpu", intra_op_threads=1)
    for e in (old, engine):
        e.device_type = "cuda"                  # what it says at load on a GPU, where this onnxruntime has none
        e._note_the_device(8)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    old_says = [m for m in said if str(old.package.path) in m and "total length" in m]
    new_says = [m for m in said if str(engine.package.path) in m and "step by step" in m]
    assert len(old_says) == 1 and "translations on CUDA are wrong" in old_says[0] and "model.upgrade" in old_says[0]
    assert len(new_says) == 1 and "wrong" not in new_says[0] and "cuda_agreement.py" in new_says[0]
    assert not [m for m in said if str(engine.package.path) in m and "total length" in m]


# --- parity with PyTorch ----------------------------------------------------------------------------

@pytest.mark.parametrize("beam", [1, 4])
def test_engine_translates_exactly_like_the_pytorch_reference(engine, reference, beam):
    model, tok = reference
    assert len(set(PARITY)) >= 100
    expected = translate(model, tok, PARITY, settings=SearchOptions(beam_size=beam))
    got = [t.text for t in engine.translate(PARITY, source_lang="de", target_lang="en", beam_size=beam)]
    assert got == expected
    assert sum(g == r for g, r in zip(got, REFERENCES)) >= 60  # and the outputs are the memorised ones


def test_export_refuses_a_head_size_the_fused_attention_cannot_take(tmp_path):
    """onnxruntime's GroupQueryAttention takes head sizes in multiples of 8: d_model 96 over 8 heads (12)
    is refused at export, with a head count that works, rather than by the engine's first step."""
    model = Transformer(TransformerConfig(vocab_size=64, d_model=96, h=8, d_ff=64, n_encoder_layers=1,
                                          n_decoder_layers=1))
    with pytest.raises(ValueError, match=r"d_model / h = 12: .* multiple of 8, e.g. h=1 for d_model=96"):
        export_translation(model, tmp_path)


def test_decoder_steps_match_pytorch_through_select(engine, reference, ids):
    """Padded sources of different lengths; steps before and after select() reorders, duplicates and
    drops rows, so the engine's reorder of the cache and its choice of cross tensors (one source per
    row, or one per group of rows as beams share their sentence) are what is compared."""
    model, _ = reference
    by_length = {len(s): s for s in ids}                                      # one source per length
    lengths = sorted(by_length)
    assert len(lengths) >= 4
    batch = [by_length[n] for n in (lengths[-1], lengths[0], lengths[len(lengths) // 2], lengths[1])]
    src = np.zeros((4, max(map(len, batch))), dtype=np.int64)                # (B, S), 0 = pad
    for i, s in enumerate(batch):
        src[i, :len(s)] = s
    ort_dec = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id)
    torch_dec = TorchDecoder(model, torch.from_numpy(src))
    toks = np.full(4, engine.bos_id, dtype=np.int64)                          # (N,)
    steps, groups = 0, []
    # 19 steps: the cache widens at positions 8 and 16, at 8 right after a select (two copies in one step).
    schedule = (None, None, [3, 1, 1, 0], None, [2, 2, 0, 0], None, [2, 0], None, [1, 0, 1]) + (None,) * 7 + (
        [2, 0], None, None)
    for rows in schedule:
        if rows is not None:
            ort_dec.select(np.array(rows))
            torch_dec.select(np.array(rows))
            toks = toks[rows]
        groups.append(len(source_groups(ort_dec.row_source)))
        a, b = ort_dec.step(toks), torch_dec.step(toks)                      # (N, V) each
        assert a.shape == b.shape == (len(toks), model.config.vocab_size)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
        toks = b.argmax(axis=1)
        steps += 1
    assert steps == 19 and groups[:8] == [4, 4, 4, 4, 2, 2, 2, 2]   # two rows per source after [2, 2, 0, 0]
    assert ort_dec.cache.width == 24


def test_a_cache_that_outgrows_its_blocks_moves_to_larger_ones_with_the_same_outputs(engine, ids):
    """Blocks sized for one row and one position must be replaced as rows multiply (beams) and
    positions accumulate; every step's distribution stays that of a decoder sized for the whole run."""
    batch = ids[:3]
    src = np.zeros((3, max(map(len, batch))), dtype=np.int64)
    for i, s in enumerate(batch):
        src[i, :len(s)] = s
    small = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id, max_rows=1, max_positions=1)
    roomy = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id, max_rows=12, max_positions=12)
    first = (small.cache.read.size, small.cache.write.size)
    toks = np.full(3, engine.bos_id, dtype=np.int64)
    for rows in (None, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], None, None, [1, 5, 9, 10], None, None):
        if rows is not None:
            small.select(np.array(rows))
            roomy.select(np.array(rows))
            toks = toks[rows]
        a, b = small.step(toks), roomy.step(toks)                               # (N, V) each
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
        toks = b.argmax(axis=1)
    assert min(small.cache.read.size, small.cache.write.size) > max(first)      # both blocks were replaced
    small.close(), roomy.close()


def test_each_search_reuses_the_blocks_the_last_one_handed_back(tiny_package, ids):
    engine = Engine(tiny_package, device="cpu", intra_op_threads=1)
    engine.search(ids[:8], SearchOptions(beam_size=4))
    held = sorted(b.address for b in engine.pool._free)
    assert len(held) == 3                                       # the encoder's outputs and two cache blocks
    for _ in range(3):
        engine.search(ids[:8], SearchOptions(beam_size=4))
        engine.search(ids[8:10], SearchOptions(beam_size=2))    # smaller: served from the same blocks
        assert sorted(b.address for b in engine.pool._free) == held
    before = engine.pool.held_bytes
    engine.search(ids * 2, SearchOptions(beam_size=4))          # larger: new blocks, and the pool keeps 3
    assert len(engine.pool._free) == 3 and engine.pool.held_bytes > before
    assert sorted(b.address for b in engine.pool._free) != held


def test_the_pool_counts_the_bytes_lent_to_running_searches():
    """What transerve_cache_bytes reads: the bytes the blocks out were asked for (a reused block may be larger),
    none once given back; a block dropped unreturned stops counting (a search closed before its first step)."""
    import gc

    from service.inference.device_memory import BlockPool

    pool = BlockPool(np.float32, "cpu")
    a, b = pool.take(100), pool.take(50)
    assert pool.lent_bytes == 600 and pool.held_bytes == 0
    pool.give(a)
    assert pool.lent_bytes == 200 and pool.held_bytes == 400
    assert pool.take(10) is a and pool.lent_bytes == 240
    del b
    gc.collect()
    assert pool.lent_bytes == 40


def test_a_relayout_told_each_rows_written_columns_copies_those_and_no_more():
    """InPlaceCache.fit(rows, width, filled) (the running batch's, its rows at different positions): kept row i
    is source row rows[i]'s first filled[i] columns in every tensor; the columns past them and a new row (-1) are
    not copied (their search writes each before reading it), so they keep what the block held."""
    from service.inference.device_memory import BlockPool, InPlaceCache

    names = ["a", "b"]
    cache = InPlaceCache(BlockPool(np.float32, "cpu"), names, names, 3, 2, 4, max_rows=4, max_positions=16)
    cache.reserve(7)                                                           # W = 8
    src = cache.read.host()[:2 * 3 * 2 * 8 * 4].reshape(2, 3, 2, 8, 4)
    src[:] = np.arange(src.size, dtype=np.float32).reshape(src.shape)
    before = src.copy()
    cache.write.host()[:] = -1.0
    cache.fit(np.array([2, 0, -1, 2]), 16, np.array([3, 8, 5, 1]))
    out = cache.read.host()[:2 * 4 * 2 * 16 * 4].reshape(2, 4, 2, 16, 4)
    for i, (r, c) in enumerate([(2, 3), (0, 8), (None, 0), (2, 1)]):
        if r is not None:
            np.testing.assert_array_equal(out[:, i, :, :c], before[:, r, :, :c])
        assert (out[:, i, :, c:] == -1.0).all()


def test_one_binding_serves_full_and_top_k_steps_in_turn(engine, ids):
    """A search's binding is reused, so a top-k step after a full one (and the reverse) must not write
    into the other kind's arrays: each step's values match a decoder that only ever takes full steps."""
    batch = ids[:4]
    src = np.zeros((4, max(map(len, batch))), dtype=np.int64)
    for i, s in enumerate(batch):
        src[i, :len(s)] = s
    mixed = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id)
    full = OrtDecoder(engine.graph, engine.encode(src), src != engine.pad_id)
    toks = np.full(4, engine.bos_id, dtype=np.int64)
    for kind in ("full", "top", "top", "full", "top"):
        ref = full.step(toks)                                                 # (N, V)
        if kind == "full":
            np.testing.assert_allclose(mixed.step(toks), ref, atol=1e-6, rtol=0)
        else:
            top_logp, top_ids, eos_logp = mixed.step_top(toks, 5)
            np.testing.assert_allclose(top_logp, np.take_along_axis(ref, top_ids, axis=1), atol=1e-6, rtol=0)
            np.testing.assert_allclose(np.sort(top_logp, axis=1), np.sort(ref, axis=1)[:, -5:], atol=1e-6, rtol=0)
            np.testing.assert_allclose(eos_logp, ref[:, engine.eos_id], atol=1e-6, rtol=0)
        toks = ref.argmax(axis=1)
    mixed.close(), full.close()


def test_binding_through_the_public_iobinding_methods_gives_the_same_hypotheses(tiny_package, engine, ids):
    """The Binder's fallback, for an onnxruntime without the binding underneath the public methods."""
    public = Engine(tiny_package, device="cpu", intra_op_threads=1)
    public.pool.bind._c_device = public.host._c_device = None
    opts = SearchOptions(beam_size=4, num_hypotheses=2)
    ours, theirs = engine.search(ids[:16], opts), public.search(ids[:16], opts)
    assert [[(h.tokens, round(h.score, 5)) for h in hs] for hs in ours] == \
        [[(h.tokens, round(h.score, 5)) for h in hs] for hs in theirs]


def test_source_groups_share_a_source_only_between_equal_runs():
    assert source_groups(np.array([5, 5, 5, 5, 2, 2, 2, 2])).tolist() == [5, 2]
    assert source_groups(np.array([1, 1, 0, 0, 1, 1])).tolist() == [1, 0, 1]
    assert source_groups(np.array([3, 1, 1, 0])).tolist() == [3, 1, 1, 0]      # unequal runs: one per row
    assert source_groups(np.array([0, 0, 0, 1, 2, 2])).tolist() == [0, 0, 0, 1, 2, 2]
    assert source_groups(np.array([7])).tolist() == [7]


def test_evaluate_package_reproduces_the_references(tiny_package, data_dir, capsys):
    capsys.readouterr()
    evaluate.main(["--package", str(tiny_package), "--data", str(data_dir / "test.tsv"), "--beam", "4", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["package"] == str(tiny_package) and result["precision"] == "fp32"
    assert result["sentences"] == 64 and result["direction"] == "de-en"
    for name in ("greedy", "beam4"):
        assert result[name]["bleu"] >= 90, result
        assert result[name]["chrf"] >= 90, result
        assert result[name]["bleu_signature"].startswith("nrefs:1|case:mixed")
        assert result[name]["chrf_signature"].startswith("nrefs:1|case:mixed")


def test_evaluate_says_when_the_data_file_is_missing(tiny_package, tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        evaluate.main(["--package", str(tiny_package), "--data", str(tmp_path / "nope.tsv")])


@pytest.mark.parametrize("options", [dict(beam_size=1), dict(beam_size=4, num_hypotheses=3),
                                     dict(beam_size=1, min_length=12, max_length_b=20),
                                     dict(beam_size=4, min_length=5, max_length=4),
                                     dict(beam_size=5, max_length_a=0.5, max_length_b=2, num_hypotheses=2)])
def test_in_graph_top_k_search_equals_the_full_distribution_search(engine, options):
    """The graph's top_k outputs (what searches read by default) against the (N, V) log-probs, under
    the constraints that remove candidates (banned ids, min_length) or force eos (the budget)."""
    src = engine.source_ids(PARITY, "en")
    fast = engine.search(src, SearchOptions(**options))
    engine.search_top_k = False
    try:
        full = engine.search(src, SearchOptions(**options))
    finally:
        engine.search_top_k = True
    assert [[h.tokens for h in hs] for hs in fast] == [[h.tokens for h in hs] for hs in full]
    np.testing.assert_allclose([h.score for hs in fast for h in hs], [h.score for hs in full for h in hs],
                               rtol=0, atol=1e-5)


def test_the_committed_packages_run_with_per_layer_caches_and_top_k():
    """models/de-en and models/lm-small (upgraded by model.upgrade) take the fast path: one cache
    tensor per layer, grouped sources, the k best tokens from the graph."""
    e = Engine(ROOT / "models" / "de-en", device="cpu", intra_op_threads=1)
    assert e.past_names[:2] == ["past_key_0", "past_value_0"]
    assert len(e.past_names) == 2 * e.package.config["n_decoder_layers"]
    out = e.translate(["Das Haus ist klein.", "Guten Morgen."], source_lang="de", target_lang="en", beam_size=4)
    assert all(t.text and t.tokens > 0 for t in out)
    lm = Engine(ROOT / "models" / "lm-small", device="cpu", intra_op_threads=1)
    assert lm.past_names[:2] == ["past_key_0", "past_value_0"]
    assert 0 < lm.generate(["Die Datei"], max_new_tokens=5)[0].tokens <= 5


# --- search options ---------------------------------------------------------------------------------

def test_n_best_returns_distinct_hypotheses_best_first(engine, ids):
    results = engine.search(ids, SearchOptions(beam_size=4, num_hypotheses=3))
    for hyps in results:
        assert len(hyps) == 3
        assert len({tuple(h.tokens) for h in hyps}) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    t = engine.translate(SOURCES[:4], source_lang="de", target_lang="en", beam_size=4, num_hypotheses=3)
    for tr in t:
        assert len(tr.alternatives) == 2 and all(score <= tr.score for _, score in tr.alternatives)


@pytest.mark.parametrize("options", [dict(beam_size=4, num_hypotheses=5), dict(beam_size=1, num_hypotheses=2),
                                     dict(sampling=True, num_hypotheses=2)])
def test_more_hypotheses_than_the_search_keeps_is_rejected(engine, ids, options):
    with pytest.raises(ValueError, match="num_hypotheses"):
        engine.search(ids[:2], SearchOptions(**options))


def test_an_unknown_length_rule_is_refused_naming_the_valid_ones():
    """Refused when the options are made, before any search (tests/test_ctranslate2_search.py runs both rules)."""
    with pytest.raises(ValueError, match="length_rule must be one of 'transformers', 'ctranslate2', got 'marian'"):
        SearchOptions(length_rule="marian")


@pytest.mark.parametrize("beam", [1, 4])
def test_max_length_counts_the_forced_eos(engine, ids, greedy, beam):
    """The budget counts the eos (as the positional table does): max_length=3 is 2 pieces + eos."""
    hyps = [h[0] for h in engine.search(ids, SearchOptions(beam_size=beam, max_length=3))]
    assert all(len(g) >= 3 for g in greedy)   # so the cap bites on every sentence
    # Never more than 2 pieces; beam search may prefer a hypothesis that ended earlier.
    assert all(len(h.tokens) <= 2 and np.isfinite(h.score) for h in hyps)
    assert sum(len(h.tokens) == 2 for h in hyps) > len(hyps) // 2
    if beam == 1:
        assert [h.tokens for h in hyps] == [g[:2] for g in greedy]


def test_max_length_a_b_budget_per_source_length(engine, ids, greedy):
    a, b, cap = 0.5, 2, 9
    got = tokens(engine, ids, beam_size=1, max_length_a=a, max_length_b=b, max_length=cap)
    cut = 0
    for src, g, out in zip(ids, greedy, got):
        budget = min(int(a * len(src) + b), cap)
        if len(g) + 1 > budget:
            assert out == g[:budget - 1]
            cut += 1
        else:
            assert out == g
    assert 0 < cut < len(ids)


@pytest.mark.parametrize("beam", [1, 4])
def test_min_length_forces_that_many_tokens(engine, ids, greedy, beam):
    got = tokens(engine, ids, beam_size=beam, min_length=15, max_length_b=30)
    assert sum(len(g) < 15 for g in greedy) > 40
    assert all(len(out) >= 15 for out in got)
    if beam == 1:
        assert all(out[:len(g)] == g for g, out in zip(greedy, got))


@pytest.mark.parametrize("beam", [1, 4])
def test_max_length_wins_over_min_length(engine, ids, beam):
    """min_length above the budget used to yield -inf pad tokens past the budget (greedy) or no
    hypothesis at all (beam: IndexError in translate)."""
    hyps = engine.search(ids, SearchOptions(beam_size=beam, min_length=5, max_length=3))
    for h in hyps:
        assert len(h[0].tokens) == 2 and np.isfinite(h[0].score)
        assert not set(h[0].tokens) & set(engine.banned_ids)


def test_sampling_with_a_seed_is_reproducible_alone_and_batched(engine, ids):
    opts = SearchOptions(sampling=True, temperature=1.5)
    seeds = [1000 + i for i in range(len(ids))]
    batched = [h[0].tokens for h in engine.search(ids, opts, seeds=seeds)]
    assert [h[0].tokens for h in engine.search(ids, opts, seeds=seeds)] == batched
    for i in range(0, len(ids), 4):
        assert engine.search([ids[i]], opts, seeds=[seeds[i]])[0][0].tokens == batched[i]
        seeded = SearchOptions(sampling=True, temperature=1.5, seed=seeds[i])  # the per-request form
        assert engine.search([ids[i]], seeded)[0][0].tokens == batched[i]


def test_sampling_with_other_seeds_gives_other_outputs(engine, ids):
    opts = SearchOptions(sampling=True, temperature=1.5)
    first = [h[0].tokens for h in engine.search(ids, opts, seeds=list(range(64)))]
    second = [h[0].tokens for h in engine.search(ids, opts, seeds=list(range(100, 164)))]
    assert sum(x != y for x, y in zip(first, second)) >= 1


def test_sampling_top_k_1_is_greedy(engine, ids, greedy):
    assert tokens(engine, ids, sampling=True, temperature=1.5, top_k=1) == greedy


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram_size_1_repeats_no_token(engine, ids, greedy, beam):
    assert sum(map(has_repeat, greedy)) >= 5       # the plain outputs do repeat pieces
    assert not any(map(has_repeat, tokens(engine, ids, beam_size=beam, no_repeat_ngram_size=1)))


def test_repetition_penalty_lowers_the_score_of_repeating_outputs(engine, ids):
    """The memorised model is too sure of itself for a penalty to change its words, but the penalised
    log-probs are what the score sums: lower exactly where a token repeats."""
    plain = [h[0] for h in engine.search(ids, SearchOptions(beam_size=1))]
    penal = [h[0] for h in engine.search(ids, SearchOptions(beam_size=1, repetition_penalty=10.0))]
    lowered = 0
    for p, q in zip(plain, penal):
        if q.tokens != p.tokens:
            continue
        if has_repeat(p.tokens):
            assert q.score <= p.score
            lowered += q.score < p.score
        else:
            assert q.score == pytest.approx(p.score, abs=1e-9)
    assert lowered >= 5


# --- int8, broken packages, directions, the torch-free service ---------------------------------------

@pytest.fixture(scope="module", params=list(SCHEMES))
def int8_package(request, tiny_int8):
    """tiny_run exported with each --quantize, named after it."""
    return tiny_int8(request.param)


def test_int8_package_is_smaller_and_keeps_the_graph_signatures(int8_package, tiny_package):
    meta = json.loads((int8_package / "model.json").read_text())
    fp32 = json.loads((tiny_package / "model.json").read_text())
    assert meta["precision"] == "int8" and meta["quantization"] == SCHEMES[int8_package.name]
    # int8-static says how much text set its scales: the 64 pairs of the run's dev split
    assert meta.get("calibration") == ({"sentences": 64} if meta["quantization"] == INT8_STATIC else None)
    assert meta["graphs"] == fp32["graphs"]
    for graph in ("encoder", "decoder"):
        model = onnx.load(str(int8_package / f"{graph}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert [v.name for v in model.graph.input] == list(meta["graphs"][graph]["inputs"])
        assert [v.name for v in model.graph.output] == list(meta["graphs"][graph]["outputs"])
        size = (int8_package / f"{graph}.onnx").stat().st_size
        assert size < 0.8 * (tiny_package / f"{graph}.onnx").stat().st_size


def test_int8_encoder_outputs_stay_close_to_fp32(int8_package, tiny_package):
    src = np.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]], dtype=np.int64)
    ref, got = (ort.InferenceSession(str(p / "encoder.onnx"), session_options(1)).run(None, {"src_ids": src})
                for p in (tiny_package, int8_package))
    error = np.mean([np.abs(g - r).mean() / np.abs(r).mean() for g, r in zip(got, ref)])
    assert 0 < error < 0.05        # 0 would mean nothing was quantized


@pytest.mark.parametrize("beam", [1, 4])
def test_int8_package_translates_like_fp32(int8_package, engine, beam):
    int8 = Engine(int8_package, device="cpu", intra_op_threads=1)
    a = [t.text for t in engine.translate(SOURCES, source_lang="de", target_lang="en", beam_size=beam)]
    b = [t.text for t in int8.translate(SOURCES, source_lang="de", target_lang="en", beam_size=beam)]
    # Measured on this fixture: 64/64 greedy in both forms; beam 4 61/64 int8-rows, 62/64 int8-static.
    assert sum(x == y for x, y in zip(a, b)) >= 58, beam


@pytest.mark.parametrize("damage, file", [("flip", "decoder.onnx"), ("delete", "encoder.onnx"),
                                          ("truncate", "model.json")])
def test_a_corrupt_package_is_refused_naming_the_file(tiny_package, tmp_path, damage, file):
    pkg = tmp_path / "pkg"
    shutil.copytree(tiny_package, pkg)
    target = pkg / file
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "delete":
        target.unlink()
    else:
        target.write_text(target.read_text()[:100])
    with pytest.raises(PackageError, match=re.escape(str(target))):
        load_package(pkg)
    with pytest.raises(PackageError, match=re.escape(file)):
        Engine(pkg, device="cpu")


def test_an_unknown_direction_names_the_valid_ones(engine):
    with pytest.raises(ValueError, match="translates de-en, not en-de"):
        engine.translate(["Hello."], source_lang="en", target_lang="de")


def test_service_never_imports_torch_or_model():
    code = ("import sys; import service.inference.engine, service.shared.search; "
            "assert 'torch' not in sys.modules and 'model' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pattern = re.compile(r"^\s*(import\s+(torch|model)\b|from\s+(torch|model)\b)", re.MULTILINE)
    sources = sorted((ROOT / "service").rglob("*.py"))
    assert sources
    offenders = [f"{f.relative_to(ROOT)}: {m.group(0).strip()}" for f in sources
                 for m in pattern.finditer(f.read_text(encoding="utf-8"))]
    assert not offenders


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_device_cuda_without_a_cuda_onnxruntime_is_refused(tiny_package):
    with pytest.raises(DeviceError, match="no CUDAExecutionProvider.*onnxruntime-gpu"):
        Engine(tiny_package, device="cuda")


def test_a_cuda_provider_that_does_not_load_is_refused_not_run_on_cpu(tiny_package, monkeypatch, caplog):
    """onnxruntime-gpu lists CUDAExecutionProvider whether or not CUDA and cuDNN load; when they do not,
    its sessions run on CPU with one log line. Played here by a CPU onnxruntime that claims CUDA: asked
    for CUDA, its sessions fall back exactly so."""
    preloaded = []
    monkeypatch.setattr(device_module.ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(device_module.ort, "preload_dlls", lambda *a, **k: preloaded.append(1), raising=False)
    with pytest.raises(DeviceError, match="CUDA provider did not load.*runs on \\['CPUExecutionProvider'\\]"):
        Engine(tiny_package, device="cuda")
    with pytest.raises(DeviceError, match="did not load"):
        probe_device(tiny_package, "cuda")
    auto = Engine(tiny_package, device="auto", intra_op_threads=1)
    assert (auto.device_type, auto.providers) == ("cpu", ["CPUExecutionProvider"])   # what runs, not the wish
    assert probe_device(tiny_package, "auto") == "cpu"
    assert preloaded                       # CUDA and cuDNN looked for in the nvidia-* packages first
    assert "did not load" in caplog.text
    caplog.clear()
    assert Engine(tiny_package, device="cpu", intra_op_threads=1).device_type == "cpu"
    assert "did not load" not in caplog.text   # CPU asked for: nothing to warn about
    assert auto.translate(["Guten Morgen."], source_lang="de", target_lang="en")[0].text


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA")
def test_the_server_with_device_cuda_and_no_cuda_stops_before_starting_workers(tiny_package):
    proc = subprocess.run([sys.executable, "-m", "service", "--model", str(tiny_package), "--device", "cuda",
                           "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: cannot serve: device=cuda" in proc.stderr and "onnxruntime-gpu" in proc.stderr


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the saturating kernel is x86's")
def test_the_exact_int8_product_setting_is_for_x86_cpus_without_vnni_only(tmp_path):
    """session.x64quantprecision costs CPU time where VNNI is already exact, so only CPUs without VNNI get it."""
    from service.inference.device import int8_products_saturate

    def cpu(flags: str):
        f = tmp_path / "cpuinfo"
        f.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        return f
    assert int8_products_saturate(cpu("fpu sse2 avx2 fma"))
    assert int8_products_saturate(cpu("avx2 avx512f avx512bw"))              # AVX-512 without VNNI
    assert not int8_products_saturate(cpu("avx2 avx512f avx512_vnni"))
    assert not int8_products_saturate(cpu("avx2 avx_vnni"))
    assert int8_products_saturate(tmp_path / "missing")                      # unreadable: the safe path


def test_int8_products_are_exact_with_the_engines_session_options():
    """uint8 x int8 products whose 16-bit pair sums would saturate (VPMADDUBSW on x86 CPUs without VNNI: 8,160
    for 1,032,256 here) come out exact with the engine's sessions, on every CPU (session.x64quantprecision where
    there is no VNNI)."""
    k = 64
    session = ort.InferenceSession(product_graph(np.full((k, 1), 127, np.int8)), session_options(1),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"A": np.full((1, k), 255, np.uint8)})[0]
    assert got[0, 0] == k * (255 - 128) * 127


def product_graph(weights: np.ndarray) -> bytes:
    """y = (A - 128) . weights as onnxruntime's MatMulIntegerToFloat (int8 packages' product), scales 1."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = weights.shape
    inits = {"B": weights, "a_scale": np.array(1, np.float32), "b_scale": np.ones(n, np.float32),
             "a_zero": np.array(128, np.uint8)}
    node = helper.make_node("MatMulIntegerToFloat", ["A", *inits], ["Y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.UINT8, [1, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
                              initializer=[numpy_helper.from_array(v, name) for name, v in inits.items()])
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def widening(options: ort.SessionOptions) -> bool:
    """Whether these session options widen int8 products first (session.x64quantprecision)."""
    try:
        return options.get_session_config_entry("session.x64quantprecision") == "1"
    except RuntimeError:       # onnxruntime: no such entry
        return False


def test_7_bit_int8_weights_multiply_exactly_without_the_widening():
    """A 7-bit package's session skips session.x64quantprecision, and its largest products stay exact: 2 x 255 x 63 =
    32,130 fits VPMADDUBSW's 16-bit pair sums on x86 CPUs without VNNI (model/quantize.py), where 127 did not."""
    from service.inference.device import int8_products_saturate

    assert not widening(session_options(1, int8_weight_bits=7))
    assert widening(session_options(1)) == int8_products_saturate()
    k = 64
    weights = np.stack([np.full(k, 63), np.full(k, -63), np.tile([63, -63], k // 2)], axis=1).astype(np.int8)
    session = ort.InferenceSession(product_graph(weights), session_options(1, int8_weight_bits=7),
                                   providers=["CPUExecutionProvider"])
    for a in (np.full((1, k), 255, np.uint8), np.zeros((1, k), np.uint8), np.arange(k, dtype=np.uint8)[None] * 4):
        got = session.run(None, {"A": a})[0]
        assert np.array_equal(got, (a.astype(np.int64) - 128) @ weights.astype(np.int64)), a[0, :4]


@pytest.fixture(scope="module")
def seven_bit_package(tiny_int8):
    """tiny_run exported int8 with 7-bit weights."""
    return tiny_int8("int8", 7)


def test_an_int8_package_exported_with_7_bit_weights_says_so_and_holds_them(seven_bit_package):
    assert json.loads((seven_bit_package / "model.json").read_text())["weight_bits"] == 7
    for graph in ("encoder.onnx", "decoder.onnx"):
        weights = [onnx.numpy_helper.to_array(i) for i in onnx.load(str(seven_bit_package / graph)).graph.initializer
                   if i.data_type == onnx.TensorProto.INT8]
        assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) == 63


def test_the_engine_widens_int8_products_where_they_saturate_unless_the_weights_are_7_bit(
        seven_bit_package, int8_package, monkeypatch, caplog):
    """As on an x86 CPU without VNNI, whatever this one is: the 8-bit package's sessions widen, the 7-bit one's do
    not, and the engine says so for the 8-bit one."""
    monkeypatch.setattr(device_module, "int8_products_saturate", lambda *a: True)
    seen = []

    def opening(path, options, providers):
        seen.append(widening(options))
        return device_module.open_session(path, options, providers)
    with caplog.at_level("INFO", logger="service.inference.engine"):
        Engine(seven_bit_package, device="cpu", intra_op_threads=1, open_session=opening)
        assert seen == [False, False] and "are widened first" not in caplog.text
        Engine(int8_package, device="cpu", intra_op_threads=1, open_session=opening)
        assert seen[2:] == [True, True] and "this CPU has no VNNI" in caplog.text


def test_a_7_bit_package_computes_the_same_without_the_widening_as_with_it(seven_bit_package):
    """The exported graph itself, run both ways: where this CPU's products saturate, the widened session is the exact
    reference (an 8-bit package's encoder differs by up to 0.9 here on an AVX2-only EPYC); elsewhere both are exact.
    And alone or batched, the same translation."""
    ids = Engine(seven_bit_package, device="cpu").source_ids([de for de, _ in pairs64()[:16]], "en")
    width = max(map(len, ids))
    src = np.array([row + [0] * (width - len(row)) for row in ids], dtype=np.int64)
    encoder = str(seven_bit_package / "encoder.onnx")
    widened, fast = (ort.InferenceSession(encoder, session_options(1, int8_weight_bits=b),
                                          providers=["CPUExecutionProvider"]).run(None, {"src_ids": src})
                     for b in (8, 7))
    assert all(np.array_equal(a, b) for a, b in zip(widened, fast))
    engine = Engine(seven_bit_package, device="cpu", intra_op_threads=1)
    texts = [de for de, _ in pairs64()[:12]]
    alone = [engine.translate([t], source_lang="de", target_lang="en", beam_size=4)[0].text for t in texts]
    assert [t.text for t in engine.translate(texts, source_lang="de", target_lang="en", beam_size=4)] == alone


def test_int8_weight_bits_other_than_8_or_7_are_refused_by_the_export_and_the_engine(
        tiny_run, seven_bit_package, tmp_path):
    with pytest.raises(ValueError, match="--int8-weight-bits applies to an int8 package"):
        export_package(tiny_run, tmp_path / "fp32", weight_bits=7)
    with pytest.raises(ValueError, match="weight bits must be one of"):
        export_package(tiny_run, tmp_path / "w6", quantize="int8", weight_bits=6)
    bad = tmp_path / "bad"
    shutil.copytree(seven_bit_package, bad)
    meta = json.loads((bad / "model.json").read_text())
    (bad / "model.json").write_text(json.dumps(meta | {"weight_bits": 6}))
    with pytest.raises(PackageError, match="weight_bits is 6"):
        Engine(bad, device="cpu")


def test_a_target_tag_in_a_clients_text_reads_as_unknown():
    """SentencePiece matches the `<2en>` / `<2de>` tags wherever they stand in a text; in a client's text they
    must not steer the translation: the source holds the request's own tag first and no other."""
    engine = Engine(ROOT / "models" / "de-en", device="cpu")
    tags = set(engine.target_tags.values())
    for text in ("Sag <2de> hallo <2en>", "Sag \uff1c2de\uff1e hallo <2en>"):   # also full-width: NFKC
        (ids,) = engine.source_ids([text], "en")
        assert ids[0] == engine.target_tags["en"] and not tags & set(ids[1:]) and ids.count(engine.unk_id) == 2
    (plain,) = engine.source_ids(["Sag hallo"], "en")
    assert plain[0] == engine.target_tags["en"] and engine.unk_id not in plain
