"""The backends' clients, shared by the store, the queues and discovery of each kind.

- :mod:`.sqlite`, :mod:`.redis`, :mod:`.etcd`: opening a connection, its errors as
  dfpubsub's typed ones, and what each backend's users share (etcd's transaction
  builder, channel options, endpoints and the fork-aware connection of the store and
  the queues; Redis's per-process client);
- :mod:`.access`: credentials and TLS for Redis and etcd, from ``[redis]`` / ``[etcd]``;
- :mod:`.foreign`: skipping and counting records another writer left, so none fails a listing;
- :mod:`.extras`: which optional extra brings which library, named in the error when missing.

The face imports nothing: the Redis and etcd modules need their extras, and are
imported only by what opens such a backend.
"""

__all__: list[str] = []
