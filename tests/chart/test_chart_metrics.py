"""The chart's metrics: worker and scheduler pods expose the port the controller serves, and the
optional ServiceMonitor, PrometheusRule and Grafana dashboard use only metrics the controller
exports (off by default)."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.chart.test_chart import CREDENTIALS, NAMESPACE, chart, helm, merge, of_kind, one, render  # noqa: F401
from tests.support.metrics import exported

ALL_ON = {"metrics": {k: {"enabled": True} for k in ("serviceMonitor", "prometheusRule", "grafanaDashboard")}}


def used_in(expression: str) -> set[str]:
    return set(re.findall(r"\bcontroller_[a-z_]+\b", expression))


def test_metrics_objects_are_off_by_default(chart: Any) -> None:  # noqa: F811
    objects = render(chart, CREDENTIALS)
    assert not [o for o in objects if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert not [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_receiver_worker_and_scheduler_expose_the_port_the_controller_serves(chart: Any) -> None:  # noqa: F811
    """The receiver's metrics port is a port of its own, not on its Service (nor its Ingress)."""
    objects = render(chart, CREDENTIALS)
    [config] = [o for o in of_kind(objects, "ConfigMap") if "CONTROLLER_RUNNER" in o.get("data", {})]
    assert config["data"]["CONTROLLER_METRICS_PORT"] == "9090"
    public = one(objects, "Service", "demo-sandbox-controller-receiver")
    assert [p["name"] for p in public["spec"]["ports"]] == ["http"]
    for component in ("receiver", "worker", "scheduler"):
        [container] = one(objects, "Deployment", f"demo-sandbox-controller-{component}")["spec"]["template"]["spec"][
            "containers"
        ]
        assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    off = render(chart, merge(CREDENTIALS, {"metrics": {"port": 0}}))
    [worker] = one(off, "Deployment", "demo-sandbox-controller-worker")["spec"]["template"]["spec"]["containers"]
    assert "ports" not in worker


def test_service_monitor_scrapes_receiver_workers_and_scheduler(chart: Any) -> None:  # noqa: F811
    objects = render(chart, merge(CREDENTIALS, ALL_ON))
    [monitor] = of_kind(objects, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in of_kind(objects, "Service") if selector.items() <= s["metadata"]["labels"].items()]
    ports = {
        (s["metadata"]["labels"]["app.kubernetes.io/component"], p["name"])
        for s in services
        for p in s["spec"]["ports"]
    }
    assert {("receiver", "metrics"), ("worker", "metrics"), ("scheduler", "metrics")} <= ports
    for service in services:
        if any(p["name"] == "metrics" for p in service["spec"]["ports"]):
            component = service["metadata"]["labels"]["app.kubernetes.io/component"]
            assert service["spec"]["selector"]["app.kubernetes.io/component"] == component


def test_rules_and_dashboard_use_only_exported_metrics(chart: Any) -> None:  # noqa: F811
    objects = render(chart, merge(CREDENTIALS, ALL_ON))
    [rule] = of_kind(objects, "PrometheusRule")
    expressions = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    [dashboard_map] = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(dashboard_map["data"]["sandbox-controller.json"])
    expressions += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set().union(*(used_in(e) for e in expressions))
    known = exported()
    assert used - known == set()
    for wanted in ("controller_decisions_total", "controller_delivery_to_sandbox_start_seconds_bucket"):
        assert wanted in used
    assert all(f'namespace="{NAMESPACE}"' in e for e in expressions if "controller_" in e and "$namespace" not in e)


def test_an_alert_watches_the_receivers_refusals_of_genuine_deliveries(chart: Any) -> None:  # noqa: F811
    """L5: 503s beyond the receiver's capacity (genuine deliveries turned away) raise an alert, on a
    reason the server counts."""
    from controller.endpoint import REFUSAL_REASONS

    objects = render(chart, merge(CREDENTIALS, ALL_ON))
    [rule] = of_kind(objects, "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    expression = alerts["SandboxControllerReceiverOverCapacity"]
    assert 'controller_receiver_refused_total{reason="over_capacity"' in expression
    assert "over_capacity" in REFUSAL_REASONS
