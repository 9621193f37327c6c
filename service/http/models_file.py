"""The models file (--models-file): the translation versions an operator wants served, applied through model control
(http/model_control.py) when it changes and on SIGHUP, as the keys file is re-read (http/keys.py):

    models:
      - path: /models/versions/de-en-3     # the version that serves de-en's requests
        version: "3"                       # optional: model.json's "version", else its checksum's first 12 digits
        canary:                            # optional: a candidate beside it
          path: /models/versions/de-en-4
          share: 0.1                       # of the other keys' requests
          keys: [team-a]                   # every request of these keys (names in the keys file)

Each entry is applied as the admin routes would: a model not served is loaded; one whose active version has another
checksum than the path's is replaced (or promoted, when the path is its candidate's); a canary is loaded, changed or
rolled back to match. A model the file does not name is left as it is (unload it through the admin route), so a file
listing one model does not unload the others. A version that fails to load leaves the old one serving, with the
log line and transerve_model_loads_total{result} of any refused load; the file is applied again when it changes or
on SIGHUP, not in a loop. Comparisons are by checksum: applying a file twice changes nothing.

Every HTTP process polls the file (its poller starts with the process, server.at_startup; a readiness probe
restarts one that ended); the table is shared, so
whichever applies a change first does it for all, and the others, finding another change under way (409), try again
at their next poll and then find nothing to do. In a cluster the file is a ConfigMap every pod mounts: each pod
applies it to itself (deploy/README.md, "Model versions without a restart").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import multiprocessing as mp
import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .keys import file_identity
from .model_control import ModelControl
from ..errors import ApiError
from ..shared.schemas import Canary

log = logging.getLogger("transerve")

POLL_S = 1.0          # a changed file or a SIGHUP is applied within this
WHO = "models-file"   # the name the log gives the changes it makes (the admin key's name for the routes')


class ModelsFileError(ValueError):
    """Why the models file cannot be used (never quoting a path it names)."""


class _Canary(Canary):
    """A canary in the file names its candidate's package too (the admin route loads it with the body's path)."""
    path: str = Field(..., min_length=1)
    version: str | None = None


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(..., min_length=1)
    version: str | None = None
    canary: _Canary | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[_Entry] = Field(..., min_length=1)


def read_models_file(path: str) -> list[_Entry]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelsFileError(f"cannot read the models file ({type(e).__name__})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ModelsFileError(f"the models file is not valid YAML (line {mark.line + 1 if mark else '?'})") from None
    try:
        return _File.model_validate(data).models
    except ValidationError as e:
        why = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:3])
        raise ModelsFileError(f"the models file is malformed: {why}") from None


def checksum_at(path: str) -> tuple[str, str] | None:
    """(package name, checksum) of the package at `path` as the table records them; None when unreadable (the load
    then says why)."""
    try:
        raw = (Path(path) / "model.json").read_bytes()
        return json.loads(raw)["name"], hashlib.sha256(raw).hexdigest()
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ModelsFile:
    """The poller of one HTTP process (made in the main process: the SIGHUP counter is shared by inheritance)."""

    def __init__(self, path: str, control: ModelControl):
        self.path, self.control = path, control
        self.hups = mp.Value("i", 0)
        self.seen: tuple | None = None
        self.task: asyncio.Task | None = None
        self.task_pid: int | None = None

    def hup(self) -> None:
        with self.hups.get_lock():
            self.hups.value += 1

    def watch(self) -> None:
        """Starts this process's poller on its event loop, once (from a coroutine: server.at_startup at the
        process's start, and the readiness route)."""
        if self.task_pid != os.getpid() or self.task is None or self.task.done():
            self.task_pid, self.task = os.getpid(), asyncio.get_running_loop().create_task(self.poll())

    def identity(self) -> tuple | None:
        return file_identity(self.path)

    async def poll(self) -> None:
        while True:
            now = (self.hups.value, self.identity())
            if now != self.seen:
                try:
                    applied = await self.apply()
                except Exception as e:   # the poller never ends (one that did would wait for a readiness probe)
                    log.error("models file: applying it failed (%s); tried again at its next change or SIGHUP",
                              type(e).__name__)
                    applied = True
                if applied:
                    self.seen = now
            await asyncio.sleep(POLL_S)

    async def apply(self) -> bool:
        """The file applied; False when another change was under way (tried again at the next poll)."""
        if not os.path.exists(self.path):      # not there (yet): a ConfigMap mounted as optional
            return True
        try:
            entries = await asyncio.to_thread(read_models_file, self.path)
        except ModelsFileError as e:
            log.warning("models file not applied: %s; the versions serving stay", e)
            return True
        for entry in entries:
            try:
                await self.reconcile(entry)
            except ApiError as e:
                if e.type == "model_change_under_way":
                    return False
                log.warning("models file: an entry not applied (%s); the versions serving stay", e.type)
        return True

    async def reconcile(self, entry: _Entry) -> None:
        """One model brought to what its entry says (ApiError where a step is refused)."""
        control, want = self.control, checksum_at(entry.path)
        if want is None:                          # unreadable: the load says why, in the log and the metric
            await control.load(entry.path, entry.version, None, None, WHO)
            return
        name, active_sum = want
        model = control.table.read().get("models", {}).get(name)
        sums = {vid: v["checksum"] for vid, v in (model or {}).get("versions", {}).items()}
        if model is None or sums[model["active"]] != active_sum:
            if model is not None and model["candidate"] and sums[model["candidate"]] == active_sum:
                await control.promote(name, WHO)
            else:
                await control.load(entry.path, entry.version, None, None, WHO)
        model = control.table.read().get("models", {}).get(name)
        if model is None:               # unloaded meanwhile (an admin's call): applied again at the next change
            return
        canary = entry.canary
        if canary is None:
            if model["candidate"]:
                await control.rollback(name, WHO)
            return
        cand = checksum_at(canary.path)
        candidate_sum = model["versions"][model["candidate"]]["checksum"] if model["candidate"] else None
        if cand is None or candidate_sum != cand[1]:
            await control.load(canary.path, canary.version, canary.share, canary.keys, WHO)
        elif (model["share"], sorted(model["keys"])) != (canary.share, sorted(canary.keys)):
            await control.set_canary(name, canary.share, canary.keys, WHO)
