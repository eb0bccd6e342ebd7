"""What every etcd client of dfpubsub shares: endpoints, channel options, failure codes, the
shapes of the responses read, and the fork-aware connection of the store, the queues and the
etcd watch driver.

The store, the queues, publisher discovery and the etcd watch driver all talk
to etcd through aetcd's generated gRPC stubs on a synchronous channel (aetcd's
own client is asyncio-only). Loaded only by them, so ``import dfpubsub`` does
not need grpc.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import grpc
from aetcd import rpc

from ..errors import AuthenticationError, ClosedError, StoreError, StoreUnavailable
from .access import EtcdAccess, etcd_access
from .urls import parse_endpoints

__all__ = ["CHANNEL_OPTIONS", "RECONNECT_OPTIONS", "UNAVAILABLE", "parse_endpoints", "status_code", "answers",
           "open_channel", "txn", "keep_alive_once", "Endpoints", "ForkHooks", "register_fork_hooks", "unregister_fork_hooks",
           "EtcdChannel", "EtcdConnection", "KvLeaseStubs", "KeyValue", "ResponseHeader", "RangeResponse", "DeleteRangeResponse",
           "ResponseOp", "TxnResponse"]

S = TypeVar("S")
T = TypeVar("T")

#: Retry a lost server quickly rather than with gRPC's backoff of up to two minutes. (gRPC's
#: ``min_reconnect_backoff_ms`` is no backoff but the connect timeout: :func:`open_channel` sets it
#: from ``[etcd] connect_timeout``. At 100 ms, as it was, no connection came up at 200 ms of round
#: trip.)
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_MAX_MESSAGE_BYTES = 64 << 20  # gRPC's default of 4 MiB would cap a page of a listing
#: A request/response channel's options: the store, the queues and discovery share them.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    *RECONNECT_OPTIONS,
]
#: The server is gone or slow: drop the channel, the next call connects again.
UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})
#: What etcd says, with UNKNOWN, of a call whose deadline ran out inside the server.
_EXPIRED = "context deadline exceeded"


def status_code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    """The gRPC status of a failed call, if it has one."""
    return exc.code() if isinstance(exc, grpc.Call) else None


def answers(channel: grpc.Channel, timeout: float) -> bool:
    """Connect; False as soon as the connection fails (refused, unreachable), or after ``timeout``."""
    done = threading.Event()
    ready: list[bool] = []

    def seen(state: grpc.ChannelConnectivity) -> None:
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            ready.append(state == grpc.ChannelConnectivity.READY)
            done.set()

    channel.subscribe(seen, try_to_connect=True)
    try:
        return done.wait(timeout) and ready[0]
    finally:
        channel.unsubscribe(seen)


def open_channel(target: str, options: list[tuple[str, Any]]) -> grpc.Channel:
    """A channel to ``target`` (host:port) as ``[etcd]`` says: its connect timeout, TLS when it
    names a CA or a client certificate, and an auth token on every call when it names a user."""
    access = etcd_access()
    # gRPC shares connections between channels to one address by default: a channel opened
    # with other credentials must not ride on a connection another one authenticated.
    options = [*options, ("grpc.use_local_subchannel_pool", 1),
               # gRPC gives a connection attempt max(this, the current backoff) to come up.
               ("grpc.min_reconnect_backoff_ms", round(access.connect_timeout * 1000))]
    if access.tls:
        ca, key, cert = access.pem()
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        if access.server_name:
            options = [*options, ("grpc.ssl_target_name_override", access.server_name)]
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    if not access.username:
        return channel
    return grpc.intercept_channel(channel, _TokenAuth(channel, access, target))


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


# grpc ships no type information (its stubs, types-grpcio, are not installed), so mypy sees these
# bases as Any; grpc.intercept_channel needs them as real bases (it dispatches by isinstance).
class _TokenAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Adds etcd's auth token to every call; a call refused for an expired token (etcd's tokens
    last minutes by default) gets a new one and is made once more, if it was a unary call."""

    def __init__(self, channel: grpc.Channel, access: EtcdAccess, target: str):
        self._auth = rpc.AuthStub(channel)
        self._access = access
        self._target = target
        self._lock = threading.Lock()
        self._token: str | None = None

    def _token_for(self, stale: str | None = None) -> str:
        with self._lock:
            if self._token is None or self._token == stale:
                try:
                    self._token = self._auth.Authenticate(rpc.AuthenticateRequest(
                        name=self._access.username, password=self._access.password), timeout=10.0).token
                except grpc.RpcError as exc:
                    if status_code(exc) in UNAVAILABLE:
                        raise  # the server is away: the caller's usual handling
                    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                    raise AuthenticationError(f"etcd at {self._target} refused user "
                                              f"{self._access.username!r}: {details}") from None
            return self._token

    def _details(self, details: grpc.ClientCallDetails, token: str) -> _Details:
        metadata = [*(details.metadata or ()), ("token", token)]
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def _unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        token = self._token_for()
        outcome = continuation(self._details(details, token), request)
        exc = outcome.exception()
        if exc is not None and _token_refused(exc):
            outcome = continuation(self._details(details, self._token_for(stale=token)), request)
        return outcome

    def _stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details, self._token_for()), request)

    intercept_unary_unary = _unary
    intercept_stream_unary = _unary
    intercept_unary_stream = _stream
    intercept_stream_stream = _stream


