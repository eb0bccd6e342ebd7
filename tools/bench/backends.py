"""A store of each backend for benchmarks: SQLite in a temp dir, private etcd and Redis servers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dfpubsub.store import Store, open_store
from dfpubsub.testing.servers import EtcdServer, RedisServer

__all__ = ["bench_store"]


@contextlib.contextmanager
def bench_store(backend: str, workdir: str, tables: list[str], **options: Any) -> Iterator[tuple[Store, str]]:
    """Yield ``(store, url)`` for ``backend`` (``sqlite``, ``etcd`` or ``redis``), keys under prefix ``bench``.

    etcd and Redis run as servers of this benchmark's own on free loopback
    ports, killed on exit.
    """
    server = None
    if backend == "sqlite":
        url = f"sqlite:///{workdir}/nb.sqlite"
        store = open_store(url, tables)
    else:
        server = (EtcdServer if backend == "etcd" else RedisServer)(Path(workdir) / backend).start()
        url = server.url
        store = open_store(url, tables, prefix="bench", **options)
    try:
        yield store, url
    finally:
        store.close()
        if server is not None:
            server.kill()
