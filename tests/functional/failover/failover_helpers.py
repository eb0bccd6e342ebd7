"""A writer that writes without pause and a reader that follows the change feed as a controller
does (relisting when history is gone), both in threads, for failover tests."""

from __future__ import annotations

import threading
import time
from typing import Any

from dfpubsub.errors import HistoryGone, StoreUnavailable, WriteOutcomeUnknown

__all__ = ["Follower", "Writer"]


class Writer:
    """Creates ``port/k{n}`` through ``store`` (a store, or an NbApi) one after the other until stopped, noting what each write returned:
    ``acked`` (key -> version), ``unknown`` (WriteOutcomeUnknown), ``refused`` (other
    StoreUnavailable: not written), and when each acknowledged write returned."""

    def __init__(self, store: Any, topic: str = "t"):
        self.store = store
        self.topic = topic
        self.acked: dict[str, int] = {}
        self.acked_at: list[float] = []
        self.unknown: set[str] = set()
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"k{n}"
            n += 1
            try:
                obj = self.store.create("port", key, {"n": n}, topic=self.topic)
            except WriteOutcomeUnknown:
                self.unknown.add(key)
            except StoreUnavailable as exc:
                self.refused.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.01)
            else:
                self.acked[key] = obj.version
                self.acked_at.append(time.monotonic())

    def first_ack_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first write acknowledged after it."""
        later = [t for t in list(self.acked_at) if t > moment]
        return later[0] - moment if later else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)  # a call in flight may wait out a failover's retries on a starved machine
        assert not self._thread.is_alive()


class Follower:
    """Follows ``store``'s feed from its head as a controller's repair does: ``view`` holds each
    object's revision as the feed told it; history gone (``HistoryRewound`` included) relists,
    counted by the error's reason in ``relists``."""

    def __init__(self, store: Any):
        self.store = store
        self.view: dict[str, int] = {}
        self.relists: dict[str, int] = {}
        self.read_up_to = 0  # the highest revision this reader ever reached
        self.reader = store.follow_feed(store.feed_head())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for entry in self.reader.read(1000, 0.05):
                    if entry.action.value == "delete":
                        self.view.pop(entry.key, None)
                    else:
                        self.view[entry.key] = entry.revision
                self.read_up_to = max(self.read_up_to, self.reader.position)
            except HistoryGone as exc:
                self.relists[exc.reason] = self.relists.get(exc.reason, 0) + 1
                try:
                    listed, revision = self.store.list_at(["t"])
                except StoreUnavailable:
                    continue
                self.view = {o.key: o.version for o in listed}
                self.reader = self.store.follow_feed(revision)
            except StoreUnavailable:
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)  # a call in flight may wait out a failover's retries on a starved machine
        assert not self._thread.is_alive()
