"""Settings from flags and TRANSERVE_* variables: the API keys file (--api-keys-file /
TRANSERVE_API_KEYS_FILE), which deploy/k8s mounts from a Secret instead of passing keys in the
environment; what --help says of each flag."""

from __future__ import annotations

import pytest

from service.config import parse_settings, read_api_keys_file


@pytest.fixture(autouse=True)
def no_key_environment(monkeypatch):
    for name in ("TRANSERVE_API_KEYS", "TRANSERVE_API_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_keys_file_one_key_per_line_skips_blanks_and_comments(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# team A\nkey-one\n\n   key-two  \n  # rotated out: old-key\nkey-three\n")
    assert read_api_keys_file(str(f)) == ["key-one", "key-two", "key-three"]
    s = parse_settings(["--api-keys-file", str(f)])
    assert s.api_keys == ["key-one", "key-two", "key-three"]
    assert s.public()["auth"] is True and "key-one" not in repr(s.public())


def test_keys_file_from_the_environment_adds_to_listed_keys(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    f.write_text("from-file\nshared\n")
    monkeypatch.setenv("TRANSERVE_API_KEYS_FILE", str(f))
    monkeypatch.setenv("TRANSERVE_API_KEYS", "from-env,shared")
    assert parse_settings([]).api_keys == ["from-env", "shared", "from-file"]
    # The flag wins over the variable.
    other = tmp_path / "other"
    other.write_text("other-key\n")
    assert parse_settings(["--api-keys-file", str(other)]).api_keys == ["from-env", "shared", "other-key"]


def test_keys_file_windows_line_endings(tmp_path):
    f = tmp_path / "keys"
    f.write_bytes(b"alpha\r\nbeta\r\n")
    assert read_api_keys_file(str(f)) == ["alpha", "beta"]


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n   \n"])
def test_keys_file_without_a_key_is_refused(tmp_path, content, capsys):
    f = tmp_path / "keys"
    f.write_text(content)
    with pytest.raises(SystemExit):
        parse_settings(["--api-keys-file", str(f)])
    assert "holds no key" in capsys.readouterr().err


def test_missing_keys_file_is_refused_not_ignored(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_settings(["--api-keys-file", str(tmp_path / "absent")])
    assert "cannot read the API keys file" in capsys.readouterr().err


def test_no_keys_file_means_no_authentication():
    s = parse_settings([])
    assert s.api_keys == [] and s.api_keys_file == "" and s.public()["auth"] is False


def help_lines(monkeypatch, capsys) -> dict[str, str]:
    """`python -m service --help`: each flag's description (after the flag on its line, or on the next)."""
    monkeypatch.setenv("COLUMNS", "1000")   # no wrapping within a description
    with pytest.raises(SystemExit):
        parse_settings(["--help"])
    out: dict[str, str] = {}
    flag = None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  --"):
            flag, _, text = line.strip().partition("  ")
            flag = flag.split()[0].rstrip(",")
            out[flag] = text.strip()
        elif flag and line.startswith("   "):
            out[flag] = (out[flag] + " " + line.strip()).strip()
    return out


def test_every_flag_says_what_it_does(monkeypatch, capsys):
    flags = help_lines(monkeypatch, capsys)
    assert len(flags) > 30, flags
    bare = [flag for flag, text in flags.items() if text.startswith("(env") or not text]
    assert bare == [], bare
    assert "X-API-Key" in flags["--api-keys"] and "Bearer" in flags["--api-keys"]


def test_help_never_shows_a_key_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("TRANSERVE_API_KEYS", "s3cret-from-env")
    text = help_lines(monkeypatch, capsys)["--api-keys"]
    assert "s3cret" not in text and "default given" in text, text


def test_a_structured_keys_file_is_checked_at_start_and_keeps_its_keys_out_of_api_keys(tmp_path, capsys):
    f = tmp_path / "keys.yaml"
    f.write_text("keys:\n  - name: team-a\n    key: s3cret\n    limits: {characters_per_minute: 1000}\n")
    s = parse_settings(["--api-keys-file", str(f)])
    assert s.api_keys == [] and s.keyed and s.public()["auth"] is True   # its keys have names: http/keys.py
    f.write_text("keys:\n  - name: team-a\n    key: s3cret\n    limits: {characters_per_minute: many}\n")
    with pytest.raises(SystemExit):
        parse_settings(["--api-keys-file", str(f)])
    err = capsys.readouterr().err
    assert "malformed" in err and "characters_per_minute" in err and "s3cret" not in err


def test_redis_settings_hide_the_url_and_check_the_choice(monkeypatch, capsys):
    monkeypatch.setenv("TRANSERVE_REDIS_URL", "redis://:pa55word@redis:6379/0")
    s = parse_settings(["--redis-down", "refuse", "--redis-timeout-ms", "50"])
    assert s.redis_url.endswith("@redis:6379/0") and s.redis_down == "refuse" and s.redis_timeout_ms == 50
    assert s.public()["redis"] is True and "pa55word" not in repr(s.public())
    assert "pa55word" not in help_lines(monkeypatch, capsys)["--redis-url"]
    with pytest.raises(SystemExit):
        parse_settings(["--redis-down", "maybe"])
    assert "--redis-down must be admit or refuse" in capsys.readouterr().err


def test_log_format_is_text_or_json():
    assert parse_settings([]).log_format == "text"
    assert parse_settings(["--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        parse_settings(["--log-format", "xml"])


@pytest.mark.parametrize("url, words", [
    ("127.0.0.1:6379", "must start with redis://"),                   # every request reading Redis was a 500
    ("redis://:Kx9/Qm2SecretTail+w==@127.0.0.1:6379/0", "percent-encoded"),   # the start's traceback held "Kx9"
    ("redis://:Kx9#Qm2SecretTail@127.0.0.1:6379/0", "percent-encoded"),
    ("redis://127.0.0.1:6379/zero", "database"),
])
def test_a_redis_url_that_cannot_be_opened_stops_the_start_without_quoting_it(url, words, capsys):
    with pytest.raises(SystemExit):
        parse_settings(["--redis-url", url])
    err = capsys.readouterr().err
    assert words in err and "Kx9" not in err and "SecretTail" not in err, err


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "redis://:Kx9%2FQm2@10.0.0.1/3", "rediss://r.example:6380",
                                 "unix:///run/redis.sock"])
def test_a_redis_url_that_can_be_opened_is_taken(url):
    assert parse_settings(["--redis-url", url]).redis_url == url
