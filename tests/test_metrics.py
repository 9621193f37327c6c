"""service/metrics.py's `labelled`: the child that prometheus_client's labels() gives, made once."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from service.metrics import labelled


def test_labelled_is_the_child_labels_gives_and_counts_into_its_series():
    counter = Counter("t_requests_total", "test", ["endpoint", "status"], registry=CollectorRegistry())
    child = labelled(counter, "translate", "200")
    assert child is counter.labels("translate", "200") is labelled(counter, "translate", "200")
    child.inc()
    labelled(counter, "translate", "200").inc(2)
    labelled(counter, "translate", "400").inc()
    assert counter.labels("translate", "200")._value.get() == 3 and counter.labels("translate", "400")._value.get() == 1
