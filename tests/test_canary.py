"""A canary (service/http/model_control.py): a candidate version beside the active one, on a real server. At 10% it
serves 8-12% of 2,000 requests, each answer naming its version in the body and the X-Model-Version header; a named
key's requests all go to it; the requests are counted by version in /metrics; promote and rollback are one call
each, after which one version serves every request and /metrics no longer lists the other."""

import asyncio
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import start_server, stop_server
from test_model_control import ADMIN, PACKAGE, keys_files, new_version

KEYS = {"team-a": "team-a-key-0001", "team-b": "team-b-key-0002"}
REQUESTS = 2000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("canary")
    _, admins = keys_files(root)
    users = root / "users.yaml"
    users.write_text("keys:\n" + "".join(f"  - name: {n}\n    key: {k}\n" for n, k in KEYS.items()))
    proc, url = start_server(PACKAGE, "--api-keys-file", str(users), "--admin-keys-file", str(admins))
    try:
        yield url, root
    finally:
        stop_server(proc)


def admin(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + "/admin/models" + path, json=body, headers=ADMIN, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def versions_served(url: str, n: int, key: str = "team-b", clients: int = 16) -> list[tuple[str, str]]:
    """(body's model_version, X-Model-Version) of `n` one-word translations sent by `clients` at once."""
    out: list[tuple[str, str]] = []

    async def run() -> None:
        todo = iter(range(n))

        async def one() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60,
                                         headers={"Authorization": f"Bearer {KEYS[key]}"}) as http:
                for _ in todo:
                    r = await http.post("/translate", json={"text": "Hallo.", "source_lang": "de",
                                                            "target_lang": "en", "beam_size": 1})
                    assert r.status_code == 200, r.text
                    out.append((r.json()["model_version"], r.headers["x-model-version"]))

        await asyncio.gather(*(one() for _ in range(clients)))
    asyncio.run(run())
    return out


def version_labels(url: str) -> set:
    """The versions /metrics names: (model, version) of the HTTP processes' series, the slot (a `model` label) of
    the workers'."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['team-a']}"}).text
    return {(s.labels["model"], s.labels["version"]) if "version" in s.labels else s.labels["model"]
            for family in text_string_to_metric_families(text) for s in family.samples if "model" in s.labels}


def test_a_canary_at_10_percent_serves_8_to_12_percent_of_2000_requests_each_naming_its_version(server):
    url, root = server
    active = httpx.get(url + "/admin/models", headers=ADMIN).json()["models"][0]["active"]
    model = admin(url, "", {"path": str(new_version(root, "cand-1")), "canary": {"share": 0.1}})
    assert model["active"] == active and model["candidate"] == "cand-1" and model["canary_share"] == 0.1
    served = versions_served(url, REQUESTS)
    assert len(served) == REQUESTS and all(body == header for body, header in served)
    assert {body for body, _ in served} == {active, "cand-1"}
    share = sum(body == "cand-1" for body, _ in served) / REQUESTS
    assert 0.08 <= share <= 0.12, share
    metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['team-a']}"}).text
    counted = {v: float(n) for v, n in re.findall(
        r'transerve_model_version_requests_total\{model="de-en",outcome="ok",version="([^"]+)"\} (\S+)', metrics)}
    assert counted["cand-1"] == sum(body == "cand-1" for body, _ in served)
    assert re.search(r'transerve_model_version_request_duration_seconds_count\{model="de-en",version="cand-1"\}',
                     metrics)


def test_named_keys_get_the_candidate_and_rollback_then_promote_are_one_call_each(server):
    url, root = server
    listing = httpx.get(url + "/admin/models", headers=ADMIN).json()["models"][0]
    active, candidate = listing["active"], listing["candidate"]
    assert candidate == "cand-1"                         # from the test before
    admin(url, "/canary", {"name": "de-en", "share": 0.0, "keys": ["team-a"]})
    assert {v for v, _ in versions_served(url, 40, key="team-a", clients=4)} == {candidate}
    assert {v for v, _ in versions_served(url, 40, key="team-b", clients=4)} == {active}
    assert {("de-en", candidate), "de-en@cand-1", ("de-en", active), "de-en"} <= version_labels(url)
    model = admin(url, "/rollback", {"name": "de-en"})
    assert model["candidate"] is None and [v["version"] for v in model["versions"]] == [active]
    served = version_labels(url)
    assert ("de-en", candidate) not in served and "de-en@cand-1" not in served      # unloaded: its labels gone
    assert {("de-en", active), "de-en"} <= served
    assert {v for v, _ in versions_served(url, 40, key="team-a", clients=4)} == {active}
    admin(url, "", {"path": str(new_version(root, "cand-2")), "canary": {"keys": ["team-a"]}})
    assert {v for v, _ in versions_served(url, 40, key="team-a", clients=4)} == {"cand-2"}
    model = admin(url, "/promote", {"name": "de-en"})
    assert model["active"] == "cand-2" and [v["version"] for v in model["versions"]] == ["cand-2"]
    assert {v for v, _ in versions_served(url, 40, key="team-b", clients=4)} == {"cand-2"}
    served = version_labels(url)     # the start-up version's too: its slot was the model's name
    assert {("de-en", "cand-2"), "de-en@cand-2"} <= served and not {("de-en", active), "de-en"} & served
    assert {label for label in served if "de-en" in label} == {("de-en", "cand-2"), "de-en@cand-2"}
