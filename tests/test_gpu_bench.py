"""benchmarks/gpu.py where there is no GPU (CI): every part that needs no CUDA runs on the tiny package and
prints its counts, every CUDA part is reported as skipped rather than passed, no GPU ratio is made up, and
asking for CUDA where it is not running stops the command with exit status 2."""

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")
sys.path.insert(0, str(ROOT / "benchmarks"))


def cuda_here() -> bool:
    import ctranslate2
    import onnxruntime

    return ("CUDAExecutionProvider" in onnxruntime.get_available_providers()
            and ctranslate2.get_cuda_device_count() > 0)


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_on_a_cpu_runs_the_cpu_parts_and_reports_the_cuda_parts_skipped(tiny_package):
    # On a machine with CUDA the CPU parts are what this test is about: ask for them.
    # A 12-token budget (--quick's CPU default is 24): what is checked is the report, not the figures.
    r = run("--package", str(tiny_package), "--quick", "--max-length", "12",
            *(["--device", "cpu"] if cuda_here() else []))
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-4000:]
    for search in ("beam 4", "greedy"):
        same = re.search(rf"^agreement int8 vs fp32, {search}: same tokens on (\d+) of 64 sentences", out, re.M)
        assert same, out
        for precision in ("int8", "fp32"):
            # Batch invariance holds on a CPU in every precision we ship: here it is a goal, and met.
            line = re.search(rf"^invariance {precision}, {search}: (\d+) of (\d+) searches differ.*: (\w+)$", out, re.M)
            assert line and line.group(1) == "0" and int(line.group(2)) > 0 and line.group(3) == "PASS", out
    for size in (1, 8, 32, 64):
        assert re.search(rf"^speed beam 4 batch +{size}: ours int8 +[\d,]+ tok/s .* CTranslate2 int8 +[\d,]+ tok/s",
                         out, re.M), out
    assert re.search(r"^served \(int8, server --device cpu, /info says cpu\): [\d,]+ tok/s", out, re.M), out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and "fp16 vs fp32 agreement" in skipped[0] and "CUDA provider check" in skipped[0], out
    assert "CUDA provider check: every session" not in out     # never reported as passed
    assert "engine_fp16=" not in out
    lines = out.strip().splitlines()
    assert re.fullmatch(r"served_vs_engine_cpu int8=\d+\.\d\d", lines[-3]), lines[-3]
    assert re.fullmatch(r"ratio_vs_ctranslate2_cpu engine_int8=\d+\.\d\d served=\d+\.\d\d", lines[-2]), lines[-2]
    assert lines[-1].startswith("ratio_vs_ctranslate2_gpu skipped: no CUDA here"), lines[-1]


@pytest.mark.skipif(cuda_here(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_stops_with_the_reason(tiny_package):
    r = run("--package", str(tiny_package), "--device", "cuda", timeout=120)
    assert r.returncode == 2
    assert "error: --device cuda, but onnxruntime" in r.stderr and "CUDAExecutionProvider" in r.stderr, r.stderr
    assert "ratio_vs_ctranslate2" not in r.stdout


def test_a_session_that_fell_back_to_the_cpu_stops_the_run(capsys):
    """onnxruntime creates a CPU session when its CUDA provider does not load; the benchmark reads each
    session's own providers rather than trusting what it asked for."""
    import gpu

    cpu = SimpleNamespace(get_providers=lambda: ["CPUExecutionProvider"])
    cuda = SimpleNamespace(get_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    gpu.require_cuda(SimpleNamespace(encoder=cuda, decoder=cuda), "fp16")
    with pytest.raises(SystemExit) as stop:
        gpu.require_cuda(SimpleNamespace(encoder=cuda, decoder=cpu), "fp16")
    assert stop.value.code == 2
    assert "decoder session runs on ['CPUExecutionProvider']" in capsys.readouterr().err


def test_without_ctranslate2_the_tables_and_ratios_say_skipped_and_served_is_held_to_our_engine():
    """A GPU machine without a CTranslate2 that runs there (2026-11-28's H200: CUDA 13, and its wheel links CUDA
    12's cuBLAS): ours are measured alone, every CTranslate2 figure says skipped, and served is still compared."""
    import gpu

    ours = {"tok_s": 14756.0, "p50_ms": 40.7}
    rows = [{"batch": 64, "ours": ours, "ct2": None, "ratio": None, "settings": {"ours": "1"}}]
    assert gpu.speed_table(rows)[-1] == "| 64 | 14,756 | skipped | – | 40.7 | skipped |"
    setup = gpu.Setup("cuda", [], {}, {}, "de-en", "en", "ctranslate2 not installed")
    http = {"tok_s": 2633.0, "p50_ms": 89.8, "alone_p50_ms": 29.1, "device": "cuda"}
    assert gpu.summary_lines(setup, rows[0], http) == [
        "served_vs_engine_cuda fp16=0.18", "ratio_vs_ctranslate2_cuda skipped: ctranslate2 not installed"]
    assert "0.18x our engine fp16 offline batch 64; CTranslate2 skipped" in gpu.served_line(setup, http, rows[0])
    assert gpu.ctranslate2_problem("cpu", wanted=False) == "--no-ctranslate2"


def test_a_server_that_did_not_start_is_reported_failed_and_the_report_still_ends():
    """2026-11-28's H200 lacked a package the server imports: the served part failed, and with it the whole report."""
    import gpu

    setup = gpu.Setup("cuda", [], {}, {}, "de-en", "en", "ctranslate2 not installed")
    row = {"batch": 64, "ours": {"tok_s": 100.0, "p50_ms": 1.0}, "ct2": None, "ratio": None, "settings": {}}
    line = gpu.served_line(setup, {"error": "the service did not become ready"}, row)
    assert line == "served: FAILED: the service did not become ready"
    assert gpu.summary_lines(setup, row, None)[0] == "served_vs_engine_cuda fp16=n/a"
