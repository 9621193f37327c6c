"""The allowed imports of docs/architecture.md, checked on the source: which part may import which, that
only the bridge modules touch LitServe's and onnxruntime's private names, that no import loop exists, and
that no function outside tests runs past 60 lines. The checker is tested on planted violations too, so a
rule that stopped looking would fail here."""

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PARTS = ("model", "service")
# LitServe's boundary between HTTP processes and workers has two sides, a bridge each
BRIDGES = {"service.worker.litserve_bridge": "litserve", "service.http.litserve_workers": "litserve",
           "service.inference.onnxruntime_bridge": "onnxruntime", "service.http.fastapi_bridge": "fastapi",
           "service.prometheus_bridge": "prometheus_client"}
# What each part may import (first-party modules by prefix, third-party by top-level name); stdlib is free.
# service/'s folders are layers, each importing only those below it: inference (onnxruntime, no HTTP, no LitServe)
# < worker (LitServe's workers and the scheduler) < http (the core, no routes) < api (the flavours); server.py
# and __main__.py compose them. COMMON are the process-wide modules every layer may use; they import no layer.
COMMON = {"service.config", "service.metrics", "service.prometheus_bridge", "service.stopping", "service.errors",
          "service.keyfile", "service.logs", "service.tracing"}
ALLOWED = {
    "service.shared": {"service.shared", "numpy", "pydantic"},
    "service.client": {"service.shared.options", "service.shared.schemas", "httpx", "pydantic", "typing_extensions"},
    "model": {"model", "service.shared", "torch", "numpy", "sentencepiece", "onnx", "onnxscript", "onnxruntime", "tqdm",
              "sacrebleu", "transformers", "ctranslate2", "yaml", "polib", "huggingface_hub"},
    **{name: {"service.shared", "prometheus_client", "fastapi", "starlette", "pydantic"} for name in COMMON},
    # the keys file's structured form may be YAML; config.py checks it at start-up
    "service.keyfile": {"pydantic", "yaml"},
    # the one module that knows OpenTelemetry (its SDK imported only when OTEL_* turn traces on)
    "service.tracing": {"opentelemetry"},
    "service.config": {"service.shared", "service.keyfile", "prometheus_client", "fastapi", "starlette", "pydantic"},
    # prometheus_client's multiprocess value class, replaced by the one module that knows its layout
    "service.metrics": {"service.shared", "service.prometheus_bridge", "prometheus_client", "fastapi", "starlette",
                        "pydantic"},
    "service.inference": {"service.inference", "service.shared", "numpy", "onnxruntime", "sentencepiece"},
    "service.worker": {"service.worker", "service.inference", "service.shared", *COMMON, "numpy", "litserve"},
    # the worker loop answers a request that waited too long with LitServe's HTTPException (fastapi's)
    "service.worker.litserve_bridge": {"service.worker", "service.shared", *COMMON, "numpy", "litserve", "fastapi"},
    # litserve and onnxruntime: their versions in GET /info
    "service.http": {"service.__init__", "service.http", "service.worker", "service.inference", "service.shared",
                     *COMMON, "numpy", "fastapi", "starlette", "pydantic", "uvicorn", "py3langid", "litserve",
                     "onnxruntime"},
    # the one module that knows the redis client (the limits' counters shared by the replicas)
    "service.http.redis_bridge": {"redis"},
    # the models file (--models-file), YAML as the keys file may be
    "service.http.models_file": {"service.http", "service.shared", *COMMON, "pydantic", "yaml"},
    # the workers' ENDPOINT names: the metrics' endpoint label
    # (service.http.json_body: a body read as FastAPI's body parameter would, by the flavours that read their own)
    "service.api": {"service.__init__", "service.api", "service.http.gateway", "service.http.json_body",
                    "service.shared", "service.documents",
                    *COMMON,
                    "service.worker.translate_api", "service.worker.generate_api", "fastapi", "starlette", "pydantic"},
    # the bulk command (transerve translate): the engine in-process, or a service through the SDK; no HTTP layer.
    # service.config: the documents' limits, defined once there, are the command's too.
    "service.bulk": {"service.bulk", "service.inference", "service.shared", "service.client", "service.documents",
                     "service.config", "pydantic", "polib"},
    # documents read and written with their structure (the files extra's libraries): no engine, no HTTP, so both
    # the bulk command and LibreTranslate's /translate_file use them
    "service.documents": {"service.documents", "service.shared", "polib", "docx", "pptx", "lxml"},
    # the one module that knows Ray (the ray extra): the engine's translator in Ray Data's actors, numpy its batches
    "service.bulk.ray_bridge": {"service.bulk", "service.inference", "service.shared", "ray", "numpy"},
    "service": {"service", "numpy", "onnxruntime", "sentencepiece", "litserve", "fastapi", "starlette", "pydantic",
                "prometheus_client", "uvicorn", "httpx", "py3langid"},
}
# Evaluating a package runs it on the served engine, so BLEU is measured on what is served; calibrating one
# tokenizes its text as the served engine does.
EXCEPTIONS = {("model.evaluate", "service.inference"), ("model.calibrate", "service.inference")}
FIRST_PARTY = {"model", "service"}
MAX_FUNCTION_LINES = 60


