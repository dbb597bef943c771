"""The real ``sandbox-controller scheduler`` whose round takes ``SLOW_SCHEDULER_ROUND_SECONDS``:
its runner's listing of the sandboxes is that slow (an API server under load), so each reconcile
sweep (and the round it is part of) lasts that long. Everything else is the product's: the
settings, leadership, the store, the fenced publisher, the loop.

The runner lists ``SLOW_SCHEDULER_SANDBOXES`` sandboxes named after ``SLOW_SCHEDULER_NAME``
(``<name>-0`` ...): the sweep's jobs on the maintenance queue say which scheduler queued them.
Each listing writes a JSON line (``"event": "test: listing"``, with ``started``/``ended`` wall
times) to stdout, beside the scheduler's own.

    python -m tests.support.slow_scheduler   (CONTROLLER_* settings in the environment)
"""

from __future__ import annotations

import json
import os
import sys
import time

from controller import cli, wiring
from controller.config import Settings
from controller.model import Handle
from controller.runners.base import Runner
from tests.support.fakes import FakeRunner

NAME, ROUND, SANDBOXES = "SLOW_SCHEDULER_NAME", "SLOW_SCHEDULER_ROUND_SECONDS", "SLOW_SCHEDULER_SANDBOXES"


class SlowRunner(FakeRunner):
    def __init__(self, name: str, seconds: float, sandboxes: int) -> None:
        super().__init__()
        self.name, self.seconds, self.sandboxes = name, seconds, sandboxes

    def list_managed(self) -> list[Handle]:
        started = time.time()
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
        print(json.dumps({"event": "test: listing", "started": started, "ended": time.time()}), flush=True)
        return [
            Handle(session_id=f"{self.name}-{n}", name=f"sbx-{self.name}-{n}", generation=1, uid=f"{self.name}-{n}")
            for n in range(self.sandboxes)
        ]


def main() -> int:
    runner = SlowRunner(os.environ[NAME], float(os.environ[ROUND]), int(os.environ.get(SANDBOXES, "3")))

    def slow_runner(settings: Settings, *args: object, **kwargs: object) -> Runner:
        return runner

    wiring.runner = slow_runner
    return cli.main(["scheduler"])


if __name__ == "__main__":
    sys.exit(main())
