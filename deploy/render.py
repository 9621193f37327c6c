#!/usr/bin/env python3
"""Renders a kustomization directory to YAML, like `kubectl kustomize DIR`, for machines without kubectl.

    python deploy/render.py deploy/k8s/overlays/cpu            # all objects, as a YAML stream
    python deploy/render.py deploy/k8s/overlays/gpu -o out.yaml
    python deploy/render.py --prometheus-rule > deploy/k8s/base/prometheusrule.yaml

It implements only the kustomize features deploy/k8s and deploy/grafana use, and refuses anything
else instead of rendering it wrongly: `resources` (files and directories), `patches` (strategic-merge
patch files, merged the way the API server merges them for the kinds we ship), `configMapGenerator`
(envs, literals, files; behavior create/merge/replace; options.labels; disableNameSuffixHash;
the name-suffix hash computed exactly as kustomize v5 does, and the new names written into pod
specs), `generatorOptions` and `images`. tests/test_deploy.py checks that its output equals
`kubectl kustomize` wherever a kubectl binary exists, so the two cannot drift apart silently.

`--prometheus-rule` wraps deploy/prometheus/alerts.yaml (the file promtool tests) into the
PrometheusRule object the Prometheus Operator reads, so the alerts exist in one place only.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "configMapGenerator", "generatorOptions", "images"}

# List merge keys of the strategic merge patch (from the Kubernetes API types): lists under these
# field names merge item by item on the key; every other list is replaced whole, as the API server does.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
    "topologySpreadConstraints": "topologyKey",
}

# kubectl kustomize's default ("legacy") output order, so the two outputs read alike.
KIND_ORDER = ["Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
              "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
              "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
              "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget"]
KIND_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


class RenderError(Exception):
    pass


# --- name-suffix hash (kustomize api/hasher) ---------------------------------------------------------
def _go_json_string(s: str) -> str:
    """A string as Go's encoding/json writes it (HTML-safe escapes, \\u00XX for other controls)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or ch in "<>&\u2028\u2029":
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _go_json(value) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_json_string(k)}:{_go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, str):
        return _go_json_string(value)
    raise RenderError(f"cannot hash {type(value).__name__}")


def configmap_hash(cm: dict) -> str:
    # kustomize v5 looks the name up with a path it never finds, so the name hashes as "": mirrored here.
    m = {"kind": "ConfigMap", "name": "", "data": cm.get("data") or {}}
    if cm.get("binaryData"):
        m["binaryData"] = cm["binaryData"]
    hexdigest = hashlib.sha256(_go_json(m).encode()).hexdigest()[:10]
    return hexdigest.translate(str.maketrans("013ae", "ghkmt"))


# --- strategic merge patch --------------------------------------------------------------------------
def _merge_key(path: tuple[str, ...]) -> str | None:
    if path[-1:] == ("ports",):
        # Container ports merge on containerPort, Service ports on port.
        return "containerPort" if path[-2:-1] in (("containers",), ("initContainers",)) else "port"
    return MERGE_KEYS.get(path[-1]) if path else None


