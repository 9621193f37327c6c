"""Terminology: what a glossary gets kept, and what keeping it costs (issue 51's bar).

The test is built from the Ding test split (data/de-en/test.tsv) and the Ding dictionary's word entries, as WMT
2021's terminology task builds its own: a sentence qualifies when a dictionary entry's German term stands in its
source (glossary.matches' rules) and the entry's English term in its reference (as a whole word), and the
unconstrained translation (beam 4) misses that English term; its glossary is those entries (at most two a
sentence, the longest German terms first). Then:

- term success: the share of those terms present (exact, glossary.held) in the translation with the glossary;
- BLEU and chrF (sacrebleu) of those sentences without and with the glossary;
- cost: Engine.search over the same sentences, length-sorted batches of 32, beam 4, without and with their terms,
  alternating, best of --passes each: constrained ÷ unconstrained CPU seconds;
- the same mechanics on an imported Marian package (a randomly initialised Marian model over models/de-en's
  vocabulary, as the import tests build one): its term success on the same glossaries.

    python benchmarks/terminology.py --out benchmarks/results/terminology.md
"""

from __future__ import annotations

import argparse
import gc
import re
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
from common import ROOT, cpu_facts, describe_cpu

import sacrebleu

from model.corpus.ding import find_ding, read_ding
from service.inference.engine import Engine
from service.shared.constraints import Terms
from service.shared.glossary import Entry, held, matches
from service.shared.options import SearchOptions

BEAM = SearchOptions(beam_size=4)
WORD = re.compile(r"\w+")


def dictionary(path: Path) -> dict[str, list[str]]:
    """German term -> its English terms: Ding's word entries (not its example sentences) of 1-3 words a side,
    4 or more letters, the two sides not the same word."""
    out: dict[str, list[str]] = {}
    for p in read_ding(path):
        if p.sentence or not (1 <= len(p.de.split()) <= 3 and 1 <= len(p.en.split()) <= 3):
            continue
        if len(p.de) < 4 or len(p.en) < 4 or p.de.lower() == p.en.lower() or not WORD.fullmatch(p.de.split()[0]):
            continue
        out.setdefault(p.de, []).append(p.en)
    return out


