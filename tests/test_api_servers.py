"""How many HTTP processes `--api-servers 0` (the default) starts (service/server.py's api_servers): one on a CPU,
where the inference workers take the cores; on a GPU one per CORES_PER_API_SERVER cores the workers leave; one
whenever key limits would be counted in each process's memory (no --redis-url), so a key's limits stay its own."""

import logging

from service.config import Settings, parse_settings
from service.http.keys import KeyRing
from service.server import CORES_PER_API_SERVER, MOST_API_SERVERS, api_servers

LIMITED = "keys:\n  - name: team\n    key: k-team-1\n    limits:\n      requests_per_minute: 5\n"
UNLIMITED = "keys:\n  - name: team\n    key: k-team-1\n"


def keyring(tmp_path, text: str | None) -> KeyRing:
    if text is None:
        return KeyRing([])
    (tmp_path / "keys.yaml").write_text(text, encoding="utf-8")
    return KeyRing([], str(tmp_path / "keys.yaml"))


def test_one_on_a_cpu_whatever_its_cores(tmp_path):
    assert api_servers(Settings(workers=2), "cpu", keyring(tmp_path, None), cores=64) == 1


def test_on_a_gpu_one_per_cores_the_workers_leave_up_to_the_most(tmp_path):
    keys = keyring(tmp_path, UNLIMITED)
    assert api_servers(Settings(workers=1), "cuda", keys, cores=2) == 1
    assert api_servers(Settings(workers=1), "cuda", keys, cores=1 + 2 * CORES_PER_API_SERVER) == 2
    assert api_servers(Settings(workers=2), "cuda", keys, cores=128) == MOST_API_SERVERS


def test_limits_counted_in_memory_keep_one_process_unless_redis_counts_them(tmp_path):
    keys = keyring(tmp_path, LIMITED)
    assert api_servers(Settings(), "cuda", keys, cores=128) == 1
    assert api_servers(Settings(redis_url="redis://127.0.0.1:1/0"), "cuda", keys, cores=128) == MOST_API_SERVERS


def test_an_explicit_count_is_kept_and_a_split_limit_is_told(tmp_path, caplog):
    keys = keyring(tmp_path, LIMITED)
    with caplog.at_level(logging.WARNING, logger="transerve"):
        assert api_servers(Settings(api_servers=3), "cpu", keys) == 3
    assert "up to 3 times its limits" in caplog.text and "k-team-1" not in caplog.text


def test_the_flag_takes_zero_and_refuses_a_negative_count(capsys):
    assert parse_settings(["--api-servers", "0"]).api_servers == 0
    try:
        parse_settings(["--api-servers", "-1"])
    except SystemExit as stop:
        assert stop.code == 2 and "--api-servers must be 0" in capsys.readouterr().err
    else:
        raise AssertionError("--api-servers -1 was taken")
