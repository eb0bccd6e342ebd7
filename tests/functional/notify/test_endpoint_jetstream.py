"""The NATS JetStream endpoint against a private nats-server (never the machine's own NATS)."""

from __future__ import annotations

import asyncio
import json

import pytest

nats = pytest.importorskip("nats")

from dfpubsub.endpoints import open_endpoint  # noqa: E402
from dfpubsub.errors import EndpointConfigError, EndpointError  # noqa: E402
from dfpubsub.notify.notification import make_notification  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def batch_of(n, topic="images"):
    return [make_notification(topic, "s3:ObjectCreated:Put", "update", "media", f"obj-{i}", i + 1, {"i": i})
            for i in range(n)]


async def stream_messages(url, stream, subject):
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            out.append(await js.get_msg(stream, seq))
        return out
    finally:
        await nc.close()


async def add_stream(url, name, subjects):
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=subjects)
    finally:
        await nc.close()


def test_acknowledged_in_order_and_a_resent_batch_is_stored_once(nats_server):
    async def go():
        await add_stream(nats_server.url, "NOTIFY", ["notify.>"])
        sent = batch_of(50)
        async with open_endpoint(f"{nats_server.url}/notify.{{topic}}", options={"max_batch": "20"}) as ep:
            await ep.send(sent)
            await ep.send(sent[10:30])  # the delivery layer resending after a failure
        got = await stream_messages(nats_server.url, "NOTIFY", "notify.images")
        assert [m.headers["Nats-Msg-Id"] for m in got] == [n.id for n in sent]
        assert {m.subject for m in got} == {"notify.images"}
        record = json.loads(got[0].data)["Records"][0]
        assert record["s3"]["object"]["key"] == "obj-0" and got[0].headers["Content-Type"] == "application/json"

    asyncio.run(go())


def test_no_stream_then_server_down_are_errors_and_the_endpoint_recovers(nats_server):
    async def go():
        async with open_endpoint(f"{nats_server.url}/orders", options={"timeout": "1"}) as ep:
            with pytest.raises(EndpointError, match="no stream holds the subject"):
                await ep.send(batch_of(3))
            await add_stream(nats_server.url, "ORDERS", ["orders"])
            first, later = batch_of(3), batch_of(5, topic="later")
            await ep.send(first)
            nats_server.kill()
            with pytest.raises(EndpointError):
                await ep.send(batch_of(2))
            nats_server.start()
            for _ in range(50):  # reconnecting: a send succeeds once the client is back
                try:
                    await ep.send(later)  # resent whole after each failure: stored once
                    break
                except EndpointError:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("the endpoint did not recover")
        got = await stream_messages(nats_server.url, "ORDERS", "orders")
        assert [m.headers["Nats-Msg-Id"] for m in got] == [n.id for n in first + later]

    asyncio.run(go())


@pytest.mark.parametrize("url, match", [("nats:///x", "not a nats URL"), ("nats://h:4222/a.*", "not a subject")])
def test_bad_urls_are_config_errors(url, match):
    with pytest.raises(EndpointConfigError, match=match):
        open_endpoint(url)
