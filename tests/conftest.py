"""Shared test helpers: waiting on conditions (never on bare sleeps) and free ports."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest


def wait_for(cond: Callable[[], object], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> None:
    """Poll ``cond`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(name="wait_for")
def _wait_for_fixture() -> Callable[..., None]:
    return wait_for
