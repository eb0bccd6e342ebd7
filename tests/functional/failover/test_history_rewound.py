"""A Redis store whose server comes back without its last writes (what a failover to a replica
that lacked them does, here by a restart from an append-only file that stopped early): the
controllers, whose positions are past what the server kept, relist once, counted under
``history_rewound``, and equal the store again; the next loss is a replay."""

from __future__ import annotations

import redis

from tests.functional.replay_helpers import Backend, Cluster, replay_always


def test_a_store_that_went_back_below_the_controllers_positions_is_one_relist_history_rewound(redis_server):
    c = Cluster(Backend("redis", redis_server.url, redis_server), runtimes=(replay_always(), replay_always()))
    try:
        raw = redis.Redis(port=redis_server.port)
        raw.config_set("appendonly", "no")  # the server keeps nothing written from here on
        raw.close()
        kept = c.store.feed_head()
        lost = c.write(c.api.update, "port", "k1", {"lost with the server": True}, lose=True)
        c.wait_converged()  # replayed: the controllers' positions are now past what the server keeps
        assert all(min(node.ctrl.positions.values()) > kept for node in c.nodes)
        redis_server.restart()  # kill -9; back from its append-only file, without the last write
        assert c.store.get("port", "k1").version < lost.version
        c.write(c.api.update, "port", "k2", {"after": True}, lose=True)  # a gap: the controllers repair
        c.wait_converged()
        for node in c.nodes:
            assert node.relists() == {"first_sync": 1, "history_rewound": 1}, node.relists()
        c.write(c.api.update, "port", "k3", {"next": True}, lose=True)
        c.wait_converged()
        for node in c.nodes:
            assert node.relists() == {"first_sync": 1, "history_rewound": 1}, node.relists()  # a replay again
    finally:
        c.close()
