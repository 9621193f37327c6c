"""What the translation cache (--cache-size) saves a document translated twice: a .docx and a .txt whose 30 distinct
paragraphs (two sentences each, tests/fixtures/pairs64.tsv) are each repeated 10 times, through LibreTranslate's
POST /libretranslate/translate_file on models/de-en, beam 4. Printed for each: the first run's and the second
run's wall time (upload to download) and decoder calls (transerve_step_batch_rows_count on /metrics), on a server
with the cache and on one without (a fresh server each), and whether the four results say the same.

    python benchmarks/translation_cache.py
"""

from __future__ import annotations

import io
import time

import common  # noqa: F401  (puts the repository on sys.path)
from common import ROOT, cpu_facts, describe_cpu, pairs64, service

import docx
import httpx
from prometheus_client.parser import text_string_to_metric_families

REPEATS = 10


def documents() -> dict[str, bytes]:
    german = [de for de, _ in pairs64()]
    paragraphs = [f"{german[i]} {german[i + 30]}" for i in range(30)] * REPEATS
    word = docx.Document()
    for p in paragraphs:
        word.add_paragraph(p)
    out = io.BytesIO()
    word.save(out)
    return {"docx": out.getvalue(), "txt": ("\n".join(paragraphs) + "\n").encode()}


def decoder_calls(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "transerve_step_batch_rows_count")


def translated(url: str, suffix: str, data: bytes) -> tuple[float, float, bytes]:
    """(seconds from upload to download, decoder calls it made, the file)."""
    calls, start = decoder_calls(url), time.perf_counter()
    r = httpx.post(url + "/libretranslate/translate_file", data={"source": "de", "target": "en"},
                   files={"file": (f"doc.{suffix}", data)}, timeout=600)
    r.raise_for_status()
    got = httpx.get(r.json()["translatedFileUrl"], timeout=60)
    got.raise_for_status()
    return time.perf_counter() - start, decoder_calls(url) - calls, got.content


def content(suffix: str, data: bytes) -> list[str] | bytes:
    """What a result says: a .docx's paragraphs (its zip's timestamps differ from run to run), a .txt's bytes."""
    return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs] if suffix == "docx" else data


def main() -> None:
    print(f"CPU: {describe_cpu(cpu_facts())}; models/de-en, beam 4, 30 distinct paragraphs x {REPEATS}, "
          "a fresh server each line")
    for suffix, data in documents().items():
        results = []
        for flag in ("100000", "0"):
            with service([str(ROOT / "models" / "de-en")], ["--cache-size", flag]) as (_, url):
                (s1, c1, out1), (s2, c2, out2) = (translated(url, suffix, data) for _ in range(2))
            results += [content(suffix, out1), content(suffix, out2)]
            print(f".{suffix} --cache-size {flag:>6}: first {s1:6.2f} s ({c1:4.0f} decoder calls), second "
                  f"{s2:6.2f} s ({c2:4.0f} decoder calls): {s1 / s2:5.1f}x")
        print(f".{suffix}: the four results {'the same' if all(r == results[0] for r in results) else 'DIFFER'}")


if __name__ == "__main__":
    main()
