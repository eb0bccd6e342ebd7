"""The raw clients of fanout.py: each backend's own client doing the same fan-out as dfpubsub.

One msgpack message per event, as a user without dfpubsub would write it:
ZeroMQ PUB/SUB (one message per event), Redis pipelined ``XADD`` read with
``XREAD BLOCK COUNT``, etcd transactions of puts read by a prefix watch, NATS
JetStream publishes pipelined (``publish_async``, up to 4000 unacknowledged)
read by a pull consumer each (``fetch`` of up to 512). A subscriber reports what it received (``Received``); nothing here detects loss. Every process waits for the word to exit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgpack
from e2e import CONNECT_TIMEOUT, HWM, KEYS, TABLE, TOPICS, VALUE, send_loop

SAMPLE = 8  # the clock is read on one event in 8, as the full-stack recorder does


class Received:
    """A raw subscriber's count, first and last sampled clock, and CPU from the first to the last."""

    def __init__(self) -> None:
        self.count = self.last_count = 0
        self.first = self.last = 0.0
        self.cpu0 = self.cpu = 0.0

    def got(self, data: bytes) -> None:
        msgpack.unpackb(data)
        self.count += 1
        if self.count % SAMPLE == 1:
            self.last, self.last_count, self.cpu = time.time(), self.count, time.process_time() - self.cpu0
            if self.count == 1:
                self.first, self.cpu0, self.cpu = self.last, self.cpu, 0.0

    def report(self) -> dict[str, Any]:
        window = self.last - self.first
        return {"delivered": self.count, "rate": (self.last_count - 1) / window if window > 0 else 0.0,
                "cpu_s": self.cpu, "cpu_events": self.last_count - 1, "sizes": {}}


def _event(j: int) -> bytes:
    return msgpack.packb({"table": TABLE, "key": KEYS[j & 1023], "action": "update", "version": j + 1,
                          "value": VALUE, "timestamp": time.time()})


def _until_done(conn: Connection, rec: Received, read: Callable[[], None], idle: Callable[[], bool]) -> None:
    """Call ``read`` until the publisher's count (relayed on ``conn``) was received or reading went idle."""
    sent: int | None = None
    while sent is None or rec.count < sent:
        before = rec.count
        read()
        if rec.count == before and idle():
            if sent is not None:
                return
            if conn.poll():
                sent = conn.recv()["sent"]


# -- ZeroMQ ------------------------------------------------------------------------------------

