"""Model control, the HTTP side: which version of a translation package serves a request (`route`, a canary's share
and keys), and the changes an operator makes while the server runs (`load`, `unload`, `promote`, `rollback`,
`set_canary`), each behind an admin key (`admin`).

A change is made in this order, so that serving never stops: the package is read and its checksums checked here;
the memory for it beside the versions serving is checked (`memory_refusal`); every translation worker loads it
beside the others, warms it and translates its card's examples (worker/model_swap.py); only when every worker said
yes is the table switched (one write, seen by every HTTP process at its next request); then the versions no longer
routed to are unloaded by each worker once the requests it holds on them are answered. A package that fails any
step leaves the table as it was, and the answer, the log and transerve_model_loads_total{result} say why.

The table lives in shared memory (worker/model_swap.ModelTable): with --api-servers > 1 every HTTP process of this
server reads the same one, and one change at a time is made (`changing`: 409 while another is under way). Replicas
(other pods) share nothing: each is changed on its own (docs/serving.md, "Model control and canary").

Admin keys are not users' keys: they come from --admin-keys-file only (a keys file of either form,
service/keyfile.py, re-read on SIGHUP and when it changes as the users' is, and read when it first appears), work
on the admin routes only, and a users' key is refused there; with no admin keys file (or none there yet) the admin
routes answer 403.

A version that stops serving takes its series out of /metrics (`gone_series`): the workers' (labelled by its slot)
and the HTTP processes' (by model and version), so that the labels stay those of the versions served.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
import random
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fastapi import Request

from .auth import CHALLENGE, given_key
from .keys import KeyRing
from .litserve_workers import Workers
from ..config import Settings
from ..errors import ERROR_KIND, ApiError
from ..metrics import hide_series, labelled, metrics
from ..shared.package import PackageError, load_package
from ..stopping import main_alive
from ..worker.model_swap import ModelTable, without_path
from ..worker.translate_api import ENDPOINT

log = logging.getLogger("transerve")

VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")   # a version id: a metrics label, a header's value
MEMORY_MARGIN = 0.9      # of the memory free, what a new version may take


@dataclass(frozen=True)
class Route:
    """The version a request goes to: its model, version id, the workers' engine slot and the package's checksum."""
    name: str
    version: str
    slot: str
    checksum: str


def package_record(package_path: Path, meta: dict, version: str | None = None) -> dict:
    """A version's record in the table: its checksum (model.json's sha256, which holds every file's), its version
    id (`version`, else model.json's "version", else the checksum's first 12 hex digits), directions, size."""
    checksum = hashlib.sha256((package_path / "model.json").read_bytes()).hexdigest()
    given = version or meta.get("version")
    vid = given if isinstance(given, str) and VERSION.match(given) else checksum[:12]
    return {"version": vid, "checksum": checksum, "path": str(package_path.resolve()),
            "directions": list(meta.get("directions", [])),
            "bytes": sum(f.get("bytes", 0) for f in meta.get("files", {}).values()), "resident_bytes": 0}


def initial_table(packages: list[dict]) -> dict:
    """The table of the translation packages served from start-up, each under its own name (its slot)."""
    models = {}
    for p in packages:
        if p["task"] != "translation" or p["name"] in models:
            continue
        path = Path(p["path"])
        rec = package_record(path, json.loads((path / "model.json").read_text(encoding="utf-8")))
        rec["slot"] = p["name"]
        models[p["name"]] = {"active": rec["version"], "candidate": None, "share": 0.0, "keys": [],
                             "versions": {rec.pop("version"): rec}}
    return {"models": models, "busy": None}


def available_memory() -> int:
    """Bytes this server may still take: the container's cgroup (v2) room when it has a limit, else the machine's
    MemAvailable, whichever is less."""
    free = []
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(free) if free else 1 << 62


class ModelControl:
    def __init__(self, table: ModelTable, workers: Workers, settings: Settings, others: list[tuple[str, str]]):
        self.table, self.workers, self.settings = table, workers, settings
        self.others = others       # the pairs of packages outside the table (generation's)
        # Made here, before the HTTP processes fork, so that SIGHUP reaches theirs, the file there or not (a file that
        # appears later is read by each process's poller, or at SIGHUP, as a changed one is)
        path = settings.admin_keys_file
        self.admin_keys = KeyRing([], path, optional=True) if path else None
        self.file = None           # the models file's poller (http/models_file.py), when --models-file is given
        for result in ("loaded", "refused", "failed"):   # at 0 from the start, as the errors are (server.install)
            metrics().model_loads.labels(result)
        self._routing: tuple[int, dict, list] = (-1, {}, [])
        # The start-up versions' slots are their models' names: once such a version stops serving, its name as a
        # worker's model label has gone too (gone_series)
        self.first_slots = set(table.versions())
        hide_series("model versions", self.gone_series)

    # --- every request ---------------------------------------------------------------------------
    def _current(self) -> tuple[dict, list]:
        """(pair -> model name, served pairs), remade when the table has changed."""
        generation = self.table.generation()
        if generation != self._routing[0]:
            models = self.table.read().get("models", {})
            by_pair = {tuple(d.split("-")): name for name, m in models.items()
                       for d in m["versions"][m["active"]]["directions"]}
            self._routing = (generation, by_pair, sorted(set(by_pair) | set(self.others)))
        return self._routing[1], self._routing[2]

    def pairs(self) -> list[tuple[str, str]]:
        return self._current()[1]

    def name_for(self, source: str, target: str) -> str | None:
        return self._current()[0].get((source, target))

    def route(self, name: str, key_name: str) -> Route | None:
        """The version `name`'s request goes to: the candidate for the canary's keys and its share of the others'
        requests (drawn per request), else the active one."""
        model = self.table.read().get("models", {}).get(name)
        if model is None:
            return None
        vid = model["active"]
        if model["candidate"] and (key_name in model["keys"] or random.random() < model["share"]):
            vid = model["candidate"]
        v = model["versions"][vid]
        return Route(name, vid, v["slot"], v["checksum"])

    @contextmanager
    def observed(self, route: Route | None, out: dict):
        """Counts and times a request by the version it was routed to (the one that answered, should a worker
        have unloaded that since: `out["model_version"]` once the answer is in `out`)."""
        t0, outcome = time.monotonic(), "ok"
        try:
            yield
        except ApiError as e:
            outcome = ERROR_KIND.get(e.status, "internal")
            raise
        finally:
            if route is not None:
                outcome = outcome if out or outcome != "ok" else "client_closed"   # no answer: the client left
                version = out.get("model_version") or route.version
                labelled(metrics().version_requests, route.name, version, outcome).inc()
                labelled(metrics().version_duration, route.name, version).observe(time.monotonic() - t0)

    def gone_series(self) -> Callable[[dict], bool]:
        """At each exposition of /metrics (metrics.hide_series): whether a series' labels are those of a version no
        longer served. A worker's name it by the version's slot (`model`: name@version, or a start-up version's
        name), the HTTP processes' by `model` and `version`; any other series stays (a generation package's too)."""
        served = self.table.versions()
        slots, versions = set(served), set(served.values())

        def gone(labels: dict) -> bool:
            model = labels.get("model")
            if model is None:
                return False
            if "version" in labels:
                return (model, labels["version"]) not in versions
            return model not in slots and ("@" in model or model in self.first_slots)
        return gone

    # --- admin -----------------------------------------------------------------------------------
    def admin(self, request: Request) -> str:
        """The name of the request's admin key; 403 when no admin key is configured, 401 without a good one."""
        if self.admin_keys is not None:
            self.admin_keys.watch()   # this process's poller: at its first call, what changed since the fork is read
        if not self.admin_keys:
            raise ApiError(403, "model_control_off", "model control is off: no admin key is configured "
                           "(--admin-keys-file)")
        h = request.headers
        key = given_key(h.get("authorization", ""), h.get("x-api-key"))
        tenant = self.admin_keys.find(key) if key else None
        if tenant is None:
            raise ApiError(401, "unauthorized", "missing or invalid admin key: send Authorization: Bearer <admin key>",
                           headers=CHALLENGE)
        return tenant.name

    def hup(self) -> None:
        """SIGHUP, in the main process: the admin keys file re-read, the models file applied again."""
        if self.admin_keys is not None:
            self.admin_keys.hup()
        if self.file is not None:
            self.file.hup()

    def watch(self) -> None:
        """This HTTP process's models file poller started (from a coroutine), when there is a models file."""
        if self.file is not None:
            self.file.watch()

    def listing(self) -> dict:
        """Every served model: its versions (with their role, checksum, directions, measured resident bytes)."""
        return {"models": [self.describe(name) for name in sorted(self.table.read().get("models", {}))]}

    def describe(self, name: str) -> dict:
        m = self.table.read()["models"][name]
        role = {m["active"]: "active"} | ({m["candidate"]: "candidate"} if m["candidate"] else {})
        return {"name": name, "active": m["active"], "candidate": m["candidate"], "canary_share": m["share"],
                "canary_keys": m["keys"],
                "versions": [{"version": vid, "role": role.get(vid, "retiring"), "checksum": v["checksum"],
                              "directions": v["directions"], "bytes": v["bytes"],
                              "resident_bytes": v["resident_bytes"]} for vid, v in m["versions"].items()]}

    def _update(self, change) -> None:
        """A read-change-write of the table under its lock (`change` edits a deep copy)."""
        with self.table.lock():
            table = copy.deepcopy(self.table.read())
            change(table)
            self.table.write(table)

    @contextmanager
    def changing(self, what: str):
        """One change at a time over every HTTP process: 409 while another is under way (a change whose process
        died no longer counts)."""
        with self.table.lock():
            busy = self.table.read().get("busy")
            if busy and (busy["pid"] == os.getpid() or main_alive(busy["pid"])):
                raise ApiError(409, "model_change_under_way", f"another model change ({busy['what']}) is under way; "
                               "retry when it has ended")
            self._update(lambda t: t.update(busy={"pid": os.getpid(), "what": what}))
        try:
            yield
        finally:
            self._update(lambda t: t.update(busy=None))

    def _model(self, name: str) -> dict:
        model = self.table.read().get("models", {}).get(name)
        if model is None:
            raise ApiError(404, "unknown_model", f"no translation model {name!r} is served")
        return model

    async def load(self, path: str, version: str | None, share: float | None, keys: list[str] | None,
                   admin: str) -> dict:
        """A package loaded: a new model, or a new version of a served one that replaces it (or, with a canary's
        `share` or `keys`, becomes its candidate). 409 with the reason when it cannot be, the old one serving on."""
        with self.changing("load"):
            record = await self._readable(path, version)
            name, vid = record.pop("name"), record.pop("version")
            current = self.table.read()["models"].get(name)
            self._check_fits(name, vid, record, current, share is not None or bool(keys))
            record["slot"] = f"{name}@{vid}"
            payload = {"control": "load", "slot": record["slot"], "name": name, "version": vid, "path": record["path"],
                       "checksum": record["checksum"]}
            try:
                answers = await self.workers.each_worker(ENDPOINT, payload)
            except ApiError as e:
                answers = [{"ok": False, "reason": f"an inference worker did not load it ({e.message})"}]
            if failed := [a["reason"] for a in answers if not a.get("ok")]:
                await self._unload_slots([record["slot"]])
                self._refused("failed", name, vid, failed[0], admin)
            record["resident_bytes"] = max(a.get("resident_bytes", 0) for a in answers)
            retired = self._switch(name, vid, record, share, keys)
            metrics().model_loads.labels("loaded").inc()
            log.info("model %s: version %s loaded by admin key %s (%s); unloading %s", name, vid, admin,
                     "canary" if share is not None or keys else "serving", retired or "nothing")
        await self._unload_slots(retired)
        return self.describe(name)

    async def _readable(self, path: str, version: str | None) -> dict:
        """The package's record (with its name), its model.json and every file's checksum checked; 409 if not."""
        if version is not None and not VERSION.match(version):
            raise ApiError(422, "invalid_request", "version: 1 to 64 letters, digits, '.', '_', '+' or '-'")
        where = Path(path)
        try:
            package = await asyncio.to_thread(load_package, where)
            if not isinstance(package.meta.get("name"), str) or not package.meta["name"]:
                raise PackageError("model.json: no \"name\" (a model package's is its model's name)")
        except (PackageError, OSError, ValueError) as e:   # ValueError: a NUL in the path
            self._refused("refused", None, version, without_path(str(e), where), None)
        except (AttributeError, KeyError, TypeError):      # model.json not an object, or its files not model.export's
            self._refused("refused", None, version, "model.json: not a model package's (model.export writes it)", None)
        if package.meta.get("task", "translation") != "translation":
            self._refused("refused", package.name, version, "not a translation package (model control serves "
                          "translation packages; a generation package changes with a restart)", None)
        return package_record(package.path, package.meta, version) | {"name": package.name}

    def _check_fits(self, name: str, vid: str, record: dict, current: dict | None, canary: bool) -> None:
        models = self.table.read()["models"]
        if current is not None and vid in current["versions"]:
            self._refused("refused", name, vid, f"version {vid} of {name} is served already", None)
        same = [v for v, r in (current or {}).get("versions", {}).items() if r["checksum"] == record["checksum"]]
        if same:
            self._refused("refused", name, vid, f"this package is served already, as version {same[0]} of {name}", None)
        if current is None and canary:
            self._refused("refused", name, vid, f"a canary needs a served version of {name} to share with", None)
        if current is None:
            taken = {d for m in models.values() for d in m["versions"][m["active"]]["directions"]}
            if clash := sorted(taken & set(record["directions"])):
                self._refused("refused", name, vid, f"{', '.join(clash)} is translated by another model", None)
        if why := self.memory_refusal(current, record):
            self._refused("refused", name, vid, why, None)

    def memory_refusal(self, current: dict | None, record: dict) -> str | None:
        """Why the workers could not hold the new version beside those serving, or None. A version's cost in each
        worker: what loading the served one measured (resident memory before and after, worker/model_swap.py), or
        its files' size when nothing was measured (an int8 package's sessions take about that)."""
        workers = self.workers.count(ENDPOINT)
        measured = max((v["resident_bytes"] for v in (current or {}).get("versions", {}).values()), default=0)
        need = max(record["bytes"], measured) * workers
        if self.settings.model_memory_bytes:
            held = sum(max(v["bytes"], v["resident_bytes"]) for m in self.table.read()["models"].values()
                       for v in m["versions"].values()) * workers
            free = self.settings.model_memory_bytes - held
        else:
            free = int(available_memory() * MEMORY_MARGIN)
        if need <= free:
            return None
        return (f"not enough memory to hold both versions: the new one needs about {need >> 20} MiB ({workers} "
                f"workers), {max(0, free) >> 20} MiB are free" + (" under --model-memory-bytes"
                                                                  if self.settings.model_memory_bytes else ""))

    def _switch(self, name: str, vid: str, record: dict, share: float | None, keys: list[str] | None) -> list[str]:
        """The table switched to the new version (or its canary); the slots no longer routed to."""
        retired: list[str] = []

        def change(table: dict) -> None:
            model = table["models"].get(name)
            if model is None:
                table["models"][name] = {"active": vid, "candidate": None, "share": 0.0, "keys": [],
                                         "versions": {vid: record}}
                return
            keep = {model["active"]} if share is not None or keys else set()
            model["versions"][vid] = record
            if share is not None or keys:
                model.update(candidate=vid, share=share or 0.0, keys=list(keys or []))
            else:
                model.update(active=vid, candidate=None, share=0.0, keys=[])
            keep.add(vid)
            for old in [v for v in model["versions"] if v not in keep]:
                retired.append(model["versions"].pop(old)["slot"])
        self._update(change)
        return retired

    def _refused(self, result: str, name: str | None, version: str | None, reason: str, admin: str | None):
        metrics().model_loads.labels(result).inc()
        log.warning("model version %s of %s not loaded (%s): %s", version or "?", name or "a package", result, reason)
        raise ApiError(409, "model_load_failed", f"not loaded: {reason}; the versions serving go on")

    async def _unload_slots(self, slots: list[str]) -> None:
        """Each worker unloads these once no request it holds uses them."""
        for slot in slots:
            try:
                await self.workers.each_worker(ENDPOINT, {"control": "unload", "slot": slot})
            except ApiError as e:   # a worker that died comes back without it (it loads what the table lists)
                log.warning("unloading a model version: %s", e.message)

    async def unload(self, name: str, admin: str) -> dict:
        with self.changing("unload"):
            slots = [v["slot"] for v in self._model(name)["versions"].values()]
            self._update(lambda t: t["models"].pop(name))
            log.info("model %s unloaded by admin key %s", name, admin)
        await self._unload_slots(slots)
        return self.listing()

    async def promote(self, name: str, admin: str) -> dict:
        """The candidate becomes the active version; the old one is unloaded."""
        return await self._settle(name, admin, promote=True)

    async def rollback(self, name: str, admin: str) -> dict:
        """The candidate is dropped and unloaded; the active version serves every request."""
        return await self._settle(name, admin, promote=False)

    async def _settle(self, name: str, admin: str, promote: bool) -> dict:
        with self.changing("promote" if promote else "rollback"):
            model = self._model(name)
            if not model["candidate"]:
                raise ApiError(409, "no_candidate", f"{name} has no candidate version to "
                               f"{'promote' if promote else 'roll back'}")
            gone = model["active"] if promote else model["candidate"]
            slot = model["versions"][gone]["slot"]

            def change(table: dict) -> None:
                m = table["models"][name]
                if promote:
                    m["active"] = m["candidate"]
                m.update(candidate=None, share=0.0, keys=[])
                m["versions"].pop(gone)
            self._update(change)
            log.info("model %s: %s by admin key %s; version %s unloaded", name, "promoted" if promote else
                     "rolled back", admin, gone)
        await self._unload_slots([slot])
        return self.describe(name)

    async def set_canary(self, name: str, share: float, keys: list[str], admin: str) -> dict:
        """The candidate's share of requests and its keys changed."""
        with self.changing("canary"):
            if not self._model(name)["candidate"]:
                raise ApiError(409, "no_candidate", f"{name} has no candidate version; load one with a canary")
            self._update(lambda t: t["models"][name].update(share=share, keys=list(keys)))
            log.info("model %s: canary share %.3f, %d keys, by admin key %s", name, share, len(keys), admin)
        return self.describe(name)
