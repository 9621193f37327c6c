"""The decoding engine: a model package run by onnxruntime, without torch.

    engine = Engine("models/de-en")                       # CUDA when there is a GPU, else CPU
    engine.translate(["Das geht zu weit."], source_lang="de", target_lang="en", beam_size=4)
    lm = Engine("models/lm-small")                         # a package with task "generation"
    lm.generate(["Die Datei wird"], max_new_tokens=20, temperature=0.8, seed=1)

Layers, so the HTTP service can split the work across LitServe's hooks:

- `load_package()` reads `model.json`, checks every file against its sha256, and says which file
  is missing or corrupt;
- `Engine.source_ids()` / `Engine.detokenize()` (tokenizer, host side);
- `Engine.search(src_ids, options)` (arrays only: encoder once per batch, then the decoder step
  by step under `service.shared.search`'s decode()).

Where the graphs run is service/inference/device.py's (providers, the sessions); how a graph of each layout is
stepped and which layouts are refused, service/inference/decoders.py's; the memory of the caches,
service/inference/device_memory.py's.
"""

from __future__ import annotations

import json
import logging
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generator, Sequence

import numpy as np
import onnxruntime as ort
import sentencepiece as spm

from .decoders import DecoderGraph, OrtDecoder, OrtLmDecoder, SearchIds, columns_for
from .device import SessionFactory, open_session, pick_providers, running_device
from .device import session_options, widens_int8
from .device_memory import BlockPool, Tensors
from .lm_batch import LmBatch
from .onnxruntime_bridge import Binder
from .running_batch import Encoded, RunningBatch
from ..shared.constraints import Terms
from ..shared.kept_spans import QUOTES
from ..shared.options import GENERATION_MAX_NEW_TOKENS, GENERATION_MIN_LENGTH, SearchOptions
from ..shared.package import ModelPackage, PackageError, load_package, weight_bits
from ..shared.search import Hypothesis, Search, Step, continuation_budgets, decode, finish, max_lengths

log = logging.getLogger(__name__)
# Engine.generate_steps: a Step per decoder call, then one Hypothesis per prompt (or a list: beam search).
Steps = Generator[Step, None, list]


@dataclass
class Translation:
    text: str
    score: float
    tokens: int                                   # output pieces, eos excluded
    alternatives: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class Generation:
    text: str                                     # the continuation only, as streamed
    tokens: int                                   # generated pieces, eos excluded
    finish_reason: str                            # "stop" (eos or a stop sequence), "length" or "cancelled"
    score: float = 0.0                            # sum of log-probs of the generated pieces


