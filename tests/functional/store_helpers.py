"""A store on each backend, for fixtures parametrized over sqlite, etcd and redis (the controller and
pipeline tests)."""

import itertools

_prefix = itertools.count()


def backend_store(request, tmp_path, tables, label):
    """A store on the backend named by ``request.param`` (sqlite, etcd, redis), with a key prefix
    of its own on the shared servers; for fixtures parametrized over the three backends."""
    from dfpubsub.store import open_store

    if request.param == "sqlite":
        return open_store(f"sqlite:///{tmp_path}/nb.sqlite", tables)
    server = request.getfixturevalue(f"shared_{request.param}")
    return open_store(server.url, tables, prefix=f"{label}{next(_prefix)}-{tmp_path.name}")
