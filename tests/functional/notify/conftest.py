"""The notification tests' queues: one fixture parametrized over the three queue backends."""

import itertools

import pytest

from dfpubsub.queues import open_queues

_prefix = itertools.count()


def open_backend(kind, tmp_path, shared_redis=None, shared_etcd=None):
    """Queues on ``kind`` (sqlite, redis or etcd), under a key prefix of their own."""
    if kind == "sqlite":
        return open_queues(f"sqlite:///{tmp_path}/queues.sqlite")
    prefix = f"t{next(_prefix)}-{tmp_path.name[-20:]}"
    if kind == "redis":
        return open_queues(f"redis://127.0.0.1:{shared_redis.port}/0", prefix=prefix)
    return open_queues(f"etcd://127.0.0.1:{shared_etcd.port}", prefix=prefix)


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def queues(request, tmp_path):
    """Queues on each backend, closed after the test."""
    extra = {"redis": "shared_redis", "etcd": "shared_etcd"}.get(request.param)
    server = request.getfixturevalue(extra) if extra else None
    q = open_backend(request.param, tmp_path, shared_redis=server, shared_etcd=server)
    yield q
    q.close()
