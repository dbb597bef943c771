"""Kubernetes-safe names, labels and annotations for sandbox objects (pure).

A pod is named from the session id plus a hash (ids are not DNS-safe and may be long) and a
generation suffix, so a replacement never collides with a pod that is still terminating:
``sbx-<slug>-<hash8>-g<generation>``, at most 63 characters (a DNS-1123 label).

A warm pod (a template's warm pool) is named ``warm-<template slug>-<random>`` by the API
server (``generateName``) and carries the pool's labels: ``pool`` (a hash of the template
name) and ``pool-state`` (``ready`` until a session claims it, then ``claimed``). A claim adds
the session's labels and annotations (as a cold pod has them) plus the remote URL, which the
pod reads through a downward-API volume (late binding). A claimed pod whose binding the pool's
tending has refreshed once (``pool.binding_refresh_due``) also carries ``binding-refreshed``.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "sandbox-controller.dev"
SESSION_HASH_LABEL = f"{PREFIX}/session-hash"
GENERATION_LABEL = f"{PREFIX}/generation"
SESSION_ID_ANNOTATION = f"{PREFIX}/session-id"
ENVIRONMENT_ID_ANNOTATION = f"{PREFIX}/environment-id"
TEMPLATE_ANNOTATION = f"{PREFIX}/template"
REMOTE_URL_ANNOTATION = f"{PREFIX}/remote-url"
CLAIMED_AT_ANNOTATION = f"{PREFIX}/claimed-at"
SHAPE_ANNOTATION = f"{PREFIX}/shape"
POOL_LABEL = f"{PREFIX}/pool"
POOL_STATE_LABEL = f"{PREFIX}/pool-state"
BINDING_REFRESHED_LABEL = f"{PREFIX}/binding-refreshed"
READY = "ready"
CLAIMED = "claimed"
MANAGED_BY = "sandbox-controller"
CONTAINER = "executor"
"""The sandbox container's name in every sandbox pod (the one the kubelet checkpoints)."""
COMPONENT = "sandbox"
_MAX_LABEL = 63
_INVALID = re.compile(r"[^a-z0-9-]+")


def session_hash(session_id: str) -> str:
    """A stable 16-hex-digit label value for a session (label values cannot hold any id)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


def slug(text: str, length: int) -> str:
    cleaned = _INVALID.sub("-", text.lower()).strip("-")
    return cleaned[:length].strip("-") or "x"


def pod_name(session_id: str, generation: int) -> str:
    suffix = f"-{session_hash(session_id)[:8]}-g{generation}"
    return f"sbx-{slug(session_id, _MAX_LABEL - 4 - len(suffix))}{suffix}"


def pvc_name(session_id: str) -> str:
    suffix = f"-{session_hash(session_id)[:8]}"
    return f"ws-{slug(session_id, _MAX_LABEL - 3 - len(suffix))}{suffix}"


def selector_labels() -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": MANAGED_BY, "app.kubernetes.io/component": COMPONENT}


def labels(session_id: str, generation: int | None = None) -> dict[str, str]:
    result = {
        **selector_labels(),
        "app.kubernetes.io/name": "sandbox",
        "app.kubernetes.io/part-of": "sandbox-controller",
        SESSION_HASH_LABEL: session_hash(session_id),
    }
    if generation is not None:
        result[GENERATION_LABEL] = str(generation)
    return result


def session_selector(session_id: str) -> str:
    return f"{SESSION_HASH_LABEL}={session_hash(session_id)}"


def managed_selector() -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels().items())


def pool_hash(template: str) -> str:
    """A label value naming a template's warm pool (template names need not be label-safe)."""
    return hashlib.sha256(f"pool:{template}".encode()).hexdigest()[:16]


def warm_prefix(template: str) -> str:
    """``generateName`` of a template's warm pods (the API server adds five characters)."""
    return f"warm-{slug(template, 40)}-"


def pool_labels(template: str) -> dict[str, str]:
    return {
        **selector_labels(),
        "app.kubernetes.io/name": "sandbox",
        "app.kubernetes.io/part-of": "sandbox-controller",
        POOL_LABEL: pool_hash(template),
        POOL_STATE_LABEL: READY,
    }


def pool_selector(template: str) -> str:
    """The warm pods of a template's pool that no session has claimed."""
    return f"{managed_selector()},{POOL_LABEL}={pool_hash(template)},{POOL_STATE_LABEL}={READY}"


def unrefreshed_selector(template: str) -> str:
    """The claimed pods of a template's pool whose binding has not been refreshed yet."""
    pool = f"{POOL_LABEL}={pool_hash(template)},{POOL_STATE_LABEL}={CLAIMED}"
    return f"{managed_selector()},{pool},!{BINDING_REFRESHED_LABEL}"


def placement_name(session_id: str, generation: int) -> str:
    """The name of the placement record (a Lease) that says which pod serves a session's
    generation (warm pools: a claimed pod's own name says nothing about its session). Unique per
    session and generation."""
    return f"{pod_name(session_id, generation)}.placed"
