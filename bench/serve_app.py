"""Serve a bench app on the receiver's exact uvicorn settings (``cli.cmd_serve``: the same
options from ``controller.server``, log config, access log and lifespan), so the benchmark
compares apps, not servers.

    python bench/serve_app.py bare_app:app PORT      (module relative to bench/)
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller import server
from controller.config import ReceiverSettings


def main() -> None:
    target, port = sys.argv[1], int(sys.argv[2])
    module, _, name = target.partition(":")
    app = getattr(importlib.import_module(module), name)
    assert not any(k.startswith("CONTROLLER_RECEIVER_") for k in os.environ), "bench apps use the default limits"
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        **server.options(ReceiverSettings()),
    )


if __name__ == "__main__":
    main()
