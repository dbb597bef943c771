"""``store.pipelined``, the receiver's one-connection Redis client, against a real redis-server
(and, for a Redis that never answers, a loopback socket that reads and stays silent), on both
event loops the receiver may run on (asyncio's and uvloop's, which ``sandbox-controller serve`` runs on when installed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import uvloop

from controller.errors import RedisPasswordRefused
from controller.redis_client import Endpoint
from controller.store.pipelined import PipelinedRedis
from tests.support.redis_server import RedisServer

ECHO = "return ARGV[1]"


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Awaitable[Any]], Any]]:
    def runner(main: Awaitable[Any]) -> Any:
        if request.param == "uvloop":
            return uvloop.run(main)  # type: ignore[arg-type]
        return asyncio.run(main)  # type: ignore[arg-type]

    yield runner


def test_concurrent_commands_share_one_connection_and_get_their_own_replies(server: RedisServer, run: Any) -> None:
    """500 scripts in flight at once on one connection: each caller gets its own reply."""

    async def main() -> tuple[list[Any], set[Any]]:
        client = PipelinedRedis(server.url)
        echo = client.register_script(ECHO)
        try:
            replies = await asyncio.gather(*(echo(args=[f"reply-{n}"]) for n in range(500)))
            ids = await asyncio.gather(*(client.execute("CLIENT", "ID") for _ in range(50)))
            return list(replies), set(ids)
        finally:
            await client.aclose()

    replies, connections = run(main())
    assert replies == [f"reply-{n}" for n in range(500)]
    assert len(connections) == 1


def test_an_error_reply_raises_and_the_connection_carries_on(server: RedisServer, run: Any) -> None:
    async def main() -> Any:
        client = PipelinedRedis(server.url)
        try:
            wrong_type = client.register_script("redis.call('SET', KEYS[1], 1); return redis.call('LPUSH', KEYS[1], 1)")
            with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
                await wrong_type(keys=["pipelined:wrongtype"])
            return await client.register_script(ECHO)(args=["still here"])
        finally:
            await client.aclose()

    assert run(main()) == "still here"


def test_a_script_redis_does_not_have_is_sent_whole(server: RedisServer, run: Any) -> None:
    """After SCRIPT FLUSH (a restarted Redis), EVALSHA's NOSCRIPT is answered by EVAL."""

    async def main() -> list[Any]:
        client = PipelinedRedis(server.url)
        echo = client.register_script(ECHO)
        try:
            first = await echo(args=["one"])
            await client.execute("SCRIPT", "FLUSH")
            return [first, await echo(args=["two"]), await echo(args=["three"])]
        finally:
            await client.aclose()

    assert run(main()) == ["one", "two", "three"]


def test_password_and_database_come_from_the_url(server: RedisServer, run: Any) -> None:
    """L5: AUTH and SELECT are sent on connecting; a wrong password is a configuration error
    naming the URL's variable (``RedisPasswordRefused``, never the password), which the receiver
    answers 503 like any error it did not expect: never a 2xx."""
    with server.client() as admin:
        admin.config_set("requirepass", "pipelined-test-pass")
    host = f"127.0.0.1:{server.port}"
    try:

        async def main() -> None:
            client = PipelinedRedis(f"redis://:pipelined-test-pass@{host}/3")
            try:
                await client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")(
                    keys=["pipelined:db"], args=["three"]
                )
            finally:
                await client.aclose()
            wrong = PipelinedRedis(f"redis://:not-the-password@{host}/0")
            none = PipelinedRedis(f"redis://{host}/0")  # no password where one is required: NOAUTH
            try:
                with pytest.raises(RedisPasswordRefused, match="CONTROLLER_REDIS_URL") as refused:
                    await wrong.ping()
                assert "not-the-password" not in str(refused.value)
                with pytest.raises(RedisPasswordRefused, match="CONTROLLER_REDIS_URL"):
                    await none.ping()
            finally:  # a connection left open keeps uvloop's run from returning
                await wrong.aclose()
                await none.aclose()

        with pytest.raises(RedisPasswordRefused, match="CONTROLLER_REDIS_URL"):
            Endpoint(f"redis://{host}/0").client(timeout_seconds=1).ping()  # the store's client: the same

        run(main())
        with redis.Redis(port=server.port, db=3, password="pipelined-test-pass", decode_responses=True) as c:
            assert c.get("pipelined:db") == "three"
    finally:
        with redis.Redis(port=server.port, password="pipelined-test-pass") as c:
            c.config_set("requirepass", "")


def test_a_redis_that_never_answers_times_out_and_one_that_hangs_up_is_a_connection_error(run: Any) -> None:
    """L5: commands waiting on a silent connection fail with TimeoutError after the timeout (the
    connection is closed: Redis answers in order, so all behind it would wait too); a peer that
    closes the connection fails what waits with ConnectionError. Either is a 503 upstream."""

    async def main() -> None:
        stop = asyncio.Event()
        writers: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            await reader.read(1 << 16)
            await stop.wait()

        async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            await reader.read(1 << 16)
            writer.close()

        for handler, error in ((silent, redis.TimeoutError), (hangs_up, redis.ConnectionError)):
            listener = await asyncio.start_server(handler, "127.0.0.1", 0)
            port = listener.sockets[0].getsockname()[1]
            client = PipelinedRedis(f"redis://127.0.0.1:{port}/0", timeout_seconds=0.3)
            try:
                results = await asyncio.gather(*(client.ping() for _ in range(5)), return_exceptions=True)
                assert all(isinstance(r, error) for r in results), results
                with pytest.raises(error):  # a fresh connection, failing the same way
                    await client.ping()
            finally:
                await client.aclose()
                stop.set()
                for writer in writers:
                    writer.close()
                listener.close()
                await listener.wait_closed()

    run(main())


# Keep last: it stops and restarts the module's server.
def test_a_restarted_redis_is_reconnected_to(server: RedisServer, run: Any) -> None:
    """L5: while Redis is down every command fails (the receiver answers 503, never 2xx); once
    it is back the same client connects again."""

    async def main() -> list[Any]:
        client = PipelinedRedis(server.url, timeout_seconds=1.0)
        try:
            before = await client.ping()
            server.stop()
            server.process = None
            with pytest.raises(redis.ConnectionError):
                await client.ping()
            with pytest.raises(redis.ConnectionError):  # refused while down
                await client.ping()
            server.start()
            return [before, await client.ping()]
        finally:
            await client.aclose()

    assert run(main()) == [True, True]
