"""The alert rules and the dashboard in etc/: valid (promtool, Debian's prometheus package), their
own unit tests pass, and every metric they name is in a live scrape of the daemons."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dfpubsub import open_store
from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from tests.conftest import wait_for
from tests.functional.daemon_helpers import DAEMONS, DaemonProcess, daemon_args
from tests.functional.notify_helpers import make_topic

ETC = Path(__file__).parents[3] / "etc"
RULES = ETC / "prometheus" / "dfpubsub-alerts.yml"
DASHBOARD = ETC / "grafana" / "dfpubsub.json"


def promtool(*args):
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: ./dev installs Debian's prometheus package (APT_PACKAGES)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent)


def test_promtool_checks_the_rules():
    out = promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_runs_the_rules_unit_tests():
    out = promtool("test", "rules", "dfpubsub-alerts.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def named_metrics():
    """Every dfpubsub metric (sample name) the rules and the dashboard use."""
    exprs = re.findall(r"expr: (.+)", RULES.read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {name for e in exprs for name in re.findall(r"\bdfpubsub_[a-z_]+", e)}


def test_every_metric_the_rules_and_the_dashboard_name_is_scraped(tmp_path):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, ["port", "network"])
    store.create("port", "p1", {"n": 1})  # the controller reconciles it: its histograms have a sample
    store.close()
    queues = open_queues(url)
    make_topic(NotificationRegistry(queues), "orders", "http://127.0.0.1:9/hook")
    queues.close()
    named = named_metrics()
    assert {"dfpubsub_ready", "dfpubsub_gaps_total", "dfpubsub_pending"} <= named  # the parsing finds them
    scraped: set[str] = set()
    running = []
    try:
        for name in DAEMONS:
            extra = ["--notify.bridge", "true"] if name == "df-notify" else []
            work = tmp_path / name
            work.mkdir()
            running.append(DaemonProcess(name, daemon_args(name, work, url) + extra))
        for d in running:
            d.wait_status("/readyz", 200)
        # df-notify measures its topics' gauges on its walks.
        wait_for(lambda: "dfpubsub_pending{" in running[DAEMONS.index("df-notify")].metrics(), what="the pending gauge")
        for d in running:
            scraped |= {s.name for fam in text_string_to_metric_families(d.metrics()) for s in fam.samples}
        for d in running:
            assert d.terminate() == 0
    finally:
        for d in running:
            d.kill()
    assert not named - scraped, f"named by etc/ but in no scrape: {sorted(named - scraped)}"