def merge(base, patch, path: tuple[str, ...] = ()):
    """Strategic merge of patch into base (a new object; neither argument is changed)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        if "$patch" in patch:
            raise RenderError("$patch directives are not supported")
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v, path + (k,))
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(patch, list) and isinstance(base, list):
        key = _merge_key(path)
        if not key or not all(isinstance(x, dict) and key in x for x in base + patch):
            return copy.deepcopy(patch)
        out = list(base)
        for item in patch:
            idx = next((i for i, b in enumerate(out) if b[key] == item[key]), None)
            if idx is None:
                out.append(copy.deepcopy(item))
            else:
                out[idx] = merge(out[idx], item, path)
        return out
    return copy.deepcopy(patch)


# --- kustomization ----------------------------------------------------------------------------------
def _load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _env_file(path: Path) -> dict[str, str]:
    data = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise RenderError(f"{path}:{n}: expected KEY=VALUE")
        k, v = line.split("=", 1)
        data[k] = v
    return data


def _generate(spec: dict, root: Path, options: dict) -> dict:
    unknown = set(spec) - {"name", "behavior", "envs", "literals", "files", "options"}
    if unknown:
        raise RenderError(f"configMapGenerator {spec.get('name')}: unsupported {sorted(unknown)}")
    data: dict[str, str] = {}
    for env in spec.get("envs", []):
        data.update(_env_file(root / env))
    for lit in spec.get("literals", []):
        k, v = lit.split("=", 1)
        data[k] = v
    for f in spec.get("files", []):
        key, _, src = f.partition("=") if "=" in f else (Path(f).name, "", f)
        data[key] = (root / src).read_text(encoding="utf-8")
    opts = {**options, **spec.get("options", {})}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec["name"]}, "data": data}
    if opts.get("labels"):
        cm["metadata"]["labels"] = dict(opts["labels"])
    cm["_hash"] = not opts.get("disableNameSuffixHash", False)
    return cm


def _pod_spec(obj: dict) -> dict | None:
    spec = obj.get("spec", {})
    if obj.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec")


def _containers(pod: dict):
    for field in ("initContainers", "containers"):
        yield from pod.get(field, [])


def build(directory: Path) -> list[dict]:
    """The objects of one kustomization, generated ConfigMaps still under their plain names."""
    directory = Path(directory)
    kfile = next((directory / n for n in ("kustomization.yaml", "kustomization.yml", "Kustomization")
                  if (directory / n).exists()), None)
    if kfile is None:
        raise RenderError(f"{directory}: no kustomization.yaml")
    k = yaml.safe_load(kfile.read_text(encoding="utf-8")) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise RenderError(f"{kfile}: render.py does not implement {sorted(unknown)}; use kubectl kustomize")

    objs: list[dict] = []
    for res in k.get("resources", []):
        p = directory / res
        objs.extend(build(p) if p.is_dir() else _load_docs(p))

    def find(kind, name):
        return [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]

    options = k.get("generatorOptions", {})
    for spec in k.get("configMapGenerator", []):
        behavior = spec.get("behavior", "create")
        cm = _generate(spec, directory, options)
        existing = find("ConfigMap", spec["name"])
        if behavior == "create":
            if existing:
                raise RenderError(f"ConfigMap {spec['name']} exists already; use behavior: merge")
            objs.append(cm)
        elif behavior in ("merge", "replace"):
            if len(existing) != 1:
                raise RenderError(f"ConfigMap {spec['name']}: nothing to {behavior}")
            old = existing[0]
            if behavior == "merge":
                old["data"] = {**old.get("data", {}), **cm["data"]}
                if cm["metadata"].get("labels"):
                    old["metadata"].setdefault("labels", {}).update(cm["metadata"]["labels"])
            else:
                old["data"] = cm["data"]
        else:
            raise RenderError(f"unknown behavior {behavior}")

    for p in k.get("patches", []):
        if set(p) - {"path", "target"}:
            raise RenderError(f"{kfile}: only file patches are supported")
        docs = _load_docs(directory / p["path"])
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise RenderError(f"{p['path']}: one strategic-merge patch per file")
        patch = docs[0]
        target = p.get("target") or {"kind": patch["kind"], "name": patch["metadata"]["name"]}
        hits = [o for o in objs if all(o.get(f, o["metadata"].get(f)) == v for f, v in target.items())]
        if not hits:
            raise RenderError(f"{p['path']}: no object matches {target}")
        for o in hits:
            merged = merge(o, patch)
            o.clear()
            o.update(merged)

    for img in k.get("images", []):
        for o in objs:
            pod = _pod_spec(o)
            for c in _containers(pod or {}):
                name = c["image"].split("@")[0]
                name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
                if name == img["name"]:
                    new = img.get("newName", name)
                    if "digest" in img:
                        c["image"] = f"{new}@{img['digest']}"
                    else:
                        tag = img.get("newTag") or (c["image"][len(name) + 1:] if c["image"] != name else "")
                        c["image"] = f"{new}:{tag}" if tag else new
    return objs


def _rename_configmaps(objs: list[dict]) -> None:
    renames = {}
    for o in objs:
        if o["kind"] == "ConfigMap" and o.pop("_hash", False):
            old = o["metadata"]["name"]
            o["metadata"]["name"] = renames[old] = f"{old}-{configmap_hash(o)}"
        o.pop("_hash", None)
    for o in objs:
        pod = _pod_spec(o)
        if not pod:
            continue
        for c in _containers(pod):
            for ef in c.get("envFrom", []):
                ref = ef.get("configMapRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]
        for v in pod.get("volumes", []):
            refs = [v.get("configMap")] + [s.get("configMap") for s in v.get("projected", {}).get("sources", [])]
            for ref in refs:
                if ref and ref.get("name") in renames:
                    ref["name"] = renames[ref["name"]]


def render(directory: Path | str) -> list[dict]:
    objs = build(Path(directory))
    _rename_configmaps(objs)

    def order(o):
        kind = o["kind"]
        rank = (KIND_ORDER.index(kind) if kind in KIND_ORDER
                else len(KIND_ORDER) + 1 + KIND_LAST.index(kind) if kind in KIND_LAST else len(KIND_ORDER))
        return rank, kind, o["metadata"].get("namespace", ""), o["metadata"]["name"]

    return sorted(objs, key=order)


def prometheus_rule() -> dict:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text(encoding="utf-8"))
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "transerve",
                         "labels": {"app.kubernetes.io/name": "transerve", "release": "kube-prometheus-stack"}},
            "spec": {"groups": rules["groups"]}}


PROMETHEUS_RULE_HEADER = """\
# Creates the PrometheusRule that loads transerve's alerts into a Prometheus Operator's Prometheus.
# Generated from deploy/prometheus/alerts.yaml (the file promtool tests): do not edit by hand, run
#   python deploy/render.py --prometheus-rule > deploy/k8s/base/prometheusrule.yaml
# The release label must match your Prometheus's ruleSelector (kube-prometheus-stack's default shown).
"""


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):
        # Sequences indented under their key, as in the hand-written manifests (and yamllint's rule).
        return super().increase_indent(flow, False)


def _str(dumper, value: str):
    # Multi-line strings (PromQL, dashboard JSON) as literal blocks, readable and diffable.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120)


def dump(objs: list[dict]) -> str:
    return "".join("---\n" + to_yaml(o) for o in objs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", nargs="?", help="a kustomization directory, e.g. deploy/k8s/overlays/cpu")
    ap.add_argument("-o", "--output", help="write here instead of stdout")
    ap.add_argument("--prometheus-rule", action="store_true",
                    help="print deploy/prometheus/alerts.yaml as a PrometheusRule object")
    args = ap.parse_args(argv)
    if args.prometheus_rule:
        text = PROMETHEUS_RULE_HEADER + to_yaml(prometheus_rule())
    elif args.directory:
        try:
            text = dump(render(args.directory))
        except RenderError as e:
            print(f"render.py: {e}", file=sys.stderr)
            return 1
    else:
        ap.error("give a kustomization directory or --prometheus-rule")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
