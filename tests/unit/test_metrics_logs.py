import json
import logging

from prometheus_client import REGISTRY, generate_latest

from dfpubsub.logs import JsonFormatter, RateLimitedLog
from dfpubsub.metrics import Stats, register_collector


def test_counters_are_exported_to_prometheus():
    register_collector()
    register_collector()  # idempotent
    stats = Stats("subscriber", "metrics-test")
    stats.inc("events_in", 5)
    stats.inc("decode_errors", reason="truncated")
    text = generate_latest(REGISTRY).decode()
    assert 'dfpubsub_events_in_total{name="metrics-test",role="subscriber"} 5.0' in text
    assert 'dfpubsub_decode_errors_total{name="metrics-test",reason="truncated",role="subscriber"} 1.0' in text
    assert stats.get("decode_errors") == 1 and stats.snapshot()["decode_errors:truncated"] == 1


def test_counters_exist_at_zero_and_carry_no_empty_reason():
    register_collector()
    stats = Stats("subscriber", "zero-test")
    text = generate_latest(REGISTRY).decode()
    assert 'dfpubsub_gaps_total{name="zero-test",role="subscriber"} 0.0' in text
    assert 'reason=""' not in text
    stats.inc("drops", 2, reason="overflow")
    text = generate_latest(REGISTRY).decode()
    assert 'dfpubsub_drops_total{name="zero-test",reason="overflow",role="subscriber"} 2.0' in text
    assert 'reason=""' not in text and stats.snapshot() == {"drops:overflow": 2}


def test_gauges_are_exported_with_their_help():
    register_collector()
    stats = Stats("notify", "gauge-test")
    stats.set("pending", 7)
    text = generate_latest(REGISTRY).decode()
    assert "# HELP dfpubsub_pending Notifications waiting" in text
    assert 'dfpubsub_pending{name="gauge-test",role="notify"} 7.0' in text


def test_json_log_lines_carry_extra_fields():
    record = logging.makeLogRecord({"name": "x", "levelname": "WARNING", "msg": "gap", "topic": "port"})
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "gap" and line["topic"] == "port" and line["level"] == "warning"


def test_rate_limited_log_says_how_much_it_suppressed(caplog):
    rl = RateLimitedLog(logging.getLogger("rl-test"), interval=3600)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            rl.warning("k", "bad frame", key="v")
    assert len(caplog.records) == 1 and caplog.records[0].suppressed == 0 and caplog.records[0].key == "v"


def test_gauges_read_at_scrape_time_and_histograms_are_exported():
    register_collector()
    stats = Stats("controller", "gauge-test")
    depth = [3]
    stats.set("workqueue_depth", lambda: depth[0])
    stats.set("reconcile_failed_keys", 1)
    hist = stats.histogram("workqueue_wait")
    for v in (0.00001, 0.002, 0.002, 7.0):
        hist.observe(v)
    depth[0] = 4
    text = generate_latest(REGISTRY).decode()
    assert 'dfpubsub_workqueue_depth{name="gauge-test",role="controller"} 4.0' in text
    assert 'dfpubsub_reconcile_failed_keys{name="gauge-test",role="controller"} 1.0' in text
    assert 'dfpubsub_workqueue_wait_seconds_bucket{le="0.0025",name="gauge-test",role="controller"} 3.0' in text
    assert 'dfpubsub_workqueue_wait_seconds_count{name="gauge-test",role="controller"} 4.0' in text
    assert hist.quantile(0.5) == 0.0025 and hist.quantile(0.99) == 10.0 and stats.level("workqueue_depth") == 4
