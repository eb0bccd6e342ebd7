"""A library user's own daemon gets df-controller's start-up policy in one call:
``open_store_from_settings(settings, wait=...)`` retries a store that does not answer, and
refuses at once one that nobody made (docs/controller.md)."""

import threading
import time

import pytest

from dfpubsub import open_store
from dfpubsub.config import load_settings
from dfpubsub.errors import StoreMissing, StoreUnavailable
from dfpubsub.store import open_store_from_settings
from tests.conftest import wait_for


def _settings(url: str, prefix: str = "dfpubsub"):
    return load_settings(overrides={"store": {"url": url, "tables": ["port"], "prefix": prefix}})


def test_wait_retries_an_unreachable_store_until_it_answers(etcd_server):
    url = etcd_server.url
    with open_store(url, ["port"]) as store:
        store.initialize()
        store.create("port", "p1", {"n": 1})
    etcd_server.kill()
    opened: list[object] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            opened.append(open_store_from_settings(_settings(url), wait=None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=open_it, daemon=True)
    t.start()
    time.sleep(1.5)  # tried, refused, tried again: still waiting, not failed
    assert t.is_alive() and not errors, errors
    etcd_server.restart()
    wait_for(lambda: opened or errors, timeout=60, what="the store to open once etcd is back")
    assert not errors, errors
    store = opened[0]
    try:
        assert store.get("port", "p1").value == {"n": 1}
    finally:
        store.close()


def test_wait_gives_up_after_its_deadline_and_the_default_tries_once(etcd_server, caplog):
    url = etcd_server.url
    with open_store(url, ["port"]) as store:
        store.initialize()
    etcd_server.kill()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="dfpubsub.store"), pytest.raises(StoreUnavailable):
        open_store_from_settings(_settings(url), wait=2.0)
    assert time.monotonic() - started >= 2.0
    assert [r for r in caplog.records if r.getMessage() == "cannot reach the store; retrying"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dfpubsub.store"), pytest.raises(StoreUnavailable):
        open_store_from_settings(_settings(url))
    assert not [r for r in caplog.records if r.getMessage() == "cannot reach the store; retrying"]


def test_wait_refuses_a_store_nobody_made_at_once(etcd_server):
    started = time.monotonic()
    with pytest.raises(StoreMissing, match="under prefix 'typo'"):
        open_store_from_settings(_settings(etcd_server.url, prefix="typo"), wait=None)
    assert time.monotonic() - started < 30