def candidates(de: str, ref: str, terms: dict[str, list[str]]) -> list[Entry]:
    """The entries whose German term `de` holds and whose English term `ref` holds, longest German term first."""
    words = WORD.findall(de)
    grams = {" ".join(words[i:i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}
    grams |= {g[0].swapcase() + g[1:] for g in grams}
    found = []
    for g in grams:
        for en in terms.get(g, ()):
            if matches(de, [Entry(g, en)]) and held(ref, en):
                found.append(Entry(g, en))
    return sorted(found, key=lambda e: (-len(e.source), e.source, e.target))


def translate(engine: Engine, sentences: list[str], glossaries: list[list[Entry]] | None) -> list[str]:
    """Engine.search in length-sorted batches of 32, each sentence's glossary as its terms (the worker's way)."""
    ids = engine.source_ids(sentences, "en")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [""] * len(ids)
    for start in range(0, len(order), 32):
        idx = order[start:start + 32]
        terms = None
        if glossaries is not None:
            terms = [Terms.of([engine.term_ids(glossaries[i][j].target)
                               for j in matches(sentences[i], glossaries[i])], joiners=engine.joiners)
                     for i in idx]
        for i, hyps in zip(idx, engine.search([ids[i] for i in idx], BEAM, terms=terms)):
            out[i] = engine.detokenize(hyps[0].tokens)
    return out


def build_test(engine: Engine, data: Path, terms: dict[str, list[str]], limit: int):
    """(sources, references, glossaries) of the sentences whose unconstrained translation misses a term."""
    rows = [line.split("\t") for line in data.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    picked = [(de, ref, c) for de, ref, *_ in rows if (c := candidates(de, ref, terms))]
    plain = translate(engine, [de for de, _, _ in picked], None)
    test = []
    for (de, ref, cands), out in zip(picked, plain):
        missed, sources = [], set()
        for e in cands:
            if not held(out, e.target) and e.source not in sources and len(missed) < 2:
                missed.append(e)
                sources.add(e.source)
        if missed:
            test.append((de, ref, missed))
    return [t[0] for t in test], [t[1] for t in test], [t[2] for t in test]


def success(outputs: list[str], glossaries: list[list[Entry]]) -> tuple[int, int]:
    hits = sum(held(o, e.target) for o, g in zip(outputs, glossaries) for e in g)
    return hits, sum(len(g) for g in glossaries)


def cost(engine: Engine, sentences: list[str], glossaries: list[list[Entry]], passes: int) -> tuple[float, float]:
    """Best CPU seconds of `passes` alternating passes: without the terms, with them."""
    best = [float("inf"), float("inf")]
    for _ in range(passes):
        for i, g in enumerate((None, glossaries)):
            t0 = time.process_time()
            translate(engine, sentences, g)
            best[i] = min(best[i], time.process_time() - t0)
    return best[0], best[1]


def marian_success(sources: list[str], glossaries: list[list[Entry]]) -> tuple[int, int]:
    from model.import_marian import import_marian
    with tempfile.TemporaryDirectory() as tmp:
        marian = common.build_marian(Path(tmp) / "marian", ROOT / "models" / "de-en" / "spm.model")
        package = Path(tmp) / "package"
        import_marian(marian, package, source_lang="de", target_lang="en")
        engine = Engine(package, device="cpu", intra_op_threads=1)
        return success(translate(engine, sources, glossaries), glossaries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", type=Path, default=ROOT / "models" / "de-en")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "de-en" / "test.tsv")
    ap.add_argument("--ding", type=Path, default=None, help="the Ding file (default: installed or fetched)")
    ap.add_argument("--sentences", type=int, default=1000, help="test sentences read at most")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--no-marian", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    engine = Engine(args.package, device="cpu", intra_op_threads=1)
    terms = dictionary(find_ding(args.ding, Path.home() / ".cache" / "transerve" / "debs"))
    sources, refs, glossaries = build_test(engine, args.data, terms, args.sentences)
    # The dictionary (259k entries) is the benchmark's, not the service's: left alive, every full collection of
    # the garbage collector walks it, and the constrained search, which makes more small objects, pays more.
    del terms
    gc.collect()
    plain, kept = translate(engine, sources, None), translate(engine, sources, glossaries)
    hits, total = success(kept, glossaries)
    before, after = success(plain, glossaries)[0], hits
    lines = [f"- CPU: {describe_cpu(cpu_facts())}; package {args.package.name} "
             f"({engine.package.meta['precision']}), beam 4, one onnxruntime thread",
             f"- test: {len(sources)} sentences of the first {args.sentences} of {args.data.name} whose beam-4 "
             f"translation misses a Ding term of their reference; {total} terms",
             f"- term success: {after}/{total} = {100 * after / total:.1f}% with the glossary "
             f"(without: {before}/{total})",
             f"- BLEU without / with: {sacrebleu.corpus_bleu(plain, [refs]).score:.2f} / "
             f"{sacrebleu.corpus_bleu(kept, [refs]).score:.2f}; chrF {sacrebleu.corpus_chrf(plain, [refs]).score:.2f}"
             f" / {sacrebleu.corpus_chrf(kept, [refs]).score:.2f}"]
    free, constrained = cost(engine, sources, glossaries, args.passes)
    lines.append(f"- cost, batches of 32: {free:.2f} / {constrained:.2f} CPU s without / with the glossary "
                 f"= {constrained / free:.2f}x (best of {args.passes} alternating passes)")
    if not args.no_marian:
        m_hits, m_total = marian_success(sources, glossaries)
        lines.append(f"- imported Marian package (random weights): term success {m_hits}/{m_total} = "
                     f"{100 * m_hits / m_total:.1f}%")
    examples = [f"  - {s} → {k} (without: {p}; glossary: "
                f"{', '.join(f'{e.source} → {e.target}' for e in g)})"
                for s, p, k, g in list(zip(sources, plain, kept, glossaries))[:8]]
    text = "\n".join(lines + ["- the first examples:"] + examples) + "\n"
    print(text)
    if args.out:
        args.out.write_text(f"# Terminology: glossaries kept by the beam search\n\n`python benchmarks/terminology.py "
                            f"--out {args.out}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{text}",
                            encoding="utf-8")


if __name__ == "__main__":
    main()
