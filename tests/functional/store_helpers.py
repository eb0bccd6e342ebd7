"""A store on each backend, for fixtures parametrized over sqlite, etcd and redis (the controller and
pipeline tests)."""

import itertools

_prefix = itertools.count()


def backend_location(request, tmp_path, label, filename="nb.sqlite"):
    """(url, options) of a fresh location on the backend named by ``request.param`` (sqlite, etcd,
    redis): a file of its own, or a key prefix of its own on the shared servers."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/{filename}", {}
    server = request.getfixturevalue(f"shared_{request.param}")
    return server.url, {"prefix": f"{label}{next(_prefix)}-{tmp_path.name}"}


def backend_store(request, tmp_path, tables, label):
    """A store on the backend named by ``request.param`` (sqlite, etcd, redis), with a key prefix
    of its own on the shared servers; for fixtures parametrized over the three backends."""
    from dfpubsub.store import open_store

    url, options = backend_location(request, tmp_path, label)
    return open_store(url, tables, **options)
