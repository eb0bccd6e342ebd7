"""librdkafka's mock Kafka cluster, for tests and benchmarks, with its fault injection.

The mock cluster (``rd_kafka_mock_*`` in librdkafka, inside the
confluent-kafka wheel) serves the real Kafka wire protocol on loopback ports,
so the code under test connects to it as to any cluster. confluent-kafka does
not expose the mock API in Python, so it is called here through ctypes on the
very library the wheel ships: injected request errors, brokers down and up,
leader changes, slow brokers. What it does not model (replication, disks,
controller failover, the sequence check of an idempotent producer that is not
transactional) is said in docs/endpoints.md. Installed as ``dfpubsub.testing.kafka_mock``.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Self

__all__ = ["MockKafkaCluster", "ApiKey", "KafkaErr"]


class ApiKey:
    """Kafka protocol request kinds errors may be injected into."""

    PRODUCE = 0
    METADATA = 3
    INIT_PRODUCER_ID = 22


class KafkaErr:
    """Broker error codes (rd_kafka_resp_err_t)."""

    NOT_LEADER_FOR_PARTITION = 6
    REQUEST_TIMED_OUT = 7
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    LEADER_NOT_AVAILABLE = 5


def _library() -> ctypes.CDLL:
    import confluent_kafka

    base = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    found = sorted(glob.glob(os.path.join(base, "confluent_kafka.libs", "librdkafka*.so*")))
    if not found:
        raise RuntimeError("no librdkafka shared library in the confluent-kafka wheel")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_rtt.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                                       ctypes.c_int32]
    return lib


class MockKafkaCluster:
    """``brokers`` mock brokers (ids 1..n) on loopback; :attr:`bootstrap_servers` is their list."""

    def __init__(self, brokers: int = 3):
        self._lib = _library()
        errstr = ctypes.create_string_buffer(512)
        # The cluster belongs to a client handle of its own (a producer that never produces, and
        # says nothing of its missing bootstrap.servers).
        conf = self._lib.rd_kafka_conf_new()
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
        self._rk = self._lib.rd_kafka_new(0, conf, errstr, len(errstr))
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.brokers = brokers
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, topic: str, partitions: int, replication: int = 3) -> None:
        self._check(self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions,
                                                         min(replication, self.brokers)), "topic_create")

    def push_request_errors(self, api_key: int, *errors: int) -> None:
        """The next ``len(errors)`` requests of kind ``api_key`` fail with these codes, in order."""
        fn = self._lib.rd_kafka_mock_push_request_errors
        self._check(fn(ctypes.c_void_p(self._cluster), ctypes.c_int16(api_key), ctypes.c_size_t(len(errors)),
                       *(ctypes.c_int(e) for e in errors)), "push_request_errors")

    def broker_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones until :meth:`broker_up`."""
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker_id), "broker_set_down")

    def broker_up(self, broker_id: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker_id), "broker_set_up")

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay the broker's responses by ``rtt_ms`` (several requests are then in flight at once)."""
        self._check(self._lib.rd_kafka_mock_broker_set_rtt(self._cluster, broker_id, rtt_ms), "broker_set_rtt")

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the partition's leadership (-1: no leader, the partition is unavailable)."""
        self._check(self._lib.rd_kafka_mock_partition_set_leader(self._cluster, topic.encode(), partition,
                                                                 broker_id), "partition_set_leader")

    @staticmethod
    def _check(err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"rd_kafka_mock_{what} failed with error {err}")

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._rk)
            self._cluster = self._rk = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
