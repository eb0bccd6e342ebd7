"""Pub/sub drivers shipped with dfpubsub, installed as ``dfpubsub.drivers``.

Each driver module imports only the core API and its own backend library,
and only when it is loaded through :func:`dfpubsub.plugins.load_driver`.
"""

__all__: list[str] = []
