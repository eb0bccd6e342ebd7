"""systemd's notify protocol as a Type=notify unit sees it: READY=1 once synced, WATCHDOG=1 while
the loop turns, STOPPING=1 on SIGTERM; and the status-file check of a controller's first sync."""

import socket
import time

import pytest

from dfpubsub import open_store
from tests.conftest import wait_for
from tests.functional.daemon_helpers import DAEMONS, DaemonProcess, daemon_args


class NotifySocket:
    """What systemd listens on: a datagram socket; :meth:`received` the messages in order."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.path = str(path)
        self.messages: list[tuple[float, str]] = []

    def received(self) -> list[str]:
        while True:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                return [m for _, m in self.messages]

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("name", DAEMONS)
def test_ready_after_sync_watchdog_while_running_stopping_on_sigterm(tmp_path, name):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    open_store(url, ["port", "network"]).close()
    systemd = NotifySocket(tmp_path / "notify.sock")
    d = DaemonProcess(name, daemon_args(name, tmp_path, url),
                      env={"NOTIFY_SOCKET": systemd.path, "WATCHDOG_USEC": "1000000"})
    try:
        wait_for(lambda: "READY=1" in systemd.received(), timeout=30, what=f"{name} to say READY=1")
        # Ready means synced: the probe agrees from then on.
        assert d.get("/readyz")[0] == 200
        wait_for(lambda: systemd.received().count("WATCHDOG=1") >= 5, timeout=10,
                 what="WATCHDOG=1 every half WatchdogSec")
        pings = [t for t, m in systemd.messages if m == "WATCHDOG=1"]
        assert max(b - a for a, b in zip(pings, pings[1:])) < 1.0  # within WatchdogSec, every time
        assert d.terminate() == 0
        assert "STOPPING=1" in systemd.received()
    finally:
        d.kill()
        systemd.close()


def test_an_abstract_notify_socket_is_spoken_to_as_well(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"dfpubsub-test-{id(sock)}"
    sock.bind("\0" + name)
    sock.settimeout(10)
    d = DaemonProcess("df-publisher-service", daemon_args("df-publisher-service", tmp_path, ""),
                      env={"NOTIFY_SOCKET": "@" + name})
    try:
        wait_for(lambda: "READY=1" in sock.recv(4096).decode().split("\n"), what="READY=1 (after STATUS= lines)")
        assert d.terminate() == 0
    finally:
        d.kill()
        sock.close()


def test_controller_warns_when_the_store_it_held_objects_of_is_empty(tmp_path):
    """A controller pointed at another (empty) store than the one of its last run: a warning and
    dfpubsub_suspect_empty_syncs_total 1, not a silent 'synced, objects: 0'."""
    right, wrong = tmp_path / "nb.sqlite", tmp_path / "other.sqlite"
    store = open_store(f"sqlite:///{right}", ["port", "network"])
    for i in range(3):
        store.create("port", f"p{i}", {"i": i})
    store.close()
    open_store(f"sqlite:///{wrong}", ["port", "network"]).close()
    first = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, f"sqlite:///{right}"))
    try:
        first.wait_status("/readyz", 200)
        assert first.terminate() == 0
    finally:
        first.kill()
    assert not any("empty" in r["msg"] for r in first.records())
    second = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, f"sqlite:///{wrong}"))
    try:
        second.wait_status("/readyz", 200)
        wait_for(lambda: "dfpubsub_suspect_empty_syncs_total{name=" in second.metrics()
                 and any("held objects before" in r["msg"] for r in second.records()),
                 what="the warning and its count")
        warning = next(r for r in second.records() if "held objects before" in r["msg"])
        assert warning["level"] == "warning" and warning["objects_before"] == 3
        assert 'dfpubsub_suspect_empty_syncs_total{name="' in second.metrics()
        line = next(x for x in second.metrics().splitlines() if x.startswith("dfpubsub_suspect_empty_syncs_total{"))
        assert line.endswith(" 1.0"), line
        assert second.terminate() == 0
    finally:
        second.kill()


def test_every_daemon_has_a_notify_unit_that_runs_its_installed_script():
    """etc/systemd: one unit per daemon, Type=notify with a watchdog (what the tests above speak),
    the script under the virtualenv prefix the docs install to, and the docs it names shipped there."""
    import configparser
    from pathlib import Path

    root = Path(__file__).parents[3]
    shipped = (root / "setup.cfg").read_text()
    for name in DAEMONS:
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.read(root / "etc" / "systemd" / f"{name}.service")
        service = unit["Service"]
        assert service["Type"] == "notify" and service["NotifyAccess"] == "main", name
        assert float(service["WatchdogSec"]) > 0
        assert service["ExecStart"] == f"/opt/dfpubsub/bin/{name}"
        assert unit["Unit"]["Documentation"] == "file:///opt/dfpubsub/share/doc/dfpubsub/deploy.md"
    assert "share/doc/dfpubsub = docs/*.md" in shipped and "share/dfpubsub/systemd = etc/systemd/*.service" in shipped
