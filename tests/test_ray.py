"""Ray Data over the engine (service/bulk/ray_bridge.py, the ray extra): on a local Ray cluster this test starts
(2 CPUs), 2,000 sentences of a Parquet file translated by a pool of up to 2 actors (it grows from one while rows
wait) come back equal, row for row, to `transerve translate`'s output for the same options; the callable class
keeps blank and missing texts and the other columns in both batch formats, and refuses options as the command
refuses them."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, pairs64

ray = pytest.importorskip("ray", reason="pip install -e '.[ray]' (in the dev extra)")
pq = pytest.importorskip("pyarrow.parquet", reason="ray[data] brings pyarrow")

MODEL = ROOT / "models" / "de-en"
GERMAN = [de for de, _ in pairs64()]
# Greedy (fast) with two options off their defaults, so a difference in how the options travel would show.
SEARCH = {"beam_size": 1, "no_repeat_ngram_size": 2, "max_length": 40}
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SEARCH.items()]


@pytest.fixture(scope="module")
def cluster():
    # The actors import this checkout's service/ (the editable install may point at another one).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    yield
    ray.shutdown()


def bulk_command(src, dst) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "service.cli", "translate", str(src), "-o", str(dst), "--field",
                             "de", "--to-field", "en", "--model", str(MODEL), "--threads", "1", "--progress", "off",
                             *FLAGS], cwd=ROOT, stderr=subprocess.PIPE, text=True)


def test_2000_sentences_on_a_pool_of_two_actors_equal_the_bulk_commands_output(cluster, tmp_path):
    import pyarrow as pa

    from service.bulk.ray_bridge import main

    rows = [{"id": i, "de": GERMAN[i * 7 % len(GERMAN)]} for i in range(2000)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    command = bulk_command(tmp_path / "in.jsonl", tmp_path / "bulk.jsonl")     # runs beside the Ray job
    # The documented job (docs/ray.md): Parquet in, a directory of Parquet files out, 2 actors of 1 CPU each.
    assert main([str(tmp_path / "in.parquet"), str(tmp_path / "out"), "--column", "de", "--to-column", "en",
                 "--actors", "2", "--batch-rows", "500", "--model", str(MODEL), *FLAGS]) == 0
    assert command.wait(timeout=600) == 0, command.stderr.read()
    expected = [json.loads(line) for line in (tmp_path / "bulk.jsonl").read_text().splitlines()]
    got = sorted(pq.read_table(tmp_path / "out").to_pylist(), key=lambda r: r["id"])
    assert len(got) == len(expected) == 2000
    assert [r["en"] for r in got] == [r["en"] for r in expected]
    assert [r["de"] for r in got] == [r["de"] for r in rows]
    assert all(r["en"].strip() for r in got)


@pytest.fixture(scope="module")
def translate():
    from service.bulk.ray_bridge import Translate

    return Translate(column="de", model=str(MODEL), **SEARCH)


def test_the_callable_class_keeps_blanks_missing_texts_and_other_columns(translate):
    import numpy as np
    import pandas as pd

    texts = np.array([GERMAN[0], "", None, "  ", GERMAN[1]], dtype=object)
    numpy_batch = {"de": texts, "id": np.arange(5)}
    out = translate(numpy_batch)
    assert out["de"][1:4].tolist() == ["", None, "  "] and out["de"].dtype == object
    assert out["id"].tolist() == list(range(5)) and numpy_batch["de"] is texts and texts[0] == GERMAN[0]
    frame = pd.DataFrame({"de": texts, "id": range(5)})
    from_pandas = translate(frame)
    # pandas' missing value stays missing (its string columns hold NaN for None)
    assert from_pandas["de"].isna().tolist() == [False, False, True, False, False] and frame["de"][0] == GERMAN[0]
    assert [t for t in from_pandas["de"] if isinstance(t, str)] == [t for t in out["de"] if t is not None]
    # The command's answer for the same line
    assert out["de"][0] == translate.translator.translate([GERMAN[0]])[0][0] != GERMAN[0]


def test_options_are_refused_as_the_command_refuses_them():
    from service.bulk.ray_bridge import bulk_options

    with pytest.raises(ValueError, match="beam_size"):
        bulk_options(1, {"beam_size": 0})
    with pytest.raises(TypeError, match="url"):
        bulk_options(1, {"url": "http://x"})
    proc = subprocess.run([sys.executable, "-m", "service.cli", "translate", "--beam-size", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "beam_size" in proc.stderr
    o = bulk_options(2, {"beam_size": 4, "model": "m", "target_lang": "de", "source_lang": "en"})
    assert (o.search, o.threads, o.model, o.source_lang) == ({"beam_size": 4}, 2, "m", "en")
