"""A resync's relist: versions first, values only for what differs, truth wins.

A cache that already holds most objects reads the store's identities and
versions (:meth:`Store.list_versions_at`, no values), compares them with what
it holds, and reads and decodes only the objects that differ
(:meth:`Store.get_many`). An empty cache, or one that differs from the store
in most objects, has to read every value anyway and takes the full listing in
one read (:meth:`Store.list_packed_at`, with the values' bytes, which the cache
keeps). Either listing comes with the store revision it reflects, so that
:meth:`VersionedCache.reconcile` can replace every cached version the listing
does not show, unless it is provably newer. A caller that acts on no change (a
controller without reconcilers, indexes nor ``on_reconciled``) fills an empty
cache from the listing by table and column instead
(:meth:`Store.list_packed_tables_at`, :meth:`VersionedCache.fill`): neither an
object per row nor a :class:`Change` per object is built (a fifth of a first
sync of 100k objects, tools/bench/resync.py).

The garbage collector is off while a relist builds its objects: a resync of a
million objects allocates millions of containers, each allocation counts
towards a collection, and every collection walks the young objects again and
every full one all of them, so the cost per object grew with the size of the
resync (10k objects cost half as much per object as 100k). Nothing a relist
builds is cyclic garbage; afterwards what it built joins the oldest generation
directly.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from ..store import Store
from .cache import Change, VersionedCache

__all__ = ["Relisted", "relist", "relist_pages"]


class Relisted(NamedTuple):
    """What a relist found: the changes the cache had missed, how many objects the store holds for
    the topics, the store revision the listing reflects (every write up to it is in it), how
    many changes there were (``len(changes)``, unless they were not built: ``relist(changes=False)``),
    and how many pages the listing came in (0: not read in pages)."""

    changes: list[Change]
    objects: int
    revision: int
    changed: int
    pages: int = 0


@contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # Everything is now in the youngest generation, and the next collection would walk
        # millions of objects. Freezing and unfreezing moves them to the oldest generation
        # (in constant time) instead, where only the rare full collections look at them:
        # nothing is left out of collection for good.
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


def relist(store: Store, cache: VersionedCache, topics: set[str], values: bool = True,
           changes: bool = True, page_size: int = 0) -> Relisted:
    """Make ``cache`` equal to ``store`` for ``topics``: the resync a plain :class:`Subscriber`'s
    ``on_resync`` should run (a :class:`Controller` runs it for you where a replay cannot serve).

    Truth wins: the listing comes with the store revision it reflects and the relist begins
    (:meth:`VersionedCache.begin_relist`) before it is read, so only a cached version provably
    newer than the listing survives; any other, a forged 2^64-1 included, becomes the store's.
    Returns the changes the cache had missed (to hand to whatever acts on them). ``values=False``:
    the creates of a first sync may carry None for their values (see :meth:`VersionedCache.reconcile`).
    ``changes=False``: nothing acts on the changes (nor on their values), and a first sync into an
    empty cache builds none (:meth:`VersionedCache.fill`); ``changed`` still counts them.
    ``page_size``: a listing of values is read in pages of that many objects, each merged into
    the cache before the next is read (:func:`relist_pages`); 0: in one piece.
    """
    with _gc_paused():
        cache.begin_relist()
        if page_size and not len(cache) and not cache.tombstones():
            return relist_pages(store, cache, topics, page_size, values, changes)
        if not changes and not len(cache) and not cache.tombstones():
            tables, revision = store.list_packed_tables_at(topics)
            created = cache.fill(tables)
            if created is not None:
                return Relisted([], created, revision, created)
            cache.begin_relist()  # events came meanwhile: the listing below is read after them
        if len(cache):
            versions, revision = store.list_versions_at(topics)
            stale, same = cache.diff(versions)
            if len(stale) * 2 <= len(versions):
                # An object moved to another topic since the listing is, for these topics, deleted.
                fetched = [obj for obj in store.get_many(stale) if obj.topic in topics] if stale else []
                found = cache.reconcile(topics, fetched, revision, same)
                return Relisted(found, len(versions), revision, len(found))
            cache.begin_relist()  # the full listing below is read after the versions
            if page_size:
                return relist_pages(store, cache, topics, page_size, values, changes)
        objects, blobs, revision = store.list_packed_at(topics, values)  # the cache keeps the store's bytes
        found = cache.reconcile(topics, objects, revision, blobs=blobs, values=values)
        return Relisted(found, len(objects), revision, len(found))


def relist_pages(store: Store, cache: VersionedCache, topics: set[str], page_size: int, values: bool = True,
                 changes: bool = True) -> Relisted:
    """:func:`relist`'s full listing read in pages (:meth:`Store.list_pages_at`): each page is merged
    into the cache (:meth:`VersionedCache.reconcile_page`) before the next is read, so neither the
    store nor this process holds the whole listing's values at once; then what no page showed is
    deleted (:meth:`VersionedCache.end_relist`). Truth wins across pages as in one piece: every
    write up to the revision read before the first page is in some page (a later page may show
    later writes), so only a cached version provably newer than that survives. A listing that fails
    part way puts back what its pages changed (:meth:`VersionedCache.undo`; changes that nothing
    acts on are not built, nor put back), so that the retry finds them again. The caller called
    :meth:`VersionedCache.begin_relist` before."""
    fresh = not len(cache) and not cache.tombstones()
    revision, pages = store.list_pages_at(topics, page_size, values)
    seen: set[tuple[str, str]] = set()
    found: list[Change] = []
    objects = count = 0
    try:
        for page, blobs in pages:
            count += 1
            objects += len(page)
            seen.update([(o[1], o[2]) for o in page])
            found.extend(cache.reconcile_page(page, revision, blobs, values=values, fresh=fresh, build=changes))
    except BaseException:  # the store failed part way: the retry must find these changes again
        cache.undo(found)
        raise
    found.extend(cache.end_relist(topics, seen, revision))
    changed = len(found) if changes or not fresh else objects
    return Relisted(found, objects, revision, changed, count)
