"""Structured logging: one JSON object per line, with the ``extra`` fields of the call.

``log.warning("gap", extra={"topic": t, "publisher": p})`` prints
``{"ts": ..., "level": "warning", "logger": ..., "msg": "gap", "topic": ..., "publisher": ...}``;
with ``--log.format text``, ``2026-01-02 03:04:05,678 WARNING logger: gap topic=port publisher=api-1``
(the same fields, logfmt-style: a value with spaces or quotes is quoted as JSON).
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "TextFormatter", "setup_logging", "RateLimitedLog"]

_STD_ATTRS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The ``extra`` fields of ``record``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """Formats a record and its ``extra`` fields as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Formats a record for people: time, level, logger, message, then its ``extra`` fields as
    ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={_logfmt(v)}" for k, v in _fields(record).items())
        if not fields:
            return text
        head, sep, trace = text.partition("\n")  # the fields stay on the message's line
        return f"{head} {fields}{sep}{trace}"


def _logfmt(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if text and not any(c in text for c in ' "=\n') else json.dumps(text)


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger: ``fmt`` is ``json`` or ``text``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
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
