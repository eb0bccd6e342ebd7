"""Running the daemons as operators do: a subprocess with flags, JSON logs on stderr, the
probes and /metrics over HTTP, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from tests.conftest import free_port, wait_for

#: Every daemon, by its console script.
DAEMONS = ("df-controller", "df-feed", "df-notify", "df-archiver", "df-publisher-service")


def exe(name: str) -> str:
    """The installed console script ``name``."""
    found = shutil.which(name, path=os.path.dirname(sys.executable))
    assert found, f"{name} is not installed next to {sys.executable}"
    return found


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of GET ``path`` on 127.0.0.1:``port``; (0, error) if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


class DaemonProcess:
    """Daemon ``name`` started with ``args`` (plus ``--metrics.port``: :attr:`port`), its stderr
    read into :attr:`lines`."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None = None, metrics: bool = True):
        self.name = name
        self.port = free_port() if metrics else 0
        argv = [exe(name), *args, "--log.format", "json"]
        if metrics:
            argv += ["--metrics.port", str(self.port)]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr or ()), daemon=True)
        self._reader.start()

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (anything else is kept as {"msg": line})."""
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line.rstrip()})
        return out

    def logged(self, msg: str) -> dict[str, Any] | None:
        return next((r for r in self.records() if r.get("msg") == msg), None)

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.port, path)

    def wait_status(self, path: str, status: int, timeout: float = 30.0, what: str = "") -> str:
        """Wait until ``path`` answers ``status``; its body."""
        seen: list[tuple[int, str]] = []

        def answered() -> bool:
            seen.append(self.get(path))
            return seen[-1][0] == status

        try:
            wait_for(answered, timeout=timeout, interval=0.1, what=what or f"{self.name} {path} -> {status}")
        except BaseException:
            print(f"{self.name} last answered {seen[-1:]}; stderr:\n{''.join(self.lines[-30:])}")
            raise
        return seen[-1][1]

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body

    def terminate(self, timeout: float = 5.0) -> int:
        """SIGTERM, then its exit status (within ``timeout`` seconds, or the test fails)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout} s of SIGTERM; stderr:\n"
                                 + "".join(self.lines[-30:])) from None

    def wait_exit(self, deadline: float) -> int:
        """Its exit status, by ``deadline`` (time.monotonic()) or the test fails."""
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit in time after SIGTERM; stderr:\n"
                                 + "".join(self.lines[-30:])) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)


def store_args(url: str, tables: str = "port,network") -> list[str]:
    return ["--store.url", url, "--store.tables", tables]


def daemon_args(name: str, tmp_path: Any, store_url: str, **extra: str) -> list[str]:
    """Flags that run daemon ``name`` on ``store_url`` in ``tmp_path`` with private ports and files."""
    args = [] if name == "df-publisher-service" else store_args(store_url)  # it has no store
    if name == "df-controller":
        args += ["--pubsub.driver", f"zmq+tcp://127.0.0.1:{free_port()}", "--controller.status-file",
                 str(tmp_path / "ctl.status")]
    elif name == "df-feed":
        args += ["--pubsub.driver", f"zmq+tcp://127.0.0.1:{free_port()}", "--feed.cursor", str(tmp_path / "feed.cursor"),
                 "--feed.announce", "false"]
    elif name == "df-notify":
        args += ["--notify.renew-interval", "0.3", "--notify.lease", "3", "--notify.poll-interval", "0.05"]
    elif name == "df-archiver":
        args += ["--pubsub.driver", f"zmq+tcp://127.0.0.1:{free_port()}", "--archive.path", str(tmp_path / "archive"),
                 "--archive.fsync", "false"]
    elif name == "df-publisher-service":
        args += ["--pubsub.driver", f"zmq+tcp://127.0.0.1:{free_port()}", "--pubsub.multiproc-socket",
                 str(tmp_path / "pub.sock"), "--publisher-service.announce", "false"]
    for flag, value in extra.items():
        args += [f"--{flag.replace('__', '.').replace('_', '-')}", value]
    return args
