"""Typed settings, parsed once from ``CONTROLLER_*`` environment variables.

Every problem is collected and reported together (``ConfigError``). Units are in the names
(``…_SECONDS``, ``…_BYTES``); every number has a minimum and a maximum (``BOUNDS``, stated in
README's settings table). Secrets may also come from ``…_FILE`` paths (mounted Secrets, read
without ever blocking: ``files.read_small``); they are held as ``Secret`` whose ``repr``/``str``
is masked, and a credential inside any URL setting is masked too (``credentials``), so
printing settings is safe.

One module a section, each holding its settings and the function that reads them:
``receiver`` (webhook deliveries, the HTTP server's limits), ``api`` (the Agents API, routing),
``queue`` (Redis, delivery), ``runner``, ``kubernetes``, ``lifecycle``, ``metrics``, ``node_agent``
(the node agent of suspend with memory on Kubernetes); beneath
them ``reader`` (each variable converted once, every problem collected) and ``masked``
(``Secret``, printing safely); above them ``settings`` (``Settings``, the parser that reads the
sections in one pass, and ``KEYS``/``BOUNDS``/``DEFAULTS``). Import every name from here.

A new setting follows the same rules: a number goes through ``number(…, minimum, maximum)``
(and its range into README's row and values.schema.json: tests compare them); a secret through
``secret`` (so ``…_FILE`` works and ``secret_values`` redacts it); a URL that may carry a
password needs nothing more (``describe``, ``repr`` and ``secret_values`` mask it whichever
field holds it); and a check a process makes at start belongs in ``wiring.preflight``, which
``check-config`` runs too.

``KEYS`` lists every variable the parser reads, recorded from a parse rather than kept by hand;
the Helm chart sets a subset of them (a test checks).
"""

from __future__ import annotations

from controller.config.api import ApiSettings, RoutingSettings
from controller.config.kubernetes import KubernetesSettings
from controller.config.lifecycle import LifecycleSettings
from controller.config.masked import Printable, Secret
from controller.config.metrics import MetricsSettings
from controller.config.node_agent import NodeAgentSettings
from controller.config.queue import MAX_CA_FILE_BYTES, QueueSettings
from controller.config.reader import DAY, PREFIX, number_text
from controller.config.receiver import ReceiverSettings, WebhookSettings
from controller.config.runner import IDLE_SUSPENDS, MAX_UID, RUNNERS, RunnerSettings
from controller.config.settings import BOUNDS, DEFAULTS, KEYS, LOG_LEVELS, Settings, read_by

__all__ = [
    "BOUNDS",
    "DAY",
    "DEFAULTS",
    "IDLE_SUSPENDS",
    "KEYS",
    "LOG_LEVELS",
    "MAX_CA_FILE_BYTES",
    "MAX_UID",
    "PREFIX",
    "RUNNERS",
    "ApiSettings",
    "KubernetesSettings",
    "LifecycleSettings",
    "MetricsSettings",
    "NodeAgentSettings",
    "Printable",
    "QueueSettings",
    "ReceiverSettings",
    "RoutingSettings",
    "RunnerSettings",
    "Secret",
    "Settings",
    "WebhookSettings",
    "number_text",
    "read_by",
]
