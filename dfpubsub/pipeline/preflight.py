"""What df-pipeline checks before it starts a JVM: the inputs, Java, and the master.

Starting Spark costs seconds and a screen of log4j lines; a mistyped path, a
bad date or a master that does not answer is one line instead. Local paths
(no scheme, or ``file:``) are checked here; a path on another file system
(``hdfs:``, ``s3a:``) only the jobs can check, through Spark's JVM. A bad
argument is a :class:`~dfpubsub.errors.ConfigError` (exit 2), a missing
input or an unreachable master a :class:`~dfpubsub.errors.PipelineError` (exit 1).
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
from urllib.parse import urlsplit

from ..errors import ConfigError, PipelineError

__all__ = ["check_date", "check_directory", "check_java", "check_master", "local_path"]


def local_path(path: str) -> str | None:
    """The local file of ``path`` (a plain path or a ``file:`` URI); None for another file system."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    return None if parts.scheme else path


def check_directory(path: str, what: str, must_exist: bool = True) -> None:
    """PipelineError when local ``path`` (``what``, e.g. "event log") is missing (if ``must_exist``)
    or is not a directory."""
    local = local_path(path)
    if local is None:
        return
    if os.path.isdir(local):
        if not os.access(local, os.R_OK | os.X_OK):
            raise PipelineError(f"cannot read the {what} at {path}: permission denied")
        return
    if os.path.exists(local):
        raise PipelineError(f"the {what} at {path} is not a directory")
    if must_exist:
        raise PipelineError(f"no {what} at {path}")
    parent = os.path.dirname(os.path.abspath(local))
    if not os.path.isdir(parent):
        raise PipelineError(f"cannot make the {what} at {path}: {parent} is not a directory")


def check_date(value: str | None, flag: str) -> None:
    """ConfigError unless ``value`` is None or a YYYY-MM-DD date."""
    if value is None:
        return
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"{flag} takes a date as YYYY-MM-DD, not {value!r}") from None
    if len(value) != 10:  # fromisoformat also takes 20260101; the log's directories are named 2026-01-01
        raise ConfigError(f"{flag} takes a date as YYYY-MM-DD, not {value!r}")


def check_java() -> None:
    """PipelineError unless a Java runtime is there for pyspark to start (``$JAVA_HOME/bin/java`` or
    ``java`` on the PATH, as pyspark's launcher looks for it)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if not os.access(os.path.join(home, "bin", "java"), os.X_OK):
            raise PipelineError(f"JAVA_HOME={home} has no bin/java: Spark needs a Java runtime (17 or 21)")
        return
    if shutil.which("java") is None:
        raise PipelineError("no java on the PATH and no JAVA_HOME: Spark needs a Java runtime (17 or 21)")


def check_master(master: str | None, timeout: float = 3.0) -> None:
    """ConfigError for a master URL Spark would refuse; PipelineError when no master of a
    ``spark://host:port[,host:port]`` URL answers (Spark would retry for a minute first)."""
    if master is None or master in ("local", "yarn") or master.startswith(("local[", "local-cluster[", "k8s://")):
        return
    if not master.startswith("spark://"):
        raise ConfigError(f"--master {master!r}: use local[*], local[N], spark://host:port, yarn or k8s://...")
    endpoints = []
    for part in master[len("spark://"):].split(","):
        host, _, digits = part.rpartition(":")
        if not host or not digits.isdigit() or not 0 < int(digits) < 65536:
            raise ConfigError(f"--master {master!r}: a standalone master is spark://host:port[,host:port]")
        endpoints.append((host.strip("[]"), int(digits)))
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError:
            continue
    raise PipelineError(f"no Spark master answers at {master}")
