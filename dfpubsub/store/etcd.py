"""etcd store (``etcd://host:port[,host:port...]``) through aetcd.

Why an event loop in a thread: aetcd (gRPC's asyncio API) is asyncio-only,
while the :class:`~dfpubsub.store.api.Store` contract is synchronous and
thread-safe, because its callers are forked web workers and plain threads
that have no loop of their own. Each store therefore owns a private loop in a
daemon thread; a call submits a coroutine to it and waits for the result.
Both the loop and the gRPC channel are created on first use; they are closed
just before ``os.fork()`` (gRPC does not survive a fork with its threads
active) and reopened on the next call, in the parent and in the child. A
channel that failed is dropped, so the next call reconnects: a restarted etcd
is picked up by the same store object.

Layout: ``/{prefix}/nb/{table}/{key}`` holds msgpack ``[topic, value blob]``.
An object's version is its ``mod_revision``, i.e. etcd's store-wide revision
of its last write; a deletion's version is the revision of the delete. Every
write is one transaction that compares the revision it expects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import aetcd
import grpc
import msgpack
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..errors import AlreadyExists, ConfigError, NotFound, StoreError, StoreUnavailable, VersionConflict
from ..events import VersionedObject
from .api import DEFAULT_MAX_VALUE_BYTES, Store, decode_value

__all__ = ["EtcdStore"]

T = TypeVar("T")
_MAX_MESSAGE_BYTES = 64 << 20  # gRPC's default of 4 MiB would cap a page of a listing
_PAGE_KEYS = 5000
_CHANNEL_OPTIONS = {
    "grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
    "grpc.max_send_message_length": _MAX_MESSAGE_BYTES,
    # Retry a lost server quickly rather than with gRPC's backoff of up to two minutes.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}
# The server is gone or slow: the channel is dropped and the caller told StoreUnavailable.
_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


# gRPC cannot fork while a thread is inside it (the child crashes or hangs), so every store of
# this process closes its channel and loop just before a fork, holding its lock until the fork
# is done; both sides then reopen them lazily.
_STORES: weakref.WeakSet[EtcdStore] = weakref.WeakSet()
_FORKING: list[EtcdStore] = []


def _before_fork() -> None:
    for store in list(_STORES):
        store._lock.acquire()
        _FORKING.append(store)
        store._close_locked()


def _after_fork() -> None:
    while _FORKING:
        _FORKING.pop()._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def _parse_endpoints(url: str) -> list[tuple[str, int]]:
    if not url.startswith("etcd://"):
        raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
    endpoints = []
    for part in url[len("etcd://"):].split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or "@" in host:
            raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
        endpoints.append((host, int(port)))
    return endpoints


def _kv_op(req: Any) -> rpc.RequestOp:
    if isinstance(req, rpc.PutRequest):
        return rpc.RequestOp(request_put=req)
    if isinstance(req, rpc.DeleteRangeRequest):
        return rpc.RequestOp(request_delete_range=req)
    return rpc.RequestOp(request_range=req)


def _created(key: bytes, result: int) -> rpc.Compare:
    """Compare the key's create_revision with 0: EQUAL means absent, GREATER present."""
    return rpc.Compare(key=key, target=rpc.Compare.CREATE, result=result, create_revision=0)


def _mod_is(key: bytes, revision: int) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision)


async def _answers(channel: grpc.aio.Channel) -> bool:
    """Connect; False as soon as the connection fails (refused, unreachable)."""
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return False
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)
    return True


def _head(kvs: Any) -> tuple[str, int] | None:
    """(topic, mod_revision) of the first of ``kvs``, or None."""
    return (msgpack.unpackb(kvs[0].value)[0], kvs[0].mod_revision) if kvs else None


