"""Serve a bench app on the receiver's own server (``cli.cmd_serve``: ``controller.endpoint.run``
with the default limits), or with ``h11`` on the settings the receiver had before issue 21
(uvicorn's h11 protocol, the header cap as h11's ``max_incomplete_event_size``, the connection
cap), so a benchmark compares apps, not servers.

    python bench/serve_app.py bare_app:app PORT [h11]      (module relative to bench/)
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller import endpoint
from controller.config import ReceiverSettings, WebhookSettings


def main() -> None:
    target, port = sys.argv[1], int(sys.argv[2])
    module, _, name = target.partition(":")
    app = getattr(importlib.import_module(module), name)
    assert not any(k.startswith("CONTROLLER_RECEIVER_") for k in os.environ), "bench apps use the default limits"
    limits = ReceiverSettings()
    if sys.argv[3:] != ["h11"]:
        endpoint.run(
            app, "127.0.0.1", port, endpoint.Limits.from_settings(limits, WebhookSettings().body_timeout_seconds)
        )
        return
    options: dict[str, Any] = {
        "http": "h11",
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "limit_concurrency": limits.max_connections,
    }
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off", **options)


if __name__ == "__main__":
    main()
