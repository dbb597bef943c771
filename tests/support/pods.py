"""A test's way from the Kubernetes client's models to the project's own ``Pod``: the product
reads the API server's JSON (``objects.pod_from_json``) and builds no client model, so only tests
that build a ``V1Pod`` need this."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from controller.runners.kubernetes.objects import Pod, pod_from_json


def pod_of(pod: Any) -> Pod:
    """The project's ``Pod`` from a ``V1Pod`` a test built (as the API server would send it)."""
    return pod_from_json(k8s.ApiClient().sanitize_for_serialization(pod))  # type: ignore[no-untyped-call]