class EtcdStore(Store):
    """Objects in etcd 3.4+; versions are etcd revisions."""

    backend = "etcd"

    def __init__(
        self,
        url: str,
        tables: Iterable[str],
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        prefix: str = "dfpubsub",
        timeout: float = 5.0,
    ):
        super().__init__(tables, max_value_bytes)
        self.url = url
        self.prefix = prefix
        self.timeout = timeout
        self._endpoints = _parse_endpoints(url)
        self._endpoint = 0  # index of the endpoint in use; moves on after a failure
        self._root = f"/{prefix}/nb/".encode()
        self._lock = threading.Lock()
        self._pid = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: aetcd.Client | None = None  # touched only on the loop's thread
        self._connecting: asyncio.Lock | None = None  # ditto
        self._orphans: list[object] = []  # a forked child's copies of the parent's loop: never closed
        _STORES.add(self)

    # -- plumbing ------------------------------------------------------------------------

    def _loop_locked(self) -> asyncio.AbstractEventLoop:
        if self._loop is not None and self._pid == os.getpid():
            return self._loop
        if self._loop is not None:  # forked without our hook: the parent's loop thread is not here
            self._orphans.append((self._loop, self._thread, self._client))
            self._client = None
        loop = asyncio.new_event_loop()
        self._connecting = asyncio.Lock()
        thread = threading.Thread(target=loop.run_forever, name=f"dfpubsub-etcd-{self.prefix}", daemon=True)
        thread.start()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()
        return loop

    def _run(self, fn: Callable[[aetcd.Client], Coroutine[Any, Any, T]], bounded: bool = True) -> T:
        """Run ``fn(client)`` on the loop; gRPC failures become StoreUnavailable / StoreError.

        Every RPC has a deadline of ``timeout``; the wait here is a backstop, and
        is left out for listings, whose page count is unknown.
        """
        coro = self._guarded(fn)
        with self._lock:  # so that close() cannot stop the loop before it has the task to cancel
            future = asyncio.run_coroutine_threadsafe(coro, self._loop_locked())
        try:
            return future.result(2 * self.timeout + 1 if bounded else None)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise StoreUnavailable(f"etcd at {self._where()} did not answer within {self.timeout}s") from exc
        except concurrent.futures.CancelledError as exc:
            raise StoreUnavailable(f"etcd store {self.url} was closed (or the process forked) during the call") from exc

    async def _guarded(self, fn: Callable[[aetcd.Client], Coroutine[Any, Any, T]]) -> T:
        client = await self._connect()
        try:
            return await fn(client)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                details = f"no answer within {self.timeout}s"
            if code is None or code in _UNAVAILABLE:
                raise await self._failed(client, details) from exc
            raise StoreError(f"etcd at {self._where()} refused the request: {code.name}: {details}") from exc
        except aetcd.ClientError as exc:
            raise await self._failed(client, str(exc)) from exc

    async def _failed(self, client: aetcd.Client, details: str) -> StoreUnavailable:
        """Drop the failed channel (unless another call already replaced it); try the next endpoint next."""
        where = self._where()
        if client is self._client:
            await self._disconnect()
            self._endpoint = (self._endpoint + 1) % len(self._endpoints)
        return StoreUnavailable(f"etcd at {where} is unavailable: {details}")

    def _where(self) -> str:
        host, port = self._endpoints[self._endpoint]
        return f"{host}:{port}"

    async def _connect(self) -> aetcd.Client:
        if self._client is not None:
            return self._client
        assert self._connecting is not None
        async with self._connecting:
            if self._client is None:
                self._client = await self._open()
            return self._client

    async def _open(self) -> aetcd.Client:
        first = self._endpoint
        for i in range(len(self._endpoints)):
            self._endpoint = (first + i) % len(self._endpoints)
            host, port = self._endpoints[self._endpoint]
            client = aetcd.Client(host, port, timeout=self.timeout, options=dict(_CHANNEL_OPTIONS))
            await client.connect()  # creates the channel; gRPC connects on the first call
            if len(self._endpoints) == 1:
                return client
            try:  # several endpoints: take the first that answers
                if await asyncio.wait_for(_answers(client.channel), self.timeout / len(self._endpoints)):
                    return client
            except asyncio.TimeoutError:
                pass
            await client.close()
        raise StoreUnavailable(f"none of the etcd endpoints of {self.url} answered")

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except (grpc.RpcError, aetcd.ClientError):
                pass  # the channel is being thrown away

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None:
            return
        if self._pid != os.getpid():  # the parent's: its thread does not exist here
            self._orphans.append((loop, thread, self._client))
            self._client = None
            return

        async def shutdown() -> None:  # callers still waiting get StoreUnavailable
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await self._disconnect()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(self.timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass  # closing anyway
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(self.timeout)
        if not loop.is_running():
            loop.close()

    # -- etcd operations ----------------------------------------------------------------

    def _path(self, table: str, key: str) -> bytes:
        return self._root + f"{table}/{key}".encode()

    async def _txn(self, client: aetcd.Client, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        request = rpc.TxnRequest(compare=compare, success=[_kv_op(r) for r in success],
                                 failure=[_kv_op(r) for r in failure])
        return await client.kvstub.Txn(request, timeout=self.timeout, metadata=client.metadata)

    async def _range(self, client: aetcd.Client, request: rpc.RangeRequest) -> Any:
        return await client.kvstub.Range(request, timeout=self.timeout, metadata=client.metadata)

    def _get(self, table: str, key: str) -> VersionedObject | None:
        async def run(client: aetcd.Client) -> Any:
            return await self._range(client, rpc.RangeRequest(key=self._path(table, key)))

        kvs = self._run(run).kvs
        if not kvs:
            return None
        topic, blob = msgpack.unpackb(kvs[0].value)
        return VersionedObject(topic, table, key, kvs[0].mod_revision, decode_value(blob))

    def _list(self, table: str | None, topics: set[str] | None) -> list[VersionedObject]:
        if topics is not None and not topics:
            return []
        start = self._root + (f"{table}/".encode() if table is not None else b"")
        end = prefix_range_end(start)

        async def run(client: aetcd.Client) -> list[Any]:
            pages: list[Any] = []
            key, revision, limit = start, 0, _PAGE_KEYS
            while True:
                request = rpc.RangeRequest(key=key, range_end=end, limit=limit, revision=revision)
                try:
                    page = await self._range(client, request)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                        limit //= 2  # a page above the message limit: smaller pages
                    elif exc.code() == grpc.StatusCode.OUT_OF_RANGE and revision:
                        pages, key, revision = [], start, 0  # snapshot compacted away: start over
                    else:
                        raise
                    continue
                revision = revision or page.header.revision  # every page from the same snapshot
                pages.append(page.kvs)
                if not page.more or not page.kvs:
                    return pages
                key = page.kvs[-1].key + b"\x00"

        pages = self._run(run, bounded=False)
        out: list[VersionedObject] = []
        skip, tables, unpack = len(self._root), self.tables, msgpack.unpackb
        for kvs in pages:
            for kv in kvs:
                tbl, _, key = kv.key[skip:].decode().partition("/")
                if tbl not in tables:
                    continue
                topic, blob = unpack(kv.value)
                if topics is None or topic in topics:
                    out.append(VersionedObject(topic, tbl, key, kv.mod_revision, decode_value(blob)))
        return out

    def _create(self, table: str, key: str, topic: str, blob: bytes, value: Any) -> VersionedObject:
        path = self._path(table, key)

        async def run(client: aetcd.Client) -> Any:
            return await self._txn(client, [_created(path, rpc.Compare.EQUAL)],
                                   [rpc.PutRequest(key=path, value=msgpack.packb([topic, blob]))], [])

        response = self._run(run)
        if not response.succeeded:
            raise AlreadyExists(f"{table}/{key} already exists")
        return VersionedObject(topic, table, key, response.header.revision, value)

    def _update(
        self, table: str, key: str, topic: str | None, blob: bytes, value: Any, expected: int | None
    ) -> VersionedObject:
        path = self._path(table, key)

        async def run(client: aetcd.Client) -> tuple[str, int]:
            # The stored value holds the topic: without a new topic, read the current one and
            # write only if the object did not change meanwhile.
            new_topic, want, current = topic, expected, None
            if topic is None:
                current = _head((await self._range(client, rpc.RangeRequest(key=path))).kvs)
            while True:
                if topic is None:
                    if current is None:
                        raise NotFound(f"{table}/{key} does not exist")
                    if expected is not None and current[1] != expected:
                        raise VersionConflict(table, key, expected, current[1])
                    new_topic, want = current
                compare = [_created(path, rpc.Compare.GREATER)]
                if want is not None:
                    compare.append(_mod_is(path, want))
                put = rpc.PutRequest(key=path, value=msgpack.packb([new_topic, blob]))
                response = await self._txn(client, compare, [put], [rpc.RangeRequest(key=path)])
                if response.succeeded:
                    return str(new_topic), response.header.revision
                current = _head(response.responses[0].response_range.kvs)
                if current is None:
                    raise NotFound(f"{table}/{key} does not exist")
                if expected is not None:
                    raise VersionConflict(table, key, expected, current[1])
                # No version expected, but it changed since its topic was read: retry on what we got.

        new_topic, version = self._run(run)
        return VersionedObject(new_topic, table, key, version, value)

    def _delete(self, table: str, key: str, expected: int | None) -> VersionedObject:
        path = self._path(table, key)
        compare = [_created(path, rpc.Compare.GREATER)]
        if expected is not None:
            compare.append(_mod_is(path, expected))

        async def run(client: aetcd.Client) -> Any:
            return await self._txn(client, compare, [rpc.DeleteRangeRequest(key=path, prev_kv=True)],
                                   [rpc.RangeRequest(key=path)])

        response = self._run(run)
        if not response.succeeded:
            current = _head(response.responses[0].response_range.kvs)
            if current is None:
                raise NotFound(f"{table}/{key} does not exist")
            raise VersionConflict(table, key, expected or 0, current[1])
        prev = response.responses[0].response_delete_range.prev_kvs  # exists: compared in the txn
        return VersionedObject(msgpack.unpackb(prev[0].value)[0], table, key, response.header.revision, None)

    def _drop_all(self) -> int:
        async def run(client: aetcd.Client) -> int:
            request = rpc.DeleteRangeRequest(key=self._root, range_end=prefix_range_end(self._root))
            response = await client.kvstub.DeleteRange(request, timeout=self.timeout, metadata=client.metadata)
            return int(response.deleted)

        return self._run(run)
