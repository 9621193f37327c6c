"""Who a request's key is: the KeyRing looks a key up by its SHA-256 among the keys given (--api-keys) and those
of the keys file (service/keyfile.py), and re-reads the file without a restart: on SIGHUP to the main process
and when the file changes (a Kubernetes Secret's update swaps the mounted file). A reload is all or nothing:
the new keys replace the old in one assignment, so a request sees either set, never half of each, and a request
already past its key check goes on; a file that cannot be used leaves the keys as they were and the log says why
(never quoting a key).

Each HTTP process reloads for itself (LitServe forks them from the main process, whose keys they inherit): a
thread polls, every POLL_S, the file's identity and a counter the main process's SIGHUP handler bumps.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time

from ..errors import ApiError
from ..keyfile import KeysFileError, Tenant, digest_of, plain_tenant, read_keys_file

log = logging.getLogger("transerve")

POLL_S = 0.25            # a changed file or a SIGHUP takes effect within this (and the file's read)
ANONYMOUS = Tenant("anonymous", b"")   # every request of a server without keys: counted, never limited


def file_identity(path: str) -> tuple | None:
    """What changes when a watched file does (the keys file, the models file): a Secret's or ConfigMap's update
    points its link at a new file (another inode); None while it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class KeyRing:
    def __init__(self, given: list[str], path: str = "", optional: bool = False):
        """`optional`: a file not there yet holds no key until it appears, then is read as a changed one is (the
        admin keys file: a Secret mounted as optional)."""
        self.path = path
        absent = bool(path) and optional and file_identity(path) is None
        file_tenants = read_keys_file(path) if path and not absent else []
        in_file = {t.digest for t in file_tenants}
        # config.py adds a plain file's keys to --api-keys; those stay the file's, to go when it drops them
        self.given = {t.digest: t for t in map(plain_tenant, given) if t.digest not in in_file}
        self.tenants = self.given | {t.digest: t for t in file_tenants}
        self.hups = mp.Value("i", 0)     # bumped by SIGHUP in the main process, read by every HTTP process
        self.seen = (0, None if absent else self.identity())   # absent: one there by the first check is read
        self.watching_in: int | None = None

    def __bool__(self) -> bool:
        return bool(self.tenants)

    def names(self) -> list[str]:
        return sorted(t.name for t in self.tenants.values())

    def find(self, key: str) -> Tenant | None:
        """The key's Tenant, or None. A dict lookup by the key's SHA-256: its timing tells nothing of how near
        a wrong key came to a right one."""
        self.watch()
        return self.tenants.get(digest_of(key)) if key else None

    def hup(self) -> None:
        """SIGHUP, in the main process: every HTTP process re-reads the file at its next poll."""
        with self.hups.get_lock():
            self.hups.value += 1

    def identity(self) -> tuple | None:
        return file_identity(self.path)

    def watch(self) -> None:
        """The polling thread of this process, started on its first request (a thread does not survive fork),
        which first catches up at once with what changed since the fork."""
        if self.path and self.watching_in != os.getpid():
            self.watching_in = os.getpid()
            self.check()
            threading.Thread(target=self.poll, name="keys-file", daemon=True).start()

    def poll(self) -> None:
        while True:
            time.sleep(POLL_S)
            self.check()

    def check(self) -> None:
        now = (self.hups.value, self.identity())
        if now != self.seen:
            why = "SIGHUP" if now[0] != self.seen[0] else "the file changed"
            self.seen = now
            self.reload(why)

    def reload(self, why: str) -> bool:
        try:
            tenants = read_keys_file(self.path)
        except KeysFileError as e:
            log.warning("API keys not reloaded (%s): %s; the %d keys in use stay", why, e, len(self.tenants))
            return False
        self.tenants = self.given | {t.digest: t for t in tenants}
        log.info("API keys reloaded (%s): %d keys (%s)", why, len(self.tenants), ", ".join(self.names()))
        return True


def allow_route(tenant: Tenant, path: str) -> None:
    if tenant.routes is not None and path not in tenant.routes:
        raise ApiError(403, "route_not_allowed", f"the key {tenant.name!r} may not use {path}; it may use "
                       + ", ".join(sorted(tenant.routes)))


def allow_model(tenant: Tenant, model: str) -> None:
    if tenant.models is not None and model not in tenant.models:
        raise ApiError(403, "model_not_allowed", f"the key {tenant.name!r} may not use the model {model!r}; it "
                       "may use " + ", ".join(sorted(tenant.models)))