def _token_refused(exc: BaseException) -> bool:
    if not isinstance(exc, grpc.Call):
        return False
    return exc.code() == grpc.StatusCode.UNAUTHENTICATED or "invalid auth token" in (exc.details() or "")


def _kv_op(req: Any) -> rpc.RequestOp:
    if isinstance(req, rpc.PutRequest):
        return rpc.RequestOp(request_put=req)
    if isinstance(req, rpc.DeleteRangeRequest):
        return rpc.RequestOp(request_delete_range=req)
    return rpc.RequestOp(request_range=req)


def txn(compare: list[rpc.Compare], success: list[Any], failure: list[Any] | None = None) -> rpc.TxnRequest:
    """A transaction of ``compare`` guards with ``success`` and ``failure`` put, delete and range requests."""
    return rpc.TxnRequest(compare=compare, success=[_kv_op(r) for r in success],
                          failure=[_kv_op(r) for r in failure or ()])


class KvLeaseStubs(NamedTuple):
    """The KV and Lease stubs on one channel (what leases and relist slots call)."""

    kv: Any
    lease: Any

    @classmethod
    def on(cls, channel: grpc.Channel) -> KvLeaseStubs:
        return cls(rpc.KVStub(channel), rpc.LeaseStub(channel))


def keep_alive_once(lease_stub: Any, lease: int, timeout: float) -> int:
    """One ``LeaseKeepAlive`` exchange on aetcd's Lease stub (a stream opened for one request and its
    answer: at one renewal every few seconds a standing stream would save little and need a thread
    of its own); the lease's TTL after it, 0 when etcd no longer knows the lease."""
    responses = lease_stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=timeout)
    try:
        for response in responses:
            return int(response.TTL)
        return 0
    finally:
        responses.cancel()


# -- the responses' shapes -------------------------------------------------------------------
# aetcd's generated messages carry no type information: these are their fields that dfpubsub
# reads. A response takes one of these types where it comes back from gRPC (an annotation, free).


