"""The metrics section: where the receiver, workers and the scheduler serve ``GET /metrics``."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable
from controller.config.reader import Reader


@dataclass(frozen=True, repr=False)
class MetricsSettings(Printable):
    port: int = 0
    """Port of ``GET /metrics`` for the receiver, workers and the scheduler (0, the default: not
    served; the Helm chart sets 9090). Never the receiver's public port: a client of the webhook
    endpoint gets no answer it did not pay for."""


def metrics(r: Reader) -> MetricsSettings:
    return MetricsSettings(port=r.number("METRICS_PORT", MetricsSettings.port, int, 0, 65535))
