"""The bulk command's options: one dataclass, and the search options made from POST /translate's schema, so
each is defined once (name, default, range and description in shared/schemas.py's TranslateRequest)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, get_args

from pydantic import ValidationError

from ..shared.glossary import Entry, GlossaryError, parse
from ..shared.options import DEFAULTS
from ..shared.schemas import SEARCH_FIELDS, TranslateRequest


@dataclass
class BulkOptions:
    """What `transerve translate` was asked to do."""
    input: str = "-"                    # a path, or "-": standard input
    output: str = "-"                   # a path, or "-": standard output (no --resume then)
    format: str = "txt"                 # txt | tsv | csv | jsonl | po (guessed from the input's suffix)
    column: str = "1"                   # tsv/csv: the column translated, 1-based or a header name
    header: bool = False                # tsv/csv: the first row is a header, copied as it is
    field: str = "text"                 # jsonl: the field translated (the name shadows dataclasses.field here)
    to_field: Optional[str] = None      # jsonl: written there instead (the source kept); None = in place
    source_lang: str = "de"
    target_lang: str = "en"
    model: str = "models/de-en"         # the package run in this process (ignored with --url)
    url: Optional[str] = None           # a running service: sent there through the SDK instead
    api_key: Optional[str] = None
    concurrency: int = 4                # --url: requests in flight at once
    threads: int = 0                    # in-process: onnxruntime's intra-op threads; 0 = its default (all cores)
    chunk: int = 1024                   # segments read, sorted and written at a time: the memory bound
    batch_size: int = 32                # sentences per engine batch (Engine.translate's) or per request
    batch_tokens: int = 2048            # in-process: padded source tokens per engine batch at most (the memory)
    resume: bool = False                # go on where a stopped run left its output
    progress: str = "auto"              # auto (a bar on a terminal, lines otherwise) | bar | lines | off
    # POST /translate's fields that were given (the others take the schema's defaults)
    search: dict = dataclasses.field(default_factory=dict)
    glossary: Optional[str] = None      # a DeepL glossary file (.tsv or .csv); None = none
    glossary_entries: list[Entry] = dataclasses.field(default_factory=list)   # its entries, read by read_options


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """--beam-size, --length-penalty, ...: one per SEARCH_FIELDS entry, typed, described and defaulted by the
    schema, so the command cannot drift from the API."""
    group = parser.add_argument_group("search (as POST /translate's fields)")
    for name in SEARCH_FIELDS:
        info = TranslateRequest.model_fields[name]
        kind = next(t for t in (info.annotation, *get_args(info.annotation)) if t in (int, float))
        # A field without a fixed default says in its description what it is then (max_length: from the source).
        described = info.description if info.default is None else f"{info.description} (default: {info.default})"
        group.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=described)


def search_fields(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The search fields given on the command line, checked by the schema itself (ranges, beam and
    alternatives)."""
    given = {name: getattr(args, name) for name in SEARCH_FIELDS if getattr(args, name) is not None}
    try:
        return checked_search(given, args.source_lang, args.target_lang)
    except ValueError as e:
        parser.error(str(e))


def checked_search(given: dict, source_lang: str, target_lang: str) -> dict:
    """POST /translate's search fields as given (the others keep the schema's defaults), checked by the schema:
    the command line and the Ray Data class (ray_bridge.py) both go through here. ValueError names each
    field refused and why, or a name that is no search field."""
    unknown = sorted(set(given) - set(SEARCH_FIELDS))
    if unknown:
        raise ValueError(f"not search options: {', '.join(unknown)} (they are: {', '.join(SEARCH_FIELDS)})")
    try:
        TranslateRequest(text="x", source_lang=source_lang, target_lang=target_lang, **given)
    except ValidationError as e:
        raise ValueError("; ".join(f"{'.'.join(map(str, err['loc'])) or 'options'}: {err['msg']}"
                                   for err in e.errors())) from None
    return dict(given)


def glossary_entries(path: Optional[str], search: dict, parser: argparse.ArgumentParser) -> list[Entry]:
    """--glossary's entries ([] without it), or the parser's error (exit 2): for greedy search, which cannot keep
    terms, and for a file read_glossary refuses."""
    if path is None:
        return []
    if search.get("beam_size", DEFAULTS.beam_size) < 2:
        parser.error(f"--glossary: its terms are kept by beam search, which needs --beam-size 2 or more (the default "
                     f"is {DEFAULTS.beam_size})")
    try:
        return read_glossary(path)
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"--glossary {path}: {e.strerror or e}")


def read_glossary(path: str) -> list[Entry]:
    """A glossary file in DeepL's format its suffix names, .tsv or .csv (shared/glossary.py's parse, the service's
    reading and checks). ValueError naming the file and the line or entry refused; OSError where it cannot be read."""
    fmt = Path(path).suffix.lower().removeprefix(".")
    if fmt not in ("tsv", "csv"):
        raise ValueError(f"--glossary {path}: a glossary is a .tsv file (a source term TAB its target term a line) "
                         "or a .csv file (source,target a line), DeepL's formats")
    try:
        entries = parse(Path(path).read_text(encoding="utf-8-sig"), fmt)    # -sig: a BOM, as spreadsheets write
    except UnicodeDecodeError as e:
        raise ValueError(f"--glossary {path}: not UTF-8 text (byte {e.start})") from None
    except GlossaryError as e:
        raise ValueError(f"--glossary {path}: {e}") from None
    if not entries:
        raise ValueError(f"--glossary {path}: the file holds no entry")
    return entries
