#!/usr/bin/env python3
"""Prints deploy/prometheus/alerts.yaml (the rule file promtool tests and compose loads) wrapped in the
PrometheusRule object a Prometheus Operator reads, so the alerts are written in one place only:

    python deploy/prometheus/prometheusrule.py > deploy/k8s/base/prometheusrule.yaml

tests/test_deploy.py fails, naming this command, when the committed PrometheusRule and alerts.yaml differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ALERTS = Path(__file__).resolve().parent / "alerts.yaml"

HEADER = """\
# Creates the PrometheusRule that loads transerve's alerts into a Prometheus Operator's Prometheus.
# Generated from deploy/prometheus/alerts.yaml (the file promtool tests): do not edit by hand, run
#   python deploy/prometheus/prometheusrule.py > deploy/k8s/base/prometheusrule.yaml
# The release label must match your Prometheus's ruleSelector (kube-prometheus-stack's default shown).
"""


def prometheus_rule() -> dict:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "transerve",
                         "labels": {"app.kubernetes.io/name": "transerve", "release": "kube-prometheus-stack"}},
            "spec": {"groups": rules["groups"]}}


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):
        # Sequences indented under their key, as in the hand-written manifests (and yamllint's rule).
        return super().increase_indent(flow, False)


def _str(dumper, value: str):
    # Multi-line strings (PromQL) as literal blocks, readable and diffable.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def main() -> int:
    sys.stdout.write(HEADER + yaml.dump(prometheus_rule(), Dumper=_Dumper, sort_keys=False, width=110))
    return 0


if __name__ == "__main__":
    sys.exit(main())
