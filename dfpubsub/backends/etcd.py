"""What every etcd client of dfpubsub shares: endpoints, channel options, failure codes.

The store, publisher discovery and the etcd watch driver all talk to etcd
through aetcd's generated gRPC stubs on a synchronous channel (aetcd's own
client is asyncio-only). Loaded only by them, so ``import dfpubsub`` does not
need grpc.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
from aetcd import rpc

from ..errors import AuthenticationError, ConfigError
from .access import EtcdAccess, etcd_access

__all__ = ["CHANNEL_OPTIONS", "RECONNECT_OPTIONS", "UNAVAILABLE", "parse_endpoints", "status_code", "answers",
           "open_channel", "txn"]

#: Retry a lost server quickly rather than with gRPC's backoff of up to two minutes.
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
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


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://host:port[,host:port...]`` as (host, port) pairs; ConfigError otherwise."""
    if not url.startswith("etcd://"):
        raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
    endpoints = []
    for part in url[len("etcd://"):].split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or "@" in host:
            raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
        if not 0 < int(port) < 65536:
            raise ConfigError(f"etcd URL {url!r}: port {port} is not between 1 and 65535")
        endpoints.append((host, int(port)))
    return endpoints


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
    """A channel to ``target`` (host:port) as ``[etcd]`` says: TLS when it names a CA or a client
    certificate, and an auth token on every call when it names a user."""
    access = etcd_access()
    # gRPC shares connections between channels to one address by default: a channel opened
    # with other credentials must not ride on a connection another one authenticated.
    options = [*options, ("grpc.use_local_subchannel_pool", 1)]
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


class _TokenAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
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
