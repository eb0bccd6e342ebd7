"""A Redis master with two replicas and three sentinels of the test's own, and the [redis]
settings a test changes, put back afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dfpubsub.backends import access
from dfpubsub.testing.servers import RedisSentinelCluster

#: The sentinels' down-after-milliseconds: short, so that a test fails over in a few seconds.
DOWN_AFTER = 1000


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[RedisSentinelCluster]:
    cluster = RedisSentinelCluster(tmp_path / "sentinel", down_after=DOWN_AFTER).start()
    yield cluster
    cluster.kill()


@pytest.fixture
def redis_settings() -> Iterator[None]:
    """Lets a test ``access.configure(redis=...)``; the settings before it come back after."""
    before = access.redis_access()
    yield
    access.configure(redis=before)
