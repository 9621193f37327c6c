"""Who translates a chunk of segments: the engine in this process (the default: no server), or a running
service through the SDK. Both take a chunk (blank segments included, returned as they are) and return its
translations in order with the number of output tokens (for the progress display). Both keep --glossary's terms:
in-process as the translate worker keeps a request's glossary, through a service as POST /translate's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..inference.engine import Engine
from ..inference.request_terms import glossary_ids, sentence_terms
from ..shared.glossary import GlossaryError
from ..shared.schemas import search_options
from ..shared.text import join_sentences, split_sentences
from .options import BulkOptions


class InProcess:
    """The model package run here by service/inference's Engine, as a translate worker runs it: each segment
    split into sentences (shared/text.py), its spans kept as written and its glossary terms made constraints as the
    worker makes them (inference/request_terms.py), the sentences of the chunk sorted by length and cut into batches
    of batch_size, the options mapped from POST /translate's fields by shared/schemas.py's search_options."""

    def __init__(self, options: BulkOptions):
        self.engine = Engine(options.model, intra_op_threads=options.threads)
        self.engine.check_direction(options.source_lang, options.target_lang)
        self.target, self.batch_size, self.batch_tokens = options.target_lang, options.batch_size, options.batch_tokens
        # The server caps max_length by its --max-output-tokens; here the model's own length is the cap.
        self.options = search_options(options.search, self.engine.max_positions)
        self.glossary = [(e.source, e.target) for e in options.glossary_entries] or None
        if self.glossary:                  # every entry checked now: exit 2 before the output is opened
            try:
                glossary_ids(self.engine, self.glossary, self.options.max_length)
            except GlossaryError as e:
                raise ValueError(f"--glossary {options.glossary}: {e}") from None

    def translate(self, segments: list[str]) -> tuple[list[str], int]:
        spans, seps, sentences = [], [], []
        for text in segments:
            sents, sep = split_sentences(text) if text.strip() else ([], [])
            spans.append((len(sentences), len(sentences) + len(sents)))
            seps.append(sep)
            sentences.extend(sents)
        st = sentence_terms(self.engine, sentences, self.glossary, self.options.max_length, keep_spans=True,
                            beam=self.options.strategy == "beam")
        ids = [s[: self.engine.max_positions] for s in self.engine.source_ids(st.texts, self.target)]
        best: list = [None] * len(ids)
        for batch in batches(ids, self.batch_size, self.batch_tokens):
            some = [st.terms[i] for i in batch]
            for i, hyps in zip(batch, self.engine.search([ids[i] for i in batch], self.options,
                                                         terms=None if all(t is None for t in some) else some)):
                best[i] = hyps[0]
        said = [k.restore(self.engine.detokenize(h.tokens)) for k, h in zip(st.kept, best)]
        out = [join_sentences(said[a:b], sep) if b > a else text for text, (a, b), sep in zip(segments, spans, seps)]
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


RETRY_WAIT_S = 120.0     # --url: the longest Retry-After a request waits for before the run stops (resumable)


class Remote:
    """A running service (--url) through the SDK: the chunk's segments in requests of batch_size texts,
    `concurrency` of them in flight (the service batches them with other clients' and splits sentences
    itself); its retries on 429/503 are the SDK's."""

    def __init__(self, options: BulkOptions):
        from ..client import Client

        # A run of hours waits out a key's minute (a 429's Retry-After up to 60 s), not a day's limit.
        self.client = Client(options.url, api_key=options.api_key, timeout=600.0, max_retries=8,
                             max_retry_wait_s=RETRY_WAIT_S)
        self.options = options
        self.glossary = [(e.source, e.target) for e in options.glossary_entries] or None
        self.pool = ThreadPoolExecutor(options.concurrency)
        if self.glossary:
            self._check_glossary()

    def _check_glossary(self) -> None:
        """The service checks every entry of a request's glossary, whatever its texts hold: one short request now,
        so that a glossary it refuses (a term the model cannot write, too many entries) is told, exit 2, before the
        output is opened. Another refusal (of "." itself) is left to the run's own requests, as without one."""
        from ..client import BadRequestError

        try:
            self._request(["."])
        except BadRequestError as e:
            if e.type == "invalid_glossary" or "glossary" in e.message:
                self.close()
                o = self.options
                raise ValueError(f"{o.url} refused --glossary {o.glossary}: {e.message}") from None

    def _request(self, texts: list[str]):
        o = self.options
        return self.client.translate(texts, source_lang=o.source_lang, target_lang=o.target_lang,
                                     glossary=self.glossary, **o.search)

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
