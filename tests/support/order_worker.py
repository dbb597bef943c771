"""A real Celery worker on the product's queue settings whose task only records the order it
works sessions in (the Redis list ``ORDER``), for tests and benchmarks of queue ordering.

It runs with the product's app (``queue.make_app``) and worker arguments (``cli.worker_argv``:
the same queues in the same order); only the task body differs. The session ``GATE`` blocks
its pool process until ``RELEASE`` is pushed, so a test can hold the worker busy while it
queues jobs. Each call's arguments are also recorded, as JSON ``[session_id, kwargs]``, in ``CALLS``.
The sessions ``FILE_GATE`` and ``FILE_REJECT`` hold their pool process until the file
``RELEASED`` exists in the worker's directory (no Redis needed to release them, so a test can
let a job end while Redis refuses writes); then the first succeeds (the worker acknowledges it)
and the second raises Celery's ``Reject`` (the worker rejects it).

    python -m tests.support.order_worker   (CONTROLLER_REDIS_URL, and CONTROLLER_REDIS_SENTINELS
                                            and the like, in the environment; ORDER_WORKER_CONCURRENCY
                                            pool processes, default 1)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery.exceptions import Reject

from controller import cli, queue
from controller.config import Settings
from controller.redis_client import Endpoint

ORDER, GATE, RELEASE, CALLS = "test:order", "gate", "test:release", "test:calls"
FILE_GATE, FILE_REJECT, RELEASED = "file-gate", "file-reject", "released"
CONCURRENCY = "ORDER_WORKER_CONCURRENCY"


def main() -> None:
    settings = Settings.from_env(dict(os.environ))
    app = queue.make_app(settings)
    client = Endpoint.from_settings(settings.queue).client(decode_responses=False)

    @app.task(name=queue.TASK_SYNC_SESSION)  # type: ignore[untyped-decorator]
    def sync_session(session_id: str, **kwargs: Any) -> None:
        client.rpush(CALLS, json.dumps([session_id, kwargs]))
        client.rpush(ORDER, session_id)
        if session_id == GATE:
            client.blpop([RELEASE], timeout=120)
        if session_id in (FILE_GATE, FILE_REJECT):
            deadline = time.monotonic() + 120
            while not Path(RELEASED).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if session_id == FILE_REJECT:
                raise Reject("rejected by the test", requeue=False)

    concurrency = int(os.environ.get(CONCURRENCY, "1"))
    app.worker_main(cli.worker_argv(concurrency=concurrency, hostname=f"order-{os.getpid()}@%h"))


if __name__ == "__main__":
    main()
