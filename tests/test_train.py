"""Training and evaluation end to end on real sentence pairs (64 Ding sentences, tests/fixtures/pairs64.tsv,
from Debian's trans-de-en, GPL-2+)."""

import json
import os
import random
import re
import resource
import select
import signal
import subprocess
import sys
import time
from contextlib import closing, suppress

import numpy as np
import pytest
import torch

from model import evaluate, train
from model.batching import Example, Prefetcher, TokenArrays, batch_indices, cache_key, collate, collate_ids
from model.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer

from conftest import FIXTURES, ROOT, TINY
from oracles import load_examples, token_batches


def test_tokenizer_has_fixed_special_ids_and_language_tags(tmp_path):
    rows = (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines()
    texts = [line for row in rows for line in row.split("\t")]
    tok = train_tokenizer(texts, tmp_path / "spm", vocab_size=200, languages=["de", "en"])
    sp = tok.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.languages() == ["de", "en"]
    assert tok.lang_id("de") == 4 and tok.lang_id("en") == 5
    with pytest.raises(ValueError, match="no language tag <2fr>"):
        tok.lang_id("fr")
    ids = tok.source_ids("Das geht zu weit.", "en")
    assert ids[0] == tok.lang_id("en") and ids[-1] == EOS_ID
    assert tok.decode(ids) == "Das geht zu weit."
    sentence = "Daran wirst du nicht sterben."
    assert Tokenizer(tmp_path / "spm.model").encode(sentence) == tok.encode(sentence)


def test_tiny_model_overfits_64_pairs_to_bleu_90(tiny_run, data_dir, capsys):
    capsys.readouterr()
    evaluate.main(["--checkpoint", str(tiny_run), "--data", str(data_dir / "test.tsv"), "--beam", "4", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 64
    assert result["greedy"]["bleu"] >= 90, result
    assert result["beam4"]["bleu"] >= 90, result
    assert result["greedy"]["bleu_signature"].startswith("nrefs:1|case:mixed")


def test_training_writes_resumable_checkpoints(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "both", "--max-steps", "6",
                "--eval-every", "0", "--eval-sentences", "4", *TINY])
    first = torch.load(out / "checkpoint.pt", weights_only=False)
    assert first["step"] == 6 and first["directions"] == ["de-en", "en-de"] and first["tagged"]
    capsys.readouterr()
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "both", "--max-steps", "10",
                "--eval-every", "0", "--eval-sentences", "4", *TINY])
    assert "resumed" in capsys.readouterr().out
    second = torch.load(out / "checkpoint.pt", weights_only=False)
    assert second["step"] == 10
    assert any(not torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert {"dev_loss", "bleu_de-en", "bleu_en-de", "step"} <= set(log[-1])


def test_evaluate_rejects_a_direction_the_model_does_not_have(tiny_run, data_dir):
    with pytest.raises(SystemExit, match="translates de-en"):
        evaluate.main(["--checkpoint", str(tiny_run), "--data", str(data_dir / "test.tsv"), "--direction", "en-de"])


@pytest.mark.slow
def test_a_sigterm_to_torchrun_stops_its_cpu_ranks_at_the_next_step(data_dir, tmp_path):
    """A job runner (Kubernetes, `docker stop`, a spot machine's end) sends SIGTERM to torchrun alone, which passes it
    on and kills its ranks 30 s later: CPU ranks must agree to stop at the next step, not at the next 25th (minutes
    at nice 19, where the default's run, so stopped, saved nothing). SIGTERM goes out just past a 25th step, as the
    progress bar shows it; the ranks must stop a few steps on, far short of the next 25th."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "model.train", "--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-every", "0",
           "--eval-sentences", "4", *TINY, "--max-tokens", "300", "--threads", "1", "--max-steps", "100000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    seen, shown, deadline = None, b"", time.monotonic() + 120
    try:
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:            # never blocks past the deadline
                shown += os.read(proc.stdout.fileno(), 65536)
            steps = re.findall(rb"(\d+)/100000 \[", shown[-400:])
            if steps and int(steps[-1]) % 25 in (1, 2, 3, 4) and int(steps[-1]) > 25:
                seen = int(steps[-1])
                os.kill(proc.pid, signal.SIGTERM)                       # torchrun's pid only
        output = (shown + proc.communicate(timeout=120)[0]).decode(errors="replace")
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = re.search(r"SIGTERM: stopped at step (\d+)", output)
    assert seen is not None and stopped, output[-3000:]
    assert seen <= int(stopped.group(1)) <= seen + 12, (seen, stopped.group())
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == int(stopped.group(1))


@pytest.mark.parametrize("stop", ["max-target-tokens", "max-minutes", "max-cpu-minutes", "sigterm", "max-steps"])
def test_torchrun_processes_stop_together(stop, data_dir, tmp_path):
    """Each stop condition is decided by both processes together, so they end together, within a minute, with
    one checkpoint (two processes that train: "device cpu x2"). Before, each counted target tokens from its own
    batches: one reached the budget and left while the other waited in the gradient all-reduce forever, deaf to
    SIGTERM."""
    out, budget = tmp_path / "ddp", 12_000
    limits = {"max-target-tokens": ["--max-target-tokens", str(budget)], "max-minutes": ["--max-minutes", "0.15"],
              "max-cpu-minutes": ["--max-cpu-minutes", "0.1"], "sigterm": [], "max-steps": ["--max-steps", "3"]}[stop]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "model.train", "--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-every", "0",
           "--eval-sentences", "4", *TINY, "--max-tokens", "300", "--threads", "1", *limits]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    children_cpu = children_cpu_seconds()   # after Popen(), which reaps earlier tests' ended children
    try:
        if stop == "sigterm":
            deadline = time.monotonic() + 120
            while not (out / "config.json").exists() and time.monotonic() < deadline:   # both are training
                time.sleep(0.2)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGTERM)              # what a job's end or `docker stop` sends
            started = time.monotonic()
        output = proc.communicate(timeout=180)[0]
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] > 0 and list(out.glob("*.pt.*.tmp")) == [] and "device cpu x2" in output
    if stop == "sigterm":
        assert time.monotonic() - started < 60 and "SIGTERM: stopped at step" in output, output[-3000:]
    else:
        assert proc.returncode == 0, output[-3000:]
        assert "done: step" in output
    if stop == "max-target-tokens":              # summed over both processes, at most 25 steps past the budget
        assert budget <= state["target_tokens"] < budget + 25 * 2 * 300
    if stop == "max-steps":    # before the processes' first sum (every 25 steps): their tokens are counted all the same
        assert state["step"] == 3 and 0 < state["target_tokens"] <= 3 * 2 * 300
    if stop == "max-cpu-minutes":
        # The budget is the run's, both processes' CPU summed: what the two spent beyond a one-step run's start,
        # evaluation and save is the 6 CPU seconds counted (before 2026-12-03 each spent 6 of its own, 12 in all).
        spent = children_cpu_seconds() - children_cpu
        step_cmd = [*cmd[:-2], "--max-steps", "1", "--out", str(tmp_path / "one-step")]
        subprocess.run(step_cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)
        start = children_cpu_seconds() - children_cpu - spent
        assert 6 <= state["cpu_seconds"] < 6 + 6, state["cpu_seconds"]
        assert spent - start < 1.5 * state["cpu_seconds"], (spent, start, state["cpu_seconds"])


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- the flat-array input pipeline against the per-example reference code it replaced -----------------
# (tests/oracles.py's token_batches and load_examples, and model.batching.collate: the code as it was)

def random_examples(n, seed, vocab=300):
    rng = random.Random(seed)
    return [Example([rng.randrange(4, vocab) for _ in range(rng.randint(1, 40))],
                    [rng.randrange(4, vocab) for _ in range(rng.randint(0, 40))]) for _ in range(n)]


def assert_same_batch(new, old):
    for name in ["src", "src_mask", "tgt_in", "tgt_out", "tgt_mask"]:
        a, b = getattr(new, name), getattr(old, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
    assert new.n_tokens == old.n_tokens


@pytest.mark.parametrize("max_tokens", [40, 300, 2000, 25000])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("bucket_size", [100_000, 333])
def test_batch_indices_are_the_per_example_token_batches(max_tokens, shuffle, bucket_size):
    """Same seed, same batches in the same order (a run resumed across the change sees what it would have)."""
    examples = random_examples(2000, seed=max_tokens)
    want = token_batches(examples, max_tokens, shuffle=shuffle, seed=7, bucket_size=bucket_size)
    if max_tokens >= 300:
        assert len(want) < len(examples) / 4                               # the budget really groups rows
    data = TokenArrays.from_examples(examples)
    got = batch_indices(data.src_len, data.tgt_len, max_tokens, shuffle=shuffle, seed=7, bucket_size=bucket_size)
    assert [b.tolist() for b in got] == want


@pytest.mark.parametrize("decoder_only", [False, True])
def test_collate_ids_builds_what_the_per_example_collate_built(decoder_only):
    """Ids, masks (built from the ids at .to(), with transformer.padding_mask/causal_mask) and token counts."""
    examples = random_examples(1500, seed=3) + [Example([5], []), Example([3], [7])]
    data = TokenArrays.from_examples(examples)
    batches = token_batches(examples, 2000, seed=1) + [[1500, 1501], [1501], list(range(1490, 1502))]
    for idx in batches:
        want = collate([examples[i] for i in idx], decoder_only)
        host = collate_ids(data, np.array(idx), decoder_only=decoder_only)
        assert host.n_tokens == want.n_tokens
        assert_same_batch(host.to("cpu"), want)


def tokenizer_for(tmp_path, name="spm", vocab_size=300):
    texts = [c for row in (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines() for c in row.split("\t")]
    return train_tokenizer(texts, tmp_path / name, vocab_size=vocab_size, languages=["de", "en"])


def test_examples_are_those_of_the_per_example_loader(tmp_path):
    """Both directions, tagged or not, a column tokenized once; a two-column line is source<TAB>target
    in either direction (read_pairs), as before; too long pairs left out alike."""
    tok = tokenizer_for(tmp_path)
    rows = [line.split("\t") for line in (FIXTURES / "pairs64.tsv").read_text(encoding="utf-8").splitlines()]
    corpus = tmp_path / "train.tsv"
    corpus.write_text("".join(f"{de}\t{en}\tding\n" if i % 3 else f"{de}\t{en}\n" for i, (de, en) in enumerate(rows)),
                      encoding="utf-8")
    kept = []
    for directions, tagged, max_positions in [([("de", "en"), ("en", "de")], True, 200), ([("en", "de")], False, 200),
                                              ([("de", "en"), ("en", "de")], True, 13)]:
        want = load_examples(corpus, tok, directions, tagged, max_positions)
        assert train.encode_pairs(corpus, tok, directions, tagged, max_positions).examples() == want
        kept.append(len(want))
    assert kept[0] == 2 * kept[1] == 128 and 20 < kept[2] < 100       # 13 pieces leave some pairs out
    lm_corpus = tmp_path / "mono.tsv"
    lm_corpus.write_text("".join(f"de\t{de}\tding\n\nen\t{en} {en} {en}\tding\n" for de, en in rows), encoding="utf-8")
    width = 11
    want = [ids[i:i + width] for ids in tok.encode_batch([t for _, t in train.read_texts(lm_corpus)])
            for i in range(0, len(ids), width) if ids[i:i + width]]
    got = train.encode_lm(lm_corpus, tok, width + 1)
    assert [e.tgt for e in got.examples()] == want and all(e.src == [] for e in got.examples())


def test_token_cache_is_reused_and_rebuilt_when_the_corpus_tokenizer_or_settings_change(tmp_path, monkeypatch):
    tok = tokenizer_for(tmp_path)
    corpus = tmp_path / "train.tsv"
    corpus.write_text((FIXTURES / "pairs64.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    cache = tmp_path / "cache"
    both = [("de", "en"), ("en", "de")]
    builds = []
    encode = train.encode_pairs
    monkeypatch.setattr(train, "encode_pairs", lambda *a, **k: builds.append(1) or encode(*a, **k))

    def load(tokenizer=tok, directions=both, max_positions=200):
        return train.load_token_arrays(corpus, tokenizer, directions, len(directions) > 1, max_positions, cache)

    first, hit = load()
    assert not hit and len(builds) == 1 and len(list(cache.glob("train-*.npz"))) == 1
    second, hit = load()
    assert hit and len(builds) == 1
    assert second.examples() == first.examples() == load_examples(corpus, tok, both, True, 200)

    corpus.write_text(corpus.read_text(encoding="utf-8") + "Hallo Welt\thello world\n", encoding="utf-8")
    third, hit = load()
    assert not hit and len(third) == len(first) + 2
    assert load()[1]

    other = tokenizer_for(tmp_path, "spm2", vocab_size=250)
    fourth, hit = load(other)
    assert not hit and fourth.examples() == load_examples(corpus, other, both, True, 200)
    assert load(other)[1] and load()[1]                     # both tokenizers' entries stay

    assert not load(directions=[("de", "en")])[1]
    assert not load(max_positions=5)[1]
    assert len(builds) == 5

    key = cache_key(corpus, tok.model_file, kind="pairs", directions=["de-en", "en-de"], tagged=True, max_positions=200)
    (cache / f"train-{key[:24]}.npz").write_bytes(b"damaged")
    assert not load()[1] and load()[1] and len(builds) == 6    # a damaged entry is rebuilt
    assert train.load_token_arrays(corpus, tok, both, True, 200, None)[1] is False   # --token-cache none


def test_prefetcher_hands_over_items_in_order_and_the_producers_error():
    with closing(Prefetcher(iter(range(50)), depth=2)) as stream:
        assert list(stream) == list(range(50))

    def failing():
        yield 1
        raise SystemExit("too few batches")

    stream = Prefetcher(failing())
    assert next(stream) == 1
    with pytest.raises(SystemExit, match="too few batches"):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)

    stream = Prefetcher(iter(range(10 ** 9)), depth=2)          # a consumer that stops early
    assert next(stream) == 0
    stream.close()
    assert not stream._thread.is_alive()


def test_a_short_tiny_run_learns_and_caches_its_tokens(data_dir, tmp_path, capsys):
    """Loss falls over 60 steps (dev loss at steps 20, 40, 60), the tokenized corpus lands in the data
    directory's cache, and a second run in a new directory (same tokenizer: training it is
    deterministic) loads it from there."""
    out = tmp_path / "run"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--max-steps", "60",
                "--eval-every", "20", "--eval-sentences", "4", *TINY, "--max-tokens", "400", "--threads", "1"])
    losses = [json.loads(line)["dev_loss"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
    assert list((data_dir / ".token-cache").glob("train-*.npz"))
    capsys.readouterr()
    train.main(["--data", str(data_dir), "--out", str(tmp_path / "again"), "--direction", "de-en", "--max-steps", "2",
                "--eval-every", "0", "--eval-sentences", "4", *TINY, "--threads", "1"])
    assert f"to load from {data_dir / '.token-cache'})" in capsys.readouterr().out


def test_the_schedule_peaks_at_its_peak_after_warmup_and_decays_as_the_papers():
    assert train.lr_at(100, 1e-3, 400) == pytest.approx(2.5e-4)                    # linear warm-up
    assert train.lr_at(400, 1e-3, 400) == pytest.approx(1e-3)                      # the peak
    assert train.lr_at(1600, 1e-3, 400) == pytest.approx(5e-4)                     # 1/sqrt(step)
    d_model, warmup, factor = 256, 4000, 2.0                                       # the paper's form, same values
    peak = factor * d_model ** -0.5 * warmup ** -0.5
    for step in (1, 50, 3999, 4000, 9000):
        paper = factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
        assert train.lr_at(step, peak, warmup) == pytest.approx(paper, rel=1e-12)


def test_each_epoch_keeps_every_long_pair_and_a_share_of_the_short_ones():
    tgt_len = np.array([2, 3, 8, 12, 1, 6, 5] * 2000)
    keep = train.epoch_sample(tgt_len, short_pieces=6, weight=0.25, seed=1)
    long_rows = np.flatnonzero(tgt_len >= 6)
    assert np.isin(long_rows, keep).all()
    short_share = (tgt_len[keep] < 6).sum() / (tgt_len < 6).sum()
    assert 0.22 < short_share < 0.28
    other = train.epoch_sample(tgt_len, short_pieces=6, weight=0.25, seed=2)
    assert not np.array_equal(keep, other)                                         # another share each epoch
    assert train.epoch_sample(tgt_len, 6, 1.0, seed=1) is None                     # every pair
    assert set(train.epoch_sample(tgt_len, 6, 0.0, seed=1)) == set(long_rows)      # sentences only


def test_precision_auto_is_bf16_only_where_the_cpu_has_bf16_instructions(monkeypatch):
    cpu = torch.device("cpu")
    assert train.autocast_dtype("fp32", cpu) is None
    assert train.autocast_dtype("bf16", cpu) == torch.bfloat16
    monkeypatch.setattr(train, "cpu_has_bf16", lambda: False)
    assert train.autocast_dtype("auto", cpu) is None
    monkeypatch.setattr(train, "cpu_has_bf16", lambda: True)
    assert train.autocast_dtype("auto", cpu) == torch.bfloat16
    with pytest.raises(SystemExit, match="use auto, fp32 or bf16"):
        train.autocast_dtype("fp16", cpu)


def test_a_run_stops_at_its_target_token_budget_and_logs_tokens(data_dir, tmp_path):
    out = tmp_path / "budget"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-sentences", "4", *TINY,
                "--max-tokens", "300", "--threads", "1", "--max-target-tokens", "1000", "--eval-every", "0",
                "--precision", "bf16"])
    last = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    assert 1000 <= last["target_tokens"] < 1300 and last["step"] > 1
    assert torch.load(out / "checkpoint.pt", weights_only=False)["target_tokens"] == last["target_tokens"]


def test_a_run_stops_at_its_cpu_time_budget_evaluations_left_out(data_dir, tmp_path):
    """--max-cpu-minutes counts the process's CPU time in training steps: evaluations (here every 5 steps) and
    saves are left out, and a process stopped by SIGSTOP would not spend any; a resumed run counts on from its
    checkpoint's. --shape changes the preset's."""
    out = tmp_path / "cpu"
    started = time.process_time()
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-sentences", "8", *TINY,
                "--max-tokens", "300", "--threads", "1", "--max-cpu-minutes", "0.05", "--eval-every", "5",
                "--shape", "d_ff=128,n_decoder_layers=1"])
    spent = time.process_time() - started
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) > 2 and log[-1]["step"] > 10
    assert [r["cpu_minutes"] for r in log] == sorted(r["cpu_minutes"] for r in log)
    assert 0.05 <= log[-1]["cpu_minutes"] < 0.05 + 0.02           # stopped at the first step past 3 CPU seconds
    assert spent > log[-1]["cpu_minutes"] * 60                     # the evaluations, loading and saves not counted
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["d_model"], model["d_ff"], model["n_encoder_layers"], model["n_decoder_layers"]) == (64, 128, 2, 1)
    # The count is the run's, kept in checkpoint.pt: resumed with a budget of 0.08, it trains 0.03 minutes more
    first = torch.load(out / "checkpoint.pt", weights_only=False)
    assert first["cpu_seconds"] == pytest.approx(log[-1]["cpu_minutes"] * 60, abs=0.6)
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--eval-sentences", "8", *TINY,
                "--max-tokens", "300", "--threads", "1", "--max-cpu-minutes", "0.08", "--eval-every", "5",
                "--shape", "d_ff=128,n_decoder_layers=1"])
    resumed = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()][len(log):]
    assert resumed and first["step"] < resumed[-1]["step"] < 2 * first["step"]   # 0.03 more minutes, not 0.08
    assert 0.08 <= resumed[-1]["cpu_minutes"] < 0.08 + 0.02
    assert torch.load(out / "checkpoint.pt", weights_only=False)["cpu_seconds"] >= 0.08 * 60


def test_shape_overrides_the_presets_fields():
    assert train.parse_shape("d_model=384,h=6, n_encoder_layers=6,n_decoder_layers=2") == {
        "d_model": 384, "h": 6, "n_encoder_layers": 6, "n_decoder_layers": 2}
    assert train.parse_shape("") == {}
    for bad in ["dropout=0", "d_model=x", "d_model", "vocab_size=10"]:
        with pytest.raises(SystemExit, match="--shape"):
            train.parse_shape(bad)


def test_a_run_from_a_package_continues_its_schedule(tiny_package, data_dir, tmp_path):
    """--init-from goes on from the step the package records: the step count, the target tokens and the
    curve continue, and the learning rate climbs back to the schedule's (not to the peak) over --rewarm steps."""
    meta = json.loads((tiny_package / "model.json").read_text())
    step, tokens = meta["training"]["step"], meta["training"]["target_tokens"]
    assert step > 50 and tokens > 0                     # past the tiny run's warm-up
    out = tmp_path / "continued"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--init-from", str(tiny_package),
                *TINY, "--max-steps", str(step + 3), "--rewarm", "4", "--eval-every", "0", "--eval-sentences", "4",
                "--threads", "1"])
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert saved["step"] == step + 3 and saved["target_tokens"] > tokens and saved["rewarm_from"] == step
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == step and rows[-1]["step"] == step + 3       # evaluated where it resumed, and at the end
    peak, warmup = float(TINY[TINY.index("--lr") + 1]), 50
    lrs = [train.lr_at(s, peak, warmup, step, 4) for s in range(step + 1, step + 6)]
    assert lrs[:4] == sorted(lrs[:4]) and lrs[3] == train.lr_at(step + 4, peak, warmup) < peak / 2
    assert saved["optimizer"]["param_groups"][0]["lr"] == train.lr_at(step + 3, peak, warmup, step, 4)


