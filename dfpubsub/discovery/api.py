"""The discovery contract: publisher records, leased registrations and watchers.

A backend (:mod:`.etcd`, :mod:`.redis`, :mod:`.sqlite`) implements four hooks
on :class:`Discovery`: write a new leased row, renew it (re-creating it if it
vanished), delete it, and list the live rows. Everything else is shared:
:class:`Registration` renews its row from a daemon thread every
``renew_interval``; :class:`PollingWatcher` lists the rows every
``poll_interval`` and reports the difference. etcd replaces the polling
watcher by a real watch.

Timing rule (what Dragonflow got wrong: it renewed at about its timeout, so
live publishers were collected as dead): ``renew_interval <= ttl / 3``, so a
registration survives two lost renewals in a row.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from ..backends import foreign
from ..errors import ClosedError, ConfigError, StoreError
from ..logs import RateLimitedLog

__all__ = [
    "PublisherRecord",
    "Discovery",
    "Registration",
    "Watcher",
    "PollingWatcher",
    "RecordCallback",
    "check_timing",
]

log = logging.getLogger("dfpubsub.discovery")

#: Called with a record as it appears, changes or vanishes.
RecordCallback = Callable[["PublisherRecord"], None]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_Z85 = re.compile(r"[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}")


def check_timing(ttl: float, renew_interval: float) -> None:
    """Refuse a TTL and renew interval that would let a live publisher expire."""
    if not ttl > 0 or not renew_interval > 0:
        raise ConfigError(f"discovery ttl and renew_interval must be positive, got {ttl!r} and {renew_interval!r}")
    if renew_interval > ttl / 3:
        raise ConfigError(
            f"discovery renew_interval ({renew_interval:g} s) must be at most ttl / 3 ({ttl / 3:g} s), "
            "so that a live publisher survives two lost renewals"
        )


@dataclass(frozen=True, slots=True)
class PublisherRecord:
    """One publisher as registered in discovery (docs/discovery.md).

    ``publisher_id`` is new at every process start; ``name`` is stable, for
    people; ``uris`` are where subscribers reach it (empty for drivers where
    nobody connects to the publisher); ``started_at`` is Unix time. Records
    read from a backend carry ``lease_left``, the seconds before the row
    expires unless renewed (whole seconds on etcd; ``None`` where unknown).
    """

    publisher_id: str
    name: str
    uris: list[str]
    host: str
    pid: int
    started_at: float
    topics: list[str]
    lease_left: float | None = field(default=None, compare=False)
    #: The publisher's CURVE public key (Z85) when it encrypts: what a discovering subscriber pins.
    curve_key: str = ""
    #: What it is beyond a publisher: "feed" for df-feed, whose bookmarks controllers may trust
    #: (docs/reliability.md, "Bookmarks"); "" for any other.
    role: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.publisher_id, str) or not _ID.fullmatch(self.publisher_id):
            raise ValueError(f"publisher_id must match {_ID.pattern}, got {self.publisher_id!r}")
        for name in ("name", "host"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("uris", "topics"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of strings, got {value!r}")
            object.__setattr__(self, name, list(value))
        if isinstance(self.pid, bool) or not isinstance(self.pid, int):
            raise ValueError(f"pid must be an int, got {self.pid!r}")
        if isinstance(self.started_at, bool) or not isinstance(self.started_at, (int, float)):
            raise ValueError(f"started_at must be Unix seconds, got {self.started_at!r}")
        object.__setattr__(self, "started_at", float(self.started_at))
        if not isinstance(self.curve_key, str) or self.curve_key and not _Z85.fullmatch(self.curve_key):
            raise ValueError(f"curve_key must be a 40-character Z85 key, got {self.curve_key!r}")
        if not isinstance(self.role, str) or len(self.role) > 64:
            raise ValueError(f"role must be a string of at most 64 characters, got {self.role!r:.80}")

    @property
    def age(self) -> float:
        """Seconds since the publisher started (by this host's clock)."""
        return max(0.0, time.time() - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        """The stored fields (no ``lease_left``)."""
        return {
            "publisher_id": self.publisher_id, "name": self.name, "uris": list(self.uris), "host": self.host,
            "pid": self.pid, "started_at": self.started_at, "topics": list(self.topics),
            **({"curve_key": self.curve_key} if self.curve_key else {}),
            **({"role": self.role} if self.role else {}),
        }

    def to_json(self) -> bytes:
        """The row's value: compact JSON of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str, lease_left: float | None = None) -> PublisherRecord:
        """Parse a row's value; ``ValueError`` if it is not a record."""
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        try:
            return cls(obj["publisher_id"], obj["name"], obj["uris"], obj["host"], obj["pid"], obj["started_at"],
                       obj["topics"], lease_left, obj.get("curve_key", ""), obj.get("role", ""))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"missing or bad field: {exc}") from exc


class Discovery(abc.ABC):
    """A table of publisher records whose rows expire ``ttl`` seconds after their last renewal.

    Thread-safe. :meth:`close` ends the registrations (deleting their rows)
    and the watchers made through this object.
    """

    backend: ClassVar[str] = ""

    def __init__(self, url: str, ttl: float, renew_interval: float, prefix: str, timeout: float | None = None):
        check_timing(ttl, renew_interval)
        if not isinstance(prefix, str) or not prefix or "/" in prefix:
            raise ConfigError(f"discovery prefix must be a non-empty string without '/', got {prefix!r}")
        self.url = url
        self.ttl = float(ttl)
        self.renew_interval = float(renew_interval)
        self.prefix = prefix
        #: Deadline of one backend call: a renewal that hangs longer than a renew interval is lost anyway.
        self.timeout = float(timeout) if timeout is not None else min(5.0, max(1.0, self.renew_interval))
        #: How often polling watchers list the table.
        self.poll_interval = min(self.renew_interval, 1.0)
        self._lock = threading.Lock()
        self._registrations: set[Registration] = set()
        self._watchers: set[Watcher] = set()
        self._closed = False

    @property
    def effective_ttl(self) -> float:
        """Seconds a row outlives its last renewal, as the backend applies it (etcd rounds up)."""
        return self.ttl

    # -- public API ---------------------------------------------------------------

    def register(self, record: PublisherRecord) -> Registration:
        """Write ``record``'s row and keep it alive until :meth:`Registration.close`.

        Raises :class:`~dfpubsub.errors.StoreUnavailable` if the backend cannot
        be reached now; later outages are retried by the keep-alive thread.
        """
        self._check_open()
        handle = self._create(record)
        reg = Registration(self, record, handle)
        with self._lock:
            self._registrations.add(reg)
        reg._start()
        return reg

    def list(self) -> list[PublisherRecord]:
        """The live records, with ``lease_left``, sorted by name then id."""
        self._check_open()
        return sorted(self._snapshot().values(), key=lambda r: (r.name, r.publisher_id))

    def watch(
        self, on_added: RecordCallback, on_removed: RecordCallback, on_updated: RecordCallback | None = None
    ) -> Watcher:
        """Report rows as they appear (``on_added``), change (``on_updated``) and vanish (``on_removed``).

        The rows that exist already are reported as added before this returns,
        on the caller's thread; later changes are reported on the watcher's
        thread, one callback at a time. A row that expires is reported as
        removed. While the backend is unreachable nothing is reported as
        removed: the last known rows stand until the backend answers again.
        """
        self._check_open()
        watcher = self._watcher(on_added, on_removed, on_updated)
        with self._lock:
            self._watchers.add(watcher)
        try:
            watcher._start()
        except BaseException:
            watcher.close()
            raise
        return watcher

    def close(self) -> None:
        """Close every registration and watcher made here, then the connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            regs, watchers = list(self._registrations), list(self._watchers)
        for watcher in watchers:
            watcher.close()
        for reg in regs:
            reg.close()
        self._close()

    def __enter__(self) -> Discovery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self.backend} discovery is closed")

    def _forget(self, item: Registration | Watcher) -> None:
        with self._lock:
            if isinstance(item, Registration):
                self._registrations.discard(item)
            else:
                self._watchers.discard(item)

    # -- backend hooks --------------------------------------------------------------

    @abc.abstractmethod
    def _create(self, record: PublisherRecord) -> Any:
        """Write a new row with the TTL; return the backend's handle of it (etcd: the lease id)."""

    @abc.abstractmethod
    def _renew(self, handle: Any, record: PublisherRecord, rewrite: bool) -> Any:
        """Extend the row's TTL (``rewrite``: also store ``record``); re-create it if it vanished.

        Returns the handle, which changes when the row had to be re-created.
        """

    @abc.abstractmethod
    def _remove(self, handle: Any, record: PublisherRecord) -> None:
        """Delete the row now."""

    @abc.abstractmethod
    def _snapshot(self) -> dict[str, PublisherRecord]:
        """The live rows by publisher id, with ``lease_left``; expired ones are left out."""

    def _watcher(
        self, on_added: RecordCallback, on_removed: RecordCallback, on_updated: RecordCallback | None
    ) -> Watcher:
        return PollingWatcher(self, on_added, on_removed, on_updated)

    def _close(self) -> None:
        """Release connections."""

    # Shared by the backends: one line per trouble and second, however often it happens.
    _trouble = RateLimitedLog(log)

    def _parse_row(self, publisher_id: str, blob: bytes | str, lease_left: float | None) -> PublisherRecord | None:
        """The record in a row keyed ``publisher_id``; None (skipped: dfpubsub.backends.foreign) if it is not one."""
        try:
            record = PublisherRecord.from_json(blob, lease_left)
            if record.publisher_id != publisher_id:
                raise ValueError(f"the record's publisher_id is {record.publisher_id!r}")
        except ValueError as exc:
            foreign.skip("discovery_row", f"{self.backend} discovery row {publisher_id}", "bad_value", str(exc))
            return None
        return record


class Registration:
    """A registered record kept alive by a daemon thread; made by :meth:`Discovery.register`.

    Renewals run at a fixed rate of ``renew_interval``. A renewal that fails
    (backend unreachable) is logged and retried at the next tick; a row that
    vanished (expired during an outage, deleted by someone) is re-created.
    """

    def __init__(self, discovery: Discovery, record: PublisherRecord, handle: Any):
        self.discovery = discovery
        self._record = record
        self._handle = handle
        self._pid = os.getpid()  # a forked child inherits the object, not the registration
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._dirty = False  # the stored row lags behind _record
        self._topics_source: Callable[[], Iterable[str]] | None = None
        #: Successful and failed renewals, and when the last success was (monotonic).
        self.renewals = 0
        self.failures = 0
        self.last_renewed = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"dfpubsub-discovery-{record.publisher_id[:12]}", daemon=True
        )

    @property
    def record(self) -> PublisherRecord:
        """The record as last set (and stored, unless a renewal is failing)."""
        return self._record

    @property
    def closed(self) -> bool:
        return self._closed

    def update(self, *, topics: Iterable[str] | None = None, uris: Iterable[str] | None = None,
               name: str | None = None) -> PublisherRecord:
        """Change the record and store it now; return it.

        If the backend cannot be reached the error is raised, and the keep-alive
        thread stores the new record at its next successful renewal.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("registration is closed")
            changes: dict[str, Any] = {}
            if topics is not None:
                changes["topics"] = sorted(set(topics))
            if uris is not None:
                changes["uris"] = list(uris)
            if name is not None:
                changes["name"] = name
            self._record = replace(self._record, **changes)
            self._dirty = True
            self._renew_locked()
            return self._record

    def follow_topics(self, source: Callable[[], Iterable[str]]) -> None:
        """Refresh the record's topics from ``source()`` at every renewal (stored only when they change)."""
        self._topics_source = source

    def close(self) -> None:
        """Stop renewing and delete the row at once (it expires by itself if that fails).

        In a forked child (whose copy was never renewed: threads do not survive a
        fork) this only marks the copy closed; the parent's row is left alone.
        """
        if os.getpid() != self._pid:  # checked first: the lock may have been held at the fork
            self._closed = True
            self.discovery._forget(self)
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.discovery.timeout + 1)
        try:
            self.discovery._remove(self._handle, self._record)
        except StoreError as exc:
            log.warning("could not delete a discovery registration; it expires by itself",
                        extra={"publisher_id": self._record.publisher_id, "error": str(exc)})
        self.discovery._forget(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        interval = self.discovery.renew_interval
        due = time.monotonic() + interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            with self._lock:
                if self._closed:
                    return
                self._follow()
                try:
                    self._renew_locked()
                except StoreError as exc:
                    self.failures += 1
                    self.discovery._trouble.warning(
                        f"renew-{self._record.publisher_id}", "discovery renewal failed; retrying",
                        publisher_id=self._record.publisher_id, error=str(exc),
                        unrenewed_for=round(time.monotonic() - self.last_renewed, 3),
                    )
            # Fixed rate; a tick missed by a slow call is skipped, not made up in a burst.
            due = max(due + interval, time.monotonic())

    def _follow(self) -> None:
        if self._topics_source is None:
            return
        topics = sorted(set(self._topics_source()))
        if topics != self._record.topics:
            self._record = replace(self._record, topics=topics)
            self._dirty = True

    def _renew_locked(self) -> None:
        self._handle = self.discovery._renew(self._handle, self._record, self._dirty)
        self._dirty = False
        self.renewals += 1
        self.last_renewed = time.monotonic()


class Watcher(abc.ABC):
    """Reports rows appearing, changing and vanishing; made by :meth:`Discovery.watch`.

    ``records`` is the watcher's current view, by publisher id. Subclasses
    feed it through :meth:`_apply` (a full listing) or :meth:`_put` and
    :meth:`_delete` (single changes).
    """

    def __init__(self, discovery: Discovery, on_added: RecordCallback, on_removed: RecordCallback,
                 on_updated: RecordCallback | None = None):
        self.discovery = discovery
        self.on_added = on_added
        self.on_removed = on_removed
        self.on_updated = on_updated
        self._records: dict[str, PublisherRecord] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dfpubsub-discovery-watch-{id(self):x}",
                                        daemon=True)

    @property
    def records(self) -> dict[str, PublisherRecord]:
        """A copy of the current view."""
        return dict(self._records)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """Stop watching; no callback runs after this returns (unless called from one)."""
        self._stop.set()
        self._interrupt()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.discovery.timeout + 2)
        self.discovery._forget(self)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses ----------------------------------------------------------------

    def _start(self) -> None:
        """List once (callbacks on the caller's thread), then start the thread."""
        self._apply(self.discovery._snapshot())
        self._thread.start()

    @abc.abstractmethod
    def _run(self) -> None:
        """The watcher thread: report changes until ``_stop`` is set."""

    def _interrupt(self) -> None:
        """Wake the thread out of a blocking wait, for :meth:`close`."""

    def _apply(self, snapshot: dict[str, PublisherRecord]) -> None:
        """Report the difference between the view and a full listing; adopt the listing."""
        for rec in snapshot.values():
            self._put(rec)
        for pid in [p for p in self._records if p not in snapshot]:
            self._delete(pid)

    def _put(self, record: PublisherRecord) -> None:
        """Adopt ``record``; report it as added, or as updated if it changed (not just its lease_left)."""
        old = self._records.get(record.publisher_id)
        self._records[record.publisher_id] = record
        if old is None:
            self._call(self.on_added, record)
        elif old != record and self.on_updated is not None:
            self._call(self.on_updated, record)

    def _delete(self, publisher_id: str) -> None:
        old = self._records.pop(publisher_id, None)
        if old is not None:
            self._call(self.on_removed, old)

    def _call(self, callback: RecordCallback, record: PublisherRecord) -> None:
        if self._stop.is_set():
            return
        try:
            callback(record)
        except Exception:  # user code: one failing callback must not end the watch
            log.exception("discovery watcher callback failed",
                          extra={"callback": getattr(callback, "__qualname__", repr(callback)),
                                 "publisher_id": record.publisher_id})


class PollingWatcher(Watcher):
    """Lists the table every ``discovery.poll_interval`` seconds and reports the difference."""

    def _run(self) -> None:
        while not self._stop.wait(self.discovery.poll_interval):
            try:
                snapshot = self.discovery._snapshot()
            except StoreError as exc:  # keep the last view: an outage is not a mass removal
                self.discovery._trouble.warning(f"watch-{self.discovery.backend}",
                                                "discovery listing failed; keeping the last view", error=str(exc))
                continue
            self._apply(snapshot)
