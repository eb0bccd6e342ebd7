"""Optional dependencies: which extra brings which library, and the error that names it.

Backends import their libraries only when chosen, so ``import dfpubsub`` and the
embedded default need none of them. When a chosen one is missing, the user
should read which extra to install, not a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import MissingExtra

__all__ = ["EXTRA_OF", "needs_extra"]

#: Top-level module -> the dfpubsub extra that installs it (setup.cfg [options.extras_require]).
EXTRA_OF: dict[str, str] = {
    "zmq": "zmq",
    "aetcd": "etcd",
    "grpc": "etcd",
    "redis": "redis",
    "hiredis": "redis",
    "nats": "nats",
    "nkeys": "nats",
    "confluent_kafka": "kafka",
    "aiohttp": "notify",
    "aio_pika": "notify",
    "aiormq": "notify",
    "typer": "cli",
    "rich": "cli",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "matplotlib": "spark",
    "tenacity": "test",
}


@contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Turn the import of a missing optional library inside the block into :class:`MissingExtra`.

    ``what`` names the feature for the message ("driver 'zmq'", "df-db"). An
    ImportError of anything else (a bug, a broken install) passes unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        extra = EXTRA_OF.get(module)
        if extra is None:
            raise
        raise MissingExtra(what, module, extra) from exc