class Engine:
    """A loaded model package: tokenizer and onnxruntime sessions (encoder and decoder for
    translation, the decoder alone for generation). `open_session` makes the sessions (service/inference/device.py's
    open_session; a benchmark may pass its own)."""

    # Called after every encoder run with its start and end (time.time_ns()) and its rows: the worker's traces
    # time the encoder apart from the search around it (service/worker/traces.py); None: nothing is told.
    on_encode: Callable[[int, int, int], None] | None = None

    def __init__(self, package: str | Path | ModelPackage, *, device: str = "auto", intra_op_threads: int = 0,
                 inter_op_threads: int = 1, spin_wait: bool = False, verify: bool = True,
                 open_session: SessionFactory = open_session):
        self.package = package if isinstance(package, ModelPackage) else load_package(package, verify=verify)
        meta = self.package.meta
        self.task: str = meta.get("task", "translation")
        if self.task not in ("translation", "generation"):
            raise PackageError(f"{self.package.path / 'model.json'}: task {self.task!r}; "
                               "this engine serves translation and generation packages")
        # The decoder class of this package's graph layout, which refuses other layouts.
        self.layout = OrtDecoder if self.task == "translation" else OrtLmDecoder
        bits = weight_bits(self.package)
        self._open_sessions(device, session_options(intra_op_threads, inter_op_threads, spin_wait=spin_wait,
                                                    int8_weight_bits=bits), open_session)
        self.layout.check_layout(self.package, [i.name for i in self.decoder.get_inputs()])
        self.float_dtype = np.float16 if meta["precision"] == "fp16" else np.float32
        self.pool = BlockPool(self.float_dtype, self.device_type)   # the cache's and the encoder outputs' memory
        self.host = Binder("cpu")                                    # for what the searches read on the host
        self.graph = DecoderGraph.read(self.package, self.decoder, self.encoder, self.pool, self.host)
        self.past_names, self.h, self.d_k = self.graph.past_names, self.graph.h, self.graph.d_k
        self._note_the_device(bits)
        self.search_top_k = True               # False: searches read the whole distribution (for comparisons)
        self._load_tokenizers(meta["tokenizer"])
        ids = meta["special_ids"]
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        self.unk_id = ids.get("unk", 1)
        self.target_tags: dict[str, int] = meta.get("target_tags", {})
        # SentencePiece matches its user-defined symbols (the target tags) wherever they stand in a text, after its
        # NFKC normalisation ("＜2de＞" too), so a text holding one would steer its own translation: in a client's
        # text they read as unknown (`_encode`, by id).
        self._tag_ids = frozenset(self.target_tags.values()) if self.vocab is None else frozenset()
        # Never shown in a translation (as skip_special_tokens does): special ids and language tags.
        self.hidden_ids = {self.pad_id, self.bos_id, self.eos_id, self.unk_id, *self.target_tags.values()}
        self.directions: list[str] = meta["directions"]
        self.max_positions: int = self.package.config["max_len"]
        # Tags never appear in output: a model that wrote one would be writing nonsense. Nor does a generated text's
        # unknown piece, which its text would show as SentencePiece's " ⁇ " (a translation hides it: hidden_ids).
        self.banned_ids = [self.pad_id, self.bos_id, *self.target_tags.values(),
                           *([self.unk_id] if self.task == "generation" else [])]
        self.languages: list[str] = meta.get("languages", [])
        # The target pieces that continue the word before them: a glossary's term ends where a word does
        # (service/shared/constraints.py's Terms).
        pieces = self.id_pieces if self.vocab is not None else [
            "" if self.sp_target.is_control(i) or self.sp_target.is_unknown(i) else self.sp_target.id_to_piece(i)
            for i in range(self.sp_target.get_piece_size())]
        self.joiners = np.array([p[:1].isalnum() for p in pieces], dtype=bool)
        self._characters = frozenset(c for p in pieces for c in p.replace("▁", ""))
        self._writable: dict[str, bool] = {}
        # What each piece adds to a generated text, so streamed pieces concatenate to the full text.
        self.piece_texts = [("" if self.sp.is_control(i) else " ⁇ " if self.sp.is_unknown(i)
                             else self.sp.id_to_piece(i).replace("▁", " "))
                            for i in range(self.sp.get_piece_size())]

    def _note_the_device(self, bits: int) -> None:
        """What serving this package on this device costs, said once at load."""
        if self.device_type == "cuda" and self.task == "translation":
            self._note_cuda_translation()
        if self.device_type == "cpu" and self.package.meta["precision"] == "int8" and widens_int8(bits):
            log.info("model %s: this CPU has no VNNI, so its 8-bit int8 products are widened first to stay exact "
                     "(int8 ran 13-23%% faster without it on an AVX2-only EPYC); a package exported with "
                     "--int8-weight-bits 7 needs no widening (docs/training.md)", self.package.name)

    def _note_cuda_translation(self) -> None:
        """What is known of this translation package's answers and speed on CUDA (benchmarks/results/gpu-h200.md)."""
        path = self.package.path
        if not self.graph.host_total:
            log.warning("%s computes its self-attention's total length in the decoder graph, which onnxruntime's "
                        "CUDA kernel reads wrongly (log-probs off by up to 16 on an H200, onnxruntime 1.31.1: "
                        "benchmarks/results/gpu-h200.md): its translations on CUDA are wrong. Re-export it with "
                        "python -m model.upgrade (a package made by model.import_marian: import it again), or "
                        "serve it with --device cpu", path)
        else:
            log.warning("%s on CUDA: its decoder agrees with the CPU's step by step (benchmarks/cuda_ops.py, H200), "
                        "but whole searches on CUDA have not yet been compared with the CPU's since the fix of "
                        "2026-12-04 (benchmarks/cuda_agreement.py does): check before relying on them", path)
        if self.float_dtype == np.float32:
            log.warning("%s is fp32: onnxruntime's GroupQueryAttention has CUDA kernels for fp16 only, so the "
                        "decoder's self-attention runs on the CPU and its cache crosses to the host every step; "
                        "export with --fp16 for the GPU", path)

    def _open_sessions(self, device: str, so: ort.SessionOptions, open_session: SessionFactory) -> None:
        self.providers = pick_providers(device)
        try:
            self.encoder = (open_session(str(self.package.file("encoder.onnx")), so, self.providers)
                            if self.task == "translation" else None)
            self.decoder = open_session(str(self.package.file("decoder.onnx")), so, self.providers)
        except Exception as e:  # onnxruntime raises several types for unreadable graphs
            raise PackageError(f"{self.package.path}: onnxruntime cannot load the graphs ({e})") from None
        self.device_type = running_device(self.decoder, device, self.providers)
        self.providers = self.decoder.get_providers()

    def _load_tokenizers(self, tk: dict) -> None:
        self.sp = spm.SentencePieceProcessor(model_file=str(self.package.file(tk["source"])))
        self.sp_target = (self.sp if tk.get("target", tk["source"]) == tk["source"]
                          else spm.SentencePieceProcessor(model_file=str(self.package.file(tk["target"]))))
        # Our packages use SentencePiece ids as model ids. Imported Marian packages have their own id
        # space (vocab.json: piece -> id, shared by separate source and target SentencePiece models).
        self.vocab: dict[str, int] | None = None
        if tk.get("vocab"):
            try:
                self.vocab = json.loads(self.package.file(tk["vocab"]).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise PackageError(f"{self.package.file(tk['vocab'])}: not a readable vocabulary ({e})") from None
            self.id_pieces = [""] * (max(self.vocab.values()) + 1)
            for piece, i in self.vocab.items():
                self.id_pieces[i] = piece

    # --- host side: text <-> ids -------------------------------------------------------------------
    def check_direction(self, source_lang: str, target_lang: str) -> None:
        if f"{source_lang}-{target_lang}" not in self.directions:
            raise ValueError(f"{self.package.name} translates {', '.join(self.directions)}, "
                             f"not {source_lang}-{target_lang}")

    def source_ids(self, texts: Sequence[str], target_lang: str) -> list[list[int]]:
        """Encoder inputs: the target tag when the model is multi-directional, pieces, eos."""
        tag = [self.target_tags[target_lang]] if self.target_tags else []
        if self.vocab is not None:
            unk, vocab = self.unk_id, self.vocab
            return [tag + [vocab.get(p, unk) for p in pieces] + [self.eos_id]
                    for pieces in self._encode(texts, str)]
        return [tag + ids + [self.eos_id] for ids in self._encode(texts, int)]

    def _encode(self, texts: Sequence[str], out_type: type) -> list[list]:
        """Each text's pieces, one text a call: SentencePiece's list form starts a thread pool a call, which cost a
        one-sentence request 45-60 us of CPU and 0.5-0.8 ms of wall time on a busy 2-core machine, against 4.5 us
        for the text alone; a worker's engine wants those cores anyway."""
        encoded = [self.sp.encode(t, out_type=out_type) for t in texts]
        if self._tag_ids and out_type is int:                       # (none in an imported Marian package's)
            for i, ids in enumerate(encoded):
                if not self._tag_ids.isdisjoint(ids):
                    encoded[i] = [self.unk_id if x in self._tag_ids else x for x in ids]
        return encoded

    def term_ids(self, term: str) -> list[int]:
        """A target-side term's ids as the model would write it inside a sentence (after a space: SentencePiece's
        "▁" on its first piece); ids the target vocabulary lacks read as unknown."""
        if self.vocab is not None:
            unk = self.unk_id
            return [self.vocab.get(p, unk) for p in self.sp_target.encode(term, out_type=str)]
        return self.sp_target.encode(term, out_type=int)

    def writable(self, ch: str) -> bool:
        """Whether the model can write the character ch (its target pieces hold it, after SentencePiece's NFKC and
        the quotes kept_spans.QUOTES reads as ASCII): what it cannot comes back as written (kept_spans.py)."""
        ok = self._writable.get(ch)
        if ok is None:
            ok = self._writable[ch] = all(c in self._characters
                                          for c in unicodedata.normalize("NFKC", ch.translate(QUOTES)))
        return ok

    def detokenize(self, ids: Sequence[int]) -> str:
        """Target ids -> text; special ids and language tags are dropped (as skip_special_tokens does)."""
        ids = [i for i in ids if i not in self.hidden_ids]
        if self.vocab is not None:
            # As MarianTokenizer does: pieces the target model lacks keep their "▁", which becomes a space.
            return self.sp_target.decode_pieces([self.id_pieces[i] for i in ids]).replace("▁", " ").strip()
        return self.sp_target.decode(ids)

    # --- device side: arrays only ---------------------------------------------------------------------
    def encode(self, src: np.ndarray) -> Tensors:
        """src (B, S) int64 padded -> the decoder's cross_* inputs (each layer's cross-attention keys and
        values, (B, h, S, d_k) each), left where the model runs. `close()` the result when done."""
        t0 = time.time_ns()
        io = self.encoder.io_binding()
        io.bind_cpu_input("src_ids", src)
        cross = Tensors(self.pool, self.graph.cross_names, [src.shape[0], self.h, src.shape[1], self.d_k])
        cross.bind_outputs(io)
        self.encoder.run_with_iobinding(io)
        if self.on_encode is not None:
            self.on_encode(t0, time.time_ns(), src.shape[0])
        return cross

    def search(self, src_ids: Sequence[Sequence[int]], options: SearchOptions,
               seeds: Sequence[int | None] | None = None,
               terms: Sequence[Terms | None] | None = None) -> list[list[Hypothesis]]:
        """Decodes one padded batch; for each source its hypotheses, best first. terms: each source's
        constraints (service/shared/constraints.py: term_ids() makes them) or None."""
        return finish(self.search_steps(src_ids, options, seeds, terms))

    def search_steps(self, src_ids: Sequence[Sequence[int]], options: SearchOptions,
                     seeds: Sequence[int | None] | None = None, terms: Sequence[Terms | None] | None = None
                     ) -> Generator[object, None, list[list[Hypothesis]]]:
        """search() one decoder call at a time: the encoder runs at the first next(), then each next()
        runs one decoder step; the return value is search()'s. The caller may run other searches between
        the steps (the translate worker does, so a small request need not wait for a large one's batch):
        each search has its own cache, so its answer is the same. Closing it early hands its blocks back."""
        B = len(src_ids)
        width = columns_for(max(len(s) for s in src_ids))    # as OrtLmDecoder's cache, for the same reason
        src = np.full((B, width), self.pad_id, dtype=np.int64)
        for i, s in enumerate(src_ids):
            src[i, :len(s)] = s
        limits = max_lengths([len(s) for s in src_ids], a=options.max_length_a, b=options.max_length_b,
                             cap=min(options.max_length, self.max_positions))
        decoder = OrtDecoder(self.graph, self.encode(src), src != self.pad_id, max_positions=int(max(limits)) + 1,
                             max_rows=B * options.rows_per_input, top_k=self.search_top_k)
        try:
            # Greedy search and sampling yield their Steps too: the caller ignores them.
            return (yield from decode(decoder, B, options, bos_id=self.bos_id, eos_id=self.eos_id, max_length=limits,
                                      banned_ids=self.banned_ids, seeds=seeds, terms=terms))
        finally:
            decoder.close()

    def running_batch(self, group: int) -> RunningBatch:
        """An empty batch for searches that share each decoder call (RunningBatch.join of encode_sources()' output),
        each with `group` rows per source (SearchOptions.rows_per_input: its beams): the translate worker's."""
        return RunningBatch(self.graph, group, SearchIds(self.bos_id, self.eos_id, tuple(self.banned_ids),
                                                         self.search_top_k))

    def encode_sources(self, src_ids: Sequence[Sequence[int]], options: SearchOptions) -> Encoded:
        """`src_ids` encoded in one call (padded to a multiple of COLUMNS_STEP: each source's encoder outputs are
        its own, batched or not), with their lengths and output budgets under `options`: what a RunningBatch
        joins."""
        lengths = np.array([len(s) for s in src_ids], dtype=np.int64)
        src = np.full((len(src_ids), columns_for(int(lengths.max()))), self.pad_id, dtype=np.int64)   # (B, S)
        for i, s in enumerate(src_ids):
            src[i, :len(s)] = s
        limits = max_lengths(lengths, a=options.max_length_a, b=options.max_length_b,
                             cap=min(options.max_length, self.max_positions))
        return Encoded(self.encode(src), lengths, limits)

    # --- generation (decoder-only packages) -------------------------------------------------------------
    def prompt_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Decoder inputs: bos, then the prompt's pieces (an empty prompt is bos alone)."""
        return [[self.bos_id] + ids for ids in self._encode(texts, int)]

    def piece_text(self, ids: Sequence[int]) -> str:
        return "".join(self.piece_texts[i] for i in ids)

    def generate_steps(self, prompts: Sequence[Sequence[int]], options: SearchOptions, *,
                       seeds: Sequence[int | None] | None = None, cancel: set[int] | None = None) -> Steps:
        """Continues each prompt (ids from prompt_ids); yields a Step per decoder call and returns the
        hypotheses (one per prompt, or num_hypotheses with beam search, which yields no steps).
        options.max_length counts generated tokens, eos included."""
        if self.task != "generation":
            raise ValueError(f"{self.package.name} is a {self.task} package; generation needs a decoder-only one")
        N = len(prompts)
        budget = continuation_budgets(prompts, max_length=options.max_length, max_positions=self.max_positions)
        decoder = OrtLmDecoder(self.graph, prompts, max_rows=N * options.rows_per_input,
                               max_new_positions=max(budget) + 1, top_k=self.search_top_k)
        search = decode(decoder, N, options, bos_id=self.bos_id, eos_id=self.eos_id, max_length=budget,
                        banned_ids=self.banned_ids, start_tokens=decoder.start_tokens, seeds=seeds, cancel=cancel)
        if options.strategy != "beam":
            return _closing(decoder, _one_each(search))
        try:
            return _no_steps(finish(search))
        finally:
            decoder.close()

    def generation_batch(self) -> LmBatch:
        """An empty running batch for generation searches that share each decoder call (LmBatch.join of
        prompt_ids()' output): the generate worker's."""
        if self.task != "generation":
            raise ValueError(f"{self.package.name} is a {self.task} package; generation needs a decoder-only one")
        return LmBatch(self.graph, SearchIds(self.bos_id, self.eos_id, tuple(self.banned_ids), self.search_top_k),
                       max_positions=self.max_positions)

    def generate(self, texts: Sequence[str], *, max_new_tokens: int = GENERATION_MAX_NEW_TOKENS,
                 **options) -> list[Generation]:
        """Continues each text (best hypothesis). Options: see SearchOptions; e.g. sampling=True, seed=1.
        min_length defaults to 0 here, as the generation API's min_new_tokens: a continuation may stop at once."""
        opts = SearchOptions(**{"min_length": GENERATION_MIN_LENGTH} | options | {"max_length": max_new_tokens + 1})
        prompts = self.prompt_ids(texts)
        hyps = finish(self.generate_steps(prompts, opts))
        out = []
        for h in hyps:
            best = h[0] if isinstance(h, list) else h
            reason = "length" if len(best.tokens) >= max_new_tokens else "stop"
            out.append(Generation(self.piece_text(best.tokens), len(best.tokens), reason, best.log_prob))
        return out

    # --- convenience: text in, text out ---------------------------------------------------------------
    def translate(self, texts: Sequence[str], *, source_lang: str, target_lang: str,
                  batch_size: int = 32, **options) -> list[Translation]:
        """Translates texts in length-sorted batches. Options: see SearchOptions."""
        self.check_direction(source_lang, target_lang)
        opts = SearchOptions(**options)
        ids = [s[: self.max_positions] for s in self.source_ids(texts, target_lang)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[Translation | None] = [None] * len(ids)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            for i, hyps in zip(idx, self.search([ids[i] for i in idx], opts)):
                best = hyps[0]
                out[i] = Translation(self.detokenize(best.tokens), best.score, len(best.tokens),
                                     [(self.detokenize(h.tokens), h.score) for h in hyps[1:]])
        return out  # type: ignore[return-value]


def _closing(decoder: OrtLmDecoder, steps: Steps) -> Steps:
    """`steps`, then the decoder's blocks handed back, also when the caller stops early (close(), or
    dropping the generator, runs this finally). A generator closed before its first step never
    entered the try: its blocks go to the garbage collector rather than back to the pool."""
    try:
        return (yield from steps)
    finally:
        decoder.close()


def _one_each(search: Search) -> Steps:
    """A greedy search's or sampling's Steps, returning each prompt's one Hypothesis (as the API streams them)."""
    return [hyps[0] for hyps in (yield from search)]


def _no_steps(result):
    """A Steps generator that yields nothing and returns `result` (beam search does not stream)."""
    return result
    yield  # unreachable: its presence makes this a generator
