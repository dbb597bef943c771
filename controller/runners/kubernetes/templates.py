"""Named sandbox templates, read once from a JSON file, and the choice of one per session.

The file (the Helm chart's ``sandbox.templates``, mounted at
``CONTROLLER_KUBERNETES_TEMPLATES_FILE``) maps names to Kubernetes-style fields::

    {"large": {"image": "...", "resources": {"requests": {...}, "limits": {...}},
               "runtimeClassName": "gvisor", "nodeSelector": {...}, "tolerations": [...],
               "imagePullSecrets": ["regcred"], "activeDeadlineSeconds": 86400,
               "workspacePersistence": {"enabled": true, "size": "20Gi", "storageClassName": "fast"},
               "codexSandbox": false, "agentIds": ["agent_123"],
               "warmPool": {"size": 2, "maxAgeSeconds": 3600},
               "httpsProxy": "http://10.20.30.40:3128", "noProxy": "internal.example.com",
               "seccompProfile": "sandbox-controller/codex-sandbox.json", "hostUsers": false,
               "suspend": "checkpoint", "annotations": {"example.com/team": "a"}}}

``suspend: checkpoint`` checkpoints a sandbox at its idle timeout instead of deleting it, and
restores it with its processes and memory at the session's next connection request (issue 40;
needs ``workspacePersistence`` and the chart's node agent, ``sandbox.checkpoints``;
``runners/kubernetes/checkpoints.py``). ``annotations`` are put on the template's pods as they
are (none under the controller's prefix or Kubernetes' own).

A session names its template with the metadata key ``sandbox_template``; otherwise the
first template listing its agent id applies; otherwise ``default`` (which the file may
override). Unknown names fall back to ``default`` rather than refusing to start compute.

``httpsProxy`` routes the sandbox's HTTPS (codex's registration and WebSocket, and the tools
that read ``HTTPS_PROXY``) through a proxy: ``HTTPS_PROXY``/``https_proxy`` in the pod, with
``noProxy`` as ``NO_PROXY``/``no_proxy``. A proxy URL is ``http(s)://host:port`` without
credentials (the pod spec is readable by whoever reads pods).

``warmPool.size`` keeps that many pods of the template started and waiting for a session
(``runners/kubernetes/pool.py``). ``warmPool: {min, max}`` instead sizes the pool to demand
within [min, max] (0 ≤ min ≤ max, max ≥ 1; ``windowSeconds``, ``intervalSeconds`` and
``headroomPercent`` tune it, ``pool.target``); ``size`` and ``min``/``max`` together are
refused. A template with workspace persistence cannot have a pool (its volume belongs to a
session that does not exist yet), so that combination is refused.

``seccompProfile`` gives the sandbox container a ``Localhost`` seccomp profile, named by its
path under the kubelet's seccomp directory; with the chart's Codex profile installed on the
nodes, Codex's own sandbox works within Pod Security "restricted" (docs/kubernetes.md). It
cannot be combined with ``codexSandbox`` (which takes seccomp off entirely).

``hostUsers: false`` runs the template's pods in their own user namespace: the sandbox's uids,
root included, map to unprivileged uids of the node (the cluster needs Kubernetes 1.33+ and a
runtime that supports it: containerd 2.0+ with runc 1.2+, or CRI-O). A template without the
field inherits the default template's (``CONTROLLER_KUBERNETES_USER_NAMESPACES``, the chart's
``sandbox.userNamespaces``); ``codexSandbox`` implies it and refuses ``hostUsers: true``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from controller import files
from controller.errors import ConfigError
from controller.model import Session
from controller.runners.kubernetes import names
from controller.runners.kubernetes.manifests import SandboxTemplate

METADATA_KEY = "sandbox_template"
_FIELDS = {
    "image", "imagePullPolicy", "resources", "runtimeClassName", "nodeSelector", "tolerations",
    "imagePullSecrets", "activeDeadlineSeconds", "workspacePersistence", "codexSandbox", "agentIds",
    "warmPool", "httpsProxy", "noProxy", "seccompProfile", "hostUsers", "suspend", "annotations",
}  # fmt: skip
# The JSON type each field must have (None allowed where noted); nothing is coerced, so a string
# "false" never turns codexSandbox on and a bare string never becomes a list of characters.
_TYPES: dict[str, tuple[type, ...]] = {
    "image": (str,), "imagePullPolicy": (str, type(None)), "resources": (dict,),
    "runtimeClassName": (str, type(None)), "nodeSelector": (dict,), "tolerations": (list,),
    "imagePullSecrets": (list,), "activeDeadlineSeconds": (int, type(None)), "workspacePersistence": (dict,),
    "codexSandbox": (bool,), "agentIds": (list,), "warmPool": (dict,), "httpsProxy": (str,), "noProxy": (str,),
    "seccompProfile": (str, type(None)), "hostUsers": (bool,), "suspend": (str,), "annotations": (dict,),
}  # fmt: skip
_POOL_TYPES: dict[str, tuple[type, ...]] = {
    "size": (int,), "maxAgeSeconds": (int,), "min": (int,), "max": (int,), "windowSeconds": (int,),
    "intervalSeconds": (int,), "headroomPercent": (int,),
}  # fmt: skip
_DEMAND_FIELDS = ("min", "max", "windowSeconds", "intervalSeconds", "headroomPercent")
"""The fields of a pool that sizes itself to demand (``warmPool: {min, max}``)."""
_PERSISTENCE_TYPES: dict[str, tuple[type, ...]] = {
    "enabled": (bool,), "size": (str,), "storageClassName": (str, type(None)),
}  # fmt: skip


@dataclass(frozen=True)
class Templates:
    by_name: dict[str, SandboxTemplate]
    by_agent: dict[str, str]

    def choose(self, session: Session) -> str:
        named = session.metadata.get(METADATA_KEY)
        if named and named in self.by_name:
            return named
        if session.agent_id and session.agent_id in self.by_agent:
            return self.by_agent[session.agent_id]
        return "default"

    def get(self, name: str | None) -> SandboxTemplate:
        return self.by_name.get(name or "default", self.by_name["default"])

    def pooled(self) -> tuple[SandboxTemplate, ...]:
        """The templates with a warm pool."""
        return tuple(t for t in self.by_name.values() if t.pooled)


def load(path: str | None, base: SandboxTemplate) -> Templates:
    """Templates from ``path`` (or only ``base`` as ``default``); every problem reported together."""
    if not path:
        return Templates({"default": base}, {})
    try:
        raw = json.loads(files.read_small(path, limit=1024 * 1024) or "{}")  # never blocks on a FIFO
    except (OSError, ValueError) as exc:
        raise ConfigError([f"CONTROLLER_KUBERNETES_TEMPLATES_FILE: cannot read JSON from {path}: {exc}"]) from exc
    return parse(raw, base)


def parse(raw: Any, base: SandboxTemplate) -> Templates:
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError(["sandbox templates must be a JSON object of name → template"])
    by_name = {"default": base}
    by_agent: dict[str, str] = {}
    for name, fields in raw.items():
        if not isinstance(fields, dict):
            problems.append(f"template {name!r} must be an object")
            continue
        unknown = sorted(set(fields) - _FIELDS)
        if unknown:
            problems.append(f"template {name!r} has unknown fields: {', '.join(unknown)}")
        mistyped = _mistyped(fields, _TYPES, "")
        if isinstance(fields.get("workspacePersistence"), dict):
            mistyped += _mistyped(fields["workspacePersistence"], _PERSISTENCE_TYPES, "workspacePersistence.")
        if isinstance(fields.get("warmPool"), dict):
            mistyped += _mistyped(fields["warmPool"], _POOL_TYPES, "warmPool.")
            extra = sorted(set(fields["warmPool"]) - set(_POOL_TYPES))
            if extra:
                mistyped.append(f"warmPool has unknown fields: {', '.join(extra)}")
        if mistyped:
            problems += [f"template {name!r}: {m}" for m in mistyped]
            continue
        try:
            by_name[name] = _template(name, fields, base)
        except (TypeError, ValueError) as exc:
            problems.append(f"template {name!r}: {exc}")
        for agent in fields.get("agentIds") or ():
            by_agent.setdefault(str(agent), name)
    if problems:
        raise ConfigError(problems)
    return Templates(by_name, by_agent)


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", bool: "true or false",
               float: "a number", type(None): "null"}  # fmt: skip


def _mistyped(fields: dict[str, Any], types: dict[str, tuple[type, ...]], prefix: str) -> list[str]:
    def fits(value: Any, allowed: tuple[type, ...]) -> bool:
        return isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)

    def json_name(t: type) -> str:
        return _JSON_NAMES.get(t, t.__name__)

    return [
        f"{prefix}{key} must be {' or '.join(json_name(t) for t in allowed)}, got {json_name(type(fields[key]))}"
        for key, allowed in types.items()
        if key in fields and not fits(fields[key], allowed)
    ]


def _template(name: str, fields: dict[str, Any], base: SandboxTemplate) -> SandboxTemplate:
    persistence = fields.get("workspacePersistence") or {}
    if not isinstance(persistence, dict):
        raise ValueError("workspacePersistence must be an object")
    resources = fields.get("resources", base.resources)
    if not isinstance(resources, dict):
        raise ValueError("resources must be an object")
    deadline = fields.get("activeDeadlineSeconds", base.active_deadline_seconds)
    pool = fields.get("warmPool") or {}
    template = replace(
        base,
        name=name,
        image=str(fields.get("image", base.image)),
        image_pull_policy=fields.get("imagePullPolicy", base.image_pull_policy),
        resources={str(k): {str(r): str(v) for r, v in dict(q).items()} for k, q in resources.items()},
        runtime_class_name=fields.get("runtimeClassName", base.runtime_class_name) or None,
        node_selector=dict(fields.get("nodeSelector", base.node_selector)),
        tolerations=tuple(dict(t) for t in fields.get("tolerations", base.tolerations)),
        image_pull_secrets=tuple(str(s) for s in fields.get("imagePullSecrets", base.image_pull_secrets)),
        active_deadline_seconds=int(deadline) if deadline else None,
        persist_workspace=bool(persistence.get("enabled", base.persist_workspace)),
        workspace_size=str(persistence.get("size", base.workspace_size)),
        storage_class_name=persistence.get("storageClassName", base.storage_class_name),
        codex_sandbox=bool(fields.get("codexSandbox", base.codex_sandbox)),
        warm_max_age_seconds=_at_least(pool, "maxAgeSeconds", base.warm_max_age_seconds, 60),
        **_pool_size(pool, base),
        https_proxy=_proxy_url(fields.get("httpsProxy", base.https_proxy)),
        no_proxy=fields.get("noProxy", base.no_proxy) or None,
        seccomp_profile=_localhost_profile(fields.get("seccompProfile", base.seccomp_profile)),
        host_users=fields.get("hostUsers", base.host_users),
        checkpoint_idle=_suspend(fields.get("suspend"), base.checkpoint_idle),
        annotations=_annotations(fields.get("annotations"), base.annotations),
    )
    if template.seccomp_profile and template.codex_sandbox:
        raise ValueError("seccompProfile cannot be used with codexSandbox (which sets seccomp Unconfined)")
    if template.codex_sandbox and fields.get("hostUsers") is True:
        raise ValueError("hostUsers: true cannot be used with codexSandbox (which needs its own user namespace)")
    if (template.warm_pool_size > 0 or template.sized_by_demand) and template.persist_workspace:
        raise ValueError("warmPool cannot be used with workspacePersistence (the volume belongs to one session)")
    if template.checkpoint_idle and not template.persist_workspace:
        raise ValueError(
            "suspend: checkpoint needs workspacePersistence (a restored sandbox finds its files on the "
            "session's claim, and its checkpoint image is bound to that claim)"
        )
    return template


def _suspend(value: str | None, default: bool) -> bool:
    """``suspend``: ``checkpoint`` (an idle sandbox is checkpointed and restored with its
    memory) or ``stop`` (it is deleted; the next one starts afresh)."""
    if value is None:
        return default
    if value not in ("checkpoint", "stop"):
        raise ValueError(f"suspend must be checkpoint or stop, got {value!r}")
    return value == "checkpoint"


_RESERVED_ANNOTATION_DOMAINS = (names.PREFIX, "kubernetes.io", "k8s.io")


def _annotations(value: dict[str, Any] | None, default: dict[str, str]) -> dict[str, str]:
    """``annotations``: string values, none in the controller's own domain (it reads those to
    know its pods) or Kubernetes' reserved ones."""
    if value is None:
        return dict(default)
    for key, item in value.items():
        if not isinstance(item, str):
            raise ValueError(f"annotations.{key} must be a string")
        domain = key.split("/", 1)[0] if "/" in key else ""
        if any(domain == d or domain.endswith("." + d) for d in _RESERVED_ANNOTATION_DOMAINS):
            raise ValueError(f"annotations.{key} is reserved (the controller's or Kubernetes' own)")
    return dict(value)


