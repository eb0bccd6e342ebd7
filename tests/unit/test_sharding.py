"""Shard names and the key -> shard mapping of persistent topics."""

import collections
import os
import subprocess
import sys
import zlib

import pytest

from dfpubsub.errors import InvalidValue
from dfpubsub.queues import shard_for, shard_index, shard_names


def test_names_shard_zero_is_the_topic():
    assert shard_names("orders", 1) == ["orders"]
    assert shard_names("orders", 3) == ["orders", "orders.1", "orders.2"]
    names = shard_names("orders", 11)
    assert len(names) == 11 and names[0] == "orders" and names[-1] == "orders.10"


@pytest.mark.parametrize(("bucket", "key", "crc", "of_11", "of_7"), [
    ("port", "p1", 3103010612, 9, 2),
    ("bucket", "photos/cat.jpg", 939882399, 5, 1),
    ("network", "n-42", 2472154018, 4, 5),
    ("t", "", 3431364543, 2, 5),
])
def test_index_is_crc32_of_bucket_colon_key(bucket, key, crc, of_11, of_7):
    # Fixed values: any host, process or language must compute the same shard.
    assert zlib.crc32(f"{bucket}:{key}".encode()) == crc
    assert shard_index(bucket, key, 11) == of_11 and shard_index(bucket, key, 7) == of_7
    assert shard_index(bucket, key, 1) == 0
    assert shard_for("topic", 11, bucket, key) == ("topic" if of_11 == 0 else f"topic.{of_11}")


def test_stable_across_processes():
    # Python's hash() of a str is salted per process; the shard must not be.
    code = "from dfpubsub.queues import shard_index; print(shard_index('port', 'p1', 11))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
    assert outs == {"9"}


def test_keys_spread_evenly_over_shards():
    counts = collections.Counter(shard_index("port", f"port-{i}", 11) for i in range(22_000))
    assert set(counts) == set(range(11))
    assert all(abs(c - 2000) < 200 for c in counts.values()), counts


def test_the_bucket_is_part_of_the_key():
    spread = {shard_index(f"bucket-{b}", "same-key", 11) for b in range(50)}
    assert len(spread) > 5


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, None])
def test_bad_shard_counts(bad):
    with pytest.raises(InvalidValue):
        shard_index("b", "k", bad)
    with pytest.raises(InvalidValue):
        shard_names("t", bad)
