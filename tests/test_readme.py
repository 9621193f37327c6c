"""The code blocks of the README and of the docs/ pages, as a user pastes them.

- The README's main command block (`bash scripts/serve.sh`, then curl) and its SDK snippet run as written,
  against the server that command starts, in the environment it builds (only the port is changed to a free
  one).
- Every other block's commands, in the README and in docs/*.md: each `python -m …` (and each tool) exists,
  and every option a block gives it is one the command knows (its --help); `bash scripts/serve.sh ARGS`
  passes ARGS on to `python -m service`, so they are checked against its --help. Running them in full means
  hours of training: tests/test_train.py, test_recipe.py, test_generation.py and test_marian.py run the
  same commands on small data.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import ROOT, free_port, wait_ready

README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(bash|python)\n(.*?)```", text, re.S)]


README_BLOCKS = blocks(README)
BLOCKS = [block for page in PAGES for block in blocks(page.read_text(encoding="utf-8"))]
MAIN = next(code for lang, code in README_BLOCKS if lang == "bash" and code.startswith("bash scripts/serve.sh\n"))
SDK = next(code for lang, code in README_BLOCKS if lang == "python" and "from service.client import" in code)
SERVE_VENV = ROOT / ".venv-serve"


def commands(code: str) -> list[list[str]]:
    """A bash block's command lines as argument lists: continuations joined, comments dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["timeout"]:                       # timeout [-k N] SECONDS command ...
            words = words[next(i for i, w in enumerate(words[1:], 1) if w[0].isdigit() and words[i - 1] != "-k"):][1:]
        while words:                                        # a pipeline: each of its commands
            cut = words.index("|") if "|" in words else len(words)
            if words[:cut]:
                out.append([w.strip("[]") for w in words[:cut]])
            words = words[cut + 1:]
    return out


def options(words: list[str]) -> list[str]:
    return [w.split("=")[0] for w in words if w.startswith("--") and w != "--"]


@lru_cache(maxsize=None)
def help_text(*command: str) -> str:
    proc = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(command)} --help: {proc.stderr[-1500:]}"
    return proc.stdout


def checked_commands() -> list[tuple[list[str], list[str]]]:
    """(command, the options a page gives it) for every command of every block of the README and the docs/
    pages but the main one and the test command (which runs this test)."""
    out = []
    for lang, code in BLOCKS:
        if lang != "bash" or code == MAIN or "scripts/test.sh" in code:
            continue
        for words in commands(code):
            if words[:3] == ["python", "-m", "model.recipe"] and "--" in words:   # recipe -- model.train options
                cut = words.index("--")
                out += [(["python", "-m", "model.recipe"], options(words[3:cut])),
                        (["python", "-m", "model.train"], options(words[cut + 1:]))]
            elif words[:2] == ["python", "-m"]:
                out.append((words[:3], options(words[3:])))
            elif words[:2] == ["bash", "scripts/serve.sh"]:                     # its arguments go to the service
                out.append((["python", "-m", "service"], options(words[2:])))
            elif words[0] == "python" and words[1:2] and words[1].endswith(".py"):   # a script: its own --help
                out.append((words[:2], options(words[2:])))
            elif words[0] == "transerve":                                      # its subcommand's own --help
                out.append((words[:2], options(words[2:])))
            elif words[0] not in ("pip", "sh", "bash", "curl", "zcat", "gzip"):
                out.append((words[:1], options(words[1:])))
    return out


@pytest.mark.parametrize("command, given", checked_commands(), ids=lambda v: " ".join(v)[:60])
def test_each_command_of_the_readme_and_docs_knows_the_options_it_is_given(command, given):
    executable = [sys.executable, *command[1:]] if command[0] == "python" else \
        [str(Path(sys.executable).parent / command[0]), *command[1:]]
    text = help_text(*executable)
    assert [o for o in given if o not in text] == [], text