def _localhost_profile(path: str | None) -> str | None:
    """A path under the kubelet's seccomp directory: relative, with no ``..`` in it."""
    if not path:
        return None
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"seccompProfile must be a path under the kubelet's seccomp directory, got {path!r}")
    return path


def _proxy_url(url: str | None) -> str | None:
    """``http(s)://host:port``, without credentials (they would sit in the pod spec)."""
    if not url:
        return None
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(f"httpsProxy must be http(s)://host[:port], got {url!r}")
    if parsed.username or parsed.password:
        raise ValueError("httpsProxy must not carry credentials (the pod spec is readable by whoever reads pods)")
    return url


def _pool_size(pool: dict[str, Any], base: SandboxTemplate) -> dict[str, int]:
    """A fixed pool (``size``) or one sized by demand (``min``, ``max`` and its window,
    interval and headroom): the template's fields for either, every bad value refused."""
    demand = [key for key in _DEMAND_FIELDS if key in pool]
    if not demand:
        return {"warm_pool_size": _at_least(pool, "size", base.warm_pool_size, 0)}
    if "size" in pool:
        raise ValueError("warmPool takes size (a fixed pool) or min and max (sized by demand), not both")
    if "max" not in pool:
        raise ValueError(f"warmPool.max is required with {', '.join(demand)} (a pool sized by demand)")
    minimum, maximum = _at_least(pool, "min", 0, 0), _at_least(pool, "max", 0, 1)
    if minimum > maximum:
        raise ValueError(f"warmPool.min ({minimum}) must not exceed warmPool.max ({maximum})")
    interval = _at_least(pool, "intervalSeconds", base.warm_interval_seconds, 1)
    window = _at_least(pool, "windowSeconds", base.warm_window_seconds, 1)
    if window < interval:
        raise ValueError(f"warmPool.windowSeconds ({window}) must be at least warmPool.intervalSeconds ({interval})")
    headroom = _at_least(pool, "headroomPercent", base.warm_headroom_percent, 0)
    if headroom > 1000:
        raise ValueError(f"warmPool.headroomPercent must be at most 1000, got {headroom}")
    return {
        "warm_pool_size": 0,
        "warm_pool_min": minimum,
        "warm_pool_max": maximum,
        "warm_interval_seconds": interval,
        "warm_window_seconds": window,
        "warm_headroom_percent": headroom,
    }


def _at_least(fields: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = int(fields.get(key, default))
    if value < minimum:
        raise ValueError(f"warmPool.{key} must be at least {minimum}, got {value}")
    return value
