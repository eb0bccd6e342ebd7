"""/livez, /readyz and /metrics of every daemon, over HTTP, with the store killed and restarted."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dfpubsub import open_store
from dfpubsub.metrics import ROLE_COUNTERS
from tests.functional.daemon_helpers import DAEMONS, DaemonProcess, daemon_args

#: The roles whose counters each daemon exports from its start (df-feed's publisher carries the
#: feed's counters too; df-notify's per topic appear with their topic).
ROLES = {
    "df-controller": {"controller": ROLE_COUNTERS["controller"], "subscriber-transport": ROLE_COUNTERS["subscriber-transport"]},
    "df-feed": {"publisher": ROLE_COUNTERS["publisher"] + ROLE_COUNTERS["feed"]},
    "df-notify": {},
    "df-archiver": {"archiver": ROLE_COUNTERS["archiver"], "subscriber": ROLE_COUNTERS["subscriber"]},
    "df-publisher-service": {"publisher_service": ROLE_COUNTERS["publisher_service"]},
}


def samples(text):
    """{(sample name, role label)} -> value, of a scrape."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("role", ""))] = s.value
    return out


@pytest.mark.parametrize("name", DAEMONS)
def test_every_counter_is_exported_at_zero_from_the_start(tmp_path, name):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    open_store(url, ["port", "network"]).close()
    d = DaemonProcess(name, daemon_args(name, tmp_path, url))
    try:
        d.wait_status("/readyz", 200)
        got = samples(d.metrics())
        assert got[("dfpubsub_up", name)] == 1
        assert got[("dfpubsub_synced", name)] == 1
        assert got[("dfpubsub_ready", name)] == 1
        missing = [(role, c) for role, counters in ROLES[name].items() for c in counters
                   if (f"dfpubsub_{c}_total", role) not in got]
        assert not missing, f"{name} does not export {missing}"
        assert d.get("/livez") == (200, "ok\n")
        assert d.get("/healthz")[0] == 200
        assert d.get("/nothing")[0] == 404
        status, verbose = d.get("/readyz?verbose")
        assert status == 200 and "[+]synced ok" in verbose
        assert d.terminate() == 0
    finally:
        d.kill()


@pytest.mark.parametrize("name", ["df-controller", "df-feed", "df-notify"])
def test_readyz_names_the_store_while_it_is_down(tmp_path, etcd_server, name):
    """Ready once synced; etcd killed: /readyz 503 naming the failing check, /livez still 200 (a
    restart would not help), dfpubsub_ready 0; etcd restarted: ready again, same process."""
    with open_store(etcd_server.url, ["port"]) as store:
        store.initialize()  # as df-db init does: the daemons open no store that nobody made
    d = DaemonProcess(name, daemon_args(name, tmp_path, etcd_server.url))
    check = "queues" if name == "df-notify" else ("feed" if name == "df-feed" else "store")
    try:
        body = d.wait_status("/readyz", 200, what=f"{name} to sync on etcd")
        assert body == "ok\n"
        etcd_server.kill()
        body = d.wait_status("/readyz", 503, what=f"{name} to see etcd gone")
        assert f"[-]{check} failed:" in body, body
        assert body.strip().splitlines()[-1] == "readyz check failed"
        assert d.get("/livez")[0] == 200
        assert samples(d.metrics())[("dfpubsub_ready", name)] == 0
        etcd_server.restart()
        d.wait_status("/readyz", 200, what=f"{name} to be ready again once etcd is back")
        assert samples(d.metrics())[("dfpubsub_ready", name)] == 1
        assert d.terminate() == 0
    finally:
        d.kill()


def test_readyz_fails_before_the_first_sync(tmp_path, etcd_server):
    """A controller that never reached its store is not ready, and says both why."""
    url = etcd_server.url
    etcd_server.kill()
    d = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, url))
    try:
        body = d.wait_status("/readyz", 503)
        assert "[-]synced failed: first sync not done" in body
        d.wait_status("/livez", 200)
        assert samples(d.metrics())[("dfpubsub_synced", "df-controller")] == 0
        assert d.terminate() == 0
    finally:
        d.kill()
