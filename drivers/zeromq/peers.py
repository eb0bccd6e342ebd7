"""A publisher's tcp peers, each held to a budget: one that floods or never reads is cut off.

libzmq keeps every subscription a peer sends in its XPUB's trie (in manual mode
too: ``_manual_subscriptions``, to undo them when the peer leaves), byte by byte,
about 45 bytes of memory per byte subscribed: 100,000 made-up subscriptions of
96 bytes cost 425 MB, whatever this code then does with them, until the peer
disconnects. No socket option bounds it, and an XPUB cannot tell which peer sent
what. The kernel can: the connections libzmq accepted are the process's tcp
sockets whose local port is the bound one (found in ``/proc/self/fd`` and known
by their inode, which no reuse of an fd number confuses), and ``TCP_INFO``
counts what each has sent and what it has acknowledged. A peer is cut off
(``shutdown(2)``, on a copy of libzmq's fd: libzmq sees the connection end,
drops the peer's pipe and frees its subscriptions)

- when it has sent more than ``max_peer_bytes`` plus ``peer_bytes_per_second``
  for each second it has been connected (ZMTP heartbeats): ``peers_cut{reason="flood"}``;
- when data waits for it and it has acknowledged nothing for
  ``peer_stall_timeout`` seconds, so that what libzmq queues for it (up to
  ``sndhwm`` envelopes) does not stay: ``peers_cut{reason="stalled"}``;
- when more than ``max_peers`` are connected, the newest beyond:
  ``peers_cut{reason="too_many"}`` (each costs libzmq its pipes, and may cost
  its own budget);
- when all of them together have sent more than ``max_peers_bytes`` beyond
  their ``peer_bytes_per_second``, the heaviest until they are within it:
  ``peers_cut{reason="total_bytes"}``, so that many peers each within its own
  budget do not add up to what one may not send.

The trie grows only while the publisher's thread is inside a libzmq call and
only by what that call reads from the peers' pipes; with ``RCVHWM`` 2 on the
XPUB that is two messages per peer per call (each read must hand the I/O thread
room for the next), so a check every ``_CHECK_EVERY`` subscriptions read keeps
a flood within its budget plus a few hundred subscriptions. A subscriber cut
off by mistake reconnects, and resyncs from the gap the hellos show it.

Memory freed inside the process stays in the allocator's heap: after a peer
leaves, glibc is asked to give free pages back (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import NamedTuple

from dfpubsub.metrics import Stats

__all__ = ["PeerGuard", "PeerBudget"]

#: Subscriptions read between two checks of the peers' byte counts.
_CHECK_EVERY = 500
#: Seconds between the periodic checks (stalled peers, slow floods).
_CHECK_INTERVAL = 1.0
# struct tcp_info (linux/tcp.h): tcpi_unacked, tcpi_bytes_acked, tcpi_bytes_received (Linux 4.1+),
# tcpi_notsent_bytes (4.6+).
_TCP_INFO_BYTES = 148
_INFO = struct.Struct("=24xI92xQQ8xI")
_FDS = "/proc/self/fd"


class PeerBudget(NamedTuple):
    """What one peer may send and how long it may read nothing, how many peers there may be
    and what they may send together (see the module's doc)."""

    max_bytes: int
    bytes_per_second: float
    stall_timeout: float
    max_peers: int
    max_total_bytes: int


class _Live(NamedTuple):
    """A peer within its own budget at a check, and the bytes it sent beyond its allowance of
    ``bytes_per_second`` (what counts against ``max_total_bytes``)."""

    peer: _Peer
    ino: int
    fd: int
    sent: float


class _Peer:
    """A connection libzmq accepted, since it was first seen."""

    __slots__ = ("since", "acked", "progress", "cut")

    def __init__(self, now: float):
        self.since, self.acked, self.progress = now, 0, now
        self.cut = False  # shut down, until libzmq closes it


def _socket(fd: int, ino: int) -> socket.socket | None:
    """A socket object on a copy of ``fd`` (never on libzmq's own fd: an object owning it would
    close it when collected) if ``fd`` is still the socket of inode ``ino``; else None."""
    try:
        copy = os.dup(fd)
    except OSError:  # closed meanwhile
        return None
    try:
        if os.fstat(copy).st_ino == ino:
            return socket.socket(fileno=copy)
    except OSError:
        pass
    os.close(copy)
    return None


def _trimmer() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    return trim  # glibc's malloc_trim(size_t pad) -> int; None elsewhere


class PeerGuard:
    """Watches the tcp peers of one bound port and cuts off those over budget."""

    def __init__(self, budget: PeerBudget, stats: Stats, clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self.stats = stats
        self._clock = clock
        #: The bound tcp port (None: not tcp, nothing to watch), see :meth:`bound`.
        self._port: int | None = None
        #: Peers by socket inode; ``_others`` the inodes of the process's other sockets.
        self._peers: dict[int, _Peer] = {}
        self._others: set[int] = set()
        self._read = 0
        self._next_check = 0.0
        self._trim = _trimmer()
        #: Trims still to do after a peer left, and when the next may be.
        self._trims_due, self._next_trim = 0, 0.0
        stats.set("tcp_peers", self.connected)

    def connected(self) -> int:
        """The tcp peers connected and not cut off at the last check."""
        return sum(1 for peer in list(self._peers.values()) if not peer.cut)

    def bound(self, uri: str) -> None:
        """The endpoint the socket bound: only a tcp one has peers to watch (on Linux)."""
        if uri.startswith("tcp://") and os.path.isdir(_FDS):
            self._port = int(uri.rsplit(":", 1)[1])

    def read(self, subscriptions: int) -> None:
        """Note ``subscriptions`` read from the socket; check the peers every ``_CHECK_EVERY``."""
        self._read += subscriptions
        if self._read >= _CHECK_EVERY:
            self.check()

    def poll(self) -> None:
        """The periodic check (the publisher's thread calls it at every poll): only when
        subscriptions were read since the last one, or ``_CHECK_INTERVAL`` has passed."""
        if self._read or self._clock() >= self._next_check:
            self.check()

    def check(self) -> None:
        """Find the peers connected now, then cut off every one over budget."""
        if self._port is None:
            return
        now = self._clock()
        self._read, self._next_check = 0, now + _CHECK_INTERVAL
        budget = self.budget
        sockets = self._sockets()
        live: list[_Live] = []
        for ino in [i for i in self._peers if i not in sockets]:  # gone
            del self._peers[ino]
            self._trims_due = 2
        self._others &= sockets.keys()
        for ino, fd in sockets.items():
            if ino in self._others:
                continue
            sock = _socket(fd, ino)
            if sock is None:
                continue
            with sock:
                peer = self._peers.get(ino)
                if peer is None:
                    if not self._accepted(sock):
                        self._others.add(ino)
                        continue
                    peer = self._peers[ino] = _Peer(now)
                if peer.cut:
                    continue
                try:
                    unacked, acked, received, notsent = _INFO.unpack_from(
                        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES))
                except OSError:
                    continue
                if acked != peer.acked or not (unacked or notsent):
                    peer.acked, peer.progress = acked, now
                sent = received - budget.bytes_per_second * (now - peer.since)
                if sent > budget.max_bytes:
                    self._cut(peer, sock, "flood")
                elif budget.stall_timeout and now - peer.progress > budget.stall_timeout:
                    self._cut(peer, sock, "stalled")
                else:
                    live.append(_Live(peer, ino, fd, max(0.0, sent)))
        self._bound_all(live)
        # libzmq frees a peer's subscriptions when this thread next calls into the socket after
        # the peer left, which may be after the fd went: trimmed twice, a second apart.
        if self._trims_due and self._trim is not None and now >= self._next_trim:
            self._trim(0)
            self._trims_due -= 1
            self._next_trim = now + _CHECK_INTERVAL

    def _bound_all(self, live: list[_Live]) -> None:
        """Cut off the newest peers beyond ``max_peers``, then the heaviest while all together
        sent more than ``max_total_bytes``: the peers connected longest, which read what they
        are sent and subscribe little, are the subscribers a flood of connections must not
        push out."""
        budget = self.budget
        if len(live) > budget.max_peers:
            live.sort(key=lambda p: p.peer.since)
            for extra in live[budget.max_peers:]:
                self._cut_live(extra, "too_many")
            del live[budget.max_peers:]
        total = sum(p.sent for p in live)
        if total > budget.max_total_bytes:
            for heavy in sorted(live, key=lambda p: p.sent, reverse=True):
                if total <= budget.max_total_bytes:
                    break
                self._cut_live(heavy, "total_bytes")
                total -= heavy.sent

    def _cut_live(self, live: _Live, reason: str) -> None:
        sock = _socket(live.fd, live.ino)
        if sock is not None:
            with sock:
                self._cut(live.peer, sock, reason)

    def _sockets(self) -> dict[int, int]:
        """The process's sockets now: inode -> an fd of it."""
        out: dict[int, int] = {}
        for name in os.listdir(_FDS):
            try:
                target = os.readlink(f"{_FDS}/{name}")
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                out[int(target[8:-1])] = int(name)
        return out

    def _accepted(self, sock: socket.socket) -> bool:
        """Whether ``sock`` is a connection accepted on the bound port (nothing else in the
        process accepts on it; the listening socket has no peer)."""
        try:
            return (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.getsockname()[1] == self._port and bool(sock.getpeername()))
        except OSError:
            return False

    def _cut(self, peer: _Peer, sock: socket.socket, reason: str) -> None:
        # Shut down, not closed: the connection ends for libzmq too, which frees the peer's pipe
        # and subscriptions and closes its own fd (then the peer is gone, and memory trimmed).
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return
        peer.cut = True
        self.stats.inc("peers_cut", reason=reason)