def sources(root: Path = ROOT) -> dict[str, str]:
    """module name -> source, for every module of model/ and service/."""
    out = {}
    for part in PARTS:
        for f in sorted((root / part).rglob("*.py")):
            name = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            out[name] = f.read_text(encoding="utf-8")
    return out


def imports(name: str, tree: ast.Module) -> list[tuple[str, list[str], int, bool]]:
    """(imported module, names taken from it, line, for type annotations only) for every import, relative ones
    resolved."""
    out = []
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    package = name if name.count(".") == 0 or name.endswith("__init__") else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno, id(node) in typing_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno, id(node) in typing_only))
    return out


def loaded(target: str, names: list[str], mods: dict[str, str]) -> set[str]:
    """The first-party modules an import loads: `from pkg import sub` loads pkg.sub where that is a module."""
    return ({target} & mods.keys()) | {f"{target}.{n}" for n in names if f"{target}.{n}" in mods}


def rule_for(name: str) -> set[str]:
    return ALLOWED[max((p for p in ALLOWED if name == p or name.startswith(p + ".")), key=len)]


def allowed(target: str, rule: set[str]) -> bool:
    """A first-party module by prefix (a package's "__init__": that module alone, not its parts), a third-party one
    by its top-level name."""
    if f"{target}.__init__" in rule:
        return True
    return any(target == a or target.startswith(a + ".") for a in rule) or target.split(".")[0] in rule


def violations(mods: dict[str, str]) -> list[str]:
    """Every broken rule, one line each; empty when the tree keeps them all."""
    import sys

    found, graph = [], {}
    for name, src in mods.items():
        tree = ast.parse(src)
        graph[name] = set()
        for target, names, line, typing_only in imports(name, tree):
            top = target.split(".")[0]
            if top in FIRST_PARTY:          # a loop of type-only imports is a loop of knowledge all the same
                graph[name] |= loaded(target, names, mods)
            elif top in sys.stdlib_module_names or top == "__future__":
                continue
            if typing_only:                 # for annotations only: nothing is loaded when the program runs
                continue
            excepted = any(name == n and allowed(target, {t}) for n, t in EXCEPTIONS)
            if not allowed(target, rule_for(name)) and not excepted:
                found.append(f"{name}:{line} imports {target} (allowed: {', '.join(sorted(rule_for(name)))})")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if top in BRIDGES.values() and private and BRIDGES.get(name) != top:
                found.append(f"{name}:{line} imports {top}'s private {', '.join(private)} outside its bridge")
        found += private_attributes(name, tree)
        found += long_functions(name, tree)
    return found + [f"import loop: {' -> '.join(c)}" for c in loops(graph)]


