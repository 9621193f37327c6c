"""Translated files waiting for their download (LibreTranslate's /download_file), on this host's disk only.

Each file is kept under a random 128-bit name with a small JSON beside it: its download name, media type,
the key that made it (its name: "anonymous" on a server without keys) and when it expires. A download must
come with the same key and before then; anything else is a 404 that does not say which (a file of another key
is not known to exist). Expired files are deleted by a sweep that runs every quarter of the time to live
(at most a minute) while the HTTP process runs, and on every store and download; a file therefore lives at
most file_ttl_s plus one sweep interval. The directory is made 0700 and the files 0600, and one that exists already
is used only if it is this user's own, not a link, and closed to every other user (the default is named after the
user, so two users' servers do not meet): no other user of the host reads, replaces or lists them, and nothing
sends them anywhere. A download reads the file while its record is checked, so a sweep that deletes it meanwhile
leaves a 404, never a half-served file or a 500 naming it. Every HTTP process of a server (--api-servers) shares the
directory; replicas do not (route a client's download to the replica that answered it, as LibreTranslate
needs too)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from pathlib import Path

from ..errors import ApiError

log = logging.getLogger("transerve")

TOKEN = re.compile(r"[0-9a-f]{32}")


class FileStore:
    def __init__(self, directory: str, ttl_s: float):
        self.dir = Path(directory) if directory else Path(tempfile.gettempdir()) / f"transerve-files-{os.geteuid()}"
        if self.dir.exists() or self.dir.is_symlink():   # made with the first file; one there already is checked now
            try:
                private_directory(self.dir)
            except NotPrivate as e:
                raise SystemExit(str(e)) from None
        self.ttl_s = ttl_s
        self.interval_s = min(60.0, ttl_s / 4)
        self.swept = 0.0
        self.sweeper: asyncio.Task | None = None

    def put(self, data: bytes, name: str, owner: str, media_type: str) -> str:
        """Keeps `data`; returns the token that names it."""
        try:
            private_directory(self.dir)
        except NotPrivate as e:      # made or opened by another user since the start: no file is written there
            log.error("%s", e)
            raise ApiError(503, "file_store_unavailable", "translated files cannot be kept now: the server's file "
                           "directory is not private (its log says why)", headers={"Retry-After": "60"}) from None
        self.sweep()
        token = secrets.token_hex(16)
        write_private(self.dir / token, data)
        meta = {"name": name, "media_type": media_type, "owner": owner, "expires": time.time() + self.ttl_s}
        write_private(self.dir / f"{token}.json", json.dumps(meta).encode())
        return token

    def get(self, token: str, owner: str) -> tuple[bytes, dict]:
        """The file's contents and its record, or a 404 for one unknown, expired, made by another key, or deleted by a
        sweep since its record was read."""
        self.sweep()
        meta = self.read_meta(token) if TOKEN.fullmatch(token) else None
        data = None
        if meta is not None and meta["owner"] == owner and meta["expires"] >= time.time():
            try:
                with open(self.dir / token, "rb") as f:
                    data = f.read()
            except OSError:
                pass
        if data is None:
            raise ApiError(404, "file_not_found", f"no translated file {token!r} for this key: files are kept "
                           f"{self.ttl_s:g} s, and only the key that sent a file may download it")
        return data, meta

    def read_meta(self, token: str) -> dict | None:
        try:
            return json.loads((self.dir / f"{token}.json").read_text())
        except (OSError, ValueError):
            return None

    def sweep(self, force: bool = False) -> None:
        """Deletes the expired files (at most once per interval unless forced)."""
        now = time.monotonic()
        if not force and now - self.swept < self.interval_s:
            return
        self.swept = now
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            token = name.removesuffix(".json")
            meta = self.read_meta(token)
            stale = meta["expires"] < time.time() if meta else older_than(self.dir / name, self.ttl_s)
            if stale:
                for path in (self.dir / token, self.dir / f"{token}.json"):
                    path.unlink(missing_ok=True)

    def start_sweeping(self) -> None:
        """The periodic sweep on this process's event loop, started as the process starts (Gateway.at_start), and
        again by a file should it have ended."""
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await asyncio.to_thread(self.sweep, True)


class NotPrivate(Exception):
    """The files' directory is not this user's own and closed to others: at start the server does not start, later
    an upload is a 503."""


def private_directory(path: Path) -> None:
    """Makes `path` (0700), or checks that the one there is this user's own directory, not a link, and closed to every
    other user: another user's directory (made first, in a shared /tmp) could list, replace or read the files."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise NotPrivate(f"{path}: the translated files' directory must be this user's own directory, open to no "
                         f"other user (mode 0700); it is {oct(st.st_mode & 0o777)} and owned by uid {st.st_uid}: "
                         "remove it, or choose another with --file-dir")


def older_than(path: Path, seconds: float) -> bool:
    """A file without its record (a store cut short): judged by its age."""
    try:
        return path.stat().st_mtime < time.time() - seconds
    except OSError:
        return False


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
