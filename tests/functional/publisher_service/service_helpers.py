"""df-publisher-service as a subprocess, and forked workers, for the publisher service tests."""

import json
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Callable

from dfpubsub.config import load_settings
from tests.conftest import wait_for

EXE = os.path.join(os.path.dirname(sys.executable), "df-publisher-service")

#: Fast timers so that a dead publisher is found in about a second.
PUBSUB = {"max_idle_time": 0.4, "dead_after_idles": 3.0, "message_delay_window": 0.2, "batch_linger": 0.001}


class Service:
    """One df-publisher-service process; start it again after a kill (same port, same socket)."""

    def __init__(self, port: int, socket_path: str, *flags: str):
        self.port = port
        self.socket_path = socket_path
        self.flags = list(flags)
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> "Service":
        lines: list[str] = []
        self.lines = lines
        self.proc = proc = subprocess.Popen(
            [EXE, "--pubsub.driver", f"zmq+{self.uri}", "--pubsub.multiproc-socket", self.socket_path,
             "--pubsub.max-idle-time", str(PUBSUB["max_idle_time"]), "--log.format", "json", *self.flags],
            stderr=subprocess.PIPE, text=True,
        )
        stderr = proc.stderr
        assert stderr is not None
        threading.Thread(target=lambda: lines.extend(stderr), daemon=True).start()
        if wait:
            wait_for(lambda: self.logged("publisher service starting") or proc.poll() is not None,
                     what="the service to start")
            assert proc.poll() is None, self.lines
        return self

    def logged(self, msg: str) -> dict | None:
        for line in list(self.lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == msg:
                return rec
        return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def terminate(self) -> int:
        assert self.proc is not None, "terminate() before start()"
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


def worker_settings(port: int, socket_path: str, **pubsub):
    """Settings of an API worker publishing through the service."""
    return load_settings(None, {"pubsub": {
        "driver": f"zmq+tcp://127.0.0.1:{port}", "multiproc": True, "multiproc_socket": socket_path,
        **PUBSUB, **pubsub,
    }})


def fork(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child (as a pre-fork server does); exit 0 if it returns."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded process forks": on purpose
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def reap(pid: int, timeout: float = 60.0) -> int:
    """Wait for a forked child; its exit status (or -signal)."""
    status: list[int] = []

    def done() -> bool:
        got, st = os.waitpid(pid, os.WNOHANG)
        if got:
            status.append(os.waitstatus_to_exitcode(st))
        return bool(got)

    wait_for(done, timeout=timeout, what=f"worker {pid} to exit")
    return status[0]