def private_attributes(name: str, tree: ast.Module) -> list[str]:
    """x._y where x is not self or cls: another object's private name (allowed only in the bridges)."""
    if name in BRIDGES:
        return []
    return [f"{name}:{n.lineno} uses the private attribute {n.attr}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))]


def long_functions(name: str, tree: ast.Module) -> list[str]:
    return [f"{name}:{n.lineno} {n.name}() has {n.end_lineno - n.lineno + 1} lines (at most {MAX_FUNCTION_LINES})"
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules that import each other (a package's __init__
    importing its own submodules does not count: that is how a package names its parts)."""
    edges = {a: {b for b in bs if b in graph and b != a and not b.startswith(a + ".")} for a, bs in graph.items()}
    seen, cycles = set(), []
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        cycles.append(path + [start])
                elif nxt not in path and len(path) < 8:
                    stack.append((nxt, path + [nxt]))
    return cycles


def test_the_tree_keeps_the_allowed_imports():
    assert violations(sources()) == []


def test_no_function_of_the_benchmarks_or_deploy_scripts_is_over_60_lines():
    files = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "deploy").rglob("*.py"))
    assert files
    assert [v for f in files for v in long_functions(str(f.relative_to(ROOT)), ast.parse(f.read_text()))] == []


@pytest.mark.parametrize("module, line, expected", [
    ("service.shared.options", "import torch", "service.shared.options:1 imports torch"),
    ("service.shared.schemas", "from service.inference.engine import Engine", "imports service.inference.engine"),
    ("service.client", "import numpy", "service.client:1 imports numpy"),
    ("model.train", "from service.inference.engine import Engine", "model.train:1 imports service.inference.engine"),
    ("service.inference.engine", "import torch", "service.inference.engine:1 imports torch"),
    ("service.inference.engine", "from service.worker.scheduler import Job", "imports service.worker.scheduler"),
    ("service.worker.scheduler", "from service.http.gateway import Gateway", "imports service.http.gateway"),
    ("service.http.gateway", "from service.api.native import FLAVOUR", "imports service.api.native"),
    ("service.http.gateway", "import service.server", "imports service.server"),
    ("service.documents.word", "from service.inference.engine import Engine", "imports service.inference.engine"),
    ("service.api.libretranslate_files", "from service.bulk.translators import InProcess", "imports service.bulk"),
    ("service.metrics", "from service.worker.cancel import CancelBoard", "imports service.worker.cancel"),
    ("service.bulk.run", "import ray", "service.bulk.run:1 imports ray"),
    ("service.server", "from litserve.loops.base import _SENTINEL_VALUE", "private _SENTINEL_VALUE outside its bridge"),
    ("service.server", "x = server._shutdown_event", "private attribute _shutdown_event"),
    ("service.shared.search", "from service.shared.schemas import Language", "import loop: "),
    ("service.http.gateway", "if TYPE_CHECKING:\n    from service.server import FLAVOURS",
     "import loop: service.http.gateway"),
    ("model.export", "def f():\n" + "    pass\n" * 61, "f() has 62 lines"),
])
def test_a_planted_violation_is_found(module, line, expected):
    mods = sources()
    if expected == "import loop: ":        # schemas imports options; make options import schemas back
        mods["service.shared.options"] = "from .schemas import Language\n" + mods["service.shared.options"]
        mods["service.shared.schemas"] = "from .options import DEFAULTS\n" + mods["service.shared.schemas"]
    mods[module] = line + "\n" + mods[module]
    found = violations(mods)
    assert any(expected in v for v in found), found


def test_ruff_finds_nothing():
    """The linter configured in pyproject.toml ([tool.ruff]) over the whole tree."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# A search's strategy (sampling, greedy, beam) is decided by SearchOptions.strategy alone; the request mappings
# in shared/schemas.py decide `sampling` from a request's fields, which is what a mapping is for ("temperature 0
# is greedy" among them: a flavour asks the mapping's options, as /v1/completions does).
STRATEGY_TEST = re.compile(r"\.sampling\b|\bbeam(_size)? *(>|==|<=|<) *1\b|\btemperature *== *0\b")
STRATEGY_HOMES = {"service/shared/options.py", "service/shared/schemas.py"}


def strategy_decisions(path: Path, text: str) -> list[str]:
    return [f"{path}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if STRATEGY_TEST.search(line) and not line.lstrip().startswith("#")]


def test_the_strategy_is_decided_in_one_place():
    found = [hit for path in sorted((ROOT / "service").rglob("*.py"))
             if str(path.relative_to(ROOT)) not in STRATEGY_HOMES
             for hit in strategy_decisions(path.relative_to(ROOT), path.read_text(encoding="utf-8"))]
    assert found == [], "ask SearchOptions.strategy (or rows_per_input) instead:\n" + "\n".join(found)
    planted = strategy_decisions(Path("x.py"), "if options.sampling or options.beam_size == 1:\n    pass\n")
    assert planted == ["x.py:1: if options.sampling or options.beam_size == 1:"]
    planted = strategy_decisions(Path("y.py"), "greedy = body.temperature == 0\n")
    assert planted == ["y.py:1: greedy = body.temperature == 0"]
