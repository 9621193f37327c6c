"""Who translates a chunk of segments: the engine in this process (the default: no server), or a running
service through the SDK. Both take a chunk (blank segments included, returned as they are) and return its
translations in order with the number of output tokens (for the progress display)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..inference.engine import Engine
from ..shared.schemas import search_options
from ..shared.text import join_sentences, split_sentences
from .options import BulkOptions


class InProcess:
    """The model package run here by service/inference's Engine, as a translate worker runs it: each segment
    split into sentences (shared/text.py), the sentences of the chunk sorted by length and cut into batches of
    batch_size, the options mapped from POST /translate's fields by shared/schemas.py's search_options."""

    def __init__(self, options: BulkOptions):
        self.engine = Engine(options.model, intra_op_threads=options.threads)
        self.engine.check_direction(options.source_lang, options.target_lang)
        self.target, self.batch_size, self.batch_tokens = options.target_lang, options.batch_size, options.batch_tokens
        # The server caps max_length by its --max-output-tokens; here the model's own length is the cap.
        self.options = search_options(options.search, self.engine.max_positions)

    def translate(self, segments: list[str]) -> tuple[list[str], int]:
        spans, seps, sentences = [], [], []
        for text in segments:
            sents, sep = split_sentences(text) if text.strip() else ([], [])
            spans.append((len(sentences), len(sentences) + len(sents)))
            seps.append(sep)
            sentences.extend(sents)
        ids = [s[: self.engine.max_positions] for s in self.engine.source_ids(sentences, self.target)]
        best: list = [None] * len(ids)
        for batch in batches(ids, self.batch_size, self.batch_tokens):
            for i, hyps in zip(batch, self.engine.search([ids[i] for i in batch], self.options)):
                best[i] = hyps[0]
        out = [join_sentences([self.engine.detokenize(h.tokens) for h in best[a:b]], sep) if b > a else text
               for text, (a, b), sep in zip(segments, spans, seps)]
        return out, sum(len(h.tokens) for h in best)


def batches(ids: list[list[int]], size: int, tokens: int) -> list[list[int]]:
    """Indices of ids sorted by length (a batch pads little), cut at `size` sentences or `tokens` padded source
    tokens, whichever comes first: the encoder's activations grow with sentences x the longest, so the cap keeps
    a chunk of long sentences from costing more memory than one of short ones (a sentence longer than `tokens`
    goes alone). The translations go back in input order: the caller indexes by position."""
    out: list[list[int]] = []
    for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):
        if out and len(out[-1]) < size and (len(out[-1]) + 1) * len(ids[i]) <= tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


class Remote:
    """A running service (--url) through the SDK: the chunk's segments in requests of batch_size texts,
    `concurrency` of them in flight (the service batches them with other clients' and splits sentences
    itself); its retries on 429/503 are the SDK's."""

    def __init__(self, options: BulkOptions):
        from ..client import Client

        self.client = Client(options.url, api_key=options.api_key, timeout=600.0, max_retries=8)
        self.options = options
        self.pool = ThreadPoolExecutor(options.concurrency)

    def _request(self, texts: list[str]):
        o = self.options
        return self.client.translate(texts, source_lang=o.source_lang, target_lang=o.target_lang, **o.search)

    def translate(self, segments: list[str]) -> tuple[list[str], int]:
        todo = [i for i, text in enumerate(segments) if text.strip()]
        groups = [todo[s:s + self.options.batch_size] for s in range(0, len(todo), self.options.batch_size)]
        out, tokens = list(segments), 0
        for group, answer in zip(groups, self.pool.map(self._request, [[segments[i] for i in g] for g in groups])):
            for i, item in zip(group, answer.translations):
                out[i] = item.text
                tokens += item.output_tokens or 0
        return out, tokens

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.client.close()


def translator(options: BulkOptions):
    return Remote(options) if options.url else InProcess(options)
