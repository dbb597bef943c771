"""The "20-line handler" of the receiver benchmark, three ways of writing it: verify the delivery
with the ``standardwebhooks`` package, push the session id onto a Redis list with redis-py.

  app           async endpoint, redis-py's blocking client called on the event loop (the fastest
                of the three here: no thread hop, but each push stalls every other request)
  app_thread    async endpoint, the blocking push in Starlette's thread pool
  app_asyncio   async endpoint, redis-py's asyncio client

No de-duplication, no wanted counter, no limits. BENCH_SECRET and BENCH_REDIS_URL come from
the environment.
"""

import json
import os

import redis
import redis.asyncio
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

webhook = Webhook(os.environ["BENCH_SECRET"])
client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
async_client = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"])


async def verified_job(request: Request) -> str | None:
    body = await request.body()
    try:
        event = webhook.verify(body, dict(request.headers))
    except WebhookVerificationError:
        return None
    return json.dumps({"session_id": event["data"]["id"], "webhook_id": request.headers["webhook-id"]})


async def blocking(request: Request) -> JSONResponse:
    job = await verified_job(request)
    if job is None:
        return JSONResponse({"status": "rejected"}, status_code=401)
    client.lpush("bench:jobs", job)
    return JSONResponse({"status": "enqueued"})


async def threaded(request: Request) -> JSONResponse:
    job = await verified_job(request)
    if job is None:
        return JSONResponse({"status": "rejected"}, status_code=401)
    await run_in_threadpool(client.lpush, "bench:jobs", job)
    return JSONResponse({"status": "enqueued"})


async def awaited(request: Request) -> JSONResponse:
    job = await verified_job(request)
    if job is None:
        return JSONResponse({"status": "rejected"}, status_code=401)
    await async_client.lpush("bench:jobs", job)
    return JSONResponse({"status": "enqueued"})


app = Starlette(routes=[Route("/webhooks", blocking, methods=["POST"])])
app_thread = Starlette(routes=[Route("/webhooks", threaded, methods=["POST"])])
app_asyncio = Starlette(routes=[Route("/webhooks", awaited, methods=["POST"])])
