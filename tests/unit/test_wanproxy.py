"""The WAN proxy: round trips of rtt ± jitter, order kept, loss as stalls, cuts as resets."""

import socket
import socketserver
import threading
import time

import pytest

from dfpubsub.testing.wanproxy import WanProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def _exchange(sock, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "the proxy closed the connection"
        got += chunk
    return got, time.monotonic() - started


def test_round_trips_take_the_rtt_give_or_take_the_jitter_and_keep_order(echo):
    with WanProxy(echo, rtt=0.1, jitter=0.02, loss=0.0, seed=1) as proxy:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(30)
            first, rtt = _exchange(sock, b"hello")
            connected = time.monotonic() - started  # the handshake's round trip, then the exchange's
            assert first == b"hello" and connected >= 0.18
            times = []
            for i in range(20):
                payload = f"{i:04d}".encode() * 1000
                got, rtt = _exchange(sock, payload)
                assert got == payload
                times.append(rtt)
    # Never below the delay (a loaded machine only adds to it).
    assert min(times) >= 0.09 - 0.001
    assert proxy.stalls == 0


def test_loss_becomes_stalls_of_about_an_rto_with_nothing_lost(echo):
    with WanProxy(echo, rtt=0.05, jitter=0.0, loss=0.3, seed=2) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(30)
            times = []
            for i in range(30):
                got, rtt = _exchange(sock, bytes([i]) * 100)
                assert got == bytes([i]) * 100
                times.append(rtt)
    assert proxy.stalls >= 5
    assert proxy.rto == pytest.approx(0.25)
    assert max(times) >= 0.05 + 0.25 - 0.001  # a stalled chunk waited its RTO
    assert sorted(times)[len(times) // 4] < 0.25  # most did not


def test_cut_resets_connections_and_new_ones_still_work(echo):
    with WanProxy(echo, rtt=0.02, jitter=0.0, loss=0.0) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(30)
            assert _exchange(sock, b"x")[0] == b"x"
            proxy.cut()
            with pytest.raises(OSError):
                sock.sendall(b"y")
                if not sock.recv(10):
                    raise ConnectionResetError("closed")
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(30)
            assert _exchange(sock, b"z")[0] == b"z"
        assert proxy.accepted == 2


def test_a_dead_server_closes_the_clients_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()  # bound, never listening: connections are refused
        with WanProxy(dead, rtt=0.02, jitter=0.0, loss=0.0) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
                sock.settimeout(30)
                try:
                    assert sock.recv(10) == b""
                except ConnectionResetError:
                    pass
