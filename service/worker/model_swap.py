"""Model control, the worker's side: the served versions of the translation packages and the routing between them
(`ModelTable`, in shared memory), and what a translation worker does with a control message: a version loaded,
warmed and checked beside those serving (`control` "load"), or unloaded once no request it holds uses it
("unload").

The table is made in the main process before any other (server.build_server): the forked HTTP processes inherit it
and the spawned workers get it pickled, so one write is seen by every HTTP process at its next request, and a
restarted worker loads the versions the table lists, not those of the command line. The HTTP side
(service/http/model_control.py) writes it and sends the control messages; a worker only reads it.

In a worker each version is an engine in `TranslateAPI.engines` under its *slot*: the package's name for a version
served since start-up (so the metrics' `model` label stays the package's name), `name@version` for one loaded
since. A request names the slot the HTTP process routed it to; a worker that has unloaded that slot since serves it
on the model's active version and says so in the answer (`model_version`).

A control message runs in the worker's loop, between two decoder steps: while a version loads and is checked (a
second or two for models/de-en on 2 cores) the worker's requests wait; none fails.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing as mp
import os
import re
from pathlib import Path
from typing import Any

from ..inference.engine import Engine
from ..metrics import metrics
from ..shared.package import PackageError, load_package
from .watch import SchedulerWatch

# The translation worker's LitAPI (translate_api.TranslateAPI, which imports this module: not imported here, not even
# for its type, so that no loop forms): its engines, routes, versions, retiring, scheduler, models, settings, provider.
TranslateAPI = Any

log = logging.getLogger("transerve")

TABLE_BYTES = 1 << 18          # the table's JSON at most: about 1,000 versions' records
SMOKE = {"de": "Hallo Welt.", "en": "Hello world."}   # translated where a package's card has no examples
SMOKE_DEFAULT = "Hello."
# A card example: - "source" → "translation", optionally after `xx→yy: ` naming its direction.
EXAMPLE = re.compile(r'^\s*-\s*(?:([a-z]{2,3})→([a-z]{2,3}):\s*)?"([^"]+)"\s*→\s*"([^"]+)"')
DIRECTION = re.compile(r"\b([a-z]{2,3})→([a-z]{2,3})\b")


class ModelTable:
    """The served versions as JSON in shared memory (spawn context: picklable into LitServe's workers):

        {"models": {name: {"active": version, "candidate": version | null, "share": 0.0-1.0, "keys": [key names],
                           "versions": {version: {"slot", "checksum", "path", "directions", "resident_bytes"}}}},
         "busy": {"pid", "what"} | null}

    A write replaces the whole under the lock and bumps the generation; a reader parses it again only when the
    generation has moved (one shared integer read per request)."""

    def __init__(self):
        ctx = mp.get_context("spawn")
        self._data = ctx.Array("c", TABLE_BYTES)
        self._generation = ctx.Value("q", 0)
        self._cache: tuple[int, dict] = (-1, {})

    def generation(self) -> int:
        return self._generation.value

    def read(self) -> dict:
        """The table as last written (do not change it: copy, then `write`)."""
        if self._generation.value != self._cache[0]:
            with self._data.get_lock():
                generation, raw = self._generation.value, self._data.raw
            self._cache = (generation, json.loads(raw.rstrip(b"\0") or b"{}"))
        return self._cache[1]

    def write(self, table: dict) -> None:
        raw = json.dumps(table, separators=(",", ":")).encode()
        if len(raw) >= TABLE_BYTES:
            raise ValueError(f"the model table would take {len(raw)} bytes; it holds {TABLE_BYTES}")
        with self._data.get_lock():
            self._data.raw = raw + b"\0" * (TABLE_BYTES - len(raw))
            self._generation.value += 1

    def lock(self):
        """The table's lock, for a read-change-write of the HTTP side (held for microseconds)."""
        return self._data.get_lock()

    def versions(self) -> dict[str, tuple[str, str]]:
        """slot -> (model name, version) of every version the table lists."""
        return {v["slot"]: (name, vid) for name, m in self.read().get("models", {}).items()
                for vid, v in m["versions"].items()}

    def active_slot(self, name: str) -> str | None:
        model = self.read().get("models", {}).get(name)
        return None if model is None else model["versions"][model["active"]]["slot"]


def served_paths(api: TranslateAPI) -> list[tuple[str | None, Path]]:
    """What a starting worker loads: each version the table lists (slot, path), or without a table (a LitAPI made
    outside a server) the command line's packages, each under its name (None). A listed version whose directory
    has gone since it was loaded is left out (logged; its requests run on the model's other version, if any),
    rather than failing every start of the worker."""
    if api.models is None:
        return [(None, p) for p in api.settings.model_paths]
    out = []
    for name, m in api.models.read().get("models", {}).items():
        for vid, v in m["versions"].items():
            if (Path(v["path"]) / "model.json").is_file():
                out.append((v["slot"], Path(v["path"])))
            else:
                log.error("model version %s of %s: its package is gone from disk; this worker serves it no more",
                          vid, name)
    return out


def slot_for(api: TranslateAPI, request: dict, pair: tuple[str, str]) -> str | None:
    """The engine a request runs on: the slot it was routed to while this worker has it (a retiring one too: the
    requests routed to it before the switch finish on it), else its model's active version now, else the first
    engine that translates the pair (a request sent without a slot)."""
    slot = request.get("slot")
    if slot is not None and slot in api.engines:
        return slot
    if slot is not None and api.models is not None:
        name = api.versions.get(slot, (slot.split("@")[0], None))[0]
        active = api.models.active_slot(name)
        if active in api.engines:
            return active
    return api.routes.get(pair)


def answer_fields(api: TranslateAPI, slot: str) -> dict:
    """What an answer says of the version that served it: the package's name and its version id."""
    name, version = api.versions.get(slot, (slot, None))
    return {"model": name, "model_version": version}


def control(api: TranslateAPI, payload: dict) -> dict:
    """A control message's answer: {"ok": True, ...} or {"ok": False, "reason": ...} (never quoting a path); it runs
    in the worker's loop, which an exception here would end."""
    try:
        return _control(api, payload)
    except Exception as e:
        log.exception("a model control message failed in the worker")
        return {"ok": False, "reason": f"the worker failed ({type(e).__name__}); its log says why"}


def _control(api: TranslateAPI, payload: dict) -> dict:
    what = payload["control"]
    if what == "load":
        return load(api, payload["slot"], payload["name"], payload["version"], Path(payload["path"]),
                    payload.get("checksum"))
    if what == "unload":
        # Sent once the table no longer lists the slot; listed again, it was loaded again since (a load of the same
        # version between the switch and this message): it serves, and is kept.
        if api.models is not None and payload["slot"] in api.models.versions():
            return {"ok": True, "removed": []}
        api.retiring.add(payload["slot"])
        return {"ok": True, "removed": collect_retired(api)}
    return {"ok": False, "reason": f"unknown control message {what!r}"}


def load(api: TranslateAPI, slot: str, name: str, version: str, path: Path, checksum: str | None = None) -> dict:
    """The version loaded beside the others, warmed and checked (check_engine), its resident cost measured; on any
    failure nothing of it stays. `checksum`: model.json's sha256, which the engine keeps (`transerve_checksum`)."""
    if slot in api.engines:                  # a restarted worker loaded it from the table already
        if getattr(api.engines[slot], "transerve_checksum", checksum) != checksum:
            return {"ok": False, "reason": f"version {version} of {name} was another package, still finishing its "
                    "requests here; retry in a moment, or give this one another version id"}
        api.retiring.discard(slot)
        return {"ok": True, "resident_bytes": 0, "checked": 0}
    before = resident_bytes()
    try:
        package = load_package(path)
        if package.meta.get("task", "translation") != "translation" or package.name != name:
            raise PackageError(f"model.json: a translation package named {name!r} was expected")
        engine = Engine(package, device=api.provider, intra_op_threads=api.settings.threads,
                        spin_wait=api.settings.spin_wait)
        checked = check_engine(engine)
    except Exception as e:                   # onnxruntime's own errors too: a graph it cannot load
        gc.collect()
        reason = without_path(str(e) or type(e).__name__, path)
        log.warning("model version %s of %s refused by the worker: %s", version, name, reason)
        return {"ok": False, "reason": reason}
    engine.transerve_checksum = checksum
    install(api, slot, name, version, engine)
    cost = max(0, resident_bytes() - before)
    log.info("model version %s of %s loaded beside %s (about %d MB resident, %d examples checked)", version, name,
             sorted(api.engines), cost >> 20, checked)
    return {"ok": True, "resident_bytes": cost, "checked": checked}


def install(api: TranslateAPI, slot: str, name: str, version: str, engine: Engine) -> None:
    """The engine served under `slot`: in the scheduler's engines (the same dict), its gauges watched."""
    api.engines[slot] = engine
    api.versions[slot] = (name, version)
    for d in engine.directions:
        api.routes.setdefault(tuple(d.split("-")), slot)
    api.scheduler.watch = SchedulerWatch(api.scheduler.endpoint, api.engines)
    metrics().model_info.labels(model=slot, directions=",".join(engine.directions),
                                precision=engine.package.meta["precision"], provider=engine.device_type).set(1)


def collect_retired(api: TranslateAPI) -> list[str]:
    """Removes the retiring engines that no request this worker holds uses any more; the slots removed."""
    held = {getattr(job, "model", None) for job in api.scheduler.jobs.values()}
    gone = [slot for slot in api.retiring if slot not in held]
    for slot in gone:
        api.retiring.discard(slot)
        engine = api.engines.pop(slot, None)
        api.versions.pop(slot, None)
        for key in [k for k in api.scheduler.batches if k[0] == slot]:
            del api.scheduler.batches[key]
        if engine is not None:
            metrics().model_info.labels(model=slot, directions=",".join(engine.directions),
                                        precision=engine.package.meta["precision"],
                                        provider=engine.device_type).set(0)
            for gauge in (metrics().running_rows, metrics().cache_bytes):
                gauge.labels(api.scheduler.endpoint, slot).set(0)
        del engine
    if gone:
        api.routes = {}
        for slot, engine in api.engines.items():
            for d in engine.directions:
                api.routes.setdefault(tuple(d.split("-")), slot)
        if api.models is not None:           # a pair goes to its model's active version first
            for name in {api.versions[s][0] for s in api.engines if s in api.versions}:
                active = api.models.active_slot(name)
                if active in api.engines:
                    api.routes.update({tuple(d.split("-")): active for d in api.engines[active].directions})
        api.scheduler.watch = SchedulerWatch(api.scheduler.endpoint, api.engines)
        gc.collect()
        log.info("model versions unloaded: %s; serving %s", gone, sorted(api.engines))
    return gone


def card_examples(package_path: Path, directions: list[str]) -> list[tuple[str, str, str, str]]:
    """The examples of a package's MODEL_CARD.md ("## Examples": `- "source" → "translation"`, a line's direction
    given as `xx→yy:` or the section's first `xx→yy`), as (source lang, target lang, source, translation), those of
    directions the package serves."""
    card = package_path / "MODEL_CARD.md"
    try:
        text = card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    section = re.split(r"^## Examples\s*$", text, maxsplit=1, flags=re.M)
    if len(section) < 2:
        return []
    body = re.split(r"^## ", section[1], maxsplit=1, flags=re.M)[0]
    default = DIRECTION.search(body)
    out = []
    for line in body.splitlines():
        m = EXAMPLE.match(line)
        if not m:
            continue
        src, tgt = (m[1], m[2]) if m[1] else (default.groups() if default else (None, None))
        if f"{src}-{tgt}" in directions:
            out.append((src, tgt, m[3], m[4]))
    return out


def check_engine(engine: Engine) -> int:
    """Warms the engine and checks it translates: its card's examples with beam 4 as the card was written (every
    one translated, at least half exactly as the card says: int8 kernels differ a little from CPU to CPU), or,
    without examples, a smoke sentence per direction. The examples checked; PackageError when it fails."""
    examples = card_examples(engine.package.path, list(engine.directions))
    if not examples:
        for d in engine.directions:
            src, tgt = d.split("-")
            engine.translate([SMOKE.get(src, SMOKE_DEFAULT)], source_lang=src, target_lang=tgt, beam_size=2,
                             max_length=8)
        return 0
    same = 0
    for src, tgt, text, expected in examples:
        got = engine.translate([text], source_lang=src, target_lang=tgt, beam_size=4)[0].text
        if not got.strip():
            raise PackageError(f"MODEL_CARD.md: an example ({src}-{tgt}) translated to nothing")
        same += got.strip() == expected.strip()
    if same * 2 < len(examples):
        raise PackageError(f"MODEL_CARD.md: {same} of {len(examples)} examples translated as the card says "
                           "(at least half must be)")
    return len(examples)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc/self/statm; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def without_path(message: str, path: Path) -> str:
    """A refusal's reason without the package's directory: a file is named by its name in the package."""
    try:
        where = {str(path), str(path.resolve())}
    except (OSError, ValueError):   # a path with a NUL, or a symlink loop: as given
        where = {str(path)}
    for p in where:
        message = message.replace(p + os.sep, "").replace(p, "the package")
    return message
