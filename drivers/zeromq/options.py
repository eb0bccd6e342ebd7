"""Options of the ``zmq`` driver and the socket settings every socket shares."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, overload

import zmq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dfpubsub.codec import topic_frame
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.metrics import Stats

__all__ = ["ZmqOptions", "CONTROL_SUBSCRIBE", "SCHEMES", "common_options", "recv_messages"]

#: What an XPUB reads when a subscriber subscribes to the control topic: a subscriber joined.
CONTROL_SUBSCRIBE = b"\x01" + topic_frame(CONTROL_TOPIC)
SCHEMES = ("tcp://", "ipc://", "inproc://")


class ZmqOptions(BaseModel):
    """Options of the ``zmq`` driver (config table ``[driver.zmq]``)."""

    model_config = ConfigDict(extra="forbid")

    publishers: list[str] = Field(default_factory=list, description="Endpoints a subscriber connects to at start.")
    sndhwm: int = Field(10_000, ge=1, description="Envelopes queued per subscriber before the publisher drops.")
    rcvhwm: int = Field(10_000, ge=1, description="Envelopes queued in a subscriber before ZeroMQ drops.")
    heartbeat_ivl: float = Field(1.0, ge=0, description="ZMTP heartbeat interval, seconds (0 disables).")
    heartbeat_timeout: float = Field(3.0, ge=0, description="Drop a peer silent this long, seconds.")
    linger: float = Field(1.0, ge=0, description="How long close() waits to send queued messages, seconds.")
    recv_batch: int = Field(256, ge=1, description="Most envelopes one recv() call returns.")
    worker_hwm: int = Field(
        10_000, ge=1, description="Envelopes a forked worker buffers while the publisher service is away; then drops."
    )
    max_subscriptions: int = Field(
        10_000, ge=1, description="Publisher: distinct topics it takes subscriptions to beyond those it has sent "
                                  "on (a subscription flood costs bounded memory; docs/security.md).")
    max_peer_bytes: int = Field(
        256 * 1024, ge=1024, description="Publisher: bytes one tcp subscriber may send (its subscriptions, which "
                                         "libzmq keeps at ~45 bytes of memory a byte until it leaves) beyond "
                                         "peer_bytes_per_second; then it is cut off (docs/security.md).")
    peer_bytes_per_second: float = Field(
        128.0, ge=0, description="Publisher: bytes a second of connection a tcp subscriber may send on top of "
                                 "max_peer_bytes (ZMTP heartbeats).")
    max_peers: int = Field(
        4096, ge=1, description="Publisher: tcp subscribers connected at once; the newest beyond are cut off "
                                "(each costs libzmq its pipes and up to its own budget; docs/security.md).")
    max_peers_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Publisher: bytes all tcp subscribers together may send beyond "
                                               "peer_bytes_per_second (their subscriptions' memory in libzmq, "
                                               "~45 bytes a byte); beyond, the heaviest are cut off.")
    peer_stall_timeout: float = Field(
        10.0, ge=0, description="Publisher: cut off a tcp subscriber that acknowledged nothing this long while "
                                "data waits for it, seconds (0: never; what waits is bounded by sndhwm).")
    ipc_mode: int = Field(0o660, ge=0, le=0o777, description="Permissions of a bound ipc socket file.",
                          json_schema_extra={"octal": True})
    curve_secret_key: str | None = Field(None, description="Publisher: Z85 CURVE secret key; enables encryption.")
    curve_secret_key_file: str = Field(
        "", description="Publisher: a ZeroMQ certificate file (.key_secret, df-keys generate) instead of "
                        "curve_secret_key; subscriber: its own key pair instead of curve_client_secret_key.")
    worker_curve_key_file: str = Field(
        "", description="Publisher service and its workers: the host's CURVE key pair (a .key_secret file, "
                        "mode 0600) on the ipc link: the service serves with it and lets in only workers that "
                        "present it (empty: the socket file's mode alone guards the link).")
    curve_allowed_keys: list[str] = Field(
        default_factory=list, description="Publisher with CURVE: Z85 public keys of the subscribers let in "
                                          "(with curve_allowed_dir; neither: any subscriber).")
    curve_allowed_dir: str = Field(
        "", description="Publisher with CURVE: directory of subscribers' public key files, re-read when it "
                        "changes (docs/security.md).")
    curve_server_key: str | None = Field(None, description="Subscriber: the publishers' Z85 CURVE public key.")
    curve_client_secret_key: str | None = Field(
        None, description="Subscriber: own Z85 CURVE secret key (a fresh one if unset)."
    )

    @model_validator(mode="after")
    def _check(self) -> ZmqOptions:
        if self.heartbeat_ivl and self.heartbeat_timeout <= self.heartbeat_ivl:
            raise ValueError("heartbeat_timeout must be longer than heartbeat_ivl")
        for name in ("curve_secret_key", "curve_server_key", "curve_client_secret_key"):
            key = getattr(self, name)
            if key is not None and len(key) != 40:
                raise ValueError(f"{name} must be a 40-character Z85 key")
        if any(len(k) != 40 for k in self.curve_allowed_keys):
            raise ValueError("curve_allowed_keys must be 40-character Z85 public keys")
        if self.curve_allowed_dir and not os.path.isdir(self.curve_allowed_dir):
            raise ValueError(f"curve_allowed_dir {self.curve_allowed_dir!r} is not a directory")
        for name in ("curve_secret_key_file", "worker_curve_key_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ValueError(f"{name} {path!r} is not a file")
        return self


def common_options(sock: zmq.Socket[bytes], opts: ZmqOptions) -> None:
    """Linger and ZMTP heartbeats, as the options say."""
    sock.setsockopt(zmq.LINGER, int(opts.linger * 1000))
    if opts.heartbeat_ivl:
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(opts.heartbeat_ivl * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(opts.heartbeat_timeout * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TTL, int(opts.heartbeat_timeout * 1000))


@overload
def recv_messages(
    sock: zmq.Socket[bytes], limit: int, stats: Stats, copy: Literal[True] = True
) -> list[tuple[bytes, bytes]]: ...
@overload
def recv_messages(sock: zmq.Socket[bytes], limit: int, stats: Stats, copy: Literal[False]) -> list[tuple[bytes, memoryview]]: ...
def recv_messages(
    sock: zmq.Socket[bytes], limit: int, stats: Stats, copy: bool = True
) -> Sequence[tuple[bytes, bytes | memoryview]]:
    """Up to ``limit`` waiting ``(topic + NUL, envelope)`` messages, without blocking.

    With ``copy=False`` an envelope is a memoryview of the received
    :class:`zmq.Frame` (no copy), which :class:`ZmqPublisher` sends on
    without copying either. Anything else than two frames, the first
    NUL-terminated (a peer speaking another framing), is counted as
    ``decode_errors{reason="bad_frames"}`` and dropped.
    """
    out: list[tuple[bytes, bytes | memoryview]] = []
    recv = sock.recv
    for _ in range(limit):
        try:
            # Frame by frame rather than recv_multipart: its RCVMORE getsockopt per frame
            # costs more than the frames' own flag. zmq.Again (6 us) ends each drain.
            head = recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
        if not head.more:
            stats.inc("decode_errors", reason="bad_frames")
            continue
        body = recv(copy=False)  # a message arrives whole: its other frames are here
        if body.more:
            while recv(copy=False).more:
                pass
            stats.inc("decode_errors", reason="bad_frames")
            continue
        tf = head.bytes
        if not tf.endswith(b"\x00"):
            stats.inc("decode_errors", reason="bad_frames")
            continue
        out.append((tf, body.bytes if copy else body.buffer))
    return out