def zmq_pub(conn: Connection, ready: list[MpEvent], seconds: float, url: str, prefix: str) -> None:
    import zmq

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, HWM)
    conn.send(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while not all(r.is_set() for r in ready):  # slow joiners: greet until every subscriber heard
        sock.send_multipart([b"warm", b""])
        if time.monotonic() > deadline:
            raise TimeoutError("a raw subscriber never connected")
        time.sleep(0.02)
    conn.send("go")
    topics = [t.encode() for t in TOPICS]

    def burst(i: int, n: int) -> None:
        for j in range(i, i + n):
            sock.send_multipart([topics[j & 3], _event(j)])

    conn.send(send_loop(burst, seconds, 0))
    conn.recv()
    sock.close()


def zmq_sub_socket(endpoint: str, timeout_ms: int) -> Any:
    """A raw SUB socket connected to ``endpoint``, subscribed to the benchmark's topics and ``warm``."""
    import zmq

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    for topic in (b"warm", *(t.encode() for t in TOPICS)):
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(endpoint)
    return sock


def zmq_sub(conn: Connection, ready: MpEvent, index: int, url: str, prefix: str) -> None:
    import zmq

    sock = zmq_sub_socket(conn.recv(), 200)
    rec = Received()
    timed_out = False

    def read() -> None:
        nonlocal timed_out
        try:
            topic, data = sock.recv_multipart()
        except zmq.Again:
            timed_out = True
            return
        timed_out = False
        if topic == b"warm":
            ready.set()
        else:
            rec.got(data)

    _until_done(conn, rec, read, lambda: timed_out)
    conn.send(rec.report())
    conn.recv()
    sock.close(0)


# -- Redis -------------------------------------------------------------------------------------

def redis_pub(conn: Connection, ready: list[MpEvent], seconds: float, url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    conn.send(url)
    for r in ready:
        r.wait(CONNECT_TIMEOUT)
    conn.send("go")
    keys = [f"{prefix}:{t}" for t in TOPICS]

    def burst(i: int, n: int) -> None:
        pipe = client.pipeline(transaction=False)
        for j in range(i, i + n):
            pipe.xadd(keys[j & 3], {"e": _event(j)}, maxlen=100_000, approximate=True)
        pipe.execute()

    conn.send(send_loop(burst, seconds, 0))
    conn.recv()
    client.close()


def redis_sub(conn: Connection, ready: MpEvent, index: int, url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    conn.recv()
    cursors: dict[str, bytes | str] = {f"{prefix}:{t}": "0-0" for t in TOPICS}  # fresh keys: from the start
    client.ping()
    ready.set()
    rec = Received()
    empty = False

    def read() -> None:
        nonlocal empty
        reply: Any = client.xread(cursors, count=512, block=200)  # type: ignore[arg-type]
        empty = not reply
        for key, entries in reply or ():
            for _, fields in entries:
                rec.got(fields[b"e"])
            cursors[key.decode()] = entries[-1][0]

    _until_done(conn, rec, read, lambda: empty)
    conn.send(rec.report())
    conn.recv()
    client.close()


# -- etcd --------------------------------------------------------------------------------------

def _etcd_stubs(url: str) -> tuple[Any, Any]:
    import grpc
    from aetcd import rpc

    channel = grpc.insecure_channel(url.split("://", 1)[1], options=[("grpc.max_receive_message_length", -1)])
    return rpc.KVStub(channel), rpc.WatchStub(channel)


def etcd_pub(conn: Connection, ready: list[MpEvent], seconds: float, url: str, prefix: str) -> None:
    from aetcd import rpc

    kv, _ = _etcd_stubs(url)
    conn.send(url)
    for r in ready:
        r.wait(CONNECT_TIMEOUT)
    conn.send("go")
    keys = [f"/{prefix}/{t}/".encode() for t in TOPICS]

    def burst(i: int, n: int) -> None:
        puts = [rpc.RequestOp(request_put=rpc.PutRequest(key=keys[j & 3] + b"%012x" % j, value=_event(j)))
                for j in range(i, i + n)]
        kv.Txn(rpc.TxnRequest(success=puts), timeout=10)

    conn.send(send_loop(burst, seconds, 0))
    conn.recv()
    end = f"/{prefix}0".encode()  # the next prefix: delete the run's keys (not measured)
    kv.DeleteRange(rpc.DeleteRangeRequest(key=f"/{prefix}/".encode(), range_end=end), timeout=30)


def etcd_sub(conn: Connection, ready: MpEvent, index: int, url: str, prefix: str) -> None:
    import grpc
    from aetcd import rpc
    from aetcd.utils import prefix_range_end

    _, watch = _etcd_stubs(url)
    conn.recv()
    root = f"/{prefix}/".encode()
    stop = threading.Event()

    def requests() -> Any:
        yield rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=root, range_end=prefix_range_end(root)))
        stop.wait()

    call = watch.Watch(requests())
    rec = Received()
    last = [time.monotonic()]

    def follow() -> None:
        try:
            for response in call:
                if response.created:
                    ready.set()
                for event in response.events:
                    rec.got(event.kv.value)
                last[0] = time.monotonic()
        except grpc.RpcError:  # cancelled at the end
            pass

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    _until_done(conn, rec, lambda: time.sleep(0.05), lambda: time.monotonic() - last[0] > 0.5)
    conn.send(rec.report())
    conn.recv()
    stop.set()
    call.cancel()


# -- NATS JetStream ------------------------------------------------------------------------------

def nats_pub(conn: Connection, ready: list[MpEvent], seconds: float, url: str, prefix: str) -> None:
    import nats

    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(url))
    js = nc.jetstream(publish_async_max_pending=4000)
    loop.run_until_complete(js.add_stream(name=prefix, subjects=[f"{prefix}.>"]))
    conn.send(url)
    for r in ready:
        r.wait(CONNECT_TIMEOUT)
    conn.send("go")
    subjects = [f"{prefix}.{t}" for t in TOPICS]

    async def publish(i: int, n: int) -> None:
        for j in range(i, i + n):
            await js.publish_async(subjects[j & 3], _event(j))

    report = send_loop(lambda i, n: loop.run_until_complete(publish(i, n)), seconds, 0)
    loop.run_until_complete(js.publish_async_completed())
    conn.send(report)
    conn.recv()
    loop.run_until_complete(js.delete_stream(prefix))  # not measured
    loop.run_until_complete(nc.close())


def nats_sub(conn: Connection, ready: MpEvent, index: int, url: str, prefix: str) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(url))
    conn.recv()
    psub = loop.run_until_complete(nc.jetstream().pull_subscribe(
        f"{prefix}.>", stream=prefix, config=ConsumerConfig(ack_policy=AckPolicy.NONE)))
    ready.set()
    rec = Received()
    empty = False

    def read() -> None:
        nonlocal empty
        try:
            msgs = loop.run_until_complete(psub.fetch(512, timeout=0.2))
        except TimeoutError:
            msgs = []
        empty = not msgs
        for msg in msgs:
            rec.got(msg.data)

    _until_done(conn, rec, read, lambda: empty)
    conn.send(rec.report())
    conn.recv()
    loop.run_until_complete(nc.close())


CLIENTS: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    "zmq": (zmq_pub, zmq_sub), "redis": (redis_pub, redis_sub), "etcd": (etcd_pub, etcd_sub),
    "nats": (nats_pub, nats_sub),
}
