"""Structured logging: one JSON object per line, with the ``extra`` fields of the call.

``log.warning("gap", extra={"topic": t, "publisher": p})`` prints
``{"ts": ..., "level": "warning", "logger": ..., "msg": "gap", "topic": ..., "publisher": ...}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "setup_logging", "RateLimitedLog"]

_STD_ATTRS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record and its ``extra`` fields as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger: ``fmt`` is ``json`` or ``text``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimitedLog:
    """Logs a message at most once per ``interval`` per key, counting what it skipped.

    Bad input can arrive at line rate; one line per second says as much as a
    million would.
    """

    def __init__(self, logger: logging.Logger, interval: float = 1.0):
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(self, key: str, msg: str, /, **fields: object) -> None:
        """Log ``msg`` with ``fields`` unless ``key`` was logged within the interval."""
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) < self.interval:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return
        self._last[key] = now
        fields["suppressed"] = self._skipped.pop(key, 0)
        self.logger.warning(msg, extra=fields)