@pytest.fixture(scope="module")
def main_command():
    """`bash scripts/serve.sh` as the README gives it, on a free port: the serving-only environment it builds
    (.venv-serve), both embedded packages."""
    first = commands(MAIN)[0]
    assert first == ["bash", "scripts/serve.sh"], first
    port = free_port()
    proc = subprocess.Popen([*first, "--port", str(port)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:                                                   # a fresh machine installs the environment first
        if not wait_ready(f"http://127.0.0.1:{port}", proc, 900):
            pytest.fail("scripts/serve.sh did not become ready in 15 minutes")
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_the_main_command_block_answers_as_written(main_command):
    rest = "\n".join(line for line in MAIN.splitlines() if "scripts/serve.sh" not in line)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", rest.replace(":8000", f":{main_command}")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["translations"][0]["text"] and answer["source_lang"] == "de" and answer["target_lang"] == "en"


def test_the_sdk_snippet_runs_in_the_main_commands_environment(main_command):
    proc = subprocess.run([str(SERVE_VENV / "bin" / "python"), "-c", SDK.replace(":8000", f":{main_command}")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    translated, generated, streamed = proc.stdout.split("\n", 2)
    assert translated.strip() and generated.strip() and streamed.strip()
    assert streamed.endswith("\n") and streamed.count("\n") == 1, proc.stdout   # the stream ends its line


def test_the_main_command_starts_again_without_a_package_index(main_command):
    """Once `bash scripts/serve.sh` has set up .venv-serve (the fixture), it starts again with no index:
    pip runs only when pyproject.toml or the script's install lines change."""
    port = free_port()
    proc = subprocess.Popen([*commands(MAIN)[0], "--port", str(port)], cwd=ROOT, start_new_session=True,
                            env=dict(os.environ, PIP_NO_INDEX="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", proc, 300)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert "serve.sh: installing" not in out, out[-3000:]


def test_the_readme_installs_torch_as_the_test_script_does():
    """The Install block's torch command is scripts/test.sh's: the CPU build from PyTorch's own index, PyPI
    beside it, few retries (an unreachable index costs seconds)."""
    install = next(code for lang, code in BLOCKS if lang == "bash" and "pip install torch" in code)   # docs/training.md
    readme = next(words for words in commands(install) if words[:3] == ["pip", "install", "torch==2.13.0"])
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(line for line in script.splitlines() if "pip install" in line and "torch==" in line)
    words = shlex.split(line.replace('"$PY" -m pip', "pip").replace("|| return", ""))
    assert [w for w in words if w not in ("--progress-bar", "off")] == readme
    assert readme[readme.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert readme[readme.index("--extra-index-url") + 1] == "https://pypi.org/simple"


def test_the_readme_says_what_the_test_script_installs_as_root_and_how_to_do_without():
    """scripts/test.sh run as root installs Debian packages: the README names each, and the switch that runs
    the suite without them."""
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    packages = {word for found in re.findall(r"--no-install-recommends ([^>|&]+)", script) for word in found.split()}
    assert {"prometheus", "chromium", "buildah"} <= packages, packages
    start = README.index("bash scripts/test.sh\n```")
    said = README[start:README.index("\n## ", start)]
    assert [p for p in sorted(packages) if f"`{p}`" not in said] == [], said
    assert "TRANSERVE_APT=0 bash scripts/test.sh" in said and "TRANSERVE_APT" in script


def test_the_readme_starts_where_a_user_starts():
    """The quick start, the warning on the default model's quality right after it, and the route table all
    within the README's first 120 lines (issue 28); the port is changed as the README says."""
    lines = README.splitlines()
    head = "\n".join(lines[:120])
    assert "bash scripts/serve.sh\ncurl" in head and "translates poorly" in head
    quality = next(i for i, line in enumerate(lines) if "translates poorly" in line)
    curl_end = next(i for i, line in enumerate(lines) if '"target_lang": "en"}' in line)
    assert 0 < quality - curl_end <= 4, "the quality warning must follow the quick start's curl"
    table_end = max(i for i, line in enumerate(lines) if line.startswith("| `GET /docs`"))
    assert table_end < 120
    routes = "\n".join(line for line in lines if line.startswith("| `"))
    for route in ("/translate", "/generate", "/v1/completions", "/v1/models", "/libretranslate/translate",
                  "/languages", "/ui", "/health", "/ready", "/info", "/metrics", "/docs", "/redoc"):
        assert route in routes, route
    assert "bash scripts/serve.sh --port" in head


def test_the_docs_pages_links_resolve():
    """Relative links in the README and docs/ pages (text moved between them) point at files that exist."""
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://")) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
