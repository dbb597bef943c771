"""The "20-line handler" of ``bench/receiver_fastpath.py``: verify the delivery with the
``standardwebhooks`` package, push the job onto a Redis list with redis-py in Starlette's thread
pool, answer 200. No de-duplication, no wanted counter, no limits, no log line, no metric.
BENCH_SECRET and BENCH_REDIS_URL come from the environment; run it as anyone would:
``uvicorn webhook_handler:app`` (uvicorn's defaults)."""

import json
import os

import redis
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

webhook = Webhook(os.environ["BENCH_SECRET"])
client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])


async def webhooks(request: Request) -> JSONResponse:
    body = await request.body()
    try:
        event = webhook.verify(body, dict(request.headers))
    except WebhookVerificationError:
        return JSONResponse({"status": "rejected"}, status_code=401)
    job = json.dumps({"session_id": event["data"]["id"], "webhook_id": request.headers["webhook-id"]})
    await run_in_threadpool(client.lpush, "bench:jobs", job)
    return JSONResponse({"status": "enqueued"})


app = Starlette(routes=[Route("/webhooks", webhooks, methods=["POST"])])
