"""A process that increments counters in a store with compare-and-set, for the concurrency test.

Usage: python store_worker.py URL PREFIX N_KEYS INCREMENTS
Prints one JSON line: {"versions": {key: [versions seen in order]}, "retries": N}.
"""

import json
import sys

from dfpubsub.errors import VersionConflict
from dfpubsub.store import open_store


def main() -> None:
    url, prefix, n_keys, increments = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    opts = {"prefix": prefix} if not url.startswith("sqlite") else {}
    store = open_store(url, ["counter"], **opts)
    versions: dict[str, list[int]] = {}
    retries = 0
    for i in range(increments):
        key = f"c{i % n_keys}"
        while True:
            obj = store.get("counter", key)
            assert obj is not None, f"{key} was not created"
            try:
                new = store.update("counter", key, {"n": obj.value["n"] + 1}, expected_version=obj.version)
                break
            except VersionConflict:
                retries += 1
        versions.setdefault(key, []).append(new.version)
        seen = store.get("counter", key)
        assert seen is not None, f"{key} is gone"
        versions[key].append(seen.version)
    store.close()
    print(json.dumps({"versions": versions, "retries": retries}))


if __name__ == "__main__":
    main()
