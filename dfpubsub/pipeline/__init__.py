"""The data pipeline: Spark jobs over the event log (compact, audit) and the snapshot bootstrap.

See docs/pipeline.md. pyspark and pyarrow are imported on first use: the
controller's bootstrap needs pyarrow only, and ``import dfpubsub`` neither.
"""

from .compact import ACTION_RANK, TIE_BREAK, CompactResult, compact, latest_per_key
from .session import DEFAULT_MASTER, build_session
from .snapshot import Manifest, latest_manifest

__all__ = [
    "ACTION_RANK",
    "TIE_BREAK",
    "DEFAULT_MASTER",
    "CompactResult",
    "Manifest",
    "build_session",
    "compact",
    "latest_manifest",
    "latest_per_key",
]