class KeyValue(Protocol):
    """mvccpb.KeyValue: one key as a range or a watch returns it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class ResponseHeader(Protocol):
    revision: int


class RangeResponse(Protocol):
    header: ResponseHeader
    kvs: Sequence[KeyValue]
    more: bool
    count: int


class DeleteRangeResponse(Protocol):
    header: ResponseHeader
    deleted: int
    prev_kvs: Sequence[KeyValue]


class ResponseOp(Protocol):
    """The answer to one request of a transaction (only the field of its kind is set)."""

    response_range: RangeResponse
    response_delete_range: DeleteRangeResponse


class TxnResponse(Protocol):
    header: ResponseHeader
    succeeded: bool
    responses: Sequence[ResponseOp]


# -- connections -----------------------------------------------------------------------------


class Endpoints:
    """The endpoints of an etcd URL and the one in use, which moves on after a failure.

    Not thread-safe: its user's lock guards it. ``unavailable`` is the error
    raised when none answers (the store's StoreUnavailable unless its user
    says otherwise).
    """

    def __init__(self, url: str, unavailable: type[Exception] = StoreUnavailable):
        self.url = url
        self.all = parse_endpoints(url)
        self.index = 0
        self.unavailable = unavailable

    def where(self) -> str:
        """``host:port`` of the endpoint in use."""
        host, port = self.all[self.index]
        return f"{host}:{port}"

    def failed(self) -> None:
        """The endpoint in use failed: the next channel is opened to the next one."""
        self.index = (self.index + 1) % len(self.all)

    def open(self, options: list[tuple[str, Any]] = CHANNEL_OPTIONS) -> grpc.Channel:
        """A channel to the first endpoint that answers, from the one in use; ``unavailable`` if none does.

        Each endpoint is given the connect timeout (``[etcd] connect_timeout``), not a share of a
        call's deadline: far away, a connection takes round trips that no share of a deadline
        may cut short, and an endpoint that refuses fails at once anyway.
        """
        first, n = self.index, len(self.all)
        wait = etcd_access().connect_timeout
        for i in range(n):
            self.index = (first + i) % n
            channel = open_channel(self.where(), options)
            if n == 1 or answers(channel, wait):  # several: take the first that answers
                return channel  # one: gRPC connects on the first call
            channel.close()
        raise self.unavailable(f"none of the etcd endpoints of {self.url} answered")


class ForkHooks(Protocol):
    """What closes its gRPC channels around ``os.fork()`` (see :func:`register_fork_hooks`)."""

    def before_fork(self) -> None:
        """Stop new calls, end or cancel those in flight and close the channel; return holding
        what keeps calls from starting until :meth:`after_fork`."""

    def after_fork(self, child: bool) -> None:
        """Let calls start again, in the parent or (``child``) the new process; they reopen the channel."""


# gRPC cannot fork while a thread is inside it (the child crashes or hangs), so everything of this
# process that holds a channel closes it just before a fork, once its calls have ended, and holds
# its lock until the fork is done; both sides then reopen the channel lazily. (gRPC's own threads
# can still, rarely, hang a child forked while other threads were mid-call: fork before them.)
_FORK_HOOKS: weakref.WeakSet[ForkHooks] = weakref.WeakSet()
_FORKING: list[ForkHooks] = []


def register_fork_hooks(obj: ForkHooks) -> None:
    """Have ``obj.before_fork()`` called just before every ``os.fork()`` of this process and
    ``obj.after_fork(child)`` just after it, on both sides, until ``obj`` is unregistered or garbage."""
    _FORK_HOOKS.add(obj)


def unregister_fork_hooks(obj: ForkHooks) -> None:
    """Undo :func:`register_fork_hooks` (``obj`` closed)."""
    _FORK_HOOKS.discard(obj)


def _before_fork() -> None:
    for obj in list(_FORK_HOOKS):
        obj.before_fork()
        _FORKING.append(obj)


def _after_fork(child: bool) -> None:
    while _FORKING:
        _FORKING.pop().after_fork(child)


os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                    after_in_child=lambda: _after_fork(True))


class EtcdChannel(Generic[S]):
    """A channel to etcd and the stubs ``stubs(channel)`` makes on it, shared by every call.

    The channel is opened on first use (to the first endpoint that answers);
    one that failed is closed, so the next call reconnects (to the next
    endpoint): a restarted etcd is picked up by the same object. gRPC's
    failures become ``refused`` (the server answered no) and ``unavailable``
    (it is gone or slow, or the channel was closed under the call).

    Its owner calls :meth:`before_fork` and :meth:`after_fork` around a fork
    (:class:`EtcdConnection` registers itself): the calls in flight are given
    ``fork_grace`` seconds to end, the channel is closed (cancelling the
    rest) and reopened on the next call, in the parent and in the child.
    """

    def __init__(self, url: str, timeout: float, stubs: Callable[[grpc.Channel], S], *,
                 options: list[tuple[str, Any]] = CHANNEL_OPTIONS, refused: type[Exception] = StoreError,
                 unavailable: type[Exception] = StoreUnavailable, fork_grace: float = 0.0):
        self.url = url
        self.timeout = timeout
        self.endpoints = Endpoints(url, unavailable)
        self._make_stubs = stubs
        self._options = options
        self._refused = refused
        self._unavailable = unavailable
        self._fork_grace = fork_grace
        self._lock = threading.Condition(threading.Lock())  # guards the fields below
        self._pid = -1
        self._channel: grpc.Channel | None = None
        self._stubs: S | None = None  # of _channel
        self._calls = 0  # calls in flight, on any channel
        self._draining = False  # close() waits for the calls in flight: new ones wait too
        self._closed = False  # for good: calls raise ClosedError
        self._orphans: list[object] = []  # a forked child's copies of the parent's channel: never closed

    def where(self) -> str:
        """``host:port`` of the endpoint in use."""
        return self.endpoints.where()

    def call(self, fn: Callable[[S], T]) -> T:
        """Run ``fn(stubs)``; gRPC failures become ``refused`` / ``unavailable``.

        ``fn`` makes RPCs, each with a deadline of ``timeout`` (or a stream it
        cancels when asked to); a fork waits for it to return.
        """
        with self._lock:
            if self._pid != os.getpid():  # first call, or forked without our hook: the parent's calls
                if self._channel is not None:  # and channel are not ours
                    self._orphans.append(self._channel)
                self._channel, self._stubs, self._calls, self._draining, self._pid = None, None, 0, False, os.getpid()
            self._lock.wait_for(lambda: not self._draining)
            stubs = self._stubs
            if stubs is None:
                if self._closed:
                    raise ClosedError(f"etcd connection to {self.url} is closed")
                self._channel = self.endpoints.open(self._options)
                stubs = self._stubs = self._make_stubs(self._channel)
            self._calls += 1
        error: Exception
        try:
            try:
                return fn(stubs)
            except (grpc.RpcError, ValueError) as exc:
                error = self.error(stubs, exc)
            # Not chained to gRPC's error, and without our references: gRPC's call and channel are
            # freed here, before the call counts as ended, so that no thread is inside gRPC at a fork.
            del stubs
        finally:
            with self._lock:
                self._calls -= 1
                if not self._calls:
                    self._lock.notify_all()
        raise error

    def error(self, stubs: S, exc: grpc.RpcError | ValueError) -> Exception:
        """What a call on ``stubs`` that failed with ``exc`` means (:meth:`call` does this; for a call
        made inside another one's ``fn``). A lost or slow server: the channel is closed (unless
        another call already did so) and the next call connects to the next endpoint."""
        where = self.where()
        if isinstance(exc, ValueError):  # gRPC refuses a call on a channel that close(), a failure or a fork closed
            return self._unavailable(f"etcd channel to {where} was closed (or the process forked) during the call")
        code = status_code(exc)
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            details = f"no answer within {self.timeout}s"
        # etcd answers UNKNOWN "context deadline exceeded" when the call's deadline ran out inside the
        # server (a loaded or recovering member): as ambiguous as no answer, so a write may have been applied.
        if code is not None and code not in UNAVAILABLE and not (
                code == grpc.StatusCode.UNKNOWN and _EXPIRED in details):
            return self._refused(f"etcd at {where} refused the request: {code.name}: {details}")
        with self._lock:
            if stubs is self._stubs:
                channel, self._channel, self._stubs = self._channel, None, None
                if channel is not None:
                    channel.close()
                self.endpoints.failed()
        return self._unavailable(f"etcd at {where} is unavailable: {details}")

    def close(self, final: bool = False) -> None:
        """Close the channel, cancelling the calls in flight (waited for up to ``timeout``); the
        next call opens another, or (``final``) raises ClosedError."""
        with self._lock:
            if final:
                self._closed = True
            self._close_locked(0.0)

    def before_fork(self) -> None:
        """See :class:`ForkHooks`: returns holding the lock, with the channel closed."""
        self._lock.acquire()
        self._close_locked(self._fork_grace)

    def after_fork(self, child: bool) -> None:
        self._lock.release()  # a child's first call finds a pid of the parent's and starts afresh

    def _close_locked(self, grace: float) -> None:
        """Close the channel once the calls in flight have ended (given ``grace`` seconds; the rest
        are cancelled) and wait (up to ``timeout``) for them."""
        channel, self._channel, self._stubs = self._channel, None, None
        if channel is None:
            return
        if self._pid != os.getpid():  # the parent's: its calls do not exist here
            self._orphans.append(channel)
            return
        self._draining = True
        if grace:
            self._lock.wait_for(lambda: not self._calls, grace)
        channel.close()  # callers still waiting get ``unavailable``
        self._lock.wait_for(lambda: not self._calls, self.timeout)
        self._draining = False
        self._lock.notify_all()


class EtcdConnection(EtcdChannel[Any]):
    """The channel of an etcd store or queue backend and its KV stub (aetcd's, untyped), shared by
    every call: errors are StoreError / StoreUnavailable, and it closes itself around a fork."""

    def __init__(self, url: str, timeout: float):
        super().__init__(url, timeout, rpc.KVStub)
        register_fork_hooks(self)

    def commit(self, request: rpc.TxnRequest) -> TxnResponse:
        """Run the transaction ``request`` (see :func:`txn`); its response."""
        response: TxnResponse = self.call(lambda kv: kv.Txn(request, timeout=self.timeout))
        return response
