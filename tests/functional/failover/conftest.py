"""A Redis master with two replicas and three sentinels of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dfpubsub.testing.servers import RedisSentinelCluster

#: The sentinels' down-after-milliseconds: short, so that a test fails over in a few seconds.
DOWN_AFTER = 1000


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[RedisSentinelCluster]:
    cluster = RedisSentinelCluster(tmp_path / "sentinel", down_after=DOWN_AFTER).start()
    yield cluster
    cluster.kill()
