"""What a large glossary costs a request: glossary.matches of 10,000 entries over one sentence, and the worker's
whole making of its constraints (request_terms.sentence_terms: every entry checked and tokenized, then matched;
a second time, the same glossary, kept), CPU ms, models/de-en. Entries: 10,000 distinct ASCII words of
data/de-en/train.tsv (model.data's output).

    python benchmarks/glossary_cost.py
"""

import time

import common  # noqa: F401  (puts the repository on sys.path)
from common import ROOT, cpu_facts, describe_cpu

from service.inference.engine import Engine
from service.inference.request_terms import sentence_terms
from service.shared.glossary import Entry, matches

SENTENCE = "Der Auftrag wurde gestern von der Firma erteilt."


def main() -> None:
    lines = (ROOT / "data" / "de-en" / "train.tsv").read_text(encoding="utf-8").splitlines()
    words = [line.split("\t")[0].split()[0] for line in lines[:40000] if line.strip()]
    entries = list({w: Entry(w, "x" + w.lower()) for w in words
                    if w.isascii() and w.isalpha() and len(w) > 3}.values())[:10000]
    t = time.process_time()
    matches(SENTENCE, entries)
    matched = (time.process_time() - t) * 1000
    engine = Engine(ROOT / "models" / "de-en", device="cpu", intra_op_threads=1)
    made = []
    for _ in range(2):                   # the second request sends the same glossary: request_terms keeps it
        t = time.process_time()
        sentence_terms(engine, [SENTENCE], [(e.source, e.target) for e in entries], 256, keep_spans=True)
        made.append((time.process_time() - t) * 1000)
    print(f"CPU: {describe_cpu(cpu_facts())}\n{len(entries)} entries, one sentence: glossary.matches "
          f"{matched:.1f} ms, request_terms.sentence_terms {made[0]:.0f} ms the first time, {made[1]:.0f} ms "
          "again (CPU)")


if __name__ == "__main__":
    main()
