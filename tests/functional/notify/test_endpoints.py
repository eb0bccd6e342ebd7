"""Endpoints against real servers: local aiohttp webhooks, RabbitMQ on 127.0.0.1:5672, a private Redis."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import unquote, unquote_plus

import pytest

from dfpubsub.endpoints import open_endpoint
from dfpubsub.errors import EndpointError, EndpointRejected
from dfpubsub.notify.notification import Notification, make_notification
from dfpubsub.testing.servers import free_port

aiohttp = pytest.importorskip("aiohttp")
aio_pika = pytest.importorskip("aio_pika")
from aiohttp import web  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def batch_of(n: int, topic: str = "images", action: str = "create") -> list[Notification]:
    event = "s3:ObjectRemoved:Delete" if action == "delete" else "s3:ObjectCreated:Put"
    return [
        make_notification(topic, event, action, "media", f"dir/obj {i}", 100 + i, {"i": i},
                          opaque_data="od", include_value=True)
        for i in range(n)
    ]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


class Webhook:
    """A local aiohttp server that records what it receives and answers ``status``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.status = 200
        self.ok_budget: int | None = None  # if set, answers ``status`` this many times, then 503
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.stall = asyncio.Event()  # while clear, /slow never answers
        self._runner: web.AppRunner | None = None

    async def _hook(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        status = self.status
        if self.ok_budget is not None:
            status = status if self.ok_budget > 0 else 503
            self.ok_budget -= 1
        return web.Response(status=status, text="" if status < 300 else "nope")

    async def _moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/hook")

    async def _slow(self, request: web.Request) -> web.Response:
        await self.stall.wait()
        return web.Response(status=200)

    async def __aenter__(self) -> Webhook:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/slow", self._slow)
        app.router.add_post("/moved", self._moved)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stall.set()
        assert self._runner is not None
        await self._runner.cleanup()

    def records(self) -> list[dict]:
        return [r for _, body in self.requests for r in json.loads(body)["Records"]]


# --- HTTP ----------------------------------------------------------------------------------------


def test_http_s3_batches_are_acked_in_order():
    async def scenario() -> None:
        async with Webhook() as hook:
            batch = batch_of(250)
            async with open_endpoint(hook.url, options={"max_batch": "100", "header.X-Token": "t0k"}) as ep:
                await ep.send(batch)
            assert len(hook.requests) == 3  # 100 + 100 + 50
            headers, _ = hook.requests[0]
            assert headers["Content-Type"] == "application/json" and headers["X-Token"] == "t0k"
            recs = hook.records()
            assert [unquote_plus(r["s3"]["object"]["key"]) for r in recs] == [n.key for n in batch]
            assert [r["s3"]["object"]["sequencer"] for r in recs] == sorted(r["s3"]["object"]["sequencer"] for r in recs)
            assert recs[0]["eventName"] == "ObjectCreated:Put" and recs[0]["opaqueData"] == "od"
            assert recs[0]["dfpubsub"]["value"] == {"i": 0}

    run(scenario)


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_http_retryable_statuses_raise_endpoint_error(status):
    async def scenario() -> None:
        async with Webhook() as hook:
            hook.status = status
            async with open_endpoint(hook.url) as ep:
                with pytest.raises(EndpointError) as info:
                    await ep.send(batch_of(3))
                assert info.value.status == status and info.value.acked == 0
                hook.status = 200  # the endpoint is fixed: the same batch goes through
                await ep.send(batch_of(3))
            assert len(hook.records()) == 6

    run(scenario)


@pytest.mark.parametrize("path, status", [("/hook", 400), ("/hook", 404), ("/moved", 302)])
def test_http_permanent_failures_raise_endpoint_rejected(path, status):
    async def scenario() -> None:
        async with Webhook() as hook:
            hook.status = status if path == "/hook" else 200
            async with open_endpoint(hook.url.replace("/hook", path)) as ep:
                with pytest.raises(EndpointRejected) as info:
                    await ep.send(batch_of(2))
                assert info.value.status == status
                assert not isinstance(info.value, EndpointError)

    run(scenario)


def test_http_failure_part_way_reports_what_was_acked():
    async def scenario() -> None:
        async with Webhook() as hook:
            async with open_endpoint(hook.url, options={"max_batch": "10"}) as ep:
                hook.ok_budget = 2
                with pytest.raises(EndpointError) as info:
                    await ep.send(batch_of(35))
                assert info.value.acked == 20 and info.value.status == 503
            assert len(hook.records()) == 30  # the refused third request was received, not acknowledged

    run(scenario)


def test_http_connection_refused_and_timeout_raise_endpoint_error():
    async def scenario() -> None:
        async with open_endpoint(f"http://user:pw@127.0.0.1:{free_port()}/hook") as ep:
            with pytest.raises(EndpointError) as info:
                await ep.send(batch_of(1))
            assert "pw" not in str(info.value)
        async with Webhook() as hook:
            async with open_endpoint(hook.url.replace("/hook", "/slow"), options={"timeout": "0.3"}) as ep:
                with pytest.raises(EndpointError):
                    await ep.send(batch_of(1))

    run(scenario)


def test_http_webhook_down_then_back():
    async def scenario() -> None:
        hook = Webhook()
        async with open_endpoint(hook.url) as ep:
            with pytest.raises(EndpointError):
                await ep.send(batch_of(5))
            async with hook:
                await ep.send(batch_of(5))
            assert len(hook.records()) == 5

    run(scenario)


def test_cloudevents_structured_batch_and_binary_modes():
    async def scenario() -> None:
        async with Webhook() as hook:
            batch = batch_of(3)
            async with open_endpoint(hook.url, format="cloudevents") as ep:
                await ep.send(batch)
            (headers, body), = hook.requests
            assert headers["Content-Type"] == "application/cloudevents-batch+json"
            events = json.loads(body)
            assert [e["id"] for e in events] == [n.id for n in batch]
            assert all(e["specversion"] == "1.0" and e["type"] == "dfpubsub.s3.ObjectCreated:Put" for e in events)
            hook.requests.clear()

            async with open_endpoint(hook.url, format="cloudevents", options={"mode": "structured"}) as ep:
                await ep.send(batch)
            assert len(hook.requests) == 3
            assert all(h["Content-Type"] == "application/cloudevents+json" for h, _ in hook.requests)
            assert [json.loads(b)["subject"] for _, b in hook.requests] == [n.key for n in batch]
            hook.requests.clear()

            async with open_endpoint(hook.url, format="cloudevents", options={"mode": "binary"}) as ep:
                await ep.send(batch)
            assert len(hook.requests) == 3  # one event per request
            for (headers, body), n in zip(hook.requests, batch):
                assert headers["Content-Type"] == "application/json"
                assert headers["ce-specversion"] == "1.0" and headers["ce-id"] == n.id.replace(" ", "%20")
                assert unquote(headers["ce-subject"]) == n.key and headers["ce-sequence"] == n.sequencer
                assert headers["ce-source"] and headers["ce-type"] and headers["ce-time"].endswith("Z")
                data = json.loads(body)
                assert (data["key"], data["version"], data["value"]) == (n.key, n.version, n.value)

    run(scenario)


# --- RabbitMQ ------------------------------------------------------------------------------------


def _rabbitmq_listening() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


rabbitmq = pytest.mark.skipif(not _rabbitmq_listening(), reason="no RabbitMQ listening on 127.0.0.1:5672")
BROKER = "amqp://guest:guest@127.0.0.1:5672/%2F"


class Proxy:
    """A TCP relay to RabbitMQ that the test can cut, to lose the endpoint's connection for real."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.server: asyncio.base_events.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _with_queue(test: Callable[[str, object, object], Awaitable[None]]) -> None:
    suffix = uuid.uuid4().hex[:12]
    exchange_name = f"dfpubsub-test-x-{suffix}"
    connection = await aio_pika.connect(BROKER, timeout=10)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.DIRECT)
        queue = await channel.declare_queue(f"dfpubsub-test-q-{suffix}")
        await queue.bind(exchange, routing_key="rk")
        try:
            await test(exchange_name, queue, channel)
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await exchange.delete()
    finally:
        await connection.close()


async def _drain(queue, count: int, timeout: float = 10.0) -> list:
    """Consume ``count`` messages (failing after ``timeout``), then check no more arrive at once."""
    messages: list = []
    got_all = asyncio.Event()

    async def on_message(message) -> None:
        messages.append(message)
        if len(messages) >= count:
            got_all.set()

    tag = await queue.consume(on_message, no_ack=True)
    try:
        await asyncio.wait_for(got_all.wait(), timeout)
    finally:
        await queue.cancel(tag)
    assert await queue.get(no_ack=True, fail=False) is None, "more messages than expected"
    return messages


@rabbitmq
def test_amqp_confirmed_batch_arrives_in_order():
    async def test(exchange_name: str, queue, channel) -> None:
        batch = batch_of(30)
        async with open_endpoint(f"{BROKER}?exchange={exchange_name}&routing_key=rk", options={"max_batch": "8"}) as ep:
            await ep.send(batch)
        messages = await _drain(queue, len(batch))
        assert len(messages) == len(batch)
        bodies = [json.loads(m.body) for m in messages]
        assert [b["Records"][0]["eventId"] for b in bodies] == [n.id for n in batch]
        assert [m.message_id for m in messages] == [n.id for n in batch]
        assert all(m.content_type == "application/json" and m.delivery_mode == 2 for m in messages)

    run(lambda: _with_queue(test))


@rabbitmq
def test_amqp_cloudevents_and_default_routing_key_is_the_topic():
    async def test(exchange_name: str, queue, channel) -> None:
        async with open_endpoint(f"{BROKER}?exchange={exchange_name}", format="cloudevents") as ep:
            await ep.send(batch_of(2, topic="rk"))
        messages = await _drain(queue, 2)
        assert [json.loads(m.body)["specversion"] for m in messages] == ["1.0", "1.0"]
        assert messages[0].content_type == "application/cloudevents+json"

    run(lambda: _with_queue(test))


@rabbitmq
def test_amqp_unroutable_and_missing_exchange_are_errors_and_the_endpoint_recovers():
    async def test(exchange_name: str, queue, channel) -> None:
        async with open_endpoint(f"{BROKER}?exchange={exchange_name}&routing_key=nowhere") as ep:
            with pytest.raises(EndpointError) as info:
                await ep.send(batch_of(3))
            assert "unroutable" in str(info.value) and info.value.acked == 0
            assert "guest:guest" not in str(info.value)
        async with open_endpoint(f"{BROKER}?exchange={exchange_name}-late&routing_key=rk") as ep:
            with pytest.raises(EndpointError) as info:
                await ep.send(batch_of(1))
            assert "NOT_FOUND" in str(info.value)
            # The operator creates the exchange: the next send works on a new channel.
            late = await channel.declare_exchange(f"{exchange_name}-late", aio_pika.ExchangeType.DIRECT)
            try:
                await queue.bind(late, routing_key="rk")
                await ep.send(batch_of(2))
            finally:
                await late.delete()
        assert len(await _drain(queue, 2)) == 2

    run(lambda: _with_queue(test))


@rabbitmq
def test_amqp_reconnects_after_connection_loss():
    async def test(exchange_name: str, queue, channel) -> None:
        proxy = Proxy(5672)
        await proxy.start()
        try:
            url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F?exchange={exchange_name}&routing_key=rk"
            async with open_endpoint(url, options={"timeout": "3"}) as ep:
                await ep.send(batch_of(2))
                proxy.cut()
                delivered = 2
                try:
                    await ep.send(batch_of(2))  # may fail if the loss is noticed only now
                    delivered += 2
                except EndpointError:
                    pass
                await ep.send(batch_of(3))
                delivered += 3
            assert len(await _drain(queue, delivered)) == delivered
        finally:
            await proxy.stop()
        refused = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F?exchange={exchange_name}&routing_key=rk"
        async with open_endpoint(refused, options={"timeout": "3"}) as ep:
            with pytest.raises(EndpointError):
                await ep.send(batch_of(1))

    run(lambda: _with_queue(test))


# --- Redis stream --------------------------------------------------------------------------------


def test_redis_stream_xadd_and_server_loss(redis_server):
    redis = pytest.importorskip("redis")

    async def scenario() -> None:
        async with open_endpoint(f"{redis_server.url}?stream=notify:{{topic}}&maxlen=1000", options={"timeout": "2"}) as ep:
            batch = batch_of(150)
            await ep.send(batch)
            client = redis.Redis.from_url(redis_server.url)
            entries = client.xrange("notify:images")
            assert [e[1][b"id"].decode() for e in entries] == [n.id for n in batch]
            record = json.loads(entries[0][1][b"data"])["Records"][0]
            assert entries[0][1][b"content_type"] == b"application/json" and record["eventId"] == batch[0].id

            redis_server.kill()
            with pytest.raises(EndpointError):
                await ep.send(batch_of(2))
            redis_server.start()
            await ep.send(batch_of(2, topic="later"))
            assert client.xlen("notify:later") == 2

            client.set("notify:wrongtype", "x")
            with pytest.raises(EndpointRejected):
                await ep.send(batch_of(1, topic="wrongtype"))
            client.close()

    run(scenario)
