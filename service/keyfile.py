"""The API keys file, in either of its forms, read into Tenants: who a key is (its name, what metrics and logs
show: never the key) and what it may use. Process-wide: config.py checks the file at start-up, the HTTP core
(http/keys.py) re-reads it on SIGHUP and when it changes.

The plain form, one key per line (blank lines and `#` comments skipped), gives keys without limits, each named
`key-` and the first 8 hex digits of its SHA-256. The structured form, YAML or JSON (told from the plain form by
its first line: `{` or `keys:`), names each key and gives its limits:

    keys:
      - name: team-a
        key: s3cret                 # or sha256: <64 hex digits>, so that the file need not hold the key
        limits:                     # each optional; absent: no limit
          requests_per_minute: 600
          characters_per_minute: 20000    # translation: the characters of the texts sent
          characters_per_day: 2000000
          tokens_per_day: 500000          # generation: prompt and generated tokens
        routes: [/translate, /libretranslate/translate]   # absent: every route
        models: [de-en]                                    # absent: every model
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class KeysFileError(ValueError):
    """Why a keys file cannot be used; never quotes a key."""


# --- what a key is, once read -----------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What a key may use in each window (None: no limit). Windows start at the key's first request in them
    (service/http/quota.py says why)."""
    requests_per_minute: int | None = None
    characters_per_minute: int | None = None
    characters_per_day: int | None = None
    tokens_per_day: int | None = None

    def given(self) -> dict[str, int]:
        return dict(self._given)

    @functools.cached_property
    def _given(self) -> dict[str, int]:
        # Read on every request of its key (quota.py): dataclasses.fields() was 1-2% of the HTTP process's CPU.
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class Tenant:
    """One key: its name, the SHA-256 of the key (the key itself is not kept), its limits and what it may
    use (None: everything)."""
    name: str
    digest: bytes
    limits: Limits = Limits()
    routes: frozenset[str] | None = None
    models: frozenset[str] | None = None


def digest_of(key: str) -> bytes:
    # surrogatepass: a header's bytes decoded as Latin-1, or a body's lone surrogate, still hash
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def plain_tenant(key: str) -> Tenant:
    digest = digest_of(key)
    return Tenant(f"key-{digest.hex()[:8]}", digest)


# --- the structured form, as written ------------------------------------------------------------------
class _LimitsEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(None, ge=0)
    characters_per_minute: int | None = Field(None, ge=0)
    characters_per_day: int | None = Field(None, ge=0)
    tokens_per_day: int | None = Field(None, ge=0)


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    key: str | None = Field(None, min_length=1)
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    limits: _LimitsEntry = _LimitsEntry()
    routes: list[str] | None = None
    models: list[str] | None = None

    @model_validator(mode="after")
    def one_key(self) -> _KeyEntry:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of key and sha256")
        return self


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[_KeyEntry] = Field(..., min_length=1)


def structured(text: str) -> bool:
    """Whether a keys file is in the structured form: its first line that is no comment opens a JSON object
    or a YAML mapping of `keys:`."""
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    return first.startswith("{") or first.startswith("keys:")


def parse_structured(text: str, path: str) -> list[Tenant]:
    json_form = text.lstrip().startswith("{")
    try:
        data = json.loads(text) if json_form else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        # Only where: a parser's own message may quote the line at fault, which may hold a key.
        mark = getattr(e, "problem_mark", None)
        line = getattr(e, "lineno", None) or (mark.line + 1 if mark else "?")
        raise KeysFileError(f"the API keys file {path} is not valid {'JSON' if json_form else 'YAML'} "
                            f"(line {line})") from None
    try:
        entries = _KeysFile.model_validate(data).keys
    except ValidationError as e:   # pydantic's messages name the field, not its value
        why = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:3])
        raise KeysFileError(f"the API keys file {path} is malformed: {why}") from None
    tenants = [Tenant(e.name, digest_of(e.key) if e.key is not None else bytes.fromhex(e.sha256 or ""),
                      Limits(**e.limits.model_dump()), None if e.routes is None else frozenset(e.routes),
                      None if e.models is None else frozenset(e.models)) for e in entries]
    check_unique(tenants, path)
    return tenants


def check_unique(tenants: list[Tenant], path: str) -> None:
    names = [t.name for t in tenants]
    if dup := next((n for n in names if names.count(n) > 1), None):
        raise KeysFileError(f"the API keys file {path} names {dup!r} twice: each key needs its own name")
    if len({t.digest for t in tenants}) < len(tenants):
        raise KeysFileError(f"the API keys file {path} gives one key twice (under {len(tenants)} names)")


def plain_keys(text: str) -> list[str]:
    keys = [line.strip() for line in text.splitlines()]
    return [k for k in keys if k and not k.startswith("#")]


def read_keys_file(path: str) -> list[Tenant]:
    """The Tenants of a keys file in either form, or KeysFileError: unreadable, malformed, or holding no key
    (a Secret created empty by mistake must not turn authentication off without a word)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeysFileError(f"cannot read the API keys file {path}: {e}") from None
    if structured(text):
        return parse_structured(text, path)
    keys = plain_keys(text)
    if not keys:
        raise KeysFileError(f"the API keys file {path} holds no key (one per line; # starts a comment)")
    return [plain_tenant(k) for k in dict.fromkeys(keys)]
