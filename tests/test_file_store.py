"""service/api/file_store.py: the translated files waiting for LibreTranslate's /download_file. A download that a
sweep races is a 404 (it was a 500 whose log line named the file's path, the download's token), and the directory is
used only if it is this user's own and closed to everyone else (another user's, made first in a shared /tmp, could
list, read and replace the files). A server sweeps from its start, not from its first file."""

from __future__ import annotations

import json
import os
import time

import pytest

from service.api.file_store import FileStore
from service.errors import ApiError


def test_a_file_deleted_after_its_record_was_written_is_a_404_not_a_path(tmp_path):
    store = FileStore(str(tmp_path / "files"), ttl_s=60)
    token = store.put(b"Hello world", "a.txt", "alice", "text/plain")
    assert store.get(token, "alice") == (b"Hello world", {"name": "a.txt", "media_type": "text/plain",
                                                           "owner": "alice",
                                                           "expires": store.read_meta(token)["expires"]})
    (tmp_path / "files" / token).unlink()        # what a sweep does between a download's check and its read
    with pytest.raises(ApiError) as e:
        store.get(token, "alice")
    assert e.value.status == 404
    with pytest.raises(ApiError):
        store.get(token, "mallory")


def test_the_default_directory_is_named_after_the_user():
    assert FileStore("", 60).dir.name == f"transerve-files-{os.geteuid()}"


def refused(path) -> str:
    with pytest.raises(SystemExit) as e:
        FileStore(str(path), 60)
    return str(e.value)


def test_a_directory_open_to_other_users_or_a_link_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert "0o777" in refused(shared) and "--file-dir" in refused(shared)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(private)
    assert "must be this user's own directory" in refused(tmp_path / "link")
    FileStore(str(private), 60)                  # its own, 0700: used


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user takes root")
def test_another_users_directory_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    assert "owned by uid 65534" in refused(theirs)


def test_a_server_deletes_a_file_left_by_its_last_run_when_it_expires_before_any_upload(tmp_path):
    """The periodic sweep was started by a process's first file: a file still valid when the server restarted stayed
    on disk after its expiry for as long as no one translated a file."""
    from conftest import ROOT, start_server, stop_server

    files = tmp_path / "files"
    token = FileStore(str(files), ttl_s=3600).put(b"Hello world", "a.txt", "anonymous", "text/plain")
    proc, url = start_server(ROOT / "models" / "de-en", "--file-dir", str(files), "--file-ttl-s", "4")
    try:
        assert (files / token).exists()                   # not expired as the server started
        record = files / f"{token}.json"
        record.write_text(json.dumps(json.loads(record.read_text()) | {"expires": time.time() - 1}))   # now it is
        deadline = time.monotonic() + 30
        while (files / token).exists():
            assert time.monotonic() < deadline, "the expired file is still on disk"
            time.sleep(0.2)
        assert not (files / f"{token}.json").exists()
    finally:
        stop_server(proc)


def test_a_directory_opened_to_others_after_the_start_makes_a_store_a_503_not_an_exit(tmp_path):
    """Made (or opened) by another user after the server started: an upload is refused with a 503 the Gateway answers,
    where the SystemExit of the start-up check escaped the middleware as a bare 500."""
    store = FileStore(str(tmp_path / "files"), 60)        # not there yet: made with the first file
    (tmp_path / "files").mkdir()
    (tmp_path / "files").chmod(0o777)
    with pytest.raises(ApiError) as e:
        store.put(b"Hello", "a.txt", "alice", "text/plain")
    assert (e.value.status, e.value.type) == (503, "file_store_unavailable")
    assert list((tmp_path / "files").iterdir()) == []
