"""storemeter: what a store serves, measured, for the benchmarks that count it (repair, fleet).

* a private store of each backend (:func:`private_store`: a SQLite file, or a Redis or etcd
  server of this run's own on a free loopback port), loaded with port-like objects
  (:func:`load`, :func:`port_value`);
* what its server sent, from the server's own counters (:class:`RedisMeter`: ``INFO stats``
  ``total_net_output_bytes`` and ``INFO commandstats``; :class:`EtcdMeter`: ``/metrics``);
* the server process's CPU seconds and peak RSS (:class:`ProcessMeter`, from ``/proc``);
* rows and bytes at the store API, for SQLite which has no server (:class:`ApiMeter`, a
  measuring wrapper around the real handles' read calls).
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

from dfpubsub.store import Store, open_store
from dfpubsub.store.sqlite import SqliteStore
from dfpubsub.testing.servers import EtcdServer, RedisServer

TABLE = "port"
PREFIX = "bench"


def port_value(i: int, gen: int = 0) -> dict[str, Any]:
    """A port-like value, ~190 bytes as msgpack."""
    return {"name": f"port-{i:07d}", "mac": f"fa:16:3e:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
            "fixed_ips": [{"ip_address": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"}],
            "network_id": "9b2f6c1e-3d4a-4f8b-a0c7-5e6d1f2a3b4c", "status": "ACTIVE", "admin_state_up": True,
            "mtu": 1500, "device_owner": "compute:nova", "gen": gen}


def key_of(i: int) -> str:
    return f"port-{i:07d}"


def wait_until(cond: Callable[[], bool], timeout: float, poll: float = 0.001) -> bool:
    """Poll ``cond`` until it holds (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def wait_for(cond: Callable[[], bool], timeout: float, what: str, poll: float = 0.001) -> None:
    """Poll ``cond`` until it holds; SystemExit naming ``what`` after ``timeout`` seconds."""
    if not wait_until(cond, timeout, poll):
        raise SystemExit(f"timed out after {timeout}s waiting for {what}")



def _text(s: str) -> int:
    return len(s.encode())


def _obj_bytes(o: Any) -> int:
    return _text(o[0]) + _text(o[1]) + _text(o[2]) + 8 + len(msgpack.packb(o[4]))


class ApiMeter:
    """Rows and bytes the store handles' read methods returned (see the module's doc), counted
    while ``active``. Results are kept and measured at :meth:`take`, off the repair's path."""

    METHODS = ("get_many", "list_at", "list_packed_at", "list_versions_at", "_read_feed", "feed_head")

    def __init__(self) -> None:
        self.active = False
        self.results: list[tuple[str, Any]] = []

    def wrap(self, store: Store) -> None:
        for name in self.METHODS:
            real = getattr(store, name)
            setattr(store, name, self._wrapped(name, real))
        if type(store).follow_feed is not Store.follow_feed:
            # etcd's reader follows a watch, not _read_feed: measure what its reads return.
            follow = store.follow_feed

            def follow_feed(after: int) -> Any:
                reader = follow(after)
                read = reader.read

                def measured(*args: Any, **kwargs: Any) -> Any:
                    entries = read(*args, **kwargs)
                    if self.active:
                        self.results.append(("_read_feed", (entries, reader.position)))
                    return entries

                reader.read = measured  # type: ignore[method-assign]
                return reader

            store.follow_feed = follow_feed  # type: ignore[method-assign]

    def _wrapped(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if self.active:
                self.results.append((name, result))  # list.append: atomic, no lock
            return result
        return call

    def start(self) -> None:
        self.results = []
        self.active = True

    def take(self) -> dict[str, Any]:
        self.active = False
        calls: Counter[str] = Counter()
        rows = nbytes = 0
        for name, result in self.results:
            calls[name] += 1
            if name == "get_many":
                rows += len(result)
                nbytes += sum(_obj_bytes(o) for o in result)
            elif name in ("list_at", "list_packed_at"):
                rows += len(result[0])
                nbytes += 8 + sum(_obj_bytes(o) for o in result[0])
            elif name == "list_versions_at":
                rows += len(result[0])
                nbytes += 8 + sum(_text(t) + _text(tb) + _text(k) + 8 for t, tb, k, _ in result[0])
            elif name == "_read_feed":
                rows += len(result[0])
                nbytes += 8 + sum(8 + _text(e.topic) + _text(e.table) + _text(e.key) + _text(e.action.value)
                                  for e in result[0])
            else:  # feed_head
                rows += 1
                nbytes += 8
        self.results = []
        return {"api_rows": rows, "api_bytes": nbytes, "api_calls": sum(calls.values()), "api_by_call": dict(calls)}


class ProcessMeter:
    """A process's CPU seconds (``/proc/PID/stat``) and its peak RSS between :meth:`start` and
    :meth:`take`, sampled every ``interval`` seconds by a thread of its own (``VmHWM`` is the peak
    since the process began, and resetting it needs privileges a benchmark should not ask for)."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid = pid
        self.interval = interval
        self._peak = 0
        self._cpu0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-{pid}", daemon=True)
        self._thread.start()

    def cpu(self) -> float:
        """CPU seconds (user + system) the process used so far."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss(self) -> int:
        """The process's resident set now, in bytes."""
        with open(f"/proc/{self.pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._peak = max(self._peak, self.rss())
            except OSError:  # the process is gone
                return

    def start(self) -> None:
        self._cpu0 = self.cpu()
        self._peak = self.rss()

    def take(self) -> dict[str, float]:
        """Since :meth:`start`: ``cpu_s``, ``peak_rss`` and ``rss`` (bytes, now)."""
        rss = self.rss()
        return {"cpu_s": self.cpu() - self._cpu0, "peak_rss": max(self._peak, rss), "rss": rss}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class ServerMeter:
    """What a store server sent, read before and after; :meth:`delta` gives bytes and commands.
    ``process``: its server process, where there is one."""

    process: ProcessMeter | None = None

    def read(self) -> Any:
        return None

    def delta(self, before: Any, after: Any) -> dict[str, Any]:
        return {}


class RedisMeter(ServerMeter):
    """``INFO stats`` and ``INFO commandstats`` over a raw socket: the replies' exact sizes are
    known, and taken out of ``total_net_output_bytes``."""

    def __init__(self, host: str, port: int):
        self.sock = socket.create_connection((host, port))
        self.buf = b""

    def _info(self, section: str) -> tuple[str, int]:
        self.sock.sendall(f"INFO {section}\r\n".encode())
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, _, rest = self.buf.partition(b"\r\n")
        assert head.startswith(b"$"), head
        size = int(head[1:])
        while len(rest) < size + 2:
            rest += self.sock.recv(65536)
        body, self.buf = rest[:size], rest[size + 2:]
        return body.decode(), len(head) + 2 + size + 2

    def read(self) -> dict[str, Any]:
        cmd_text, cmd_reply = self._info("commandstats")
        stats_text, stats_reply = self._info("stats")
        out = int(re.search(r"total_net_output_bytes:(\d+)", stats_text)[1])  # type: ignore[index]
        calls = {m[1]: int(m[2]) for m in re.finditer(r"cmdstat_([^:]+):calls=(\d+)", cmd_text)}
        calls.pop("info", None)
        return {"out": out, "calls": calls, "cmd_reply": cmd_reply, "stats_reply": stats_reply}

    def delta(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        # Counted between the two reads of total_net_output_bytes: the first read's own
        # reply (sent after the counter was read) and the second's commandstats reply.
        sent = after["out"] - before["out"] - before["stats_reply"] - after["cmd_reply"]
        calls = {c: n - before["calls"].get(c, 0) for c, n in after["calls"].items()}
        calls = {c: n for c, n in calls.items() if n}
        return {"bytes": sent, "commands": sum(calls.values()), "by_command": calls}

    def close(self) -> None:
        self.sock.close()


class EtcdMeter(ServerMeter):
    """etcd's ``/metrics`` on its client URL."""

    _LINE = re.compile(r'^(\w+)(?:\{([^}]*)\})? ([0-9.e+-]+)$')

    def __init__(self, host: str, port: int):
        self.url = f"http://{host}:{port}/metrics"

    def read(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url, timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = self._LINE.match(line)
            if m is None:
                continue
            name, labels, value = m[1], m[2] or "", float(m[3])
            if name == "etcd_network_client_grpc_sent_bytes_total":
                out["bytes"] = value
            elif name in ("grpc_server_started_total", "grpc_server_msg_sent_total"):
                method = re.search(r'grpc_method="(\w+)"', labels)
                out[f"{name}:{method[1] if method else '?'}"] = out.get(f"{name}:{method[1] if method else '?'}",
                                                                         0.0) + value
        return out

    def delta(self, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        started = {k.split(":", 1)[1]: int(v) for k, v in d.items() if k.startswith("grpc_server_started") and v}
        msgs = sum(int(v) for k, v in d.items() if k.startswith("grpc_server_msg_sent"))
        return {"bytes": int(d.get("bytes", 0)), "commands": sum(started.values()), "by_command": started,
                "messages": msgs}


@contextmanager
def private_store(backend: str, workdir: Path) -> Iterator[tuple[str, ServerMeter | None]]:
    """(url, server meter) of a store of ``backend`` of this run's own."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir}/nb.sqlite", None
        return
    server = (EtcdServer if backend == "etcd" else RedisServer)(workdir / backend).start()
    meter: ServerMeter = EtcdMeter(server.host, server.port) if backend == "etcd" else RedisMeter(server.host,
                                                                                                 server.port)
    assert server.proc is not None
    meter.process = ProcessMeter(server.proc.pid)
    try:
        yield server.url, meter
    finally:
        meter.process.close()
        if isinstance(meter, RedisMeter):
            meter.close()
        server.kill()


def open_bench_store(url: str) -> Store:
    return open_store(url, [TABLE]) if url.startswith("sqlite") else open_store(url, [TABLE], prefix=PREFIX)


def load(store: Store, start: int, stop: int, threads: int) -> float:
    """Create objects ``start`` .. ``stop - 1``; seconds taken. SQLite: one transaction of
    plain INSERTs (the store's triggers still stamp revisions and append the feed); Redis and
    etcd: ``store.create`` from ``threads`` threads (the stores have no batch write)."""
    t0 = time.perf_counter()
    if isinstance(store, SqliteStore):
        conn = sqlite3.connect(store.path)
        (rev,) = conn.execute("SELECT value FROM nb_meta WHERE name = 'revision'").fetchone()
        conn.executemany("INSERT INTO nb_objects VALUES (?, ?, ?, ?, ?)",
                         ((TABLE, key_of(i), TABLE, rev + 1 + i - start, msgpack.packb(port_value(i)))
                          for i in range(start, stop)))
        conn.commit()
        conn.close()
    else:
        def work(part: range) -> None:
            for i in part:
                store.create(TABLE, key_of(i), port_value(i))

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, [range(start + j, stop, threads) for j in range(threads)]))
    return time.perf_counter() - t0



def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

