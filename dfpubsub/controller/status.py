"""A controller's status file: synced, queue depth, the failed set and the cache's objects and bytes per
table, for ``df-db``.

``df-controller`` with ``[controller] status_file`` rewrites it atomically
(a temporary file renamed over it) every ``status_interval`` seconds and on
exit; ``df-db controller-status FILE...`` reads it. It also remembers how many
objects the cache held: a controller whose first sync finds an empty store
while its previous run held objects warns and counts ``suspect_empty_syncs``
(a mistyped store URL or prefix, or a store wiped behind its back). The failed set is the one of
docs/controller.md: keys given up after ``max_retries`` until a reconcile of
theirs succeeds. At most :data:`MAX_FAILED` keys are written (the count is
whole), so the file stays small whatever fails.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from typing import Any

from ..logs import RateLimitedLog
from .runtime import Controller

__all__ = ["MAX_FAILED", "status_of", "write_status", "read_status", "held_before", "StatusWriter"]

MAX_FAILED = 1000


def status_of(controller: Controller, objects: int | None = None) -> dict[str, Any]:
    """The status document of ``controller`` now; ``objects`` stands for the cache's size before
    it is synced (what the previous run held, kept until this one knows)."""
    failed = controller.failed()
    synced = controller.synced.is_set()
    return {
        "controller": controller.name, "pid": os.getpid(), "written_at": time.time(),
        "synced": synced, "queue_depth": len(controller.queue),
        "objects": len(controller.cache) if synced or objects is None else objects,
        "failed_total": len(failed),
        "position": min(controller.positions.values(), default=0),
        "repairs": {f"{kind}:{cause}": n for kind in ("replay", "relist")
                    for cause, n in controller.stats.by_reason(f"{kind}s").items()},
        "last_repair": None if controller.last_repair is None else controller.last_repair._asdict(),
        # With a state_dir: how this run started (resumed from its snapshot, or relisted and why).
        "start": None if controller.snapshots is None or controller.snapshots.warm_start is None
        else controller.snapshots.warm_start._asdict(),
        "cache": {table: u._asdict() for table, u in controller.cache.usage().items()},
        "failed": [{"table": f.key.table, "key": f.key.key, "error": f.error, "failures": f.failures,
                    "since": f.since} for f in failed[:MAX_FAILED]],
    }


def write_status(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically: a reader sees the old file or the new one, whole."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".status-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_status(path: str) -> dict[str, Any]:
    """A status file as written; ValueError (naming what is wrong) for anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a status file (not JSON: {exc})") from exc
    if (not isinstance(doc, dict) or not isinstance(doc.get("controller"), str)
            or not isinstance(doc.get("failed"), list) or not isinstance(doc.get("synced"), bool)
            or not isinstance(doc.get("written_at"), (int, float))):
        raise ValueError(f"{path} is not a status file (fields missing or of the wrong type)")
    return doc


def held_before(path: str) -> int | None:
    """How many objects the controller that wrote status file ``path`` held once synced; None if
    the file is missing, unreadable or does not say."""
    try:
        objects = read_status(path).get("objects")
    except ValueError:
        return None
    return objects if isinstance(objects, int) and not isinstance(objects, bool) else None


class StatusWriter:
    """Rewrites a controller's status file every ``interval`` seconds until :meth:`close`; a write
    that fails (a full disk, a removed directory) is logged, rate-limited, and tried again next time.
    Once the controller is synced, an empty cache where the file said objects were held is warned
    about and counted (``suspect_empty_syncs``)."""

    def __init__(self, controller: Controller, path: str, interval: float):
        self.controller = controller
        self.path = path
        self.interval = interval
        self.held_before = held_before(path)
        self._checked = False
        self._stop = threading.Event()
        self._log = logging.getLogger("dfpubsub.controller")
        self._warn = RateLimitedLog(self._log, interval=60.0)
        self._thread = threading.Thread(target=self._run, name="dfpubsub-controller-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.write()
            # Every status interval, and soon after the first sync (the check below).
            if self._stop.wait(self.interval if self._checked else min(self.interval, 0.2)):
                return

    def _check_first_sync(self) -> None:
        controller = self.controller
        if self._checked or not controller.synced.is_set():
            return
        self._checked = True
        if self.held_before and not len(controller.cache):
            controller.stats.inc("suspect_empty_syncs")
            self._log.warning("the store is empty, but this controller held objects before: is store.url "
                              "(or store.prefix) the right one?", extra={
                                  "controller": controller.name, "objects_before": self.held_before,
                                  "status_file": self.path})

    def write(self) -> None:
        self._check_first_sync()
        try:
            write_status(self.path, status_of(self.controller, self.held_before))
        except (OSError, ValueError) as exc:
            self._warn.warning("status", "cannot write the status file", path=self.path, error=str(exc))

    def close(self) -> None:
        """Stop, with a last write."""
        self._stop.set()
        self._thread.join(timeout=5.0)  # a write to a hung file system must not hold up an exit
        self.write()
