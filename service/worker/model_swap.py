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

A load runs in a thread of the worker (`begin`, `prepare`) while its loop goes on serving: reading the package and
checking its checksums, opening the sessions and tokenizers, warming and checking the engine touch only the new
engine, and hashlib, onnxruntime and SentencePiece release the GIL while they work. Only what changes the worker's
engines and routing (`installed`) runs in the loop, between two decoder steps, where the answer is sent
(`finish_loads`). One load at a time: another load, and any message naming the version loading, waits for it. Any
other control message (an unload of another version) is answered at once, between two steps.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing as mp
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..inference.engine import Engine
from ..metrics import metrics
from ..shared.options import DEFAULTS
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
    """A control message's answer, the load done here and now (a LitAPI outside a server's loop, a test; the loop
    takes its messages through `begin`): {"ok": True, ...} or {"ok": False, "reason": ...} (never quoting a path)."""
    return guarded(_control, api, payload)


def guarded(step, *args) -> dict:
    """`step`'s answer, or the failure's: it runs in the worker's loop, which an exception here would end."""
    try:
        return step(*args)
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


@dataclass
class Loading:
    """A version being loaded (`prepare`: in a thread of its own when the worker's loop took the message) and what
    it came to: its engine and the examples checked, or why it was refused."""
    slot: str
    name: str
    version: str
    path: Path
    checksum: str | None                         # model.json's sha256, which the engine keeps (`transerve_checksum`)
    answer: Callable[[dict], None] | None = None  # sends the control message's answer (the loop's)
    engine: Engine | None = None
    checked: int = 0
    refusal: str | None = None
    resident_before: int = 0
    took_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class Loads:
    """A worker's load under way (one at a time) and the control messages that wait for it, answered in order once
    it is: another load, and any naming the version loading (an unload the HTTP process sent after it gave up
    waiting, or the same load tried again), which would otherwise act on a version half there."""
    running: Loading | None = None
    waiting: deque = field(default_factory=deque)    # (payload, answer)


def begin(api: TranslateAPI, payload: dict, answer: Callable[[dict], None]) -> None:
    """A control message the worker's loop took: a load starts in a thread and is answered by `finish_loads` once
    done, the loop serving meanwhile; what must wait for a load under way waits; anything else is answered now."""
    loads: Loads = api.loads
    what, slot = payload.get("control"), payload.get("slot")
    if loads.running is not None and (what == "load" or slot == loads.running.slot):
        loads.waiting.append((payload, answer))
        return
    try:
        loading = Loading(slot, payload["name"], payload["version"], Path(payload["path"]), payload.get("checksum"),
                          answer) if what == "load" and slot not in api.engines else None
    except (KeyError, TypeError):
        loading = None
    if loading is None:       # an unload, a version this worker has already (restarted), a malformed message
        answer(control(api, payload))
        return
    loads.running = loading
    threading.Thread(target=prepare, args=(api, loading), name="model-load", daemon=True).start()


def finish_loads(api: TranslateAPI) -> bool:
    """In the worker's loop, between two steps: a load whose thread has ended is installed and answered, then the
    messages that waited for it are taken in order. Whether a load still runs."""
    loads: Loads = api.loads
    while loads.running is not None and loads.running.done.is_set():
        loading, loads.running = loads.running, None
        loading.answer(guarded(installed, api, loading))
        while loads.waiting and loads.running is None:
            begin(api, *loads.waiting.popleft())
    return loads.running is not None


def load(api: TranslateAPI, slot: str, name: str, version: str, path: Path, checksum: str | None = None) -> dict:
    """The version loaded beside the others, warmed and checked (check_engine), its resident cost measured; on any
    failure nothing of it stays. All in this thread (the loop's loads go through `begin`)."""
    if slot in api.engines:                  # a restarted worker loaded it from the table already
        if getattr(api.engines[slot], "transerve_checksum", checksum) != checksum:
            return {"ok": False, "reason": f"version {version} of {name} was another package, still finishing its "
                    "requests here; retry in a moment, or give this one another version id"}
        api.retiring.discard(slot)
        return {"ok": True, "resident_bytes": 0, "checked": 0}
    loading = Loading(slot, name, version, path, checksum)
    prepare(api, loading)
    return installed(api, loading)


def prepare(api: TranslateAPI, loading: Loading) -> None:
    """The package read and its checksums checked, its sessions and tokenizers opened, the engine warmed and checked:
    all on the new engine alone, nothing the worker's running batch or routing holds, so that a thread may do it
    while the loop serves. hashlib, onnxruntime's session creation and runs and SentencePiece's load release the GIL
    as they work (measured: docs/serving.md, "Model control and canary"); the sessions take the worker's settings."""
    t0 = time.monotonic()
    loading.resident_before = resident_bytes()
    try:
        loading.engine, loading.checked = checked_engine(api, loading)
    except Exception as e:                   # onnxruntime's own errors too: a graph it cannot load
        loading.refusal = without_path(str(e) or type(e).__name__, loading.path)
    finally:
        loading.took_s = time.monotonic() - t0
        if loading.engine is None:
            gc.collect()                     # a refused engine's sessions, once the exception has let them go
        loading.done.set()


def checked_engine(api: TranslateAPI, loading: Loading) -> tuple[Engine, int]:
    package = load_package(loading.path)
    if package.meta.get("task", "translation") != "translation" or package.name != loading.name:
        raise PackageError(f"model.json: a translation package named {loading.name!r} was expected")
    engine = Engine(package, device=api.provider, intra_op_threads=api.settings.threads,
                    spin_wait=api.settings.spin_wait)
    return engine, check_engine(engine)


def installed(api: TranslateAPI, loading: Loading) -> dict:
    """A prepared version served beside the others (in the worker's loop: the routing changes between two steps),
    or its refusal logged; the control message's answer."""
    if loading.refusal is not None or loading.engine is None:
        reason = loading.refusal or "the load did not finish"
        log.warning("model version %s of %s refused by the worker: %s", loading.version, loading.name, reason)
        return {"ok": False, "reason": reason}
    loading.engine.transerve_checksum = loading.checksum
    install(api, loading.slot, loading.name, loading.version, loading.engine)
    cost = max(0, resident_bytes() - loading.resident_before)
    log.info("model version %s of %s loaded beside %s in %.2f s (about %d MB resident, %d examples checked)",
             loading.version, loading.name, sorted(api.engines), loading.took_s, cost >> 20, loading.checked)
    return {"ok": True, "resident_bytes": cost, "checked": loading.checked}


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
        got = engine.translate([text], source_lang=src, target_lang=tgt, beam_size=DEFAULTS.beam_size)[0].text
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