def test_a_cooldown_falls_linearly_to_zero_at_max_steps(tiny_package, data_dir, tmp_path):
    """--cooldown N: the schedule as before up to max_steps - N, then a straight line from its rate there to 0 at
    --max-steps, where the run ends; without --max-steps there is no end to fall to."""
    peak, warmup = 1e-3, 400
    base = train.lr_at(1000, peak, warmup)
    assert train.lr_at(999, peak, warmup, end=1100, cooldown=100) == train.lr_at(999, peak, warmup)
    assert [train.lr_at(s, peak, warmup, end=1100, cooldown=100) for s in (1000, 1050, 1075, 1100)] == \
        pytest.approx([base, base / 2, base / 4, 0.0])
    # A branch from a package that records step 1000 (Adam afresh, --rewarm 20) inside its cooldown: the ramp
    # and the line multiply, so it learns from its second step and still ends at 0.
    ramped = [train.lr_at(s, peak, warmup, 1000, 20, end=1100, cooldown=100) for s in (1000, 1010, 1020, 1050)]
    assert ramped == pytest.approx([0.0, base * 0.9 / 2, base * 0.8, base / 2])
    for bad in (["--cooldown", "10"], ["--cooldown", "10", "--max-steps", "5"], ["--cooldown", "-1"]):
        with pytest.raises(SystemExit, match="--max-steps"):
            train.parse_args(["--data", str(data_dir), "--out", str(tmp_path / "x"), *bad])
    step = json.loads((tiny_package / "model.json").read_text())["training"]["step"]
    out = tmp_path / "cooled"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--init-from", str(tiny_package),
                *TINY, "--max-steps", str(step + 4), "--cooldown", "4", "--rewarm", "0", "--eval-every", "0",
                "--eval-sentences", "4", "--threads", "1"])
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert saved["step"] == step + 4 and saved["optimizer"]["param_groups"][0]["lr"] == 0.0


def test_a_run_can_start_from_a_model_packages_weights(tiny_package, data_dir, tmp_path):
    """--init-from reads the weights back out of the package's graphs and takes its tokenizer; with a zero
    learning rate the saved weights are the package's."""
    from model.upgrade import load_weights

    out = tmp_path / "from-package"
    train.main(["--data", str(data_dir), "--out", str(out), "--direction", "de-en", "--init-from", str(tiny_package),
                *TINY, "--lr", "0", "--max-steps", "1", "--eval-every", "0", "--eval-sentences", "4",
                "--threads", "1"])
    assert (out / "spm.model").read_bytes() == (tiny_package / "spm.model").read_bytes()
    saved = torch.load(out / "checkpoint.pt", weights_only=False)["model"]
    expected = load_weights(tiny_package)[0].state_dict()
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
